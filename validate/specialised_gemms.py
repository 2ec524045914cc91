"""A GEMM `x @ weight.T` (x: tokens × K, weight: N × K) made the way a probe's opportunity says, with
PyTorch's own kernels where it has them and the same arithmetic emulated where it does not.

Each maker takes the weight (and what the probe measured) once, as a deployment would prepare it,
and returns a function of the input.  On a CUDA device the function runs PyTorch's kernel
(`torch._scaled_mm`, `torch._int_mm`, semi-structured sparse tensors); elsewhere it computes what that
kernel computes (operands cast to float8 or rounded to int8 and back with the same scales, operands
pruned to 2:4), so that the output error can be measured on any machine and the time only on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from fuselens.analysis.probe import numerics
from fuselens.analysis.probe.distinct import fingerprint

Gemm = Callable[[torch.Tensor], torch.Tensor]
FP8_MAX = numerics.FP8_MAX
INT8_MAX = numerics.INT8_MAX
SMOOTHING = 0.5  # how much of an input channel's range moves into the weight (SmoothQuant's alpha)


def dense(weight: torch.Tensor) -> Gemm:
    return lambda x: F.linear(x, weight)


def _absmax(t: torch.Tensor, dim: int | None) -> torch.Tensor:
    """The abs max along `dim` (kept as a dim of 1), or the whole tensor's (a 0-d tensor)."""
    return t.abs().amax(dim=dim, keepdim=True).float() if dim is not None else t.abs().amax().float()


def smoothing(weight: torch.Tensor, input_channel_max: torch.Tensor) -> torch.Tensor:
    """Per input channel (K), the factor the input is divided by and the weight multiplied by, so that
    an input's outlier channels share their range with the weight: max|x|^α / max|w|^(1−α)."""
    weight_max = weight.abs().amax(0).float().clamp_min(numerics.TINY)
    factor = input_channel_max.float().clamp_min(numerics.TINY) ** SMOOTHING / weight_max ** (1 - SMOOTHING)
    return factor.clamp_min(1e-6)


class QuantizedGemm:
    """A GEMM in fp8 or int8 on a prepared weight: called on an input, it quantizes the input first
    (per call, in PyTorch ops of their own) and runs the low-precision kernel; `kernel_on(x)` gives a
    call of the kernel alone on `x` quantized ahead, what it costs where the op before it leaves its
    output quantized (a fused producer)."""

    def __init__(self, weight: torch.Tensor, fmt: str, per_channel: bool, input_channel_max: torch.Tensor | None):
        self.fmt, self.out_features = fmt, weight.shape[0]
        self.smooth = smoothing(weight, input_channel_max) if per_channel and input_channel_max is not None else None
        w = weight.float() * self.smooth if self.smooth is not None else weight.float()
        self.dim = -1 if per_channel else None
        self.largest = FP8_MAX if fmt == "fp8" else INT8_MAX
        self.w_scale = _absmax(w, self.dim).clamp_min(numerics.TINY) / self.largest
        self.wq = _cast(w / self.w_scale, fmt)
        self.cuda = weight.device.type == "cuda"

    def quantize_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = x.reshape(-1, x.shape[-1]).float()
        if self.smooth is not None:
            rows = rows / self.smooth
        x_scale = _absmax(rows, self.dim).clamp_min(numerics.TINY) / self.largest
        return _cast(rows / x_scale, self.fmt), x_scale

    def kernel(self, xq: torch.Tensor, x_scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if self.cuda:
            return _device_gemm(self.fmt, xq, self.wq, x_scale, self.w_scale, dtype)
        return (xq.float() * x_scale) @ (self.wq.float() * self.w_scale).T

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xq, x_scale = self.quantize_input(x)
        out = self.kernel(xq, x_scale, x.dtype)
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def kernel_on(self, x: torch.Tensor) -> Callable[[], torch.Tensor]:
        xq, x_scale = self.quantize_input(x)
        return lambda: self.kernel(xq, x_scale, x.dtype)


def quantized(
    weight: torch.Tensor, fmt: str, per_channel: bool, input_channel_max: torch.Tensor | None = None
) -> tuple[str, QuantizedGemm]:
    """The GEMM in `fmt` ("fp8" or "int8") with one scale per tensor, or (`per_channel`) the input's
    channels smoothed into the weight and one scale per row of the input and per output channel of the
    weight; its description and the function."""
    scaling = "per-row × per-output-channel scales, input channels smoothed into the weight" if per_channel else (
        "per-tensor scales"
    )  # fmt: skip
    kernel = {"fp8": "torch._scaled_mm (float8 e4m3)", "int8": "torch._int_mm (int8)"}[fmt]
    return f"{kernel}, {scaling}", QuantizedGemm(weight, fmt, per_channel, input_channel_max)


def _cast(scaled: torch.Tensor, fmt: str) -> torch.Tensor:
    if fmt == "fp8":
        return scaled.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return scaled.round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8)


def _device_gemm(
    fmt: str, xq: torch.Tensor, wq: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    if fmt == "int8":  # int32 accumulators, the scales applied after
        return torch._int_mm(xq, wq.T) * x_scale * (w_scale.T if w_scale.dim() else w_scale)
    out_dtype = dtype if dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    scale_b = w_scale.T if w_scale.dim() else w_scale
    return torch._scaled_mm(xq, wq.T, scale_a=x_scale, scale_b=scale_b, out_dtype=out_dtype)


def sparse_weight(weight: torch.Tensor) -> tuple[str, Gemm]:
    """The weight pruned to 2:4 along K (the two largest of every four kept), as a semi-structured
    sparse tensor on a CUDA device."""
    pruned = numerics.prune_24(weight.float()).to(weight.dtype)
    if weight.device.type == "cuda":
        sparse = torch.sparse.to_sparse_semi_structured(pruned)
        return "torch.sparse.to_sparse_semi_structured weight (pruned to 2:4), F.linear", lambda x: _linear_2d(
            x, sparse, weight.shape[0]
        )
    return "the weight pruned to 2:4, dense F.linear", lambda x: F.linear(x, pruned)


def sparse_input(weight: torch.Tensor) -> tuple[str, Gemm]:
    """The input pruned to 2:4 along K each call (a no-op where it already is) and, on a CUDA device,
    compressed to a semi-structured sparse tensor: that compression is part of what each call costs."""

    def gemm(x: torch.Tensor) -> torch.Tensor:
        rows = numerics.prune_24(x.reshape(-1, x.shape[-1])).to(x.dtype)
        if x.device.type == "cuda":
            out = torch.mm(torch.sparse.to_sparse_semi_structured(rows), weight.T)
        else:
            out = rows @ weight.T
        return out.reshape(*x.shape[:-1], weight.shape[0])

    where = "torch.sparse.to_sparse_semi_structured input (compressed each call), torch.mm"
    return where if weight.device.type == "cuda" else "the input pruned to 2:4, dense matmul", gemm


def _linear_2d(x: torch.Tensor, sparse: torch.Tensor, out_features: int) -> torch.Tensor:
    return F.linear(x.reshape(-1, x.shape[-1]), sparse).reshape(*x.shape[:-1], out_features)


def low_rank(weight: torch.Tensor, rank: int) -> tuple[str, Gemm]:
    """The weight as two factors of `rank` (its leading singular triplets): two GEMMs."""
    left, right = numerics.low_rank_factors(weight, rank)
    left, right = left.to(weight.dtype), right.to(weight.dtype)
    return f"two GEMMs through rank {rank} ({tuple(right.shape)}, then {tuple(left.shape)})", lambda x: F.linear(
        F.linear(x, right), left
    )


class Memoised:
    """The dense GEMM behind a cache of outputs by input: a fingerprint finds the entry, an exact
    comparison confirms it, so that a hit returns the output the GEMM would have."""

    def __init__(self, weight: torch.Tensor, capacity: int = 64):
        self.weight = weight
        self.capacity = capacity
        self.entries: dict[bytes, tuple[torch.Tensor, torch.Tensor]] = {}
        self.hits = 0
        self.calls = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        key = fingerprint(x)
        held = self.entries.get(key)
        if held is not None and held[0].shape == x.shape and torch.equal(held[0], x):
            self.hits += 1
            return held[1]
        out = F.linear(x, self.weight)
        if len(self.entries) < self.capacity:
            self.entries[key] = (x.clone(), out)
        return out


def memoised(weight: torch.Tensor) -> tuple[str, Memoised]:
    return "a cache of outputs by input (fingerprint, then an exact comparison)", Memoised(weight)
