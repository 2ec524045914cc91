"""The imports a worker client asks its host to run before a file's job, and those it asks no more.

Before a file's job the host runs the file's imports of installed packages (`PreloadImports`,
`worker/preload.py`), which no job has run yet.  An import that hangs or crashes the interpreter
would take the host with it, and every later job of the file would go the same way.  So a request
counts as done once the host has forked the job sent after it (any answer of that job says so); the
packages of a request that a host did not get past (it exited, or was given up on) are never asked
of a host again by this client: their jobs import them themselves, under the jobs' limits.
"""

from __future__ import annotations

import os

from fuselens.worker.protocol import ModuleImport, PreloadImports


def _top(statement: ModuleImport) -> str:
    return statement.module.partition(".")[0]


class ImportRequests:
    def __init__(self) -> None:
        self._sent: set[tuple[str, str, tuple[str, ...]]] = set()  # (folder, module, names) asked of this host
        self._unconfirmed: list[tuple[int, set[str]]] = []  # (the job sent after the request, its packages)
        self.refused: set[str] = set()  # top-level packages no host is asked to import any more

    def new_host(self) -> None:
        """A fresh host has imported nothing: every file's imports are asked of it again."""
        self._sent.clear()
        self._unconfirmed.clear()

    def request(self, path: str, imports: list[ModuleImport], job_id: int) -> PreloadImports | None:
        """The request for the imports of the file at `path` that this host was not asked for yet, sent
        just before the job `job_id`; None if there are none."""
        folder = os.path.dirname(os.path.realpath(path))  # (what a package there shadows depends on it)
        fresh = [
            i for i in imports if _top(i) not in self.refused and (folder, i.module, tuple(i.names)) not in self._sent
        ]
        if not fresh:
            return None
        self._sent.update((folder, i.module, tuple(i.names)) for i in fresh)
        self._unconfirmed.append((job_id, {_top(i) for i in fresh}))
        return PreloadImports(path, fresh)

    def answered(self, job_id: int) -> None:
        """The host answered for the job `job_id`: it got past every request sent before that job."""
        self._unconfirmed = [(first, tops) for first, tops in self._unconfirmed if first > job_id]

    def host_lost(self) -> set[str]:
        """The host is gone unasked: the packages it had not got past yet, which no host is asked again."""
        lost = set().union(*(tops for _, tops in self._unconfirmed))
        self.refused |= lost
        self._unconfirmed.clear()
        return lost
