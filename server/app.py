"""`fuselens serve`: the language server, put together.

It never imports torch.  Open and save schedule an analysis of that document in the worker host
(`analyzing.py`, `scheduler.py`, `workers.py`); the analysis that comes back is kept per document
(`state.py`), and every request is answered from a snapshot of that state taken as it arrives
(`snapshot.py`, `requests.py`, `commands.py`).  Nothing runs until the user has trusted the workspace
(`trust.py`).

The byte stream is read by `framing.py` (bounded frames, resynchronised after a bad one) and fed to
pygls' protocol (`protocol.py`), which keeps to the LSP lifecycle: `initialize` once, every request
answered, InvalidRequest after `shutdown`; the exit code `exit` asks for is `stdio.py`'s.

Which module holds what:
- state: `state.py` (documents, analyses, folders and trust, profiles), `configuration.py` (the
  settings and where they are read from), `client.py` (what the client supports);
- handlers: `handlers.py` (lifecycle, document changes, requests), `commands.py`;
- services, each given only what it uses: `analyzing.py`, `scheduler.py`, `generation.py`,
  `inductor.py`, `worker_handle.py`, `editor.py` (what the server sends the client), `history.py`, `views.py`;
- logging: `logs.py`;
- the start: `start.py` (the worker host is launched before this module is imported).
"""

from __future__ import annotations

import asyncio
import sys

from lsprotocol import types as lsp
from pygls.lsp.server import LanguageServer

from fuselens.contracts.version import TOOL_VERSION

from . import history, logs, stdio
from .admission import Admission
from .analyzing import Analyzer
from .background import Background
from .commands import register_commands
from .configuration import Configuration
from .editor import Editor
from .generation import Generation
from .handlers import register_features
from .logs import EditorLog
from .protocol import FuselensProtocol
from .runner import RemoteRunners
from .services import Services
from .state import Folders, OpenDocuments, ServerState
from .worker_handle import WorkerHandle
from .workers import WorkerClient


class FuselensServer(LanguageServer):
    """pygls' server, speaking through `FuselensProtocol`; what it does is registered on it by
    `create_server`."""

    def __init__(self) -> None:
        super().__init__(
            "fuselens",
            TOOL_VERSION,
            text_document_sync_kind=lsp.TextDocumentSyncKind.Incremental,
            protocol_cls=FuselensProtocol,
        )
        self.protocol: FuselensProtocol


def create_server(launched: WorkerClient | None = None) -> tuple[FuselensServer, Services]:
    """A server with every handler registered, and the parts they use; `launched`: the worker host
    started before the server was imported (`start.py`)."""
    server = FuselensServer()
    log = EditorLog(server.window_log_message, server.window_show_message)
    background = Background()
    configuration = Configuration(lambda text: log.tell(text, lsp.MessageType.Warning))
    worker = WorkerHandle(lambda: configuration.current.worker.python, log.line, background, launched)
    admission = Admission()
    generation = Generation(worker.run, admission, log.line)
    state = ServerState(
        OpenDocuments(lambda: server.workspace.text_documents),
        configuration,
        Folders(log.tell),
        generation.joined,
        lambda path: history.measured(path, log.line),
    )
    editor = Editor(server, background)
    analyzer = Analyzer(state, worker, admission, generation, editor, log, background)
    services = Services(state, log, editor, worker, admission, generation, analyzer, RemoteRunners(), background)
    register_features(server, services)
    register_commands(server, services)
    return server, services


def serve_stdio(server: FuselensServer, services: Services, loop: asyncio.AbstractEventLoop | None = None) -> int:
    """Serve on stdin and stdout (`stdio.py`), on `loop` if given; the exit code."""
    try:
        return stdio.serve(server.protocol, services.remote.kill_all, loop)
    finally:
        server.shutdown()


def run(
    log_file: str | None = None, loop: asyncio.AbstractEventLoop | None = None, worker: WorkerClient | None = None
) -> int:
    """Serve on stdio; `worker`: a worker client whose host was launched on `loop` before the server
    was imported (`start.py`)."""
    logs.configure(log_file)
    logs.log.info("fuselens %s language server on stdio (python %s)", TOOL_VERSION, sys.version.split()[0])
    server, services = create_server(worker)
    return serve_stdio(server, services, loop)
