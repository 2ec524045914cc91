"""The LSP byte stream: `Content-Length` frames in, JSON values out, whatever the client sends.

A frame is a header block (`Content-Length: N`, optionally other headers, then an empty
line) and N bytes of JSON.  The reader here keeps what it holds bounded: a header block of at
most `MAX_HEADER_BYTES`, a body of at most `MAX_BODY_BYTES`.  A frame it cannot take (no
length, a length that is not a byte count, one over the limit, a header block that never
ends) is reported and skipped: the reader then looks for the next `Content-Length:` and goes
on from there, so one bad frame costs that frame, never the stream.  A body that is not JSON
but holds a `Content-Length:`, or ends in the start of one (its length ran past its end, into
the next frame), is read again from that header, so the frame after a truncated one still
arrives.

Bytes come from the editor through a daemon thread that reads one chunk whenever the loop
asks for one: memory stays bounded whatever the client sends, and a read blocked on stdin
never holds up the process's exit.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

MAX_HEADER_BYTES = 8 << 10
MAX_BODY_BYTES = 64 << 20  # a document of tens of MB still fits; 99999999999 bytes is refused, not allocated
READ_CHUNK = 1 << 16

HEADER_END = b"\r\n\r\n"
MARKER = b"Content-Length:"  # where a frame starts: what the reader looks for to resynchronise


@dataclass(frozen=True)
class Malformed:
    """A frame the reader skipped: `kind` names the sort of problem (logged once per kind)."""

    kind: str
    detail: str


class Frames:
    """Splits bytes into frame bodies.  `feed()` yields each complete body (bytes) or `Malformed`;
    between two items the consumer may hand bytes back with `unread()`, which are read first."""

    def __init__(self, max_body: int = MAX_BODY_BYTES, max_header: int = MAX_HEADER_BYTES) -> None:
        self.max_body, self.max_header = max_body, max_header
        self._buffer = bytearray()
        self._length: int | None = None  # the body length of the frame whose header was read
        self._resyncing = False

    def feed(self, data: bytes) -> Iterator[bytes | Malformed]:
        self._buffer += data
        while (item := self._next()) is not None:
            yield item

    def unread(self, data: bytes) -> None:
        """Put `data` back in front of what is buffered: it starts a frame (the header of the next one)."""
        self._buffer[:0] = data
        self._length, self._resyncing = None, False

    def _resync(self) -> bool:
        """Skip to the next `Content-Length:`; False (keeping only a possible partial marker) if none yet."""
        at = self._buffer.find(MARKER)
        if at < 0:
            del self._buffer[: max(0, len(self._buffer) - len(MARKER) + 1)]
            return False
        del self._buffer[:at]
        self._resyncing = False
        return True

    def _next(self) -> bytes | Malformed | None:
        """The next body, or the next frame skipped; None until more bytes come."""
        if self._resyncing and not self._resync():
            return None
        if self._length is None:
            found = self._header()
            if not isinstance(found, int):
                return found
            self._length = found
        return self._body()

    def _header(self) -> int | Malformed | None:
        """The body length a complete header block gives (the block is consumed), Malformed when it
        gives none, None until the block is complete."""
        end = self._buffer.find(HEADER_END, 0, self.max_header + len(HEADER_END))
        if end < 0:
            if len(self._buffer) < self.max_header + len(HEADER_END):
                return None
            return self._skip(Malformed("header", f"no end of headers within {self.max_header} bytes"))
        length = _content_length(bytes(self._buffer[:end]), self.max_body)
        if isinstance(length, Malformed):
            return self._skip(length)
        del self._buffer[: end + len(HEADER_END)]
        return length

    def _body(self) -> bytes | None:
        assert self._length is not None
        if len(self._buffer) < self._length:
            return None
        body = bytes(self._buffer[: self._length])
        del self._buffer[: self._length]
        self._length = None
        return body

    def _skip(self, problem: Malformed) -> Malformed:
        del self._buffer[:1]  # past this header's own marker: resynchronise on the next one
        self._resyncing = True
        return problem


def _content_length(header: bytes, max_body: int) -> int | Malformed:
    length: int | None = None
    for line in header.split(b"\r\n"):
        name, colon, value = line.partition(b":")
        if not colon:
            return Malformed("header", f"a header line without ':': {_show(line)}")
        if name.strip().lower() != b"content-length":
            continue  # Content-Type, or a header of a newer protocol
        text = value.strip()
        if not text.isdigit():  # (bytes.isdigit: ASCII digits only, so no sign, space or exponent)
            return Malformed("length", f"Content-Length {_show(text)} is not a byte count")
        if len(text) > len(str(max_body)) or int(text) > max_body:
            return Malformed("too large", f"a frame of {_show(text)} bytes (the limit is {max_body})")
        length = int(text)
    if length is None:
        return Malformed("header", f"no Content-Length in {_show(header)}")
    return length


def _show(data: bytes) -> str:
    return repr(data[:60].decode(errors="replace")) + ("…" if len(data) > 60 else "")


async def read_messages(fd: int, deliver: Callable[[Any], None], complain: Callable[[str, str], None]) -> None:
    """Read frames from `fd` until end of file: each body's JSON value goes to `deliver`, each frame
    that cannot be read to `complain(kind, detail)`."""
    chunks = _Chunks(fd)
    frames = Frames()
    while chunk := await chunks.next():
        for item in frames.feed(chunk):
            if isinstance(item, Malformed):
                complain(item.kind, item.detail)
                continue
            try:
                value = json.loads(item)
            except (ValueError, RecursionError) as exc:  # (UnicodeDecodeError is a ValueError)
                at = _next_frame_in(item)
                if at is not None:
                    frames.unread(item[at:])
                complain("json", f"a body that is not JSON ({type(exc).__name__}: {str(exc)[:80]})")
                continue
            deliver(value)


def _next_frame_in(body: bytes) -> int | None:
    """Where the next frame seems to start in a body that is not JSON: at a `Content-Length:` in it,
    or at the start of one that its end cuts short (its length ran into the next frame's header)."""
    at = body.find(MARKER)
    if at >= 0:
        return at
    for size in range(min(len(MARKER) - 1, len(body)), 0, -1):
        if body.endswith(MARKER[:size]):
            return len(body) - size
    return None


class _Chunks:
    """Reads `fd` in a daemon thread, one chunk per `next()`: never more than one chunk ahead."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._wanted = threading.Semaphore(0)
        self._waiting: asyncio.Future[bytes] | None = None
        threading.Thread(target=self._read, name="fuselens-stdin", daemon=True).start()

    async def next(self) -> bytes:
        """The next chunk; b"" at end of file."""
        self._waiting = self._loop.create_future()
        self._wanted.release()
        return await self._waiting

    def _read(self) -> None:
        while True:
            self._wanted.acquire()
            chunk = self._read_chunk()
            try:
                self._loop.call_soon_threadsafe(self._hand_over, chunk)
            except RuntimeError:  # the loop is closed: the server is exiting
                return
            if not chunk:
                return

    def _read_chunk(self) -> bytes:
        while True:
            try:
                return os.read(self._fd, READ_CHUNK)
            except BlockingIOError:  # a non-blocking stdin: wait until it has bytes
                select.select([self._fd], [], [])
            except OSError:
                return b""

    def _hand_over(self, chunk: bytes) -> None:
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_result(chunk)
