"""A probe run in a worker of its own: what `fuselens probe` calls, so that the user's model and data
function run in the worker process, never in the command's."""

from __future__ import annotations

from collections.abc import Callable

from fuselens.contracts.options import AnalyzeOptions
from fuselens.contracts.probe import ProbeOptions, ProbeReport
from fuselens.worker.protocol import MAX_MEMORY_MB, Limits, ProbeJob

from .workers import WorkerClient

PROBE_SECONDS = 3600.0  # a probe over many batches of a large model on a CPU is slow, not stuck


async def probe_in_worker(
    path: str,
    analyze_options: AnalyzeOptions,
    options: ProbeOptions,
    progress: Callable[[str, float | None], None] | None = None,
) -> ProbeReport:
    """The probe report of `path` (raises `workers.JobFailed` when the job did not finish)."""
    worker = WorkerClient()
    try:
        return await worker.run(
            ProbeJob(path, analyze_options, options), Limits(PROBE_SECONDS, MAX_MEMORY_MB), progress
        )
    finally:
        await worker.stop()
