"""Comparing a kernel's outputs with eager: per-dtype tolerances, NaN/Inf aware."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# (atol, rtol) per output dtype.  The kernels compute in fp32 without rounding each
# intermediate to a narrow dtype, so fp16/bf16 differ from eager by a few ulps.  The Triton
# interpreter (3.8) also truncates float32 to bf16 where a GPU rounds to nearest, so in CI a bf16
# result can sit one ulp toward zero from eager's.
TOLERANCES = {
    torch.float32: (1e-4, 1e-4),
    torch.float64: (1e-7, 1e-7),
    torch.float16: (2e-3, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
}


@dataclass
class Comparison:
    ok: bool
    max_abs: float
    max_rel: float
    atol: float
    rtol: float
    message: str = ""
    # The largest |error| / (atol + rtol·|expected|) over the elements: what the verdict compares with 1.
    tolerance_ratio: float = 0.0


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return TOLERANCES.get(dtype, (0.0, 0.0))


_WIDTH = {torch.float64: 64, torch.float32: 32, torch.float16: 16, torch.bfloat16: 16}


def narrowest(dtypes) -> torch.dtype | None:
    """The float dtype with the fewest mantissa bits among `dtypes` (bf16 < fp16 < fp32 < fp64)."""
    floats = [d for d in dtypes if d in _WIDTH]
    if not floats:
        return None
    return min(floats, key=lambda d: (_WIDTH[d], d != torch.bfloat16))


# Whole models on a GPU: convolutions run in TF32 by default (10-bit mantissa), so a tiny
# difference entering a convolution leaves it amplified to TF32 rounding.
TF32 = (1e-3, 1e-3)


def compare(
    actual: torch.Tensor,
    expected: torch.Tensor,
    precision: torch.dtype | None = None,
    tol: tuple[float, float] | None = None,
) -> Comparison:
    """Compare within the tolerance of `precision`: the narrowest float type the values
    passed through (a bf16 cast inside an fp32 computation rounds like bf16)."""
    narrow = narrowest([expected.dtype, precision]) if precision else None
    # With no float among them (integer values) there is no narrower type: exact, as for any non-float.
    atol, rtol = tolerance(narrow if narrow is not None else expected.dtype)
    if tol is not None:
        atol, rtol = max(atol, tol[0]), max(rtol, tol[1])
    inf = float("inf")
    if actual.shape != expected.shape:
        shape = f"shape {list(actual.shape)} instead of {list(expected.shape)}"
        return Comparison(False, inf, inf, atol, rtol, shape, inf)
    if actual.dtype != expected.dtype:
        return Comparison(False, inf, inf, atol, rtol, f"dtype {actual.dtype} instead of {expected.dtype}", inf)
    a = actual.detach().to(torch.float64)  # on its own device: a GPU compares 1 GB outputs in place
    e = expected.detach().to(a.device, torch.float64)
    if a.numel() == 0:
        return Comparison(True, 0.0, 0.0, atol, rtol)
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    if not torch.equal(nan_a, nan_e):
        bad = int((nan_a != nan_e).sum())
        nan = float("nan")
        return Comparison(False, nan, nan, atol, rtol, f"{bad} element(s) NaN in one and not the other", inf)
    inf_a, inf_e = torch.isinf(a), torch.isinf(e)
    if not torch.equal(inf_a, inf_e) or not torch.equal(a[inf_a], e[inf_e]):
        return Comparison(False, inf, inf, atol, rtol, "infinities differ", inf)
    finite = ~(nan_e | inf_e)
    diff = (a - e).abs()[finite]
    ref = e.abs()[finite]
    max_abs = float(diff.max()) if diff.numel() else 0.0
    sizable = ref > atol  # relative error means little next to values near zero
    max_rel = float((diff[sizable] / ref[sizable]).max()) if bool(sizable.any()) else 0.0
    bound = atol + rtol * ref
    ok = bool((diff <= bound).all())
    message = "" if ok else f"max |error| {max_abs:.3g} exceeds atol {atol:g} + rtol {rtol:g}·|expected|"
    return Comparison(ok, max_abs, max_rel, atol, rtol, message, _tolerance_ratio(diff, bound))


def _tolerance_ratio(diff: torch.Tensor, bound: torch.Tensor) -> float:
    """max(|error| / tolerance) over the elements: an error where the tolerance is 0 (an exact dtype) is
    infinitely over it, no error there is none (0 / 0)."""
    if diff.numel() == 0:
        return 0.0
    return float(torch.nan_to_num(diff / bound, nan=0.0, posinf=float("inf")).max())


# A narrow model's whole output, after many layers, differs from eager's by more than a few ulps
# wherever one rounding inside it differs; what matters is that it is as accurate as eager's.  So,
# as torch.compile's own accuracy check does (`torch._dynamo.utils.same` with a float64
# reference), both are measured against the model run in float64: the patched output may be off
# by up to this many times eager's root-mean-square error.  (torch.compile allows 3 for bf16/fp16.)
ACCURACY_MULTIPLIER = 2.0
# And, as there, an error this small passes whatever eager's (`tol / 10` of its default `tol`): a value
# whose float64 truth is about zero (the gradient of a bias a normalisation takes out, a key's bias in
# attention) is rounding noise in both float32 runs, at any ratio of one to the other.
ACCURACY_SLACK = 1e-5
NARROW = (torch.float16, torch.bfloat16)


@dataclass
class Accuracy:
    ok: bool
    error: float  # root-mean-square error against float64, of the output checked
    eager_error: float  # the same of eager's output


def rms_error(actual: torch.Tensor, exact: torch.Tensor) -> float:
    a = actual.detach().to(torch.float64)
    e = exact.detach().to(a.device, torch.float64)
    finite = torch.isfinite(e)
    return float(((a - e)[finite] ** 2).mean().sqrt()) if bool(finite.any()) else 0.0


def as_accurate_as_eager(actual: torch.Tensor, expected: torch.Tensor, exact: torch.Tensor) -> Accuracy:
    """Whether `actual` (the patched model's output) is about as close to `exact` (the model in
    float64) as `expected` (eager's) is: NaN where and only where eager has NaN, and a
    root-mean-square error at most ACCURACY_MULTIPLIER times eager's."""
    if actual.shape != expected.shape or not torch.equal(torch.isnan(actual), torch.isnan(expected)):
        return Accuracy(False, float("inf"), rms_error(expected, exact))
    error, eager_error = rms_error(actual, exact), rms_error(expected, exact)
    return Accuracy(error <= ACCURACY_MULTIPLIER * eager_error + ACCURACY_SLACK, error, eager_error)


# A gradient or a statistic sums over the batch and positions; a kernel sums in another order than
# eager, and where the model cancels (a batch norm's gradient subtracts its mean) the rounding of
# that order is amplified past an element's tolerance.  Such a sum "matches" when it differs from
# eager's by little against its own size: the relative 2-norm difference within this bound.
SUM_BOUND = {torch.float32: 1e-4, torch.float64: 1e-4}
NARROW_SUM_BOUND = 1e-2


@dataclass
class SumCloseness:
    ok: bool
    relative: float  # |actual - expected| / |expected|, 2-norms
    bound: float


def sums_close(actual: torch.Tensor, expected: torch.Tensor) -> SumCloseness:
    """Whether a summed value (a gradient, a statistic) is `expected` up to the order of its sums."""
    bound = SUM_BOUND.get(expected.dtype, NARROW_SUM_BOUND)
    a, e = actual.detach().double(), expected.detach().to(actual.device).double()
    relative = float((a - e).norm()) / (float(e.norm()) or 1.0)
    return SumCloseness(relative <= bound, relative, bound)
