"""The kernels' code of a document version, generated when something asks for it.

A save's analysis (`AnalyzeJob`) leaves out each kernel's source and each cluster's backward: the
diagnostics, hovers, inlay hints, lenses and the quick fixes' edits do not read them, and working
them out (the backward is captured and planned like a forward) took a third to a half of the
analysis.  What reads them asks here: the kernel module a quick fix writes, a kernel view.  A
`GenerateJob` analyzes the same text with the settings of now in the worker, in a foreground turn,
and its code is merged into the cached analysis of that version, where the next request (a second
fix, the hover's training line) finds it.  One job per text and settings at a time: a request made
while it runs waits for it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from typing import TYPE_CHECKING

from fuselens.contracts.report import BACKWARD_FIELDS, Cluster, Edit, LibraryPatch, Report
from fuselens.worker.protocol import GenerateJob, Limits

from . import last_analysis
from .scheduler import Analysis

if TYPE_CHECKING:
    from .app import FuselensServer


class NotTheSameAnalysis(Exception):
    """The analysis with code found other clusters than the cached one (the settings or a file the
    model imports changed since): its code is not that of the clusters the editor shows."""


def has_code(report: Report) -> bool:
    """Whether every kernel of `report` has its source (a report without kernels has all it needs)."""
    return all(c.kernel.has_code for _, c in report.clusters() if c.kernel is not None)


class Generation:
    def __init__(self, server: FuselensServer) -> None:
        self.server = server
        self.running: dict[str, tuple[str, asyncio.Future[Report]]] = {}  # uri -> (its key, the job)
        self.completed = 0

    async def with_code(self, uri: str, path: str, analysis: Analysis) -> Report:
        """`analysis.report`, every kernel with its source and every cluster with its backward: at once
        when it has them, else once they are generated.  JobFailed when the job fails, and
        NotTheSameAnalysis when it found other clusters."""
        if has_code(analysis.report):
            return analysis.report
        key = self._key(path, analysis.text)
        running = self.running.get(uri)
        if running is None or running[0] != key:
            job = asyncio.ensure_future(self._generate(path, analysis))
            self.running[uri] = (key, job)
            job.add_done_callback(lambda done: self._forget(uri, done))
            running = (key, job)
        generated = await asyncio.shield(running[1])  # (a request cancelled leaves it to the others)
        if not has_code(analysis.report):
            take_code(analysis.report, generated)
        return analysis.report

    def _key(self, path: str, text: str) -> str:
        settings = last_analysis.settings_key(self.server.settings.analyze_options())
        return hashlib.sha256(f"{path}\0{text}\0{settings}".encode()).hexdigest()

    def _forget(self, uri: str, job: asyncio.Future[Report]) -> None:
        if self.running.get(uri, ("", None))[1] is job:
            del self.running[uri]
        if not job.cancelled():
            job.exception()  # (seen: each request that waited has it raised; one cancelled meanwhile does not)

    async def _generate(self, path: str, analysis: Analysis) -> Report:
        server = self.server
        w = server.settings.worker
        job = GenerateJob(path, server.settings.analyze_options(analysis.text))
        started = time.perf_counter()
        async with server.scheduler.admission.turn():
            report: Report = await server.get_worker().run(job, Limits(w.timeout_seconds, w.memory_mb))
        self.completed += 1
        took = (time.perf_counter() - started) * 1000
        server.log_line(f"generated the kernels of {os.path.basename(path)} v{analysis.version} in {took:.0f} ms")
        return report


def take_code(report: Report, generated: Report) -> None:
    """Each kernel's source and each cluster's backward from `generated`, the analysis of the same text
    with code, into `report`."""
    if generated.source_sha256 != report.source_sha256 or _clusters(generated) != _clusters(report):
        raise NotTheSameAnalysis(
            "the kernels were generated from another analysis of the file than the one shown (a setting or "
            "a file it imports changed since): save it to analyze it again"
        )
    theirs = {c.id: c for _, c in generated.clusters()}
    for _, cluster in report.clusters():
        source = theirs[cluster.id]
        cluster.kernel = source.kernel
        for name in BACKWARD_FIELDS:
            setattr(cluster, name, getattr(source, name))


def _clusters(report: Report) -> list[tuple[str, str, list[int], str | None, Edit | None, LibraryPatch | None, str]]:
    """What the editor shows and applies of each cluster: ids, lines, kernel names and edits."""
    return [(m.name, c.id, c.lines, _kernel_name(c), c.edit, c.patch, c.applies) for m, c in report.clusters()]


def _kernel_name(cluster: Cluster) -> str | None:
    return cluster.kernel.name if cluster.kernel is not None else None
