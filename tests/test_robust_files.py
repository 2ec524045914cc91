"""Robustness, the files the server reads: nothing there can hold up its loop or swamp its memory.

Files the server did not write and reads on its event loop: git's `HEAD` above the workspace (for the
validation history), the `<model>_kernels.py` beside a model (for the quick fix), the workspace's
`pyproject.toml` (for the settings), the user's trust file and the validation history.  Each is put
there as something that blocks a reader (a FIFO, which a plain `open()` waits on for ever), something
of gigabytes, or something the TOML parser rejects; the server says what it did not read and why, and
answers the next request (a hover) as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os

import pytest
import pytest_asyncio
from lsprotocol import types as lsp

from fuselens.codegen.files import GENERATED
from fuselens.server import history

from lsp_helpers import TIMEOUT, Client, example_text, make_workspace, replace_line, running_server, server_pid
from robust_helpers import single_server, status_kb

pytestmark = pytest.mark.asyncio(loop_scope="module")

GIT_HEAD_ABOVE = os.path.join("..", ".git", "HEAD")  # git's HEAD in the folder above the workspace


def git_head_a_fifo_above(root: str) -> None:
    """A repository above the workspace whose HEAD is a FIFO (anyone can make `/tmp/.git`)."""
    os.makedirs(os.path.join(root, "..", ".git"))
    os.mkfifo(os.path.join(root, GIT_HEAD_ABOVE))


client = single_server(prepare=git_head_a_fifo_above)


def release(fifo: str) -> None:
    """Open `fifo` for writing and close it: a reader waiting on it (the old server) gets its end of file."""
    with contextlib.suppress(OSError):  # (no reader: nothing waits on it)
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@contextlib.asynccontextmanager
async def fifo_at(path: str):
    """A FIFO at `path` for as long as the block runs; whatever waits on it is let go at the end."""
    os.mkfifo(path)
    try:
        yield path
    finally:
        release(path)


async def answered(request, what: str):
    """The answer to `request`, which must come within TIMEOUT seconds."""
    try:
        return await asyncio.wait_for(request, TIMEOUT)
    except TimeoutError:
        raise AssertionError(f"no answer to {what} within {TIMEOUT:.0f} s: the server is held up") from None


async def hover_is_answered(client: Client, uri: str) -> None:
    hover = await answered(client.hover(uri, 19), "a hover")
    assert hover is not None and "c0" in hover.contents.value


async def opened(client: Client, name: str) -> str:
    uri = client.open(name, example_text())
    await client.diagnostics_of(uri, 1)
    return uri


# ---- FIFOs where the server reads -----------------------------------------------------------------


async def test_a_fifo_for_git_head_above_the_workspace_holds_nothing_up(client: Client):
    uri = await opened(client, "git_fifo.py")
    try:
        result = await answered(client.command("fuselens.validateKernel", uri, "c0", {"interpret": True}), "validate")
        assert [c["status"] for m in result["models"] for c in m["clusters"]] == ["verified"]
        (model,) = result["results_view"]["models"]
        assert model["rows"][0][:3] == ["c0", "mul → relu → add", "verified"]
        await hover_is_answered(client, uri)
    finally:
        release(client.path(GIT_HEAD_ABOVE))


async def test_a_kernel_module_that_is_a_fifo_disables_the_fix(client: Client):
    uri = await opened(client, "fifo_net.py")
    async with fifo_at(client.path("fifo_net_kernels.py")):
        actions = await answered(client.code_actions(uri, 18), "a code action")
        assert len(actions) == 1 and actions[0].edit is None, actions
        assert actions[0].disabled is not None
        assert actions[0].disabled.reason.startswith("fifo_net_kernels.py was not read: it is a FIFO"), actions[0]
        shown = await answered(client.command("fuselens.showKernel", uri), "Show kernels")
        assert "def _cluster0_kernel" in shown["text"]  # fuselens's own module, the FIFO left out
        await hover_is_answered(client, uri)


async def test_a_validation_history_that_is_a_fifo_is_skipped(client: Client):
    uri = await opened(client, "history_fifo.py")
    path = history.history_path(client.path("history_fifo.py"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    async with fifo_at(path):
        shown = await answered(client.command("fuselens.validationResults", uri), "Show validation results")
        assert shown["results_view"] is None
        await client.wait_until(
            lambda: any(f"{path} skipped: it is a FIFO" in m.message for m in client.log_messages), "the log line"
        )
        await hover_is_answered(client, uri)


# ---- files of gigabytes -----------------------------------------------------------------------------


async def test_a_kernel_module_of_gigabytes_is_not_read(client: Client):
    """Beside the model, a `<model>_kernels.py` of 2 GB that starts as fuselens's do (a sparse file:
    it takes no disk).  Reading it took minutes and 4 GB; it is refused from its size."""
    uri = await opened(client, "huge_net.py")
    with open(client.path("huge_net_kernels.py"), "wb") as fh:
        fh.write(GENERATED.encode() + b"\n")
        fh.truncate(2 << 30)
    actions = await answered(client.code_actions(uri, 18), "a code action")
    assert len(actions) == 1 and actions[0].disabled is not None, actions
    assert actions[0].disabled.reason == (
        "huge_net_kernels.py was not read: it is 2 GB, more than the 16 MB fuselens reads; nothing was written"
    )
    await hover_is_answered(client, uri)
    assert status_kb(server_pid(client), "VmHWM") < 1 << 20  # its peak: under 1 GB (it is about 100 MB)


# ---- a pyproject.toml that is not read ----------------------------------------------------------


def deeply_nested(depth: int = 100_000) -> bytes:
    return b"x = " + b"[" * depth + b"]" * depth + b"\n"


def write_pyproject(root: str, case: str) -> None:
    path = os.path.join(root, "pyproject.toml")
    os.unlink(path)
    if case == "a FIFO":
        os.mkfifo(path)
        return
    with open(path, "wb") as fh:
        if case == "300 MB":
            fh.write(b"[tool.fuselens]\n")
            fh.truncate(300 << 20)
        elif case == "not UTF-8":
            fh.write(b'[tool.fuselens]\nseverity = "hint"\n# caf\xe9\n')
        else:
            fh.write(deeply_nested())


PYPROJECTS = {  # how each is named in the warning
    "a FIFO": "was not read: it is a FIFO, not a regular file",
    "300 MB": "was not read: it is 300 MB, more than the 1 MB fuselens reads",
    "not UTF-8": "was not read: it is not UTF-8 text (invalid continuation byte at byte 39)",
    "nested too deeply": "was not read: its arrays or tables are nested too deeply",
}


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=list(PYPROJECTS))
async def untrusted(request, tmp_path_factory):
    """A server on a workspace whose pyproject.toml is `request.param`; nothing runs (untrusted), and
    the client's settings hold a bad value, whose warning says they were read."""
    root = make_workspace(str(tmp_path_factory.mktemp("ws") / "pyproject ü"))
    write_pyproject(root, request.param)
    async with running_server(
        "visual-studio-code",
        root,
        {"workspaceTrusted": False},
        {"fuselens": {"device": "a sundial"}},
        wait_ready=False,
    ) as client:
        client.case = request.param
        yield client
    release(os.path.join(root, "pyproject.toml"))


async def test_an_unreadable_pyproject_is_named_and_the_clients_settings_still_apply(untrusted: Client):
    client = untrusted
    pyproject = client.path("pyproject.toml")
    try:
        warned = await client.wait_until(lambda: client.messages_matching(pyproject), "the pyproject warning")
        (warning,) = warned
        assert warning.type == lsp.MessageType.Warning
        assert f"{pyproject} {PYPROJECTS[client.case]}" in warning.message, warning.message
        await client.wait_until(
            lambda: client.messages_matching("settings: fuselens.device"), "the client's settings read"
        )
        assert client.configuration_requests >= 1
        await answered(client.hover(client.open("model.py", example_text()), 19), "a hover")
        assert status_kb(server_pid(client), "VmHWM") < 200 << 10  # (300 MB read took it to 619 MB)
    finally:
        release(pyproject)


# A trusted root: the 2 s limit the client sets holds, whatever the pyproject.toml there is.
not_utf8 = single_server(
    prepare=lambda root: write_pyproject(root, "not UTF-8"),
    configuration={"fuselens": {"worker": {"timeoutSeconds": 2}}},
)


async def test_the_clients_time_limit_holds_beside_a_pyproject_that_is_not_utf8(not_utf8: Client):
    client = not_utf8
    await client.wait_until(lambda: client.messages_matching("is not UTF-8 text"), "the pyproject warning")
    assert not [m.message for m in client.messages if m.type == lsp.MessageType.Error]  # ("Error in server")
    uri = client.open("slow_net.py", replace_line(example_text(), 19, "        __import__('time').sleep(40)"))
    (error,) = await client.diagnostics_of(uri, 1)
    assert error.code == "timeout" and "worker.timeoutSeconds is 2 s" in error.message, error.message


# ---- the user's trust file ---------------------------------------------------------------------------


def trust_file_a_fifo(root: str) -> str:
    config = os.path.join(os.path.dirname(root), "config")
    os.makedirs(os.path.join(config, "fuselens"))
    os.mkfifo(os.path.join(config, "fuselens", "trusted-folders.json"))
    return config


@pytest_asyncio.fixture(loop_scope="module")
async def trust_fifo(tmp_path):
    """A server that must ask the user's trust file, which is a FIFO."""
    root = make_workspace(str(tmp_path / "ws"))
    config = trust_file_a_fifo(root)
    fifo = os.path.join(config, "fuselens", "trusted-folders.json")
    async with running_server("visual-studio-code", root, {}, None, {"XDG_CONFIG_HOME": config}, False) as client:
        try:
            yield client
        finally:
            release(fifo)


async def test_a_trust_file_that_is_a_fifo_trusts_nothing(trust_fifo: Client):
    client = trust_fifo
    uri = client.open("model.py", example_text())
    assert await answered(client.hover(uri, 19), "a hover") is None  # nothing analyzed, and no wait
    await client.wait_until(lambda: client.messages_matching("waits until you trust"), "the trust message")
    assert not json.dumps([p.uri for p in client.published]).count("model.py")
