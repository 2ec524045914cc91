"""Robustness, load: twenty documents opened at once, a 48-layer GPT on a long sequence, and fifty
saves in a burst.  Memory stays bounded (the server small, the worker host flat), requests are
answered promptly while analyses run, and the scheduler never queues more than one job in flight
and one pending per document: superseded analyses are cancelled, not finished.

How promptly requests are answered is measured in every run (the figures) but asserted only by the
tests marked `timing` (`pytest -m timing`, limits times FUSELENS_TIMING_SCALE).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import defaultdict

import pytest
from lsprotocol import types as lsp

from lsp_helpers import Client, example_text, replace_line, server_pid, time_limit
from robust_helpers import descendants, errors, fusable, pss_kb, single_server, status_kb, worker_host

pytestmark = pytest.mark.asyncio(loop_scope="module")

# Load does not depend on the editor's capabilities.  The job time limit is far above any wait here:
# a superseded job that the server failed to cancel waits for its release until the test fails,
# rather than timing out and letting the next job start as if it had been cancelled.
client = single_server(init_options={"workspaceTrusted": True, "settings": {"worker": {"timeoutSeconds": 600}}})

SERVER_RSS_MB = 150
HOST_RSS_MB = 1536
LATENCY_S = time_limit(1.0)  # asserted by the `timing` tests only
EXAMPLES = ["example_net.py", "branchy.py", "conv_block.py", "gpt.py", "llama_block.py"]


class Sampler:
    """Samples the memory of the server, the worker host and its job processes in a thread."""

    def __init__(self, client: Client):
        self.server, self.host = server_pid(client), worker_host(client)
        self.peak = defaultdict(int)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            jobs = descendants(self.host)
            for key, value in (
                ("server_rss_mb", status_kb(self.server) // 1024),
                ("host_rss_mb", status_kb(self.host) // 1024),
                ("jobs_at_once", len(jobs)),
                ("host_and_jobs_pss_mb", (pss_kb(self.host) + sum(pss_kb(j) for j in jobs)) // 1024),
            ):
                self.peak[key] = max(self.peak[key], value)
            time.sleep(0.01)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class Latency:
    def __init__(self):
        self.worst: dict[str, float] = defaultdict(float)

    async def __call__(self, kind: str, request):
        started = time.perf_counter()
        result = await request
        self.worst[kind] = max(self.worst[kind], round(time.perf_counter() - started, 4))
        return result


async def every_feature(client: Client, latency: Latency, uri: str, lines: list[int]) -> None:
    for line in lines:
        await latency("hover", client.hover(uri, line))
        await latency("codeAction", client.code_actions(uri, line, resolve=False))  # (as an editor asks: unresolved)
    await latency("inlayHint", client.inlay_hints(uri))
    await latency("codeLens", client.code_lenses(uri))


def signature(diags: list[lsp.Diagnostic]) -> list[tuple]:
    return sorted((d.range.start.line, d.range.end.line, d.code, d.message) for d in diags)


async def twenty_documents(client: Client, figures, prefix: str):
    """Open twenty documents (the examples, four times) at once and ask for every feature of each, while
    they are analyzed and again when they are; the figures go under "twenty_documents".  Returns
    ({uri: example name}, {uri: its diagnostics}, the memory peaks, the worst latency per request)."""
    latency = Latency()
    loop = asyncio.get_running_loop()
    with Sampler(client) as sampler:
        started = loop.time()
        uris = {
            client.open(f"{prefix}_{i:02d}_{name}", example_text(name)): name for i, name in enumerate(EXAMPLES * 4)
        }
        for uri in uris:  # asked at once, while the twenty analyses run
            await every_feature(client, latency, uri, [19])
        published = {uri: await client.diagnostics_of(uri, 1, timeout=120) for uri in uris}
        elapsed = loop.time() - started
        for uri in uris:  # and once they are done
            await every_feature(client, latency, uri, [19, 25, 40])
    figures["twenty_documents"] = {
        "seconds_until_all_published": round(elapsed, 2),
        **sampler.peak,
        "worst_latency_s": dict(latency.worst),
    }
    for uri in uris:
        client.close(uri)
    return uris, published, sampler.peak, latency.worst


async def test_twenty_documents_opened_at_once(client: Client, figures):
    uris, published, peak, _ = await twenty_documents(client, figures, "load")
    by_example = defaultdict(set)
    for uri, name in uris.items():
        assert errors(published[uri]) == [], (name, published[uri])
        by_example[name].add(tuple(signature(published[uri])))
    assert all(len(sigs) == 1 for sigs in by_example.values())  # every copy says the same
    assert len(fusable(next(published[u] for u, n in uris.items() if n == "example_net.py"))) == 3
    assert peak["server_rss_mb"] < SERVER_RSS_MB
    assert peak["host_rss_mb"] < HOST_RSS_MB


@pytest.mark.timing
async def test_twenty_documents_opened_at_once_answer_requests_promptly(client: Client, figures):
    _, published, _, worst = await twenty_documents(client, figures, "timed_load")
    assert all(errors(diags) == [] for diags in published.values())  # (the load was the real one)
    assert max(worst.values()) <= LATENCY_S, worst


async def gpt_48_layers(client: Client, figures, name: str):
    """Open a 48-layer GPT on a 1024-token sequence and ask for every feature while it is analyzed and
    once it is; the figures go under "gpt_48_layers".  Returns (its diagnostics, the memory peaks,
    the worst latency per request)."""
    text = example_text("gpt.py").replace(
        "class GPT(nn.Module):", "class GPT(nn.Module):  # fuselens: input=(1, 1024) int64 init=(n_layers=48)"
    )
    latency = Latency()
    loop = asyncio.get_running_loop()
    with Sampler(client) as sampler:
        started = loop.time()
        uri = client.open(name, text)
        await every_feature(client, latency, uri, [52])  # while it is analyzed
        diags = await client.diagnostics_of(uri, 1, timeout=120)
        elapsed = loop.time() - started
        await every_feature(client, latency, uri, list(range(10, 80, 3)))
    figures["gpt_48_layers"] = {
        "seconds_to_diagnostics": round(elapsed, 2),
        "diagnostics": len(diags),
        **sampler.peak,
        "worst_latency_s": dict(latency.worst),
    }
    client.close(uri)
    return diags, sampler.peak, latency.worst


async def test_a_48_layer_gpt_on_a_long_sequence(client: Client, figures):
    diags, peak, _ = await gpt_48_layers(client, figures, "load_gpt48.py")
    assert errors(diags) == []
    assert any("×48" in d.message for d in diags), [d.message for d in diags]  # one per layer, folded
    assert peak["server_rss_mb"] < SERVER_RSS_MB
    assert peak["host_rss_mb"] < HOST_RSS_MB


@pytest.mark.timing
async def test_a_48_layer_gpt_on_a_long_sequence_answers_requests_promptly(client: Client, figures):
    diags, _, worst = await gpt_48_layers(client, figures, "timed_load_gpt48.py")
    assert any("×48" in d.message for d in diags), [d.message for d in diags]  # (the load was the real one)
    assert max(worst.values()) <= LATENCY_S, worst


async def test_fifty_rapid_saves_run_one_job_at_a_time(client: Client, figures):
    """Fifty saves of one document whose forward() waits until the test releases it: twenty-five in a
    burst, then twenty-five each landing as soon as the previous version's job has started running
    the model.  The test releases the forward passes only once the last version's job has started:
    so a superseded job that was still alive then (not cancelled, or run beside the newer one) would
    finish too, and one that was cancelled (killed in the worker) or never started cannot.  At most
    one job of the document exists at any moment, and only the last version is analyzed to the end."""
    log = os.path.join(client.root, "burst_log.txt")
    release = os.path.join(client.root, "burst_release")

    def version_text(n: int) -> str:  # records, in the workspace, which saves started and finished
        def record(event: str) -> str:
            return f"open({log!r}, 'a').write(f'{event} {{SAVE}}\\n')"

        text = replace_line(example_text(), 9, f"import os, time; SAVE = {n}; RELEASE = {release!r}; {record('start')}")
        wait = "exec('while not os.path.exists(RELEASE): time.sleep(0.005)')"  # until the test releases it
        return replace_line(text, 29, f"        x = x * 3.0; {wait}; {record('done')}")

    def events(what: str) -> set[int]:
        try:
            with open(log) as fh:
                return {int(n) for event, n in (line.split() for line in fh.read().splitlines()) if event == what}
        except (OSError, ValueError):  # (not yet written, or a line half written)
            return set()

    def analyzed() -> list[str]:
        return [m.message.split()[2] for m in client.log_messages if m.message.startswith("analyzed load_burst.py ")]

    open(release, "w").close()  # version 0 runs to the end
    uri = client.open("load_burst.py", version_text(0))
    await client.diagnostics_of(uri, 1)
    await client.roundtrip()
    os.remove(log)
    os.remove(release)  # from here on every forward pass waits
    seen, before = len(client.published), len(analyzed())
    saves, burst = 50, 25
    loop = asyncio.get_running_loop()
    with Sampler(client) as sampler:
        started = loop.time()
        for n in range(1, burst + 1):  # as fast as the client can send them
            client.save_text(uri, version_text(n))
        for n in range(burst + 1, saves + 1):  # each superseding a job that is running the model
            await client.wait_until(
                lambda last=n - 1: last in events("start"), f"save {n - 1}'s job to start", poll=0.005
            )
            client.save_text(uri, version_text(n))
        final = client.versions[uri]
        # The worker starts the last job only after the one it superseded is killed (the cancel is
        # sent, and handled, before the next job).  Only now may any forward pass finish.
        await client.wait_until(lambda: saves in events("start"), f"save {saves}'s job to start", poll=0.005)
        open(release, "w").close()
        diags = await client.diagnostics_of(uri, final)
        elapsed = loop.time() - started
        await client.roundtrip()
    await client.wait_until(lambda: not descendants(worker_host(client)), "every job to be gone", poll=0.05)

    began, finished = events("start"), events("done")
    published = [p.version for p in client.published[seen:] if p.uri == uri]
    figures["fifty_saves"] = {
        "saves": saves,
        "seconds_to_last_diagnostics": round(elapsed, 2),
        "jobs_that_ran_the_model": len(began),
        "forward_passes_finished": len(finished),
        "analyses_published": len(analyzed()) - before,
        "jobs_of_the_document_at_once": sampler.peak["jobs_at_once"],
    }
    assert [chain for *_, chain in fusable(diags)] == [
        "mul → relu → add",
        "linear → gelu → sigmoid → mul",
        "tanh → mul → softmax",
    ]
    assert published == [final] and analyzed()[before:] == [f"v{final}"]
    assert set(range(burst, saves + 1)) <= began  # these superseded jobs were running ...
    assert finished == {saves}  # ... and were killed: only the last job ran to the end
    # One in flight (the pending one waits in the server); a job that has answered may still be
    # exiting when the next one is forked, so a sample can catch two processes for a moment.
    assert sampler.peak["jobs_at_once"] <= 2
    client.close(uri)
