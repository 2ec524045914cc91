"""`fuselens serve`: the language server.

It never imports torch.  Open and save schedule an analysis of that document in the
worker host (`workers.py`, `scheduler.py`); the report that comes back is cached per
document version, and every feature is answered from that cache (`features/`).
Nothing runs until the user has trusted the workspace (`trust.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import unquote

from cattrs import transform_error
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol

from fuselens.codegen import edits as edits_mod
from fuselens.codegen import files
from fuselens.contracts.config import ConfigError, read_tool_table
from fuselens.contracts.report import Report
from fuselens.contracts.version import TOOL_VERSION
from fuselens.worker.protocol import AnalyzeJob, Limits

from . import settings as settings_mod
from .commands import register_commands
from .features import actions as actions_mod
from .features.diagnostics import diagnostics
from .features.hover import hover
from .features.inlay import inlay_hints
from .features.lenses import code_lenses
from .features.text import same_file, uri_to_path
from .inductor import InductorComparer
from .scheduler import Analysis, Scheduler
from .trust import Trust, client_trust
from .watch import Watcher, affects
from .workers import WorkerClient

log = logging.getLogger("fuselens.server")


_ANSWERED = object()  # a request already answered with an error while it was being read


class FuselensProtocol(LanguageServerProtocol):
    """pygls' protocol, except that a request whose params cannot be read is answered.

    pygls drops such a request before dispatching it (a negative line, a missing URI), so
    the client would wait for its answer for ever; here it gets an InvalidParams error.
    """

    def structure_message(self, data: dict[str, Any]):
        try:
            return super().structure_message(data)
        except JsonRpcInvalidParams as exc:
            if data.get("id") is None or not isinstance(data.get("method"), str):
                raise  # a notification or a response: nobody waits for an answer
            cause = exc.__cause__
            detail = "; ".join(transform_error(cause)) if cause is not None else "unreadable"
            error = JsonRpcInvalidParams(f"invalid params for {data['method']}: {detail}")
            self._send_response(data["id"], error=error.to_response_error())
            return _ANSWERED

    def handle_message(self, message) -> None:
        if message is not _ANSWERED:
            super().handle_message(message)


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
        self.warned_settings: set[str] = set()
        self.seen_changes: dict[str, float] = {}
        self.stats = {"published": 0, "dropped_stale": 0}
        self.inductor = InductorComparer(self)
        self.background: set[asyncio.Future[Any]] = set()

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
            if os.path.isfile(pyproject):
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
                (config,) = await asyncio.wait_for(
                    self.workspace_configuration_async(
                        lsp.ConfigurationParams([lsp.ConfigurationItem(section="fuselens")])
                    ),
                    5,
                )
            except Exception:  # a client that cannot answer keeps the other sources
                config = None
            merged, found = settings_mod.merge(merged, config, "settings")
            problems += found
        self.settings = merged
        for problem in problems:
            if problem not in self.warned_settings:
                self.warned_settings.add(problem)
                self.tell(f"fuselens: {problem} (ignored; the default is used)", lsp.MessageType.Warning)

    # ---- analysis -----------------------------------------------------------------------------
    def schedule(self, uri: str) -> None:
        doc = self.document(uri)
        path = uri_to_path(uri)
        if doc is None or path is None or not path.endswith(".py"):
            return
        if not self.trusted(path):
            if not self.untrusted_told:
                self.untrusted_told = True
                self.tell(Trust.explanation(path), lsp.MessageType.Warning)
            return
        self.inductor.cancel(uri)  # a new analysis supersedes the comparison of the old text
        self.scheduler.request(uri, path, doc.version or 0, doc.source)

    async def _run_analysis(self, path: str, text: str, version: int) -> Report:
        w = self.settings.worker
        job = AnalyzeJob(path, self.settings.analyze_options(text))
        return await self.get_worker().run(job, Limits(w.timeout_seconds, w.memory_mb))

    def _on_result(self, uri: str, analysis: Analysis) -> None:
        doc = self.document(uri)
        if doc is None:
            return
        if (doc.version or 0) != analysis.version:
            self.stats["dropped_stale"] += 1  # the user typed since: never show stale results
            return
        self.publish(uri, analysis)
        self.log_line(
            f"analyzed {os.path.basename(uri_to_path(uri) or uri)} v{analysis.version} in {analysis.elapsed_ms:.0f} ms"
        )
        self.refresh_views()
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
        diags = diagnostics(analysis.report, path, lines, self.settings.severity, self.settings.show, analysis.failure)
        self.stats["published"] += 1
        self.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri, diags, analysis.version))

    def current(self, uri: str) -> Analysis | None:
        """The cached analysis, if it is of the document's current version."""
        analysis = self.scheduler.cache.get(uri)
        doc = self.document(uri)
        if analysis is None or analysis.failure is not None or doc is None or (doc.version or 0) != analysis.version:
            return None  # typed since: its lines no longer line up with the document's
        return analysis

    def file_changed(self, path: str) -> None:
        """A file changed on disk: re-analyze the open documents that depend on it."""
        try:
            stamp = os.stat(path).st_mtime
        except OSError:
            stamp = -1.0
        if self.seen_changes.get(path) == stamp:
            return  # watchdog and the client both told us
        self.seen_changes[path] = stamp
        for doc in list(self.workspace.text_documents.values()):
            doc_path = uri_to_path(doc.uri)
            if doc_path and not same_file(doc_path, path) and affects(path, doc_path, doc.source):
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


@server.feature(lsp.INITIALIZED)
async def on_initialized(ls: FuselensServer, params: lsp.InitializedParams) -> None:
    await ls.reload_settings()
    caps = ls.client_capabilities.workspace
    watched = caps.did_change_watched_files if caps else None
    if watched and watched.dynamic_registration:
        try:
            await asyncio.wait_for(
                ls.client_register_capability_async(
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
                ),
                5,
            )
        except Exception as exc:  # watchdog still watches
            ls.log_line(f"the client did not register file watching ({exc}); using watchdog only")
    if any(ls.trusted(os.path.join(r, "x.py")) for r in ls.roots):
        loop = asyncio.get_running_loop()
        ls.watcher = Watcher(ls.roots, lambda p: _call_soon(loop, ls.file_changed, p))
        ls.watcher.start()
        ls.in_background(_warm(ls))


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[str], None], path: str) -> None:
    """Run `callback(path)` on the server's loop (the watcher calls from its own thread)."""
    loop.call_soon_threadsafe(callback, path)


async def _quietly(request) -> None:
    """Await a request whose failure does not matter (a client that cannot refresh lenses)."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(request, 10)


async def _warm(ls: FuselensServer) -> None:
    try:
        await ls.get_worker().ensure_started()
    except Exception as exc:  # reported on first use
        ls.log_line(f"worker did not start: {exc}")


@server.feature(lsp.SHUTDOWN)
async def on_shutdown(ls: FuselensServer, params: None) -> None:
    if ls.watcher:
        ls.watcher.stop()
    if ls.worker:
        await ls.worker.stop()


@server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: FuselensServer, params: lsp.DidOpenTextDocumentParams) -> None:
    ls.schedule(params.text_document.uri)


@server.feature(lsp.TEXT_DOCUMENT_DID_SAVE, lsp.SaveOptions(include_text=False))
def did_save(ls: FuselensServer, params: lsp.DidSaveTextDocumentParams) -> None:
    ls.schedule(params.text_document.uri)


@server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: FuselensServer, params: lsp.DidCloseTextDocumentParams) -> None:
    ls.inductor.cancel(params.text_document.uri)
    ls.scheduler.forget(params.text_document.uri)
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
    analysis = ls.current(params.text_document.uri)
    path = uri_to_path(params.text_document.uri)
    if analysis is None or path is None:
        return None
    return hover(analysis.report, path, params.position.line + 1)


@server.feature(lsp.TEXT_DOCUMENT_INLAY_HINT, lsp.InlayHintOptions(resolve_provider=False))
def on_inlay_hint(ls: FuselensServer, params: lsp.InlayHintParams) -> list[lsp.InlayHint]:
    analysis = ls.current(params.text_document.uri)
    path = uri_to_path(params.text_document.uri)
    if analysis is None or path is None or not ls.settings.inlay_hints:
        return []
    return inlay_hints(
        analysis.report, path, analysis.text.splitlines(), params.range.start.line + 1, params.range.end.line + 1
    )


@server.feature(lsp.TEXT_DOCUMENT_CODE_LENS, lsp.CodeLensOptions(resolve_provider=False))
def on_code_lens(ls: FuselensServer, params: lsp.CodeLensParams) -> list[lsp.CodeLens]:
    analysis = ls.current(params.text_document.uri)
    path = uri_to_path(params.text_document.uri)
    if analysis is None or path is None or not ls.settings.code_lens:
        return []
    return code_lenses(analysis.report, path, params.text_document.uri, analysis.text.splitlines())


@server.feature(
    lsp.TEXT_DOCUMENT_CODE_ACTION,
    lsp.CodeActionOptions(
        code_action_kinds=[lsp.CodeActionKind.QuickFix, lsp.CodeActionKind.RefactorRewrite], resolve_provider=False
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
    try:
        if module_path:
            files.check_kernel_module(module_path)
    except files.Refused as exc:  # a file of the module's name that the user wrote is never replaced
        reason = lsp.CodeActionDisabled(reason=str(exc))
        return [lsp.CodeAction(title="Fuse into Triton kernels", kind=lsp.CodeActionKind.QuickFix, disabled=reason)]
    caps = ls.client_capabilities.workspace
    edit_caps = caps.workspace_edit if caps else None
    ops = (edit_caps.resource_operations or []) if edit_caps else []
    document_changes = bool(edit_caps and edit_caps.document_changes)
    create_ok = document_changes and lsp.ResourceOperationKind.Create in ops
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
            lambda ids: kernel_module_text(analysis.report, ids),
            create_ok,
            document_changes,
        )
        + restores
    )


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


def kernel_module_text(report, patched: list[str] | None = None) -> str:
    """The kernel module for `report` (merged with the one on disk), with library patches for the
    clusters `patched`."""
    from fuselens.codegen.module import module_for_report

    module_path = next((c.kernel.path for _, c in report.clusters() if c.kernel), None)
    existing = None
    if module_path and os.path.exists(module_path):
        with open(module_path, encoding="utf-8") as fh:
            existing = fh.read()
    return module_for_report(report, existing, patched)


register_commands(server)


def run(log_file: str | None = None) -> int:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(level=logging.INFO, handlers=handlers, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("pygls").setLevel(logging.WARNING)
    log.info("fuselens %s language server on stdio (python %s)", TOOL_VERSION, sys.version.split()[0])
    server.start_io()
    return 0
