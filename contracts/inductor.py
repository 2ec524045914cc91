"""What torch.compile fused, beside what fuselens found: the data of the Inductor comparison.

Two contracts, both plain data (no torch), so the language server reads them:

- `InductorCapture`: the kernels Inductor generated for one model, each with the aten ops it
  computes and the user's ops (as Dynamo captured them) those came from
  (`analysis/inductor.py` fills it);
- `InductorComparison`: each fuselens cluster classified against those kernels
  (`analysis/inductor_compare.py` fills it; it goes into the report's `Model.inductor`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .plain import to_plain

KERNEL_KINDS = ("pointwise", "reduction", "persistent-reduction", "template", "foreach", "extern", "other")


# ---- the capture -------------------------------------------------------------------------------


@dataclass
class AtenOp:
    """One post-grad node a kernel computes."""

    name: str  # node name in the post-grad graph, e.g. "mul_3"
    target: str  # e.g. "aten.mul.Tensor", "prims.iota.default"
    file: str  # the user's line it came from ("" / 0 when provenance was lost)
    line: int
    user_ops: list[str] = field(default_factory=list)  # names of the InductorOps it lowers
    layout: bool = False  # only moves or relabels memory (view, permute, clone, ...)


@dataclass
class InductorOp:
    """One op of the user's forward, as Dynamo captured it (a node of the pre-grad graph)."""

    name: str  # node name in Dynamo's graph, e.g. "x_1"
    op: str  # canonical name in fuselens's vocabulary (analysis/ops.py): "relu", "div", "cast"
    target: str  # what was called: "operator.mul", "torch.nn.functional.gelu", "Tensor.float"
    file: str  # innermost frame in the user's code
    line: int
    free: bool  # a view / identity / no-op cast: moves no data, never counted as fused
    producers: list[str] = field(default_factory=list)  # nearest non-free ops it reads (through views)
    kernels: list[str] = field(default_factory=list)  # ids of the kernels that compute it
    inferred: bool = False  # placed by adjacency after a pattern rewrite dropped its provenance


@dataclass
class InductorKernel:
    id: str  # "g0.k3": graph index and Inductor's provenance handle; stable for an unchanged model
    name: str  # e.g. "triton_poi_fused_add_mul_relu_0", "extern_kernels.addmm"
    kind: str  # one of KERNEL_KINDS
    graph: int
    aten_ops: list[AtenOp]
    user_ops: list[str]  # names of the non-free InductorOps it computes, in program order
    lines: list[list[str | int]]  # [[file, line], ...] of those ops, sorted
    source: str  # the @triton.jit function, or the library call for extern kernels
    inferred_ops: list[str] = field(default_factory=list)  # subset of user_ops placed by adjacency
    unattributed: int = 0  # aten nodes it computes that map to no user op (pattern-rewrite output)

    @property
    def is_fusion(self) -> bool:
        return len(self.user_ops) >= 2


@dataclass
class InductorGraph:
    """One graph Dynamo handed to Inductor (a graph break starts another)."""

    index: int
    ops: list[InductorOp]
    kernels: list[InductorKernel]
    unplaced: list[str] = field(default_factory=list)  # non-free ops no kernel computes


@dataclass
class InductorCapture:
    device: str  # "cpu" | "cuda"
    backend: str  # "triton-cpu" (Inductor's Triton code for CPU tensors) | "cuda"
    pattern_matcher: bool
    torch_version: str
    graphs: list[InductorGraph] = field(default_factory=list)
    seconds: float = 0.0  # wall time of the whole capture
    notes: list[str] = field(default_factory=list)

    def kernels(self) -> Iterator[InductorKernel]:
        for graph in self.graphs:
            yield from graph.kernels

    def to_dict(self) -> dict[str, Any]:
        return dict(to_plain(self))


# ---- the comparison ----------------------------------------------------------------------------

STATUSES = ("agree", "inductor-wider", "inductor-splits", "inductor-misses", "not-found")


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
    summary: str  # the ops it fuses with their lines ("mul (line 3) + add (line 4)"); each op says why we did not


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
        return dict(to_plain(self))


@dataclass
class ComparisonResult:
    """The torch.compile comparison of one file: what the worker sends back to the editor."""

    file: str
    source_sha256: str  # of the text compared, to match it to the analysis it belongs to
    models: dict[str, InductorComparison | None] = field(default_factory=dict)  # by model name
    errors: dict[str, str] = field(default_factory=dict)  # model name -> why its comparison is missing
    sources: dict[str, str] = field(default_factory=dict)  # Inductor kernel id -> its Triton source
