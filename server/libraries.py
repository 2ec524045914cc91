"""The library modules an analysis found a model's code in: what the worker host keeps imported.

Jobs are forks of the warm worker host, and each imported a model's library (transformers' Llama:
seconds of CPU) afresh, on every save; the host imports what the server names here once
(`worker/preload.py`), and the jobs forked after that start with it.
"""

from __future__ import annotations

import os

from fuselens.contracts.report import Report


def library_modules(report: Report) -> list[str]:
    """The import names of the installed libraries' files that hold the report's clusters' ops, in
    the order they come ("transformers.models.llama.modeling_llama")."""
    found: dict[str, None] = {}
    for _, cluster in report.clusters():
        for file in [cluster.file, *(op.file for op in cluster.ops)]:
            name = _module_name(report, file)
            if name:
                found[name] = None
    return list(found)


def _module_name(report: Report, file: str) -> str:
    """The import name of `file` in one of the report's libraries ("" in none)."""
    for library in report.libraries:
        package = os.path.join(library.root, library.name)
        if not file.startswith(package + os.sep) or not file.endswith(".py"):
            continue
        parts = os.path.relpath(file[: -len(".py")], library.root).split(os.sep)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)
    return ""
