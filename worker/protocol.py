"""The pipe protocol between the language server and its worker host: every message, typed.

Newline-delimited JSON, one message per line, in both directions; each message is one of
the dataclasses below in its plain form (`contracts/plain.py`), told apart by its `op`
(server to host) or `event` (host to server).  A line that is not one of them is a
`ContractError`, never silently half-read.  No torch here: the server imports this module.

    server -> host    Run(id, job, limits) | Cancel(id) | Shutdown
    host -> server    Ready(pid, python, torch, warmup_ms) | Progress(id, message, fraction)
                      | Done(id, result) | Failed(id, error)

A job is what to run (`AnalyzeJob`, `ValidateJob`, `CompareJob`, `PingJob`); the result of a
finished job is the plain form of its `result_type()`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from fuselens.contracts.inductor import ComparisonResult
from fuselens.contracts.options import AnalyzeOptions, ValidateOptions
from fuselens.contracts.plain import ContractError, from_plain, to_plain
from fuselens.contracts.report import Report
from fuselens.contracts.validation import ValidationReport

# Why a job did not finish.  "internal" is a fuselens bug; "unavailable": the worker could not start.
FailureKind = Literal["timeout", "memory", "crash", "cancelled", "internal", "unavailable"]
FAILURES: tuple[str, ...] = FailureKind.__args__  # type: ignore[attr-defined]


# ---- jobs ------------------------------------------------------------------------------------


@dataclass
class AnalyzeJob:
    path: str
    options: AnalyzeOptions  # `options.source_text` is the editor's buffer
    kind: Literal["analyze"] = "analyze"


@dataclass
class ValidateJob:
    path: str
    options: AnalyzeOptions
    validate: ValidateOptions
    kind: Literal["validate"] = "validate"


@dataclass
class CompareJob:
    """Compile the models with torch.compile and compare its kernels with our clusters."""

    path: str
    options: AnalyzeOptions
    kind: Literal["compare"] = "compare"


@dataclass
class Pong:
    pong: bool = True


@dataclass
class PingJob:
    kind: Literal["ping"] = "ping"


Job = AnalyzeJob | ValidateJob | CompareJob | PingJob

_RESULTS: dict[str, type] = {"analyze": Report, "validate": ValidationReport, "compare": ComparisonResult, "ping": Pong}


def result_type(job: Job) -> type:
    """The contract a finished `job`'s result is."""
    return _RESULTS[job.kind]


@dataclass
class Limits:
    seconds: float = 60.0  # wall time
    memory_mb: int = 8192  # address space beyond what the warm host already maps


@dataclass
class Failure:
    kind: FailureKind
    message: str
    file: str | None = None  # the user's line it happened at, when known
    line: int | None = None
    traceback: str = ""  # for "internal": where fuselens failed


# ---- server -> host --------------------------------------------------------------------------


@dataclass
class Run:
    id: int
    job: Job
    limits: Limits = field(default_factory=Limits)
    op: Literal["run"] = "run"


@dataclass
class Cancel:
    id: int
    op: Literal["cancel"] = "cancel"


@dataclass
class Shutdown:
    op: Literal["shutdown"] = "shutdown"


Request = Run | Cancel | Shutdown


# ---- host -> server --------------------------------------------------------------------------


@dataclass
class Ready:
    pid: int
    python: str
    torch: str
    warmup_ms: int
    event: Literal["ready"] = "ready"


@dataclass
class Progress:
    id: int
    message: str
    fraction: float | None = None
    event: Literal["progress"] = "progress"


@dataclass
class Done:
    id: int
    result: dict[str, Any]  # the plain form of the job's result_type()
    event: Literal["done"] = "done"


@dataclass
class Failed:
    id: int
    error: Failure
    event: Literal["failed"] = "failed"


Event = Ready | Progress | Done | Failed


# ---- the wire --------------------------------------------------------------------------------


def encode(message: Request | Event) -> bytes:
    return (json.dumps(to_plain(message), separators=(",", ":")) + "\n").encode()


def decode_request(line: bytes | str) -> Request:
    """A server -> host line; ContractError if it is not one."""
    return from_plain(Request, _json(line), "request")  # type: ignore[arg-type]


def request_id(line: bytes | str) -> int | None:
    """The `id` a line that is not a valid request still carries, if any (to answer it with a failure)."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    job_id = data.get("id") if isinstance(data, dict) else None
    return job_id if isinstance(job_id, int) and not isinstance(job_id, bool) else None


def decode_event(line: bytes | str) -> Event:
    """A host -> server line; ContractError if it is not one."""
    return from_plain(Event, _json(line), "event")  # type: ignore[arg-type]


def _json(line: bytes | str) -> Any:
    try:
        return json.loads(line)
    except ValueError as exc:
        raise ContractError(f"not a JSON message: {exc}") from None
