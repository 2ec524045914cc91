"""Options of the pipeline's jobs: what the CLI and the editor ask an analysis or a validation for.

Plain data: the language server builds them from its settings and sends them over the
worker pipe (`worker/protocol.py`), the CLI builds them from its flags; both reach the
same pipeline (`pipeline/`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .config import InputSpec, ModelSettings
from .training import MeasuredTraining

MAX_BRANCH_PATHS = 4  # data-dependent branches followed the other way, per model
DEVICE_PROFILES = ("h200", "h100", "a100", "rtx4090")  # the cost model's devices (`--device`), the default first

# How a long job says how far it is: (message, fraction done or None).
Progress = Callable[[str, "float | None"], None]


def no_progress(message: str, fraction: float | None = None) -> None:
    """A Progress for callers that show none."""


@dataclass
class AnalyzeOptions:
    model_class: str | None = None  # analyze only this class
    input_shapes: list[str] | None = None  # --input-shape values
    dtypes: list[str] | None = None  # --dtype values
    dims: list[str] | None = None  # --dim values: the ranges of sizes the input shapes name
    param_dtype: str | None = None  # --param-dtype
    device: str | None = None  # device profile for regimes: one of DEVICE_PROFILES
    peak_gbps: float | None = None
    out_dir: str | None = None  # where the kernel module goes (default: beside the file)
    source_text: str | None = None  # analyze this text as the file's content (an editor buffer)
    models: dict[str, ModelSettings] = field(default_factory=dict)  # per-class settings from the editor
    branch_paths: int = MAX_BRANCH_PATHS
    # Analyze the models as they train (`model.train()`): dropout draws random masks and BatchNorm
    # updates its running statistics in place, so neither is fused across.
    train: bool = False
    # What the file's validations measured of each cluster's training step (`training.py`): a cluster
    # measured slower than torch.compile gets no backward, and trains through its original code.  What
    # writes a fix's kernel module passes them; a validation does not (it measures the kernels).
    training: list[MeasuredTraining] = field(default_factory=list)


@dataclass
class ValidateOptions:
    interpret: bool = False  # run kernels in the Triton interpreter on CPU
    clusters: list[str] | None = None  # cluster ids; None: all
    benchmark: bool = True  # time kernels (CUDA only)
    seed: int = 0
    shapes: list[InputSpec] | None = None  # validate at these instead of choosing
    peak_gbps: float | None = None  # bandwidth ceiling for "% of peak" (default: measured copy)
    # torch.compile modes timed beside mode "default" (the results table's baseline), such as
    # "max-autotune-no-cudagraphs": each compiles every cluster again, so a benchmark asks, not the editor.
    other_compile_modes: list[str] = field(default_factory=list)


@dataclass
class ProfileOptions:
    iterations: int = 10  # forwards profiled
    warmup: int = 3  # forwards run first and not profiled (allocator, cuDNN and Triton caches)
    device: str = ""  # "cuda" or "cpu"; "": CUDA where there is one
    seed: int = 0
    train: bool = False  # profile a training step: the forward, then the backward of its outputs
    # On a CPU, the analyzed input shapes as they are; by default smaller ones with the same clusters, so
    # that a forward moves at most `pipeline.profile_shapes.CPU_FORWARD_BYTES`.
    full_size: bool = False
