"""A measured profile: where one forward's time goes, by source line, by cluster and by opaque op.

`fuselens profile` runs a model's forward under `torch.profiler` and attributes every kernel's time
(on a CPU, every op's own time) to the torch call that issued it, and through that call to the
lines of model code that made it and to the cluster (or the opaque op: GEMM, attention,
convolution) it belongs to.  Each kernel is counted once, at the innermost call around it; what no
call of the model issued is `unattributed_us`, never dropped.  Figures are per forward, averaged
over the profiled iterations; a line run by N repeated layers sums their time (`calls` says how
many torch calls that was).
"""

from __future__ import annotations

from dataclasses import dataclass, field

PROFILE_VERSION = 1

# What an op that no cluster holds is, as a profile groups it.
OPAQUE_KINDS = ("GEMM", "attention", "convolution", "unfused op")


@dataclass
class LineTime:
    """The time spent in the torch calls one line of model code made (directly or through helpers)."""

    file: str
    line: int
    function: str  # qualified name, "LlamaBlock.forward"
    us: float  # per forward (per training step: forward and backward)
    share: float  # of the forward's measured time, 0..1
    calls: int  # torch calls it made per forward
    backward_us: float = 0.0  # the part of `us` in the backward of those calls (a training step)
    ops: list[str] = field(default_factory=list)  # what ran there, longest first ("linear", "mul")
    clusters: list[str] = field(default_factory=list)  # the clusters with ops on the line
    library: bool = False  # a line of an installed library (transformers), not the user's
    entry_line: int | None = None  # for a library line: the user's line in the profiled file that reached it


@dataclass
class ClusterTime:
    """A cluster's measured time (its ops one kernel each, as the model runs now), and what fusing it
    would give by the cost model."""

    id: str
    us: float
    share: float
    calls: int  # torch calls its ops made per forward
    predicted_fused_us: float  # its time scaled by fused / unfused bytes (a backward by its own bytes)
    amdahl_speedup: float  # the forward's speedup if only this cluster were fused as predicted
    rank_by_time: int  # 1: the cluster that takes longest
    rank_by_bytes: int  # 1: the cluster that saves the most bytes by the cost model
    backward_us: float = 0.0  # the part of `us` in its backward (a training step)


@dataclass
class OpaqueTime:
    kind: str  # one of OPAQUE_KINDS
    us: float
    share: float
    ops: list[str] = field(default_factory=list)


@dataclass
class AppliedTime:
    """A kernel `fuselens apply` put in the file: its cluster's measured time in the code before the
    edit, the time the cost model predicted for it fused, and the time the kernel measures now."""

    kernel: str  # "cluster3"
    cluster: str  # the cluster's id in the code before apply
    kind: str  # the cluster's kind ("softmax", "elementwise")
    unfused_us: float
    predicted_fused_us: float
    measured_us: float
    error: float  # predicted / measured - 1: above 0, the cost model expected it slower than it is
    reference: bool = False  # the kernel did not run here (no CUDA, say): `measured_us` is its reference's


@dataclass
class ModelProfile:
    name: str
    forward_us: float  # measured time per forward (or training step): the sum of every kernel (CPU: op)
    attributed_us: float  # the part attributed to a call of the model's code
    unattributed_us: float  # the rest, shown as such
    backward_us: float = 0.0  # the part of `forward_us` in the backward (a training step)
    wall_us: float | None = None  # one forward timed alone, without the profiler (CUDA events)
    lines: list[LineTime] = field(default_factory=list)  # longest first
    clusters: list[ClusterTime] = field(default_factory=list)  # by rank_by_time
    opaque: list[OpaqueTime] = field(default_factory=list)  # longest first
    unfused_us: float = 0.0  # ops outside every cluster and not opaque (elementwise ops left alone)
    problem: str = ""  # why the model could not be profiled ("" when it was)
    # The input shapes the forward ran at: the analyzed ones, or on a CPU by default smaller ones with the
    # same clusters, so that a forward moves at most `cpu_budget_bytes` (`--full-size`: the analyzed ones).
    inputs: list[list[int]] = field(default_factory=list)
    cpu_budget_bytes: int | None = None  # the bound the shapes were brought under, when they were
    # For a model with declared dynamic sizes: each size's values at every call of a module of its class
    # in the profiled forwards (its own, and where another profiled model calls it), smallest first.
    sizes_seen: dict[str, list[int]] = field(default_factory=dict)
    # The fuselens kernels the code calls (an applied file), by name: µs per forward, their reference's
    # where it ran instead.  Their calls' time is on the lines that call them.
    kernels: dict[str, float] = field(default_factory=dict)
    fell_back: list[str] = field(default_factory=list)  # those of `kernels` whose reference ran instead
    # For an applied file, the code before apply measured in the same run: its forward, each applied
    # kernel against its prediction, and the cost model's mean error by cluster kind.
    before_us: float | None = None
    applied: list[AppliedTime] = field(default_factory=list)
    cost_model_error: dict[str, float] = field(default_factory=dict)


@dataclass
class Profile:
    mode: str  # "cuda": GPU kernel time; "cpu": each CPU op's own time
    device: str  # "NVIDIA H200", "cpu"
    iterations: int  # forwards profiled, after `warmup` forwards that were not
    warmup: int
    step: str = "forward"  # "forward", or "training step": the forward, then the backward of its outputs
    versions: dict[str, str] = field(default_factory=dict)  # torch, and the driver on CUDA
    models: list[ModelProfile] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # why nothing was profiled (no CUDA where it was asked for)
    version: int = PROFILE_VERSION
