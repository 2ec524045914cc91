"""The path of a document's analysis: what schedules one (open, save, a reload from disk, a change to
a file the document imports, new settings), the job that runs it in the worker, and what becomes of
its result: kept (`state.py`), published as diagnostics while it is of the document's version, kept
on disk for the next session (`last_analysis.py`), then compared with torch.compile (`inductor.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os

from fuselens.contracts.report import Report
from fuselens.worker.protocol import AnalyzeJob, Limits

from . import last_analysis
from .admission import Admission
from .background import Background
from .editor import Editor
from .features.diagnostics import diagnostics
from .features.text import same_file, uri_to_path
from .generation import Generation
from .inductor import InductorComparer
from .libraries import file_imports, library_modules
from .logs import EditorLog
from .protocol import remember
from .reloads import Reloads, disk_text
from .scheduler import Analysis, Scheduler
from .settings import Settings
from .state import ServerState
from .views import is_view
from .watch import Watcher, affects
from .worker_handle import WorkerHandle
from .workers import JobFailed

SEEN_CHANGES_KEPT = 4096  # how many changed files' times `file_changed` remembers


class Analyzer:
    def __init__(
        self,
        state: ServerState,
        worker: WorkerHandle,
        admission: Admission,
        generation: Generation,
        editor: Editor,
        log: EditorLog,
        background: Background,
    ) -> None:
        self._state = state
        self._worker = worker
        self._generation = generation
        self._editor = editor
        self._log = log
        self._background = background
        self.scheduler = Scheduler(self._run_job, self._on_result, state.configuration.settled, admission)
        self.inductor = InductorComparer(
            worker.run, worker.torch_version, admission, state.analyses, log.line, self._compared
        )
        self.reloads = Reloads()  # open documents whose files changed on disk, until the editor reloads them
        self.seen_changes: dict[str, float] = {}  # path -> its time when last changed (the latest SEEN_CHANGES_KEPT)
        self.watcher: Watcher | None = None

    # ---- what the editor says happened to a document -------------------------------------------
    def opened(self, uri: str, version: int) -> None:
        self.reloads.opened(uri, version)
        self.facing(uri)
        self.schedule(uri, opened=True)

    def changed(self, uri: str) -> None:
        """Typing analyzes nothing (a save does), but puts the document in front; a change that reloads
        the file from disk analyzes it."""
        doc = self._state.documents.get(uri)
        if doc is not None and self.reloads.changed(uri, doc.version or 0, doc.source):
            self._log.line(f"{os.path.basename(uri_to_path(uri) or uri)} reloaded from disk: re-analyzing it")
            self.schedule(uri)
        else:
            self.facing(uri)

    def saved(self, uri: str) -> None:
        self.facing(uri)
        doc, analysis = self._state.documents.get(uri), self._state.analyses.get(uri)
        version = (doc.version or 0) if doc is not None else 0
        if self.reloads.saved(uri, version, analysis.version if analysis else None):
            self.schedule(uri)

    def closed(self, uri: str) -> None:
        """Closed means cleared: nothing of the document is kept, and its diagnostics are withdrawn."""
        self.reloads.closed(uri)
        self.inductor.cancel(uri)
        self.scheduler.forget(uri)
        self._state.analyses.forget(uri)
        self._generation.forget(uri)
        self._editor.publish_diagnostics(uri, [], None)

    def settings_changed(self) -> None:
        for doc in self._state.documents.all():
            self.schedule(doc.uri)  # (the documents' keys are unquoted URIs, not the client's)

    def facing(self, uri: str) -> None:
        """The user opened, edited, saved or hovered `uri`: its background work goes first."""
        path = uri_to_path(uri)
        if path and self._state.documents.get(uri) is not None:
            self.scheduler.admission.set_front(path)

    # ---- files on disk -------------------------------------------------------------------------
    def watch(self, roots: list[str]) -> None:
        """Watch the workspace's files (from watchdog's thread, handed to the server's loop)."""
        loop = asyncio.get_running_loop()

        def changed(path: str) -> None:
            loop.call_soon_threadsafe(self.file_changed, path)

        self.watcher = Watcher(roots, changed)
        self.watcher.start()

    def stop_watching(self) -> None:
        if self.watcher:
            self.watcher.stop()

    def file_changed(self, path: str) -> None:
        """A file changed on disk: re-analyze the open documents that depend on it, and an open document
        of that file once the editor holds the text now on disk (`reloads.py`)."""
        try:
            stamp = os.stat(path).st_mtime
        except OSError:
            stamp = -1.0
        if self.seen_changes.get(path) == stamp:
            return  # watchdog and the client both told us
        remember(self.seen_changes, path, stamp, SEEN_CHANGES_KEPT)
        on_disk: list[str | None] = []  # the file's text, read once, when an open document is of it
        for doc in self._state.documents.all():
            doc_path = uri_to_path(doc.uri)
            if not doc_path:
                continue
            if same_file(doc_path, path):
                if not on_disk:
                    on_disk.append(disk_text(path))
                if self.reloads.file_changed(doc.uri, doc.version or 0, doc.source, on_disk[0]):
                    self._log.line(f"{os.path.basename(path)} changed on disk: re-analyzing it")
                    self.schedule(doc.uri)
            elif affects(path, doc_path, doc.source):
                self._log.line(f"{os.path.basename(path)} changed: re-analyzing {os.path.basename(doc_path)}")
                self.schedule(doc.uri)

    # ---- the analysis --------------------------------------------------------------------------
    def schedule(self, uri: str, opened: bool = False) -> None:
        """Analyze the document `uri` (`opened`: it was just opened, and its last analysis, kept from an
        earlier session, may be shown while it runs)."""
        doc = self._state.documents.get(uri)
        path = uri_to_path(uri)
        if doc is None or path is None or not path.endswith(".py") or is_view(path):
            return  # a kernel view is generated code the user reads, not a model
        folders = self._state.folders
        if folders.trust.not_a_model(path):
            return  # a library's source the user opened to read (from a diagnostic's link, say)
        if not folders.trusted(path):
            folders.untrusted(path)
            return
        self.inductor.cancel(uri)  # a new analysis supersedes the comparison of the old text
        self.scheduler.request(uri, path, doc.version or 0, doc.source)
        if opened:
            self._background.start(self._show_last_analysis(uri, path, doc.version or 0, doc.source))

    async def _show_last_analysis(self, uri: str, path: str, version: int, text: str) -> None:
        """Publish the kept analysis of this very text (`last_analysis.py`) unless the new one came first
        or the user typed since: it stands until the analysis that is running replaces it."""
        settings = await self._state.configuration.settled()
        report = last_analysis.load(path, text, settings.analysis_key(), self._log.line)
        doc = self._state.documents.get(uri)
        if report is None or uri in self._state.analyses or doc is None or (doc.version or 0) != version:
            return
        analysis = Analysis(version, text, report, settings, kept=True)
        self._state.analyses.keep(uri, analysis)
        self._log.line(f"showing the last analysis of {os.path.basename(path)} (the same text) while it runs again")
        self.publish(uri, analysis)
        self.refresh_views()

    async def _run_job(self, path: str, text: str, settings: Settings) -> Report:
        w = settings.worker
        job = AnalyzeJob(path, settings.analyze_options(text))
        try:
            # The host imports the file's installed libraries first: even a first job starts with them.
            limits = Limits(w.timeout_seconds, w.memory_mb)
            report: Report = await self._worker.run(job, limits, imports=file_imports(text))
        except JobFailed as exc:
            if exc.kind != "timeout":
                raise
            limit = f"{exc.error.message} (worker.timeoutSeconds is {w.timeout_seconds:g} s)"
            raise JobFailed(dataclasses.replace(exc.error, message=limit)) from None
        return report

    def _on_result(self, uri: str, analysis: Analysis) -> None:
        self._state.analyses.keep(uri, analysis)
        doc = self._state.documents.get(uri)
        if doc is None or (doc.version or 0) != analysis.version:
            return  # closed, or the user typed since: never show stale results
        path = uri_to_path(uri) or ""
        self._log.line(analysis.outcome(os.path.basename(path or uri)))  # (in the log when they show)
        self.publish(uri, analysis)
        self.refresh_views()
        if analysis.failure is None:
            last_analysis.store(path, analysis.text, analysis.settings.analysis_key(), analysis.report, self._log.line)
        self._worker.keep_loaded(library_modules(analysis.report))  # the next jobs start with its library imported
        if self._state.configuration.current.compare_inductor:
            self.inductor.start(uri, path, analysis)

    def _compared(self, uri: str, compared: Analysis) -> None:
        """The torch.compile comparison joined the document's analysis: shown while it is of the document."""
        doc = self._state.documents.get(uri)
        if doc is None or (doc.version or 0) != compared.version:
            return
        if any(m.inductor is not None and m.inductor.unmatched for m in compared.report.models):
            self.publish(uri, compared)  # the fusions only torch.compile makes, as diagnostics
        self.refresh_views()

    # ---- what the editor is sent ---------------------------------------------------------------
    def publish(self, uri: str, analysis: Analysis) -> None:
        path = uri_to_path(uri) or ""
        lines = analysis.text.splitlines()
        s = self._state.configuration.current
        diags = diagnostics(analysis.report, path, lines, s.severity, s.show, analysis.failure, s.pattern_severity)
        self._editor.publish_diagnostics(uri, diags, analysis.version)

    def refresh_views(self) -> None:
        """Ask the client to re-request lenses and inlay hints (they derive from the analyses)."""
        self._editor.refresh_views(self._state.client)
