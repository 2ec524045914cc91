"""The torch.compile comparison in the editor: a background job after the fast analysis.

The fast analysis publishes first; then, if `compareInductor` is on and the document has
stayed as it is for a moment, the worker compiles the model with Inductor (seconds of CPU)
and a new analysis holding the comparison replaces the cached one: hover gains a "torch.compile" section,
the model's lens says how often Inductor agrees, and Inductor fusions fuselens does not make
become Hint diagnostics.  It compiles with the settings the analysis was made with
(`Analysis.settings`), and is kept under those settings and the worker's torch.  It runs quietly: no progress in the editor's status, and the
diagnostics are published again only when it adds one.  A new save cancels the job (a burst
of saves starts none); results are cached by file content, settings and torch version.

Comparisons yield (`admission.py`): none starts while an analysis or a validation runs or waits,
one that runs when a save arrives is stopped and queued again, and the comparison of the
document the user is working on goes before the others'.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from fuselens.contracts.inductor import ComparisonResult
from fuselens.worker.protocol import CompareJob, Job, Limits

from .admission import Admission, Turn
from .scheduler import Analysis
from .state import Analyses
from .workers import JobFailed

RunJob = Callable[[Job, Limits], Awaitable[Any]]  # a job's result from the worker
OnCompared = Callable[[str, Analysis], None]  # (uri, the analysis with the comparison, now kept in its place)

CACHE_SIZE = 16
IDLE_SECONDS = 2.0  # a document saved again within this starts no comparison for the older text


class InductorComparer:
    def __init__(
        self,
        run: RunJob,
        torch_version: Callable[[], str],
        admission: Admission,
        analyses: Analyses,
        log: Callable[[str], None],
        on_compared: OnCompared,
    ) -> None:
        self._run_job = run
        self._torch_version = torch_version
        self._admission = admission
        self._analyses = analyses
        self._log = log
        self._on_compared = on_compared
        self.jobs: dict[str, asyncio.Task] = {}
        self.queued: dict[str, Turn] = {}  # each job's place in the admission queue
        self.cache: OrderedDict[str, ComparisonResult] = OrderedDict()
        self.completed = 0
        self.cancelled = 0
        self.preempted = 0  # stopped for an analysis, and queued again

    def key(self, analysis: Analysis) -> str:
        settings = analysis.settings.analysis_key()
        return hashlib.sha256(f"{analysis.text}\0{settings}\0{self._torch_version()}".encode()).hexdigest()

    def cancel(self, uri: str) -> None:
        queued = self.queued.pop(uri, None)
        if queued is not None:
            self._admission.withdraw(queued)  # (its task may never have run)
        task = self.jobs.pop(uri, None)
        if task is not None and not task.done():
            task.cancel()
            self.cancelled += 1
            self._log(f"torch.compile comparison cancelled: {_name(uri)} changed")

    def start(self, uri: str, path: str, analysis: Analysis) -> None:
        """After `analysis` is published: merge a cached comparison, or queue one in the background (at
        once: the document's place in the queue is taken before the analysis gives its turn back)."""
        report = analysis.report
        if analysis.failure is not None or not any(m.status == "analyzed" and m.clusters for m in report.models):
            return
        self.cancel(uri)
        key = self.key(analysis)
        cached = self.cache.get(key)
        if cached is not None:
            self.cache.move_to_end(key)
            self._merge(uri, analysis, cached)
            return
        self.queued[uri] = self._admission.queue(path, IDLE_SECONDS)
        self.jobs[uri] = asyncio.ensure_future(self._run(uri, path, analysis, key))

    async def _run(self, uri: str, path: str, analysis: Analysis, key: str) -> None:
        """The comparison of `analysis`, kept under `key` (taken as it was queued: the worker may have
        been restarted with another torch by the time it ends)."""
        w = analysis.settings.worker
        job = CompareJob(path, analysis.settings.analyze_options(analysis.text))
        try:
            result = await self._compare_in_turn(uri, job, Limits(max(w.timeout_seconds, 300.0), w.memory_mb))
        except JobFailed as exc:
            if exc.kind != "cancelled":
                self._log(f"torch.compile comparison failed: {exc}")
            return
        finally:
            if self.jobs.get(uri) is asyncio.current_task():
                self.queued.pop(uri, None)
        self.completed += 1
        self._log(f"torch.compile comparison of {_name(path)} v{analysis.version} done")
        self.cache[key] = result
        while len(self.cache) > CACHE_SIZE:
            self.cache.popitem(last=False)
        self._merge(uri, analysis, result)

    async def _compare_in_turn(self, uri: str, job: CompareJob, limits: Limits) -> ComparisonResult:
        """The comparison, in its background turn: after IDLE_SECONDS (cancelled by the next save: no
        compile for a text left behind), after the analyses, one at a time.  When an analysis or a
        validation arrives meanwhile, the compile is stopped and queued again in its place."""
        admission = self._admission

        def waits(why: str) -> None:
            self._log(f"torch.compile comparison of {_name(job.path)} waits: {why}")

        queued = self.queued[uri]
        while True:
            async with admission.run(queued, on_wait=waits) as turn:
                compare = asyncio.ensure_future(self._compare(job, limits))
                stops: list[asyncio.Future[Any]] = [compare, turn.preempted]
                try:
                    await asyncio.wait(stops, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if not compare.done():
                        compare.cancel()  # (the worker kills the job)
                        with contextlib.suppress(asyncio.CancelledError, JobFailed):
                            await compare
                if not compare.cancelled():
                    return compare.result()
            self.preempted += 1
            self._log(f"torch.compile comparison of {_name(job.path)} put back: an analysis goes first")
            queued = self.queued[uri] = admission.queue(job.path, place=turn.place)

    async def _compare(self, job: CompareJob, limits: Limits) -> ComparisonResult:
        self._log(f"torch.compile comparison of {_name(job.path)} started")
        result: ComparisonResult = await self._run_job(job, limits)
        return result

    def _merge(self, uri: str, analysis: Analysis, result: ComparisonResult) -> None:
        """Keep, in `analysis`'s place, a new analysis that holds the comparison: what was published is
        never changed under a request that is answering from it."""
        compared = with_comparison(analysis, result)
        if self._analyses.replace(uri, analysis, compared):  # (not when a newer analysis replaced it)
            self._on_compared(uri, compared)


def with_comparison(analysis: Analysis, result: ComparisonResult) -> Analysis:
    """`analysis` with the comparison in each of its models, as a new analysis (`analysis` is unchanged)."""
    models = [
        dataclasses.replace(
            model,
            inductor=comparison if (comparison := result.models.get(model.name)) is not None else model.inductor,
            inductor_error=result.errors.get(model.name, ""),
        )
        for model in analysis.report.models
    ]
    report = dataclasses.replace(analysis.report, models=models)
    return dataclasses.replace(analysis, report=report, inductor_sources=result.sources)


def _name(path: str) -> str:
    return path.rsplit("/", 1)[-1]
