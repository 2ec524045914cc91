"""Language server, profile: the "Profile" lens measures the forward in the worker, and the hover, the
inlay hints and the lens then show the measured time per line and per cluster (CPU op times here)."""

from __future__ import annotations

import pytest

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
    assert result["results_markdown"].startswith("### ExampleNet: where the time of a forward goes")
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
    linear = next(line for line in model["lines"] if line["ops"] == ["linear"])
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
