"""From the traces of one model to its report entries: clusters, rejections and patterns.

Each trace path (the main one, then each data-dependent branch taken the other way) is
detected, planned, costed and mapped to source; a cluster another path already showed is
not repeated, and repeated layers fold into one entry with a count (`multiplicity`).
"""

from __future__ import annotations

import functools
import linecache
import os
from dataclasses import dataclass, field
from typing import Any

from fuselens.analysis import attention, cost, places, sourcemap
from fuselens.analysis import patterns as patterns_mod
from fuselens.analysis import rewrites as rewrites_mod
from fuselens.analysis.capture import Trace
from fuselens.analysis.detect import Detection, Group, Rejected, Split, detect
from fuselens.analysis.graph import Graph, Node
from fuselens.analysis.repeats import group_repeats
from fuselens.codegen.plan import KernelPlan, PlanError, plan_cluster, returned_outputs
from fuselens.contracts import report as R

from .pieces import split_into_pieces


@dataclass
class Found:
    """One cluster instance, before repeats are merged."""

    graph: Graph
    plan: KernelPlan
    mapping: sourcemap.Mapping
    unfused: int | None
    fused: int | None
    path_note: str
    splits: list[Split]
    path: int = 0  # which trace of the model it is in
    position: int = 0  # its place among the clusters detected in that trace
    part: list[int] = field(default_factory=list)  # where it is a part of that cluster (`Cluster.parts`)


def op_ref(node: Node) -> R.OpRef:
    src = node.source
    meta = node.meta
    return R.OpRef(
        node.op,
        src.file if src else "",
        src.line if src else 0,
        list(meta.shape) if meta else None,
        meta.dtype if meta else None,
        node.owner or node.module,
        node.call,
    )


def findings(
    model: R.Model, paths: list[tuple[Trace, str]], source: sourcemap.SourceIndex, profile: cost.DeviceProfile
) -> list[Found]:
    """Fill the model's clusters, rejections and patterns; return the cluster instances behind them."""
    found: list[Found] = []
    rejected: list[tuple[Graph, Any, str]] = []
    matches: list[tuple[Graph, patterns_mod.Match, str]] = []
    seen_signatures: set = set()
    for index, (trace, note) in enumerate(paths):
        graph = trace.graph
        plans = _Plans(graph)
        detection: Detection = detect(graph, plans.check)
        path_found = []
        placed = _gemms_on_lines_of_their_own(plans, detection, source)
        for position, detected in enumerate(detection.clusters):
            entry = placed[position]
            if entry is None:
                continue
            group, (plan, mapping) = entry
            if mapping.region is None and _BIAS_KEPT in mapping.detail:
                smaller = _without_the_bias(plans, group, mapping.detail, detection)
                if smaller is not None:
                    group = smaller
                    plan, mapping = _planned(plans, group, source)
            parts = [(group, (plan, mapping))]
            if mapping.region is None:
                parts = (
                    split_into_pieces(
                        graph,
                        group,
                        mapping.detail,
                        functools.partial(_placed, plans, source=source),
                        detection.rejected,
                    )
                    or parts
                )
            whole = sorted(detected.members)
            for piece, (plan, mapping) in parts:
                inputs = [s.node for s in plan.inputs]
                outputs = [o.node for o in returned_outputs(plan)]
                unfused, fused = cost.cluster_bytes(graph, plan.compute, inputs, outputs)
                part = [] if piece.members == detected.members else [whole.index(m) for m in sorted(piece.members)]
                path_found.append(
                    Found(graph, plan, mapping, unfused, fused, note, piece.splits, index, position, part)
                )
        path_rejected = [(graph, r, note) for r in detection.rejected]
        path_matches = [(graph, m, note) for m in patterns_mod.find_patterns(graph)]
        if index == 0:
            found += path_found
            rejected += path_rejected
            matches += path_matches
            seen_signatures = {_signature(f) for f in found}
            continue
        # Other branch paths add only what the main path did not already show: the clusters, and the
        # ops left out of one (those only a branch the main path does not take runs, too).
        found += [f for f in path_found if _signature(f) not in seen_signatures]
        seen_signatures |= {_signature(f) for f in found}
        shown = {_rejection_signature(r) for r in rejected}
        rejected += [r for r in path_rejected if _rejection_signature(r) not in shown]
    _refuse_regions_other_calls_need(found)
    groups = group_repeats(found, _signature)
    model.clusters = [_cluster(group, profile, source) for group in groups]
    model.rejections = [_rejection(group, source) for group in group_repeats(rejected, _rejection_signature)]
    pattern_groups = group_repeats(matches, _pattern_signature)
    model.patterns = [_pattern(group, source, profile) for group in pattern_groups]
    # Which clusters each pattern overlaps, by op identity within the same trace.
    for pattern, matched in zip(model.patterns, pattern_groups, strict=True):
        graph, match, _ = matched[0]
        pattern.clusters = [
            str(i)
            for i, f in enumerate(g[0] for g in groups)
            if f.graph is graph and set(f.plan.compute) & set(match.nodes)
        ]
    model.totals.clusters = len(model.clusters)
    saved = [c.bytes_saved * c.multiplicity for c in model.clusters if c.bytes_saved is not None and not c.branch]
    model.totals.bytes_avoidable = sum(saved)
    return [group[0] for group in groups]


class _Plans:
    """The kernel plans of one trace's groups of ops, by their members: detection plans each group it
    tries (`check`), and the mapping of a cluster it keeps needs the plan of its last try again."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._made: dict[frozenset[int], KernelPlan] = {}

    def check(self, graph: Graph, members: frozenset[int]) -> tuple[bool, str, str]:
        """`codegen.plan.check`, keeping the plan."""
        try:
            self._made[members] = plan_cluster(graph, set(members))
        except PlanError as exc:
            return False, exc.reason, exc.detail
        return True, "", ""

    def of(self, members: set[int]) -> KernelPlan:
        made = self._made.get(frozenset(members))
        return made if made is not None else plan_cluster(self.graph, members)


def _planned(plans: _Plans, group: Group, source: sourcemap.SourceIndex) -> tuple[KernelPlan, sourcemap.Mapping]:
    """The cluster's kernel plan, and where its code is."""
    graph = plans.graph
    plan = plans.of(group.members)
    inputs = [s.node for s in plan.inputs]
    outputs = [o.node for o in returned_outputs(plan)]
    numbers = [(n.text, n.at) for n in plan.scalars]
    return plan, sourcemap.map_cluster(graph, plan.compute, set(group.members), inputs, outputs, source, numbers)


def _placed(plans: _Plans, group: Group, source: sourcemap.SourceIndex) -> tuple[KernelPlan, sourcemap.Mapping] | None:
    """The piece's plan and mapping where one kernel call can stand in for its code, else None."""
    plan, mapping = _planned(plans, group, source)
    return (plan, mapping) if mapping.region is not None else None


# What the source map says of a convolution whose bias add joined the cluster but whose call the code
# cannot make without its bias (a module of the library's own that holds the convolution).
_BIAS_KEPT = "adds its bias in the cluster, but"


def _without_the_bias(plans: _Plans, group: Group, why: str, detection: Detection) -> Group | None:
    """The cluster without the bias add of a convolution whose call must keep its bias: its other ops,
    where they are still one kernel (the bias add is then left out, with why)."""
    graph = plans.graph
    biases = [
        m for m in group.members if graph[m].op == "add" and any(graph[i].op in _CONVOLUTIONS for i in graph[m].inputs)
    ]
    if len(biases) != 1:
        return None
    rest = set(group.members) - set(biases)
    if not any(graph[m].cls.absorbable for m in rest) or not plans.check(graph, frozenset(rest))[0]:
        return None
    detail = why.split("; ")[-1]
    detection.rejected.append(Rejected(biases[0], "layer-boundary", f"{detail}: the bias stays with it"))
    return Group(rest, group.splits)


_CONVOLUTIONS = frozenset({"conv1d", "conv2d", "conv3d"})


def _gemms_on_lines_of_their_own(
    plans: _Plans, detection: Detection, source: sourcemap.SourceIndex
) -> list[tuple[Group, tuple[KernelPlan, sourcemap.Mapping]] | None]:
    """Each detected group with its plan and mapping, the GEMM a group starts with left out where the
    group's code would then have no one call of its own: no region (the GEMM is a layer's last
    projection, the ops after it the caller's), one that another call of its lines needs as written (a
    helper defined between the GEMM's line and the ops', run in a call of its own), or one that shares
    a line with another group's (the GEMM's statement on the line where the group before it ends:
    `w = torch.tanh(z) + 1.0; u = self.proj(w)`), which one rewrite of the line could not give both calls.  Of two groups that start with GEMMs and
    share a line, the later one leaves its GEMM out.  None for a group of one op after its GEMM, left out
    as detection would have left it."""
    graph = plans.graph
    placed: list[tuple[Group, tuple[KernelPlan, sourcemap.Mapping]] | None] = [
        (group, _planned(plans, group, source)) for group in detection.clusters
    ]

    def strip(k: int, group: Group) -> None:
        epilogue = _without_the_gemm(graph, group, detection)
        placed[k] = None if epilogue is None else (epilogue, _planned(plans, epilogue, source))

    def gemm_groups() -> list[tuple[int, Group, sourcemap.Mapping]]:
        return [(k, e[0], e[1][1]) for k, e in enumerate(placed) if e is not None and e[0].gemm is not None]

    changed = True
    while changed:
        changed = False
        for k, group, mapping in gemm_groups():  # no region, or a region on another group's lines
            if placed[k] is not None and (mapping.region is None or _shares_lines(placed, k)):
                strip(k, group)
                changed = True
        if changed:
            continue
        # Then those whose region another call needs as written: worked out over every region at once,
        # so one group at a time, each leaving out its GEMM changing what the others' calls need.
        needed = _needed_as_written(graph, placed)
        first = next(((k, group) for k, group, mapping in gemm_groups() if id(mapping) in needed), None)
        if first is not None:
            strip(*first)
            changed = True
    return placed


def _needed_as_written(graph: Graph, placed: list) -> set[int]:
    """The mappings (their ids) whose region another call of its lines needs as written: it computes
    something else there (a helper defined inside them, run in a call of its own), so that the region
    would be refused."""
    found = [
        Found(graph, plan, mapping, None, None, "", []) for entry in placed if entry for plan, mapping in [entry[1]]
    ]
    return {id(f.mapping) for group, _ in _regions_other_calls_need(found) for f in group}


def _shares_lines(placed: list, k: int) -> bool:
    """Whether the region of group `k` shares a line with another group's: an earlier one's, or a later
    one's that starts with no GEMM (that one keeps its code)."""
    region = placed[k][1][1].region
    for j, other in enumerate(placed):
        if j == k or other is None or other[1][1].region is None:
            continue
        theirs = other[1][1].region
        if j > k and other[0].gemm is not None:
            continue  # the later GEMM cluster leaves its GEMM out
        if os.path.abspath(theirs.file) != os.path.abspath(region.file) or (theirs.first, theirs.last) == (
            region.first,
            region.last,
        ):
            continue  # elsewhere, or the same lines (another layer's call of them, asked in turn)
        if not (theirs.last < region.first or region.last < theirs.first):
            return True
    return False


def _without_the_gemm(graph: Graph, group: Group, detection: Detection) -> Group | None:
    """A cluster that starts with a GEMM whose code no one call can stand in for (the GEMM is a layer's
    last projection, the ops after it the caller's residual add): its ops without the GEMM, as
    detection had grouped them; None where that was one op, which is left out as it was, with why."""
    rest = {m for m in group.members if m != group.gemm and not _only_reads(graph, m, group.gemm)}
    if len([m for m in rest if graph[m].cls.absorbable]) < 2:
        only = next(m for m in rest if graph[m].cls.absorbable)
        detection.rejected.append(Rejected(only, *(group.alone or ("no-neighbour", ""))))
        detection.rejected.sort(key=lambda r: r.node)
        return None
    return Group(rest, group.splits)


def _only_reads(graph: Graph, member: int, gemm: int | None) -> bool:
    """Whether `member` is an identity the cluster took in only to read the GEMM's result through."""
    node = graph[member]
    while node.cls.free and node.inputs:
        if node.inputs[0] == gemm:
            return True
        node = graph[node.inputs[0]]
    return False


def _refuse_regions_other_calls_need(found: list[Found]) -> None:
    """A region is code of a function, and the rewrite written there runs in every call of it.  Where a
    call runs the region's lines and computes other ops there (a layer whose `self.activation` is
    `nn.Identity()` in another instance, or `None`), a kernel must not stand for them: that is fine
    where its `fits` tells that call apart (a module the lines call is of another class or set up
    otherwise, or an `if` the lines sit in went the other way), and the rewrite runs the lines there;
    otherwise no call is offered.  (A call that computes the same ops, fused otherwise, is fine.)"""
    for group, detail in _regions_other_calls_need(found):
        for f in group:
            f.mapping.region = None
            f.mapping.quality = "pointer"
            f.mapping.detail = f"{f.mapping.detail}; {detail}" if f.mapping.detail.startswith("its code is") else detail


def _regions_other_calls_need(found: list[Found]) -> list[tuple[list[Found], str]]:
    """The instances of each region that another call of its lines needs left as written, with why."""
    refused = []
    by_region: dict[tuple, list[Found]] = {}
    for f in found:
        region = f.mapping.region
        if region is not None:
            by_region.setdefault((id(f.graph), region.file, region.first, region.last), []).append(f)
    for (_, file, first, last), group in by_region.items():
        graph = group[0].graph
        calls = _calls_running(graph, file, first, last)
        span = f"line {first}" if first == last else f"lines {first}–{last}"
        detail = ""
        for f in group:
            place = places.common_place(graph, f.plan.compute)
            own = calls.get(place.invocation) if place is not None else None
            if own is None:
                continue
            for invocation, other in calls.items():
                if other.iteration == own.iteration or _told_apart(graph, f, own, other):
                    continue
                if invocation in [p.invocation for g in group if (p := places.common_place(graph, g.plan.compute))]:
                    detail = f"{span} compute {own.chain} in one call and {other.chain} in another: one kernel call cannot stand for both"
                else:
                    detail = f"{span} also run in `{other.owner or 'the model'}`, where they compute something else: a kernel call there would change it"
                break
            if detail:
                break
        if detail:
            refused.append((group, detail))
    return refused


@dataclass
class _Call:
    """What one call of a function runs on a region's lines."""

    owner: str  # the module path of its `self`
    ops: list[str] = field(default_factory=list)  # the fusable ops, in order
    lines: set[int] = field(default_factory=set)  # the lines they ran on

    @property
    def chain(self) -> str:
        return " → ".join(self.iteration)

    @property
    def iteration(self) -> list[str]:
        """The ops one evaluation of the lines runs: a loop over them (a mixture's experts) runs the same
        ops again each time, as many times as it loops."""
        n = len(self.ops)
        period = next((p for p in range(1, n + 1) if n % p == 0 and self.ops == self.ops[:p] * (n // p)), n)
        return self.ops[:period]


def _calls_running(graph: Graph, file: str, first: int, last: int) -> dict[int, _Call]:
    """Each call (invocation) of the function whose lines `first`..`last` of `file` ran fusable ops."""
    calls: dict[int, _Call] = {}
    for node in graph:
        if not node.cls.absorbable:
            continue
        for frame in node.stack:
            if frame.file == file and first <= frame.line <= last:
                call = calls.setdefault(frame.invocation, _Call(frame.owner))
                call.ops.append(node.op)
                call.lines.add(frame.line)
                break
    return calls


def _told_apart(graph: Graph, f: Found, own: _Call, other: _Call) -> bool:
    """Whether the kernel's `fits` answers no for the other call: a module its lines call is of another
    class, set up otherwise or in another mode there, or the `if`s the lines sit in went another way
    (the other call ran ops on other lines of the region)."""
    region = f.mapping.region
    if region is None:
        return False
    for module in region.checks:
        mine, theirs = (
            f"{o}.{module.path}" if o and module.path else (module.path or o) for o in (own.owner, other.owner)
        )
        if module.path and graph.module_classes.get(mine) != graph.module_classes.get(theirs):
            return True
        if module.mode is not None and graph.module_training.get(mine) != graph.module_training.get(theirs):
            return True
        if module.path:
            settings = [
                {k: v for k, v in graph.module_settings.get(m, {}).items() if k not in module.taken}
                for m in (mine, theirs)
            ]
            if settings[0] != settings[1]:
                return True
    return bool(region.conditions) and own.lines != other.lines


def _signature(f: Found):
    g = f.graph
    ops = tuple((g[i].op, g[i].file, g[i].line) for i in f.plan.compute)
    ins = tuple((s.shape, s.dtype) for s in f.plan.inputs)
    outs = tuple((o.shape, o.dtype) for o in returned_outputs(f.plan))
    return ops, ins, outs


def _cluster(group: list[Found], profile: cost.DeviceProfile, source: sourcemap.SourceIndex) -> R.Cluster:
    first = group[0]
    g, plan, mapping = first.graph, first.plan, first.mapping
    ops = [op_ref(g[i]) for i in plan.compute]
    names_in: list[str | None] = list(mapping.region.arguments) if mapping.region else [None] * len(plan.inputs)
    inputs = [
        R.TensorInfo(list(s.shape), s.dtype, names_in[k] if k < len(names_in) else None)
        for k, s in enumerate(plan.inputs)
    ]
    for k, info in enumerate(inputs):
        if info.name is None:
            node = g[plan.inputs[k].node]
            info.name = _param_expr(node)
    names_out: list[str | None] = (
        list(mapping.region.outputs)
        if mapping.region and mapping.region.outputs
        else [None] * len(returned_outputs(plan))
    )
    outputs = [  # a loss totalled over the rows is returned as its total: one number
        R.TensorInfo(
            [] if o.total else list(o.shape),
            o.total.dtype if o.total else o.dtype,
            names_out[k] if k < len(names_out) else None,
        )
        for k, o in enumerate(returned_outputs(plan))
    ]
    lines = list(mapping.lines) if mapping.lines != (0, 0) else [min(op.line for op in ops), max(op.line for op in ops)]
    boundaries = []
    for split in first.splits:
        node = g[split.node]
        boundaries.append(R.Boundary(op_ref(node), split.reason, split.detail))
    cluster = R.Cluster(
        id="",
        kind=plan.kind,
        ops=ops,
        inputs=inputs,
        outputs=outputs,
        file=mapping.file or (ops[0].file if ops else ""),
        lines=lines,
        function=mapping.function,
        mapping=mapping.quality,
        mapping_detail=mapping.detail,
        bytes_unfused=first.unfused,
        bytes_fused=first.fused,
        regime=cost.regime(g, plan.compute, first.fused, profile) if first.fused is not None else None,
        multiplicity=len(group),
        instances=[f.graph[f.plan.compute[0]].owner for f in group],
        boundaries=boundaries,
        branch=first.path_note,
        total_bytes_unfused=_times(first.unfused, len(group)),
        total_bytes_fused=_times(first.fused, len(group)),
        path=first.path,
        positions=[f.position for f in group],
        parts=[f.part for f in group] if any(f.part for f in group) else [],
    )
    if not _here(cluster.file, source):
        cluster.reached_from = _reached_from(g, plan.compute, source)
        cluster.code = _code(cluster.file, cluster.lines)
    return cluster


def _here(file: str, source: sourcemap.SourceIndex) -> bool:
    return not file or os.path.abspath(file) == source.path


def _reached_from(graph: Graph, node_ids: list[int], source: sourcemap.SourceIndex) -> R.SourceRef | None:
    """The line of the analyzed file that reaches ops whose code is elsewhere (None: none reaches them,
    as in a model whose forward is all a library's; the model's own line stands for it then)."""
    frame = places.entry_point(graph, node_ids, source.path)
    return R.SourceRef(frame.file, frame.line) if frame is not None else None


def _code(file: str, lines: list[int]) -> list[str]:
    """The lines as they read in `file` (a library's), for a hover that shows them where they are used."""
    shown = [linecache.getline(file, n).rstrip("\n") for n in range(lines[0], min(lines[1], lines[0] + 11) + 1)]
    if lines[1] > lines[0] + 11:
        shown.append(f"# … {lines[1] - lines[0] - 11} more lines, to line {lines[1]}")
    return shown


def _times(count: int | None, multiplicity: int) -> int | None:
    return None if count is None else count * multiplicity


def _param_expr(node: Node) -> str | None:
    if node.op in ("param", "buffer") and node.name:
        return node.name
    if node.op == "input":
        return node.name
    return None


def _rejection_signature(item):
    graph, r, _ = item
    node = graph[r.node]
    return node.op, node.file, node.line, r.reason


def _rejection(group, source: sourcemap.SourceIndex) -> R.Rejection:
    graph, r, _ = group[0]
    node = graph[r.node]
    ref = op_ref(node)
    rejection = R.Rejection([ref], r.reason, r.detail, ref.file, [ref.line, ref.line], multiplicity=len(group))
    if not _here(ref.file, source):
        rejection.reached_from = _reached_from(graph, [r.node], source)
    return rejection


def _pattern_signature(item):
    graph, m, _ = item
    return m.name, tuple((graph[i].op, graph[i].line) for i in m.nodes)


def _pattern(group, source: sourcemap.SourceIndex, profile: cost.DeviceProfile) -> R.Pattern:
    graph, m, _ = group[0]
    ops = [op_ref(graph[i]) for i in m.nodes]
    place = places.common_place(graph, m.nodes)
    lines = list(place.lines) if place else [0, 0]
    pattern = R.Pattern(
        m.name,
        ops,
        place.file if place else (ops[0].file if ops else ""),
        lines,
        R.PatternEstimate(m.bytes_before, m.bytes_after, m.speedup),
        dict(m.dims),
        multiplicity=len(group),
        summary=m.summary,
        memory=m.memory,
    )
    if not _here(pattern.file, source):
        pattern.reached_from = _reached_from(graph, m.nodes, source)
    built = rewrites_mod.rewrite_of(graph, m, source)
    if isinstance(built, R.Rewrite):
        pattern.rewrite = built
    elif built is not None:
        pattern.refusal, pattern.refusal_detail = built.code, built.detail
    if isinstance(m.parts, attention.Attention):
        _attention_dims(pattern, graph, m, profile)
    return pattern


def _attention_dims(pattern: R.Pattern, graph: Graph, m: patterns_mod.Match, profile: cost.DeviceProfile) -> None:
    """What an attention's diagnostic and hover say beside its bytes: the regime a fused attention is in
    on the device profile, and the kernel its rewrite's call runs there."""
    parts: attention.Attention = m.parts
    pattern.dims["regime"] = cost.regime(graph, m.nodes, m.bytes_after, profile)
    if pattern.rewrite is not None:
        mask, flex = parts.written_mask, parts.written_flex
    else:  # what the call would run, were the code rewritten
        mask, flex = pattern.dims.get("mask", "none"), bool(parts.score_mods)
    backend = attention.sdpa_backend(pattern.dims, mask, parts.dropout is not None, flex, profile.name)
    pattern.dims["backend"], pattern.dims["backend_detail"] = backend.name, backend.detail
