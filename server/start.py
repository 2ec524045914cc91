"""`fuselens serve`'s first step: the worker host starts before the language server is even imported.

A file's first analysis waits for the worker host to import torch (a second or more on a laptop),
and the server's own start (pygls and lsprotocol: half a second) and the editor's handshake come
before the file is even opened.  So the host is launched first, with the server's own interpreter,
by the command's entry before it imports anything else (`cli/main.py`), and both go on at once, on
two cores.  Nothing of the workspace runs in it until the workspace is trusted (the host runs
fuselens's warm-up on a model of its own): if `initialize` says no folder is trusted, it is ended at
once (`handlers.py`); if the settings name another interpreter for the worker, it is replaced as any
worker is (`worker_handle.py`).

Only asyncio, the host's launch and two small policies of the worker (its confinement, its garbage
collector) are imported here before the host starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fuselens.worker.collector import paused
from fuselens.worker.confine import keep_descriptors_private

from .host_process import start_host

if TYPE_CHECKING:
    from .workers import WorkerClient


@dataclass
class _Launch:
    """The event loop the server will run on, and the host started on it (None: it could not be)."""

    loop: asyncio.AbstractEventLoop
    host: asyncio.subprocess.Process | None


_launch: _Launch | None = None  # this process's launch: one server a process


def launch_host() -> None:
    """Start the worker host, without waiting for it; a second call does nothing."""
    global _launch
    if _launch is not None:
        return
    # Not dumpable before anything is started (worker/confine.py): the host's jobs run the model's code.
    keep_descriptors_private()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    host = None
    with contextlib.suppress(OSError):  # (no interpreter to start: the first job says so)
        host = loop.run_until_complete(start_host(sys.executable))
    _launch = _Launch(loop, host)


def serve(log_file: str | None = None) -> int:
    launch_host()  # (done already where the command's entry saw `serve`)
    assert _launch is not None
    with paused():  # (the server's imports, while the host imports torch; faster so)
        from .app import run
        from .workers import WorkerClient

    worker = WorkerClient()
    if _launch.host is not None:
        _launch.loop.run_until_complete(_adopt(worker, _launch.host))

    return run(log_file, loop=_launch.loop, worker=worker)


async def _adopt(worker: WorkerClient, host: asyncio.subprocess.Process) -> None:
    worker.adopt(host)  # (its readers are tasks of the loop the server runs)
