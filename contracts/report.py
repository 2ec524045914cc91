"""The analysis report: the one data contract shared by the CLI, the worker and the server.

Everything here is plain data (no torch), so the language server can import it.
`Report.to_dict()` is exactly what `fuselens analyze --json` writes and what the
worker sends back over its pipe; `Report.from_dict()` reads it back.  The JSON Schema
in `report.schema.json` describes the same shape and is checked in the tests.

Conventions: lines are 1-based and inclusive, byte counts are integers, and a cost
that cannot be known (symbolic or unknown shape) is `None`, never a guess.
Bump SCHEMA_VERSION on any change that could break a reader.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from .dynamic import DynamicShapes
from .inductor import InductorComparison
from .plain import ContractError, from_plain, to_plain
from .profile import Profile

# 2: a model that was analyzed says "analyzed"; 3: code in libraries, reached_from; 4: library patches,
# the original lines of an edit; 5: the numbers of the model's state a cluster takes; 6: the `layout`
# rejection reason; 9: the fingerprints of a library patch's code; 10: the libraries whose code the
# report names, wherever they are installed; 11: the `view` rejection reason; 13: a pattern's source
# rewrite (`Rewrite`), or why it has none; 14: a pattern's activation memory in training (`ActivationMemory`);
# 15: clusters that start with a GEMM (kind "gemm-epilogue") and the `compute-bound` regime
# 16: a model's costs over declared ranges of its sizes (`Model.dynamic`, `dynamic.py`);
# 17: the sizes a profile saw (`ModelProfile.sizes_seen`), a dynamic cluster's GEMM FLOPs (`gemm_flop`)
SCHEMA_VERSION = 17

# Stable reason codes for ops that could have been fused but were not.
REJECTION_REASONS = {
    "fan-out": "a value escapes the group in a form one kernel cannot write",
    "layout": "a value escapes the group in another layout (a permute) than the kernel's iteration space",
    "layer-boundary": "the group would span two layers, a layer and the code around it, or a copy made elsewhere",
    "convexity": "a dependency path leaves the group and re-enters it",
    "shape": "the group would need two different iteration spaces",
    "view": "the ops meet through a view a kernel does not follow (a reshape that regroups dims)",
    "aliasing": "an in-place write that other views of the buffer would observe",
    "reduction": "a reduction a row-per-program kernel cannot express",
    "no-lowering": "no Triton lowering exists for this op",
    "graph-break": "the values cross a graph break",
    "no-neighbour": "no other fusable op is adjacent",
}

Mapping = Literal["exact", "pointer", "unavailable"]
Regime = Literal["launch-bound", "l2-resident", "dram-bound", "compute-bound"]
ModelStatus = Literal["analyzed", "skipped", "error"]
ClusterKind = Literal["elementwise", "reduction", "gemm-epilogue"]
MAPPINGS: tuple[str, ...] = typing.get_args(Mapping)
REGIMES: tuple[str, ...] = typing.get_args(Regime)


@dataclass
class SourceRef:
    """A line of the user's code: where it reaches code that lives elsewhere (an installed library)."""

    file: str
    line: int


@dataclass
class TensorInfo:
    shape: list[int] | None
    dtype: str
    name: str | None = None  # the user's expression for it, when known ("x", "self.weight")
    high: int | None = None  # a model's integer input: its example values lie in [0, high) (None: [0, 16))


@dataclass
class Number:
    """A number of the model's state that a cluster's ops take (`self.eps`, `math.sqrt(self.head_dim)`):
    the kernel's function takes it from its caller, so that every instance computes with its own."""

    name: str  # the kernel function's parameter
    value: float  # in the analyzed instance: the parameter's default
    type: Literal["float", "int"]
    text: str  # as the op's call spells it
    passed: str | None  # what the replaced code passes for it (None: the cluster has no region)
    in_kernel: bool  # a kernel argument; False: the kernel has the analyzed value, and another runs the reference


@dataclass
class OpRef:
    target: str  # canonical op name, e.g. "mul", "softmax", "linear"
    file: str
    line: int
    shape: list[int] | None
    dtype: str | None
    module: str = ""  # module instance path, e.g. "blocks.3.mlp"
    call: str = ""  # what the user called, e.g. "torch.nn.functional.gelu"


@dataclass
class Boundary:
    """Why a neighbouring op was left out of a cluster."""

    op: OpRef
    reason: str
    detail: str
    cluster: str | None = None  # the cluster that op ended up in, if any


@dataclass
class Kernel:
    name: str  # launcher name, e.g. "cluster0"
    path: str  # the kernel module file it is written to
    # The @triton.jit kernel plus its launcher (its backward, its `fits`).  "" in an analysis that leaves
    # the code to be generated when something asks for it (the editor's, on a save): its cluster's
    # BACKWARD_FIELDS are then unknown too.
    source: str
    strategy: str = ""  # e.g. "elementwise-2d", "row-single-block", "row-looped"

    @property
    def has_code(self) -> bool:
        return bool(self.source)


@dataclass
class Edit:
    """Replace whole lines `start_line..end_line` (1-based, inclusive) with `text`."""

    start_line: int
    end_line: int
    text: str
    import_line: str  # the import statement the edit needs
    call: str  # the new call, for display: "x = cluster0(x)"
    original: str = ""  # the lines as they were, which restoring the cluster puts back
    # When the call stands in place of one expression on a line that stays: that expression's text and
    # the call (another cluster's edit of the same line can carry it).
    replaces: str = ""
    expression: str = ""
    # Clusters whose calls this edit writes too: their code shares its lines (a convolution's bias add
    # joined the kernel after it, and its argument is an earlier cluster's).
    includes: list[str] = field(default_factory=list)


@dataclass
class CodeFingerprint:
    """What a library function's code was when its patch was made (`analysis/code_identity.py` makes it,
    and the kernel module's `install()` compares it with the code there at run time): digests of its
    source text, bytecode, constants and names (through its nested code objects), and the variables it
    closes over."""

    python: str  # "3.11": the version whose bytecode the digests are of (another compares the source only)
    source: str  # "" where the source could not be read
    bytecode: str
    constants: str
    names: str
    free_variables: list[str]  # its closure's names, in its code object's order: ["__class__"]


@dataclass
class LibraryFunction:
    """A function of an installed library that holds clusters: what a library patch replaces."""

    module: str  # its module's import path: "transformers.models.llama.modeling_llama"
    qualname: str  # "LlamaRMSNorm.forward", "apply_rotary_pos_emb"
    file: str
    first_line: int  # its first line (its first decorator's), as the library's code object says
    last_line: int
    source: str  # its text as it reads in the library
    fingerprint: CodeFingerprint  # its code: a patch is installed only over this code


@dataclass
class CalledCode:
    """A function whose code a patched cluster's kernel computes in place of calling it (the norm a
    decoder layer's residual add is fused with): the patch is installed only while it is this code."""

    module: str
    qualname: str
    first_line: int
    fingerprint: CodeFingerprint


@dataclass
class LibraryPatch:
    """How a cluster in a library's code is applied: `function`, with `edit` (on the library file's
    lines) and those of the other patched clusters in it, runs in place of the library's own."""

    function: LibraryFunction
    edit: Edit  # its `import_line` is "": the kernels are reached through the kernel module
    # The functions below `function` (called from it) whose code the kernel computes, each once.
    calls: list[CalledCode] = field(default_factory=list)


# A cluster's backward "strategy" when its gradients are its outputs' own, passed on (a residual sum's,
# a bias's summed by the caller): the op's backward runs no kernel.
PASS_THROUGH_BACKWARD = "pass-through"
# ... and when its gradients are a scatter into a table (an embedding's), which torch runs as eager
# autograd does: the forward still runs the kernel, keeping only what the gradients read.
TORCH_BACKWARD = "torch"


# What a cluster's backward, worked out with its kernel's code, says (`Kernel.source`).
BACKWARD_FIELDS = (
    "backward",
    "backward_detail",
    "backward_bytes_unfused",
    "backward_bytes_fused",
    "saved_bytes_eager",
    "saved_bytes_fused",
)


@dataclass
class Cluster:
    id: str
    kind: ClusterKind
    ops: list[OpRef]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    file: str
    lines: list[int]  # [first, last]
    function: str
    mapping: Mapping
    mapping_detail: str
    bytes_unfused: int | None
    bytes_fused: int | None
    regime: Regime | None
    multiplicity: int = 1
    instances: list[str] = field(default_factory=list)
    kernel: Kernel | None = None
    edit: Edit | None = None
    boundaries: list[Boundary] = field(default_factory=list)
    lowering: str = "ok"  # "ok" or why codegen could not lower it
    branch: str = ""  # set when the cluster is on a branch path the main trace did not take
    total_bytes_unfused: int | None = None  # times multiplicity
    total_bytes_fused: int | None = None
    # When the cluster's code is not in the analyzed file (a library's, another of the user's files): the
    # line of the analyzed file that reaches it (None: none does; the model's line stands for it), and
    # the cluster's lines as they read there.
    reached_from: SourceRef | None = None
    code: list[str] = field(default_factory=list)
    # Where each instance is in the model's traces: the trace path (an index into `Model.paths`) and,
    # per instance, its place among the clusters detected in that trace, in execution order.  The
    # same ops on the same lines can be two clusters (a residual add and the norm of the next layer, or
    # of the final norm): validation finds each instance's own values by this position.
    path: int = 0
    positions: list[int] = field(default_factory=list)
    # Where an instance is a part of the group detection found at its position (split where one kernel
    # call could not stand in for the whole: a convolution's bias left with it, the ops of one call of
    # several): the places of its ops and views among that group's, in the trace's order; one list per
    # position, empty for the whole group (no lists: every instance is its whole group).
    parts: list[list[int]] = field(default_factory=list)
    # How it can be applied: "edit" (`edit` changes the analyzed file), "patch" (its code is a
    # library's, patched at run time), or "no"; `apply_detail` says how, or precisely why not.
    applies: Literal["edit", "patch", "no"] = "no"
    apply_detail: str = ""
    patch: LibraryPatch | None = None  # set when it applies as "patch"
    numbers: list[Number] = field(default_factory=list)
    # Training: the backward kernel's strategy when the cluster's gradients are one kernel ("" when
    # not); `backward_detail` names the inputs it computes gradients of, or precisely why there is none
    # (the cluster then trains through its reference, as the model wrote it).
    backward: str = ""  # PASS_THROUGH_BACKWARD (no kernel needed) or TORCH_BACKWARD (a scatter torch runs)
    backward_detail: str = ""
    # The backward's DRAM traffic, its ops one kernel each and as the backward kernel; and what the
    # forward keeps for the backward: eager autograd's saved tensors, and the kernel op's (the inputs
    # and outputs its gradients read).  Both leave out what lives anyway: parameters, buffers and
    # values an op outside the cluster keeps for its own backward (a GEMM's input).
    backward_bytes_unfused: int | None = None
    backward_bytes_fused: int | None = None
    saved_bytes_eager: int | None = None
    saved_bytes_fused: int | None = None

    @property
    def bytes_saved(self) -> int | None:
        if self.bytes_unfused is None or self.bytes_fused is None:
            return None
        return self.bytes_unfused - self.bytes_fused

    @property
    def op_chain(self) -> str:
        return " → ".join(op.target for op in self.ops)


@dataclass
class Rejection:
    ops: list[OpRef]
    reason: str  # a code from REJECTION_REASONS
    detail: str
    file: str
    lines: list[int]
    multiplicity: int = 1
    reached_from: SourceRef | None = None  # the user's line reaching it, when it is in a library


# Stable codes for a pattern whose kind has a source rewrite but that cannot be rewritten here (the
# sentence beside each code in a report says precisely what stops it).
REWRITE_REFUSALS = {
    "elsewhere": "its code is not in the analyzed file, or not in one function's statements that a rewrite can replace",
    "escapes": "a value inside it is used elsewhere (returned, stored, read by later code)",
    "modified": "a value inside it is changed by code the rewrite cannot express (another module, an unknown op)",
    "mask": "its mask cannot be passed to the fused call as it is computed",
    "scale": "its scale is not a number the fused call can take",
    "shape": "its operands are not laid out as the fused call needs",
    "torch": "the installed torch has no fused call that computes it",
    "weight": "a projection's weight or bias is not a parameter used as it is (a slice, a cast, a value computed from it)",
    "soft-capping": "the values are soft-capped (tanh) on their way, which the fused call does not do",
    "class-weights": "the loss weights its classes (`weight=`), which the fused call does not do",
    "soft-targets": "the loss's targets are class probabilities, not class indices",
}


@dataclass
class Rewrite:
    """A rewrite of the user's source that stands in for a pattern's code (hand-written attention becomes
    `F.scaled_dot_product_attention`): whole lines `start_line..end_line` of `file` are replaced by `text`.

    It is written only where those lines still read `original`: a rewrite made for other text is stale
    and refused, never written over what the user typed since.  `fuselens apply` and the quick fix write
    it (with the clusters, leaving out those it `replaces`), and keep `text` and `original` in the
    kernel module for `fuselens restore` and the restore action to put the lines back."""

    id: str  # "r0", "r1", ...: numbered across the file's models, as clusters are
    file: str
    start_line: int  # 1-based, inclusive
    end_line: int
    original: str  # the lines as analyzed, each ending in a newline
    text: str  # the lines written in their place, each ending in a newline
    # Top-level import statements `text` needs ("import torch.nn.functional as F"): each added after the
    # file's imports where the file does not have it.
    imports: list[str] = field(default_factory=list)
    torch_version: str = ""  # the oldest torch `text` runs under ("2.5" for `enable_gqa`); "" for any
    title: str = ""  # the quick fix's title: "Rewrite lines 62–64 as F.scaled_dot_product_attention"
    call: str = ""  # the call written, for display: "F.scaled_dot_product_attention(q, k, v, scale=...)"
    note: str = ""  # what else a reader should know (a repeat kept, a mask cast to the query's dtype)
    # Clusters whose ops it computes, or whose lines it rewrites: not applied with it.
    replaces: list[str] = field(default_factory=list)
    # The kernel module's functions `text` calls (the fused linear cross-entropy, where torch has none): the
    # module is written with them, and `imports` imports them from it.
    kernel_functions: list[str] = field(default_factory=list)


@dataclass
class PatternEstimate:
    bytes_before: int | None
    bytes_after: int | None
    speedup_bound: float | None


@dataclass
class ActivationMemory:
    """What one training step of a projection onto a vocabulary and its loss holds at its peak, beyond the
    parameters and the projection's input: eager's, with the logits written (the logits, the float32 upcast
    of them if the code makes one, the log-probabilities the loss keeps for its backward, then their
    gradients), and the fused loss's, which writes the logits of one chunk of tokens at a time and computes
    the input's and weight's gradients as it goes.  Both count the gradients the step returns."""

    tokens: int
    vocabulary: int
    hidden: int
    dtype: str  # the logits' (the projection's) dtype
    upcast: bool  # the code casts the logits to float32 before the loss
    logits_bytes: int  # tokens × vocabulary in `dtype`
    logits_grad_bytes: int  # their gradient, in `dtype`
    upcast_bytes: int  # the float32 copy (0 without one)
    saved_bytes: int  # what the loss keeps for its backward: the log-probabilities
    chunk_tokens: int  # the tokens of one chunk of the fused loss
    peak_bytes_eager: int
    peak_bytes_fused: int


@dataclass
class Pattern:
    name: str  # "rmsnorm", "swiglu", "gemm-residual-rmsnorm-gemm", ...
    ops: list[OpRef]
    file: str
    lines: list[int]
    estimate: PatternEstimate
    dims: dict[str, Any] = field(default_factory=dict)
    clusters: list[str] = field(default_factory=list)
    multiplicity: int = 1
    summary: str = ""
    reached_from: SourceRef | None = None  # the user's line reaching it, when it is in a library
    # The source rewrite that applies it (patterns of a kind that has one: `attention`), or why there is
    # none: a code from REWRITE_REFUSALS and the sentence that says what stops it.
    rewrite: Rewrite | None = None
    refusal: str = ""
    refusal_detail: str = ""
    memory: ActivationMemory | None = None  # a training step's peak with and without what the pattern writes


@dataclass
class GraphBreak:
    file: str
    line: int
    reason: str
    code: str = ""  # the source line that caused it
    reached_from: SourceRef | None = None  # the user's line reaching it, when it is in a library
    multiplicity: int = 1  # the same break at the same line, in a loop or a repeated layer


@dataclass
class Problem:
    """An error that stopped part of the analysis, placed at the user's line."""

    kind: str  # "syntax" | "import" | "construct" | "inputs" | "trace" | "timeout" | "memory" | "crash"
    message: str
    file: str | None = None
    line: int | None = None
    column: int | None = None
    hint: str = ""


@dataclass
class Totals:
    clusters: int = 0
    bytes_total: int | None = None  # all ops of the model, unfused
    bytes_avoidable: int | None = None  # saved by fusing every cluster


@dataclass
class Model:
    name: str
    file: str
    line: int
    status: ModelStatus
    inputs: list[TensorInfo] = field(default_factory=list)
    inputs_source: str = ""  # where the example inputs came from
    param_dtype: str | None = None  # the dtype the weights were cast to, when one was asked for
    training: bool = False  # analyzed in training mode (`model.train()`), not eval mode
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    clusters: list[Cluster] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    patterns: list[Pattern] = field(default_factory=list)
    problem: Problem | None = None
    totals: Totals = field(default_factory=Totals)
    ops_total: int = 0
    kernel_module: str = ""  # file name of the generated module, e.g. "example_net_kernels.py"
    notes: list[str] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)
    inductor: InductorComparison | None = None  # what torch.compile fused, beside our clusters
    inductor_error: str = ""  # why the comparison is missing, when it was asked for
    paths: list[list[bool]] = field(default_factory=list)  # each trace's decision at each data-dependent branch
    partial: str = ""  # when part of the model could not be analyzed: which part, and why
    # Its costs over the declared ranges of the sizes its inputs name (None: every size is fixed).
    dynamic: DynamicShapes | None = None


@dataclass
class Library:
    """An installed package whose code the report names: its files are those under `root`/`name`,
    named from `root` down ("diffusers/models/resnet.py"), wherever it was installed."""

    name: str  # its import name: "diffusers"
    root: str  # the folder it was imported from: site-packages, a `pip install --target` folder, a checkout
    distribution: str = ""  # the distribution that installed it, from its metadata ("" for a plain folder)
    version: str = ""


@dataclass
class DeviceInfo:
    name: str
    peak_gbps: float
    l2_bytes: int
    launch_us: float


@dataclass
class Report:
    file: str
    source_sha256: str
    models: list[Model] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)  # file-level (syntax, import)
    device: DeviceInfo | None = None
    torch_version: str = ""
    tool_version: str = ""
    profile: Profile | None = None  # measured by `fuselens profile`; None from an analysis alone
    # The installed packages whose code a cluster, rejection, pattern or graph break is in: a reader that
    # never imports them (the language server) names their files from them (`contracts/units.library_path`).
    libraries: list[Library] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return typing.cast(dict[str, Any], to_plain(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        version = data.get("schema_version") if isinstance(data, dict) else None
        if version != SCHEMA_VERSION:
            raise ContractError(f"report schema_version {version!r} is not {SCHEMA_VERSION}")
        return from_plain(cls, data, "report")

    def clusters(self) -> Iterator[tuple[Model, Cluster]]:
        """Every cluster of every model, with its model."""
        for model in self.models:
            for cluster in model.clusters:
                yield model, cluster

    def rewrites(self) -> Iterator[tuple[Model, Pattern, Rewrite]]:
        """Every pattern's source rewrite, with its model and pattern."""
        for model in self.models:
            for pattern in model.patterns:
                if pattern.rewrite is not None:
                    yield model, pattern, pattern.rewrite
