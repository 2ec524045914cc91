"""Validation results: plain data, printed by the CLI, sent to the editor, written as JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .plain import to_plain

VALIDATION_SCHEMA_VERSION = 2

# The problem a validation without the interpreter reports on a machine without CUDA.
NO_CUDA = "no CUDA device here"


@dataclass
class Timing:
    """GPU timings of one cluster, microseconds (CUDA-graph replay unless noted)."""

    eager_us: float | None = None
    compiled_us: float | None = None  # torch.compile (Inductor) of the same ops
    fused_us: float | None = None  # the generated kernel
    fused_launch_us: float | None = None  # the generated kernel through its Python launcher, no graph
    eager_launch_us: float | None = None
    compiled_launch_us: float | None = None
    bytes_fused: int | None = None
    achieved_gbps: float | None = None
    peak_gbps: float | None = None
    pct_of_peak: float | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compiled: float | None = None
    # CUDA-graph µs of torch.compile in each other mode asked for (`ValidateOptions.other_compile_modes`)
    compiled_modes_us: dict[str, float] = field(default_factory=dict)
    # A cluster that starts with a GEMM (`fused_us` is its public function, which runs whichever path
    # it kept): the fused kernel alone, the library's GEMM then the epilogue's kernel, cuBLASLt's GEMM
    # with its epilogue where offered, and which one the public function keeps at the shape ("fused",
    # "library", "cublaslt"; the fused kernel only where it is the fastest).
    gemm_fused_us: float | None = None
    gemm_library_us: float | None = None
    gemm_cublaslt_us: float | None = None
    gemm_kept: str = ""


@dataclass
class ClusterCheck:
    id: str
    kernel: str
    status: str  # "verified" | "mismatch" | "error" | "not-reached"
    ops: str = ""  # "mul → relu → add"
    regime: str | None = None
    bytes_unfused: int | None = None  # at the shapes validated (the cost model's prediction)
    bytes_fused: int | None = None
    instances: int = 0
    shapes: list[list[int]] = field(default_factory=list)  # input shapes it ran at
    max_abs: float | None = None
    max_rel: float | None = None
    atol: float | None = None
    rtol: float | None = None
    message: str = ""
    timing: Timing | None = None
    # Training: the backward kernel's gradients against eager autograd on the same values, with the same
    # seeded random upstream gradients ("" when the cluster has no backward kernel).
    backward: BackwardCheck | None = None
    # The largest |error| / (atol + rtol·|expected|) over the elements of every output and instance: the
    # check passes at most 1 (None: not compared, or a report from before it was kept).
    tolerance_ratio: float | None = None


@dataclass
class TrainingTiming:
    """GPU timings of one training step of a cluster, microseconds (CUDA-graph replay): its forward
    with autograd recording, and that forward plus the gradients of the inputs the backward kernel
    covers, for seeded random upstream gradients; the backward is the step less the forward."""

    eager_forward_us: float | None = None
    eager_step_us: float | None = None
    compiled_forward_us: float | None = None  # torch.compile, mode COMPILE_MODE
    compiled_step_us: float | None = None
    fused_forward_us: float | None = None  # the forward kernel, keeping what its backward kernel reads
    fused_step_us: float | None = None
    step_vs_eager: float | None = None
    step_vs_compiled: float | None = None

    def backward_us(self, implementation: str) -> float | None:
        """The step less the forward of "eager", "compiled" or "fused"."""
        step, forward = getattr(self, f"{implementation}_step_us"), getattr(self, f"{implementation}_forward_us")
        return None if step is None or forward is None else round(step - forward, 2)


@dataclass
class BackwardCheck:
    status: str  # "verified" | "mismatch" | "nondeterministic" | "error"
    inputs: list[str] = field(default_factory=list)  # the inputs whose gradients were compared
    max_abs: float | None = None
    max_rel: float | None = None
    atol: float | None = None
    rtol: float | None = None
    message: str = ""
    timing: TrainingTiming | None = None  # on a GPU, when the gradients were verified
    # Each input's (and parameter's) largest |difference| from eager, over the instances checked,
    # and the input whose comparison decided the status (the mismatching one, else the largest).
    per_input: dict[str, float] = field(default_factory=dict)
    worst_input: str = ""


@dataclass
class ModelCheck:
    status: str  # "matches" | "mismatch" | "error" | "skipped"
    applied: list[str] = field(default_factory=list)  # cluster ids patched in
    max_abs: float | None = None
    max_rel: float | None = None
    message: str = ""
    eager_us: float | None = None  # whole forward, CUDA-graph time (GPU only)
    patched_us: float | None = None  # the same with every exact cluster applied
    speedup: float | None = None  # eager_us / patched_us
    amdahl_speedup: float | None = None  # whole forward if every cluster (all instances) were fused
    # The same model in training mode (outputs, every parameter's gradient, the running statistics a
    # step leaves), and in eval mode at inputs of other sizes; None where not checked.
    training: ModelCheck | None = None
    other_shapes: ModelCheck | None = None
    kernel_launches: int | None = None  # the kernel calls the patched forward made (eval, the checked inputs)


@dataclass
class ModelValidation:
    name: str
    inputs: list[list[int]]  # shapes validated at
    dtypes: list[str]
    clusters: list[ClusterCheck] = field(default_factory=list)
    model: ModelCheck | None = None
    # The declared dynamic sizes' values at these shapes ({"seq": 13}); {} for a model without them,
    # validated at one shape.  A model with them has one validation per binding.
    binding: dict[str, int] = field(default_factory=dict)


@dataclass
class ValidationReport:
    file: str
    mode: str  # "interpret" (Triton interpreter on CPU) | "cuda"
    device: str
    models: list[ModelValidation] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    schema_version: int = VALIDATION_SCHEMA_VERSION

    @property
    def ok(self) -> bool:
        checks = [c for m in self.models for c in m.clusters]
        models = [m.model for m in self.models if m.model]
        return (
            not self.problems
            and all(c.status in ("verified", "not-reached") for c in checks)
            and all(m.status in ("matches", "skipped") for m in models)
        )

    @property
    def needs_gpu(self) -> bool:
        """Nothing ran because this machine has no CUDA device (and the interpreter was not asked for)."""
        return any(p.startswith(NO_CUDA) for p in self.problems)

    def to_dict(self) -> dict[str, Any]:
        return dict(to_plain(self))


# ---- the results table ---------------------------------------------------------------------------
# One table for every place a validation is shown (the CLI's --markdown and --html, the editors' results
# view, all put together by `results_view.py`): per cluster its numerics and, on a GPU, its CUDA-graph
# times against eager and torch.compile in the mode validation compiles with.

COMPILE_MODE = "default"  # the torch.compile mode the timings compare with
RESULT_COLUMNS = (
    "cluster",
    "ops",
    "status",
    "max abs err",
    "backward",
    "eager µs",
    f"torch.compile ({COMPILE_MODE}) µs",
    "fused µs",
    "GB/s",
    "% of copy ceiling",
    "vs eager",
    "vs torch.compile",
    "fused fwd + bwd µs",
    "fwd + bwd vs torch.compile",
)


def result_rows(model: ModelValidation) -> list[tuple[str, ...]]:
    """The results table's rows for `model`, one per cluster ("—" where nothing was measured)."""
    return [
        (
            c.id,
            c.ops,
            c.status,
            "—" if c.max_abs is None else f"{c.max_abs:.1e}",
            backward_cell(c.backward),
            *timing_cells(c.timing),
            *training_cells(c.backward.timing if c.backward else None),
        )
        for c in model.clusters
    ]


def backward_cell(check: BackwardCheck | None) -> str:
    """The backward kernel's gradient check: its status and largest difference from eager, and whose
    gradient that is where there are several; "—" for a cluster without a backward kernel."""
    if check is None:
        return "—"
    if check.max_abs is None:
        return check.status
    where = f" ({check.worst_input})" if check.worst_input and len(check.per_input) > 1 else ""
    return f"{check.status} {check.max_abs:.1e}{where}"


def timing_cells(t: Timing | None) -> tuple[str, ...]:
    """eager, torch.compile and fused µs, GB/s, % of the ceiling, and the two speedups, as table cells."""
    t = t or Timing()
    return (
        _number(t.eager_us),
        _number(t.compiled_us),
        _number(t.fused_us),
        _number(t.achieved_gbps, 0),
        _number(t.pct_of_peak, 0),
        _times(t.speedup_vs_eager),
        _times(t.speedup_vs_compiled),
    )


# What a fix does with a cluster whose kernels train slower than torch.compile (`training.py`).
ORIGINAL_CODE = "trains through the original code"


def training_cells(t: TrainingTiming | None) -> tuple[str, ...]:
    """A training step's fused µs, its forward and backward apart, and its speedup on torch.compile's;
    below 1×, what a fix then does (its kernels run only where no gradient is wanted)."""
    if t is None or t.fused_step_us is None:
        return ("—", "—")
    split = f"{t.fused_step_us:.1f} ({_number(t.fused_forward_us)} + {_number(t.backward_us('fused'))})"
    slower = t.step_vs_compiled is not None and t.step_vs_compiled < 1.0
    return (split, _times(t.step_vs_compiled) + (f" ({ORIGINAL_CODE} once applied)" if slower else ""))


def where_validated(report: ValidationReport) -> str:
    """Where the report's kernels ran, as the results' headings say it."""
    return "in the Triton interpreter (numerics only)" if report.mode == "interpret" else f"on {report.device}"


def model_heading(model: ModelValidation, where: str) -> str:
    """The title of the model's table: "ExampleNet at 64×256 float32, in the Triton interpreter (numerics only)"."""
    shapes = ", ".join(f"{'×'.join(map(str, s))} {d}" for s, d in zip(model.inputs, model.dtypes, strict=True))
    return f"{model.name} at {shapes}, {where}"


def whole_model_line(model: ModelValidation) -> str:
    """What the whole-model check found, in a line under the table ("" when it did not run); an error
    says why."""
    if model.model is None:
        return ""
    m = model.model
    line = f"whole model with {', '.join(m.applied) or 'nothing'} applied: {_outcome(m)}"
    if m.kernel_launches is not None:
        line += f" ({m.kernel_launches} kernel launches)"
    if m.training is not None:
        line += f"; training: {_outcome(m.training)}"
    if m.other_shapes is not None:
        line += f"; other sizes: {_outcome(m.other_shapes)}"
    if m.speedup:
        line += f", {m.speedup:.2f}× eager"
    return line


def _outcome(check: ModelCheck) -> str:
    """A whole-model check's status, and the reason when it ended in an error."""
    return f"{check.status} ({check.message or NO_REASON})" if check.status == "error" else check.status


NO_REASON = "no reason given"


def step_errors(report: ValidationReport) -> list[str]:
    """Every step of the validation that ended in an error, each with its reason, in the order the
    steps ran: each cluster's kernel and backward kernel, then the whole model.  What the toast and
    the log say when a validation went wrong."""
    return [e for model in report.models for e in (*cluster_errors(model), *model_errors(model))]


def cluster_errors(model: ModelValidation) -> list[str]:
    """The clusters of `model` whose kernel or backward kernel check ended in an error, with the reason."""
    errors = []
    for c in model.clusters:
        if c.status == "error":
            errors.append(f"{c.id} ({c.kernel}): error: {c.message or NO_REASON}")
        if c.backward is not None and c.backward.status == "error":
            errors.append(f"{c.id} backward: error: {c.backward.message or NO_REASON}")
    return errors


def model_errors(model: ModelValidation) -> list[str]:
    """The whole-model checks of `model` that ended in an error (eval, training, other sizes), with the reason."""
    m = model.model
    if m is None:
        return []
    checks = (("", m), (" in training mode", m.training), (" at other sizes", m.other_shapes))
    return [
        f"{model.name} as a whole{what}: error: {check.message or NO_REASON}"
        for what, check in checks
        if check is not None and check.status == "error"
    ]


def _number(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _times(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"
