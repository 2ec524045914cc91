"""The worker host: a warm process that forks one child per job.

    python -m fuselens.worker.host

Started by the language server with the user's interpreter.  It imports torch, says it is ready,
and once no request has come for a moment runs one analysis to warm every lazy path (a file opened
as the server starts has its job, and its library's import, first: the job warms what it uses
itself, and the warm-up after it serves the jobs that follow).  It forks a child per job: a fork of a warm
process costs milliseconds, the child imports the user's module afresh (so edits are
always seen), and whatever the user's code does (loop forever, allocate 50 GB, chdir,
sys.exit, fork, print megabytes) stays in the child.  Between jobs it imports the installed
library modules the server names (`preload.py`: transformers' modeling code, which a job would
otherwise import afresh on every save), and before a file's job the imports of installed packages
its syntax tree names, so that even the first job of a file starts with its library imported.

Limits per job: wall time (the child's watchdog thread dumps its stack at the limit, so the
report can name the line it was stuck on, and the host then kills it) and address space
(RLIMIT_AS, so allocations fail with an error at the user's line).

What a job starts ends with it.  The host and every child are subreapers, so whatever the
model's code forks stays below the host however it detaches (a double fork, setsid()); when
a job ends (its answer, its time limit, a cancel) the host kills the child's process group
and every process below the host that is not a running job's, and it does the same when it
exits.

The model's code cannot reach the server: the server's pipes are moved off fds 0 and 1 to
descriptors the child closes before it runs anything, and the child answers over a socket of
its own on which the host hears only the child itself (the kernel names each sender), so a
fork of the model's code cannot speak for the job.  Lines are bounded both ways
(`MAX_MESSAGE_BYTES`): the most the model's code can do is spoil its own job's answer.

The host is single threaded and uses torch with one thread: forking a multi-threaded process
can deadlock.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import contextlib
import faulthandler
import posix
import re
import resource
import selectors
import signal
import socket
import stat
import struct
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import NoReturn, TextIO

from fuselens.contracts.plain import ContractError
from fuselens.worker import collector
from fuselens.worker.confine import keep_descriptors_private, prctl, renounce_ptrace
from fuselens.worker.descendants import PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG
from fuselens.worker.descendants import kill_strays as _kill_strays
from fuselens.worker.preload import folder_of, forget_shadowed, preload, preload_imports
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
    Preload,
    PreloadImports,
    Progress,
    Ready,
    Run,
    Shutdown,
    bounded,
    decode_event,
    decode_request,
    encode,
    request_id,
)

DUMP_GRACE = 0.3  # seconds a timed-out child's watchdog gets to write its stack before it is killed
EXIT_POLL = 0.05  # seconds between checks for a child's exit, where the kernel cannot signal it
# Seconds without a request before the host warms up: the server sends a waiting file's imports and
# job within milliseconds of hearing that the host is ready, and those go first.
WARM_UP_IDLE = 0.2
READS_PER_WAKE = 16  # chunks read from one child before the loop looks at the others and the clock
PROGRESS_CHARS = 1000  # the longest progress note relayed to the server (and on to the editor)
DUMP_TAIL = 1 << 20  # bytes of a stack dump read back: a stack is far shorter, what else is there is not read

_UCRED = struct.Struct("3i")  # SCM_CREDENTIALS: pid, uid, gid
_EXIT = os._exit  # the real one: a child replaces os._exit to see the model's code call it


@dataclass(frozen=True)
class Channel:
    """The host's descriptors for the server's pipes, off fds 0 and 1."""

    requests: int
    events: int
    pipes: frozenset[tuple[int, int]]  # (device, inode) of each pipe to the server, stderr's too


@dataclass
class Child:
    job_id: int
    pid: int
    answers: socket.socket  # the host's end of the child's own channel
    exited: int | None  # a pidfd, readable once the child has exited; None: polled instead
    deadline: float
    dump_path: str  # where its watchdog and faulthandler write its stack
    path: str  # the analyzed file, to find the user's line in a stack dump
    lines: Lines = field(default_factory=Lines)
    answer: Done | Failed | None = None  # the last one the child wrote: it counts once the child has exited
    status: int | None = None  # its wait status, once reaped
    timed_out_at: float | None = None


class Host:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, Child] = {}  # by pid
        self.requests = Lines()
        self.running = True
        self.warmed = False

    def send(self, message: Event) -> None:
        with contextlib.suppress(OSError):  # the server went away: reading its pipe says so
            _write_all(self.channel.events, _line(message))

    # ---- main loop -----------------------------------------------------------------------
    def serve(self) -> None:
        os.set_blocking(self.channel.requests, False)
        self.selector.register(self.channel.requests, selectors.EVENT_READ, ("requests", None))
        try:
            while self.running or self.children:
                events = self.selector.select(self._next_timeout())
                if not events and self._warm_up_due():
                    self._warm_up()
                for key, _ in events:
                    what, child = key.data
                    if what == "requests":
                        self._read_requests()
                    elif child.pid not in self.children:
                        continue  # ended by an earlier event of this round
                    elif what == "answers":
                        self._read_answers(child)
                    else:
                        self._end(child)
                self._poll_exits()
                self._enforce_deadlines()
        finally:  # a SIGTERM, or a bug: nothing the jobs started may outlive the host
            for child in list(self.children.values()):
                self._end(child, Failure("cancelled", "the worker is shutting down"))
            _kill_strays(spared=())

    def _warm_up_due(self) -> bool:
        return self.running and not self.children and not self.warmed

    def _warm_up(self) -> None:
        """Exercise every lazy import and first-call path once, so that later jobs start hot; then
        collect and freeze what the host holds, and collect from then on (`collector.py`)."""
        from fuselens.worker.jobs import warm_up

        self.warmed = True
        started = time.perf_counter()
        try:
            warm_up()
        except Exception as exc:  # a failed warm-up only costs speed
            print(f"fuselens worker: warm-up failed: {exc}", file=sys.stderr)
            return
        finally:
            collector.settle()
        print(f"fuselens worker: warmed up in {round((time.perf_counter() - started) * 1000)} ms", file=sys.stderr)

    def _next_timeout(self) -> float | None:
        if self._warm_up_due():
            return WARM_UP_IDLE
        if not self.children:
            return None
        now = time.monotonic()
        soonest = min(
            c.deadline if c.timed_out_at is None else c.timed_out_at + DUMP_GRACE for c in self.children.values()
        )
        timeout = max(0.0, soonest - now)
        if any(c.exited is None for c in self.children.values()):
            timeout = min(timeout, EXIT_POLL)
        return timeout

    def _read_requests(self) -> None:
        try:
            chunk = os.read(self.channel.requests, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:  # the server went away: finish nothing, stop everything
            self.running = False
            self.selector.unregister(self.channel.requests)
            for child in list(self.children.values()):
                self._end(child, Failure("cancelled", "the language server exited"))
            return
        dropped = self.requests.dropped
        for line in self.requests.feed(chunk):
            if not line.strip():
                continue
            try:
                self._handle(decode_request(line))
            except ContractError as exc:  # a server of another version, say: never fatal
                self._refuse(line, exc)
        if self.requests.dropped > dropped:
            print(f"fuselens worker: dropped a request longer than {MAX_MESSAGE_BYTES} bytes", file=sys.stderr)

    def _refuse(self, line: bytes, error: ContractError) -> None:
        """A request that is not one: a job it names fails at once (its caller would wait for ever)."""
        print(f"fuselens worker: refused a malformed request: {error}", file=sys.stderr)
        job_id = request_id(line)
        if job_id is not None:
            self.send(Failed(job_id, Failure("internal", f"the worker cannot read this request: {error}")))

    def _handle(self, message: Run | Cancel | Shutdown | Preload | PreloadImports) -> None:
        if isinstance(message, Run):
            self._start(message.id, message.job, message.limits)
        elif isinstance(message, Preload | PreloadImports):
            # (between jobs: the loop waits meanwhile; the job that follows a file's imports needs them first)
            with collector.paused():
                said = (
                    preload(message.modules)
                    if isinstance(message, Preload)
                    else preload_imports(message.path, message.imports)
                )
            for line in said:
                print(f"fuselens worker: {line}", file=sys.stderr)
        elif isinstance(message, Cancel):
            for child in list(self.children.values()):
                if child.job_id == message.id:
                    self._end(child, Failure("cancelled", "cancelled: a newer request superseded it"))
        else:
            self.running = False
            for child in list(self.children.values()):
                self._end(child, Failure("cancelled", "the worker is shutting down"))

    # ---- children ------------------------------------------------------------------------
    def _start(self, job_id: int, job: Job, limits: Limits) -> None:
        checked = bounded(limits)  # the server checks them too; a value that crashed the host would end every job
        if isinstance(checked, Failure):
            self.send(Failed(job_id, checked))
            return
        try:
            answers, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            dump_fd, dump_path = tempfile.mkstemp(prefix="fuselens-stack-", suffix=".txt")
        except OSError as exc:  # out of descriptors or disk, say: this job fails, the host goes on
            self.send(Failed(job_id, Failure("unavailable", f"the worker cannot start a job: {exc}")))
            return
        with contextlib.suppress(OSError, AttributeError):  # Linux: each read says which process wrote it
            answers.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        answers.setblocking(False)
        deadline = time.monotonic() + checked.seconds
        private = [*self._descriptors(), answers.fileno()]
        host_pid = os.getpid()
        collector.before_fork()
        try:
            pid = os.fork()
        except OSError as exc:  # no processes left to the user (what a fork bomb left running, say)
            answers.close()
            theirs.close()
            os.close(dump_fd)
            _remove(dump_path)
            self.send(Failed(job_id, Failure("unavailable", f"the worker cannot start a job: {exc}")))
            return
        if pid == 0:  # the child: never returns
            _child_main(job_id, job, checked, theirs, dump_fd, deadline, host_pid, private, self.channel.pipes)
        # Its process group, from this side too: a kill at once after the fork reaches it.
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
        theirs.close()
        os.close(dump_fd)
        child = Child(job_id, pid, answers, _pidfd(pid), deadline, dump_path, getattr(job, "path", ""))
        self.children[pid] = child
        self.selector.register(answers, selectors.EVENT_READ, ("answers", child))
        if child.exited is not None:
            self.selector.register(child.exited, selectors.EVENT_READ, ("exited", child))

    def _descriptors(self) -> list[int]:
        """Every descriptor of the host's own: a child closes them before it runs the model's code."""
        fds = [self.channel.requests, self.channel.events]
        if isinstance(self.selector, selectors.EpollSelector):  # (Linux's; the others hold no descriptor here)
            fds.append(self.selector.fileno())
        for child in self.children.values():
            fds.append(child.answers.fileno())
            if child.exited is not None:
                fds.append(child.exited)
        return fds

    def _read_answers(self, child: Child, reads: int = READS_PER_WAKE) -> None:
        for _ in range(reads):
            try:
                data, ancillary, _, _ = child.answers.recvmsg(1 << 16, socket.CMSG_SPACE(_UCRED.size))
            except BlockingIOError:
                return
            except OSError:
                data, ancillary = b"", []
            if not data:  # every copy of the child's end is closed; its exit ends the job
                with contextlib.suppress(KeyError, ValueError):
                    self.selector.unregister(child.answers)
                return
            if _sender(ancillary) not in (child.pid, None):
                continue  # a process the model's code forked: it does not speak for the job
            for line in child.lines.feed(data):
                self._take(child, line)

    def _take(self, child: Child, line: bytes) -> None:
        try:
            message = decode_event(line)
        except ContractError:
            return  # not a message: something the model's code wrote
        if isinstance(message, Ready) or message.id != child.job_id:
            return
        if isinstance(message, Progress):
            if len(message.message) <= PROGRESS_CHARS:  # (a longer one is not fuselens's)
                self.send(message)
        else:  # the model's code may write a line like this too, but not after the child's own last one
            child.answer = message

    def _poll_exits(self) -> None:
        for child in [c for c in self.children.values() if c.exited is None]:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(child.pid, os.WNOHANG)
                if pid:
                    child.status = status
                    self._end(child)

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for child in list(self.children.values()):
            if child.timed_out_at is None and now >= child.deadline:
                child.timed_out_at = now  # its watchdog is writing the stack it is at
            elif child.timed_out_at is not None and now >= child.timed_out_at + DUMP_GRACE:
                self._end(child, _timed_out(child))

    def _end(self, child: Child, failure: Failure | None = None) -> None:
        """The job is over: the child has exited, or `failure` says why the host ends it.  Everything
        it started is killed, and its answer (or what ended it) goes to the server."""
        if failure is None:
            self._read_answers(child, reads=64)  # what it wrote just before it exited
        with contextlib.suppress(OSError):
            os.killpg(child.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(child.pid, signal.SIGKILL)
        if child.status is None:
            child.status = _wait(child.pid)
        self._forget(child)
        _kill_strays(spared=self.children.keys())
        if failure is not None or child.answer is None:
            self.send(Failed(child.job_id, failure or _death(child.status, child)))
        else:
            self.send(child.answer)
        _remove(child.dump_path)

    def _forget(self, child: Child) -> None:
        self.children.pop(child.pid, None)
        for watched in (child.answers, child.exited):
            with contextlib.suppress(KeyError, ValueError):
                if watched is not None:
                    self.selector.unregister(watched)
        child.answers.close()
        if child.exited is not None:
            with contextlib.suppress(OSError):
                os.close(child.exited)
            child.exited = None


def _line(message: Event) -> bytes:
    """`message` on the wire, within MAX_MESSAGE_BYTES: an answer too long to send is a failure that
    says so, a progress note too long is not sent."""
    line = encode(message)
    if len(line) <= MAX_MESSAGE_BYTES:
        return line
    if not isinstance(message, (Done, Failed)):
        return b""
    too_long = (
        f"the job's answer is {len(line) / 2**20:.0f} MiB, more than the {MAX_MESSAGE_BYTES // 2**20} MiB "
        "the worker may send"
    )
    return encode(Failed(message.id, Failure("crash", too_long)))


def _timed_out(child: Child) -> Failure:
    where = _stuck_at(child.dump_path, child.path)
    message = "the analysis did not finish within the time limit"
    if where:
        message += f"; it was still running line {where[1]} ({where[2]})"
    return Failure("timeout", message, *(where[:2] if where else ()))


def _death(status: int, child: Child) -> Failure:
    """Why a child that exited without an answer did."""
    if child.lines.dropped:
        return Failure(
            "crash",
            f"the job's answer was lost in a line longer than {MAX_MESSAGE_BYTES // 2**20} MiB on its channel: "
            "the model's code wrote to a descriptor it inherited",
        )
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGKILL:
            return Failure("memory", "the worker was killed (out of memory?) while running the model's code")
        where = _stuck_at(child.dump_path, child.path)  # faulthandler's, for a fatal signal
        return Failure(
            "crash",
            f"the worker crashed ({signal.Signals(sig).name}) in the model's code",
            *(where[:2] if where else ()),
        )
    code = os.WEXITSTATUS(status)
    return Failure("crash", f"the model's code ended the worker (exit status {code}) before it finished")


_MAIN = re.compile(rb"main thread (\d+)\n")
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x(?P<ident>[0-9a-f]+) \(most recent call first\):$", re.M)
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<fn>\S+)')


def _stuck_at(dump_path: str, path: str) -> tuple[str, int, str] | None:
    """The innermost frame in the analyzed file of the main thread's last stack in a dump."""
    try:
        with open(dump_path, "rb") as fh:
            main = _MAIN.match(fh.read(64))
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - DUMP_TAIL))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    threads = list(_THREAD.finditer(text))
    ours = [t for t in threads if main is None or int(t["ident"], 16) == int(main[1])]
    if ours:
        start = ours[-1].end()
        following = [t.start() for t in threads if t.start() > start]
        text = text[start : following[0] if following else len(text)]
    target = os.path.abspath(path) if path else ""
    for m in _FRAME.finditer(text):  # faulthandler lists the innermost frame first
        if target and os.path.abspath(_unescape(m["file"])) == target:
            return _unescape(m["file"]), int(m["line"]), _unescape(m["fn"])
    return None


def _unescape(name: str) -> str:
    """faulthandler writes a name's non-ASCII characters as \\xNN, \\uNNNN or \\UNNNNNNNN."""
    return re.sub(
        r"\\x([0-9a-f]{2})|\\u([0-9a-f]{4})|\\U([0-9a-f]{8})", lambda m: chr(int(m.group(m.lastindex or 0), 16)), name
    )


def _sender(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The pid the kernel gives for what one read returned (None where it gives none)."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == getattr(socket, "SCM_CREDENTIALS", None):
            return int(_UCRED.unpack(data[: _UCRED.size])[0])
    return None


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when `pid` exits (Linux 5.3+)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _wait(pid: int) -> int:
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return 0


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


# ---- the child -------------------------------------------------------------------------------


def _child_main(
    job_id: int,
    job: Job,
    limits: Limits,
    answers: socket.socket,
    dump_fd: int,
    deadline: float,
    host_pid: int,
    private: list[int],
    pipes: frozenset[tuple[int, int]],
) -> NoReturn:
    code = 0
    try:
        collector.in_job()  # (off in a host not warmed up yet: the model's code runs as in any program)
        _contain(host_pid)
        _close_channels(private, pipes)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the host's handler is the host's
        dump = os.fdopen(dump_fd, "w")
        _watch(dump, deadline)
        # No .pyc for the user's modules: a cached one is trusted when the source's mtime (in
        # seconds) and size match, so an edit saved within a second of the last job would be missed.
        sys.dont_write_bytecode = True
        _limit_memory(limits.memory_mb)
        path = getattr(job, "path", "")
        _enter_folder(path)
        if path:
            forget_shadowed(folder_of(path))  # the model's own module of a preloaded library's name
        out = answers.detach()
        me = os.getpid()

        def emit(message: Event) -> None:
            if os.getpid() == me:  # a fork made by the user's code must not speak for us
                _write_all(out, _line(message))

        def progress(text: str, fraction: float | None = None) -> None:
            emit(Progress(job_id, text, fraction))

        _report_exits(lambda failure: emit(Failed(job_id, failure)), path)
        from fuselens.worker.jobs import run_job

        try:
            result = run_job(job, progress)
            emit(Done(job_id, result))
        except MemoryError:
            emit(Failed(job_id, Failure("memory", "the model's code ran out of memory")))
        except BaseException as exc:  # report, never propagate
            emit(Failed(job_id, _escaped(exc, path)))
    except BaseException:
        code = 70
    finally:
        _EXIT(code)


def _contain(host_pid: int) -> None:
    """Its own process group (a kill reaches what it forks), its death with the host's (nobody would
    enforce its limits then), and what it forks kept below it when the process between is gone."""
    os.setpgid(0, 0)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    if os.getppid() != host_pid:  # the host died before that took effect
        _EXIT(70)
    # Not dumpable, as the host it was forked from, and without the capability that would let it
    # past that: the host's and the server's descriptors stay out of the model's reach (confine.py).
    renounce_ptrace()


def _close_channels(private: list[int], pipes: frozenset[tuple[int, int]]) -> None:
    """Close every descriptor that leads to the server or to another job, and point 0, 1 and 2 at
    /dev/null: the user's prints go nowhere, and nothing the model's code writes reaches the server."""
    for fd in private:
        with contextlib.suppress(OSError):
            os.close(fd)
    for fd in _open_descriptors():
        with contextlib.suppress(OSError):
            if _identity(fd) in pipes:
                os.close(fd)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    if devnull > 2:  # (it may be one of them: the lowest free descriptor)
        os.close(devnull)


def _open_descriptors() -> list[int]:
    try:
        return [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(min(os.sysconf("SC_OPEN_MAX"), 4096)))


def _identity(fd: int) -> tuple[int, int] | None:
    """(device, inode) of a pipe or socket; None for anything else (a file, a terminal, /dev/null)."""
    info = os.fstat(fd)
    return (info.st_dev, info.st_ino) if stat.S_ISFIFO(info.st_mode) or stat.S_ISSOCK(info.st_mode) else None


def _enter_folder(path: str) -> None:
    """Work in the model's folder, as `python model.py` run there would: the host's own working
    directory is `/`, where a relative file the model's code writes has no place."""
    if path:
        with contextlib.suppress(OSError):
            os.chdir(os.path.dirname(os.path.realpath(path)))


def _watch(dump: TextIO, deadline: float) -> None:
    """Have the stack written to `dump` at the time limit and on a fatal signal.  A watchdog thread
    writes it, not a signal handler: the model's code can ignore a signal, and a thread needs no
    cooperation from the main thread (stuck in a loop or in C).  The first line names the main
    thread, whose stack is the one the report points at."""
    dump.write(f"main thread {threading.get_ident()}\n")
    dump.flush()
    faulthandler.enable(file=dump, all_threads=True)
    faulthandler.dump_traceback_later(max(deadline - time.monotonic(), 0.001), file=dump)


def _report_exits(fail: Callable[[Failure], None], path: str) -> None:
    """Replace os._exit so that a call from the model's code is its job's answer, at its line: the
    exit status alone cannot say where."""
    me = os.getpid()

    def _exit(status: int) -> NoReturn:
        if os.getpid() == me and isinstance(status, int):
            fail(_exited(status, sys._getframe(1), path))
        _EXIT(status)

    os._exit = posix._exit = _exit


def _exited(status: int, frame: FrameType | None, path: str) -> Failure:
    message = (
        f"the model's code ended the worker (exit status {status}) before it finished: it called os._exit({status})"
    )
    target = os.path.abspath(path) if path else ""
    while frame is not None:
        if target and os.path.abspath(frame.f_code.co_filename) == target:
            return Failure("crash", message, frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back
    return Failure("crash", message)


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


def _limit_memory(memory_mb: int) -> None:
    """Cap the address space at what the warm process already maps plus `memory_mb`."""
    try:
        with open("/proc/self/statm") as fh:
            mapped = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        mapped = 0
    limit = mapped + memory_mb * 2**20
    with contextlib.suppress(ValueError, OSError, OverflowError):
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


# ---- the host's own start --------------------------------------------------------------------


def _take_channel() -> Channel:
    """Move the server's pipes off fds 0 and 1, which then read and write /dev/null: a print in the
    host (a warning torch writes, say) cannot corrupt the protocol, and a child closes the two
    descriptors it inherits before it runs any of the model's code."""
    pipes = set()
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            pipes.add(_identity(fd))
    requests, events = os.dup(0), os.dup(1)  # (not inheritable: nothing the host runs gets them)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    if devnull > 2:
        os.close(devnull)
    return Channel(requests, events, frozenset(p for p in pipes if p is not None))


def _terminate(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (the server giving up on the host): leave through `serve`'s cleanup, once."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def main() -> int:
    started = time.perf_counter()
    collector.hold()  # until warmed up: the imports go faster without it
    if not keep_descriptors_private():
        print("fuselens worker: cannot keep its pipes from the jobs (no PR_SET_DUMPABLE)", file=sys.stderr)
    channel = _take_channel()
    if not prctl(PR_SET_CHILD_SUBREAPER, 1):
        print("fuselens worker: cannot keep the jobs' orphans (no PR_SET_CHILD_SUBREAPER)", file=sys.stderr)
    signal.signal(signal.SIGTERM, _terminate)
    import torch

    torch.set_num_threads(1)
    host = Host(channel)
    host.send(
        Ready(os.getpid(), sys.version.split()[0], torch.__version__, round((time.perf_counter() - started) * 1000))
    )
    host.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
