"""Language server, hover: everything about the cluster under the cursor, as markdown."""

from __future__ import annotations

import json
import re
import textwrap
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
        # It opens with a bold line, not a markdown heading (editors showing markdown as text keep its
        # `###`), broken before the summary so that the summary is a line of its own everywhere.
        heading, summary = text.split("\n")[:2]
        assert heading == f"**⚡ c{index} · {want['kind']} · `cluster{index}` · ExampleNet**  ", heading
        assert summary.startswith(f"**{want['bytes']}**"), summary
        ops = " → ".join(
            f"`{op}` {op_line}" for op, op_line in zip(want["chain"].split(" → "), want["ops"], strict=True)
        )
        assert f"{ops} · 16384×" in text and "float32" in text  # the ops with their lines, over their shape
        assert f"**{want['bytes']}**" in text
        assert want["regime"] in text
        assert f"maps **exactly** to lines {first}–{last}" in text
        # A save's analysis leaves the backward to the kernel's code, generated when something asks.
        assert "**training**: whether its backward is a kernel is worked out with the kernel's code" in text
        # Compact: no kernel source, but a link that opens it (the server's own command, this cluster).
        assert "@triton.jit" not in text and len([t for t in text.splitlines() if t.strip()]) <= 9, text
        (link,) = re.findall(r"\[Open the kernel\]\(command:fuselens\.showKernel\?([^)]*)\)", text)
        assert json.loads(urllib.parse.unquote(link)) == [analyzed, f"c{index}"]


async def test_hover_shows_the_bytes_moved(client: Client):
    uri = client.open("hover_bytes.py", example_text())
    await client.diagnostics_of(uri, 1)
    text = (await client.hover(uri, 19)).contents.value
    assert "**384 MB → 128 MB** (−67%) DRAM traffic" in text
    assert "reads `x` 16384×1024 float32; writes 16384×1024 float32" in text
    # Once the kernel's code is generated (opening the kernel asks for it), the training line gives the
    # backward's traffic apart from the forward's: less when fused.
    await client.command("fuselens.showKernel", uri, "c0")
    text = (await client.hover(uri, 19)).contents.value
    (unfused, fused) = re.findall(
        r"a backward kernel computes .* \(\*\*([\d.]+) MB → ([\d.]+) MB\*\* of DRAM traffic\)", text
    )[0]
    assert float(fused) < float(unfused), text


@pytest.mark.parametrize("line", [1, 11, 14, 17, 21, 26, 27])
async def test_no_hover_outside_clusters(client: Client, analyzed: str, line: int):
    assert await client.hover(analyzed, line) is None  # docstring, class line, __init__, forward, a Linear, blanks


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


# A line that reaches a library's model reaches every cluster of it: the transformers Llama of the
# library tests, built from its configuration (nothing downloaded), in the user's file.
LLAMA_LINE = 5  # model = LlamaForCausalLM(config)  # fuselens: input=(2, 16)
HOVER_LINES = 40  # the most lines a hover takes


def _bytes(label: str) -> float:
    number, unit = label.split()
    return float(number) * {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}[unit]


def _saved_in_all(text: str) -> float:
    """The traffic a cluster saves in all its instances: "82 KB → 18 KB in all" in its details (else, for
    one instance, its summary), or the first figures of its line among the others."""
    figures = r"\**([\d.]+ [KMG]?B) → ([\d.]+ [KMG]?B)"
    found = re.search(figures + r".{0,12} in all", text) or re.search(figures, text)
    assert found, text
    return _bytes(found[1]) - _bytes(found[2])


def _kernel_links(text: str) -> list[str]:
    """The cluster each "Open the kernel" link opens, in order."""
    return [json.loads(urllib.parse.unquote(link))[1] for link in re.findall(r"showKernel\?([^)]*)\)", text)]


async def test_a_library_models_hover_opens_with_its_most_useful_cluster_and_is_bounded(client: Client):
    pytest.importorskip("transformers")
    from library_corpus import CORPUS

    llama = next(case for case in CORPUS if case.id == "llama")
    uri = client.open("hover_llama.py", textwrap.dedent(llama.source).lstrip("\n"))
    await client.diagnostics_of(uri, 1, timeout=180)
    text = (await client.hover(uri, LLAMA_LINE)).contents.value
    lines = text.split("\n")
    assert len(lines) <= HOVER_LINES, len(lines)
    # It opens with one cluster: its heading, then one line that says what fusing it saves, with its link.
    first = re.match(r"\*\*⚡ (c\d+) · .*\*\*  $", lines[0])
    assert first, lines[0]
    assert "DRAM traffic" in lines[1] and _kernel_links(lines[1]) == [first[1]], lines[1]
    # The others follow, a line each, with their own links; every cluster once.
    others = [line for line in lines if line.startswith("- **c")]
    links = _kernel_links(text)
    assert len(links) == len(set(links)) == 1 + len(others) >= 6, links
    assert all(_kernel_links(line) == [re.match(r"- \*\*(c\d+)\*\*", line)[1]] for line in others), others
    # The first is the one that saves the most, in all its instances.
    details = text.split("\n---\n")[0]
    assert all(_saved_in_all(details) >= _saved_in_all(line) for line in others), (details, others)
    assert "`LlamaRMSNorm.forward`" in text  # each named by its function in the library
    client.close(uri)


CLOSURES = """
import torch


def make_gate(scale):
    def gate(x):
        y = x * scale
        y = torch.sigmoid(y)
        return y + 1.0

    return gate
"""
GATED = """
import torch.nn as nn

from closures import make_gate


class Gated(nn.Module):  # fuselens: input=(64, 64)
    def __init__(self):
        super().__init__()
        self.gate = make_gate(2.0)

    def forward(self, x):
        return self.gate(x)
"""


def _outside_code(text: str) -> str:
    return re.sub(r"```.*?```|`[^`\n]*`", "", text, flags=re.S)


async def test_a_function_made_inside_another_keeps_its_name(client: Client):
    """`make_gate.<locals>.gate`: markdown reads a bare `<locals>` as an HTML tag, which editors drop."""
    client.write("closures.py", CLOSURES.lstrip("\n"))
    uri = client.open("gated.py", GATED.lstrip("\n"))
    await client.diagnostics_of(uri, 1)
    text = (await client.hover(uri, 12)).contents.value  # return self.gate(x)
    assert not re.search(r"(?<!\\)<", _outside_code(text)), text
    assert "closures.py (make_gate.\\<locals\\>.gate)" in text  # in the sentence, escaped
    assert "`make_gate.<locals>.gate`" in text  # in the heading, as code
    client.close(uri)
