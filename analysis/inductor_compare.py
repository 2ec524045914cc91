"""Compare fuselens's clusters with the kernels Inductor generated for the same model.

Input: one model of the analysis report (`Report.models[i]`, as the dataclass or its JSON
form) and an `InductorCapture` (or its `to_dict()`).  Output: an `InductorComparison`, plain
data with `to_dict()`, meant for the versioned report.  No torch import here.

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

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from .ops import op_class

STATUSES = ("agree", "inductor-wider", "inductor-splits", "inductor-misses", "not-found")
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


# ---- the result ------------------------------------------------------------------------------


@dataclass
class OpSummary:
    op: str
    file: str
    line: int


@dataclass
class AbsorbedOp:
    """An op an Inductor kernel computes that the cluster (or every cluster) left out."""

    op: str
    file: str
    line: int
    cluster: str | None = None  # our cluster that holds it instead
    reason: str | None = None  # our rejection code for it (report.REJECTION_REASONS)
    detail: str = ""
    recomputed: bool = False  # Inductor also computes (some of) the same aten nodes in another kernel
    inferred: bool = False  # its provenance was rebuilt after a pattern rewrite
    part: list[str] = field(default_factory=list)  # when the kernel computes only part of the op:
    #                                                the aten ops it does compute (a Linear's bias "add")


@dataclass
class KernelShare:
    """One Inductor kernel's share of one instance of a cluster."""

    kernel: str  # InductorKernel.id
    name: str
    kind: str
    ops: list[OpSummary]  # the cluster's ops this kernel computes
    lines: list[int]  # the cluster's lines those ops are on
    absorbed: list[AbsorbedOp] = field(default_factory=list)


@dataclass
class InstanceComparison:
    status: str
    kernels: list[KernelShare]
    also_in: list[str] = field(default_factory=list)  # other kernels recomputing some of its ops
    connected: bool = True  # False: matched by lines only, the data edges did not single it out


@dataclass
class ClusterComparison:
    cluster: str  # Cluster.id
    status: str  # one of STATUSES
    summary: str  # one sentence for a hover
    lines: list[int]
    instances: list[InstanceComparison] = field(default_factory=list)
    not_found: list[OpSummary] = field(default_factory=list)  # our ops with no Inductor counterpart
    by_line_only: list[OpSummary] = field(default_factory=list)  # matched by line, no name agreed


@dataclass
class UnmatchedFusion:
    """An Inductor kernel fusing two or more user ops that no cluster of ours matches."""

    kernel: str
    name: str
    kind: str
    ops: list[AbsorbedOp]
    summary: str


@dataclass
class KernelAccount:
    kernel: str
    name: str
    kind: str
    user_ops: int
    role: str  # "cluster" | "unmatched-fusion" | "single-op" | "no-user-ops" | "unattributed"
    clusters: list[str] = field(default_factory=list)


@dataclass
class InductorComparison:
    model: str
    backend: str = ""  # the capture's: "triton-cpu" (a close proxy for the GPU's choices) | "cuda"
    clusters: list[ClusterComparison] = field(default_factory=list)
    unmatched: list[UnmatchedFusion] = field(default_factory=list)
    kernels: list[KernelAccount] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def status_counts(self) -> dict[str, int]:
        counts = {s: 0 for s in STATUSES}
        for c in self.clusters:
            counts[c.status] += 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---- entry point -----------------------------------------------------------------------------


def compare_with_inductor(model: Any, capture: Any) -> InductorComparison:
    """Classify each cluster of `model` against Inductor's kernels in `capture`."""
    model_data, capture_data = _plain(model), _plain(capture)
    inductor = _Inductor(capture_data)
    ours = _Ours(model_data)
    result = InductorComparison(model=model_data.get("name", ""), backend=capture_data.get("backend", ""),
                                notes=list(inductor.notes))
    clusters = model_data.get("clusters", [])
    # Larger clusters choose first, and an Inductor op serves one cluster instance only: where
    # a smaller cluster's lines recur inside a larger one (RMSNorm's lines inside "residual add
    # + RMSNorm"), the larger takes that occurrence and the smaller the others.
    comparisons: list[ClusterComparison | None] = [None] * len(clusters)
    claimed: set = set()
    for i in sorted(range(len(clusters)), key=lambda i: (-_size(clusters[i]), i)):
        comparisons[i] = _compare_cluster(clusters[i], inductor, ours, claimed)
    touched: dict[str, list[str]] = {}
    for comparison in comparisons:
        result.clusters.append(comparison)
        for instance in comparison.instances:
            for share in instance.kernels:
                ids = touched.setdefault(share.kernel, [])
                if comparison.cluster not in ids:
                    ids.append(comparison.cluster)
    for kernel in inductor.kernels.values():
        n = len(kernel["user_ops"])
        clusters = touched.get(kernel["id"], [])
        if clusters:
            role = "cluster"
        elif n >= 2:
            role = "unmatched-fusion"
            result.unmatched.append(_unmatched(kernel, inductor, ours))
        elif n == 1:
            role = "single-op"
        else:  # computes only data movement, or only nodes a pattern rewrite left without provenance
            role = "unattributed" if kernel.get("unattributed") else "no-user-ops"
        result.kernels.append(KernelAccount(kernel["id"], kernel["name"], kernel["kind"], n, role, clusters))
    return result


def _size(cluster: dict) -> int:
    return sum(1 for op in cluster["ops"] if not op_class(op["target"]).free)


def _plain(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return dataclasses.asdict(value)


# ---- the two sides, indexed ------------------------------------------------------------------


def _same_op(a: str, b: str) -> bool:
    return a == b or any(a in group and b in group for group in _EQUIVALENT)


def _norm(path: str) -> str:
    return os.path.normcase(os.path.normpath(path)) if path else ""


class _Inductor:
    """Inductor's ops and kernels, keyed by (graph, op name) and kernel id."""

    def __init__(self, capture: dict[str, Any]):
        self.notes = capture.get("notes", [])
        self.ops: dict[tuple[int, str], dict] = {}
        self.kernels: dict[str, dict] = {}
        self.order: dict[tuple[int, str], int] = {}
        self.by_line: dict[tuple[str, int], list[tuple[int, str]]] = {}
        # which aten nodes of each user op each kernel computes, to tell a kernel computing a
        # whole op from one computing part of it, and a recomputation from a split
        self.aten_of: dict[tuple[str, tuple[int, str]], list[dict]] = {}
        self.aten_kernels: dict[tuple[int, str], set[str]] = {}
        self.aten_all: dict[tuple[int, str], set[str]] = {}
        for graph in capture.get("graphs", []):
            g = graph["index"]
            for op in graph["ops"]:
                key = (g, op["name"])
                self.ops[key] = op
                self.order[key] = len(self.order)
                if not op["free"] and op["line"]:
                    self.by_line.setdefault((_norm(op["file"]), op["line"]), []).append(key)
            for kernel in graph["kernels"]:
                self.kernels[kernel["id"]] = kernel
                for aten in kernel.get("aten_ops", []):
                    if aten.get("layout"):
                        continue
                    self.aten_kernels.setdefault((g, aten["name"]), set()).add(kernel["id"])
                    for user_op in aten["user_ops"]:
                        self.aten_of.setdefault((kernel["id"], (g, user_op)), []).append(aten)
                        self.aten_all.setdefault((g, user_op), set()).add(aten["name"])

    def candidates(self, op: dict) -> tuple[list[tuple[int, str]], bool]:
        """Inductor ops that may be our `op`, and whether only the line (not the name) matched."""
        on_line = self.by_line.get((_norm(op["file"]), op["line"]), [])
        named = [k for k in on_line if _same_op(self.ops[k]["op"], op["target"])]
        return (named, False) if named or not on_line else (list(on_line), True)

    def kernels_of(self, key: tuple[int, str]) -> list[str]:
        return self.ops[key]["kernels"]

    def kernel_ops(self, kernel: dict) -> list[tuple[int, str]]:
        return [(kernel["graph"], name) for name in kernel["user_ops"]]

    def summary(self, key: tuple[int, str]) -> OpSummary:
        op = self.ops[key]
        return OpSummary(op["op"], op["file"], op["line"])


class _Ours:
    """Our clusters, boundaries and rejections, for naming what Inductor absorbed."""

    def __init__(self, model: dict[str, Any]):
        self.cluster_ops = [(c["id"], op) for c in model.get("clusters", []) for op in c["ops"]]
        self.rejections = [(r["reason"], r.get("detail", ""), op) for r in model.get("rejections", [])
                           for op in r["ops"]]

    def cluster_of(self, op: dict, other_than: str | None) -> str | None:
        for cid, ours in self.cluster_ops:
            if cid != other_than and _matches(ours, op):
                return cid
        return None

    def rejection_of(self, op: dict, cluster: dict | None) -> tuple[str | None, str]:
        """Why we left `op` out: the cluster's own boundary first, then the model's rejections."""
        for boundary in (cluster or {}).get("boundaries", []):
            if _matches(boundary["op"], op):
                return boundary["reason"], boundary.get("detail", "")
        for reason, detail, ours in self.rejections:
            if _matches(ours, op):
                return reason, detail
        return None, ""


def _matches(ours: dict, theirs: dict) -> bool:
    return (ours.get("line") == theirs["line"] and _norm(ours.get("file", "")) == _norm(theirs["file"])
            and _same_op(ours.get("target", ""), theirs["op"]))


# ---- one cluster -----------------------------------------------------------------------------


def _compare_cluster(cluster: dict, inductor: _Inductor, ours: _Ours, claimed: set) -> ClusterComparison:
    ops = [op for op in cluster["ops"] if not op_class(op["target"]).free]
    result = ClusterComparison(cluster=cluster["id"], status="not-found", summary="", lines=list(cluster["lines"]))
    candidates: list[list[tuple[int, str]]] = []
    for op in ops:
        found, line_only = inductor.candidates(op)
        summary = OpSummary(op["target"], op["file"], op["line"])
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


def _instances(candidates: list[list[tuple[int, str]]], placed: list[int], inductor: _Inductor, claimed: set):
    """Connected groups of candidate ops that each cover every placed op of the cluster.

    Ops another cluster's instance already took are left out, unless without them no group
    is complete (then the two clusters overlap in Inductor's view and both see the op)."""
    free = [[k for k in c if k not in claimed] for c in candidates]
    groups = _complete_groups(free, placed, inductor)
    if not groups:
        groups = _complete_groups(candidates, placed, inductor)
    if groups:
        return [(sorted(g, key=inductor.order.__getitem__), True) for g in
                sorted(groups, key=lambda g: min(inductor.order[k] for k in g))]
    pool = {key for c in candidates for key in c}
    return [(sorted(pool, key=inductor.order.__getitem__), False)]


def _complete_groups(candidates: list[list[tuple[int, str]]], placed: list[int], inductor: _Inductor) -> list[set]:
    """Split the candidates into groups along data edges; keep the groups covering every op.

    An edge between two candidates for the same single op of ours is not followed: it links
    two occurrences of the cluster (a residual add reading the previous layer's add).
    """
    pool = {key for c in candidates for key in c}
    serves: dict[tuple[int, str], frozenset] = {}
    for i, c in enumerate(candidates):
        for key in c:
            serves[key] = serves.get(key, frozenset()) | {i}
    parent = {key: key for key in pool}

    def root(key):
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    for key in pool:
        graph = key[0]
        for producer in inductor.ops[key]["producers"]:
            other = (graph, producer)
            if other in pool and not (serves[key] == serves[other] and len(serves[key]) == 1):
                parent[root(key)] = root(other)
    groups: dict[tuple[int, str], set] = {}
    for key in pool:
        groups.setdefault(root(key), set()).add(key)
    return [g for g in groups.values() if all(g & set(candidates[i]) for i in placed)]


def _classify(group: list, connected: bool, cluster: dict, inductor: _Inductor, ours: _Ours) -> InstanceComparison:
    members = set(group)
    held: dict[str, list] = {}
    for key in group:
        for kid in inductor.kernels_of(key):
            held.setdefault(kid, []).append(key)
    whole = [kid for kid, keys in held.items() if set(keys) == members]
    if whole:
        best = min(whole, key=lambda kid: (len(inductor.kernels[kid]["user_ops"]), kid))
        share = _share(best, held[best], members, cluster, inductor, ours)
        status = "inductor-wider" if share.absorbed else "agree"
        others = [kid for kid in held if kid != best]
        return InstanceComparison(status, [share], also_in=others, connected=connected)
    fusing = any(len(keys) >= 2 for keys in held.values())
    order = sorted(held, key=lambda kid: min(inductor.order[k] for k in held[kid]))
    shares = [_share(kid, held[kid], members, cluster, inductor, ours) for kid in order]
    return InstanceComparison("inductor-splits" if fusing else "inductor-misses", shares, connected=connected)


def _share(kid: str, keys: list, members: set, cluster: dict, inductor: _Inductor, ours: _Ours) -> KernelShare:
    kernel = inductor.kernels[kid]
    absorbed = [_absorbed(key, kernel, inductor, ours, cluster) for key in inductor.kernel_ops(kernel)
                if key not in members]
    ops = [inductor.summary(k) for k in sorted(keys, key=inductor.order.__getitem__)]
    return KernelShare(kid, kernel["name"], kernel["kind"], ops, sorted({o.line for o in ops}), absorbed)


def _absorbed(key, kernel: dict, inductor: _Inductor, ours: _Ours, cluster: dict | None) -> AbsorbedOp:
    op = inductor.ops[key]
    reason, detail = ours.rejection_of(op, cluster)
    here = inductor.aten_of.get((kernel["id"], key), [])
    recomputed = any(len(inductor.aten_kernels[(key[0], a["name"])]) > 1 for a in here)
    names_here = {a["name"] for a in here}
    part = []
    if here and names_here < inductor.aten_all.get(key, set()):
        part = list(dict.fromkeys(a["target"].split(".")[1] if "." in a["target"] else a["target"] for a in here))
    return AbsorbedOp(op["op"], op["file"], op["line"],
                      cluster=ours.cluster_of(op, cluster["id"] if cluster else None),
                      reason=reason, detail=detail, recomputed=recomputed,
                      inferred=key[1] in kernel.get("inferred_ops", []), part=part)


def _unmatched(kernel: dict, inductor: _Inductor, ours: _Ours) -> UnmatchedFusion:
    ops = [_absorbed(key, kernel, inductor, ours, None) for key in inductor.kernel_ops(kernel)]
    chain = " + ".join(f"{o.op} (line {o.line})" for o in ops)
    why = sorted({o.reason for o in ops if o.reason})
    tail = f"; we rejected: {', '.join(why)}" if why else ""
    return UnmatchedFusion(kernel["id"], kernel["name"], kernel["kind"], ops,
                           f"Inductor fuses {chain} in {kernel['name']}{tail}")


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
    parts = ", ".join(f"{s.name} (line{'s' if len(s.lines) > 1 else ''} {', '.join(map(str, s.lines))})"
                      for s in shares)
    if instance.status == "inductor-splits":
        extra = "; ".join(f"{s.name} also fuses {_absorbed_text(s.absorbed)}" for s in shares if s.absorbed)
        return f"Inductor splits this into {len(shares)} kernels: {parts}" + (f"; {extra}" if extra else "")
    return f"Inductor fuses none of these ops together: {parts}"


def _absorbed_text(ops: list[AbsorbedOp]) -> str:
    """"mul ×2 and add (line 61), in our c2; sum (line 16), which we left out: reduction"."""
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
