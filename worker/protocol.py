"""The pipe protocol between the language server and its worker host: every message, typed.

Newline-delimited JSON, one message per line, in both directions; each message is one of
the dataclasses below in its plain form (`contracts/plain.py`), told apart by its `op`
(server to host) or `event` (host to server).  A line that is not one of them is a
`ContractError`, never silently half-read.  No torch here: the server imports this module.

    server -> host    Run(id, job, limits) | Cancel(id) | Shutdown | Preload(modules)
                      | PreloadImports(path, imports)
    host -> server    Ready(pid, python, torch, startup_ms) | Progress(id, message, fraction)
                      | Done(id, result) | Failed(id, error)

A job is what to run (`AnalyzeJob`, `GenerateJob`, `ValidateJob`, `CompareJob`, `ProfileJob`, `ProbeJob`,
`PingJob`); the result of a
finished job is the plain form of its `result_type()`.  Every line is at most
`MAX_MESSAGE_BYTES` long, either way: a longer one is dropped whole, never half-read.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from fuselens.contracts.inductor import ComparisonResult
from fuselens.contracts.options import AnalyzeOptions, ProfileOptions, ValidateOptions
from fuselens.contracts.plain import ContractError, from_plain, to_plain
from fuselens.contracts.probe import ProbeOptions, ProbeReport
from fuselens.contracts.report import Report
from fuselens.contracts.validation import ValidationReport

# Why a job did not finish.  "internal" is a fuselens bug; "unavailable": the worker could not start.
FailureKind = Literal["timeout", "memory", "crash", "cancelled", "internal", "unavailable"]
FAILURES: tuple[str, ...] = FailureKind.__args__  # type: ignore[attr-defined]


# ---- jobs ------------------------------------------------------------------------------------


@dataclass
class AnalyzeJob:
    """The analysis of a save: everything the diagnostics, hovers, inlay hints, lenses and the quick
    fixes' edits read; its kernels keep no source, its clusters no backward (`GenerateJob`)."""

    path: str
    options: AnalyzeOptions  # `options.source_text` is the editor's buffer
    kind: Literal["analyze"] = "analyze"


@dataclass
class GenerateJob:
    """The analysis with the kernels' code and each cluster's backward, for what reads them: the kernel
    module a quick fix writes, a kernel view."""

    path: str
    options: AnalyzeOptions
    kind: Literal["generate"] = "generate"


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
class ProfileJob:
    """Run the models' forwards under the profiler: the result is the report with its profile."""

    path: str
    options: AnalyzeOptions
    profile: ProfileOptions
    kind: Literal["profile"] = "profile"


@dataclass
class ProbeJob:
    """Run the models on data with every GEMM call sketched: the result is the probe report."""

    path: str
    options: AnalyzeOptions
    probe: ProbeOptions
    kind: Literal["probe"] = "probe"


@dataclass
class Pong:
    pong: bool = True


@dataclass
class PingJob:
    kind: Literal["ping"] = "ping"


Job = AnalyzeJob | GenerateJob | ValidateJob | CompareJob | ProfileJob | ProbeJob | PingJob

_RESULTS: dict[str, type] = {
    "analyze": Report,
    "generate": Report,
    "validate": ValidationReport,
    "compare": ComparisonResult,
    "profile": Report,
    "probe": ProbeReport,
    "ping": Pong,
}


def result_type(job: Job) -> type:
    """The contract a finished `job`'s result is."""
    return _RESULTS[job.kind]


@dataclass
class Limits:
    seconds: float = 60.0  # wall time
    memory_mb: int = 8192  # address space beyond what the warm host already maps


# The limits a job can run under.  A time limit past a day would overflow the host's clock
# arithmetic long before it mattered, and an address space past 1 TiB is no limit at all: a value
# past the most is the most.  Under the least no job can even start: it is refused, saying so.
MIN_SECONDS, MAX_SECONDS = 0.1, 86400.0
MIN_MEMORY_MB, MAX_MEMORY_MB = 256, 2**20  # (a job's torch needs more than 256 MB beyond the host)


@dataclass
class Failure:
    kind: FailureKind
    message: str
    file: str | None = None  # the user's line it happened at, when known
    line: int | None = None
    traceback: str = ""  # for "internal": where fuselens failed


def bounded(limits: Limits) -> Limits | Failure:
    """`limits` with a value past the most clamped to it, or the Failure a job under them gets at once."""
    seconds, memory_mb = limits.seconds, limits.memory_mb
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or math.isnan(seconds):
        return Failure("timeout", f"the time limit {seconds!r} is not a number of seconds")
    if seconds < MIN_SECONDS:
        return Failure(
            "timeout", f"the time limit of {seconds:g} s is too short to run a job in (at least {MIN_SECONDS:g} s)"
        )
    if isinstance(memory_mb, bool) or not isinstance(memory_mb, int):
        return Failure("memory", f"the memory limit {memory_mb!r} is not a whole number of MB")
    if memory_mb < MIN_MEMORY_MB:
        return Failure(
            "memory", f"the memory limit of {memory_mb} MB is too small to run a job in (at least {MIN_MEMORY_MB} MB)"
        )
    return Limits(min(float(seconds), MAX_SECONDS), min(memory_mb, MAX_MEMORY_MB))


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


@dataclass
class Preload:
    """Installed library modules for the host to keep imported (`worker/preload.py`): the jobs it
    forks after that start with them loaded."""

    modules: list[str]
    op: Literal["preload"] = "preload"


@dataclass
class ModuleImport:
    """One import statement of a model's file, as its syntax tree says: `import module`, or
    `from module import names` (what Python imports for either, a lazy package's attributes too)."""

    module: str  # absolute: "transformers", "transformers.models.llama"
    names: list[str] = field(default_factory=list)  # for `from module import ...`; [] for `import module`


@dataclass
class PreloadImports:
    """The imports of the model's file at `path` that name installed packages, for the host to run
    before it forks the file's next job, which then starts with them (`worker/preload.py`).  Unlike
    `Preload`, no job has run them yet: the host imports only packages installed in a site-packages
    folder that the file's own folder does not shadow."""

    path: str
    imports: list[ModuleImport]
    op: Literal["preload_imports"] = "preload_imports"


Request = Run | Cancel | Shutdown | Preload | PreloadImports


# ---- host -> server --------------------------------------------------------------------------


@dataclass
class Ready:
    pid: int
    python: str
    torch: str
    startup_ms: int  # from the host's start to torch imported (its warm-up comes once it is idle)
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

MAX_MESSAGE_BYTES = 32 * 2**20  # one line, newline included: far more than any report needs


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


class Lines:
    """Bytes as they arrive in, whole lines out (without their newline).  A line longer than
    `limit` (newline included) is dropped whole, however it arrives, and counted in `dropped`: what
    the other end writes costs the reader no more memory than that, and never splits a message."""

    def __init__(self, limit: int = MAX_MESSAGE_BYTES) -> None:
        self.limit = limit
        self.dropped = 0
        self._partial = bytearray()
        self._skipping = False  # inside a line already dropped: until its newline

    def feed(self, data: bytes) -> list[bytes]:
        lines, start = [], 0
        while (end := data.find(b"\n", start)) >= 0:
            line = self._partial + data[start:end]
            if not self._skipping and len(line) < self.limit:
                lines.append(bytes(line))
            elif not self._skipping:
                self.dropped += 1
            self._partial.clear()
            self._skipping = False
            start = end + 1
        rest = data[start:]
        if self._skipping:
            return lines
        if len(self._partial) + len(rest) >= self.limit:  # it cannot end within the limit any more
            self._partial.clear()
            self._skipping = True
            self.dropped += 1
        else:
            self._partial += rest
        return lines
