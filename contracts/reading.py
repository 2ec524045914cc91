"""Reading a file that something other than fuselens may have put there (a `pyproject.toml`, a kernel
module, git's `HEAD`, the trusted-folder list, a validation history) without being held up or swamped
by what is there.

The language server reads on its event loop, so a read that blocks stops every request.  Opening a FIFO
for reading waits until something opens it for writing, and reading one (or a device) may never end; a
file of gigabytes takes minutes and its size in memory.  So a file is opened without blocking
(`O_NONBLOCK`: a FIFO opens at once), what was opened is checked to be a regular file (`fstat` of the
open descriptor, so a file swapped for a FIFO after a check is still caught), and it is read only when
its size is within the caller's bound, and never past it.  Anything else raises `Unreadable`, whose
message says why; a file that is not there raises `FileNotFoundError`, as `open()` does.
"""

from __future__ import annotations

import io
import os
import stat

_NOT_REGULAR = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}
_CHUNK = 1 << 20


class Unreadable(OSError):
    """A file that is there but is not read; the message says why ("it is a FIFO, not a regular file")."""


def read_bytes(path: str, limit: int) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them; `Unreadable` for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise Unreadable(f"it cannot be opened: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = _NOT_REGULAR.get(stat.S_IFMT(info.st_mode))
            raise Unreadable(f"it is {kind}, not a regular file" if kind else "it is not a regular file")
        if info.st_size > limit:
            raise Unreadable(f"it is {size_text(info.st_size)}, more than the {size_text(limit)} fuselens reads")
        data = _read_at_most(fd, limit + 1)  # (a file that grew since fstat is caught here)
        if len(data) > limit:
            raise Unreadable(f"it is more than the {size_text(limit)} fuselens reads")
        return data
    except Unreadable:
        raise
    except OSError as exc:
        raise Unreadable(f"it cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def read_text(path: str, limit: int, errors: str = "strict") -> str:
    """The text of the regular file at `path` (UTF-8, at most `limit` bytes), its line endings read as
    `open()` reads them (universal newlines); `Unreadable` for anything else, text that is not UTF-8
    included (unless `errors` says what to do with it)."""
    data = read_bytes(path, limit)
    try:
        with io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors=errors) as text:
            return text.read()
    except UnicodeDecodeError as exc:
        raise Unreadable(f"it is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def size_text(size: int) -> str:
    """A byte count as a person reads it: "300 MB", "1.9 GB", "64 KB"."""
    for unit, shift in (("GB", 30), ("MB", 20), ("KB", 10)):
        if size >= 1 << shift:
            value = size / (1 << shift)
            return f"{value:.1f} {unit}" if value < 10 and value != int(value) else f"{value:.0f} {unit}"
    return f"{size} bytes"


def _read_at_most(fd: int, count: int) -> bytes:
    chunks, left = [], count
    while left > 0:
        chunk = os.read(fd, min(left, _CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
