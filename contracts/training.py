"""What the user's own validations measured of each cluster's training, as a fix's kernel module reads it.

A cluster's kernels train only where they were not measured slower: `fuselens validate` times each
cluster's training step on a GPU (its forward and its gradients, eager, torch.compile and the kernels,
`validation.TrainingTiming`), and the file's validation history keeps it (`history.py`).  When a fix
writes the kernel module, the latest such measurement of each cluster is passed to the code
generator (`AnalyzeOptions.training`); a cluster whose kernels' step measured slower than
torch.compile's (mode COMPILE_MODE, the results table's baseline) gets no backward, so that a call
that wants gradients runs the original code, and says so where its backward is described.  Without
a measurement (no GPU, never validated) the kernels train: their gradients are checked against eager
autograd like their forward, and their own benchmarks measure them ahead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .history import ValidationRun, run_label
from .validation import COMPILE_MODE, ORIGINAL_CODE


@dataclass(frozen=True)
class MeasuredTraining:
    """One cluster's training step as a validation timed it."""

    model: str
    cluster: str  # its id ("c1")
    ops: str  # its op chain, which must still be the cluster's for the measurement to be its
    step_vs_compiled: float  # torch.compile's step time over the kernels' (below 1: the kernels are slower)
    device: str  # "NVIDIA H100 80GB HBM3"
    when: str  # the run, as the history names it ("2025-01-31 12:03 UTC")


def measured_training(runs: Sequence[ValidationRun]) -> list[MeasuredTraining]:
    """The latest measurement of each cluster's training step in `runs` (a file's history, oldest first)."""
    latest: dict[tuple[str, str, str], MeasuredTraining] = {}
    for run in runs:
        for model in run.report.models:
            for check in model.clusters:
                timing = check.backward.timing if check.backward is not None else None
                if timing is None or timing.step_vs_compiled is None:
                    continue
                key = (model.name, check.id, check.ops)
                latest[key] = MeasuredTraining(*key, timing.step_vs_compiled, run.device, run_label(run))
    return list(latest.values())


def measured_slower(
    measured: Sequence[MeasuredTraining], model: str, cluster: str, ops: str
) -> MeasuredTraining | None:
    """The measurement of the cluster `cluster` of `model` (its op chain `ops`) where its kernels'
    training step was slower than torch.compile's; None where it was not measured so."""
    for m in measured:
        if (m.model, m.cluster, m.ops) == (model, cluster, ops) and m.step_vs_compiled < 1.0:
            return m
    return None


def slower_in_training(measured: Sequence[MeasuredTraining], model: str, cluster: str, ops: str) -> str:
    """Why the cluster trains through its original code (`measured_slower`), as its backward's detail
    says it; "" where it trains with its kernels."""
    m = measured_slower(measured, model, cluster, ops)
    if m is None:
        return ""
    return (
        f"{ORIGINAL_CODE}: its kernels' training step (forward and backward) measured "
        f"{m.step_vs_compiled:.2f}× torch.compile's ({COMPILE_MODE}) on {m.device}, validated {m.when}"
    )


def training_note(m: MeasuredTraining) -> str:
    """The same, short, as a fix's title ends: "trains through the original code: 0.80× torch.compile"."""
    return f"{ORIGINAL_CODE}: {m.step_vs_compiled:.2f}× torch.compile in training"
