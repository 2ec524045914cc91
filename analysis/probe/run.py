"""Run a model on a probe's batches, in eval mode without autograd, every GEMM call sketched by its site."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fuselens.analysis.capture import UserCode
from fuselens.contracts.probe import ProbeSite

from .data import BatchSource, DataError
from .opportunities import site_summary
from .recorder import ProbeMode, SiteState


class ForwardError(Exception):
    """The model's forward failed on a batch: the message names the batch and the error."""


@dataclass
class Probed:
    sites: list[ProbeSite]
    batches: int
    states: list[SiteState]  # (what the sites were folded in: their memory is what a test bounds)


def probe_model(
    model: torch.nn.Module,
    source: BatchSource,
    batches: int,
    sample_every: int,
    device: str,
    user_code: UserCode,
    keep_calls: int = 0,
) -> Probed:
    """The sites' sketches; with `keep_calls`, each site keeps that many sampled calls' operands."""
    model.eval()
    mode = ProbeMode(user_code, sample_every, stop_at=_forward.__code__, keep_calls=keep_calls)
    run = 0
    iterator = source.batches()
    with torch.no_grad():
        while run < batches:
            try:
                batch = next(iterator)
            except StopIteration:
                break
            if run == 0 and not batch:
                raise DataError(f"batch 0 from {source.description} holds no tensors")
            _forward(model, mode, tuple(t.to(device) for t in batch), run)
            run += 1
    if run == 0:
        raise DataError(f"{source.description} gave no batches")
    states = sorted(mode.sites.values(), key=lambda s: (s.library, s.file, s.line, s.op))
    return Probed([site_summary(s, run) for s in states], run, states)


def _forward(model: torch.nn.Module, mode: ProbeMode, batch: tuple[torch.Tensor, ...], index: int) -> None:
    try:
        with mode:
            model(*batch)
    except (DataError, ForwardError):
        raise
    except Exception as exc:
        shapes = ", ".join(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in batch)
        raise ForwardError(f"the forward failed on batch {index} ({shapes}): {type(exc).__name__}: {exc}") from exc
    finally:
        mode.end_batch()
