"""Language server: the background torch.compile comparisons yield to the user's analyses.

On a 2-core machine a comparison of another open file (Inductor compiling its model) doubled the
time from a save to its diagnostics.  So a comparison never starts while an analysis runs or waits,
one that runs when a save arrives is stopped and queued again, and the comparison of the document
the user is working on goes first.  Each test reads the order of what the server did from its log.
"""

from __future__ import annotations

import os

import pytest
import pytest_asyncio

from lsp_helpers import Client, example_text, make_workspace, replace_line, running_server

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

SETTINGS = {"compareInductor": True, "models": {"ExampleNet": {"inputs": [[64, 1024]]}}}
TIMEOUT = 300.0  # a compile of ExampleNet on a busy 2-core machine, behind another one


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tmp_path_factory):
    # One client profile: the order the server runs its jobs in does not depend on the editor.
    root = make_workspace(str(tmp_path_factory.mktemp("ws") / "comparisons"))
    async with running_server("visual-studio-code", root, {"workspaceTrusted": True, "settings": SETTINGS}) as client:
        yield client


def log(client: Client, after: int = 0) -> list[str]:
    return [m.message for m in client.log_messages[after:]]


def index(lines: list[str], *needles: str) -> int:
    """The index of the first line holding every needle; -1 if none does."""
    return next((i for i, line in enumerate(lines) if all(n in line for n in needles)), -1)


async def logged(client: Client, *needles: str, after: int = 0) -> int:
    """Wait for a log line holding every needle (at or after `after`); its index in the whole log."""
    found = await client.wait_until(lambda: index(log(client, after), *needles) + 1, " ".join(needles), timeout=TIMEOUT)
    return after + found - 1


def gated(release: str, running: str) -> str:
    """ExampleNet whose forward() says it is running, then waits until the test releases it."""
    wait = (
        f"open({running!r}, 'w').close(); "
        f'exec("while not os.path.exists({release!r}): time.sleep(0.005)")'  # until the test releases it
    )
    return replace_line(replace_line(example_text(), 9, "import os, time"), 29, f"        x = x * 3.0; {wait}")


async def test_no_comparison_starts_while_another_documents_analysis_runs(client: Client):
    release, running = client.path("slow_release"), client.path("slow_running")
    slow = client.open("slow.py", gated(release, running))
    await client.wait_until(lambda: os.path.exists(running), "slow.py's analysis to run its model", poll=0.05)
    start = len(client.log_messages)
    other = client.open("waiting.py", example_text())
    await client.diagnostics_of(other, 1)  # analyzed beside slow.py: two turns
    # Once its idle time is over, the comparison of waiting.py is due; slow.py's analysis still runs.
    due = await logged(client, "comparison of waiting.py", after=start)
    assert "comparison of waiting.py waits: an analysis or a validation goes first" in log(client)[due], log(client)
    open(release, "w").close()
    await client.diagnostics_of(slow, 1)
    began = await logged(client, "comparison of waiting.py started", after=start)
    assert index(log(client, start), "analyzed slow.py v1") < began - start
    await logged(client, "comparison of waiting.py v1 done", after=start)
    client.close(other)
    client.close(slow)


async def test_a_save_stops_another_documents_comparison_and_its_own_goes_first(client: Client):
    start = len(client.log_messages)
    mine = client.open("mine.py", example_text())
    await client.diagnostics_of(mine, 1)
    theirs = client.open("theirs.py", example_text().replace("ExampleNet: ", "Theirs: "))  # opened last: in front
    await client.diagnostics_of(theirs, 1)
    await logged(client, "comparison of theirs.py started", after=start)
    saved = len(client.log_messages)
    version = client.save_text(mine, example_text() + "\n# edited\n")  # back to mine.py: a save
    await client.diagnostics_of(mine, version)
    await logged(client, f"comparison of mine.py v{version} done", after=saved)
    await logged(client, "comparison of theirs.py v1 done", after=saved)
    lines = log(client, saved)
    analyzed = index(lines, f"analyzed mine.py v{version}")
    # The compile of theirs.py was stopped for the analysis, which ran alone ...
    assert 0 <= index(lines, "comparison of theirs.py put back: an analysis goes first") < analyzed, lines
    assert index(lines, "started") > analyzed, lines
    # ... then mine.py's comparison ran first (the front document's), and theirs.py's after it.
    mine_started = index(lines, "comparison of mine.py started")
    theirs_again = index(lines, "comparison of theirs.py started")
    assert analyzed < mine_started < index(lines, f"comparison of mine.py v{version} done") < theirs_again, lines
    assert index(lines, "comparison of theirs.py v1 done") > theirs_again
    client.close(mine)
    client.close(theirs)
