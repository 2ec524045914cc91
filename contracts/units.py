"""How the report's quantities read to a person: one spelling for the CLI and the editor."""

from __future__ import annotations

import os


def bytes_label(n: int | None) -> str:
    """`402653184` -> "384 MB"; None (a cost that cannot be known) -> "unknown"."""
    if n is None:
        return "unknown"
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value >= 100 or value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


def in_library(path: str) -> bool:
    """Whether `path` is a file of an installed library (under site-packages)."""
    return library_path(path) != path


def library_path(path: str) -> str:
    """An installed library's file as people name it, from the package down
    (".../site-packages/transformers/models/llama/modeling_llama.py" -> "transformers/models/llama/modeling_llama.py");
    any other path unchanged."""
    for marker in ("site-packages", "dist-packages"):
        _, sep, tail = path.rpartition(os.sep + marker + os.sep)
        if sep:
            return tail
    return path
