"""Language server, failures in the user's code: one precise error at the offending line, and the
server keeps working (the next good save shows the clusters again)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from lsprotocol import types as lsp

from lsp_helpers import Client, children, example_text, replace_line, running, server_fixture, server_pid, time_limit

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMEOUT_S = 3
client = server_fixture(
    init_options={"workspaceTrusted": True, "settings": {"worker": {"timeoutSeconds": TIMEOUT_S, "memoryMb": 2048}}}
)

HOG = 'torch.ones(50 * 2**30, dtype=torch.uint8, device="cpu")'  # 50 GB of real memory
# name: (text, 1-based line, diagnostic code, words the message must hold)
CASES = {
    "syntax": (
        replace_line(example_text(), 19, "        x = F.relu(x"),
        19,
        "syntax",
        ["SyntaxError", "was never closed"],
    ),
    "import": (
        replace_line(example_text(), 9, "import not_a_module_xyz"),
        9,
        "import",
        ["ModuleNotFoundError", "not_a_module_xyz"],
    ),
    "forward-raises": (
        replace_line(example_text(), 24, "        x = torch.sigmoid(x) @ torch.ones(3, 3)"),
        24,
        "trace",
        ["ExampleNet: forward() failed", "16384, 512", "3, 3"],
    ),
    "raise-in-forward": (
        replace_line(example_text(), 29, '        raise ValueError("no good")'),
        29,
        "trace",
        ["forward() failed: ValueError: no good"],
    ),
    "infinite-loop": (
        replace_line(example_text(), 19, "        while x is not None: pass"),
        19,
        "timeout",
        ["timed out", "still running line 19 (forward)"],
    ),
    "loop-at-import": (
        replace_line(example_text(), 9, "while True: pass"),
        9,
        "timeout",
        ["timed out", "line 9 (<module>)"],
    ),
    "memory-hog": (
        replace_line(example_text(), 19, f"        x = x + {HOG}.sum()"),
        19,
        "memory",
        ["more memory than the worker may use"],
    ),
}


def logged(client: Client, name: str) -> list[str]:
    """The server's log lines about the analyses of `name`."""
    return [m.message for m in client.log_messages if f" {name} v" in m.message and "comparison" not in m.message]


def clusters(diags) -> list[tuple[int, int]]:
    return sorted((d.range.start.line + 1, d.range.end.line + 1) for d in diags if d.message.startswith("fusable:"))


@pytest.mark.parametrize("case", CASES)
async def test_an_error_in_the_model_is_one_diagnostic_at_its_line(client: Client, case: str):
    text, line, code, words = CASES[case]
    uri = client.open(f"broken_{case.replace('-', '_')}.py", text)
    diags = await client.diagnostics_of(uri, 1)

    errors = [d for d in diags if d.severity == lsp.DiagnosticSeverity.Error]
    assert len(errors) == 1, [(d.code, d.message) for d in diags]
    (error,) = errors
    assert error.range.start.line + 1 == line and error.range.end.line + 1 == line
    assert error.code == code and error.source == "fuselens"
    for word in words:
        assert word in error.message, error.message
    assert "Traceback" not in error.message and 'File "' not in error.message
    assert len(error.message.split("\n")) <= 2  # a sentence (and a hint), not a dump
    assert clusters(diags) == []
    # The log says what became of the analysis: the same failure at the same line, not "analyzed".
    name = f"broken_{case.replace('-', '_')}.py"
    if code == "timeout":
        said = f"timed out: {name} v1 at line {line} after "
    else:
        said = f"failed: {name} v1 ({code}, line {line}) after "
    (said_first,) = logged(client, name)  # (logged before the diagnostics are sent)
    assert said_first.startswith(said), said_first

    # The server is still up: fixing the file brings the clusters back.
    version = client.save_text(uri, example_text())
    assert clusters(await client.diagnostics_of(uri, version)) == [(18, 20), (22, 25), (28, 30)]
    assert logged(client, name)[-1].startswith(f"analyzed {name} v{version} in ")


@pytest.mark.timing
@pytest.mark.parametrize("case", CASES)
async def test_an_error_in_the_model_is_reported_within_the_limits(client: Client, case: str):
    """At the time limit (and a margin) for code that never finishes; at once for any other error."""
    text, _, code, _ = CASES[case]
    loop = asyncio.get_running_loop()
    started = loop.time()
    uri = client.open(f"timed_broken_{case.replace('-', '_')}.py", text)
    diags = await client.diagnostics_of(uri, 1)
    elapsed = loop.time() - started
    assert [d.code for d in diags if d.severity == lsp.DiagnosticSeverity.Error] == [code]
    assert elapsed < (TIMEOUT_S + time_limit(10) if code == "timeout" else time_limit(10)), elapsed
    client.close(uri)


async def test_a_syntax_error_points_at_the_column(client: Client):
    uri = client.open("broken_column.py", CASES["syntax"][0])
    (error,) = await client.diagnostics_of(uri, 1)
    assert error.range.start == lsp.Position(18, 18)  # the unclosed "("


async def test_failures_never_restart_the_worker(client: Client):
    """Time and memory limits are per job: the warm worker host survives them all."""
    assert sum("worker ready" in m.message for m in client.log_messages) == 1


async def test_a_dead_worker_is_replaced(client: Client):
    """If the worker host itself dies (say, the OOM killer), the analysis in flight fails with a
    clear error, and the next one starts a fresh host."""
    (host,) = children(server_pid(client))
    before = set(children(host))
    uri = client.open("worker_death.py", CASES["infinite-loop"][0])
    (job,) = await client.wait_until(lambda: set(children(host)) - before, "the job's process to start", poll=0.05)
    os.kill(host, signal.SIGKILL)
    (error,) = await client.diagnostics_of(uri, 1)
    assert error.severity == lsp.DiagnosticSeverity.Error and error.code == "crash"
    assert error.message == "analysis crashed: the analysis worker exited unexpectedly"
    # The job (stuck in `while x is not None: pass`) must not outlive the host that enforced its limit.
    await client.wait_until(lambda: not running(job), "the orphaned job to be killed", poll=0.05)

    version = client.save_text(uri, example_text())
    assert clusters(await client.diagnostics_of(uri, version)) == [(18, 20), (22, 25), (28, 30)]
    assert sum("worker ready" in m.message for m in client.log_messages) == 2
    assert host not in children(server_pid(client))
