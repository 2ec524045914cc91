"""Language server, diagnostics: one per fusable cluster, at the cluster's lines."""

from __future__ import annotations

import pytest
from lsprotocol import types as lsp

from lsp_helpers import CLUSTERS, Client, example_text, replace_line, server_fixture

pytestmark = pytest.mark.asyncio(loop_scope="module")

client = server_fixture()


def cluster_diagnostics(diags: list[lsp.Diagnostic]) -> list[lsp.Diagnostic]:
    return [d for d in diags if d.message.startswith("fusable:")]


async def test_open_publishes_one_diagnostic_per_cluster(client: Client):
    uri = client.open("example_net.py")
    diags = await client.diagnostics_of(uri, 1)
    lines = example_text().split("\n")

    clusters = cluster_diagnostics(diags)
    assert len(clusters) == 3, [d.message for d in diags]
    others = [d for d in diags if d not in clusters]
    assert all(str(d.code).startswith("pattern:") and d.severity == lsp.DiagnosticSeverity.Hint for d in others), [
        (d.code, d.message) for d in others
    ]  # at most the softmax pattern hint besides the clusters
    for d, want in zip(sorted(clusters, key=lambda d: d.range.start.line), CLUSTERS, strict=True):
        first, last = want["lines"]
        indent = len(lines[first - 1]) - len(lines[first - 1].lstrip())
        assert d.range == lsp.Range(lsp.Position(first - 1, indent), lsp.Position(last - 1, len(lines[last - 1])))
        assert d.severity == lsp.DiagnosticSeverity.Information
        assert d.source == "fuselens"
        assert d.code == want["kind"]
        assert want["chain"] in d.message and want["bytes"] in d.message, d.message
        assert [r.location.range.start.line + 1 for r in d.related_information] == want["ops"]
        assert all(r.location.uri == uri for r in d.related_information)
        ops = [r.message.split()[0] for r in d.related_information]
        assert " → ".join(ops) == want["chain"]  # each related entry names its op (and its shape)
        assert all("16384×" in r.message for r in d.related_information[:1])


async def test_every_publication_carries_the_document_version(client: Client):
    uri = client.open("diag_versions.py", example_text())
    await client.diagnostics_of(uri, 1)
    version = client.save_text(uri, example_text().replace("x = x * 0.5\n", "x = x * 0.25\n"))
    diags = await client.diagnostics_of(uri, version)
    assert len(cluster_diagnostics(diags)) == 3
    assert [p.version for p in client.published_for(uri)] == [1, version]


async def test_close_clears_the_diagnostics(client: Client):
    uri = client.open("diag_close.py", example_text())
    assert cluster_diagnostics(await client.diagnostics_of(uri, 1))
    seen = len(client.published)
    client.close(uri)
    await client.wait_until(lambda: any(p.uri == uri for p in client.published[seen:]), "the clearing publication")
    assert [list(p.diagnostics) for p in client.published[seen:] if p.uri == uri] == [[]]


async def test_a_file_without_models_has_no_diagnostics(client: Client):
    uri = client.open("plain.py", "import math\n\n\ndef area(r):\n    return math.pi * r * r\n")
    assert await client.diagnostics_of(uri, 1) == []


async def test_positions_count_utf16_code_units(client: Client):
    """LSP columns are UTF-16 code units: an emoji is two, a ü is one."""
    line = "        x = x + 1.0  # 🚀 über"
    uri = client.open("diag_utf16.py", replace_line(example_text(), 20, line))
    (first, *_) = sorted(cluster_diagnostics(await client.diagnostics_of(uri, 1)), key=lambda d: d.range.start.line)
    assert first.range.end == lsp.Position(19, len(line) + 1)
    (hint, *_) = await client.inlay_hints(uri)
    assert hint.position == lsp.Position(19, len(line) + 1)


async def test_reopening_a_closed_document_analyzes_it_again(client: Client):
    uri = client.open("diag_reopen.py", example_text())
    await client.diagnostics_of(uri, 1)
    client.close(uri)
    await client.wait_until(lambda: len(client.published_for(uri)) == 2, "the clearing publication")
    client.open("diag_reopen.py")
    (again,) = await client.wait_until(lambda: client.published_for(uri)[2:], "the second analysis")
    assert again.version == 1 and len(cluster_diagnostics(again.diagnostics)) == 3
    assert [p.version for p in client.published_for(uri)] == [1, None, 1]
