"""The kernels' code of a document version, generated when something asks for it.

A save's analysis (`AnalyzeJob`) leaves out each kernel's source and each cluster's backward: the
diagnostics, hovers, inlay hints, lenses and the quick fixes' edits do not read them, and working
them out (the backward is captured and planned like a forward) took a third to a half of the
analysis.  What reads them asks here: the kernel module a quick fix writes, a kernel view.  A
`GenerateJob` analyzes the same text with the settings that analysis was made with (`Analysis.settings`,
whatever the settings are now) in the worker, in a foreground turn,
once per text and settings whatever asks first (a request made while it runs waits for it), and is
kept for the document.  The cached analysis is never changed: the server answers from that analysis
joined with the code (`joined`), a new analysis made once for each cached one, so that the hover's
training line and the next fix find the code there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fuselens.contracts.plain import to_plain
from fuselens.contracts.report import BACKWARD_FIELDS, Cluster, Edit, LibraryPatch, Report
from fuselens.contracts.training import MeasuredTraining
from fuselens.worker.protocol import GenerateJob, Job, Limits

from . import history
from .admission import Admission
from .scheduler import Analysis

RunJob = Callable[[Job, Limits], Awaitable[Any]]  # a job's result from the worker


class NotTheSameAnalysis(Exception):
    """The analysis with code found other clusters than the cached one (a file the model imports
    changed since): its code is not that of the clusters the editor shows."""


def has_code(report: Report) -> bool:
    """Whether every kernel of `report` has its source (a report without kernels has all it needs)."""
    return all(c.kernel.has_code for _, c in report.clusters() if c.kernel is not None)


class Generation:
    def __init__(self, run: RunJob, admission: Admission, log: Callable[[str], None]) -> None:
        self._run = run
        self._admission = admission
        self._log = log
        self.running: dict[str, tuple[str, asyncio.Future[Report]]] = {}  # uri -> (its key, the job)
        self.generated: dict[str, tuple[str, Report]] = {}  # uri -> (its key, the analysis with code)
        self._joined: dict[str, tuple[Analysis, Analysis]] = {}  # uri -> (a cached analysis, it joined)

    def joined(self, uri: str, analysis: Analysis) -> Analysis:
        """`analysis` with the code generated for its text and settings, when there is that code and it
        is of the same clusters; else `analysis` itself."""
        if has_code(analysis.report):
            return analysis
        made = self._joined.get(uri)
        if made is not None and made[0] is analysis:
            return made[1]
        generated = self.generated.get(uri)
        if generated is None or generated[0] != self._key(analysis):
            return analysis
        try:
            joined = dataclasses.replace(analysis, report=with_code(analysis.report, generated[1]))
        except NotTheSameAnalysis:
            return analysis
        self._joined[uri] = (analysis, joined)
        return joined

    async def with_code(self, uri: str, path: str, analysis: Analysis) -> Report:
        """`analysis.report` with every kernel's source and every cluster's backward: at once when it
        has them, else once they are generated.  JobFailed when the job fails, NotTheSameAnalysis when
        it found other clusters."""
        if has_code(self.joined(uri, analysis).report):
            return self.joined(uri, analysis).report
        key = self._key(analysis)
        running = self.running.get(uri)
        if running is None or running[0] != key:
            job = asyncio.ensure_future(self._generate(path, analysis))
            self.running[uri] = running = (key, job)
            job.add_done_callback(lambda done: self._done(uri, key, done))
        generated = await asyncio.shield(running[1])  # (a request cancelled leaves it to the others)
        return with_code(analysis.report, generated)

    def forget(self, uri: str) -> None:
        """The document was closed: nothing of it is kept (a job that runs finishes for whoever waits)."""
        self.running.pop(uri, None)
        self.generated.pop(uri, None)
        self._joined.pop(uri, None)

    def _key(self, analysis: Analysis) -> str:
        """The text, the settings, and what the file's validations measured of its clusters' training
        (a validation since the code was generated may change which clusters train with kernels)."""
        settings = analysis.settings.analysis_key()
        measured = to_plain(self._measured(analysis.report.file))
        return hashlib.sha256(f"{analysis.text}\0{settings}\0{measured}".encode()).hexdigest()

    def _measured(self, path: str) -> list[MeasuredTraining]:
        return history.measured(path, self._log) if path else []

    def _done(self, uri: str, key: str, job: asyncio.Future[Report]) -> None:
        if self.running.get(uri, ("", None))[1] is not job:
            return  # the document was closed, or a newer text's job replaced this one
        del self.running[uri]
        if not job.cancelled() and job.exception() is None:  # (each request that waited was told why)
            self.generated[uri] = (key, job.result())

    async def _generate(self, path: str, analysis: Analysis) -> Report:
        w = analysis.settings.worker
        options = dataclasses.replace(analysis.settings.analyze_options(analysis.text), training=self._measured(path))
        job = GenerateJob(path, options)
        started = time.perf_counter()
        async with self._admission.turn():
            report: Report = await self._run(job, Limits(w.timeout_seconds, w.memory_mb))
        took = (time.perf_counter() - started) * 1000
        self._log(f"generated the kernels of {os.path.basename(path)} v{analysis.version} in {took:.0f} ms")
        return report


def with_code(report: Report, generated: Report) -> Report:
    """`report` with each kernel's source and each cluster's backward of `generated`, the analysis of the
    same text with code, as a new report (`report` is unchanged)."""
    if generated.source_sha256 != report.source_sha256 or _clusters(generated) != _clusters(report):
        raise NotTheSameAnalysis(
            "the kernels were generated from another analysis of the file than the one shown (a file it "
            "imports changed since): save it to analyze it again"
        )
    theirs = {c.id: c for _, c in generated.clusters()}

    def coded(cluster: Cluster) -> Cluster:
        source = theirs[cluster.id]
        backward = {name: getattr(source, name) for name in BACKWARD_FIELDS}
        return dataclasses.replace(cluster, kernel=source.kernel, **backward)

    models = [dataclasses.replace(m, clusters=[coded(c) for c in m.clusters]) for m in report.models]
    return dataclasses.replace(report, models=models)


def _clusters(report: Report) -> list[tuple[str, str, list[int], str | None, Edit | None, LibraryPatch | None, str]]:
    """What the editor shows and applies of each cluster: ids, lines, kernel names and edits."""
    return [(m.name, c.id, c.lines, _kernel_name(c), c.edit, c.patch, c.applies) for m, c in report.clusters()]


def _kernel_name(cluster: Cluster) -> str | None:
    return cluster.kernel.name if cluster.kernel is not None else None
