"""`fuselens serve`: the language server.

It never imports torch.  Open and save schedule an analysis of that document in the
worker host (`workers.py`, `scheduler.py`); the report that comes back is cached per
document version, and every feature is answered from that cache (`features/`).
Nothing runs until the user has trusted the workspace (`trust.py`).

The byte stream is read by `framing.py` (bounded frames, resynchronised after a bad one) and
fed to pygls' protocol (`protocol.py`), which keeps to the LSP lifecycle: `initialize` once, every
request answered, InvalidRequest after `shutdown`; the exit code `exit` asks for is this module's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import unquote

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcInvalidParams
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer

from fuselens.codegen import edits as edits_mod
from fuselens.codegen import files
from fuselens.codegen import rewrites as rewrites_mod
from fuselens.contracts.config import ConfigError, read_tool_table
from fuselens.contracts.profile import Profile
from fuselens.contracts.report import Report
from fuselens.contracts.version import TOOL_VERSION
from fuselens.worker.confine import keep_descriptors_private
from fuselens.worker.protocol import AnalyzeJob, Limits

from . import framing, last_analysis
from . import settings as settings_mod
from .commands import register_commands, with_code
from .features import actions as actions_mod
from .features.diagnostics import diagnostics
from .features.hover import hover
from .features.inlay import inlay_hints
from .features.lenses import code_lenses
from .features.text import same_file, uri_to_path
from .generation import Generation
from .inductor import InductorComparer
from .libraries import library_modules
from .protocol import FuselensProtocol, remember
from .reloads import Reloads, disk_text
from .runner import RemoteRunners, template_problem
from .scheduler import Analysis, Scheduler
from .trust import Trust, client_trust
from .views import is_view
from .watch import Watcher, affects
from .workers import JobFailed, WorkerClient

log = logging.getLogger("fuselens.server")

SETTINGS_WAIT = 10.0  # seconds a job waits for the settings `initialized` fetches (5 s of them for the client's)
EXIT_GRACE = 2.0  # seconds the tasks still running at exit have to clean up
SEEN_CHANGES_KEPT = 4096  # how many changed files' times `file_changed` remembers
WARNINGS_KEPT = 256  # how many settings warnings the server remembers having given (each is given once)


class FuselensServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__(
            "fuselens",
            TOOL_VERSION,
            text_document_sync_kind=lsp.TextDocumentSyncKind.Incremental,
            protocol_cls=FuselensProtocol,
        )
        self.settings = settings_mod.Settings()
        self.init_options: dict[str, Any] = {}
        self.roots: list[str] = []
        self.trust = Trust(None, [])
        self.worker: WorkerClient | None = None
        self.scheduler = Scheduler(self._run_analysis, self._on_result)
        self.watcher: Watcher | None = None
        self.untrusted_told = False
        self.editor = ""  # the client's name, from `initialize`: messages speak its words
        self.warned_settings: dict[str, None] = {}  # (the latest WARNINGS_KEPT)
        self.seen_changes: dict[str, float] = {}  # path -> its time when last changed (the latest SEEN_CHANGES_KEPT)
        self.reloads = Reloads()  # open documents whose files changed on disk, until the editor reloads them
        self.stats = {"published": 0, "dropped_stale": 0}
        self.inductor = InductorComparer(self)
        self.generation = Generation(self)  # the kernels' code, when something asks for it
        self.background: set[asyncio.Future[Any]] = set()
        self.remote = RemoteRunners()
        self.configured = asyncio.Event()  # set once `initialized` has read the settings
        self.no_gpu_choice: str | None = None  # what the user chose, once, for validations without a GPU
        # The last profile of each file, with the digest of the text it measured: shown while it lines up.
        self.profiles: dict[str, tuple[str, Profile]] = {}
        self.protocol: FuselensProtocol

    def command(self, command_name: str) -> Callable[[Any], Any]:
        """pygls' command decorator, except that `$/cancelRequest` cancels the command's task (pygls
        cancels only the request's future, and the command, a remote runner say, would run on)."""
        register = super().command(command_name)

        def decorator(handler: Callable[..., Coroutine[Any, Any, Any]]):
            @functools.wraps(handler)
            async def cancellable(ls: FuselensServer, *args: Any) -> Any:
                msg_id, task = ls.protocol.msg_id, asyncio.current_task()
                if msg_id is not None and task is not None:
                    ls.protocol.commands_running[msg_id] = task
                try:
                    return await handler(ls, *args)
                finally:
                    ls.protocol.commands_running.pop(msg_id, None)

            register(cancellable)
            return handler

        return decorator

    def serve_stdio(self) -> int:
        """Serve on stdin and stdout until `exit` or the end of input; the exit code the LSP spec asks
        for: 0 after `shutdown`, 1 for an `exit` without it (or a termination signal).

        (pygls' `start_io` reads frames of any claimed size, loses the stream for good after a length
        it cannot parse, and drops `exit`'s code; its protocol is fed from `framing.py` instead.)
        """
        # Not dumpable: the model's code, which runs as the same user, cannot reopen this process's
        # standard output through /proc and speak to the editor in its name (worker/confine.py).
        if not keep_descriptors_private():
            log.warning("cannot keep the server's descriptors from other processes (no PR_SET_DUMPABLE)")
        self.protocol.set_writer(StdoutWriter(sys.stdout.buffer))
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        code = 0
        try:
            if loop.run_until_complete(self._serve(sys.stdin.fileno())):
                code = 1
        except SystemExit as exc:  # `exit`
            code = exc.code if isinstance(exc.code, int) else 1
        except BrokenPipeError:
            log.error("the client closed its end of the connection")
        finally:
            self.remote.kill_all()
            _end_tasks(loop)
            loop.close()
            asyncio.set_event_loop(None)
            self.shutdown()
        return code

    async def _serve(self, fd: int) -> bool:
        """Read messages until the end of input; True if a signal ended the server instead."""
        loop = asyncio.get_running_loop()
        reading = asyncio.current_task()
        assert reading is not None
        signalled = False

        def terminate() -> None:
            nonlocal signalled
            signalled = True
            reading.cancel()

        for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread
                loop.add_signal_handler(number, terminate)
        try:
            await framing.read_messages(fd, self.protocol.receive, self.protocol.complain)
        except asyncio.CancelledError:
            if not signalled:
                raise
        return signalled

    # ---- state -----------------------------------------------------------------------------
    def get_worker(self) -> WorkerClient:
        python = self.settings.worker.python
        if self.worker is None or self.worker.python != (python or sys.executable):
            old = self.worker
            self.worker = WorkerClient(python, log=self.log_line)
            if old is not None:
                self.in_background(old.stop())
        return self.worker

    def in_background(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run `work` without waiting for it; the server holds the task until it ends (the loop keeps
        only weak references to tasks, and a task nobody holds can vanish mid-way)."""
        task = asyncio.ensure_future(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def log_line(self, text: str) -> None:
        log.info(text)
        with contextlib.suppress(Exception):  # logging must never break the server
            self.window_log_message(lsp.LogMessageParams(lsp.MessageType.Log, text))

    def tell(self, text: str, kind: lsp.MessageType = lsp.MessageType.Info) -> None:
        self.window_show_message(lsp.ShowMessageParams(kind, text))

    def trusted(self, path: str) -> bool:
        return self.trust.trusted(path)

    def workspace_root(self, path: str) -> str | None:
        """The workspace folder that holds `path` (with none open, the file's own folder); None
        outside them all.  Files are generated only inside the workspace."""
        if not self.roots:
            return os.path.dirname(path)
        real = os.path.realpath(path)
        return next((r for r in self.roots if real.startswith(os.path.realpath(r) + os.sep)), None)

    def document(self, uri: str):
        """The open document at `uri`, or None (pygls' get_text_document would read any file from disk)."""
        return self.workspace.text_documents.get(unquote(uri))

    # ---- settings -----------------------------------------------------------------------------
    async def reload_settings(self) -> None:
        merged = settings_mod.Settings()
        problems: list[str] = []
        for root in self.roots:
            pyproject = os.path.join(root, "pyproject.toml")
            if os.path.exists(pyproject):  # (a FIFO or a folder of that name too: the warning says so)
                try:
                    table = read_tool_table(pyproject)
                except ConfigError as exc:
                    problems.append(str(exc))
                    table = {}
                merged, found = settings_mod.merge(merged, settings_mod.from_pyproject(table), "pyproject.toml")
                problems += found
        merged, found = settings_mod.merge(
            merged, self.init_options.get("settings", self.init_options), "initializationOptions"
        )
        problems += [p for p in found if "unknown setting 'settings'" not in p]
        caps = self.client_capabilities.workspace
        if caps is not None and caps.configuration:
            try:
                async with asyncio.timeout(5):
                    (config,) = await self.workspace_configuration_async(
                        lsp.ConfigurationParams([lsp.ConfigurationItem(section="fuselens")])
                    )
            except Exception:  # a client that cannot answer keeps the other sources
                config = None
            merged, found = settings_mod.merge(merged, config, "settings")
            problems += found
        if merged.remote_runner is not None and (problem := template_problem(merged.remote_runner)):
            problems.append(problem)
            merged.remote_runner = None
        self.settings = merged
        for problem in problems:
            if problem not in self.warned_settings:
                remember(self.warned_settings, problem, None, WARNINGS_KEPT)
                self.tell(f"fuselens: {problem} (ignored; the default is used)", lsp.MessageType.Warning)

    def untrusted(self, path: str) -> str:
        """Why nothing runs for `path`, in the editor's words. The user is told once per server, by
        window/showMessage, whatever asked first (an open, a save, a command): every later open or
        command in the folder has the same answer, and a second notification would only stack on
        the first. Commands return the text as well, for a client that answers them itself."""
        if self.trust.not_a_model(path):  # asked by a command: the answer says why, and nothing else is told
            return self.trust.not_analyzed(path)
        explanation = Trust.explanation(path, self.editor)
        if not self.untrusted_told:
            self.untrusted_told = True
            self.tell(explanation, lsp.MessageType.Warning)
        return explanation

    # ---- analysis -----------------------------------------------------------------------------
    def facing(self, uri: str) -> None:
        """The user opened, edited, saved or hovered `uri`: its background work goes first."""
        path = uri_to_path(uri)
        if path and self.document(uri) is not None:
            self.scheduler.admission.set_front(path)

    def schedule(self, uri: str, opened: bool = False) -> None:
        """Analyze the document `uri` (`opened`: it was just opened, and its last analysis, kept from an
        earlier session, may be shown while it runs)."""
        doc = self.document(uri)
        path = uri_to_path(uri)
        if doc is None or path is None or not path.endswith(".py") or is_view(path):
            return  # a kernel view is generated code the user reads, not a model
        if self.trust.not_a_model(path):
            return  # a library's source the user opened to read (from a diagnostic's link, say)
        if not self.trusted(path):
            self.untrusted(path)
            return
        self.inductor.cancel(uri)  # a new analysis supersedes the comparison of the old text
        self.scheduler.request(uri, path, doc.version or 0, doc.source)
        if opened:
            self.in_background(self.show_last_analysis(uri, path, doc.version or 0, doc.source))

    async def show_last_analysis(self, uri: str, path: str, version: int, text: str) -> None:
        """Publish the kept analysis of this very text (`last_analysis.py`) unless the new one came first
        or the user typed since: it stands until the analysis that is running replaces it."""
        await self.settings_read()
        report = last_analysis.load(path, text, self.settings.analysis_key(), self.log_line)
        doc = self.document(uri)
        if report is None or uri in self.scheduler.cache or doc is None or (doc.version or 0) != version:
            return
        analysis = Analysis(version, text, report, kept=True)
        self.scheduler.cache[uri] = analysis
        self.log_line(f"showing the last analysis of {os.path.basename(path)} (the same text) while it runs again")
        self.publish(uri, analysis)
        self.refresh_views()

    async def settings_read(self) -> None:
        """Wait until the settings `initialized` reads are in (bounded: a client that never sends
        `initialized` gets the defaults), so that no job runs with defaults the user has overridden."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SETTINGS_WAIT):
                await self.configured.wait()

    async def _run_analysis(self, path: str, text: str, version: int) -> Report:
        await self.settings_read()
        w = self.settings.worker
        job = AnalyzeJob(path, self.settings.analyze_options(text))
        try:
            return await self.get_worker().run(job, Limits(w.timeout_seconds, w.memory_mb))
        except JobFailed as exc:
            if exc.kind != "timeout":
                raise
            limit = f"{exc.error.message} (worker.timeoutSeconds is {w.timeout_seconds:g} s)"
            raise JobFailed(dataclasses.replace(exc.error, message=limit)) from None

    def _on_result(self, uri: str, analysis: Analysis) -> None:
        doc = self.document(uri)
        if doc is None:
            return
        if (doc.version or 0) != analysis.version:
            self.stats["dropped_stale"] += 1  # the user typed since: never show stale results
            return
        path = uri_to_path(uri) or ""
        self.log_line(analysis.outcome(os.path.basename(path or uri)))  # (in the log when they show)
        self.publish(uri, analysis)
        self.refresh_views()
        if analysis.failure is None:
            key = self.settings.analysis_key()
            last_analysis.store(path, analysis.text, key, analysis.report, self.log_line)
        if self.worker is not None:  # the next jobs of this model start with its library imported
            self.worker.keep_loaded(library_modules(analysis.report))
        if self.settings.compare_inductor:
            self.inductor.start(uri, uri_to_path(uri) or "", analysis)

    def refresh_views(self) -> None:
        """Ask the client to re-request lenses and inlay hints (they derive from the cache)."""
        for refresh, supported in (
            (self.workspace_code_lens_refresh_async, self._client_refreshes("code_lens")),
            (self.workspace_inlay_hint_refresh_async, self._client_refreshes("inlay_hint")),
        ):
            if supported:
                self.in_background(_quietly(refresh(None)))

    def _client_refreshes(self, feature: str) -> bool:
        ws = self.client_capabilities.workspace
        support = getattr(ws, feature, None) if ws else None
        return bool(support and getattr(support, "refresh_support", False))

    def publish(self, uri: str, analysis: Analysis) -> None:
        path = uri_to_path(uri) or ""
        lines = analysis.text.splitlines()
        s = self.settings
        diags = diagnostics(analysis.report, path, lines, s.severity, s.show, analysis.failure, s.pattern_severity)
        self.stats["published"] += 1
        self.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri, diags, analysis.version))

    def current(self, uri: str) -> Analysis | None:
        """The cached analysis, if it is of the document's current version; with its kernels' code where
        that was generated (`generation.py`)."""
        analysis = self.scheduler.cache.get(uri)
        doc = self.document(uri)
        if analysis is None or analysis.failure is not None or doc is None or (doc.version or 0) != analysis.version:
            return None  # typed since: its lines no longer line up with the document's
        return self.generation.joined(uri, analysis)

    def profile_for(self, path: str, analysis: Analysis) -> Profile | None:
        """The last profile of `path`, when it measured the text `analysis` is of."""
        kept = self.profiles.get(path)
        return kept[1] if kept is not None and kept[0] == analysis.report.source_sha256 else None

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
        for doc in list(self.workspace.text_documents.values()):
            doc_path = uri_to_path(doc.uri)
            if not doc_path:
                continue
            if same_file(doc_path, path):
                if not on_disk:
                    on_disk.append(disk_text(path))
                if self.reloads.file_changed(doc.uri, doc.version or 0, doc.source, on_disk[0]):
                    self.log_line(f"{os.path.basename(path)} changed on disk: re-analyzing it")
                    self.schedule(doc.uri)
            elif affects(path, doc_path, doc.source):
                self.log_line(f"{os.path.basename(path)} changed: re-analyzing {os.path.basename(doc_path)}")
                self.schedule(doc.uri)


server = FuselensServer()


@server.feature(lsp.INITIALIZE)
def on_initialize(ls: FuselensServer, params: lsp.InitializeParams) -> None:
    ls.init_options = params.initialization_options if isinstance(params.initialization_options, dict) else {}
    roots = [uri_to_path(f.uri) for f in (params.workspace_folders or [])]
    if not roots and params.root_uri:
        roots = [uri_to_path(params.root_uri)]
    ls.roots = [r for r in roots if r]
    ls.trust = Trust(client_trust(ls.init_options), ls.roots)
    ls.editor = params.client_info.name if params.client_info else ""


@server.feature(lsp.INITIALIZED)
async def on_initialized(ls: FuselensServer, params: lsp.InitializedParams) -> None:
    try:
        await ls.reload_settings()
    finally:
        ls.configured.set()
    caps = ls.client_capabilities.workspace
    watched = caps.did_change_watched_files if caps else None
    if watched and watched.dynamic_registration:
        try:
            async with asyncio.timeout(5):
                await ls.client_register_capability_async(
                    lsp.RegistrationParams(
                        [
                            lsp.Registration(
                                id="fuselens-watch",
                                method=lsp.WORKSPACE_DID_CHANGE_WATCHED_FILES,
                                register_options=lsp.DidChangeWatchedFilesRegistrationOptions(
                                    watchers=[
                                        lsp.FileSystemWatcher(glob_pattern="**/*.py"),
                                        lsp.FileSystemWatcher(glob_pattern="**/pyproject.toml"),
                                    ]
                                ),
                            )
                        ]
                    )
                )
        except Exception as exc:  # watchdog still watches
            ls.log_line(f"the client did not register file watching ({exc}); using watchdog only")
    if any(ls.trusted(os.path.join(r, "x.py")) for r in ls.roots):
        loop = asyncio.get_running_loop()
        ls.watcher = Watcher(ls.roots, lambda p: _call_soon(loop, ls.file_changed, p))
        ls.watcher.start()
        ls.in_background(_warm(ls))


def _end_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what still runs and give it EXIT_GRACE seconds to clean up (a remote runner's group is
    killed, a worker job cancelled), twice, for what the first cancellations started; unlike
    asyncio.run, never wait longer: the server is exiting, and a task that does not end is left."""
    loop.set_exception_handler(_quiet_about_cancelling)
    for _ in range(2):
        tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
        if not tasks:
            break
        for task in tasks:
            task.cancel()
        loop.run_until_complete(asyncio.wait(tasks, timeout=EXIT_GRACE))
    loop.run_until_complete(loop.shutdown_asyncgens())


def _quiet_about_cancelling(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """At exit, a callback that finds its task cancelled (pygls' continuation of a request whose
    handler was cancelled) is expected, not an error to log with a traceback."""
    if not isinstance(context.get("exception"), asyncio.CancelledError):
        loop.default_exception_handler(context)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[str], None], path: str) -> None:
    """Run `callback(path)` on the server's loop (the watcher calls from its own thread)."""
    loop.call_soon_threadsafe(callback, path)


async def _quietly(request) -> None:
    """Await a request whose failure does not matter (a client that cannot refresh lenses)."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(10):
            await request


async def _warm(ls: FuselensServer) -> None:
    try:
        await ls.get_worker().ensure_started()
    except Exception as exc:  # reported on first use
        ls.log_line(f"worker did not start: {exc}")


@server.feature(lsp.SHUTDOWN)
async def on_shutdown(ls: FuselensServer, params: None) -> None:
    ls.remote.kill_all()
    if ls.watcher:
        ls.watcher.stop()
    if ls.worker:
        await ls.worker.stop()


@server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: FuselensServer, params: lsp.DidOpenTextDocumentParams) -> None:
    ls.reloads.opened(params.text_document.uri, params.text_document.version)
    ls.facing(params.text_document.uri)
    ls.schedule(params.text_document.uri, opened=True)


@server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: FuselensServer, params: lsp.DidChangeTextDocumentParams) -> None:
    """Typing analyzes nothing (a save does), but puts the document in front; a change that reloads
    the file from disk analyzes it."""
    uri = params.text_document.uri
    doc = ls.document(uri)
    if doc is not None and ls.reloads.changed(uri, doc.version or 0, doc.source):
        ls.log_line(f"{os.path.basename(uri_to_path(uri) or uri)} reloaded from disk: re-analyzing it")
        ls.schedule(uri)
    else:
        ls.facing(uri)


@server.feature(lsp.TEXT_DOCUMENT_DID_SAVE, lsp.SaveOptions(include_text=False))
def did_save(ls: FuselensServer, params: lsp.DidSaveTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.facing(uri)
    doc, analysis = ls.document(uri), ls.scheduler.cache.get(uri)
    version = (doc.version or 0) if doc is not None else 0
    if ls.reloads.saved(uri, version, analysis.version if analysis else None):
        ls.schedule(uri)


@server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: FuselensServer, params: lsp.DidCloseTextDocumentParams) -> None:
    ls.reloads.closed(params.text_document.uri)
    ls.inductor.cancel(params.text_document.uri)
    ls.scheduler.forget(params.text_document.uri)
    ls.generation.forget(params.text_document.uri)
    ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(params.text_document.uri, []))


@server.feature(lsp.WORKSPACE_DID_CHANGE_CONFIGURATION)
async def did_change_configuration(ls: FuselensServer, params: lsp.DidChangeConfigurationParams) -> None:
    if isinstance(params.settings, dict) and isinstance(params.settings.get("fuselens"), dict):
        ls.init_options = {**ls.init_options, "settings": params.settings["fuselens"]}
    await ls.reload_settings()
    for doc in list(ls.workspace.text_documents.values()):
        ls.schedule(doc.uri)  # (the dict's keys are unquoted URIs, not the client's)


@server.feature(lsp.WORKSPACE_DID_CHANGE_WATCHED_FILES)
def did_change_watched_files(ls: FuselensServer, params: lsp.DidChangeWatchedFilesParams) -> None:
    for change in params.changes:
        path = uri_to_path(change.uri)
        if path:
            ls.file_changed(path)


@server.feature(lsp.TEXT_DOCUMENT_HOVER)
def on_hover(ls: FuselensServer, params: lsp.HoverParams) -> lsp.Hover | None:
    ls.facing(params.text_document.uri)
    analysis = ls.current(params.text_document.uri)
    path = uri_to_path(params.text_document.uri)
    if analysis is None or path is None:
        return None
    profile = ls.profile_for(path, analysis)
    return hover(analysis.report, path, params.position.line + 1, params.text_document.uri, profile)


@server.feature(lsp.TEXT_DOCUMENT_INLAY_HINT, lsp.InlayHintOptions(resolve_provider=False))
def on_inlay_hint(ls: FuselensServer, params: lsp.InlayHintParams) -> list[lsp.InlayHint]:
    analysis = ls.current(params.text_document.uri)
    path = uri_to_path(params.text_document.uri)
    if analysis is None or path is None or not ls.settings.inlay_hints:
        return []
    first, last = params.range.start.line + 1, params.range.end.line + 1
    return inlay_hints(analysis.report, path, analysis.text.splitlines(), first, last, ls.profile_for(path, analysis))


@server.feature(lsp.TEXT_DOCUMENT_CODE_LENS, lsp.CodeLensOptions(resolve_provider=False))
def on_code_lens(ls: FuselensServer, params: lsp.CodeLensParams) -> list[lsp.CodeLens]:
    analysis = ls.current(params.text_document.uri)
    path = uri_to_path(params.text_document.uri)
    if analysis is None or path is None or not ls.settings.code_lens:
        return []
    lines = analysis.text.splitlines()
    return code_lenses(analysis.report, path, params.text_document.uri, lines, ls.profile_for(path, analysis))


@server.feature(
    lsp.TEXT_DOCUMENT_CODE_ACTION,
    lsp.CodeActionOptions(
        code_action_kinds=[lsp.CodeActionKind.QuickFix, lsp.CodeActionKind.RefactorRewrite], resolve_provider=True
    ),
)
def on_code_action(ls: FuselensServer, params: lsp.CodeActionParams) -> list[lsp.CodeAction]:
    uri = params.text_document.uri
    analysis = ls.current(uri)  # edits are offered only for the exact text they were computed from
    path = uri_to_path(uri)
    if analysis is None or path is None:
        return []
    if ls.workspace_root(path) is None:
        return []  # its kernel module would be written beside it, outside the workspace
    module_path = next((c.kernel.path for _, c in analysis.report.clusters() if c.kernel), None)
    if module_path is None and any(analysis.report.rewrites()):  # (where a rewrite's record would go)
        module_path = edits_mod.kernel_module_path(path)
    try:
        if module_path:
            files.check_kernel_module(module_path)
    except files.Refused as exc:  # a file of the module's name that the user wrote is never replaced
        reason = lsp.CodeActionDisabled(reason=str(exc))
        return [lsp.CodeAction(title="Fuse into Triton kernels", kind=lsp.CodeActionKind.QuickFix, disabled=reason)]
    restores = _restore_actions(path, uri, analysis.version, analysis.text, params.range)
    return (
        actions_mod.code_actions(
            analysis.report,
            path,
            uri,
            analysis.version,
            analysis.text,
            params.range.start.line + 1,
            params.range.end.line + 1,
            _document_changes(ls),
            resolved=not _resolves_edits(ls),
        )
        + restores
    )


@server.feature(lsp.CODE_ACTION_RESOLVE)
async def on_code_action_resolve(ls: FuselensServer, action: lsp.CodeAction) -> lsp.CodeAction:
    """The fix the user picked, with its edit, once the kernels' code the command after it writes is
    generated (the restore actions come whole)."""
    fix = actions_mod.unresolved_fix(action)
    if fix is None:
        return action
    uri, version, ids = fix
    path = uri_to_path(uri)
    analysis = ls.current(uri)
    if path is None or analysis is None or analysis.version != version:
        why = f"the document changed since version {version}: the fix is offered again once it is analyzed"
        raise JsonRpcInvalidParams.of(ValueError(why))
    report = await with_code(ls, uri, path, analysis)
    try:
        action.edit = actions_mod.fuse_edit(report, uri, version, analysis.text, ids, _document_changes(ls))
    except rewrites_mod.Stale as exc:
        raise JsonRpcInvalidParams.of(ValueError(str(exc))) from None
    return action


def _document_changes(ls: FuselensServer) -> bool:
    """Whether the client reads a workspace edit's `documentChanges`."""
    caps = ls.client_capabilities.workspace
    edit_caps = caps.workspace_edit if caps else None
    return bool(edit_caps and edit_caps.document_changes)


def _resolves_edits(ls: FuselensServer) -> bool:
    """Whether the client asks for a code action's edit when the user picks it (`codeAction/resolve`),
    sending back the action's `data`."""
    text_document = ls.client_capabilities.text_document
    caps = text_document.code_action if text_document else None
    support = caps.resolve_support if caps else None
    return bool(caps and caps.data_support and support and "edit" in support.properties)


def _restore_actions(path: str, uri: str, version: int, text: str, where: lsp.Range) -> list[lsp.CodeAction]:
    """Restore actions from the kernel module beside the file (none where there is none, or it is not ours)."""
    module_path = edits_mod.kernel_module_path(path)
    try:
        module_text = files.check_kernel_module(module_path)
    except files.Refused:
        return []
    if module_text is None:
        return []
    first, last = where.start.line + 1, where.end.line + 1
    return actions_mod.restore_actions(path, uri, version, text, first, last, module_path, module_text)


def kernel_module_text(report, patched: list[str] | None = None, rewritten=None) -> str:
    """The kernel module for `report` (merged with the one on disk), with library patches for the
    clusters `patched` and the records of the rewrites `rewritten` (`rewrites.Record`)."""
    from fuselens.codegen.module import module_for_report

    module_path = next((c.kernel.path for _, c in report.clusters() if c.kernel), None)
    if module_path is None and rewritten:
        module_path = edits_mod.kernel_module_path(report.file)
    existing = None
    if module_path:
        # A file there that is not one to merge with (the user's, a FIFO, one of gigabytes) is left
        # out; whatever would write the module refuses it first, saying why.
        with contextlib.suppress(files.Refused):
            existing = files.check_kernel_module(module_path)
    return module_for_report(report, existing, patched, rewritten)


register_commands(server)


def run(log_file: str | None = None) -> int:
    # The editor gets the server's lines as window/logMessage (`log_line`).  It also shows stderr:
    # VS Code in the same output channel (every line twice), Neovim as [ERROR] in lsp.log.  So stderr
    # carries only warnings and errors; the log file, when asked for, every line.
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setLevel(logging.WARNING)
    handlers: list[logging.Handler] = [stderr]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(level=logging.INFO, handlers=handlers, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("pygls").setLevel(logging.WARNING)
    brief = _BriefOnce()
    for handler in handlers:
        handler.addFilter(brief)
    log.info("fuselens %s language server on stdio (python %s)", TOOL_VERSION, sys.version.split()[0])
    return server.serve_stdio()


class _BriefOnce(logging.Filter):
    """pygls logs a traceback for every message it cannot read or handle: a client that sends
    thousands would bury the log.  Each kind of its warnings and errors (where, what, which
    exception) is logged once, on one line."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        decided = getattr(record, "fuselens_once", None)  # (each handler asks again)
        if decided is None:
            decided = self._first_of_its_kind(record)
            record.fuselens_once = decided
        return decided

    def _first_of_its_kind(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("pygls") or record.levelno < logging.WARNING:
            return True
        error = record.exc_info[1] if record.exc_info else None
        arg = record.args[0] if isinstance(record.args, tuple) and record.args else None
        if error is None and isinstance(arg, BaseException):
            error = arg  # (pygls' error reporter logs the exception as its argument)
        key = (record.name, str(record.msg), type(error).__name__)
        if key in self.seen:
            return False
        self.seen.add(key)
        text = record.getMessage().split("\n", 1)[0][:300]
        if error is not None:
            text += f" ({type(error).__name__}: {str(error)[:200]})"
        record.msg, record.args, record.exc_info, record.exc_text = text + "; logged once", None, None, None
        return True
