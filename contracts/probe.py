"""A probe of a model on data: what the values flowing through each GEMM allow.

`fuselens probe` runs a model in eval mode on batches (the user's, or synthetic ones built from the
declared input shapes) and folds, for every GEMM call site (one source line and its op), sketches of
the call's input, weight and output: zeros, 2:4 groups along the reduction dim, per-channel abs max
and outlier channels, quantization error at int8 and fp8, the weight's effective rank, how many
distinct inputs it saw, a histogram of log2|x|.  From them come opportunities, each with the saving
its shape gives and the error measured on the data.

`fuselens validate --probe` (and the server's validate command with `probe`) goes on to make each
opportunity with PyTorch's kernels at its site and measure it against the dense GEMM: the output
error on the probe's batches anywhere, the time on a CUDA device (`MeasuredSpecialisation`).

The probe is its own versioned contract, apart from the analysis report: `ProbeReport.from_dict`
reads every version up to `PROBE_VERSION`, filling what an older one lacks with its default
(version 2 added the measured specialisations and each site's line of code; version 3 the time of a
quantized GEMM's kernel alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .plain import ContractError, from_plain, to_plain

PROBE_VERSION = 3

Distribution = Literal["normal", "heavy", "sparse"]
DISTRIBUTIONS: tuple[str, ...] = Distribution.__args__  # type: ignore[attr-defined]

# The ops a probe sketches, by the canonical name the analysis gives them.
GEMM_OPS = ("linear", "matmul", "bmm", "conv1d", "conv2d", "einsum")

OpportunityKind = Literal["sparse-2:4", "quantize", "low-rank", "memoize", "near-identity"]

HISTOGRAM_BINS = 16
HISTOGRAM_LOW = -24  # log2|x| of the first bin's lower edge; each bin is 2 wide (below and above clamp)
HISTOGRAM_WIDTH = 2


@dataclass
class ProbeOptions:
    data: str = ""  # "pkg.mod:fn" yielding batches; "": settings' probe-data, the file's probe_batches(), synthetic
    synthetic: Distribution = "normal"  # the distribution synthetic batches are drawn from
    batches: int = 8  # batches to run (at most: a data function may yield fewer)
    sample_every: int = 0  # sketch one call in this many of each site; 0: settings' probe-sample-every, else 1
    device: str = ""  # "cuda" or "cpu"; "": CUDA where there is one
    seed: int = 0
    working_directory: str = ""  # where `data` is imported from besides the file's folder (the caller's cwd)
    measure: bool = False  # make each opportunity with PyTorch's kernels and measure it against the dense GEMM


@dataclass
class RoleSketch:
    """One operand (or the output) of a site's calls, folded over the sampled calls."""

    role: Literal["input", "weight", "output"]
    shape: list[int]  # of the first call
    elements: int  # summed over the sampled calls
    zero_fraction: float
    sparse_24_fraction: float  # of the groups of 4 along the reduction dim, those with at most 2 nonzeros
    channel_dim: int  # the dim its channels are along (input: features; weight: output channels)
    channels: int
    absmax: float
    channel_max_to_median: float  # largest channel's abs max over the median channel's
    outlier_channels: list[int]  # channels whose abs max is far above the median's, largest first
    int8_error: float  # relative error ‖q(x) − x‖ / ‖x‖ with one scale for the tensor
    int8_channel_error: float  # with one scale per channel
    fp8_error: float
    fp8_channel_error: float
    histogram: list[int]  # HISTOGRAM_BINS counts of log2|x| for the nonzeros
    effective_rank: int | None = None  # weight only: singular values holding 99% of the energy (largest over layers)
    rank_of: int | None = None  # min(rows, cols) of the weight the rank is of
    # The effective rank lies in [rank_low, rank_high]: equal to it where found from every singular value
    # (a weight whose smaller dim is at most 256), a range where a randomized range finder found it.
    rank_low: int | None = None
    rank_high: int | None = None


@dataclass
class Opportunity:
    kind: OpportunityKind
    summary: str  # one line: what to do
    evidence: str  # what the sketches showed
    flops_saved: int  # per forward, from the shapes
    bytes_saved: int  # per forward, from the shapes
    error: float | None  # the relative output error measured on the data with the change (None: exact)
    risk: str  # what the error means
    role: str = ""  # sparse-2:4: the operand that is sparse ("input" or "weight")
    scheme: str = ""  # quantize: the scheme named ("int8", "int8_channel", "fp8", "fp8_channel")


MeasureStatus = Literal["timed", "error-only", "not-measured"]


@dataclass
class MeasuredSpecialisation:
    """One opportunity made at its site with PyTorch's kernels, against the dense GEMM on the same calls."""

    kind: OpportunityKind
    implementation: str  # the PyTorch path that made it, in words
    status: MeasureStatus  # timed (a CUDA device), error-only (elsewhere), not-measured (note says why)
    calls: int = 0  # the probe's calls the error was measured on
    error: float | None = None  # relative output error ‖y' − y‖ / ‖y‖ over those calls
    per_tensor_error: float | None = None  # quantize: the same format with one scale per tensor
    dense_ms: float | None = None  # median of CUDA-event times over repeated calls, on the first call's operands
    specialised_ms: float | None = None  # the input's quantization per call included, where there is one
    # quantize: the low-precision GEMM alone on an input quantized ahead, as a fused producer leaves it
    kernel_ms: float | None = None
    note: str = ""  # why it was not timed or not measured; what a hit rate or a cost left out was

    @property
    def speedup(self) -> float | None:
        if not self.dense_ms or not self.specialised_ms:
            return None
        return self.dense_ms / self.specialised_ms

    @property
    def kernel_speedup(self) -> float | None:
        if not self.dense_ms or not self.kernel_ms:
            return None
        return self.dense_ms / self.kernel_ms


@dataclass
class ProbeSite:
    """One GEMM call site: a line of model code and the op it made there, over every call."""

    file: str
    line: int
    function: str
    op: str
    calls: int  # calls seen, over all batches (a line of N repeated layers: N per batch)
    sampled: int  # calls sketched
    layers: int  # distinct weights the site was called with (1 for a plain line)
    flops_per_call: int
    bytes_per_call: int
    distinct_inputs: int  # estimated distinct inputs (each with the weight it met) among the sampled calls
    roles: list[RoleSketch] = field(default_factory=list)
    residual_ratio: float | None = None  # ‖output‖ / ‖residual‖ where a residual add takes the output
    opportunities: list[Opportunity] = field(default_factory=list)
    library: bool = False  # a line of an installed library's code, not the user's
    measured: list[MeasuredSpecialisation] = field(default_factory=list)  # with ProbeOptions.measure
    code: str = ""  # the site's line as it reads (a library's line is shown where the user's line reaches it)


@dataclass
class ModelProbe:
    name: str
    data_source: str  # where the batches came from, in words
    batches: int  # batches run
    sites: list[ProbeSite] = field(default_factory=list)
    problem: str = ""  # why the model could not be probed


@dataclass
class ProbeReport:
    file: str
    device: str
    sample_every: int
    models: list[ModelProbe] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # the file could not be loaded or analyzed
    versions: dict[str, str] = field(default_factory=dict)
    measured_on: str = ""  # with ProbeOptions.measure: the device the specialisations were measured on
    probe_version: int = PROBE_VERSION

    def to_dict(self) -> dict[str, Any]:
        return dict(to_plain(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeReport:
        version = data.get("probe_version") if isinstance(data, dict) else None
        if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= PROBE_VERSION:
            raise ContractError(f"probe_version {version!r} is not one of 1..{PROBE_VERSION}")
        return from_plain(cls, {**data, "probe_version": PROBE_VERSION})

    @property
    def ok(self) -> bool:
        return not self.problems and all(not m.problem for m in self.models)


def histogram_edges() -> list[float]:
    """The lower edge (log2|x|) of each histogram bin; the first and last take what lies beyond."""
    return [float(HISTOGRAM_LOW + HISTOGRAM_WIDTH * i) for i in range(HISTOGRAM_BINS)]


def rank_text(sketch: RoleSketch) -> str:
    """A weight's effective rank as people read it: "16", or "≈596 (478–753)" where it is a range."""
    low, high = sketch.rank_low, sketch.rank_high
    if low is None or high is None or low == high:
        return str(sketch.effective_rank)
    return f"≈{sketch.effective_rank} ({low}–{high})"
