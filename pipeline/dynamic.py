"""A model's costs over the declared ranges of its sizes: the report's `Model.dynamic`.

The concrete analysis runs at the analysis binding (each size at the middle of its corpus).
On top of it:

1. `follow_sizes` traces the model again with the sizes as symbols (`analysis/symbolic.py`):
   each value's shape becomes an expression, and the guards the model puts on the sizes are
   found with their lines.  A declared range a guard does not hold over is refused there
   (`refusal`), before anything is reported at sizes the model cannot run.
2. `dynamic_section` costs each cluster and pattern on the graph of expressions with the
   cost model's own functions, checks each against the concrete number at the binding, and
   answers at every point of the corpus: bytes, regime, expected speedup, and along each
   size where the regime changes (bisecting the expressions).  A cluster the symbols did not
   reach (or a model they could not be followed through) is analyzed again, concretely, at
   each point instead, and says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import sympy
import torch

from fuselens.analysis import capture, cost, loader, sourcemap
from fuselens.analysis import patterns as patterns_mod
from fuselens.analysis.expressions import NotExpressible, expression
from fuselens.analysis.graph import Graph
from fuselens.analysis.symbolic import SymbolicShapes, guards_at_small_sizes, symbolic_shapes
from fuselens.codegen.plan import returned_outputs
from fuselens.contracts import dynamic as D
from fuselens.contracts import report as R
from fuselens.contracts.config import InputSpec, ModelConfig

from .findings import Found, findings, op_ref

MAX_POINTS = 64  # bindings in the per-shape table; beyond, each size varies alone


def follow_sizes(
    model: torch.nn.Module, config: ModelConfig, main: capture.Trace, user_code: capture.UserCode
) -> SymbolicShapes:
    """The main trace's values as expressions of the declared sizes, and the guards on them."""
    return symbolic_shapes(model, config.inputs or [], config.dims, main, user_code)


def refusal_of_failed_binding(
    model: torch.nn.Module, config: ModelConfig, user_code: capture.UserCode, path: str
) -> R.Problem | None:
    """Where the trace at the analysis binding failed: the bound the binding went past, found by a trace
    at small sizes, as the refusal of the declared range (None: the failure is another)."""
    guards = guards_at_small_sizes(model, config.inputs or [], config.dims, user_code)
    return refusal(SymbolicShapes(None, guards), config, path)


_BOUNDS = (sympy.LessThan, sympy.StrictLessThan, sympy.GreaterThan, sympy.StrictGreaterThan)


def refusal(shapes: SymbolicShapes, config: ModelConfig, path: str) -> R.Problem | None:
    """A declared range that goes past a bound the model's code puts on a size (`seq <= 2048`): refused at
    the bound's line.  Only bounds refuse: a guard that a size is not some value (`Ne(seq, 1024)`, where
    slicing a cache of 1024 rows takes all of it) says the trace took the path of the other sizes, which
    moves the same bytes, not that the model cannot run there."""
    for guard in shapes.guards:
        if not isinstance(guard.condition, _BOUNDS):
            continue
        for name in sorted(s.name for s in guard.condition.free_symbols):
            dim = config.dims.get(name)
            if dim is None:
                continue
            failing = [v for v in _probe_sizes(dim) if not _holds(guard.condition, config, {name: v})]
            if not failing:
                continue
            allowed = _largest_allowed(guard.condition, config, name)
            within = f"; the model runs at {name} = {dim.min}..{allowed}" if allowed is not None else ""
            place = f"line {guard.line}: `{guard.code}`" if guard.code else f"line {guard.line}"
            message = (
                f"{name} = {dim.min}..{dim.max} ({config.dims_sources.get(name, 'declared')}) goes beyond what the "
                f"model allows: {guard.condition} ({place}){within}"
            )
            hint = f"declare a range within it, e.g. {name} = {{ min = {dim.min}, max = {allowed} }}" if allowed else ""
            return R.Problem("inputs", message, guard.file or path, guard.line or 1, None, hint)
    return None


def _probe_sizes(dim) -> list[int]:
    return sorted({dim.min, dim.max, *dim.corpus})


def _holds(condition: sympy.Basic, config: ModelConfig, at: dict[str, int]) -> bool:
    values = {sympy.Symbol(n, integer=True, positive=True): d.binding for n, d in config.dims.items()}
    values.update({sympy.Symbol(n, integer=True, positive=True): v for n, v in at.items()})
    return bool(condition.xreplace(values))


def _largest_allowed(condition: sympy.Basic, config: ModelConfig, name: str) -> int | None:
    """The largest size from the minimum up at which `condition` holds (None: not even there)."""
    dim = config.dims[name]
    low, high = dim.min, dim.max
    if not _holds(condition, config, {name: low}):
        return None
    while low < high:  # the last size it holds at, as it stops holding once
        mid = (low + high + 1) // 2
        low, high = (mid, high) if _holds(condition, config, {name: mid}) else (low, mid - 1)
    return low


# ---- the section ------------------------------------------------------------------------------------

Reanalysis = Callable[[dict[str, int]], R.Model]  # the model analyzed concretely at a binding


@dataclass
class _Context:
    config: ModelConfig
    profile: cost.DeviceProfile
    points: list[dict[str, int]]
    binding: dict[str, int]
    reanalyze: Reanalysis
    _concrete: dict[tuple, R.Model] | None = None

    def concrete(self, binding: dict[str, int]) -> R.Model:
        if self._concrete is None:
            self._concrete = {}
        key = tuple(sorted(binding.items()))
        if key not in self._concrete:
            self._concrete[key] = self.reanalyze(binding)
        return self._concrete[key]


def unanswered(model: R.Model, config: ModelConfig, shapes: SymbolicShapes | None) -> D.DynamicShapes:
    """The sizes of a model traced on real values past a data-dependent op: its costs are the binding's only."""
    section = _sizes_section(model, config)
    section.symbolic = False
    section.note = f"costs are given at the analysis binding only: {shapes.error if shapes else 'not traced'}"
    section.clusters = [D.DynamicCluster(c.id, symbolic=False, note=section.note) for c in model.clusters]
    return section


def _sizes_section(model: R.Model, config: ModelConfig) -> D.DynamicShapes:
    return D.DynamicShapes(
        sizes=[
            D.Size.of(dim, config.dims_sources.get(name, ""), _used_by(model, config, name))
            for name, dim in config.dims.items()
        ],
        binding={name: dim.binding for name, dim in config.dims.items()},
        points=_points(config),
    )


def dynamic_section(
    model: R.Model,
    found: list[Found],
    shapes: SymbolicShapes | None,
    config: ModelConfig,
    profile: cost.DeviceProfile,
    reanalyze: Reanalysis,
) -> D.DynamicShapes:
    section = _sizes_section(model, config)
    binding = section.binding
    if shapes is not None:
        section.guards = [_guard(g) for g in shapes.guards]
    graph = shapes.graph if shapes is not None else None
    if graph is None:
        section.symbolic = False
        section.note = (
            f"the sizes could not be followed as symbols ({shapes.error if shapes else 'not traced'}): "
            "each point is analyzed again"
        )
    context = _Context(config, profile, section.points, binding, reanalyze)
    for cluster, instance in zip(model.clusters, found, strict=True):
        section.clusters.append(_cluster(cluster, instance, graph, shapes, context))
    main = found[0].graph if found else None
    for index, pattern in enumerate(model.patterns):
        section.patterns.append(_pattern(index, pattern, main, graph, context))
    return section


def _used_by(model: R.Model, config: ModelConfig, name: str) -> list[str]:
    out = []
    for i, spec in enumerate(config.inputs or []):
        label = model.inputs[i].name if i < len(model.inputs) and model.inputs[i].name else f"input{i}"
        out += [f"{label}[{d}]" for d, n in enumerate(spec.symbols) if n == name]
    return out


def _points(config: ModelConfig) -> list[dict[str, int]]:
    """Every combination of the corpora, or (past MAX_POINTS) each size's corpus with the others bound."""
    names = list(config.dims)
    combos = list(itertools.product(*(config.dims[n].corpus for n in names)))
    if len(combos) <= MAX_POINTS:
        return [dict(zip(names, c, strict=True)) for c in combos]
    binding = {n: d.binding for n, d in config.dims.items()}
    return [{**binding, n: v} for n in names for v in config.dims[n].corpus]


def _guard(found) -> D.Guard:
    try:
        condition = expression(found.condition)
    except NotExpressible:
        condition = D.Expression(str(found.condition), 1)
    return D.Guard(condition, found.file, found.line, found.code)


# ---- clusters ---------------------------------------------------------------------------------------


def name_clusters(report: R.Report) -> None:
    """Each dynamic entry takes its cluster's id, given once every model's clusters are numbered."""
    for model in report.models:
        if model.dynamic is not None:
            for entry, cluster in zip(model.dynamic.clusters, model.clusters, strict=True):
                entry.cluster = cluster.id


def _cluster(
    cluster: R.Cluster, instance: Found, graph: Graph | None, shapes: SymbolicShapes | None, context: _Context
) -> D.DynamicCluster:
    """`cluster`'s costs over the sizes; `instance` is the one its report entry was made from."""
    launches = _launches(instance)
    entry = D.DynamicCluster(cluster.id, symbolic=False, launches=launches)
    reason = _not_symbolic(cluster, instance, graph, shapes)
    if reason:
        entry.note = f"{reason}: its costs are those of the analysis at each point"
        entry.points = [_concrete_point(cluster, p, launches, context) for p in context.points]
        return entry
    assert graph is not None
    inputs = [s.node for s in instance.plan.inputs]
    outputs = [o.node for o in returned_outputs(instance.plan)]
    unfused, fused = cost.cluster_bytes(graph, instance.plan.compute, inputs, outputs)
    largest = sympy.Max(0, *(cost.op_bytes(graph, graph[i]) for i in instance.plan.compute))
    work = cost.gemm_work(graph, instance.plan.compute)
    try:
        entry.bytes_unfused, entry.bytes_fused = expression(unfused), expression(fused)
        entry.largest_op = expression(largest)
        if work:
            entry.gemm_flop, entry.gemm_dtype = expression(sympy.Add(*(f for f, _ in work))), work[0][1]
    except NotExpressible as exc:
        entry.note = f"its size has a function the report cannot write ({exc}): its costs are those of the analysis at each point"
        entry.points = [_concrete_point(cluster, p, launches, context) for p in context.points]
        return entry
    if (entry.bytes_unfused.at(context.binding), entry.bytes_fused.at(context.binding)) != (
        cluster.bytes_unfused,
        cluster.bytes_fused,
    ):  # (never expected: the expressions are the concrete counts' own, in symbols)
        entry.note = "its expressions disagree with the analysis at the binding: its costs are those of the analysis at each point"
        entry.bytes_unfused = entry.bytes_fused = entry.largest_op = entry.gemm_flop = None
        entry.points = [_concrete_point(cluster, p, launches, context) for p in context.points]
        return entry
    entry.symbolic = True
    entry.points = [_symbolic_point(entry, p, context.profile) for p in context.points]
    entry.changes = _changes(entry, context)
    return entry


def _launches(instance: Found) -> int:
    graph = instance.graph
    return sum(1 for i in instance.plan.compute if cost.op_bytes(graph, graph[i]) > 0) or 1


def _not_symbolic(cluster: R.Cluster, instance: Found, graph: Graph | None, shapes: SymbolicShapes | None) -> str:
    """Why the cluster's costs cannot be expressions ("" when they can)."""
    if graph is None or shapes is None:
        return "the sizes could not be followed as symbols"
    if instance.path != 0:
        return "it is on a branch path the symbolic trace does not take"
    touched = {*instance.plan.compute, *(s.node for s in instance.plan.inputs)}
    touched |= {instance.graph.view_root(i) for i in touched}
    missing = sorted(touched & shapes.unmapped)
    if missing:
        node = instance.graph[missing[0]]
        return f"the symbolic trace did not give the size of {node.op} at line {node.line}"
    return ""


def _symbolic_point(entry: D.DynamicCluster, binding: dict[str, int], profile: cost.DeviceProfile) -> D.PointCost:
    assert entry.bytes_unfused is not None and entry.bytes_fused is not None and entry.largest_op is not None
    unfused, fused = int(entry.bytes_unfused.at(binding)), int(entry.bytes_fused.at(binding))
    largest = entry.largest_op.at(binding)
    multiply = profile.gemm_us(int(entry.gemm_flop.at(binding)), entry.gemm_dtype) if entry.gemm_flop else 0.0
    return D.PointCost(
        dict(binding),
        unfused,
        fused,
        cost.regime_of(fused, largest, profile, multiply),
        cost.expected_speedup(unfused, fused, entry.launches, profile),
    )


def _concrete_point(cluster: R.Cluster, binding: dict[str, int], launches: int, context: _Context) -> D.PointCost:
    model = context.concrete(binding)
    same = next(
        (c for c in model.clusters if c.op_chain == cluster.op_chain and c.lines == cluster.lines),
        None,
    )
    if same is None or same.bytes_unfused is None or same.bytes_fused is None:
        return D.PointCost(dict(binding), None, None, None, None)
    speedup = cost.expected_speedup(same.bytes_unfused, same.bytes_fused, launches, context.profile)
    return D.PointCost(dict(binding), same.bytes_unfused, same.bytes_fused, same.regime, speedup)


def _changes(entry: D.DynamicCluster, context: _Context) -> list[D.RegimeChange]:
    """Along each size (the others at their binding), the first size of each new regime."""
    changes = []
    for name, dim in context.config.dims.items():
        sizes = sorted({dim.min, *dim.corpus, dim.max})

        def regime_at(v: int, name: str = name) -> str | None:
            return _symbolic_point(entry, {**context.binding, name: v}, context.profile).regime

        for start, end in itertools.pairwise(sizes):
            while regime_at(start) != regime_at(end):  # each change in (start, end], first to last
                at = _first_change(regime_at, start, end)
                below, above = regime_at(at - 1), regime_at(at)
                text = f"{below} below {name} = {at}, {above} from there"
                changes.append(D.RegimeChange(name, at, str(below), str(above), text))
                start = at
    return changes


def _first_change(regime_at: Callable[[int], str | None], low: int, high: int) -> int:
    """The first size in (low, high] whose regime is not `low`'s (bisecting: regimes change in runs)."""
    below = regime_at(low)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if regime_at(mid) == below else (low, mid)
    return high


# ---- patterns ---------------------------------------------------------------------------------------


def _pattern(
    index: int, pattern: R.Pattern, main: Graph | None, graph: Graph | None, context: _Context
) -> D.DynamicPattern:
    entry = D.DynamicPattern(index, pattern.name, symbolic=False)
    match = _symbolic_match(pattern, main, graph) if main is not None and graph is not None else None
    if match is not None:
        try:
            entry.bytes_before, entry.bytes_after = expression(match.bytes_before), expression(match.bytes_after)
        except NotExpressible:
            entry.bytes_before = entry.bytes_after = None
    if (
        entry.bytes_before is not None
        and entry.bytes_after is not None
        and (
            entry.bytes_before.at(context.binding),
            entry.bytes_after.at(context.binding),
        )
        == (pattern.estimate.bytes_before, pattern.estimate.bytes_after)
    ):
        entry.symbolic = True
        entry.points = [_pattern_point(entry, p) for p in context.points]
        return entry
    entry.bytes_before = entry.bytes_after = None
    entry.note = "its bytes could not be followed as expressions: they are those of the analysis at each point"
    entry.points = [_concrete_pattern_point(pattern, p, context) for p in context.points]
    return entry


def _symbolic_match(pattern: R.Pattern, main: Graph, graph: Graph) -> patterns_mod.Match | None:
    """The pattern's first instance, found again on the graph of expressions."""
    concrete = next(
        (
            m
            for m in patterns_mod.find_patterns(main)
            if m.name == pattern.name and [op_ref(main[i]) for i in m.nodes] == pattern.ops
        ),
        None,
    )
    if concrete is None:
        return None
    try:
        symbolic = patterns_mod.find_patterns(graph)
    except TypeError:  # a pattern's test of a size that an expression cannot answer
        return None
    return next((m for m in symbolic if m.name == concrete.name and m.nodes == concrete.nodes), None)


def _pattern_point(entry: D.DynamicPattern, binding: dict[str, int]) -> D.PointCost:
    assert entry.bytes_before is not None and entry.bytes_after is not None
    before, after = int(entry.bytes_before.at(binding)), int(entry.bytes_after.at(binding))
    return D.PointCost(dict(binding), before, after, None, round(before / after, 2) if after else None)


def _concrete_pattern_point(pattern: R.Pattern, binding: dict[str, int], context: _Context) -> D.PointCost:
    model = context.concrete(binding)
    same = next((p for p in model.patterns if p.name == pattern.name and p.lines == pattern.lines), None)
    if same is None:
        return D.PointCost(dict(binding), None, None, None, None)
    estimate = same.estimate
    return D.PointCost(dict(binding), estimate.bytes_before, estimate.bytes_after, None, estimate.speedup_bound)


# ---- analyzing again at a point ---------------------------------------------------------------------


def bound_specs(config: ModelConfig, binding: dict[str, int]) -> list[InputSpec]:
    """The inputs with each named size at its value in `binding`."""
    out = []
    for spec in config.inputs or []:
        shape = [
            binding[n] if n else d for d, n in zip(spec.shape, spec.symbols or [None] * len(spec.shape), strict=True)
        ]
        out.append(InputSpec(shape, spec.dtype, spec.dtype_given, spec.high, list(spec.symbols)))
    return out


def reanalysis(
    model: torch.nn.Module,
    config: ModelConfig,
    names: list[str],
    user_code: capture.UserCode,
    source: sourcemap.SourceIndex,
    profile: cost.DeviceProfile,
    branch_paths: int,
) -> Reanalysis:
    """Analyze the model concretely at a binding, on each branch path as the analysis does: its clusters
    and patterns there."""

    def at(binding: dict[str, int]) -> R.Model:
        scratch = R.Model("", "", 0, "analyzed")
        inputs = loader.meta_inputs(bound_specs(config, binding))
        try:
            main = capture.trace(model, inputs, names, user_code)
        except capture.CaptureError:
            return scratch
        paths = [(main, "")]
        for i in range(min(len(main.branches), branch_paths)):
            decisions = [*main.branches[:i], not main.branches[i]]
            try:
                paths.append((capture.trace(model, inputs, names, user_code, decisions), f"branch {i}"))
            except capture.CaptureError:
                continue
        findings(scratch, paths, source, profile)
        return scratch

    return at
