"""The processes below this one: kept below it however they detach, found, and killed.

A process that has made itself a subreaper (`prctl(PR_SET_CHILD_SUBREAPER)`) becomes the parent of
every orphan among its descendants: a child that double-forks a daemon, or that calls `setsid()`
and leaves its process group, is still below it, where `/proc` finds it.  The worker host and its
jobs use this to end whatever the model's code started; the reaper (`reaper.py`) to end whatever a
remote runner started.

Linux only (prctl and /proc); elsewhere nothing is kept or found.  No torch here: the reaper runs
with the language server's interpreter.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Collection

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36  # prctl(2) options (Linux)
SWEEP_SECONDS = 2.0  # the most that killing what was left behind may take (a process stuck in the kernel)


def kill_strays(spared: Collection[int]) -> None:
    """Kill every process below this one but the children in `spared` (and what is below them), and
    reap those that were this process's own.  What a finished child forked is still below this
    process however it detached, if this process and the children are subreapers; a process forked
    while this runs has a parent being killed, and is found on the next pass."""
    me = os.getpid()
    give_up = time.monotonic() + SWEEP_SECONDS
    while (running := [pid for pid in below(me, spared) if is_running(pid)]) and time.monotonic() < give_up:
        for pid in running:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)  # a killed process takes a moment to become a zombie
    for pid in children(me):
        if pid not in spared:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def below(root: int, spared: Collection[int] = ()) -> list[int]:
    """Every process below `root`, but the children in `spared` and what is below them."""
    found, todo = [], [p for p in children(root) if p not in spared]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children(pid)
    return found


_CHILDREN_FILES = os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children")


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux's /proc): each of its threads' own, or, on a
    kernel without those lists, every process's parent read."""
    if not _CHILDREN_FILES:
        with contextlib.suppress(OSError):
            return [int(p) for p in os.listdir("/proc") if p.isdigit() and (_stat(int(p)) or ("", 0))[1] == pid]
        return []
    found = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with (
                contextlib.suppress(OSError),
                open(f"/proc/{pid}/task/{task}/children", "rb") as fh,
            ):  # (a thread may end)
                found += [int(p) for p in fh.read().split()]
    return found


def is_running(pid: int) -> bool:
    """Whether `pid` is alive (a zombie is not)."""
    state = _stat(pid)
    return state is not None and state[0] not in ("Z", "X")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()  # after the name, which may hold anything
        return fields[0].decode(), int(fields[1])
    except (OSError, IndexError, ValueError):
        return None
