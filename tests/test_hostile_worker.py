"""The worker against hostile model code, through its own API (the server's WorkerClient, and the
host's pipe): whatever a job's code forks dies with the job, with the worker host and with the
language server; nothing it writes to its descriptors reaches the server's channel or speaks for
its job; no limit crashes the host; an exit or a hang is placed at the line that ran.

(tests/test_robust_hostile.py covers hostile code through the language server's diagnostics.)
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass

import pytest
import pytest_asyncio

from fuselens.contracts.options import AnalyzeOptions
from fuselens.server import workers
from fuselens.server.workers import JobFailed, WorkerClient
from fuselens.worker.protocol import (
    MAX_MESSAGE_BYTES,
    AnalyzeJob,
    Done,
    Failed,
    Limits,
    Lines,
    PingJob,
    Pong,
    Ready,
    Run,
    Shutdown,
    bounded,
    decode_event,
    encode,
)

from conftest import chains, only_model
from lsp_helpers import example_text, make_workspace, running_server

in_module_loop = pytest.mark.asyncio(loop_scope="module")  # the async tests share the module's worker

TIMEOUT_S = 30.0  # a job's time limit: far past what these jobs need, so that only a hang reaches it
MEMORY_MB = 2048
GONE_WITHIN = 20.0  # seconds a test waits for a process to be gone before it fails
GOOD = ["mul → relu → add", "linear → gelu → sigmoid → mul", "tanh → mul → softmax"]

# Code a hostile model is made of; RECORD is the file its processes' pids are written to.
HELPERS = textwrap.dedent(
    '''
    import os, signal, sys, time


    def _record(pid):
        """Write down `pid` and its start time (so that a reused pid is not taken for it)."""
        with open(f"/proc/{pid}/stat") as fh:
            started = fh.read().rsplit(")", 1)[1].split()[19]
        with open(RECORD, "a") as fh:
            fh.write(f"{pid} {started}\\n")


    def _sleeper():
        """A child that keeps none of its parent's descriptors and sleeps: nothing says it is there."""
        pid = os.fork()
        if pid == 0:
            os.closerange(0, 4096)
            time.sleep(600)
            os._exit(0)
        return pid


    def _lingers():
        _record(_sleeper())


    def _detaches():
        """A daemon's double fork: a grandchild in a session of its own, whose parent is gone."""
        r, w = os.pipe()
        middle = os.fork()
        if middle == 0:
            os.setsid()
            os.write(w, str(_sleeper()).encode())
            os._exit(0)
        os.close(w)
        grandchild = int(os.read(r, 64))
        os.waitpid(middle, 0)
        _record(grandchild)


    def _job_ids():
        """The job's id, as the model's code can find it in the frames below its own."""
        ids, frame = set(), sys._getframe()
        while frame is not None:
            if isinstance(frame.f_locals.get("job_id"), int):
                ids.add(frame.f_locals["job_id"])
            frame = frame.f_back
        return ids


    def _to_every_descriptor(data):
        for fd in range(1, 256):
            try:
                os.write(fd, data)
            except OSError:
                pass
    '''
)


def hostile(module_level: str = "", forward: str = "", record: str = os.devnull) -> str:
    """examples/example_net.py with HELPERS after its imports, then `module_level`; `forward` runs
    before `x = F.relu(x)` in forward()."""
    lines = example_text().split("\n")
    body = "\n".join(lines[8:])
    if forward:
        body = body.replace("        x = F.relu(x)", f"        {forward}; x = F.relu(x)", 1)
    return "\n".join(lines[:8]) + HELPERS + f"RECORD = {record!r}\n{module_level}\n" + body


def line_of(text: str, needle: str) -> int:
    (line,) = [i + 1 for i, line in enumerate(text.split("\n")) if needle in line]
    return line


async def analyze(worker: WorkerClient, path, text: str, seconds: float = TIMEOUT_S):
    path.write_text(text)
    return await worker.run(AnalyzeJob(str(path), AnalyzeOptions(source_text=text)), Limits(seconds, MEMORY_MB))


# ---- processes, by pid -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    started: str  # /proc/<pid>/stat's start time: a pid reused by another process is not this one


def stat_of(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def proc(pid: int) -> Proc:
    fields = stat_of(pid)
    assert fields is not None, f"process {pid} is not there"
    return Proc(pid, fields[19])


def alive(p: Proc) -> bool:
    fields = stat_of(p.pid)
    return fields is not None and fields[0] not in ("Z", "X") and fields[19] == p.started


def recorded(path) -> list[Proc]:
    try:
        text = path.read_text()
    except OSError:
        return []
    return [Proc(int(pid), started) for pid, started in (line.split() for line in text.splitlines())]


async def eventually(predicate, what: str, timeout: float = GONE_WITHIN):
    """Poll `predicate` until it holds; AssertionError naming `what` past `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        await asyncio.sleep(0.02)
    return result


async def all_gone(procs: list[Proc], what: str) -> None:
    await eventually(lambda: not [p for p in procs if alive(p)], f"{what}: {[p for p in procs if alive(p)]} alive")


def kill(procs: list[Proc]) -> None:
    """Whatever a failed test left behind."""
    for p in procs:
        if alive(p):
            os.kill(p.pid, signal.SIGKILL)


def descendants(pid: int) -> list[Proc]:
    """Every process below `pid` (any of its threads' children)."""
    found, todo = [], [pid]
    while todo:
        for children in glob.glob(f"/proc/{todo.pop()}/task/*/children"):
            try:
                with open(children) as fh:
                    pids = [int(p) for p in fh.read().split()]
            except OSError:
                continue
            for child in pids:
                if (fields := stat_of(child)) is not None:
                    found.append(Proc(child, fields[19]))
                    todo.append(child)
    return found


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def worker():
    client = WorkerClient()
    await client.ensure_started()
    yield client
    await client.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def own_worker():
    """A worker of the test's own, for one it stops or kills."""
    client = WorkerClient()
    await client.ensure_started()
    yield client
    await client.stop()


# ---- 1. what a job forks ends with it ----------------------------------------------------------------

FORKS = {"closes-its-descriptors-and-sleeps": "_lingers()", "setsid-grandchild": "_detaches()"}


@pytest.mark.parametrize("how", FORKS)
@pytest.mark.parametrize("where", ["module-level", "forward"])
@in_module_loop
async def test_what_a_job_forks_dies_with_its_answer(worker, tmp_path, where: str, how: str):
    record = tmp_path / "pids"
    code = FORKS[how]
    text = hostile(code, record=str(record)) if where == "module-level" else hostile(forward=code, record=str(record))
    try:
        report = await analyze(worker, tmp_path / "forks.py", text)
        assert chains(only_model(report)) == GOOD
        forked = recorded(record)
        assert forked, "the model's code forked nothing"
        await all_gone(forked, "what the job forked, after its answer")
        assert await worker.run(PingJob(), Limits(TIMEOUT_S, MEMORY_MB)) == Pong()
    finally:
        kill(recorded(record))


def lingering_then_stuck(record) -> str:
    """A model that forks both kinds of process at import, then never finishes."""
    return hostile("_lingers(); _detaches()\nwhile True: time.sleep(0.01)", record=str(record))


async def started_and_stuck(worker: WorkerClient, tmp_path, seconds: float = TIMEOUT_S):
    """Start lingering_then_stuck as a job: (its task, the job's process and what it forked)."""
    record = tmp_path / "pids"
    task = asyncio.ensure_future(analyze(worker, tmp_path / "stuck.py", lingering_then_stuck(record), seconds))
    forked = await eventually(lambda: len(recorded(record)) == 2 and recorded(record), "the model's code to fork")
    job = [p for p in descendants(worker.info.pid) if p.pid not in {f.pid for f in forked}]
    return task, job, forked


@in_module_loop
async def test_what_a_running_job_forks_dies_with_the_worker_it_shuts_down(own_worker, tmp_path):
    task, job, forked = await started_and_stuck(own_worker, tmp_path)
    host = proc(own_worker.info.pid)
    try:
        await own_worker.stop()
        with pytest.raises(JobFailed):
            await asyncio.wait_for(task, GONE_WITHIN)
        await all_gone([host, *job, *forked], "the worker, its job and what it forked, after a shutdown")
    finally:
        kill([host, *job, *forked])


@in_module_loop
async def test_what_a_running_job_forks_dies_with_a_worker_that_stopped_answering(own_worker, tmp_path, monkeypatch):
    """The model's code stops the host (SIGSTOP): the server gives up on it and its jobs' processes."""
    monkeypatch.setattr(workers, "HOST_GRACE", 1.0)
    task, job, forked = await started_and_stuck(own_worker, tmp_path, seconds=2.0)
    host = proc(own_worker.info.pid)
    try:
        os.kill(host.pid, signal.SIGSTOP)
        with pytest.raises(JobFailed, match="stopped responding"):
            await asyncio.wait_for(task, GONE_WITHIN)
        await all_gone([host, *job, *forked], "the stopped worker, its job and what it forked")
    finally:
        kill([host, *job, *forked])


@in_module_loop
async def test_what_a_running_job_forks_dies_with_a_killed_worker(own_worker, tmp_path):
    """The host is killed (the OOM killer, say) and cannot clean up: the server kills what is left
    in its session.  (A process that left the session with setsid() is out of its reach then.)"""
    record = tmp_path / "pids"
    text = hostile("_lingers()\nwhile True: time.sleep(0.01)", record=str(record))
    task = asyncio.ensure_future(analyze(own_worker, tmp_path / "stuck.py", text))
    forked = await eventually(lambda: recorded(record), "the model's code to fork")
    host = proc(own_worker.info.pid)
    job = [p for p in descendants(host.pid) if p not in forked]
    try:
        os.kill(host.pid, signal.SIGKILL)
        with pytest.raises(JobFailed, match="exited unexpectedly"):
            await asyncio.wait_for(task, GONE_WITHIN)
        await all_gone([*job, *forked], "the killed worker's job and what it forked")
    finally:
        kill([*job, *forked])


@in_module_loop
async def test_what_a_running_job_forks_dies_with_the_language_server(tmp_path):
    """shutdown, then exit, while a job is stuck: nothing it forked outlives the server."""
    root = make_workspace(str(tmp_path / "ws"))
    record = tmp_path / "pids"
    async with running_server("visual-studio-code", root) as client:
        client.open("stuck.py", lingering_then_stuck(record))
        forked = await eventually(lambda: len(recorded(record)) == 2 and recorded(record), "the model's code to fork")
        try:
            await client.shutdown_session()
            await all_gone(forked, "what the job forked, after shutdown and exit")
        finally:
            kill(forked)


# ---- 2. the model's code cannot reach the server's channel -------------------------------------------

FLOOD = """
_line = b"x" * 80_000_000 + b"\\n"
_progress = b"".join(
    b'{"event":"progress","id":%d,"message":"' % i + b"x" * 80_000_000 + b'"}\\n' for i in _job_ids()
)
_to_every_descriptor(_line)
_to_every_descriptor(_progress)
del _line, _progress
"""
FORGED = """
for _id in [*_job_ids(), *range(1, 100)]:
    _to_every_descriptor(b'{"event":"failed","id":%d,"error":{"kind":"timeout","message":"forged"}}\\n' % _id)
    _to_every_descriptor(b'{"event":"done","id":%d,"result":{"pong":true}}\\n' % _id)
"""
FORGED_BY_A_FORK = """
_ids = [*_job_ids(), *range(1, 100)]
_copy = os.fork()
if _copy == 0:
    _lines = b"".join(b'{"event":"done","id":%d,"result":{"pong":true}}\\n' % i for i in _ids)
    _until = time.monotonic() + 60
    while time.monotonic() < _until:
        _to_every_descriptor(_lines)
    os._exit(0)
_record(_copy)
"""
WRITERS = {"an-80-MB-line": FLOOD, "forged-answers": FORGED, "forged-answers-from-a-fork": FORGED_BY_A_FORK}


@pytest.mark.parametrize("case", WRITERS)
@in_module_loop
async def test_what_the_model_writes_to_its_descriptors_never_reaches_the_server(worker, tmp_path, case: str):
    """Its own job gets its real answer, or a clear error of its own; the worker is not restarted,
    and the next analysis is answered."""
    record = tmp_path / "pids"
    starts = worker.starts
    try:
        try:
            assert (
                chains(
                    only_model(
                        await analyze(worker, tmp_path / "writes.py", hostile(WRITERS[case], record=str(record)))
                    )
                )
                == GOOD
            )
        except JobFailed as exc:
            assert exc.kind == "crash" and "answer" in exc.error.message, exc.error
        assert chains(only_model(await analyze(worker, tmp_path / "harmless.py", example_text()))) == GOOD
        assert worker.starts == starts
    finally:
        kill(recorded(record))


def test_an_overlong_line_is_dropped_whole():
    lines = Lines(limit=8)
    assert lines.feed(b"short\nmuch too lo") == [b"short"]
    assert lines.feed(b"ng, still\nnext\n1234567\n12345678\n") == [b"next", b"1234567"]
    assert lines.dropped == 2


# ---- 3. no limit crashes the host --------------------------------------------------------------------

HOSTILE_LIMITS = {  # name: (limits, None if the job runs, else the failure's kind and words)
    "a-trillion-seconds": (Limits(1e12, MEMORY_MB), None),
    "infinite-seconds": (Limits(float("inf"), MEMORY_MB), None),
    "a-zettabyte": (Limits(TIMEOUT_S, 10**15), None),  # (in MB: past what RLIMIT_AS can hold)
    "a-millisecond": (Limits(0.001, MEMORY_MB), ("timeout", "the time limit of 0.001 s is too short")),
    "not-a-number": (Limits(float("nan"), MEMORY_MB), ("timeout", "is not a number of seconds")),
    "negative-seconds": (Limits(-5.0, MEMORY_MB), ("timeout", "the time limit of -5 s is too short")),
    "one-megabyte": (Limits(TIMEOUT_S, 1), ("memory", "the memory limit of 1 MB is too small")),
}


def test_limits_are_clamped_or_refused():
    assert bounded(Limits(1e12, 10**9)) == Limits(86400.0, 2**20)
    assert bounded(Limits(2.5, 4096)) == Limits(2.5, 4096)
    for limits, expected in HOSTILE_LIMITS.values():
        checked = bounded(limits)
        assert (expected is None) == isinstance(checked, Limits), (limits, checked)


@pytest.mark.parametrize("case", HOSTILE_LIMITS)
@in_module_loop
async def test_the_worker_runs_or_refuses_a_job_under_any_limits(worker, case: str):
    limits, expected = HOSTILE_LIMITS[case]
    starts = worker.starts
    if expected is None:
        assert await worker.run(PingJob(), limits) == Pong()
    else:
        with pytest.raises(JobFailed) as failed:
            await worker.run(PingJob(), limits)
        assert failed.value.kind == expected[0] and expected[1] in failed.value.error.message
    assert await worker.run(PingJob(), Limits(TIMEOUT_S, MEMORY_MB)) == Pong()
    assert worker.starts == starts


class Host:
    """The worker host on pipes of the test's own: requests as written, events read with a deadline."""

    def __init__(self, cwd):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fuselens.worker.host"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=cwd,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        self.lines = Lines(2 * MAX_MESSAGE_BYTES)
        self.pending: list[bytes] = []

    def send(self, line: bytes) -> None:
        self.proc.stdin.write(line)
        self.proc.stdin.flush()

    def event(self, timeout: float = 180.0):
        deadline = time.monotonic() + timeout
        while not self.pending:
            remaining = deadline - time.monotonic()
            assert remaining > 0, "the worker host did not answer in time"
            if select.select([self.proc.stdout], [], [], remaining)[0]:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                assert chunk, f"the worker host exited (status {self.proc.wait()})"
                self.pending += self.lines.feed(chunk)
        return decode_event(self.pending.pop(0))

    def answer(self, job_id: int):
        while True:
            event = self.event()
            if isinstance(event, (Done, Failed)) and event.id == job_id:
                return event


def test_the_host_runs_or_refuses_a_job_under_any_limits(tmp_path):
    """The host checks the limits itself, whatever server sends them."""
    host = Host(tmp_path)
    try:
        assert isinstance(host.event(), Ready)
        for job_id, (limits, expected) in enumerate(HOSTILE_LIMITS.values(), 1):
            plain = {"seconds": limits.seconds, "memory_mb": limits.memory_mb}
            host.send(
                json.dumps({"op": "run", "id": job_id, "job": {"kind": "ping"}, "limits": plain}).encode() + b"\n"
            )
            answer = host.answer(job_id)
            if expected is None:
                assert isinstance(answer, Done) and answer.result == {"pong": True}, answer
            else:
                assert isinstance(answer, Failed) and answer.error.kind == expected[0], answer
                assert expected[1] in answer.error.message, answer
        host.send(encode(Run(100, PingJob())))
        assert host.answer(100) == Done(100, {"pong": True})
        host.send(encode(Shutdown()))
        host.proc.stdin.close()
        assert host.proc.wait(timeout=60) == 0
    finally:
        if host.proc.poll() is None:
            host.proc.kill()
            host.proc.wait()


# ---- 4. an exit or a hang is placed at the line that ran ------------------------------------------


@in_module_loop
async def test_an_os_exit_is_placed_at_its_line(worker, tmp_path):
    text = hostile(forward="os._exit(3)")
    with pytest.raises(JobFailed) as failed:
        await analyze(worker, tmp_path / "exits.py", text)
    error = failed.value.error
    assert (error.kind, error.file, error.line) == ("crash", str(tmp_path / "exits.py"), line_of(text, "os._exit(3)"))
    assert "it called os._exit(3)" in error.message and "exit status 3" in error.message


@in_module_loop
async def test_a_hang_that_ignores_signals_is_placed_at_its_line(worker, tmp_path):
    text = hostile("signal.signal(signal.SIGUSR1, signal.SIG_IGN)\nwhile True: pass")
    with pytest.raises(JobFailed) as failed:
        await analyze(worker, tmp_path / "hangs.py", text, seconds=2.0)
    error = failed.value.error
    line = line_of(text, "while True: pass")
    assert (error.kind, error.file, error.line) == ("timeout", str(tmp_path / "hangs.py"), line)
    assert f"did not finish within the time limit; it was still running line {line} (<module>)" in error.message


@in_module_loop
async def test_a_crash_is_placed_at_its_line(worker, tmp_path):
    text = hostile(forward="import ctypes; ctypes.string_at(0)")
    with pytest.raises(JobFailed) as failed:
        await analyze(worker, tmp_path / "crashes.py", text)
    error = failed.value.error
    assert (error.kind, error.file, error.line) == ("crash", str(tmp_path / "crashes.py"), line_of(text, "string_at"))
    assert "the worker crashed (SIGSEGV) in the model's code" in error.message
