"""The worker host the server's jobs run in (`workers.py`): one at a time, for the interpreter the
settings name (`worker.python`); a new one is started, and the old one stopped, when they name another.
The first is launched as the server starts (`start.py`), with the server's own interpreter."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from fuselens.worker.protocol import Job, Limits, ModuleImport

from .background import Background
from .workers import WorkerClient

Log = Callable[[str], None]
Progress = Callable[[str, float | None], None]


class WorkerHandle:
    def __init__(
        self, python: Callable[[], str | None], log: Log, background: Background, launched: WorkerClient | None = None
    ) -> None:
        self._python = python  # the interpreter the current settings name (None: the server's own)
        self._log = log
        self._background = background
        self.client = launched  # (a host launched before the server was imported: `start.py`)
        if launched is not None:
            launched.log = log

    def get(self) -> WorkerClient:
        """The worker for the interpreter the settings name now."""
        python = self._python()
        if self.client is None or self.client.python != (python or sys.executable):
            old = self.client
            self.client = WorkerClient(python, log=self._log)
            if old is not None:
                self._background.start(old.stop())
        return self.client

    async def run(
        self,
        job: Job,
        limits: Limits,
        on_progress: Progress | None = None,
        imports: list[ModuleImport] | None = None,
    ) -> Any:
        """`job`'s result from the worker (`WorkerClient.run`); `imports`: its file's import statements."""
        return await self.get().run(job, limits, on_progress=on_progress, imports=imports)

    def torch_version(self) -> str:
        """The torch version of the running worker ("" before it is ready)."""
        return self.client.info.torch if self.client is not None and self.client.info is not None else ""

    def keep_loaded(self, modules: list[str]) -> None:
        """Have the running worker keep these library modules imported (`WorkerClient.keep_loaded`)."""
        if self.client is not None:
            self.client.keep_loaded(modules)

    async def warm(self) -> None:
        """Start the worker before the first job needs it; a failure is reported on first use."""
        try:
            await self.get().ensure_started()
        except Exception as exc:
            self._log(f"worker did not start: {exc}")

    def discard(self) -> None:
        """End at once a host that has run no job (`WorkerClient.discard`): the workspace is not trusted."""
        if self.client is not None:
            self.client.discard()

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.stop()
