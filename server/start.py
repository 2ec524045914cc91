"""`fuselens serve`'s first step: the worker host starts before the language server is even imported.

A file's first analysis waits for the worker host to import torch (a second or more on a laptop),
and the server's own start (pygls and lsprotocol: half a second) and the editor's handshake come
before the file is even opened.  So the host is launched first, with the server's own interpreter,
and both go on at once, on two cores.  Nothing of the workspace runs in it until the workspace is
trusted (the host runs fuselens's warm-up on a model of its own): if `initialize` says no folder is
trusted, it is ended at once (`handlers.py`); if the settings name another interpreter for the
worker, it is replaced as any worker is (`worker_handle.py`).
"""

from __future__ import annotations

import asyncio
import contextlib

from fuselens.worker.confine import keep_descriptors_private

from .workers import JobFailed, WorkerClient


def serve(log_file: str | None = None) -> int:
    # Not dumpable before anything is started (worker/confine.py): the host's jobs run the model's code.
    keep_descriptors_private()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    worker = WorkerClient()
    with contextlib.suppress(JobFailed):  # (no interpreter to start: the first job says so)
        loop.run_until_complete(worker.launch())
    from .app import run  # (pygls and lsprotocol: imported while the host imports torch)

    return run(log_file, loop=loop, worker=worker)
