"""How the report's quantities read to a person: one spelling for the CLI and the editor."""

from __future__ import annotations

import os
from collections.abc import Iterable

from .report import Library


def bytes_label(n: int | None) -> str:
    """`402653184` -> "384 MB"; None (a cost that cannot be known) -> "unknown"."""
    if n is None:
        return "unknown"
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value >= 100 or value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


def in_library(path: str, libraries: Iterable[Library]) -> bool:
    """Whether `path` is a file of one of the installed `libraries` (a report's)."""
    return library_path(path, libraries) != path


def library_path(path: str, libraries: Iterable[Library]) -> str:
    """An installed library's file as people name it, from the package down
    (".../site-packages/transformers/models/llama/modeling_llama.py" -> "transformers/models/llama/modeling_llama.py",
    wherever the library was installed); any other path unchanged."""
    for library in libraries:
        root = library.root.rstrip("/\\")
        for sep in {os.sep, "/"}:
            if path.startswith(root + sep + library.name + sep) or path == root + sep + library.name + ".py":
                return path[len(root) + 1 :].replace(os.sep, "/")
    return path
