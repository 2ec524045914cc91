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

Like the worker, the runner gets a scrubbed environment (no tokens or credentials) and a wall-time
limit (`worker.validateTimeoutSeconds`).  It runs under a reaper (`worker/reaper.py`, with the
server's interpreter), a subreaper that keeps whatever the runner starts below it however it
detaches, and kills all of it when the runner exits, when the server tells it to stop (SIGTERM: at
the limit, when the validation is cancelled, when the server shuts down or exits) and when the
server dies.  At the limit the server stops reading the runner's output at once: a process that
kept the pipe open cannot hold the answer back.  Only the last `OUTPUT_KEPT_BYTES` of what the
runner prints are kept, and progress shows its latest line a few times a second at most, however
much it prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from fuselens.contracts.plain import ContractError, from_plain
from fuselens.contracts.reading import read_bytes
from fuselens.contracts.report import Report
from fuselens.contracts.validation import ValidationReport

from .host_process import scrubbed_environment
from .runner_template import command_line, template_problem

REAPER = "fuselens.worker.reaper"
OUTPUT_KEPT_BYTES = 1 << 20  # the runner's last output: its result (without {json}) and the failure message
RESULT_MAX_BYTES = 64 << 20  # a result file larger than this is not a validation report
PROGRESS_INTERVAL = 0.25  # seconds between progress reports of the runner's output
READ_CHUNK = 1 << 16
STOP_GRACE = 5.0  # seconds a reaper told to stop gets to kill what is below it (its sweep gives up after 2)
NOTE_MAX_BYTES = 4096  # the reaper's own message: why the runner could not be started

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


@dataclass
class _Runner:
    """A runner in flight: the reaper it runs under, and the server's ends of their pipes."""

    reaper: asyncio.subprocess.Process
    output: asyncio.StreamReader  # the runner's standard output and error
    output_pipe: asyncio.ReadTransport
    note: int  # the reaper's own standard error: why the runner could not be started
    why_not_started: str = ""


class RemoteRunners:
    """The runners in flight, so that the server can stop them all when it shuts down or exits."""

    def __init__(self) -> None:
        self.running: set[asyncio.subprocess.Process] = set()  # their reapers

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
            runner = await self._start(argv)
            try:
                output, code = await self._finish(runner, seconds, report)
            finally:  # done, failed, timed out or cancelled: nothing of it is left running
                await self._stop(runner)
            if runner.why_not_started:
                raise RemoteFailed(f"the remote runner {argv[0]!r} cannot be started: {runner.why_not_started}")
            what = "a validation report" if kind == "validation" else "a report with a profile"
            return _result(result_path if "{json}" in template else None, output, code, result_type, what)

    async def _start(self, argv: list[str]) -> _Runner:
        """The runner, started under its reaper; the server keeps only the read ends of their pipes."""
        output_read, output_write = os.pipe()
        note_read, note_write = os.pipe()
        try:
            reaper = await asyncio.create_subprocess_exec(
                sys.executable,
                "-P",
                "-m",
                REAPER,
                str(os.getpid()),
                _working_directory(),  # the runner's: where the server runs, as a command the user types
                *argv,
                stdin=asyncio.subprocess.DEVNULL,  # the server's stdin is the editor's LSP stream
                stdout=output_write,
                stderr=note_write,
                env=runner_environment(),
                cwd="/",  # the reaper's: nothing in the folder the server runs in can shadow its imports
                start_new_session=True,  # a session of its own: the editor's signals are not the runner's
            )
        except OSError as exc:
            os.close(output_read)
            os.close(note_read)
            raise RemoteFailed(f"the remote runner cannot be started: {exc.strerror or exc}") from None
        finally:
            os.close(output_write)
            os.close(note_write)
        self.running.add(reaper)
        output = asyncio.StreamReader()
        pipe, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(output), os.fdopen(output_read, "rb", buffering=0)
        )
        return _Runner(reaper, output, pipe, note_read)

    async def _finish(self, runner: _Runner, seconds: float, report: Callable[[str], None]) -> tuple[bytes, int]:
        """The runner's last output and exit status, once it has exited; RemoteFailed past `seconds`."""
        output = _Tail(OUTPUT_KEPT_BYTES)
        try:
            async with asyncio.timeout(seconds):
                await _relay(runner.output, output, report)
                code = await runner.reaper.wait()
        except TimeoutError:
            last = _last_lines(output.last())
            raise RemoteFailed(
                f"the remote runner did not finish within {seconds:g} s (worker.validateTimeoutSeconds); "
                "it was stopped" + (f". Its last output: {last}" if last else ""),
                "timeout",
            ) from None
        return output.last(), code

    async def _stop(self, runner: _Runner) -> None:
        """Stop reading the runner's output (whoever still holds the pipe), have its reaper kill
        everything below it, and wait for that, within STOP_GRACE."""
        runner.output_pipe.close()
        reaper = runner.reaper
        try:
            _signal(reaper, signal.SIGTERM)
            try:
                async with asyncio.timeout(STOP_GRACE):
                    await reaper.wait()
            except TimeoutError:  # a reaper stopped (SIGSTOP) or stuck: it goes, whatever it left
                _signal(reaper, signal.SIGKILL)
                await reaper.wait()
            runner.why_not_started = _read_note(runner.note)
        finally:
            self.running.discard(reaper)
            os.close(runner.note)

    def kill_all(self) -> None:
        """Tell every reaper to stop (the server is exiting): each kills what is below it by itself."""
        for reaper in list(self.running):
            _signal(reaper, signal.SIGTERM)


def _signal(reaper: asyncio.subprocess.Process, signum: int) -> None:
    """Send `signum` to a reaper that has not been reaped (its pid cannot have gone to another)."""
    if reaper.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            reaper.send_signal(signum)


def _working_directory() -> str:
    try:
        return os.getcwd()
    except OSError:  # removed since the server started
        return "/"


def _read_note(fd: int) -> str:
    """The last line the reaper wrote on its standard error, once it has exited (never blocks): why
    it could not start the runner, or, were the reaper itself to fail, its error's last line."""
    os.set_blocking(fd, False)
    try:
        lines = os.read(fd, NOTE_MAX_BYTES).decode(errors="replace").strip().splitlines()
    except BlockingIOError:
        return ""
    return lines[-1].strip() if lines else ""


async def _relay(stream: asyncio.StreamReader, output: _Tail, report: Callable[[str], None]) -> None:
    """Read the runner's output to its end, keeping its tail and reporting its latest line now and then."""
    loop = asyncio.get_running_loop()
    reported = float("-inf")
    while chunk := await stream.read(READ_CHUNK):
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
            data = read_bytes(result_path, RESULT_MAX_BYTES)  # (Unreadable past the bound, or for a FIFO)
        else:
            data = output
        return from_plain(result_type, json.loads(data), "the remote runner's result")
    except (OSError, ValueError, RecursionError, ContractError):
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
