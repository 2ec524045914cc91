"""The last analysis of each file, kept in the user's cache folder, so that a file opened again in a
new editor session shows its diagnostics at once instead of after the worker's start.

A new server's first analysis pays for the worker host starting (importing torch) and for the
model's own imports: seconds for a transformers model on a laptop.  When the file's text, the
settings it is analyzed with and the version of fuselens are those of a kept analysis, and the files
its clusters' code lies in (the user's other modules, a library's modeling code) have not changed
since, that analysis is shown while the file is analyzed again; the new analysis then replaces it,
as a save's does.  So what is kept only ever shows early what the analysis is about to show.

One JSON file per analyzed file, `<cache>/analyses/<name>-<digest of its resolved path>.json`, read
only as data (JSON, then the report contract's checks): one that is corrupt, too large, of another
format or about another file is skipped with a log line.  At most `KEPT_FILES` files are kept, the
least recently written dropped first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

from fuselens.contracts.folders import user_cache_folder
from fuselens.contracts.plain import ContractError
from fuselens.contracts.reading import read_bytes
from fuselens.contracts.report import Report
from fuselens.contracts.version import TOOL_VERSION

from .cache_files import write_json

FORMAT = 1  # of the file around the report (the report has its own schema version)
MAX_BYTES = 32 << 20  # far above the report of any model; a larger file is not ours
KEPT_FILES = 256  # files analyzed, over every project of the user

Log = Callable[[str], None]


def entry_path(file: str) -> str:
    """Where the last analysis of `file` (any spelling of its path) is kept."""
    real = os.path.realpath(file)
    digest = hashlib.sha256(real.encode()).hexdigest()[:16]
    return os.path.join(user_cache_folder(), "analyses", f"{os.path.basename(real)}-{digest}.json")


def store(file: str, text: str, settings: str, report: Report, log: Log) -> None:
    """Keep `report`, the analysis of `text` as `file`'s content with `settings`.  Only an analysis
    that reached its models is kept: a failure is quick to find again, and showing an old one would
    only mislead.  A file that cannot be written is logged, not raised."""
    if not report.models or report.problems:
        return
    entry = {
        "format": FORMAT,
        "file": os.path.realpath(file),
        "text_sha256": _digest(text),
        "settings": settings,
        "tool_version": TOOL_VERSION,
        "sources": _stamps(_code_files(report, file)),
        "report": report.to_dict(),
    }
    try:
        write_json(entry_path(file), entry, "analysis")
    except (OSError, ValueError) as exc:
        log(f"last analysis of {os.path.basename(file)} not kept: {exc}")
        return
    _drop_oldest(os.path.dirname(entry_path(file)))


def load(file: str, text: str, settings: str, log: Log) -> Report | None:
    """The kept analysis of `file`, if it is of `text` with `settings`, by this fuselens, and the files
    its clusters' code lies in are as they were; None otherwise."""
    path = entry_path(file)
    try:
        data = json.loads(read_bytes(path, MAX_BYTES))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # (Unreadable and UnicodeDecodeError are among them)
        log(f"last analysis {path} skipped: {exc}")
        return None
    problem = _not_ours(data, os.path.realpath(file))
    if problem:
        log(f"last analysis {path} skipped: {problem}")
        return None
    if data["text_sha256"] != _digest(text) or data["settings"] != settings:
        return None  # another text or other settings: nothing to show before the analysis
    if data["tool_version"] != TOOL_VERSION or data["sources"] != _stamps(list(data["sources"])):
        return None  # fuselens, or the code the clusters are in, changed since
    try:
        return Report.from_dict(data["report"])
    except ContractError as exc:
        log(f"last analysis {path} skipped: {exc}")
        return None


def _not_ours(data: Any, real: str) -> str:
    """Why `data` is not a kept analysis of the file at `real` ("" when it is)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return "not a kept analysis of this format"
    if data.get("file") != real:
        return f"it is the analysis of {data.get('file')!r}"
    for key in ("text_sha256", "settings", "tool_version"):
        if not isinstance(data.get(key), str):
            return f"no {key}"
    sources = data.get("sources")
    if not isinstance(sources, dict) or not all(isinstance(k, str) for k in sources):
        return "no sources"
    return ""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _code_files(report: Report, file: str) -> list[str]:
    """The files, other than `file`, that the report's clusters' code lies in."""
    own = os.path.realpath(file)
    found = {
        name
        for _, cluster in report.clusters()
        for name in [cluster.file, *(op.file for op in cluster.ops)]
        if name and os.path.realpath(name) != own
    }
    return sorted(found)


def _stamps(files: list[str]) -> dict[str, list[int]]:
    """Each file's modification time and size ([-1, -1] for one that is gone)."""
    stamps = {}
    for name in files:
        try:
            st = os.stat(name)
            stamps[name] = [st.st_mtime_ns, st.st_size]
        except OSError:
            stamps[name] = [-1, -1]
    return stamps


def _drop_oldest(folder: str) -> None:
    """Keep the KEPT_FILES most recently written analyses of the folder."""
    with contextlib.suppress(OSError):
        entries = [e for e in os.scandir(folder) if e.name.endswith(".json") and e.is_file(follow_symlinks=False)]
        if len(entries) <= KEPT_FILES:
            return
        entries.sort(key=lambda e: e.stat(follow_symlinks=False).st_mtime_ns)
        for entry in entries[: len(entries) - KEPT_FILES]:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
