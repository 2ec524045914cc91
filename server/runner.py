"""The remote runner: validation (or a profile) on a GPU elsewhere, through a command line the user
configures.

`remoteRunner` is a template such as "ssh gpu fuselens validate {file} --json {json}" (and
`remoteProfiler` one such as "ssh gpu fuselens profile {file} --json {json}"): `{file}`
becomes the model's path and `{json}` a file for the runner's result (without `{json}`, its
standard output must be the result).  The template is checked before anything runs, split
into words as a shell would split it, and each word filled in (`runner_template.py`); the words
are then executed directly, never by a shell, so a path is always exactly one argument whatever
characters it holds.  (A runner that needs a pipe or a redirection says so itself:
`sh -c '...' _ {file}`.)

Like the worker, the runner gets a scrubbed environment (no tokens or credentials), a wall-time
limit (`worker.validateTimeoutSeconds`), and its own process group, which is killed at that
limit, when the validation is cancelled, and when the server shuts down or exits.  Only the
last `OUTPUT_KEPT_BYTES` of what it prints are kept, and progress shows its latest line a few
times a second at most, however much it prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import tempfile
from collections.abc import Callable

from fuselens.contracts.plain import ContractError, from_plain
from fuselens.contracts.report import Report
from fuselens.contracts.validation import ValidationReport

from .runner_template import command_line, template_problem
from .workers import scrubbed_environment

OUTPUT_KEPT_BYTES = 1 << 20  # the runner's last output: its result (without {json}) and the failure message
RESULT_MAX_BYTES = 64 << 20  # a result file larger than this is not a validation report
PROGRESS_INTERVAL = 0.25  # seconds between progress reports of the runner's output
READ_CHUNK = 1 << 16

# The socket through which ssh reaches the user's loaded keys: a path, not a secret itself.
_RUNNER_ENVIRONMENT = ("SSH_AUTH_SOCK",)


class RemoteFailed(Exception):
    def __init__(self, message: str, kind: str = "remote"):
        super().__init__(message)
        self.kind = kind


def runner_environment() -> dict[str, str]:
    env = scrubbed_environment()
    env.update({k: os.environ[k] for k in _RUNNER_ENVIRONMENT if k in os.environ})
    return env


class RemoteRunners:
    """The runners in flight, so that the server can kill them all when it shuts down or exits."""

    def __init__(self) -> None:
        self.running: set[asyncio.subprocess.Process] = set()

    async def validate(
        self, template: str, path: str, seconds: float, report: Callable[[str], None]
    ) -> ValidationReport:
        """Run the runner for `path` and read its validation report; RemoteFailed if it cannot be run,
        runs past `seconds`, or gives no report."""
        result = await self._run(template, path, seconds, report, ValidationReport, "validation")
        assert isinstance(result, ValidationReport)
        return result

    async def profile(self, template: str, path: str, seconds: float, report: Callable[[str], None]) -> Report:
        """Run the profiler for `path` and read its report (with its profile section), as `validate` does."""
        result = await self._run(template, path, seconds, report, Report, "profile")
        assert isinstance(result, Report)
        return result

    async def _run(
        self, template: str, path: str, seconds: float, report: Callable[[str], None], result_type: type, kind: str
    ) -> object:
        problem = template_problem(template, "remoteRunner" if kind == "validation" else "remoteProfiler")
        if problem is not None:
            raise RemoteFailed(problem, "settings")
        with tempfile.TemporaryDirectory(prefix="fuselens-remote-") as tmp:
            result_path = os.path.join(tmp, f"{kind}.json")
            argv = command_line(template, path, result_path)
            proc = await self._start(argv)
            try:
                output, code = await self._finish(proc, seconds, report)
            finally:  # done, failed, timed out or cancelled: nothing of it is left running
                self._kill(proc)
                self.running.discard(proc)
                await proc.wait()
            what = "a validation report" if kind == "validation" else "a report with a profile"
            return _result(result_path if "{json}" in template else None, output, code, result_type, what)

    async def _start(self, argv: list[str]) -> asyncio.subprocess.Process:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,  # the server's stdin is the editor's LSP stream
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=runner_environment(),
                start_new_session=True,  # its own process group: killed whole, never the server's
            )
        except OSError as exc:
            raise RemoteFailed(f"the remote runner {argv[0]!r} cannot be started: {exc.strerror or exc}") from None
        self.running.add(proc)
        return proc

    async def _finish(
        self, proc: asyncio.subprocess.Process, seconds: float, report: Callable[[str], None]
    ) -> tuple[bytes, int]:
        """The runner's last output and exit status, once it has exited; RemoteFailed past `seconds`."""
        output = _Tail(OUTPUT_KEPT_BYTES)
        try:
            async with asyncio.timeout(seconds):
                await _relay(proc, output, report)
                code = await proc.wait()
        except TimeoutError:
            last = _last_lines(output.last())
            raise RemoteFailed(
                f"the remote runner did not finish within {seconds:g} s (worker.validateTimeoutSeconds); "
                "it was stopped" + (f". Its last output: {last}" if last else ""),
                "timeout",
            ) from None
        return output.last(), code

    def _kill(self, proc: asyncio.subprocess.Process) -> None:
        """Kill the runner's whole process group (what it started too), if any of it is left."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def kill_all(self) -> None:
        for proc in list(self.running):
            self._kill(proc)


async def _relay(proc: asyncio.subprocess.Process, output: _Tail, report: Callable[[str], None]) -> None:
    """Read the runner's output to its end, keeping its tail and reporting its latest line now and then."""
    assert proc.stdout is not None
    loop = asyncio.get_running_loop()
    reported = float("-inf")
    while chunk := await proc.stdout.read(READ_CHUNK):
        output.add(chunk)
        now = loop.time()
        if now - reported >= PROGRESS_INTERVAL:
            line = _last_lines(output.last(4096), 1)
            if line:
                report(line[-120:])
            reported = now


def _result(result_path: str | None, output: bytes, code: int, result_type: type, what: str) -> object:
    try:
        if result_path is not None and os.path.exists(result_path):
            with open(result_path, "rb") as fh:
                data = fh.read(RESULT_MAX_BYTES + 1)
            if len(data) > RESULT_MAX_BYTES:
                raise ValueError("too large")
        else:
            data = output
        return from_plain(result_type, json.loads(data), "the remote runner's result")
    except (ValueError, RecursionError, ContractError):
        raise RemoteFailed(f"the remote runner exited {code} without {what}: {_last_lines(output)}") from None


def _last_lines(output: bytes, count: int = 5) -> str:
    lines = [line.strip() for line in output.decode(errors="replace").splitlines() if line.strip()]
    return " / ".join(lines[-count:])[-1000:]


class _Tail:
    """The last `size` bytes of a stream (trimmed only when twice that, so each byte is copied about once)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data = bytearray()

    def add(self, chunk: bytes) -> None:
        self._data += chunk
        if len(self._data) > 2 * self.size:
            del self._data[: -self.size]

    def last(self, size: int | None = None) -> bytes:
        return bytes(self._data[-min(size or self.size, self.size) :])
