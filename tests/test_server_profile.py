"""Language server, profile: the "Profile" lens measures the forward in the worker, and the hover, the
inlay hints and the lens then show the measured time per line and per cluster (CPU op times here)."""

from __future__ import annotations

import pytest
from lsprotocol import types as lsp

from lsp_helpers import CLUSTERS, MODEL_LINE, Client, example_text, server_fixture

pytestmark = pytest.mark.asyncio(loop_scope="module")

client = server_fixture()

SMALL = example_text().replace("input=(16384, 1024)", "input=(512, 1024)")


async def _profiled(client: Client, name: str) -> tuple[str, dict]:
    uri = client.open(name, SMALL)
    await client.diagnostics_of(uri, 1)
    lens = next(lens for lens in await client.code_lenses(uri) if lens.command.command == "fuselens.profile")
    assert lens.command.title == "Profile" and lens.range.start.line == MODEL_LINE - 1
    result = await client.command(lens.command.command, *lens.command.arguments)
    return uri, result


async def test_the_profile_lens_measures_the_forward_and_every_view_shows_it(client: Client):
    uri, result = await _profiled(client, "profile_views.py")
    (model,) = result["profile"]["models"]
    assert result["profile"]["mode"] == "cpu" and model["name"] == "ExampleNet" and not model["problem"]
    assert model["attributed_us"] >= 0.95 * model["forward_us"]
    assert result["results_view"]["kind"] == "profile" and result["results_view"]["models"][0]["chart"]["data"]
    # The inputs it ran at, in the heading (on a CPU they may be smaller than the analyzed ones).
    assert model["inputs"] == [[512, 1024]]
    assert result["results_markdown"].startswith("### ExampleNet at 512×1024: where the time of a forward goes")
    assert {c["id"] for c in model["clusters"]} == {"c0", "c1", "c2"}
    assert any("per forward" in m.message for m in client.messages_matching("fuselens: ExampleNet"))
    # The lens now says what the forward took, and which cluster took most of it.
    top = model["clusters"][0]
    (lens,) = [lens for lens in await client.code_lenses(uri) if lens.command.command == "fuselens.profile"]
    assert lens.command.title.startswith("◔ ") and f"{top['id']} " in lens.command.title
    # A cluster's hover gives its measured time and share, and its Amdahl bound.
    first, _ = CLUSTERS[0]["lines"]
    text = (await client.hover(uri, first)).contents.value
    assert "**measured**:" in text and "CPU time on cpu, mean of 10 forwards" in text
    c0 = next(c for c in model["clusters"] if c["id"] == "c0")
    assert f"({c0['share']:.1%};" in text and f"rank {c0['rank_by_time']} by time" in text
    # A line with no cluster (a Linear) has a hover now: its measured time, its op.
    linear = next(line for line in model["lines"] if line["ops"] == ["linear"] and not line["clusters"])
    text = (await client.hover(uri, linear["line"])).contents.value
    assert text.startswith(f"◔ **line {linear['line']}:") and "`linear`" in text
    # Inlay hints: the share of each line that took at least 1% of the forward.
    timed = [h for h in await client.inlay_hints(uri) if str(h.label).startswith("◔")]
    assert {h.position.line + 1 for h in timed} == {line["line"] for line in model["lines"] if line["share"] >= 0.01}


async def test_an_edit_hides_a_profile_of_the_text_before_it(client: Client):
    uri, _ = await _profiled(client, "profile_stale.py")
    version = client.change(uri, SMALL.replace("* 2.0", "* 3.0"))
    client.save(uri)
    await client.diagnostics_of(uri, version)
    lenses = await client.code_lenses(uri)
    assert [lens.command.title for lens in lenses if lens.command.command == "fuselens.profile"] == ["Profile"]
    assert not [h for h in await client.inlay_hints(uri) if str(h.label).startswith("◔")]


async def test_without_a_gpu_the_remote_profiler_profiles_and_its_profile_is_shown(client: Client):
    """With `remoteProfiler` set, the worker profiles only on a GPU of its own; here there is none,
    so the command line runs (here, `fuselens profile` itself, on this CPU) and its report is shown
    as the worker's would be."""
    import shlex
    import sys

    from robust_helpers import raw_notify

    uri = client.open("profile_remote.py", SMALL)
    await client.diagnostics_of(uri, 1)
    runner = (
        f"{shlex.quote(sys.executable)} -m fuselens.cli.main profile {{file}} --on cpu --iterations 2 --warmup 1 "
        "--json {json}"
    )
    seen = len(client.published)
    raw_notify(client, "workspace/didChangeConfiguration", {"settings": {"fuselens": {"remoteProfiler": runner}}})
    await client.diagnostics_of(uri, client.versions[uri], after=seen)
    result = await client.command("fuselens.profile", uri, "ExampleNet")
    assert "profile" in result, result
    assert result["profile"]["iterations"] == 2 and result["profile"]["mode"] == "cpu", result
    assert any("with the remote profiler" in m.message for m in client.log_messages)
    (lens,) = [lens for lens in await client.code_lenses(uri) if lens.command.command == "fuselens.profile"]
    assert lens.command.title.startswith("◔ ")
    raw_notify(client, "workspace/didChangeConfiguration", {"settings": {"fuselens": {"remoteProfiler": None}}})


def _percentages(client: Client, title: str, since: set) -> list[int]:
    """The percentages the work-done progress titled `title`, begun after `since`, went through."""
    (token,) = [
        t
        for t, values in client.progress_reports.items()
        if t not in since and isinstance(values[0], lsp.WorkDoneProgressBegin) and values[0].title == title
    ]
    return [v.percentage for v in client.progress_reports[token] if getattr(v, "percentage", None) is not None]


async def test_the_profile_progress_moves_with_every_forward(client: Client):
    """On a CPU one forward can take seconds: the progress moves with each of them, not from 0% to done."""
    since = set(client.progress_reports)
    await _profiled(client, "profile_progress.py")
    percentages = _percentages(client, "fuselens: profiling ExampleNet", since)
    assert percentages == sorted(percentages), percentages  # never back
    between = {p for p in percentages if 0 < p < 100}
    assert len(between) >= 10, percentages  # 3 warm-up and 10 profiled forwards, each a step


# A model whose weights alone (8 GiB) are more than a CPU profiles, whatever its inputs.
HUGE = """import torch
import torch.nn as nn


class Huge(nn.Module):  # fuselens: input=(4, 8192)
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8192, 262144)

    def forward(self, x):
        y = self.proj(x)
        return torch.relu(y) * 2.0 + 1.0
"""


async def test_a_model_a_cpu_does_not_profile_is_an_error_that_says_why_instead_of_a_chart(client: Client):
    uri = client.open("profile_huge.py", HUGE)
    await client.diagnostics_of(uri, 1)
    told = len(client.messages)
    result = await client.command("fuselens.profile", uri)
    (shown,) = [m for m in client.messages[told:] if m.message.startswith("fuselens: Huge")]
    assert shown.type == lsp.MessageType.Error, shown  # a failure, said as one
    assert "was not profiled" in shown.message and "fuselens.remoteProfiler" in shown.message, shown.message
    (model,) = result["results_view"]["models"]
    assert model["chart"]["data"] == [] and model["rows"] == []
    assert model["no_data"].startswith("Huge was not profiled: its forward moves"), model  # why, in the chart's place
    assert "_No data: Huge was not profiled: its forward moves" in result["results_markdown"]


SLEEPS = """import time

import torch
import torch.nn as nn


class Sleeps(nn.Module):  # fuselens: input=(64, 64)
    def forward(self, x):
        if x.device.type != "meta":  # (the analysis traces on meta tensors: only the profile sleeps)
            time.sleep(120)
        return torch.relu(x) * 2.0 + 1.0
"""


async def test_a_profile_past_its_time_limit_is_an_error_about_profiling(client: Client):
    from robust_helpers import raw_notify

    uri = client.open("profile_sleeps.py", SLEEPS)
    await client.diagnostics_of(uri, 1)

    async def configure(**worker) -> None:
        seen = len(client.published)
        raw_notify(client, "workspace/didChangeConfiguration", {"settings": {"fuselens": {"worker": worker}}})
        await client.diagnostics_of(uri, client.versions[uri], after=seen)

    await configure(validateTimeoutSeconds=5)
    try:
        told = len(client.messages)
        result = await client.command("fuselens.profile", uri)
    finally:
        await configure()
    assert result["error"] == "timeout", result
    (shown,) = [m for m in client.messages[told:] if "did not finish" in m.message]
    assert shown.type == lsp.MessageType.Error, shown
    assert shown.message.startswith("fuselens: profiling profile_sleeps.py did not finish within 5 s"), shown
    assert "fuselens.worker.validateTimeoutSeconds" in shown.message and "analysis" not in shown.message, shown
