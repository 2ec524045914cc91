"""Language server, processes: the server never imports torch, the worker gets a scrubbed
environment, the worker host starts with the server, and nothing outlives the server."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest

from fuselens.server.host_process import start_host
from fuselens.server.workers import WorkerClient
from fuselens.worker.protocol import Limits, PingJob, Pong

from lsp_helpers import (
    INTERPRET,
    PROFILES,
    SERVER,
    TIMEOUT,
    Client,
    children,
    make_workspace,
    running,
    running_server,
    server_pid,
)

SECRETS = {
    "GITHUB_TOKEN": "ghp_x",
    "AWS_SECRET_ACCESS_KEY": "aws_x",
    "FUSELENS_TEST_API_KEY": "key_x",
    "DATABASE_PASSWORD": "pw_x",
    "XDG_SESSION_COOKIE": "0123456789abcdef-1700000000.1-1234",  # in a family that passes (XDG_*)
}
KEPT = {"TORCH_SHOW_CPP_STACKTRACES": "1"}


def mapped_libraries(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as fh:
        return {line.split()[-1] for line in fh if len(line.split()) >= 6}


def environment(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as fh:
        pairs = [item.decode(errors="replace").split("=", 1) for item in fh.read().split(b"\0") if b"=" in item]
    return dict(pairs)


def torch_libraries(libraries: set[str]) -> set[str]:
    return {lib for lib in libraries if "libtorch" in lib or "/torch/_C" in lib or "libtriton" in lib}


async def workload(client: Client) -> str:
    """Everything a user does in an editor session, so that any lazy import would have happened."""
    uri = client.open("example_net.py")
    await client.diagnostics_of(uri, 1)
    assert await client.hover(uri, 19) is not None
    assert await client.inlay_hints(uri)
    assert await client.code_lenses(uri)
    actions = await client.code_actions(uri, 18)
    assert actions
    await client.command("fuselens.showKernel", uri)
    client.answer = lambda params: INTERPRET
    result = await client.command("fuselens.validateKernel", uri, "c0")
    assert result["models"][0]["clusters"][0]["status"] == "verified"
    client.apply_workspace_edit(actions[0].edit)
    if actions[0].command:
        await client.command(actions[0].command.command, *actions[0].command.arguments)
    client.save(uri)
    await client.diagnostics_of(uri)
    return uri


# Names in the families the worker needs (XDG_*, CONDA_*, CUDA_*, TORCH_*, ...) that say they hold a credential.
CREDENTIALS = [
    "XDG_SESSION_COOKIE",
    "XDG_SESSION_KEY",
    "XDG_SESSION_ID",
    "CONDA_API_TOKEN",
    "CONDA_PASSPHRASE",
    "CUDA_SECRET",
    "TORCH_HUB_APIKEY",
    "TORCH_HUB_AUTH",
    "TRITON_PRIVATE_KEY",
    "TRITON_SIGNING_KEY_FILE",
    "NVIDIA_ACCESS_KEY_ID",
    "LC_PASSWD",
    "XDG_CREDENTIALS_DIR",
    "XDG_SIGNATURE",
]
# ... and ones it needs, which no credential rule may take.
NEEDED = [
    "PATH",
    "HOME",
    "LC_ALL",
    "PYTHONPATH",
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_SESSION_TYPE",
    "CONDA_PREFIX",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "TORCH_HOME",
    "TORCH_CUDA_ARCH_LIST",
    "TRITON_CACHE_DIR",
]


def test_the_environment_filter_drops_every_credential_and_keeps_what_the_worker_needs():
    from fuselens.server.host_process import scrubbed_environment

    env = scrubbed_environment({name: "x" for name in CREDENTIALS + NEEDED})
    assert sorted(set(CREDENTIALS) & set(env)) == []
    assert set(NEEDED) <= set(env), sorted(set(NEEDED) - set(env))


@pytest.mark.parametrize("profile", PROFILES)
async def test_the_server_never_imports_torch_and_exits_cleanly(profile: str, tmp_path):
    root = make_workspace(str(tmp_path / "ws"))
    async with running_server(profile, root, server_env={**SECRETS, **KEPT}) as client:
        await workload(client)
        server = server_pid(client)
        (host,) = children(server)

        assert torch_libraries(mapped_libraries(server)) == set()
        assert torch_libraries(mapped_libraries(host))  # the same check finds torch where it is loaded

        env = environment(host)  # the worker runs the user's code: no credentials reach it
        assert not set(SECRETS) & set(env)
        assert env["TORCH_SHOW_CPP_STACKTRACES"] == "1" and env["OMP_NUM_THREADS"] == "1"
        assert set(SECRETS) <= set(environment(server))  # (they did reach the server)

        await client.shutdown_session()  # shutdown, then exit: the server and its worker are gone
        assert client._server.returncode == 0
        await client.wait_until(lambda: not running(host), "the worker to exit", poll=0.05)


@pytest.mark.parametrize("profile", PROFILES)
async def test_the_worker_does_not_outlive_a_killed_server(profile: str, tmp_path):
    root = make_workspace(str(tmp_path / "ws"))
    async with running_server(profile, root) as client:
        (host,) = children(server_pid(client))
        os.kill(server_pid(client), signal.SIGKILL)  # the editor crashed, say
        await client._server.wait()
        await client.wait_until(lambda: not running(host), "the worker to exit", poll=0.05)


def command_line(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [part.decode(errors="replace") for part in fh.read().split(b"\0") if part]
    except OSError:  # (gone)
        return []


def hosts(server: int) -> list[int]:
    """The worker hosts the server started (a child between its fork and its exec is not one yet)."""
    return [pid for pid in children(server) if command_line(pid)[1:] == ["-P", "-m", "fuselens.worker.host"]]


async def eventually(predicate, what: str, timeout: float = TIMEOUT):
    """Poll `predicate` (state outside any conversation: processes) until it holds."""
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f}s: {what}")
        await asyncio.sleep(0.02)
    return result


async def test_the_worker_host_starts_before_the_editor_says_anything():
    """A file's first analysis waits for the worker host to import torch: the host starts with the
    server, and imports it while the server itself starts and the editor says hello."""
    server = await asyncio.create_subprocess_exec(
        *SERVER, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        (host,) = await eventually(lambda: hosts(server.pid), "the worker host to start before `initialize`")
        assert children(server.pid) == [host]
    finally:
        assert server.stdin is not None
        server.stdin.close()  # the editor went away without a word: the server exits, and so does its host
        await server.wait()
    await eventually(lambda: not running(host), "the worker host to exit with the server")


@pytest.mark.parametrize("profile", PROFILES)
async def test_the_first_analysis_runs_in_the_host_started_with_the_server(profile: str, tmp_path):
    root = make_workspace(str(tmp_path / "ws"))
    async with running_server(profile, root, wait_ready=False) as client:
        (host,) = children(server_pid(client))  # (right after `initialize`: there already)
        uri = client.open("example_net.py")
        assert len(await client.diagnostics_of(uri, 1)) >= 3
        assert children(server_pid(client)) == [host]
        assert any(m.message.startswith(f"worker ready: pid {host},") for m in client.log_messages)


async def test_a_host_ended_for_an_untrusted_workspace_makes_way_for_a_fresh_one_at_once():
    """`initialize` ends the host launched with the server when no folder is trusted; a file trusted on
    its own (a link into a trusted folder) opened right after gets a fresh host, not the dying one."""
    worker = WorkerClient()
    try:
        worker.adopt(await start_host(sys.executable))  # (as `fuselens serve` starts its first host)
        (launched,) = await eventually(lambda: hosts(os.getpid()), "the host to start")
        worker.discard()
        assert await worker.run(PingJob(), Limits(60.0, 2048)) == Pong()
        assert worker.info is not None and worker.info.pid != launched and worker.starts == 2
    finally:
        await worker.stop()


async def test_a_host_that_said_it_is_ready_before_anyone_asked_is_the_one_used():
    """The host launched with the server can be ready (torch imported; its warm-up waits for a quiet
    moment) before `initialized` asks for it: the first request takes that host as it is, says in the
    log that it is ready, and starts no other."""
    said: list[str] = []
    worker = WorkerClient(log=said.append)
    try:
        worker.adopt(await start_host(sys.executable))  # (as `fuselens serve` starts its first host)
        await eventually(lambda: worker._ready is not None and worker._ready.done(), "the host to say it is ready")
        await worker.ensure_started()
        assert worker.info is not None and worker.starts == 1
        assert [line for line in said if line.startswith(f"worker ready: pid {worker.info.pid},")], said
        assert await worker.run(PingJob(), Limits(60.0, 2048)) == Pong()
    finally:
        await worker.stop()
