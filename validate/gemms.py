"""A cluster that starts with a GEMM, on a CUDA device: the fused kernel against the library's GEMM with
the epilogue's own kernel after it (and cuBLASLt's GEMM with its own epilogue, where the kernel module
offers it), timed on the cluster's recorded inputs, and which of them the kernel module keeps at the
shape.

The public function times its paths the first time a shape comes (`_gemm_fastest` in the module's
runtime) and keeps the fused kernel only where it beats the library's path; here the same paths are
timed again by CUDA-graph replay beside eager and torch.compile, and the module's choice is read
back, so that the validation says per cluster what runs and by how much it wins or loses.
"""

from __future__ import annotations

from typing import Any

import torch

from fuselens.analysis.graph import plain
from fuselens.codegen.gemm_launcher import gemm_form_name
from fuselens.codegen.plan import KernelPlan
from fuselens.contracts.validation import Timing

from .gpu import time_graphs_us

# Each path, as the validation's message names it.
_PATHS = {
    "fused": "the fused kernel",
    "library": "the library's GEMM and the epilogue's kernel",
    "cublaslt": "cuBLASLt's GEMM with its epilogue",
}


def compare_paths(timing: Timing, kernels: Any, name: str, plan: KernelPlan, args: list[torch.Tensor]) -> str:
    """Fill `timing`'s GEMM figures for cluster `name` (its plan, its recorded inputs `args`); the line
    the cluster's check says of them."""
    gemm = plan.gemm
    assert gemm is not None
    numbers = [plain(slot.value) for slot in plan.scalars]
    runtime = [plain(slot.value) for slot in plan.scalars if slot.runtime]
    fused = getattr(kernels, f"_{name}_fused")
    library = getattr(kernels, f"_{name}_library")
    calls = {"fused": lambda: fused(*args, *runtime), "library": lambda: library(*args, *numbers)}
    cublaslt = getattr(kernels, f"_{name}_cublaslt", None)
    if cublaslt is not None:
        calls["cublaslt"] = lambda: cublaslt(*args)
    with torch.no_grad():
        getattr(kernels, name)(*args)  # the module's own choice at this shape: its tile, then its path
        times = time_graphs_us(calls)
    timing.gemm_fused_us = round(times["fused"], 2)
    timing.gemm_library_us = round(times["library"], 2)
    timing.gemm_cublaslt_us = round(times["cublaslt"], 2) if "cublaslt" in times else None
    a, b = (args[k] for k in gemm.operands[:2])
    key = kernels._gemm_key(name, gemm_form_name(gemm), a, b)
    timing.gemm_kept = kernels._GEMM_CHOSEN.get(repr(("path", *key)), "")
    return kept_line(timing)


def kept_line(timing: Timing) -> str:
    """What runs at the validated shape, and the times it was chosen over."""
    measured = {
        path: us
        for path, us in (
            ("fused", timing.gemm_fused_us),
            ("library", timing.gemm_library_us),
            ("cublaslt", timing.gemm_cublaslt_us),
        )
        if us is not None
    }
    listed = ", ".join(f"{_PATHS[path]} {us:.1f} µs" for path, us in measured.items())
    if not timing.gemm_kept:
        return f"GEMM: {listed}; no path was chosen at this shape"
    kept = f"{_PATHS[timing.gemm_kept]} runs at this shape"
    if timing.gemm_kept != "fused" and "fused" in measured:
        kept += " (the fused kernel is not faster here, so it is not used)"
    return f"GEMM: {listed}; {kept}"
