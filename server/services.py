"""The parts of the server its handlers use, made once by `app.create_server` (each part takes only
what it needs of the others)."""

from __future__ import annotations

from dataclasses import dataclass

from .admission import Admission
from .analyzing import Analyzer
from .background import Background
from .editor import Editor
from .generation import Generation
from .logs import EditorLog
from .runner import RemoteRunners
from .state import ServerState
from .worker_handle import WorkerHandle


@dataclass(frozen=True)
class Services:
    state: ServerState  # what the server knows; requests read it through snapshots
    log: EditorLog
    editor: Editor  # what the server sends the client
    worker: WorkerHandle
    admission: Admission  # every job's turn
    generation: Generation  # the kernels' code, when something asks for it
    analyzer: Analyzer  # the documents' analyses
    remote: RemoteRunners
    background: Background
