"""A model's file as Python reads it, and its bytes after an edit: the same but for the lines that changed.

Python decodes a source file by its byte-order mark or its coding cookie (`# -*- coding: latin-1 -*-`),
UTF-8 otherwise, and takes `\\r\\n`, `\\r` and `\\n` alike as a line's end (`tokenize.open`).  The
analysis and the edits work on that text, every line ending in `\\n`; what is written back keeps every
line that did not change byte for byte, writes the changed ones with the file's own line ending, and
encodes them as the file was encoded (its mark, its cookie's codec), so that `restore` after `apply`
gives back exactly the bytes that were there.
"""

from __future__ import annotations

import difflib
import io
import re
import tokenize
from dataclasses import dataclass

from fuselens.contracts.reading import read_bytes

MAX_SOURCE_BYTES = 64 << 20  # far above any model's source; a larger file of that name is not read
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")  # a line as Python counts them, with its end


class SourceError(ValueError):
    """The file cannot be read as Python source, or the edited text cannot be written in its encoding."""


@dataclass(frozen=True)
class SourceFile:
    path: str
    raw: bytes  # the bytes read
    encoding: str  # as `tokenize.detect_encoding` names it: "utf-8-sig" for a byte-order mark
    lines: tuple[str, ...]  # decoded, each with its own line ending

    @property
    def text(self) -> str:
        """The text Python compiles (and `open()` reads), each line ending in `\\n`."""
        return "".join(_with_newline(line, "\n") for line in self.lines)

    @property
    def newline(self) -> str:
        """The line ending of the file's first line that has one (`\\n` for a file without)."""
        return next((_ending(line) for line in self.lines if _ending(line)), "\n")


def read_source(path: str) -> SourceFile:
    """The file at `path` decoded as Python decodes it.  OSError when it cannot be read (`Unreadable`: not
    a regular file, or past MAX_SOURCE_BYTES); SourceError when its bytes are not text in the encoding
    it declares."""
    return decode_source(path, read_bytes(path, MAX_SOURCE_BYTES))


def decode_source(path: str, raw: bytes) -> SourceFile:
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
        decoded = raw.decode(encoding)
    except (SyntaxError, UnicodeDecodeError, LookupError) as exc:
        raise SourceError(f"cannot read {path} as Python source: {_reason(exc)}") from None
    return SourceFile(path, raw, encoding, tuple(split_lines(decoded)))


def edited_bytes(source: SourceFile, text: str) -> bytes:
    """`text` (the edited `source.text`) as the file's bytes: every line `text` keeps from the source as it
    was read, the others ending as the file's lines do, all in the file's encoding.  SourceError when a
    changed line cannot be written in that encoding."""
    # Both with their last line ended, as `edits.apply_line_edits` ends it: the last line is written
    # back as it was below.
    old = split_lines(_ended(source.text))
    new = split_lines(_ended(text))
    # The lines both ends share are kept without a search: the matcher then sees only the edited middle.
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    out = list(source.lines[:head])
    middle = difflib.SequenceMatcher(None, old[head : len(old) - tail], new[head : len(new) - tail], autojunk=False)
    for tag, i1, i2, j1, j2 in middle.get_opcodes():
        if tag == "equal":
            out += source.lines[head + i1 : head + i2]
        else:
            out += [_with_newline(line, source.newline) for line in new[head + j1 : head + j2]]
    out += source.lines[len(old) - tail :]
    if out and source.lines and not _ending(source.lines[-1]) and out[-1].endswith("\n"):
        out[-1] = _without_ending(out[-1])  # a file that ended without a line ending still does
    try:
        return "".join(out).encode(source.encoding)
    except UnicodeEncodeError as exc:
        changed = exc.object[exc.start : exc.end]
        raise SourceError(
            f"{source.path} is encoded as {source.encoding}, which cannot hold {changed!r}: nothing was written"
        ) from None


def split_lines(text: str) -> list[str]:
    """`text`'s lines as Python counts them (`\\r\\n`, `\\r` or `\\n` ends one; a form feed does not), each
    with its ending."""
    return _LINE.findall(text)


def _ended(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def _ending(line: str) -> str:
    return line[len(line.rstrip("\r\n")) :]


def _without_ending(line: str) -> str:
    return line.rstrip("\r\n")


def _with_newline(line: str, newline: str) -> str:
    """`line` ending in `newline`, or as it is when it has no ending (the file's last line)."""
    return _without_ending(line) + newline if _ending(line) else line


def _reason(exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"{exc.reason} at byte {exc.start} for its encoding {exc.encoding}"
    return str(exc.args[0] if isinstance(exc, SyntaxError) and exc.args else exc)
