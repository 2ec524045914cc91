"""Keeping the model's code away from the descriptors of the processes that talk to the editor (Linux).

A process may open another's descriptors through `/proc/<pid>/fd/<n>` (and take them with
`pidfd_getfd`, read its memory, attach to it) when the kernel's ptrace access check lets it: when
both run as the same user and the target is *dumpable*, which every process is by default.  The
model's code runs as the user, so without more it could reopen the worker host's pipes to the
server, or the server's own standard output to the editor, and speak for either.

Two settings close that path:

- The language server and the worker host make themselves not dumpable (`PR_SET_DUMPABLE` 0):
  the kernel then lets only a process with `CAP_SYS_PTRACE` reach their descriptors and memory.  A
  job, forked from the host, inherits it.
- A job gives up `CAP_SYS_PTRACE` before the model's code runs, for itself and for whatever it runs
  (effective, permitted, inheritable, ambient and bounding sets, and no new privileges through a
  set-user-ID program).  An ordinary user has no such capability; root does, and without this a
  model run by root could still reach both processes.

Neither changes anything else a process does, except that a debugger of the same user cannot
attach to the server or the host either (root can).
"""

from __future__ import annotations

import ctypes
import os

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_LOWER = 47, 3
CAP_SYS_PTRACE = 19
_CAPABILITY_VERSION_3 = 0x20080522  # <linux/capability.h>: two 32-bit words per set


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def prctl(option: int, value: int, arg3: int = 0) -> bool:
    """prctl(2); False where it failed or the system has none."""
    libc = _libc()
    try:
        return libc is not None and libc.prctl(option, value, arg3, 0, 0) == 0
    except AttributeError:  # not Linux
        return False


def keep_descriptors_private() -> bool:
    """Make this process not dumpable, so that no process of the same user without CAP_SYS_PTRACE can
    open its descriptors or read its memory.  False where the system cannot."""
    return prctl(PR_SET_DUMPABLE, 0)


def dumpable() -> bool:
    libc = _libc()
    try:
        return libc is None or libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0
    except AttributeError:
        return True


def renounce_ptrace() -> bool:
    """Give up CAP_SYS_PTRACE for this process and everything it runs; True when it no longer has it
    (or never had it)."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    libc = _libc()
    if libc is None or not hasattr(libc, "capget"):
        return not _has_ptrace()
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_LOWER, CAP_SYS_PTRACE)
    prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE)  # (needs CAP_SETPCAP, which whoever has CAP_SYS_PTRACE has too)
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    sets = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), sets) == 0:
        word, bit = divmod(CAP_SYS_PTRACE, 32)
        mask = ~(1 << bit) & 0xFFFFFFFF
        sets[word].effective &= mask
        sets[word].permitted &= mask
        sets[word].inheritable &= mask
        libc.capset(ctypes.byref(header), sets)
    return not _has_ptrace()


def _has_ptrace() -> bool:
    """Whether CAP_SYS_PTRACE is in this process's effective set (from /proc/self/status)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return os.name == "posix" and hasattr(os, "geteuid") and os.geteuid() == 0
