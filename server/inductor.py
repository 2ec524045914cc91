"""The torch.compile comparison in the editor: a background job after the fast analysis.

The fast analysis publishes first; then, if `compareInductor` is on and the document has
stayed as it is for a moment, the worker compiles the model with Inductor (seconds of CPU)
and a new analysis holding the comparison replaces the cached one: hover gains a "torch.compile" section,
the model's lens says how often Inductor agrees, and Inductor fusions fuselens does not make
become Hint diagnostics.  It runs quietly: no progress in the editor's status, and the
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
from typing import TYPE_CHECKING, Any

from fuselens.contracts.inductor import ComparisonResult
from fuselens.worker.protocol import CompareJob, Limits

from .admission import Turn
from .scheduler import Analysis
from .workers import JobFailed

if TYPE_CHECKING:
    from .app import FuselensServer

CACHE_SIZE = 16
IDLE_SECONDS = 2.0  # a document saved again within this starts no comparison for the older text


class InductorComparer:
    def __init__(self, server: FuselensServer):
        self.server = server
        self.jobs: dict[str, asyncio.Task] = {}
        self.queued: dict[str, Turn] = {}  # each job's place in the admission queue
        self.cache: OrderedDict[str, ComparisonResult] = OrderedDict()
        self.completed = 0
        self.cancelled = 0
        self.preempted = 0  # stopped for an analysis, and queued again

    def key(self, analysis: Analysis) -> str:
        worker = self.server.worker.info.torch if self.server.worker and self.server.worker.info else ""
        settings = self.server.settings.analysis_key()
        return hashlib.sha256(f"{analysis.text}\0{settings}\0{worker}".encode()).hexdigest()

    def cancel(self, uri: str) -> None:
        queued = self.queued.pop(uri, None)
        if queued is not None:
            self.server.scheduler.admission.withdraw(queued)  # (its task may never have run)
        task = self.jobs.pop(uri, None)
        if task is not None and not task.done():
            task.cancel()
            self.cancelled += 1
            self.server.log_line(f"torch.compile comparison cancelled: {_name(uri)} changed")

    def start(self, uri: str, path: str, analysis: Analysis) -> None:
        """After `analysis` is published: merge a cached comparison, or queue one in the background (at
        once: the document's place in the queue is taken before the analysis gives its turn back)."""
        report = analysis.report
        if analysis.failure is not None or not any(m.status == "analyzed" and m.clusters for m in report.models):
            return
        self.cancel(uri)
        cached = self.cache.get(self.key(analysis))
        if cached is not None:
            self.cache.move_to_end(self.key(analysis))
            self._merge(uri, analysis, cached)
            return
        self.queued[uri] = self.server.scheduler.admission.queue(path, IDLE_SECONDS)
        self.jobs[uri] = asyncio.ensure_future(self._run(uri, path, analysis))

    async def _run(self, uri: str, path: str, analysis: Analysis) -> None:
        server = self.server
        w = server.settings.worker
        job = CompareJob(path, server.settings.analyze_options(analysis.text))
        try:
            result = await self._compare_in_turn(uri, job, Limits(max(w.timeout_seconds, 300.0), w.memory_mb))
        except JobFailed as exc:
            if exc.kind != "cancelled":
                server.log_line(f"torch.compile comparison failed: {exc}")
            return
        finally:
            if self.jobs.get(uri) is asyncio.current_task():
                self.queued.pop(uri, None)
        self.completed += 1
        server.log_line(f"torch.compile comparison of {_name(path)} v{analysis.version} done")
        key = self.key(analysis)
        self.cache[key] = result
        while len(self.cache) > CACHE_SIZE:
            self.cache.popitem(last=False)
        self._merge(uri, analysis, result)

    async def _compare_in_turn(self, uri: str, job: CompareJob, limits: Limits) -> ComparisonResult:
        """The comparison, in its background turn: after IDLE_SECONDS (cancelled by the next save: no
        compile for a text left behind), after the analyses, one at a time.  When an analysis or a
        validation arrives meanwhile, the compile is stopped and queued again in its place."""
        admission = self.server.scheduler.admission

        def waits(why: str) -> None:
            self.server.log_line(f"torch.compile comparison of {_name(job.path)} waits: {why}")

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
            self.server.log_line(f"torch.compile comparison of {_name(job.path)} put back: an analysis goes first")
            queued = self.queued[uri] = admission.queue(job.path, place=turn.place)

    async def _compare(self, job: CompareJob, limits: Limits) -> ComparisonResult:
        self.server.log_line(f"torch.compile comparison of {_name(job.path)} started")
        result: ComparisonResult = await self.server.get_worker().run(job, limits)
        return result

    def _merge(self, uri: str, analysis: Analysis, result: ComparisonResult) -> None:
        """Cache, in `analysis`'s place, a new analysis that holds the comparison: what was published is
        never changed under a request that is answering from it."""
        server = self.server
        if server.scheduler.cache.get(uri) is not analysis:
            return  # a newer analysis replaced the one this comparison belongs to
        compared = with_comparison(analysis, result)
        server.scheduler.cache[uri] = compared
        doc = server.document(uri)
        if doc is not None and (doc.version or 0) == compared.version:
            if any(m.inductor is not None and m.inductor.unmatched for m in compared.report.models):
                server.publish(uri, compared)  # the fusions only torch.compile makes, as diagnostics
            server.refresh_views()


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
