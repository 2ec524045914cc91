"""The server's side of the worker host: start it, send it jobs, relay progress, restart it.

The host (`fuselens.worker.host`) runs in the user's interpreter with a scrubbed
environment: only variables a Python/CUDA program needs pass through, never tokens or
credentials.  If it dies, every job in flight fails with a clear error and the next job
starts a fresh host.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from fuselens.contracts.plain import ContractError, from_plain
from fuselens.contracts.report import Report
from fuselens.worker.protocol import (
    Cancel,
    Done,
    Event,
    Failed,
    Failure,
    Job,
    Limits,
    Progress,
    Ready,
    Request,
    Run,
    Shutdown,
    decode_event,
    encode,
    result_type,
)

READY_TIMEOUT = 180.0  # importing torch on a cold disk can be slow
HOST_GRACE = 10.0  # seconds past a job's time limit after which the host, which enforces it, is presumed wedged

_PASS_THROUGH = re.compile(
    r"^(PATH|HOME|USER|LOGNAME|SHELL|LANG|LC_\w+|TZ|TMPDIR|TEMP|TMP|PYTHONPATH|PYTHONHOME|VIRTUAL_ENV|"
    r"CONDA_\w+|LD_LIBRARY_PATH|CUDA_\w+|NVIDIA_\w+|TRITON_\w+|TORCH_\w+|XDG_\w+|OMP_NUM_THREADS|"
    r"MKL_NUM_THREADS|HF_HUB_OFFLINE)$"
)
_SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_?KEY|PRIVATE", re.I)


def scrubbed_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = dict(os.environ if environ is None else environ)
    env = {k: v for k, v in environ.items() if _PASS_THROUGH.match(k) and not _SECRET.search(k)}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


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
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        self.stderr_tail: list[str] = []

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def ensure_started(self) -> None:
        async with self._lock:
            if self.alive and self._ready is not None and self._ready.done() and not self._ready.exception():
                return
            await self._spawn()

    async def _spawn(self) -> None:
        self.starts += 1
        self._ready = asyncio.get_running_loop().create_future()
        try:
            # -P and a neutral working directory: nothing in the folder the editor started
            # the server from can shadow the worker's own imports.
            self._proc = await asyncio.create_subprocess_exec(
                self.python,
                "-P",
                "-m",
                "fuselens.worker.host",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=scrubbed_environment(),
                limit=1 << 26,
                cwd=tempfile.gettempdir(),
            )
        except OSError as exc:
            raise JobFailed(Failure("unavailable", f"cannot start {self.python}: {exc}")) from exc
        # Each reader holds its own process: a restart must never put two readers on one pipe.
        self._reader = asyncio.create_task(self._read(self._proc, self._ready))
        self._stderr = asyncio.create_task(self._drain_stderr(self._proc))
        try:
            info: Ready = await asyncio.wait_for(asyncio.shield(self._ready), READY_TIMEOUT)
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
        info = self.info
        self.log(f"worker ready: pid {info.pid}, torch {info.torch}, warm-up {info.warmup_ms} ms")

    async def _read(self, proc: asyncio.subprocess.Process, ready: asyncio.Future) -> None:
        assert proc.stdout
        try:
            while True:
                line = await proc.stdout.readline()
                if not line:
                    break
                try:
                    message = decode_event(line)
                except ContractError as exc:
                    self.log(f"worker: ignored a malformed message: {exc}")
                    continue
                self._dispatch(message)
        finally:
            error = Failure("crash", "the analysis worker exited unexpectedly")
            if not ready.done():
                ready.set_exception(JobFailed(error))
            if self._proc is proc:  # jobs in flight belong to this process only if it is still the current one
                for future, _, _ in list(self._jobs.values()):
                    if not future.done():
                        future.set_exception(JobFailed(error))
                self._jobs.clear()

    async def _drain_stderr(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr
        while True:
            line = await proc.stderr.readline()
            if not line:
                return
            text = line.decode(errors="replace").rstrip()
            self.stderr_tail = ([*self.stderr_tail, text])[-50:]
            self.log(f"worker: {text}")

    def _dispatch(self, message: Event) -> None:
        if isinstance(message, Ready):
            if self._ready and not self._ready.done():
                self._ready.set_result(message)
            return
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
        self, job: Job, limits: Limits, on_progress: Callable[[str, float | None], None] | None = None
    ) -> Any:
        """Run a job and return its result (its `result_type()`); cancelling the awaiting task
        cancels (kills) the job in the worker."""
        await self.ensure_started()
        proc = self._proc
        job_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._jobs[job_id] = (future, job, on_progress)
        self._send(Run(job_id, job, limits))
        try:
            return await asyncio.wait_for(future, limits.seconds + HOST_GRACE)
        except TimeoutError:
            # The host kills a job at its time limit; past that it is wedged (the model's code stopped
            # it, say). Kill it: its other jobs fail, and the next job starts a fresh host.
            self._jobs.pop(job_id, None)
            self.log(f"the worker did not answer job {job_id} within its time limit: restarting it")
            if proc is self._proc and proc is not None and proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise JobFailed(
                Failure("timeout", "the analysis worker stopped responding within the time limit; it was restarted")
            ) from None
        except asyncio.CancelledError:
            self._jobs.pop(job_id, None)
            if self.alive:
                self._send(Cancel(job_id))
            raise

    def _send(self, message: Request) -> None:
        assert self._proc and self._proc.stdin
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, RuntimeError):
            self._proc.stdin.write(encode(message))

    async def stop(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            try:
                self._send(Shutdown())
                if proc.stdin is not None:
                    proc.stdin.close()
                await asyncio.wait_for(proc.wait(), 3)
            except (TimeoutError, BrokenPipeError, ConnectionResetError, RuntimeError):
                with contextlib.suppress(ProcessLookupError):  # it may exit just as the grace runs out
                    proc.kill()
                await proc.wait()
        for task in (self._reader, self._stderr):
            if task:
                task.cancel()
        self._proc = None


def _result(job: Job, done: Done) -> Any:
    """The result of a finished job, read as its contract."""
    kind = result_type(job)
    if kind is Report:
        return Report.from_dict(done.result)
    return from_plain(kind, done.result, f"{job.kind} result")
