"""The remote runner (`remoteRunner`): validation on a GPU elsewhere, through a command line.

Here the "remote" is a script the test writes, which does what a hostile or broken runner does:
dump the environment it was given, sleep for ever (with a child in its process group, or one that
left it by `setsid()`, or a double-forked daemon, each holding the runner's output), or print
hundreds of megabytes.  Each runs through the real server's validate command (this
machine has no CUDA device, so validation goes to the runner); the template checks run on the
runner module directly.  Processes are checked by pid; every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import json
import os
import shlex
import signal
import sys
import time

import pytest
import pytest_asyncio
from pygls.exceptions import JsonRpcException

from fuselens.server.runner import RemoteFailed, RemoteRunners, template_problem

from lsp_helpers import (
    TIMEOUT,
    Client,
    example_text,
    make_workspace,
    running,
    running_server,
    server_pid,
    time_limit,
)
from robust_helpers import raw_notify, status_kb

pytestmark = pytest.mark.asyncio(loop_scope="module")

REQUEST_CANCELLED = -32800
SECRETS = {
    "FAKE_TOKEN": "t0ps3cret",
    "AWS_SECRET_ACCESS_KEY": "hunter2",
    "GITHUB_TOKEN": "ghp_x",
    "XDG_SESSION_COOKIE": "0123456789abcdef-1700000000.1-1234",  # in a family that passes (XDG_*)
    "CONDA_SESSION_KEY": "k3y",
}
STRAY_SECONDS = 300  # how long a runner's stray sleeps: far past every wait of these tests
FLOOD_MB = 300

# The runner: `runner.py MODE FILE RESULT`; it reports what it saw in files beside itself.
RUNNER = f"""
import json, os, subprocess, sys, time

mode, model, result = sys.argv[1:4]
here = os.path.dirname(os.path.abspath(__file__))
runner = os.getpid()


def tell(name, value):
    with open(os.path.join(here, name + ".tmp"), "w") as fh:
        json.dump(value, fh)
    os.replace(os.path.join(here, name + ".tmp"), os.path.join(here, name + ".json"))


def stray(leave):
    # A process that leaves the runner's group (by setsid, or as a double-forked daemon), keeps
    # the runner's output open, says who it is, and sleeps.
    if os.fork():
        return
    os.setsid()
    if leave == "daemon" and os.fork():
        os._exit(0)
    tell("pids", {{"runner": runner, "child": os.getpid(), "group": os.getpgid(runner), "its_group": os.getpgid(0)}})
    time.sleep({STRAY_SECONDS})
    os._exit(0)


def report():
    cluster = {{"id": "c0", "kernel": "fused_c0", "status": "verified", "max_abs": 0.0}}
    model_check = {{"name": "ExampleNet", "inputs": [[4, 8]], "dtypes": ["float32"], "clusters": [cluster]}}
    with open(result, "w") as fh:
        json.dump({{"file": model, "mode": "cuda", "device": "remote H200", "models": [model_check]}}, fh)


if mode == "env":
    tell("seen", {{"env": dict(os.environ), "argv": sys.argv[1:], "stdin": os.readlink("/proc/self/fd/0")}})
    report()
elif mode == "sleep":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    tell("pids", {{"runner": os.getpid(), "child": child.pid, "group": os.getpgid(0)}})
    time.sleep(120)
elif mode in ("setsid", "daemon"):
    stray(mode)
    time.sleep({STRAY_SECONDS})
elif mode == "daemon-then-report":
    stray("daemon")
    while not os.path.exists(os.path.join(here, "pids.json")):
        time.sleep(0.01)
    report()
elif mode == "flood":
    line = b"x" * 1023 + b"\\n"
    block = line * 1024
    for _ in range({FLOOD_MB}):
        sys.stdout.buffer.write(block)
    sys.stdout.flush()
    report()
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def runner_script(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("runner")
    path = folder / "runner.py"
    path.write_text(RUNNER)
    return str(path)


def template(script: str, mode: str) -> str:
    """A runner command line as a user writes one: quoted where the shell would need it."""
    return f"{shlex.quote(sys.executable)} {shlex.quote(script)} {mode} {{file}} {{json}}"


def beside(script: str, name: str) -> str:
    return os.path.join(os.path.dirname(script), name + ".json")


def read_json(path: str):
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tmp_path_factory):
    root = make_workspace(str(tmp_path_factory.mktemp("ws") / "remote models ü"))
    async with running_server("visual-studio-code", root, server_env=SECRETS) as client:
        yield client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def analyzed(client: Client) -> str:
    uri = client.open("remote_net.py", example_text())
    await client.diagnostics_of(uri, 1)
    return uri


async def configure(client: Client, uri: str, **settings) -> None:
    """New settings, as an editor sends them; returns once the server re-analyzed with them."""
    seen = len(client.published)
    raw_notify(
        client, "workspace/didChangeConfiguration", {"settings": {"fuselens": {"compareInductor": False, **settings}}}
    )
    await client.diagnostics_of(uri, client.versions[uri], after=seen)


def environment(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as fh:
        pairs = [entry.split(b"=", 1) for entry in fh.read().split(b"\0") if b"=" in entry]
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


_ids = itertools.count(1)


def validate(client: Client, uri: str) -> tuple[str, concurrent.futures.Future]:
    """Start validating c0 as a request of a known id (to cancel it by), without waiting."""
    msg_id = f"validate-{next(_ids)}"
    future: concurrent.futures.Future = concurrent.futures.Future()
    client.protocol._request_futures[msg_id] = future
    client.protocol._send_data(
        {
            "jsonrpc": "2.0",
            "id": msg_id,
            "method": "workspace/executeCommand",
            "params": {"command": "fuselens.validateKernel", "arguments": [uri, "c0"]},
        }
    )
    return msg_id, future


async def answer(future: concurrent.futures.Future, timeout: float = TIMEOUT):
    """The result (as plain JSON values), or the JsonRpcException, the server answered."""
    try:
        return plain(await asyncio.wait_for(asyncio.wrap_future(future), timeout))
    except JsonRpcException as exc:
        return exc


def plain(value):
    """A raw response's value as dicts and lists (pygls reads JSON objects as named tuples)."""
    if hasattr(value, "_asdict"):
        return {k: plain(v) for k, v in value._asdict().items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


async def sleeping_runner(client: Client, script: str) -> dict[str, int]:
    """The pids of the sleeping runner and its child, once both run."""
    pids = await client.wait_until(lambda: read_json(beside(script, "pids")), "the runner to start", poll=0.05)
    assert running(pids["runner"]) and running(pids["child"])
    assert pids["group"] == pids["runner"]  # its own process group: killed whole, without the server
    return pids


async def detached_runner(client: Client, script: str) -> dict[str, int]:
    """The pids of the runner and of its child that left its process group, once both run."""
    pids = await client.wait_until(lambda: read_json(beside(script, "pids")), "the runner to start", poll=0.05)
    assert running(pids["runner"]) and running(pids["child"])
    assert pids["group"] == pids["runner"] != pids["its_group"]  # the child left the runner's process group
    return pids


@pytest.fixture(autouse=True)
def nothing_left_running(runner_script):
    """Whatever a runner of a test left is killed when the test ends, passed or failed (a server
    that fails to kill it must not leave it to the tests after)."""
    yield
    pids = read_json(beside(runner_script, "pids")) or {}
    for pid in (pids.get("runner"), pids.get("child")):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
            if runner_script.encode() in fh.read() and running(pid):  # (its own, not a pid used again)
                os.kill(pid, signal.SIGKILL)


async def gone(client: Client, pids: dict[str, int]) -> None:
    await client.wait_until(
        lambda: not running(pids["runner"]) and not running(pids["child"]), "the runner to be killed", poll=0.05
    )


def forget(script: str, name: str) -> None:
    if os.path.exists(beside(script, name)):
        os.remove(beside(script, name))


# ---- through the server ------------------------------------------------------------------------


async def test_the_runner_gets_a_scrubbed_environment_and_no_shell(client: Client, analyzed: str, runner_script):
    await configure(client, analyzed, remoteRunner=template(runner_script, "env"))
    told = len(client.messages)
    result = await client.command("fuselens.validateKernel", analyzed, "c0")

    assert result["device"] == "remote H200" and result["models"][0]["clusters"][0]["status"] == "verified"
    assert "on remote H200: 1 verified" in client.messages[told:][-1].message  # short; the log has it all
    assert any("c0 verified" in m.message for m in client.log_messages if m.message.startswith("validation of"))
    seen = read_json(beside(runner_script, "seen"))
    assert set(SECRETS) <= set(environment(server_pid(client)))  # the server had them ...
    assert not set(SECRETS) & set(seen["env"]), sorted(seen["env"])
    assert seen["env"]["PATH"] and len(seen["env"]) < 15, sorted(seen["env"])
    # No shell: the model's path, spaces and all, is one argument; stdin is not the editor's stream.
    mode, model, result_file = seen["argv"]
    assert mode == "env" and model == client.path("remote_net.py") and " " in model
    assert result_file.endswith("validation.json") and not os.path.exists(result_file)  # cleaned up
    assert seen["stdin"] == "/dev/null"


async def test_a_runner_past_its_time_limit_is_killed_with_its_children(client: Client, analyzed: str, runner_script):
    await configure(
        client, analyzed, remoteRunner=template(runner_script, "sleep"), worker={"validateTimeoutSeconds": 3}
    )
    forget(runner_script, "pids")
    told = len(client.messages)
    _, future = validate(client, analyzed)
    pids = await sleeping_runner(client, runner_script)

    result = await answer(future)
    assert result["error"] == "timeout", result
    assert "did not finish within 3 s (worker.validateTimeoutSeconds); it was stopped" in result["message"]
    await gone(client, pids)
    assert any("did not finish within 3 s" in m.message for m in client.messages[told:])


@pytest.mark.parametrize("leave", ["setsid", "daemon"])
async def test_a_runner_whose_child_left_its_group_is_stopped_at_the_limit(
    client: Client, analyzed: str, runner_script, leave: str
):
    """A child that left the runner's process group keeps the runner's output open and sleeps far
    past the limit: the validation is still answered at the limit, and nothing of the runner is
    left by then."""
    await configure(client, analyzed, remoteRunner=template(runner_script, leave), worker={"validateTimeoutSeconds": 3})
    forget(runner_script, "pids")
    _, future = validate(client, analyzed)
    pids = await detached_runner(client, runner_script)

    result = await answer(future)
    assert result["error"] == "timeout", result
    assert "did not finish within 3 s (worker.validateTimeoutSeconds); it was stopped" in result["message"]
    assert not running(pids["runner"]) and not running(pids["child"])  # killed before the answer


async def test_a_daemon_the_runner_leaves_behind_does_not_hold_its_answer(client: Client, analyzed: str, runner_script):
    """The runner writes its report and exits, leaving a daemon that holds its output: the report is
    the answer as soon as the runner exits, and the daemon is killed."""
    await configure(client, analyzed, remoteRunner=template(runner_script, "daemon-then-report"))
    forget(runner_script, "pids")
    result = await answer(validate(client, analyzed)[1])

    assert result["models"][0]["clusters"][0]["status"] == "verified", result
    pids = read_json(beside(runner_script, "pids"))  # (the runner waited for the daemon to write them)
    assert pids["its_group"] != pids["group"] and not running(pids["child"])


@pytest.mark.timing
async def test_a_runner_whose_child_left_its_group_is_answered_within_moments_of_the_limit(
    client: Client, analyzed: str, runner_script
):
    await configure(
        client, analyzed, remoteRunner=template(runner_script, "daemon"), worker={"validateTimeoutSeconds": 3}
    )
    forget(runner_script, "pids")
    _, future = validate(client, analyzed)
    await detached_runner(client, runner_script)
    started = time.monotonic()  # (the runner started a little earlier still)
    result = await answer(future)
    waited = time.monotonic() - started
    assert result["error"] == "timeout", result
    assert waited < time_limit(3 + 1), f"answered {waited:.1f} s after the runner started, with a 3 s limit"


async def test_cancelling_the_validation_kills_the_runner(client: Client, analyzed: str, runner_script):
    await configure(client, analyzed, remoteRunner=template(runner_script, "sleep"))
    forget(runner_script, "pids")
    msg_id, future = validate(client, analyzed)
    pids = await sleeping_runner(client, runner_script)

    raw_notify(client, "$/cancelRequest", {"id": msg_id})
    error = await answer(future)
    assert isinstance(error, JsonRpcException) and error.code == REQUEST_CANCELLED, error
    await gone(client, pids)


async def test_a_flood_of_output_is_bounded(client: Client, analyzed: str, runner_script):
    """300 MB of output: the server keeps its last megabyte, and progress shows a line now and then."""
    await configure(client, analyzed, remoteRunner=template(runner_script, "flood"))
    pid = server_pid(client)
    peak_before = status_kb(pid, "VmHWM")
    tokens = set(client.progress_reports)

    result = await client.command("fuselens.validateKernel", analyzed, "c0")

    assert result["models"][0]["clusters"][0]["status"] == "verified", result
    grown_mb = (status_kb(pid, "VmHWM") - peak_before) / 1024
    assert grown_mb < 100, f"the server's peak memory grew by {grown_mb:.0f} MB for {FLOOD_MB} MB of output"
    local, remote = sorted(set(client.progress_reports) - tokens, key=list(client.progress_reports).index)
    assert len(client.progress_reports[local]) == 2  # the local check: begun, and ended before the runner
    reports = [v for v in client.progress_reports[remote] if type(v).__name__ == "WorkDoneProgressReport"]
    assert 1 <= len(reports) < 1000, len(reports)  # (a report per line would be 307,200)
    assert any("xxxx" in (r.message or "") for r in reports)


async def test_a_bad_template_is_named_and_ignored(client: Client, analyzed: str, runner_script):
    """{0}, a stray brace, an unclosed quote: a warning that says what is wrong; validation falls
    back to what it does without a runner (it asks about the interpreter)."""
    for bad, words in (
        ("ssh gpu fuselens validate {file} {0}", "has the field {0}; only {file} and {json} are filled in"),
        ("ssh gpu fuselens validate {file} }", "Single '}' encountered"),
        ("ssh gpu 'fuselens validate {file}", "no closing quotation"),
        ("ssh gpu fuselens validate {file} --json {json!r}", "{json} takes no format or conversion"),
    ):
        told, asked = len(client.messages), len(client.message_requests)
        await configure(client, analyzed, remoteRunner=bad)
        (warning,) = [m for m in client.messages[told:] if "remoteRunner" in m.message]
        assert words in warning.message and "ignored" in warning.message, warning.message
        result = await client.command("fuselens.validateKernel", analyzed, "c0")
        assert "error" not in result, result
        assert len(client.message_requests) == asked + 1  # the interpreter question: no runner was run
        assert not [m for m in client.messages[told:] if "Traceback" in m.message]


async def test_a_bad_profiler_template_is_named_as_remote_profiler(client: Client, analyzed: str):
    """`remoteProfiler` is checked when the settings are read, as `remoteRunner` is, and named."""
    for bad, words in (
        ("ssh gpu fuselens profile {file} {0}", "has the field {0}; only {file} and {json} are filled in"),
        ("ssh gpu 'fuselens profile {file}", "no closing quotation"),
    ):
        told = len(client.messages)
        await configure(client, analyzed, remoteProfiler=bad)
        (warning,) = [m for m in client.messages[told:] if "remote" in m.message]
        assert "fuselens.remoteProfiler" in warning.message and "remoteRunner" not in warning.message
        assert words in warning.message and "ignored" in warning.message, warning.message


@pytest.mark.parametrize(
    ("ending", "mode"), [("shutdown", "sleep"), ("exit", "sleep"), ("SIGTERM", "setsid"), ("SIGKILL", "daemon")]
)
async def test_the_runner_does_not_outlive_the_server(ending: str, mode: str, runner_script, tmp_path):
    """However the server ends: `shutdown` (answered, and the command answered as cancelled),
    `exit` without it (exit code 1, as the LSP spec says), a termination signal, or SIGKILL (which
    the server cannot see): the runner goes, and so does what it started, in its group or not."""
    root = make_workspace(str(tmp_path / "ws"))
    settings = {"remoteRunner": template(runner_script, mode)}
    async with running_server("visual-studio-code", root, {"workspaceTrusted": True, "settings": settings}) as client:
        uri = client.open("example_net.py")
        await client.diagnostics_of(uri, 1)
        forget(runner_script, "pids")
        _, future = validate(client, uri)
        pids = await (sleeping_runner if mode == "sleep" else detached_runner)(client, runner_script)

        if ending == "shutdown":
            assert await asyncio.wait_for(client.shutdown_async(None), TIMEOUT) is None
            error = await answer(future)
            assert isinstance(error, JsonRpcException) and error.code == REQUEST_CANCELLED, error
            await gone(client, pids)
            client.exit(None)
            assert await asyncio.wait_for(client._server.wait(), TIMEOUT) == 0
        elif ending == "exit":
            raw_notify(client, "exit", None)
            assert await asyncio.wait_for(client._server.wait(), TIMEOUT) == 1
        else:
            os.kill(server_pid(client), getattr(signal, ending))
            code = await asyncio.wait_for(client._server.wait(), TIMEOUT)
            assert code == (1 if ending == "SIGTERM" else -signal.SIGKILL)
        await gone(client, pids)


# ---- the runner module -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ("", "is empty"),
        ("ssh gpu validate", "has no {file}"),
        ("ssh gpu validate {0}", "has the field {0}"),
        ("ssh gpu validate {}", "has the field {}"),
        ("ssh gpu validate {file} {out}", "has the field {out}"),
        ("ssh gpu validate {file.name}", "has the field {file.name}"),
        ("ssh gpu validate {file[0]}", "has the field {file[0]}"),
        ("ssh gpu validate {file:>9}", "takes no format or conversion"),
        ("ssh gpu validate {file} }", "Single '}' encountered"),
        ("ssh gpu validate {file", "expected '}' before end of string"),
        ("ssh gpu 'validate {file}", "no closing quotation"),
    ],
)
async def test_templates_are_checked_before_anything_runs(bad: str, words: str, tmp_path):
    assert words in (template_problem(bad) or ""), template_problem(bad)
    with pytest.raises(RemoteFailed, match="remoteRunner") as caught:
        await RemoteRunners().validate(bad, str(tmp_path / "m.py"), 5, lambda line: None)
    assert caught.value.kind == "settings"


async def test_a_profiler_template_is_named_as_remote_profiler(tmp_path):
    with pytest.raises(RemoteFailed) as caught:
        await RemoteRunners().profile("ssh gpu profile", str(tmp_path / "m.py"), 5, lambda line: None)
    assert str(caught.value) == "remoteProfiler 'ssh gpu profile' has no {file} for the model's path"
    assert caught.value.kind == "settings"


async def test_good_templates_fill_whole_words(tmp_path):
    for good in (
        "ssh gpu fuselens validate {file} --json {json}",
        "sh -c 'fuselens validate \"$1\"' _ {file}",
        "echo {{literal}} {file}",
    ):
        assert template_problem(good) is None, good
    runners = RemoteRunners()
    out = tmp_path / "seen.json"
    script = f"import json, sys; json.dump(sys.argv[1:], open({str(out)!r}, 'w'))"
    path = str(tmp_path / "a model; rm -rf ~ $(x) 'q'.py")
    with pytest.raises(RemoteFailed, match="exited 0 without a validation report"):
        await runners.validate(
            f"{shlex.quote(sys.executable)} -c {shlex.quote(script)} {{file}} {{{{x}}}}", path, 5, print
        )
    assert json.loads(out.read_text()) == [path, "{x}"]
    assert not runners.running


async def test_the_runners_exit_status_and_last_output_are_named(tmp_path):
    with pytest.raises(RemoteFailed) as caught:
        await RemoteRunners().validate(
            "sh -c 'echo no GPU free >&2; exit 3' _ {file}", str(tmp_path / "m.py"), 5, print
        )
    assert str(caught.value) == "the remote runner exited 3 without a validation report: no GPU free"


async def test_a_missing_runner_program_is_a_clear_failure(tmp_path):
    with pytest.raises(RemoteFailed, match="'no-such-runner-xyz' cannot be started: No such file or directory"):
        await RemoteRunners().validate("no-such-runner-xyz {file}", str(tmp_path / "m.py"), 5, print)
