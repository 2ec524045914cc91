"""Positions: the report's 1-based lines to LSP ranges (0-based lines, UTF-16 columns)."""

from __future__ import annotations

import os
from urllib.parse import quote, unquote, urlparse

from lsprotocol import types as lsp

from fuselens.contracts.report import Model, SourceRef


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def line_text(lines: list[str], line: int) -> str:
    return lines[line - 1] if 0 < line <= len(lines) else ""


def lines_range(lines: list[str], first: int, last: int) -> lsp.Range:
    """From the first non-blank character of `first` to the end of `last` (1-based lines)."""
    first = max(1, min(first, max(len(lines), 1)))
    last = max(first, min(last, max(len(lines), 1)))
    start_text = line_text(lines, first)
    indent = utf16_len(start_text[: len(start_text) - len(start_text.lstrip())])
    return lsp.Range(lsp.Position(first - 1, indent), lsp.Position(last - 1, utf16_len(line_text(lines, last))))


def end_of_line(lines: list[str], line: int) -> lsp.Position:
    return lsp.Position(max(line - 1, 0), utf16_len(line_text(lines, line)))


def path_to_uri(path: str) -> str:
    return "file://" + quote(os.path.abspath(path))


def uri_to_path(uri: str) -> str | None:
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        return None
    path = unquote(parsed.path)
    return path if "\0" not in path else None  # no file has such a name, and os calls raise on it


def same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def shown_at(
    file: str, lines: list[int], reached_from: SourceRef | None, model: Model, path: str
) -> tuple[int, int] | None:
    """The lines of the document at `path` an item of `model` shows on: its own lines when its code is in
    this file; else the line here that reaches it (its code is a library's, or in another file of the
    user's); else, for a model whose forward is not in this file at all, the model's own line.  None
    when the item does not show in this document."""
    if file and same_file(file, path):
        return lines[0], lines[1]
    if reached_from is not None:
        return (reached_from.line, reached_from.line) if same_file(reached_from.file, path) else None
    if same_file(model.file, path):
        return model.line, model.line
    return None
