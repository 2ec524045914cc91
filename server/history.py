"""Each file's validation history, kept in the user's cache folder so that the results view can set a
validation beside the runs of the same file before it.

One JSON file per validated file, `<cache>/history/<name>-<digest of its resolved path>.json`, holding
the last `HISTORY_LIMIT` runs (`contracts/history.py`); never anything in the project.  A history
file is only ever read as data (JSON, then the contract's checks): one that is corrupt, cut short,
too large, of another schema or about another file is skipped with a log line, and the next run
starts it afresh.  Writes never leave half a file (`cache_files.py`).  The editor's server and `fuselens validate` keep the same histories.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fuselens.contracts.folders import user_cache_folder
from fuselens.contracts.history import HISTORY_LIMIT, HISTORY_SCHEMA_VERSION, ValidationRun, unrecorded
from fuselens.contracts.plain import ContractError, from_plain, to_plain
from fuselens.contracts.reading import read_bytes
from fuselens.contracts.training import MeasuredTraining, measured_training
from fuselens.contracts.validation import ValidationReport

from .cache_files import write_json
from .git import head_revision

MAX_HISTORY_BYTES = 16 << 20  # far above HISTORY_LIMIT runs of any model; a larger file is not ours

Log = Callable[[str], None]


def history_path(file: str) -> str:
    """Where the history of `file` (any spelling of its path) is kept."""
    real = os.path.realpath(file)
    digest = hashlib.sha256(real.encode()).hexdigest()[:16]
    return os.path.join(user_cache_folder(), "history", f"{os.path.basename(real)}-{digest}.json")


def load(file: str, log: Log) -> list[ValidationRun]:
    """The runs kept for `file`, oldest first; none when there is no history, or none that can be read."""
    path = history_path(file)
    try:
        raw = read_bytes(path, MAX_HISTORY_BYTES)
    except FileNotFoundError:
        return []
    except OSError as exc:  # (Unreadable is one: a FIFO, a file past MAX_HISTORY_BYTES)
        log(f"validation history {path} skipped: {exc}")
        return []
    try:
        data = json.loads(raw)
    except ValueError as exc:  # (UnicodeDecodeError is one)
        log(f"validation history {path} skipped: not JSON ({exc})")
        return []
    problem = _not_ours(data, os.path.realpath(file))
    if problem:
        log(f"validation history {path} skipped: {problem}")
        return []
    return _runs(data["runs"], path, log)


def measured(file: str, log: Log) -> list[MeasuredTraining]:
    """The latest training measurement of each cluster of `file` its history keeps
    (`contracts/training.py`), which a fix's kernel module is written with.  Read again only when the
    history file changed: a fix, a hover's kernel and every request that asks for the kernels' code
    asks."""
    try:
        st = os.stat(history_path(file))
    except OSError:
        return []
    stamp = (history_path(file), st.st_mtime_ns, st.st_size)
    if _MEASURED.get(file, (None, []))[0] != stamp:
        _MEASURED[file] = (stamp, measured_training(load(file, log)))
    return list(_MEASURED[file][1])


_MEASURED: dict[
    str, tuple[tuple[str, int, int] | None, list[MeasuredTraining]]
] = {}  # file -> (history stamp, measured)


def record(
    file: str, report: ValidationReport, log: Log, now: datetime | None = None
) -> tuple[ValidationRun, list[ValidationRun]]:
    """Append `report` to `file`'s history, the oldest runs beyond HISTORY_LIMIT dropped; returns this
    run and the runs kept before it (oldest first).  A report that checked nothing (no GPU here, a
    file that did not load) is not kept.  A history that cannot be written is logged, not raised: the
    validation's result stands without it."""
    earlier = load(file, log)
    if not report.models:
        return unrecorded(report), earlier
    run = ValidationRun(
        time=_iso(now or datetime.now(UTC)),
        device=report.device,
        report=report,
        revision=head_revision(file),
        versions={k: v for k, v in report.versions.items() if k in ("torch", "triton")},
    )
    kept = [*earlier, run][-HISTORY_LIMIT:]
    try:
        header = {"schema_version": HISTORY_SCHEMA_VERSION, "file": os.path.realpath(file)}
        _write(history_path(file), header, kept)
    except OSError as exc:
        log(f"validation history of {os.path.basename(file)} not written: {exc}")
    return run, kept[:-1]


def _not_ours(data: Any, real: str) -> str:
    """Why `data` is not a history of the file at `real` ("" when it is)."""
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        return "not a validation history"
    if data.get("schema_version") != HISTORY_SCHEMA_VERSION:
        return f"schema version {data.get('schema_version')!r}, not {HISTORY_SCHEMA_VERSION}"
    if data.get("file") != real:
        return f"it is the history of {data.get('file')!r}"
    return ""


def _runs(entries: list[Any], path: str, log: Log) -> list[ValidationRun]:
    """The entries that read as runs; each other one skipped, with a line saying why."""
    runs = []
    for i, entry in enumerate(entries):
        try:
            runs.append(from_plain(ValidationRun, entry, f"runs[{i}]"))
        except ContractError as exc:
            log(f"validation history {path}: skipped a run: {exc}")
    return runs


def _write(path: str, header: dict[str, Any], runs: list[ValidationRun]) -> None:
    write_json(path, {**header, "runs": to_plain(runs)}, "history")


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
