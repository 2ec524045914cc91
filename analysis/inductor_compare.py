"""Compare fuselens's clusters with the kernels Inductor generated for the same model.

Input: one model of the analysis report (`contracts.report.Model`) and the `InductorCapture`
of the same model.  Output: an `InductorComparison` (`contracts.inductor`), plain data for the
versioned report.  No torch import here.

Each cluster of ours gets one status:

- `agree`            one Inductor kernel computes exactly the cluster's ops;
- `inductor-wider`   one kernel computes all of them and more: the extra ops are named,
                     with our rejection reason when we rejected them and the cluster that
                     holds them when another cluster does;
- `inductor-splits`  no kernel computes all of them, but one computes two or more: each
                     kernel is listed with the cluster lines it covers;
- `inductor-misses`  no Inductor kernel computes two or more of its ops;
- `not-found`        none of its ops is in Inductor's graphs (e.g. a branch the example
                     inputs did not take), so there is nothing to compare.

Inductor kernels that fuse two or more user ops and match no cluster are listed as
`unmatched`, with our rejection reasons for their ops; `kernels` accounts for every kernel.

How ops are matched (the heuristic):

1. By source position first.  An op of ours (`target`, `file`, `line`) can only be an
   Inductor op at the same file and line.  Both sides take the innermost frame in the
   user's code, so a helper such as `rotate_half` puts its ops at the helper's lines.
2. By name as a tiebreak, when a line holds several ops (`x * 2` and `softmax` on one line).
   The Inductor side names ops by Dynamo's graph (torch-level calls, canonicalised with the
   same vocabulary as ours, analysis/ops.py), not by their aten decomposition, so names
   mostly agree as they are; `_EQUIVALENT` covers the few spellings that differ.  If no op
   on the line agrees by name, every op on the line is a candidate (reported in
   `by_line_only`).
3. By data edges, to tell repeated code apart.  A line can hold many Inductor ops: every
   layer of a model runs the same lines, and a helper runs once per call site.  The
   candidates are split into connected groups along Dynamo's data edges (through views;
   an edge joining two candidates for the same op of ours joins two occurrences, and is cut);
   each group that covers every op of the cluster is one instance of it (a cluster of
   ours with multiplicity 2 usually finds two).  Groups covering only part (the other call
   site of a shared helper) are left to the clusters they belong to.  If no group covers
   all, the candidates are compared as one group and the instance is marked unconnected.
4. Larger clusters first.  An Inductor op serves one cluster instance: where a smaller
   cluster's lines recur inside a larger one (RMSNorm's lines inside "residual add +
   RMSNorm"), the larger cluster takes that occurrence and the smaller one the others.

A cluster with several instances takes the most significant status among them, in the
order misses > splits > wider > agree; each instance keeps its own.  An op Inductor computes
in more than one kernel (it recomputes cheap pointwise producers rather than store them) is
marked `recomputed`; it does not stop a kernel that computes the whole cluster from counting
as that cluster's kernel.  A kernel computing only some of an op's aten nodes (on CUDA, a
Linear's bias add joins the next pointwise kernel while the GEMM stays a library call) names
the part it computes (`part`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from fuselens.contracts.inductor import (
    AbsorbedOp,
    AtenOp,
    ClusterComparison,
    InductorCapture,
    InductorComparison,
    InductorKernel,
    InductorOp,
    InstanceComparison,
    KernelAccount,
    KernelShare,
    OpSummary,
    UnmatchedFusion,
)
from fuselens.contracts.report import Cluster, Model, OpRef

from .components import components
from .ops import op_class

_SIGNIFICANCE = {"not-found": 0, "agree": 1, "inductor-wider": 2, "inductor-splits": 3, "inductor-misses": 4}

# Spellings of one computation that differ between our capture and Dynamo's graph.
_EQUIVALENT = [
    frozenset({"hardtanh", "clamp", "relu6"}),
    frozenset({"amax", "max"}),
    frozenset({"amin", "min"}),
    frozenset({"copy", "contiguous", "clone"}),
    frozenset({"div", "truediv"}),
    frozenset({"matmul", "mm", "bmm"}),
]

Key = tuple[int, str]  # (graph index, Dynamo node name): one Inductor op


# ---- entry point -----------------------------------------------------------------------------


def compare_with_inductor(model: Model, capture: InductorCapture) -> InductorComparison:
    """Classify each cluster of `model` against Inductor's kernels in `capture`."""
    inductor = _Inductor(capture)
    ours = _Ours(model)
    result = InductorComparison(model=model.name, backend=capture.backend, notes=list(capture.notes))
    clusters = model.clusters
    # Larger clusters choose first, and an Inductor op serves one cluster instance only: where
    # a smaller cluster's lines recur inside a larger one (RMSNorm's lines inside "residual add
    # + RMSNorm"), the larger takes that occurrence and the smaller the others.
    comparisons: dict[int, ClusterComparison] = {}
    claimed: set[Key] = set()
    for i in sorted(range(len(clusters)), key=lambda i: (-_size(clusters[i]), i)):
        comparisons[i] = _compare_cluster(clusters[i], inductor, ours, claimed)
    touched: dict[str, list[str]] = {}
    for i in range(len(clusters)):
        comparison = comparisons[i]
        result.clusters.append(comparison)
        for instance in comparison.instances:
            for share in instance.kernels:
                ids = touched.setdefault(share.kernel, [])
                if comparison.cluster not in ids:
                    ids.append(comparison.cluster)
    for kernel in inductor.kernels.values():
        result.kernels.append(_account(kernel, touched.get(kernel.id, []), result, inductor, ours))
    return result


def _account(
    kernel: InductorKernel, clusters: list[str], result: InductorComparison, inductor: _Inductor, ours: _Ours
) -> KernelAccount:
    """What one Inductor kernel is, from our side; an unmatched fusion is also listed as one."""
    n = len(kernel.user_ops)
    if clusters:
        role = "cluster"
    elif n >= 2:
        role = "unmatched-fusion"
        result.unmatched.append(_unmatched(kernel, inductor, ours))
    elif n == 1:
        role = "single-op"
    else:  # computes only data movement, or only nodes a pattern rewrite left without provenance
        role = "unattributed" if kernel.unattributed else "no-user-ops"
    return KernelAccount(kernel.id, kernel.name, kernel.kind, n, role, clusters)


def _size(cluster: Cluster) -> int:
    return sum(1 for op in cluster.ops if not op_class(op.target).free)


# ---- the two sides, indexed ------------------------------------------------------------------


def _same_op(a: str, b: str) -> bool:
    return a == b or any(a in group and b in group for group in _EQUIVALENT)


def _norm(path: str) -> str:
    return os.path.normcase(os.path.normpath(path)) if path else ""


class _Inductor:
    """Inductor's ops and kernels, keyed by (graph, op name) and kernel id."""

    def __init__(self, capture: InductorCapture):
        self.ops: dict[Key, InductorOp] = {}
        self.kernels: dict[str, InductorKernel] = {}
        self.order: dict[Key, int] = {}
        self.by_line: dict[tuple[str, int], list[Key]] = {}
        # which aten nodes of each user op each kernel computes, to tell a kernel computing a
        # whole op from one computing part of it, and a recomputation from a split
        self.aten_of: dict[tuple[str, Key], list[AtenOp]] = {}  # (kernel, op) -> its aten nodes there
        self.aten_kernels: dict[Key, set[str]] = {}
        self.aten_all: dict[Key, set[str]] = {}
        for graph in capture.graphs:
            g = graph.index
            for op in graph.ops:
                key = (g, op.name)
                self.ops[key] = op
                self.order[key] = len(self.order)
                if not op.free and op.line:
                    self.by_line.setdefault((_norm(op.file), op.line), []).append(key)
            for kernel in graph.kernels:
                self.kernels[kernel.id] = kernel
                for aten in kernel.aten_ops:
                    if aten.layout:
                        continue
                    self.aten_kernels.setdefault((g, aten.name), set()).add(kernel.id)
                    for user_op in aten.user_ops:
                        self.aten_of.setdefault((kernel.id, (g, user_op)), []).append(aten)
                        self.aten_all.setdefault((g, user_op), set()).add(aten.name)

    def candidates(self, op: OpRef) -> tuple[list[Key], bool]:
        """Inductor ops that may be our `op`, and whether only the line (not the name) matched."""
        on_line = self.by_line.get((_norm(op.file), op.line), [])
        named = [k for k in on_line if _same_op(self.ops[k].op, op.target)]
        return (named, False) if named or not on_line else (list(on_line), True)

    def kernels_of(self, key: Key) -> list[str]:
        return self.ops[key].kernels

    def kernel_ops(self, kernel: InductorKernel) -> list[Key]:
        return [(kernel.graph, name) for name in kernel.user_ops]

    def summary(self, key: Key) -> OpSummary:
        op = self.ops[key]
        return OpSummary(op.op, op.file, op.line)


class _Ours:
    """Our clusters, boundaries and rejections, for naming what Inductor absorbed."""

    def __init__(self, model: Model):
        self.cluster_ops = [(c.id, op) for c in model.clusters for op in c.ops]
        self.rejections = [(r.reason, r.detail, op) for r in model.rejections for op in r.ops]

    def cluster_of(self, op: InductorOp, other_than: str | None) -> str | None:
        for cid, ours in self.cluster_ops:
            if cid != other_than and _matches(ours, op):
                return cid
        return None

    def rejection_of(self, op: InductorOp, cluster: Cluster | None) -> tuple[str | None, str]:
        """Why we left `op` out: the cluster's own boundary first, then the model's rejections."""
        for boundary in cluster.boundaries if cluster else []:
            if _matches(boundary.op, op):
                return boundary.reason, boundary.detail
        for reason, detail, ours in self.rejections:
            if _matches(ours, op):
                return reason, detail
        return None, ""


def _matches(ours: OpRef, theirs: InductorOp) -> bool:
    return ours.line == theirs.line and _norm(ours.file) == _norm(theirs.file) and _same_op(ours.target, theirs.op)


# ---- one cluster -----------------------------------------------------------------------------


def _compare_cluster(cluster: Cluster, inductor: _Inductor, ours: _Ours, claimed: set[Key]) -> ClusterComparison:
    ops = [op for op in cluster.ops if not op_class(op.target).free]
    result = ClusterComparison(cluster=cluster.id, status="not-found", summary="", lines=list(cluster.lines))
    candidates: list[list[Key]] = []
    for op in ops:
        found, line_only = inductor.candidates(op)
        summary = OpSummary(op.target, op.file, op.line)
        if not found:
            result.not_found.append(summary)
        elif line_only:
            result.by_line_only.append(summary)
        candidates.append(found)
    placed = [i for i, c in enumerate(candidates) if c]
    if not placed:
        result.summary = "Inductor's graphs hold none of these ops (a branch the example inputs did not take?)"
        return result
    for group, connected in _instances(candidates, placed, inductor, claimed):
        result.instances.append(_classify(group, connected, cluster, inductor, ours))
        if connected:
            claimed.update(group)
    result.status = max((i.status for i in result.instances), key=_SIGNIFICANCE.__getitem__)
    result.summary = _cluster_summary(result)
    return result


def _instances(
    candidates: list[list[Key]], placed: list[int], inductor: _Inductor, claimed: set[Key]
) -> list[tuple[list[Key], bool]]:
    """Connected groups of candidate ops that each cover every placed op of the cluster.

    Ops another cluster's instance already took are left out, unless without them no group
    is complete (then the two clusters overlap in Inductor's view and both see the op)."""
    free = [[k for k in c if k not in claimed] for c in candidates]
    groups = _complete_groups(free, placed, inductor)
    if not groups:
        groups = _complete_groups(candidates, placed, inductor)
    if groups:
        return [
            (sorted(g, key=inductor.order.__getitem__), True)
            for g in sorted(groups, key=lambda g: min(inductor.order[k] for k in g))
        ]
    pool = {key for c in candidates for key in c}
    return [(sorted(pool, key=inductor.order.__getitem__), False)]


def _complete_groups(candidates: list[list[Key]], placed: list[int], inductor: _Inductor) -> list[set[Key]]:
    """Split the candidates into groups along data edges; keep the groups covering every op.

    An edge between two candidates for the same single op of ours is not followed: it links
    two occurrences of the cluster (a residual add reading the previous layer's add).
    """
    pool = {key for c in candidates for key in c}
    serves: dict[Key, frozenset[int]] = {}
    for i, c in enumerate(candidates):
        for key in c:
            serves[key] = serves.get(key, frozenset()) | {i}
    links = [
        (key, other)
        for key in pool
        for producer in inductor.ops[key].producers
        if (other := (key[0], producer)) in pool and not (serves[key] == serves[other] and len(serves[key]) == 1)
    ]
    groups = components(pool, links)
    return [g for g in groups if all(g & set(candidates[i]) for i in placed)]


def _classify(
    group: list[Key], connected: bool, cluster: Cluster, inductor: _Inductor, ours: _Ours
) -> InstanceComparison:
    members = set(group)
    held: dict[str, list[Key]] = {}
    for key in group:
        for kid in inductor.kernels_of(key):
            held.setdefault(kid, []).append(key)
    whole = [kid for kid, keys in held.items() if set(keys) == members]
    if whole:
        best = min(whole, key=lambda kid: (len(inductor.kernels[kid].user_ops), kid))
        share = _share(best, held[best], members, cluster, inductor, ours)
        status = "inductor-wider" if share.absorbed else "agree"
        others = [kid for kid in held if kid != best]
        return InstanceComparison(status, [share], also_in=others, connected=connected)
    fusing = any(len(keys) >= 2 for keys in held.values())
    order = sorted(held, key=lambda kid: min(inductor.order[k] for k in held[kid]))
    shares = [_share(kid, held[kid], members, cluster, inductor, ours) for kid in order]
    return InstanceComparison("inductor-splits" if fusing else "inductor-misses", shares, connected=connected)


def _share(
    kid: str, keys: Iterable[Key], members: set[Key], cluster: Cluster, inductor: _Inductor, ours: _Ours
) -> KernelShare:
    kernel = inductor.kernels[kid]
    absorbed = [
        _absorbed(key, kernel, inductor, ours, cluster) for key in inductor.kernel_ops(kernel) if key not in members
    ]
    ops = [inductor.summary(k) for k in sorted(keys, key=inductor.order.__getitem__)]
    return KernelShare(kid, kernel.name, kernel.kind, ops, sorted({o.line for o in ops}), absorbed)


def _absorbed(
    key: Key, kernel: InductorKernel, inductor: _Inductor, ours: _Ours, cluster: Cluster | None
) -> AbsorbedOp:
    op = inductor.ops[key]
    reason, detail = ours.rejection_of(op, cluster)
    here = inductor.aten_of.get((kernel.id, key), [])
    recomputed = any(len(inductor.aten_kernels[(key[0], a.name)]) > 1 for a in here)
    part: list[str] = []
    if here and {a.name for a in here} < inductor.aten_all.get(key, set()):
        part = list(dict.fromkeys(a.target.split(".")[1] if "." in a.target else a.target for a in here))
    return AbsorbedOp(
        op.op,
        op.file,
        op.line,
        cluster=ours.cluster_of(op, cluster.id if cluster else None),
        reason=reason,
        detail=detail,
        recomputed=recomputed,
        inferred=key[1] in kernel.inferred_ops,
        part=part,
    )


def _unmatched(kernel: InductorKernel, inductor: _Inductor, ours: _Ours) -> UnmatchedFusion:
    ops = [_absorbed(key, kernel, inductor, ours, None) for key in inductor.kernel_ops(kernel)]
    chain = " + ".join(f"{o.op} (line {o.line})" for o in ops)
    return UnmatchedFusion(kernel.id, kernel.name, kernel.kind, ops, chain)


# ---- wording ---------------------------------------------------------------------------------


def _cluster_summary(result: ClusterComparison) -> str:
    picked = [i for i in result.instances if i.status == result.status]
    sentence = _instance_summary(picked[0])
    if len(result.instances) > 1:
        sentence = f"in {len(picked)} of {len(result.instances)} instances: {sentence}"
    return sentence


def _instance_summary(instance: InstanceComparison) -> str:
    shares = instance.kernels
    if instance.status == "agree":
        return f"Inductor fuses the same ops in {shares[0].name}"
    if instance.status == "inductor-wider":
        return f"Inductor's {shares[0].name} also fuses {_absorbed_text(shares[0].absorbed)}"
    parts = ", ".join(
        f"{s.name} (line{'s' if len(s.lines) > 1 else ''} {', '.join(map(str, s.lines))})" for s in shares
    )
    if instance.status == "inductor-splits":
        extra = "; ".join(f"{s.name} also fuses {_absorbed_text(s.absorbed)}" for s in shares if s.absorbed)
        return f"Inductor splits this into {len(shares)} kernels: {parts}" + (f"; {extra}" if extra else "")
    return f"Inductor fuses none of these ops together: {parts}"


def _absorbed_text(ops: list[AbsorbedOp]) -> str:
    """ "mul ×2 and add (line 61), in our c2; sum (line 16), which we left out: reduction"."""
    groups: dict[tuple, list[str]] = {}
    for op in ops:
        name = f"{op.op}'s {' and '.join(op.part)}" if op.part else op.op
        groups.setdefault((op.line, op.cluster, op.reason, op.recomputed), []).append(name)
    parts = []
    for (line, cluster, reason, recomputed), names in groups.items():
        counted = [f"{n} ×{names.count(n)}" if names.count(n) > 1 else n for n in dict.fromkeys(names)]
        text = f"{' and '.join(counted)} (line {line})"
        if cluster:
            text += f", in our {cluster}"
        elif reason:
            text += f", which we left out: {reason}"
        if recomputed:
            text += " (recomputed)"
        parts.append(text)
    return "; ".join(parts)
