"""The worker host: a warm process that forks one child per job.

    python -m fuselens.worker.host

Started by the language server with the user's interpreter.  It imports torch and runs
one analysis to warm every lazy path, then forks a child per job: a fork of a warm
process costs milliseconds, the child imports the user's module afresh (so edits are
always seen), and whatever the user's code does (loop forever, allocate 50 GB, chdir,
sys.exit, fork, print megabytes) stays in the child.

Limits per job: wall time (the host kills the child's process group, after asking it for
a stack dump so the report can name the line it was stuck on) and address space
(RLIMIT_AS, so allocations fail with an error at the user's line).  The host is single
threaded and uses torch with one thread: forking a multi-threaded process can deadlock.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import contextlib
import ctypes
import faulthandler
import re
import resource
import selectors
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field

from fuselens.contracts.plain import ContractError
from fuselens.worker.protocol import (
    Cancel,
    Done,
    Event,
    Failed,
    Failure,
    FailureKind,
    Job,
    Limits,
    Progress,
    Ready,
    Run,
    Shutdown,
    decode_event,
    decode_request,
    encode,
    request_id,
)

DUMP_GRACE = 0.3  # seconds a timed-out child gets to write its stack before it is killed


@dataclass
class Child:
    job_id: int
    pid: int
    pipe: int
    deadline: float
    dump_path: str
    path: str  # the analyzed file, to find the user's line in a stack dump
    buffer: bytearray = field(default_factory=bytearray)
    finished: bool = False
    dumped_at: float | None = None


class Host:
    def __init__(self) -> None:
        self.out = sys.stdout.buffer
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, Child] = {}  # by pipe fd
        self.stdin_buffer = bytearray()
        self.running = True

    def send(self, message: Event) -> None:
        self.out.write(encode(message))
        self.out.flush()

    # ---- main loop -----------------------------------------------------------------------
    def serve(self) -> None:
        stdin = sys.stdin.buffer.fileno()
        os.set_blocking(stdin, False)
        self.selector.register(stdin, selectors.EVENT_READ, "stdin")
        while self.running or self.children:
            timeout = self._next_timeout()
            for key, _ in self.selector.select(timeout):
                if key.data == "stdin":
                    self._read_stdin(stdin)
                else:
                    self._read_child(key.data)
            self._enforce_deadlines()

    def _next_timeout(self) -> float | None:
        if not self.children:
            return None
        now = time.monotonic()
        soonest = min((c.dumped_at + DUMP_GRACE) if c.dumped_at else c.deadline for c in self.children.values())
        return max(0.0, soonest - now)

    def _read_stdin(self, fd: int) -> None:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:  # the server went away: finish nothing, stop everything
            self.running = False
            self.selector.unregister(fd)
            for child in list(self.children.values()):
                self._kill(child, "cancelled", "the language server exited")
            return
        self.stdin_buffer += chunk
        while b"\n" in self.stdin_buffer:
            line, _, rest = self.stdin_buffer.partition(b"\n")
            self.stdin_buffer = bytearray(rest)
            if not line.strip():
                continue
            try:
                self._handle(decode_request(bytes(line)))
            except ContractError as exc:  # a server of another version, say: never fatal
                self._refuse(bytes(line), exc)

    def _refuse(self, line: bytes, error: ContractError) -> None:
        """A request that is not one: a job it names fails at once (its caller would wait for ever)."""
        print(f"fuselens worker: refused a malformed request: {error}", file=sys.stderr)
        job_id = request_id(line)
        if job_id is not None:
            self.send(Failed(job_id, Failure("internal", f"the worker cannot read this request: {error}")))

    def _handle(self, message: Run | Cancel | Shutdown) -> None:
        if isinstance(message, Run):
            self._start(message.id, message.job, message.limits)
        elif isinstance(message, Cancel):
            for child in list(self.children.values()):
                if child.job_id == message.id:
                    self._kill(child, "cancelled", "cancelled: a newer request superseded it")
        else:
            self.running = False
            for child in list(self.children.values()):
                self._kill(child, "cancelled", "the worker is shutting down")

    # ---- children ------------------------------------------------------------------------
    def _start(self, job_id: int, job: Job, limits: Limits) -> None:
        read_fd, write_fd = os.pipe()
        dump_fd, dump_path = tempfile.mkstemp(prefix="fuselens-stack-", suffix=".txt")
        host_pid = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(read_fd)
            _child_main(job_id, job, write_fd, dump_fd, limits.memory_mb, host_pid)
        with contextlib.suppress(
            OSError
        ):  # its process group, from this side too: a kill at once after the fork reaches it
            os.setpgid(pid, pid)
        os.close(write_fd)
        os.close(dump_fd)
        child = Child(job_id, pid, read_fd, time.monotonic() + limits.seconds, dump_path, getattr(job, "path", ""))
        self.children[read_fd] = child
        self.selector.register(read_fd, selectors.EVENT_READ, read_fd)

    def _read_child(self, fd: int) -> None:
        child = self.children.get(fd)
        if child is None:
            return
        try:
            chunk = os.read(fd, 1 << 20)
        except OSError:
            chunk = b""
        if chunk:
            child.buffer += chunk
            while b"\n" in child.buffer:
                line, _, rest = child.buffer.partition(b"\n")
                child.buffer = bytearray(rest)
                self._relay(child, bytes(line))
            return
        self._reap(child)

    def _relay(self, child: Child, line: bytes) -> None:
        try:
            message = decode_event(line)
        except ContractError:
            return
        if isinstance(message, Ready) or message.id != child.job_id:
            return  # only the child's own job speaks on its pipe
        if isinstance(message, (Done, Failed)):
            child.finished = True
        self.send(message)

    def _reap(self, child: Child) -> None:
        self._close(child)
        _, status = os.waitpid(child.pid, 0)
        if not child.finished:
            self.send(Failed(child.job_id, _death(status)))
        _remove(child.dump_path)

    def _close(self, child: Child) -> None:
        self.children.pop(child.pipe, None)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(child.pipe)
        os.close(child.pipe)

    def _kill(
        self, child: Child, kind: FailureKind, message: str, file: str | None = None, line: int | None = None
    ) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        self._close(child)
        os.waitpid(child.pid, 0)
        if not child.finished:
            self.send(Failed(child.job_id, Failure(kind, message, file, line)))
        _remove(child.dump_path)

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for child in list(self.children.values()):
            if child.dumped_at is None and now >= child.deadline:
                with contextlib.suppress(ProcessLookupError):  # a stack dump first: it says which line never finished
                    os.kill(child.pid, signal.SIGUSR1)
                child.dumped_at = now
            elif child.dumped_at is not None and now >= child.dumped_at + DUMP_GRACE:
                where = _stuck_at(child.dump_path, child.path)
                message = "the analysis did not finish within the time limit"
                if where:
                    message += f"; it was still running line {where[1]} ({where[2]})"
                self._kill(child, "timeout", message, *(where[:2] if where else ()))


def _death(status: int) -> Failure:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGKILL:
            return Failure("memory", "the worker was killed (out of memory?) while running the model's code")
        return Failure("crash", f"the worker crashed ({signal.Signals(sig).name}) in the model's code")
    code = os.WEXITSTATUS(status)
    return Failure("crash", f"the model's code ended the worker (exit status {code}) before it finished")


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<fn>\S+)')


def _stuck_at(dump_path: str, path: str) -> tuple[str, int, str] | None:
    """The innermost frame in the analyzed file from a faulthandler dump."""
    try:
        with open(dump_path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    frames = [(_unescape(m["file"]), int(m["line"]), _unescape(m["fn"])) for m in _FRAME.finditer(text)]
    target = os.path.abspath(path) if path else ""
    for frame in frames:  # faulthandler lists the innermost frame first
        if target and os.path.abspath(frame[0]) == target:
            return frame
    return None


def _unescape(name: str) -> str:
    """faulthandler writes a name's non-ASCII characters as \\xNN, \\uNNNN or \\UNNNNNNNN."""
    return re.sub(
        r"\\x([0-9a-f]{2})|\\u([0-9a-f]{4})|\\U([0-9a-f]{8})", lambda m: chr(int(m.group(m.lastindex or 0), 16)), name
    )


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


# ---- the child -------------------------------------------------------------------------------


def _child_main(job_id: int, job: Job, write_fd: int, dump_fd: int, memory_mb: int, host_pid: int) -> None:
    code = 0
    try:
        os.setpgid(0, 0)  # its own process group: a kill reaches anything it forks
        _die_with(host_pid)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # the user's prints must never reach the protocol pipe
            os.dup2(devnull, fd)
        faulthandler.register(signal.SIGUSR1, file=os.fdopen(dump_fd, "w"), all_threads=False)
        # No .pyc for the user's modules: a cached one is trusted when the source's mtime (in
        # seconds) and size match, so an edit saved within a second of the last job would be missed.
        sys.dont_write_bytecode = True
        _limit_memory(memory_mb)
        me = os.getpid()
        out = os.fdopen(write_fd, "wb", buffering=0)

        def emit(message: Event) -> None:
            if os.getpid() == me:  # a fork made by the user's code must not speak for us
                out.write(encode(message))

        def progress(text: str, fraction: float | None = None) -> None:
            emit(Progress(job_id, text, fraction))

        from fuselens.worker.jobs import run_job

        try:
            result = run_job(job, progress)
            emit(Done(job_id, result))
        except MemoryError:
            emit(Failed(job_id, Failure("memory", "the model's code ran out of memory")))
        except BaseException as exc:  # report, never propagate
            emit(Failed(job_id, _escaped(exc, getattr(job, "path", ""))))
    except BaseException:
        code = 70
    finally:
        os._exit(code)


def _escaped(exc: BaseException, path: str) -> Failure:
    """The error for an exception that escaped the job.  Analysis turns the model's exceptions
    into problems, but not a KeyboardInterrupt (or any other non-Exception) it raises: that
    is still the model's doing, at its line, when it was raised in the analyzed file."""
    if not isinstance(exc, Exception) and path:
        frames = [
            f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) == os.path.abspath(path)
        ]
        if frames:
            return Failure(
                "crash", f"the model's code raised {type(exc).__name__}", frames[-1].filename, frames[-1].lineno
            )
    return Failure("internal", f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(limit=20))


def _die_with(host_pid: int) -> None:
    """Have the kernel kill this child if the host dies: nobody would enforce its time limit then."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        return
    if os.getppid() != host_pid:  # the host died before that took effect
        os._exit(70)


def _limit_memory(memory_mb: int) -> None:
    """Cap the address space at what the warm process already maps plus `memory_mb`."""
    try:
        with open("/proc/self/statm") as fh:
            mapped = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        mapped = 0
    limit = mapped + memory_mb * 2**20
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main() -> int:
    started = time.perf_counter()
    import torch

    torch.set_num_threads(1)
    from fuselens.worker.jobs import warm_up

    try:
        warm_up()
    except Exception as exc:  # a failed warm-up only costs speed
        print(f"fuselens worker: warm-up failed: {exc}", file=sys.stderr)
    host = Host()
    host.send(
        Ready(os.getpid(), sys.version.split()[0], torch.__version__, round((time.perf_counter() - started) * 1000))
    )
    host.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
