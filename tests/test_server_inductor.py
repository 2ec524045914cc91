"""Language server, torch.compile beside our clusters: a background job after diagnostics."""

from __future__ import annotations

import os

import pytest
import pytest_asyncio

from fuselens.server import views

from lsp_helpers import Client, server_fixture

pytestmark = pytest.mark.asyncio(loop_scope="module")

SETTINGS = {"compareInductor": True, "models": {"ExampleNet": {"inputs": [[64, 1024]]}}}
client = server_fixture(init_options={"workspaceTrusted": True, "settings": SETTINGS})


def comparisons_done(client: Client, version: int) -> bool:
    return any(f"comparison of example_net.py v{version} done" in m.message for m in client.log_messages)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def compared(client: Client) -> str:
    uri = client.open("example_net.py")
    await client.diagnostics_of(uri, 1)
    return uri


async def test_diagnostics_come_first_then_hover_and_lens_gain_the_comparison(client: Client, compared: str):
    """Quietly: no progress in the editor's status, and (torch.compile fusing nothing fuselens does
    not) no second publication of the same diagnostics."""
    first = len(client.published_for(compared))
    hover = await client.hover(compared, 18)
    assert "torch.compile" not in hover.contents.value or comparisons_done(client, 1)
    await client.wait_until(lambda: comparisons_done(client, 1), "the torch.compile comparison", timeout=180)
    await client.roundtrip()
    assert len(client.published_for(compared)) == first
    titles = [getattr(v, "title", "") for values in client.progress_reports.values() for v in values]
    assert not [t for t in titles if "torch.compile" in (t or "")], titles
    hover = await client.hover(compared, 18)  # no re-save: the same version, now with Inductor's view
    text = hover.contents.value
    assert "**torch.compile**" in text and "**agree**" in text and "triton_poi_fused" in text
    lenses = await client.code_lenses(compared)
    # (c1 starts with proj1, which Inductor runs as the library's GEMM: it splits that cluster)
    assert "Inductor agrees on 2/3" in lenses[0].command.title
    shown = await client.command("fuselens.showInductorKernel", compared, "c0")
    assert shown["status"] == "agree" and "@triton.jit" in shown["text"]
    assert shown["path"] == os.path.join(views.views_folder(client.root, "inductor"), "example_net_c0.py")


async def test_a_save_during_the_comparison_cancels_it(client: Client, compared: str):
    text = client.path("example_net.py")
    with open(text) as fh:
        source = fh.read()
    v2 = client.save_text(compared, source + "\n# first edit\n")
    await client.diagnostics_of(compared, v2)
    v3 = client.save_text(compared, source + "\n# second edit\n")  # while v2's comparison runs
    await client.diagnostics_of(compared, v3)
    await client.wait_until(lambda: comparisons_done(client, v3), "the comparison of the newest version", timeout=180)
    cancelled = [m for m in client.log_messages if "comparison cancelled" in m.message]
    assert cancelled, "the comparison of the superseded version kept running"
    assert not comparisons_done(client, v2)
    hover = await client.hover(compared, 18)
    assert "**torch.compile**" in hover.contents.value
