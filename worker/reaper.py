"""Run one command so that nothing it starts outlives it.

    python -P -m fuselens.worker.reaper PARENT_PID DIRECTORY COMMAND [ARGUMENT ...]

The language server runs the remote runner through this (`server/runner.py`).  The reaper makes
itself a subreaper, then runs COMMAND in DIRECTORY, in a process group of its own, with the
reaper's standard input and output and with its standard error joined to that output.  Whatever
COMMAND starts stays below the reaper however it detaches (`setsid()`, a double-forked daemon), so
that the reaper can find it and kill it:

- when COMMAND exits (what it left running, holding the output pipe or not, is killed);
- when the reaper gets SIGTERM (the server's time limit, a cancel, the server's shutdown);
- when its parent, the server, dies, even by SIGKILL (the kernel sends the reaper SIGTERM).

The reaper then exits with COMMAND's exit status (128 + N for a command killed by signal N).  Its
own standard error is a pipe of its own to the server: it writes there only when COMMAND cannot be
started (why, in one line, and it exits with `CANNOT_START`), so that the command's output can
never be taken for that.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from types import FrameType
from typing import NoReturn

from fuselens.worker.confine import prctl
from fuselens.worker.descendants import PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG, kill_strays

CANNOT_START = 127  # as a shell exits for a command it cannot run (the reason is on standard error)
USAGE = 2


def main(arguments: list[str]) -> int:
    if len(arguments) < 3 or not arguments[0].isdigit():
        print("usage: python -m fuselens.worker.reaper PARENT_PID DIRECTORY COMMAND [ARGUMENT ...]", file=sys.stderr)
        return USAGE
    parent, directory, command = int(arguments[0]), arguments[1], arguments[2:]
    signal.signal(signal.SIGTERM, _stop)
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before that took effect: nobody wants the command now
        return 128 + signal.SIGTERM
    prctl(PR_SET_CHILD_SUBREAPER, 1)  # (where it cannot, on a system without it, the group is killed still)
    group = None
    try:
        try:
            started = subprocess.Popen(command, cwd=directory, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            print(exc.strerror or str(exc), file=sys.stderr)
            return CANNOT_START
        group = started.pid
        return _exit_status(_wait_for(started.pid))
    finally:  # the command ended, or the reaper was told to stop: what it started ends too
        if group is not None:
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGKILL)
        kill_strays(spared=())


def _wait_for(pid: int) -> int:
    """Wait until `pid` exits, reaping the orphans that end meanwhile; its wait status."""
    while True:
        reaped, status = os.waitpid(-1, 0)
        if reaped == pid:
            return status


def _exit_status(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _stop(signum: int, frame: FrameType | None) -> NoReturn:
    """SIGTERM: leave through `main`'s cleanup, once."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
