"""Robustness, memory: what the server keeps does not grow with the requests and notifications it handles.

The server's resident memory (VmRSS of its process) is read after a warm-up (the first requests fill
caches and the allocator's pools, which stay), then after thousands more of the same messages: it
must stay within GROWTH_LIMIT_MB.  Commands that succeed with large results ("Show kernels" of a whole
file, ~15 kB here), commands that fail in their handler, and notifications handled by coroutines (a
settings change, which also makes the server ask the client for its settings) each once were kept for
good, with their results or tracebacks.  (tests/test_protocol_fuzz.py measures the same over random
messages; benchmarks/fuzz_memory.py over 100,000 of them.)
"""

from __future__ import annotations

import asyncio
import collections
import itertools

import pytest
import pytest_asyncio
from lsprotocol import types as lsp

from fuzz_helpers import RawServer, initialize
from lsp_helpers import Client, example_text, make_workspace, running_server, server_pid, uri_of
from robust_helpers import single_server, status_kb

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

GROWTH_LIMIT_MB = 20
WARM_UP = 1_000
MEASURED = 10_000
SETTINGS_CHANGES = 50_000  # each kept ~0.8 kB: a leak shows past GROWTH_LIMIT_MB from about 25,000
CHANGED_FILES = 100_000
UNANSWERED = 20_000
UNKNOWN_NAME = 400  # characters in the name of each unknown setting and changed file
IN_FLIGHT = 100  # requests sent before their answers are awaited

client = single_server()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def idle(tmp_path_factory):
    """A server on an untrusted workspace: a settings change analyzes nothing, and no worker starts."""
    root = make_workspace(str(tmp_path_factory.mktemp("ws") / "idle"))
    async with running_server("visual-studio-code", root, {"workspaceTrusted": False}, wait_ready=False) as client:
        yield client


def rss_mb(client: Client) -> float:
    return status_kb(server_pid(client), "VmRSS") / 1024


def commands(uri: str) -> list[tuple[str, list]]:
    """A round of commands: what an editor sends, and what fails in the handler."""
    return [
        ("fuselens.showKernel", [uri]),  # the file's whole kernel module: the largest result
        ("fuselens.showKernel", [uri, "c0"]),
        ("fuselens.validateKernel", [uri, "c9"]),  # no cluster c9: an error raised in the handler
        ("fuselens.validationResults", [uri]),
        ("fuselens.analyze", ["file:///nowhere/model.txt"]),  # not a Python file: an error
    ]


async def execute(client: Client, uri: str, count: int) -> collections.Counter[str]:
    """Send `count` commands, IN_FLIGHT at a time; how many got a result and how many an error."""
    answers: collections.Counter[str] = collections.Counter()
    rounds = itertools.cycle(commands(uri))
    for start in range(0, count, IN_FLIGHT):
        batch = [
            client.workspace_execute_command_async(lsp.ExecuteCommandParams(name, arguments))
            for name, arguments in itertools.islice(rounds, min(IN_FLIGHT, count - start))
        ]
        for answer in await asyncio.gather(*batch, return_exceptions=True):
            answers["error" if isinstance(answer, Exception) else "result"] += 1
    return answers


async def test_ten_thousand_commands_leave_the_servers_memory_flat(client: Client, figures):
    uri = client.open("commands_net.py", example_text())
    await client.diagnostics_of(uri, 1)
    await execute(client, uri, WARM_UP)
    before = rss_mb(client)
    answers = await execute(client, uri, MEASURED)
    after = rss_mb(client)
    assert answers["result"] == MEASURED * 3 // 5 and answers["error"] == MEASURED * 2 // 5, answers
    figures["commands"] = {"count": MEASURED, "rss_before_mb": round(before, 1), "rss_after_mb": round(after, 1)}
    assert after - before < GROWTH_LIMIT_MB, f"{MEASURED} commands: {before:.0f} MB -> {after:.0f} MB"


async def test_fifty_thousand_settings_changes_leave_the_servers_memory_flat(idle: Client, figures):
    """`workspace/didChangeConfiguration` is handled by a coroutine, which asks the client for its
    settings: both a notification's handler and a request of the server's own.  Each change names a
    setting the server does not know, a new one each time, and is warned about once it is read.  The
    changes come in pairs: the second comes while the first's read may still wait for the client, and
    is then read right after it, the first's settings never taking effect; the latest always does."""

    def warned() -> int:
        return len(idle.messages_matching("unknown setting 'setting"))

    def unknown(i: int) -> str:
        return f"setting{i}".ljust(UNKNOWN_NAME, "_")

    def warned_last(i: int) -> bool:  # (the latest warning is the last message: only the last few are read)
        return any(f"unknown setting '{unknown(i)}'" in m.message for m in idle.messages[-4:])

    async def change_settings(first: int, count: int) -> None:
        for i in range(first, first + count):
            settings = {"fuselens": {"severity": ["hint", "information"][i % 2], unknown(i): 1}}
            idle.workspace_did_change_configuration(lsp.DidChangeConfigurationParams(settings))
            if i % 2 == 1:
                await idle.wait_until(lambda i=i: warned_last(i), f"a warning about setting{i}")

    await change_settings(0, WARM_UP)
    before = rss_mb(idle)
    await change_settings(WARM_UP, SETTINGS_CHANGES)
    after = rss_mb(idle)
    assert (
        warned() >= (WARM_UP + SETTINGS_CHANGES) // 2 and idle.configuration_requests <= WARM_UP + SETTINGS_CHANGES + 1
    )
    figures["settings_changes"] = {
        "count": SETTINGS_CHANGES,
        "rss_before_mb": round(before, 1),
        "rss_after_mb": round(after, 1),
    }
    assert after - before < GROWTH_LIMIT_MB, f"{SETTINGS_CHANGES} settings changes: {before:.0f} MB -> {after:.0f} MB"


async def test_fifty_thousand_changed_files_leave_the_servers_memory_flat(idle: Client, figures):
    """`workspace/didChangeWatchedFiles` for a new file each time (the server remembers when it last
    heard of each, not to re-analyze twice when watchdog tells it too)."""

    def change_files(first: int, count: int) -> None:
        for i in range(first, first + count, IN_FLIGHT):
            changes = [
                lsp.FileEvent(
                    uri_of(idle.path(f"file{j}".ljust(UNKNOWN_NAME, "_") + ".py")), lsp.FileChangeType.Changed
                )
                for j in range(i, i + IN_FLIGHT)
            ]
            idle.workspace_did_change_watched_files(lsp.DidChangeWatchedFilesParams(changes))

    change_files(0, WARM_UP)
    await idle.roundtrip()
    before = rss_mb(idle)
    change_files(WARM_UP, CHANGED_FILES)
    await idle.roundtrip()
    after = rss_mb(idle)
    figures["changed_files"] = {
        "count": CHANGED_FILES,
        "rss_before_mb": round(before, 1),
        "rss_after_mb": round(after, 1),
    }
    assert after - before < GROWTH_LIMIT_MB, f"{CHANGED_FILES} changed files: {before:.0f} MB -> {after:.0f} MB"


async def test_requests_the_client_never_answers_leave_the_servers_memory_flat(tmp_path, figures):
    """A client that never answers the server's requests: a settings change asks it for its settings
    (`workspace/configuration`), gives up after a few seconds and goes on with the others.  The changes
    sent meanwhile are read once, after it gave up: the client is asked twice, not once per change, and
    the latest settings are the ones warned about."""
    server = await RawServer.start(str(tmp_path / "server.log"))
    try:
        await initialize(server, make_workspace(str(tmp_path / "silent")), trusted=False)
        server.answering = False

        def warned(i: int) -> bool:
            return any(f"unknown setting 'setting{i}'" in m for m in server.shown)

        async def change_settings(first: int, count: int) -> None:
            for i in range(first, first + count):
                settings = {"fuselens": {f"setting{i}": 1}}
                await server.message(
                    {"jsonrpc": "2.0", "method": "workspace/didChangeConfiguration", "params": {"settings": settings}}
                )
            last = first + count - 1
            await server.wait_until(lambda: warned(last), "the server to give up and warn of the latest", 120)

        await change_settings(0, UNANSWERED)
        before = status_kb(server.proc.pid) / 1024
        asked = server.server_requests["workspace/configuration"]
        await change_settings(UNANSWERED, UNANSWERED)
        after = status_kb(server.proc.pid) / 1024
        asked = server.server_requests["workspace/configuration"] - asked
    finally:
        server.proc.kill()
        await server.proc.wait()
        server.reader.cancel()
    figures["unanswered"] = {"count": UNANSWERED, "rss_before_mb": round(before, 1), "rss_after_mb": round(after, 1)}
    assert asked <= 3, f"{UNANSWERED} changes asked a silent client {asked} times"
    assert after - before < GROWTH_LIMIT_MB, f"{UNANSWERED} unanswered requests: {before:.0f} MB -> {after:.0f} MB"
