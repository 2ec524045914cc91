"""The server's side of the worker host: start it, send it jobs, relay progress, restart it.

The host (`fuselens.worker.host`, started by `host_process.py`) runs in the user's interpreter
with a scrubbed environment.  If it dies, every job in flight fails with a clear error and the
next job starts a fresh host.

The host leads a session of its own.  It kills what its jobs start; when it cannot (it was
killed, or stopped answering), the server kills whatever is left in that session.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from fuselens.contracts.plain import ContractError, from_plain
from fuselens.contracts.probe import ProbeReport
from fuselens.contracts.report import Report
from fuselens.worker.protocol import (
    MAX_MESSAGE_BYTES,
    Cancel,
    Done,
    Event,
    Failed,
    Failure,
    Job,
    Limits,
    Lines,
    ModuleImport,
    Preload,
    Progress,
    Ready,
    Request,
    Run,
    Shutdown,
    bounded,
    decode_event,
    encode,
    result_type,
)

from .host_imports import ImportRequests
from .host_process import start_host

READY_TIMEOUT = 180.0  # importing torch on a cold disk can be slow
HOST_GRACE = 10.0  # seconds past a job's time limit after which the host, which enforces it, is presumed wedged
TERM_GRACE = 2.0  # seconds a host given up on gets to kill its jobs' processes itself
LOG_LINE_BYTES = 1 << 16  # a longer line on the host's stderr is dropped, not logged


class JobFailed(Exception):
    def __init__(self, error: Failure):
        super().__init__(error.message or "the job failed")
        self.error = error

    @property
    def kind(self) -> str:
        return self.error.kind


class WorkerClient:
    def __init__(self, python: str | None = None, log: Callable[[str], None] = lambda _: None):
        self.python = python or sys.executable
        self.log = log
        self.info: Ready | None = None
        self.starts = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None
        self._stderr: asyncio.Task | None = None
        self._ready: asyncio.Future | None = None
        self._jobs: dict[int, tuple[asyncio.Future, Job, Callable | None]] = {}
        self._next_id = 1
        self._lock = asyncio.Lock()
        self.stderr_tail: list[str] = []
        self._kept: set[str] = set()  # the modules this host was asked to keep imported
        self._imports = ImportRequests()  # the files' imports a host is asked to run before their jobs
        self._stopping: asyncio.subprocess.Process | None = None  # a host this client ends itself

    @property
    def alive(self) -> bool:
        """The host runs and hears requests: not exited, nor closed its end (it dies then; the kernel
        may tell its exit a moment after the pipe's end, and a job sent to it meanwhile is lost)."""
        reading = self._reader is not None and not self._reader.done()
        return self._proc is not None and self._proc.returncode is None and reading

    async def ensure_started(self) -> None:
        async with self._lock:
            if self._ready_now() and self.info is not None:
                return
            if not self._ready_now() and not self._starting():
                await self._spawn()
            # (a host launched with the server may have said it is ready before anyone asked: its
            # answer is taken, and logged, here all the same)
            await self._wait_ready()

    def _ready_now(self) -> bool:
        return self.alive and self._ready is not None and self._ready.done() and not self._ready.exception()

    def _starting(self) -> bool:
        """A host is started (and adopted: `server/start.py`) that has not said yet that it is ready."""
        return self.alive and self._ready is not None and not self._ready.done()

    async def _spawn(self) -> None:
        try:
            proc = await start_host(self.python)
        except OSError as exc:
            raise JobFailed(Failure("unavailable", f"cannot start {self.python}: {exc}")) from exc
        self.adopt(proc)

    def adopt(self, proc: asyncio.subprocess.Process) -> None:
        """Take `proc`, a host just started (`host_process.start_host`), as this client's host."""
        self.starts += 1
        self.info = None  # (the last host's, until this one says it is ready)
        self._kept = set()  # (a new host has none: the next analyses name them again)
        self._imports.new_host()
        self._ready = asyncio.get_running_loop().create_future()
        self._proc = proc
        # Each reader holds its own process: a restart must never put two readers on one pipe.
        self._reader = asyncio.create_task(self._read(proc, self._ready))
        self._stderr = asyncio.create_task(self._drain_stderr(proc))

    async def _wait_ready(self) -> None:
        """Wait for the host just spawned to say it is ready; a host that does not is stopped."""
        assert self._ready is not None
        try:
            async with asyncio.timeout(READY_TIMEOUT):
                info: Ready = await asyncio.shield(self._ready)
            self.info = info
        except (TimeoutError, JobFailed) as exc:
            tail = "\n".join(self.stderr_tail[-8:])
            await self.stop()
            hint = ""
            if "No module named 'fuselens" in tail or "No module named 'torch'" in tail:
                hint = f" Install fuselens and torch into {self.python} (`{self.python} -m pip install fuselens`)."
            raise JobFailed(
                Failure("unavailable", f"the analysis worker ({self.python}) did not start.{hint}\n{tail}")
            ) from exc
        self.log(f"worker ready: pid {info.pid}, torch {info.torch}, started in {info.startup_ms} ms")

    async def _read(self, proc: asyncio.subprocess.Process, ready: asyncio.Future) -> None:
        assert proc.stdout
        lines = Lines()
        try:
            while chunk := await proc.stdout.read(1 << 16):
                dropped = lines.dropped
                for line in lines.feed(chunk):
                    try:
                        message = decode_event(line)
                    except ContractError as exc:
                        self.log(f"worker: ignored a malformed message: {exc}")
                        continue
                    self._dispatch(message)
                if lines.dropped > dropped:
                    self.log(f"worker: ignored a message longer than {MAX_MESSAGE_BYTES} bytes")
        finally:
            _kill_session(proc.pid)  # the host is gone: nothing it started may stay
            error = Failure("crash", "the analysis worker exited unexpectedly")
            if not ready.done():
                ready.set_exception(JobFailed(error))
                if self._stopping is proc:
                    ready.exception()  # (ended on purpose before it was ready: nobody waits to hear why)
            if self._proc is proc:  # jobs in flight belong to this process only if it is still the current one
                for future, _, _ in list(self._jobs.values()):
                    if not future.done():
                        future.set_exception(JobFailed(error))
                self._jobs.clear()
                if self._stopping is not proc and (lost := self._imports.host_lost()):
                    self.log(
                        f"the worker exited before it had imported {', '.join(sorted(lost))} for a job: "
                        "from now on the jobs import them themselves"
                    )

    async def _drain_stderr(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr
        lines = Lines(LOG_LINE_BYTES)
        while chunk := await proc.stderr.read(1 << 16):
            for line in lines.feed(chunk):
                text = line.decode(errors="replace").rstrip()
                self.stderr_tail = ([*self.stderr_tail, text])[-50:]
                self.log(f"worker: {text}")

    def _dispatch(self, message: Event) -> None:
        if isinstance(message, Ready):
            if self._ready and not self._ready.done():
                self._ready.set_result(message)
            return
        self._imports.answered(message.id)
        entry = self._jobs.get(message.id)
        if entry is None:
            return
        future, job, on_progress = entry
        if isinstance(message, Progress):
            if on_progress is not None:
                on_progress(message.message, message.fraction)
            return
        self._jobs.pop(message.id, None)
        if future.done():
            return
        if isinstance(message, Failed):
            future.set_exception(JobFailed(message.error))
            return
        try:
            future.set_result(_result(job, message))
        except ContractError as exc:  # a worker of another fuselens version, say
            future.set_exception(JobFailed(Failure("internal", f"the worker's answer cannot be read: {exc}")))

    async def run(
        self,
        job: Job,
        limits: Limits,
        on_progress: Callable[[str, float | None], None] | None = None,
        imports: list[ModuleImport] | None = None,
    ) -> Any:
        """Run a job and return its result (its `result_type()`); cancelling the awaiting task
        cancels (kills) the job in the worker.  `imports`: the import statements of the job's file
        (`server/libraries.py`), which the host runs first where they name installed packages."""
        checked = bounded(limits)  # (the settings bound them too; the host checks them again)
        if isinstance(checked, Failure):
            raise JobFailed(checked)
        await self.ensure_started()
        proc = self._proc
        job_id = self._next_id
        self._next_id += 1
        if imports and (preload := self._imports.request(getattr(job, "path", ""), imports, job_id)):
            self._send(preload)
        request = encode(Run(job_id, job, checked))
        if len(request) > MAX_MESSAGE_BYTES:  # (the editor's buffer of a file of tens of MB)
            too_long = (
                f"the job is {len(request) / 2**20:.0f} MiB, more than the {MAX_MESSAGE_BYTES // 2**20} MiB "
                "the worker reads"
            )
            raise JobFailed(Failure("unavailable", too_long))
        future = asyncio.get_running_loop().create_future()
        self._jobs[job_id] = (future, job, on_progress)
        self._write(request)
        try:
            async with asyncio.timeout(checked.seconds + HOST_GRACE):
                return await future
        except TimeoutError:
            # The host kills a job at its time limit; past that it is wedged (the model's code stopped
            # it, say). Kill it: its other jobs fail, and the next job starts a fresh host.
            self._jobs.pop(job_id, None)
            self.log(f"the worker did not answer job {job_id} within its time limit: restarting it")
            if proc is self._proc and proc is not None and proc.returncode is None:
                await _terminate(proc)
            raise JobFailed(
                Failure("timeout", "the analysis worker stopped responding within the time limit; it was restarted")
            ) from None
        except asyncio.CancelledError:
            self._jobs.pop(job_id, None)
            if self.alive:
                self._send(Cancel(job_id))
            raise

    def keep_loaded(self, modules: list[str]) -> None:
        """Have the host import these library modules once, between jobs, so that the jobs it forks
        after that start with them (`worker/preload.py`).  Each is asked of a host once."""
        new = [m for m in modules if m not in self._kept]
        if new and self.alive and self.info is not None:
            self._kept.update(new)
            self._send(Preload(new))

    def _send(self, message: Request) -> None:
        self._write(encode(message))

    def _write(self, line: bytes) -> None:
        assert self._proc and self._proc.stdin
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, RuntimeError):
            self._proc.stdin.write(line)

    def discard(self) -> None:
        """End a host that has run no job (one launched before the workspace turned out untrusted) at
        once: nothing of the user's ran in it, there is nothing to clean up after."""
        proc = self._proc
        if proc is not None and proc.returncode is None and not self._jobs:
            self._stopping = proc
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            # Forgotten at once: a job that comes later starts a fresh host, never waits on this one.
            self._proc, self._ready = None, None

    async def stop(self) -> None:
        proc = self._proc
        if proc is None:
            return
        self._stopping = proc
        if proc.returncode is None:
            try:
                self._send(Shutdown())
                if proc.stdin is not None:
                    proc.stdin.close()
                async with asyncio.timeout(3):
                    await proc.wait()
            except (TimeoutError, BrokenPipeError, ConnectionResetError, RuntimeError):
                await _terminate(proc)
        _kill_session(proc.pid)
        for task in (self._reader, self._stderr):
            if task:
                task.cancel()
        self._proc = None


async def _terminate(proc: asyncio.subprocess.Process) -> None:
    """End a host that is given up on: SIGTERM (and SIGCONT, should the model's code have stopped it)
    lets it kill its jobs' processes itself; past TERM_GRACE it is killed (and its reader, seeing
    it gone, kills what is left in its session)."""
    for sig in (signal.SIGTERM, signal.SIGCONT):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
    try:
        async with asyncio.timeout(TERM_GRACE):
            await proc.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):  # it may exit just as the grace runs out
            proc.kill()
        await proc.wait()


def _kill_session(session: int) -> None:
    """SIGKILL every process left in the host's session: what its jobs started when the host was
    not there to kill it (killed by the OOM killer, say).  Only a process that left the session
    (setsid()) escapes this; the host itself kills those while it runs."""
    if session in (os.getsid(0), os.getpid()):  # never the server's own
        return
    give_up = time.monotonic() + TERM_GRACE
    while (left := _members(session)) and time.monotonic() < give_up:
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)  # a killed process takes a moment to become a zombie


def _members(session: int) -> list[int]:
    """The live processes of `session`, from /proc (Linux; elsewhere none are found)."""
    found = []
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()  # after the name, which may hold anything
            except (OSError, IndexError):
                continue
            if len(fields) > 3 and int(fields[3]) == session and fields[0] not in (b"Z", b"X"):
                found.append(int(name))
    return found


def _result(job: Job, done: Done) -> Any:
    """The result of a finished job, read as its contract."""
    kind = result_type(job)
    if kind is Report:
        return Report.from_dict(done.result)
    if kind is ProbeReport:
        return ProbeReport.from_dict(done.result)
    return from_plain(kind, done.result, f"{job.kind} result")
