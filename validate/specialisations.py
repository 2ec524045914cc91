"""Each opportunity a probe named at a GEMM site, made with PyTorch's kernels (`specialised_gemms.py`)
and measured against the dense GEMM: the relative output error over the calls the probe kept (its own
batches), and on a CUDA device the median time of each over repeated calls of the first of them.

Without CUDA the error is still measured, of the same arithmetic emulated on the CPU, and each result
says that its time needs a GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fuselens.contracts.probe import MeasuredSpecialisation, Opportunity, ProbeSite

from . import specialised_gemms as made

NO_GPU = "timing needs a CUDA GPU: the error is of the same arithmetic, emulated here"
Calls = list[tuple[torch.Tensor, torch.Tensor]]  # (x, weight), the output x @ weight.T
Maker = Callable[[torch.Tensor], tuple[str, made.Gemm]]  # weight -> (implementation, gemm)


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    reference = reference.float()
    return float((out.float() - reference).norm() / reference.norm().clamp_min(1e-30))


def measure_site(site: ProbeSite, calls: Calls, channel_max: torch.Tensor | None) -> list[MeasuredSpecialisation]:
    """Every opportunity of `site` measured on `calls`, the operands the probe kept."""
    found: list[MeasuredSpecialisation] = []
    for opportunity in site.opportunities:
        if not calls and opportunity.kind != "near-identity":
            found.append(_not_measured(opportunity, "no call of the form x @ weight.T was kept at this site"))
            continue
        found += _measured(opportunity, site, calls, channel_max)
    return found


def _measured(
    opportunity: Opportunity, site: ProbeSite, calls: Calls, channel_max: torch.Tensor | None
) -> list[MeasuredSpecialisation]:
    kind = opportunity.kind
    if kind == "sparse-2:4":
        return [measure(kind, calls, made.sparse_input if opportunity.role == "input" else made.sparse_weight)]
    if kind == "quantize":
        formats = ["fp8"] + (["int8"] if opportunity.scheme.startswith("int8") else [])
        return [quantize(fmt, calls, channel_max) for fmt in formats]
    if kind == "low-rank":
        weight = next((r for r in site.roles if r.role == "weight"), None)
        if weight is None or weight.effective_rank is None:
            return [_not_measured(opportunity, "the probe found no rank for the weight")]
        rank = weight.effective_rank
        return [measure(kind, calls, lambda w: made.low_rank(w, rank))]
    if kind == "memoize":
        return [_memoise(calls)]
    return [_not_measured(opportunity, "skipping a residual branch changes the model, not a GEMM kernel")]


def _not_measured(opportunity: Opportunity, why: str) -> MeasuredSpecialisation:
    return MeasuredSpecialisation(opportunity.kind, "", "not-measured", note=why)


def measure(kind, calls: Calls, maker: Maker, said: Callable[[], str] = lambda: "") -> MeasuredSpecialisation:
    """The GEMM `maker` makes of each call's weight, against the dense GEMM: the error over `calls`,
    the times (CUDA) on the first of them; `said` gives a note on what the error's calls did.  Where
    PyTorch refuses the kernel (a dtype, a shape, a device it lacks), the result says so, not measured."""
    try:
        with torch.no_grad():
            return _measure(kind, calls, maker, said)
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
        first = str(exc).strip().split("\n")[0][:200]
        return MeasuredSpecialisation(kind, "", "not-measured", note=f"{REFUSED} ({type(exc).__name__}: {first})")


REFUSED = "PyTorch refused it here"


def _measure(kind, calls: Calls, maker: Maker, said: Callable[[], str]) -> MeasuredSpecialisation:
    prepared: dict[tuple, tuple[str, made.Gemm]] = {}
    changed, reference = 0.0, 0.0
    for x, weight in calls:
        key = _storage(weight)
        if key not in prepared:
            prepared[key] = maker(weight)
        dense = made.dense(weight)(x).float()
        out = prepared[key][1](x).float()
        changed += float((out - dense).square().sum())
        reference += float(dense.square().sum())
    implementation, gemm = prepared[_storage(calls[0][1])]
    error = (changed / reference) ** 0.5 if reference > 0 else 0.0
    note = said()
    result = MeasuredSpecialisation(kind, implementation, "error-only", len(calls), round(error, 6), note=note)
    x, weight = calls[0]
    if x.device.type != "cuda":
        result.note = "; ".join(n for n in (note, NO_GPU) if n)
        return result
    result.dense_ms, result.specialised_ms, result.kernel_ms = _timed(made.dense(weight), gemm, x)
    result.status = "timed"
    result.note = "; ".join(n for n in (note, "timed on a hit" if kind == "memoize" else "") if n)
    return result


def _storage(weight: torch.Tensor) -> tuple:
    """What tells one weight from another: each call's weight is a view of its own, the storage is one."""
    return (weight.data_ptr(), tuple(weight.shape), weight.stride(), weight.dtype)


def _timed(dense: made.Gemm, specialised: made.Gemm, x: torch.Tensor) -> tuple[float, float, float | None]:
    """The median ms per call of each, by CUDA events over repeated calls, sampled in turn; and of a
    quantized GEMM's kernel alone, its input quantized ahead."""
    from .gpu import time_launches_us

    calls = {"dense": lambda: dense(x), "specialised": lambda: specialised(x)}
    if isinstance(specialised, made.QuantizedGemm):
        calls["kernel"] = specialised.kernel_on(x)
    times = time_launches_us(calls)
    kernel = round(times["kernel"] / 1000, 6) if "kernel" in times else None
    return round(times["dense"] / 1000, 6), round(times["specialised"] / 1000, 6), kernel


def quantize(fmt: str, calls: Calls, channel_max: torch.Tensor | None) -> MeasuredSpecialisation:
    """`fmt` with per-row and per-output-channel scales (the input's channels smoothed into the weight),
    beside the same with one scale per tensor; where this torch refuses the first, the second is timed."""
    per_tensor = measure("quantize", calls, lambda w: made.quantized(w, fmt, False))
    result = measure("quantize", calls, lambda w: made.quantized(w, fmt, True, channel_max))
    if result.status == "not-measured" and per_tensor.status != "not-measured":
        per_tensor.per_tensor_error = per_tensor.error
        per_tensor.note = "; ".join(
            n for n in (f"per-row scales: {result.note}; per-tensor measured", per_tensor.note) if n
        )
        return per_tensor
    result.per_tensor_error = per_tensor.error
    return result


def _memoise(calls: Calls) -> MeasuredSpecialisation:
    caches: list[made.Memoised] = []

    def maker(weight: torch.Tensor) -> tuple[str, made.Gemm]:
        implementation, cache = made.memoised(weight)
        caches.append(cache)
        return implementation, cache

    def hits() -> str:
        return f"{sum(c.hits for c in caches)} of {sum(c.calls for c in caches)} calls were hits"

    return measure("memoize", calls, maker, hits)
