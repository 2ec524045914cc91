"""What the server sends the editor besides its log: diagnostics, requests to refresh lenses and
hints, to show a file, to choose, to watch files, for the settings, and work-done progress.

Each request the server makes waits a bounded time: a client that never answers holds nothing up.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable
from typing import Any

from lsprotocol import types as lsp
from pygls.lsp.server import LanguageServer

from .background import Background
from .client import ClientFeatures

SHOW_DOCUMENT_TIMEOUT_S = 10.0  # how long a command waits for the client to show a view
ASK_TIMEOUT_S = 600.0  # how long a question to the user waits for an answer (no answer is "no")
REQUEST_TIMEOUT_S = 10.0  # how long any other request waits for the client

WATCHED = ("**/*.py", "**/pyproject.toml")  # what the server asks the client to watch


class Editor:
    def __init__(self, server: LanguageServer, background: Background) -> None:
        self._server = server
        self._background = background

    def publish_diagnostics(self, uri: str, diagnostics: list[lsp.Diagnostic], version: int | None) -> None:
        self._server.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri, diagnostics, version))

    def refresh_views(self, client: ClientFeatures) -> None:
        """Ask the client to re-request lenses and inlay hints (they derive from the analyses)."""
        if client.refreshes_code_lenses:
            self._background.start(_quietly(self._server.workspace_code_lens_refresh_async(None)))
        if client.refreshes_inlay_hints:
            self._background.start(_quietly(self._server.workspace_inlay_hint_refresh_async(None)))

    async def configuration(self) -> Any:
        """The client's "fuselens" settings (`workspace/configuration`)."""
        (config,) = await self._server.workspace_configuration_async(
            lsp.ConfigurationParams([lsp.ConfigurationItem(section="fuselens")])
        )
        return config

    async def watch_files(self) -> None:
        """Have the client tell the server of changes to Python files and pyproject.toml."""
        watchers = [lsp.FileSystemWatcher(glob_pattern=pattern) for pattern in WATCHED]
        registration = lsp.Registration(
            id="fuselens-watch",
            method=lsp.WORKSPACE_DID_CHANGE_WATCHED_FILES,
            register_options=lsp.DidChangeWatchedFilesRegistrationOptions(watchers=watchers),
        )
        async with asyncio.timeout(5):
            await self._server.client_register_capability_async(lsp.RegistrationParams([registration]))

    async def ask(self, client: ClientFeatures, message: str, options: list[str]) -> str | None:
        """The option the user picks; None when the client cannot ask, or no answer comes."""
        if not client.asks_the_user:
            return None
        params = lsp.ShowMessageRequestParams(
            lsp.MessageType.Info, message, [lsp.MessageActionItem(o) for o in options]
        )
        try:
            async with asyncio.timeout(ASK_TIMEOUT_S):
                answer = await self._server.window_show_message_request_async(params)
        except Exception:  # no answer is "no"
            return None
        return answer.title if answer else None

    async def show_document(self, client: ClientFeatures, params: lsp.ShowDocumentParams) -> None:
        """Ask the client to show a view; a client that never answers does not hold the command up."""
        if not client.shows_documents:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(SHOW_DOCUMENT_TIMEOUT_S):
                await self._server.window_show_document_async(params)

    async def progress(self, client: ClientFeatures, title: str) -> Progress:
        """Work-done progress titled `title`, when the client shows it; silent otherwise."""
        progress = self._server.work_done_progress
        if not client.work_done_progress:
            return Progress(progress, None)
        token = f"fuselens-{uuid.uuid4().hex[:8]}"
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                await progress.create_async(token)
        except Exception:
            return Progress(progress, None)
        progress.begin(token, lsp.WorkDoneProgressBegin(title=title, cancellable=False, percentage=0))
        return Progress(progress, token)


class Progress:
    """One work-done progress (silent without a token)."""

    def __init__(self, progress: Any, token: str | None) -> None:
        self._progress = progress  # pygls' progress of the server
        self.token = token

    def report(self, message: str, fraction: float | None = None) -> None:
        if self.token:
            percentage = int(fraction * 100) if fraction is not None else None
            self._progress.report(self.token, lsp.WorkDoneProgressReport(message=message, percentage=percentage))

    def end(self) -> None:
        if self.token:
            self._progress.end(self.token, lsp.WorkDoneProgressEnd(message="done"))
            self._progress.tokens.pop(self.token, None)  # (pygls keeps every token it was given)


async def _quietly(request: Awaitable[Any]) -> None:
    """Await a request whose failure does not matter (a client that cannot refresh lenses)."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            await request
