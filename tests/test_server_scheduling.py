"""Language server, scheduling: bursts of edits and saves publish only what matches the document."""

from __future__ import annotations

import asyncio

import pytest

from fuselens.server.configuration import Configuration

from lsp_helpers import Client, example_text, replace_line, server_fixture

pytestmark = pytest.mark.asyncio(loop_scope="module")

client = server_fixture()

# Versions of example_net.py a user might save one after the other.
EDITS = [
    example_text().replace("x = x * 2.0", "x = x * 3.0"),
    replace_line(example_text(), 24, "        x = torch.sigmoid(x) * 1.5"),
    example_text().replace("x = F.gelu(x)", "x = F.silu(x)"),
    example_text().replace("        x = torch.tanh(x)\n", ""),
]
FINAL = replace_line(example_text(), 19, "        x = x - 1.0")  # relu -> sub
FINAL_CLUSTERS = [
    (18, 20, "fusable: mul → sub → add"),
    (22, 25, "fusable: linear → gelu → sigmoid → mul"),
    (28, 30, "fusable: tanh → mul → softmax"),
]


def clusters(diags) -> list[tuple[int, int, str]]:
    return sorted(
        (d.range.start.line + 1, d.range.end.line + 1, d.message.split(",")[0])
        for d in diags
        if d.message.startswith("fusable:")
    )


async def open_analyzed(client: Client, name: str) -> str:
    uri = client.open(name, example_text())
    await client.diagnostics_of(uri, 1)
    return uri


async def test_a_burst_of_saves_publishes_only_the_last_version(client: Client):
    uri = await open_analyzed(client, "burst.py")
    seen = len(client.published)
    for text in [*EDITS, FINAL]:
        client.save_text(uri, text)  # no waiting in between: the user saves as fast as they type
    final = client.versions[uri]

    diags = await client.diagnostics_of(uri, final)
    await client.roundtrip()
    assert [p.version for p in client.published[seen:] if p.uri == uri] == [final]
    assert clusters(diags) == FINAL_CLUSTERS


async def test_saves_that_supersede_running_analyses(client: Client):
    """Each save lands while the previous version's analysis is under way: those are cancelled or dropped."""
    uri = await open_analyzed(client, "burst_running.py")
    seen = len(client.published)
    for text in [*EDITS, FINAL]:
        client.save_text(uri, text)
        await client.roundtrip()  # the server has handled the save (and sent the job) before the next one
    final = client.versions[uri]

    diags = await client.diagnostics_of(uri, final)
    await client.roundtrip()
    versions = [p.version for p in client.published[seen:] if p.uri == uri]
    assert versions[-1] == final and all(v == final for v in versions), versions
    assert clusters(diags) == FINAL_CLUSTERS


async def test_typing_after_a_save_drops_that_result(client: Client):
    """Saved as v2, then typed (v3, unsaved): v2's result no longer matches the buffer, so it is not shown."""
    uri = await open_analyzed(client, "burst_typing.py")
    seen = len(client.published)
    client.save_text(uri, EDITS[0])
    client.change(uri, FINAL)  # typed before the analysis of the save came back
    version = client.save_text(uri, FINAL)
    diags = await client.diagnostics_of(uri, version)
    await client.roundtrip()
    assert [p.version for p in client.published[seen:] if p.uri == uri] == [version]
    assert clusters(diags) == FINAL_CLUSTERS


async def test_edits_without_a_save_publish_nothing(client: Client):
    uri = await open_analyzed(client, "burst_unsaved.py")
    seen = len(client.published)
    for text in EDITS:
        client.change(uri, text)
    version = client.save_text(uri, FINAL)
    diags = await client.diagnostics_of(uri, version)
    await client.roundtrip()
    assert [p.version for p in client.published[seen:] if p.uri == uri] == [version]
    assert clusters(diags) == FINAL_CLUSTERS


async def test_documents_are_scheduled_independently(client: Client):
    """A burst in one document never cancels another document's analysis."""
    first = client.open("burst_a.py", example_text())
    second = client.open("burst_b.py", FINAL)
    for text in EDITS:
        client.save_text(first, text)
    a = await client.diagnostics_of(first)
    b = await client.diagnostics_of(second, 1)
    assert clusters(b) == FINAL_CLUSTERS
    assert clusters(a) == [
        (18, 20, "fusable: mul → relu → add"),
        (22, 25, "fusable: linear → gelu → sigmoid → mul"),
        (28, 29, "fusable: mul → softmax"),
    ]


async def test_closing_during_an_analysis_publishes_nothing_more(client: Client):
    """Closed means cleared: a result that comes back after the close is not shown."""
    uri = client.open("burst_closed.py", example_text())
    client.close(uri)  # while its analysis runs
    other = client.open("burst_closed_twin.py", example_text())  # the same work, to know when it would be done
    await client.diagnostics_of(other, 1)
    await client.roundtrip()
    assert [(p.version, list(p.diagnostics)) for p in client.published_for(uri)] == [(None, [])]


async def test_a_job_cancelled_as_its_settings_arrive_stops():
    """Every job first waits for the settings.  A save that supersedes it just as that wait ends must
    still stop it: a job that went on would run the model of a stale version, and hold the document's
    one job slot until that model returned."""
    configuration = Configuration(warn=lambda text: None)
    configuration.read()
    answer = asyncio.Event()  # the worker's answer to the job, which never comes

    async def job() -> None:
        await configuration.settled()
        await answer.wait()

    task = asyncio.ensure_future(job())
    await asyncio.sleep(0)  # it reads the settings, which are already in
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):  # (a job that swallowed the cancel waits here for ever)
            await task
