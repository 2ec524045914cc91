"""Serving on stdin and stdout: the event loop, the termination signals, and the exit.

pygls' `start_io` reads frames of any claimed size, loses the stream for good after a length it
cannot parse, and drops `exit`'s code; the server's protocol is fed from `framing.py` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any

from pygls.io_ import StdoutWriter

from fuselens.worker.confine import keep_descriptors_private

from . import framing
from .protocol import FuselensProtocol

log = logging.getLogger("fuselens.server")

EXIT_GRACE = 2.0  # seconds the tasks still running at exit have to clean up


def serve(
    protocol: FuselensProtocol, before_tasks_end: Callable[[], None], loop: asyncio.AbstractEventLoop | None = None
) -> int:
    """Serve on stdin and stdout until `exit` or the end of input; the exit code the LSP spec asks
    for: 0 after `shutdown`, 1 for an `exit` without it (or a termination signal).
    `before_tasks_end` runs as the server stops, before its tasks are cancelled.  `loop`: the event
    loop to serve on (one the worker host was launched from, `start.py`), else a new one."""
    # Not dumpable: the model's code, which runs as the same user, cannot reopen this process's
    # standard output through /proc and speak to the editor in its name (worker/confine.py).
    if not keep_descriptors_private():
        log.warning("cannot keep the server's descriptors from other processes (no PR_SET_DUMPABLE)")
    protocol.set_writer(StdoutWriter(sys.stdout.buffer))
    if loop is None:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    code = 0
    try:
        if loop.run_until_complete(_read(protocol, sys.stdin.fileno())):
            code = 1
    except SystemExit as exc:  # `exit`
        code = exc.code if isinstance(exc.code, int) else 1
    except BrokenPipeError:
        log.error("the client closed its end of the connection")
    finally:
        before_tasks_end()
        _end_tasks(loop)
        loop.close()
        asyncio.set_event_loop(None)
    return code


async def _read(protocol: FuselensProtocol, fd: int) -> bool:
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
        await framing.read_messages(fd, protocol.receive, protocol.complain)
    except asyncio.CancelledError:
        if not signalled:
            raise
    return signalled


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
