"""Per-document scheduling of analysis jobs, and what one finished job said (`Analysis`).

A document has at most one job in flight and one pending request.  A new request
replaces the pending one (newest wins) and cancels the job in flight, which the worker
kills: a burst of saves costs one finished analysis, of the last version.  Each job reads the
settings once, as its turn comes, and its analysis keeps them.  Results are handed to `on_result`
with the version they were computed from (while the job still holds its turn); the server keeps
them (`state.py`) and publishes only those that still match the document.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from fuselens.contracts.report import Report
from fuselens.worker.protocol import Failure

from .admission import Admission
from .settings import Settings
from .workers import JobFailed


@dataclass(frozen=True)
class Analysis:
    """What one finished job said about one version of a document.  Never changed once made: what
    joins it later (the kernels' code, the torch.compile comparison) makes a new one."""

    version: int
    text: str
    report: Report  # empty when the job failed
    settings: Settings = field(default_factory=Settings)  # what it was analyzed with; its code is made with them
    failure: Failure | None = None  # why there is no real report
    elapsed_ms: float = 0.0
    inductor_sources: dict[str, str] | None = None  # Inductor kernel id -> its Triton source
    kept: bool = False  # the analysis of the same text kept from an earlier session, shown until the new one

    def outcome(self, name: str) -> str:
        """What became of the job, for the log: analyzed, failed (how, where) or timed out; `name` is
        the document's."""
        what, took = f"{name} v{self.version}", f"{self.elapsed_ms:.0f} ms"
        stopped = self._stopped()
        if stopped is None:
            text = f"analyzed {what} in {took}"
            broken = [m for m in self.report.models if m.status == "error"]
            if broken:
                text += "; " + ", ".join(
                    f"{m.name} failed ({m.problem.kind if m.problem else 'error'})" for m in broken
                )
            return text
        kind, line, message = stopped
        if kind == "timeout":
            return f"timed out: {what}{f' at line {line}' if line else ''} after {took}: {message}"
        return f"failed: {what} ({kind}{f', line {line}' if line else ''}) after {took}: {message}"

    def _stopped(self) -> tuple[str, int | None, str] | None:
        """(kind, line, first line of the message) of what stopped the analysis of the whole file: the
        job's failure, a problem of the file, or the failure of its only models; None if a model was
        analyzed."""
        if self.failure is not None:
            return self.failure.kind, self.failure.line, _first_line(self.failure.message)
        problems = [*self.report.problems]
        models = self.report.models
        if not problems and models and all(m.status == "error" for m in models):
            problems = [m.problem for m in models if m.problem is not None]
        if not problems:
            return None
        return problems[0].kind, problems[0].line, _first_line(problems[0].message)


def _first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0][:300]


@dataclass
class _Slot:
    pending: tuple[int, str, str] | None = None  # (version, text, path)
    loop: asyncio.Task | None = None
    job: asyncio.Task | None = None
    running_version: int | None = None


RunJob = Callable[[str, str, Settings], Awaitable[Report]]  # (path, text, settings) -> its report

OnResult = Callable[[str, Analysis], None]

ReadSettings = Callable[[], Awaitable[Settings]]  # the settings a job runs with, once they are read


@dataclass
class Scheduler:
    run_job: RunJob
    on_result: OnResult
    settings: ReadSettings
    admission: Admission  # every job of the server takes its turn here
    _slots: dict[str, _Slot] = field(default_factory=dict)
    completed: int = 0
    cancelled: int = 0

    def request(self, uri: str, path: str, version: int, text: str) -> None:
        slot = self._slots.setdefault(uri, _Slot())
        slot.pending = (version, text, path)
        if slot.job is not None and not slot.job.done():
            slot.job.cancel()  # superseded: the newest request wins
        if slot.loop is None or slot.loop.done():
            slot.loop = asyncio.create_task(self._run(uri, slot))

    def forget(self, uri: str) -> None:
        slot = self._slots.pop(uri, None)
        if slot is not None:
            slot.pending = None
            for task in (slot.job, slot.loop):
                if task is not None and not task.done():
                    task.cancel()

    async def _run(self, uri: str, slot: _Slot) -> None:
        while slot.pending is not None:
            version, text, path = slot.pending
            slot.pending = None
            slot.running_version = version
            slot.job = asyncio.create_task(self._analyze(uri, slot, path, text, version))
            try:
                await slot.job
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if self._slots.get(uri) is not slot or (current is not None and current.cancelling()):
                    raise  # the document was closed, or this loop itself is cancelled (the server exits)
                self.cancelled += 1  # the job was superseded by a newer request: run that one
            finally:
                slot.running_version = None

    async def _analyze(self, uri: str, slot: _Slot, path: str, text: str, version: int) -> None:
        """One job in its turn; its result is handed on before the turn is given back, so that what the
        result starts (the document's comparison) is queued before another document's background job
        can take the turn."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with self.admission.turn():
            settings = await self.settings()
            try:
                report, failure = await self.run_job(path, text, settings), None
            except JobFailed as exc:
                if exc.kind == "cancelled":
                    self.cancelled += 1
                    return
                report, failure = Report(file=path, source_sha256=""), exc.error
            elapsed_ms = round((loop.time() - started) * 1000, 1)
            if slot.pending is not None:
                return  # a newer request arrived while this one finished: don't show this one
            self.completed += 1
            self.on_result(uri, Analysis(version, text, report, settings, failure, elapsed_ms))
