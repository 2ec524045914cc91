"""Language server, hover: everything about the cluster under the cursor, as markdown."""

from __future__ import annotations

import json
import re
import urllib.parse

import pytest
from lsprotocol import types as lsp

from lsp_helpers import CLUSTERS, Client, analyzed_fixture, example_text, server_fixture, uri_of

pytestmark = pytest.mark.asyncio(loop_scope="module")

client = server_fixture()
analyzed = analyzed_fixture()


@pytest.mark.parametrize("index", range(3))
async def test_hover_on_every_line_of_a_cluster(client: Client, analyzed: str, index: int):
    want = CLUSTERS[index]
    first, last = want["lines"]
    for line in range(first, last + 1):
        hover = await client.hover(analyzed, line)
        assert hover is not None, f"no hover on line {line}"
        assert hover.contents.kind == lsp.MarkupKind.Markdown
        text = hover.contents.value
        assert f"c{index}" in text and f"cluster{index}" in text and want["kind"] in text
        ops = " → ".join(
            f"`{op}` {op_line}" for op, op_line in zip(want["chain"].split(" → "), want["ops"], strict=True)
        )
        assert f"{ops} · 16384×" in text and "float32" in text  # the ops with their lines, over their shape
        assert f"**{want['bytes']}**" in text
        assert "dram-bound" in text  # the regime
        assert f"maps **exactly** to lines {first}–{last}" in text
        assert "**training**: a backward kernel computes the gradients of " in text
        # Compact: no kernel source, but a link that opens it (the server's own command, this cluster).
        assert "@triton.jit" not in text and len([t for t in text.splitlines() if t.strip()]) <= 9, text
        (link,) = re.findall(r"\[Open the kernel\]\(command:fuselens\.showKernel\?([^)]*)\)", text)
        assert json.loads(urllib.parse.unquote(link)) == [analyzed, f"c{index}"]


async def test_hover_shows_the_bytes_moved(client: Client, analyzed: str):
    text = (await client.hover(analyzed, 19)).contents.value
    assert "**384 MB → 128 MB** (−67%) DRAM traffic" in text
    assert "reads `x` 16384×1024 float32; writes 16384×1024 float32" in text
    # The training line gives the backward's traffic apart from the forward's: less when fused.
    (unfused, fused) = re.findall(
        r"a backward kernel computes .* \(\*\*([\d.]+) MB → ([\d.]+) MB\*\* of DRAM traffic\)", text
    )[0]
    assert float(fused) < float(unfused), text


@pytest.mark.parametrize("line", [1, 11, 14, 17, 21, 22, 26, 27])
async def test_no_hover_outside_clusters(client: Client, analyzed: str, line: int):
    assert await client.hover(analyzed, line) is None  # docstring, class line, __init__, forward, Linears, blanks


async def test_no_hover_before_the_analysis_or_for_an_unknown_file(client: Client):
    assert await client.hover(uri_of(client.path("nowhere.py")), 19) is None


async def test_unsaved_edits_hide_results_that_no_longer_line_up(client: Client):
    """Hover, inlay hints and lenses answer for the text they were computed from only."""
    uri = client.open("hover_edit.py", example_text())
    await client.diagnostics_of(uri, 1)
    assert await client.hover(uri, 18) is not None
    client.change(uri, "# a comment pushes everything down a line\n" + example_text())  # typed, not saved
    assert await client.hover(uri, 18) is None  # now `def forward(self, x):`: the old cluster moved down
    assert await client.inlay_hints(uri) == []
    assert await client.code_lenses(uri) == []
    assert await client.code_actions(uri, 19) == []
    version = client.save_text(uri, client.texts[uri])
    await client.diagnostics_of(uri, version)
    hover = await client.hover(uri, 19)  # analyzed again: everything is one line further down
    assert hover is not None and "`mul` 19 → " in hover.contents.value
    assert await client.hover(uri, 18) is None
    assert [h.position.line + 1 for h in await client.inlay_hints(uri)] == [21, 26, 31]
