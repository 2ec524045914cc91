"""From the traces of one model to its report entries: clusters, rejections and patterns.

Each trace path (the main one, then each data-dependent branch taken the other way) is
detected, planned, costed and mapped to source; a cluster another path already showed is
not repeated, and repeated layers fold into one entry with a count (`multiplicity`).
"""

from __future__ import annotations

import linecache
import os
from dataclasses import dataclass
from typing import Any

from fuselens.analysis import cost, places, sourcemap
from fuselens.analysis import patterns as patterns_mod
from fuselens.analysis.capture import Trace
from fuselens.analysis.detect import Detection, Split, detect
from fuselens.analysis.graph import Graph, Node
from fuselens.analysis.repeats import group_repeats
from fuselens.codegen.plan import KernelPlan, check, plan_cluster, returned_outputs
from fuselens.contracts import report as R


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
        detection: Detection = detect(graph, check)
        path_found = []
        for position, group in enumerate(detection.clusters):
            plan = plan_cluster(graph, group.members)
            inputs = [s.node for s in plan.inputs]
            outputs = [o.node for o in returned_outputs(plan)]
            unfused, fused = cost.cluster_bytes(graph, plan.compute, inputs, outputs)
            numbers = [(n.text, n.at) for n in plan.scalars]
            mapping = sourcemap.map_cluster(graph, plan.compute, set(group.members), inputs, outputs, source, numbers)
            path_found.append(Found(graph, plan, mapping, unfused, fused, note, group.splits, index, position))
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
    model.patterns = [_pattern(group, source) for group in pattern_groups]
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


def _refuse_regions_other_calls_need(found: list[Found]) -> None:
    """A region is code of a function, and a kernel call written there runs in every call of it.  Where
    a call runs the region's lines and computes other ops there (a layer whose `self.activation` is
    `nn.Identity()` in another instance), the kernel would change what that call computes: no call is
    offered there.  (A call that computes the same ops, fused otherwise, is fine.)"""
    by_region: dict[tuple, list[Found]] = {}
    for f in found:
        region = f.mapping.region
        if region is not None:
            by_region.setdefault((id(f.graph), region.file, region.first, region.last), []).append(f)
    for (_, file, first, last), group in by_region.items():
        graph = group[0].graph
        ops_by_call: dict[int, list[str]] = {}  # invocation -> the fusable ops the region's lines run there
        owners: dict[int, str] = {}
        for node in graph:
            if not node.cls.absorbable:
                continue
            for frame in node.stack:
                if frame.file == file and first <= frame.line <= last:
                    ops_by_call.setdefault(frame.invocation, []).append(node.op)
                    owners.setdefault(frame.invocation, frame.owner)
                    break
        held = [p.invocation for f in group if (p := places.common_place(graph, f.plan.compute))]
        computed = {" → ".join(ops_by_call.get(i, [])) for i in held}
        span = f"line {first}" if first == last else f"lines {first}–{last}"
        other = [i for i in ops_by_call if i not in held and " → ".join(ops_by_call[i]) not in computed]
        if other:
            owner = owners[other[0]] or "the model"
            detail = (
                f"{span} also run in `{owner}`, where they compute something else: a kernel call there would change it"
            )
        elif len(computed) > 1:
            detail = f"{span} compute {' in one call and '.join(sorted(computed))} in another: one kernel call cannot stand for both"
        else:
            continue
        for f in group:
            f.mapping.region = None
            f.mapping.quality = "pointer"
            f.mapping.detail = f"{f.mapping.detail}; {detail}" if f.mapping.detail.startswith("its code is") else detail


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


def _pattern(group, source: sourcemap.SourceIndex) -> R.Pattern:
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
    )
    if not _here(pattern.file, source):
        pattern.reached_from = _reached_from(graph, m.nodes, source)
    return pattern
