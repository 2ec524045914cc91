"""The LSP messages the server handles, each a thin handler: the lifecycle, the documents' changes
(which go to the analyzer, `analyzing.py`), and the requests about a document, each answered from a
snapshot taken as it arrives (`requests.py`)."""

from __future__ import annotations

from typing import Any

from lsprotocol import types as lsp
from pygls.lsp.server import LanguageServer

from .client import client_features
from .features import actions as actions_mod
from .features.text import uri_to_path
from .protocol import on_arrival
from .requests import code_actions, code_lenses, hover, inlay_hints, resolve_fix
from .services import Services
from .trust import Trust, client_trust


def register_features(server: LanguageServer, services: Services) -> None:
    _register_lifecycle(server, services)
    _register_documents(server, services)
    _register_requests(server, services)


def _register_lifecycle(server: LanguageServer, services: Services) -> None:
    state, analyzer = services.state, services.analyzer

    @server.feature(lsp.INITIALIZE)
    def on_initialize(params: lsp.InitializeParams) -> None:
        options = params.initialization_options if isinstance(params.initialization_options, dict) else {}
        state.configuration.init_options = options
        roots = [uri_to_path(f.uri) for f in (params.workspace_folders or [])]
        if not roots and params.root_uri:
            roots = [uri_to_path(params.root_uri)]
        found = [r for r in roots if r]
        editor = params.client_info.name if params.client_info else ""
        state.folders.open(found, Trust(client_trust(options), found), editor)
        state.client = client_features(params.capabilities)
        if not state.folders.trusts_a_folder():
            services.worker.discard()  # launched as the server started (`start.py`): nothing runs here for now

    @server.feature(lsp.INITIALIZED)
    async def on_initialized(params: lsp.InitializedParams) -> None:
        try:
            ask = services.editor.configuration if state.client.configuration else None
            await state.configuration.reload(state.folders.roots, ask)
        finally:
            state.configuration.read()
        if state.client.watches_files:
            try:
                await services.editor.watch_files()
            except Exception as exc:  # watchdog still watches
                services.log.line(f"the client did not register file watching ({exc}); using watchdog only")
        roots = state.folders.roots
        if state.folders.trusts_a_folder():
            analyzer.watch(roots)
            services.background.start(services.worker.warm())

    @server.feature(lsp.SHUTDOWN)
    async def on_shutdown(params: None) -> None:
        services.remote.kill_all()
        analyzer.stop_watching()
        await services.worker.stop()


def _register_documents(server: LanguageServer, services: Services) -> None:
    state, analyzer = services.state, services.analyzer

    @server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)
    def did_open(params: lsp.DidOpenTextDocumentParams) -> None:
        analyzer.opened(params.text_document.uri, params.text_document.version)

    @server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(params: lsp.DidChangeTextDocumentParams) -> None:
        analyzer.changed(params.text_document.uri)

    @server.feature(lsp.TEXT_DOCUMENT_DID_SAVE, lsp.SaveOptions(include_text=False))
    def did_save(params: lsp.DidSaveTextDocumentParams) -> None:
        analyzer.saved(params.text_document.uri)

    @server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(params: lsp.DidCloseTextDocumentParams) -> None:
        analyzer.closed(params.text_document.uri)

    @server.feature(lsp.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(params: lsp.DidChangeConfigurationParams) -> None:
        state.configuration.client_sent(params.settings)
        ask = services.editor.configuration if state.client.configuration else None
        if await state.configuration.reload(state.folders.roots, ask):
            analyzer.settings_changed()

    @server.feature(lsp.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched_files(params: lsp.DidChangeWatchedFilesParams) -> None:
        for change in params.changes:
            path = uri_to_path(change.uri)
            if path:
                analyzer.file_changed(path)


def _register_requests(server: LanguageServer, services: Services) -> None:
    state, analyzer = services.state, services.analyzer

    @server.feature(lsp.TEXT_DOCUMENT_HOVER)
    def on_hover(params: lsp.HoverParams) -> lsp.Hover | None:
        analyzer.facing(params.text_document.uri)
        return hover(state.snapshot(params.text_document.uri), params.position)

    @server.feature(lsp.TEXT_DOCUMENT_INLAY_HINT, lsp.InlayHintOptions(resolve_provider=False))
    def on_inlay_hint(params: lsp.InlayHintParams) -> list[lsp.InlayHint]:
        return inlay_hints(state.snapshot(params.text_document.uri), params.range)

    @server.feature(lsp.TEXT_DOCUMENT_CODE_LENS, lsp.CodeLensOptions(resolve_provider=False))
    def on_code_lens(params: lsp.CodeLensParams) -> list[lsp.CodeLens]:
        return code_lenses(state.snapshot(params.text_document.uri))

    @server.feature(
        lsp.TEXT_DOCUMENT_CODE_ACTION,
        lsp.CodeActionOptions(
            code_action_kinds=[lsp.CodeActionKind.QuickFix, lsp.CodeActionKind.RefactorRewrite],
            resolve_provider=True,
        ),
    )
    def on_code_action(params: lsp.CodeActionParams) -> list[lsp.CodeAction]:
        snapshot = state.snapshot(params.text_document.uri)
        root = state.folders.root_of(snapshot.path) if snapshot.path else None
        return code_actions(snapshot, params.range, root)

    @server.feature(lsp.CODE_ACTION_RESOLVE)
    @on_arrival
    def on_code_action_resolve(action: lsp.CodeAction) -> Any:
        """The fix the user picked, with its edit, once the kernels' code the command after it writes is
        generated (the restore actions come whole)."""
        fix = actions_mod.unresolved_fix(action)
        if fix is None:
            return _as_is(action)
        uri, version, ids = fix
        return resolve_fix(state.snapshot(uri), action, version, ids, services)


async def _as_is(action: lsp.CodeAction) -> lsp.CodeAction:
    return action
