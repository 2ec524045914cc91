"""From measured calls to lines, clusters and opaque ops: a `ModelProfile`.

Each torch call recorded its nodes; the call's time goes to:

- its line: the innermost frame of model code that made it (a library's line for a library's
  model, with the user's line that reached it);
- its cluster, when one of its nodes belongs to an instance of a report cluster;
- otherwise its kind: GEMM, attention, convolution, or an unfused op left outside every cluster.

Times are exclusive (a call's kernels are its own, never its callers'), so lines, and clusters plus
opaque ops plus unattributed time, each add up to the forward.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass, field

from fuselens.analysis.detect import detect
from fuselens.analysis.graph import Frame, Graph, Node
from fuselens.analysis.instances import groups_of
from fuselens.analysis.ops import OpClass
from fuselens.codegen.plan import check
from fuselens.contracts.profile import ClusterTime, LineTime, ModelProfile, OpaqueTime
from fuselens.contracts.report import Model

from .measure import Measured

_GEMM = frozenset({"linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "einsum", "__matmul__"})
_ATTENTION = frozenset({"scaled_dot_product_attention", "multi_head_attention_forward"})


@dataclass
class _Line:
    frame: Frame
    us: float = 0.0
    backward_us: float = 0.0
    calls: int = 0
    ops: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    clusters: set[str] = field(default_factory=set)
    entry_line: int | None = None


def attribute(model: Model, measured: Measured, home: str, kernel_module: str = "") -> ModelProfile:
    """The profile of `model` (its report) from `measured`; `home` is the profiled file, and
    `kernel_module` the fuselens kernel module beside it: a call made there is a kernel's, and its
    time goes to the line that called the kernel."""
    graph = measured.graph
    kernels: dict[str, float] = defaultdict(float)
    fell_back: set[str] = set()
    cluster_of = _clusters_by_node(model, graph)
    forward = sum(measured.call_us.values()) + measured.unattributed_us
    lines: dict[tuple[str, int], _Line] = {}
    cluster_us: dict[str, float] = defaultdict(float)
    cluster_backward: dict[str, float] = defaultdict(float)
    cluster_calls: dict[str, int] = defaultdict(int)
    opaque: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    unattributed = measured.unattributed_us
    for number, us in measured.call_us.items():
        node = _node_of_call(graph, measured.call_nodes.get(number))
        if node is None or node.source is None:
            unattributed += us
            continue
        cluster = next((cluster_of[i] for i in measured.call_nodes[number] if i in cluster_of), None)
        frame, kernel, reference = _caller_of_kernel(node, kernel_module)
        line = lines.setdefault((frame.file, frame.line), _Line(frame))
        backward = measured.backward_us.get(number, 0.0)
        line.us += us
        line.backward_us += backward
        line.calls += 1
        line.ops[kernel or node.op] += us
        if kernel:
            kernels[kernel] += us
            if reference:
                fell_back.add(kernel)
        if cluster is not None:
            line.clusters.add(cluster)
            cluster_us[cluster] += us
            cluster_backward[cluster] += backward
            cluster_calls[cluster] += 1
        else:
            opaque[_kind(node)][node.op] += us
        if frame.library and node.entry is not None and _same_file(node.entry.file, home):
            line.entry_line = node.entry.line
    attributed = forward - unattributed
    return ModelProfile(
        name=model.name,
        forward_us=round(forward, 3),
        attributed_us=round(attributed, 3),
        unattributed_us=round(unattributed, 3),
        backward_us=round(sum(measured.backward_us.values()), 3),
        wall_us=round(measured.wall_us, 3) if measured.wall_us is not None else None,
        lines=_line_times(lines, forward),
        clusters=_cluster_times(model, cluster_us, cluster_backward, cluster_calls, forward),
        opaque=_opaque_times(opaque, forward),
        unfused_us=round(sum(opaque.get("unfused op", {}).values()), 3),
        kernels={k: round(v, 3) for k, v in sorted(kernels.items())},
        fell_back=sorted(fell_back),
    )


def _caller_of_kernel(node: Node, kernel_module: str) -> tuple[Frame, str, bool]:
    """The frame whose line a call's time goes to, the fuselens kernel it ran in ("" for none), and
    whether it ran in the kernel's reference: a call in the kernel module (the kernel's op, or its
    reference's ops) counts on the line that called the kernel."""
    assert node.source is not None
    if not kernel_module or not _same_file(node.source.file, kernel_module):
        return node.source, "", False
    inside = [f.function.rsplit(".", 1)[-1] for f in node.stack if _same_file(f.file, kernel_module)]
    outside = next((f for f in node.stack if not _same_file(f.file, kernel_module)), node.source)
    called = next((m for name in inside if (m := _KERNEL.fullmatch(name))), None)
    if called is None:
        return outside, "", False
    return outside, f"cluster{called.group(1)}", any(name.endswith("_reference") for name in inside)


# A kernel's call, or its reference's (where the kernel does not run).
_KERNEL = re.compile(r"_?cluster(\d+)(?:_reference)?")


def _clusters_by_node(model: Model, graph: Graph) -> dict[int, str]:
    """Node id -> the report cluster an instance of which holds it.  The profiled forward follows
    the inputs' branches, the report's first path: clusters of its other paths did not run."""
    groups = detect(graph, check).clusters
    owner: dict[int, str] = {}
    for cluster in model.clusters:
        if cluster.path != 0:
            continue
        for group in groups_of(cluster, graph, groups):
            for member in group.members:
                owner.setdefault(member, cluster.id)
    return owner


def _node_of_call(graph: Graph, nodes: range | None) -> Node | None:
    """The node standing for a call: the last it recorded that is not a parameter, a buffer or an
    input first seen by it (a tensor the call made, `torch.arange(n)`, is its own)."""
    if not nodes:
        return None
    made = [graph[i] for i in nodes if not (graph[i].cls is OpClass.SOURCE and graph[i].op in _FOUND)]
    return made[-1] if made else None


_FOUND = frozenset({"param", "buffer", "input"})


def _kind(node: Node) -> str:
    op = node.op
    if op in _GEMM:
        return "GEMM"
    if op in _ATTENTION or "attention" in op:
        return "attention"
    if op.startswith("conv"):
        return "convolution"
    return "unfused op"


def _same_file(a: str, b: str) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def _share(us: float, forward: float) -> float:
    return round(us / forward, 4) if forward > 0 else 0.0


def _line_times(lines: dict[tuple[str, int], _Line], forward: float) -> list[LineTime]:
    out = [
        LineTime(
            file=line.frame.file,
            line=line.frame.line,
            function=line.frame.function,
            us=round(line.us, 3),
            share=_share(line.us, forward),
            calls=line.calls,
            ops=[op for op, _ in sorted(line.ops.items(), key=lambda kv: -kv[1])],
            clusters=sorted(line.clusters),
            library=line.frame.library,
            entry_line=line.entry_line,
            backward_us=round(line.backward_us, 3),
        )
        for line in lines.values()
    ]
    return sorted(out, key=lambda t: -t.us)


def _cluster_times(
    model: Model, us: dict[str, float], backward: dict[str, float], calls: dict[str, int], forward: float
) -> list[ClusterTime]:
    by_bytes = sorted(
        (c for c in model.clusters if c.id in us),
        key=lambda c: -((c.total_bytes_unfused or 0) - (c.total_bytes_fused or 0)),
    )
    bytes_rank = {c.id: k for k, c in enumerate(by_bytes, 1)}
    out = []
    for rank, cluster in enumerate(sorted(by_bytes, key=lambda c: -us[c.id]), 1):
        measured, behind = us[cluster.id], backward[cluster.id]
        predicted = (measured - behind) * _fraction(cluster.bytes_fused, cluster.bytes_unfused)
        if cluster.backward:  # a backward kernel: its traffic against the backward's ops one kernel each
            predicted += behind * _fraction(cluster.backward_bytes_fused, cluster.backward_bytes_unfused)
        else:
            predicted += behind  # the backward runs the cluster's own ops, as now
        rest = forward - (measured - predicted)
        out.append(
            ClusterTime(
                id=cluster.id,
                us=round(measured, 3),
                share=_share(measured, forward),
                calls=calls[cluster.id],
                predicted_fused_us=round(predicted, 3),
                amdahl_speedup=round(forward / rest, 4) if rest > 0 else 1.0,
                rank_by_time=rank,
                rank_by_bytes=bytes_rank[cluster.id],
                backward_us=round(behind, 3),
            )
        )
    return out


def _fraction(fused: int | None, unfused: int | None) -> float:
    return (fused or 0) / unfused if unfused else 1.0


def _opaque_times(opaque: dict[str, dict[str, float]], forward: float) -> list[OpaqueTime]:
    out = [
        OpaqueTime(
            kind, round(sum(ops.values()), 3), _share(sum(ops.values()), forward), sorted(ops, key=lambda o: -ops[o])
        )
        for kind, ops in opaque.items()
    ]
    return sorted(out, key=lambda t: -t.us)
