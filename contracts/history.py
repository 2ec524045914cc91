"""Earlier validations of a file: what each run kept, so that the results view can set the latest
beside the runs before it.  Stored in the user's cache folder by `server/history.py`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from .validation import ClusterCheck, ValidationReport

HISTORY_SCHEMA_VERSION = 1
HISTORY_LIMIT = 20  # runs kept per file, the oldest dropped first


@dataclass
class ValidationRun:
    """One validation of a file, as its history keeps it."""

    time: str  # when it finished, ISO 8601 in UTC ("2025-01-31T12:03:04Z")
    device: str  # the report's device ("NVIDIA H200", "cpu")
    report: ValidationReport
    revision: str | None = None  # the commit checked out in the file's git repository, if it is in one
    versions: dict[str, str] = field(default_factory=dict)  # torch, triton (those the report names)


def unrecorded(report: ValidationReport) -> ValidationRun:
    """`report` as a run that no history keeps (one that checked nothing, say): no time, no revision."""
    return ValidationRun(time="", device=report.device, report=report, versions=dict(report.versions))


def run_label(run: ValidationRun) -> str:
    """A run as the history table and the chart's legend name it: "2025-01-31 12:03 UTC"."""
    try:
        when = datetime.fromisoformat(run.time.replace("Z", "+00:00"))
    except ValueError:
        return run.time or "unrecorded"
    return when.strftime("%Y-%m-%d %H:%M UTC")


def headline(check: ClusterCheck | None) -> str:
    """A cluster's one number for comparing runs: its fused GPU time where it was timed, else its
    largest error, else its status ("—" when the run did not check it); a status other than verified
    follows the number."""
    if check is None:
        return "—"
    flag = "" if check.status == "verified" else f" ({check.status})"
    if check.timing is not None and check.timing.fused_us is not None:
        return f"{check.timing.fused_us:.1f} µs{flag}"
    if check.max_abs is not None and math.isfinite(check.max_abs):
        return f"err {check.max_abs:.1e}{flag}"
    return check.status
