"""Language server, inlay hints: the traffic each cluster saves, at the end of its last line."""

from __future__ import annotations

import pytest
from lsprotocol import types as lsp

from lsp_helpers import CLUSTERS, Client, analyzed_fixture, example_text, server_fixture

pytestmark = pytest.mark.asyncio(loop_scope="module")

client = server_fixture()
analyzed = analyzed_fixture()


async def test_one_hint_at_the_end_of_each_cluster(client: Client, analyzed: str):
    lines = example_text().split("\n")
    hints = await client.inlay_hints(analyzed)
    assert len(hints) == 3
    for hint, want in zip(sorted(hints, key=lambda h: h.position.line), CLUSTERS, strict=True):
        last = want["lines"][1]
        assert hint.position == lsp.Position(last - 1, len(lines[last - 1]))
        assert hint.label == f"⚡ −{want['saved']}"
        assert hint.padding_left
        assert want["chain"] in hint.tooltip and want["regime"] in hint.tooltip


async def test_hints_only_for_the_requested_range(client: Client, analyzed: str):
    async def ask(first: int, last: int) -> list[lsp.InlayHint]:  # whole lines, 1-based, inclusive
        return list(
            await client.text_document_inlay_hint_async(
                lsp.InlayHintParams(
                    lsp.TextDocumentIdentifier(analyzed), lsp.Range(lsp.Position(first - 1, 0), lsp.Position(last, 0))
                )
            )
        )

    assert [h.label for h in await ask(21, 26)] == ["⚡ −192 MB"]
    assert [h.position.line + 1 for h in await ask(1, 20)] == [20]
    assert [h.position.line + 1 for h in await ask(25, 40)] == [25, 30]
    assert await ask(1, 17) == []


async def test_hints_follow_the_saved_text(client: Client):
    uri = client.open("hints_edit.py", example_text())
    await client.diagnostics_of(uri, 1)
    version = client.save_text(uri, example_text().replace("        x = x * 3.0\n", ""))  # c2 is now tanh → softmax
    await client.diagnostics_of(uri, version)
    hints = await client.inlay_hints(uri)
    assert [(h.position.line + 1, h.label) for h in hints] == [
        (20, "⚡ −256 MB"),
        (25, "⚡ −192 MB"),
        (29, "⚡ −64 MB"),
    ]


async def test_clients_that_can_refresh_are_asked_to(client: Client):
    """After an analysis the server asks the client to re-request hints and lenses, where it can."""
    uri = client.open("hints_refresh.py", example_text())
    before = dict(client.refreshes)
    await client.diagnostics_of(uri, 1)
    await client.roundtrip()
    inlay = client.refreshes[lsp.WORKSPACE_INLAY_HINT_REFRESH] - before.get(lsp.WORKSPACE_INLAY_HINT_REFRESH, 0)
    lens = client.refreshes[lsp.WORKSPACE_CODE_LENS_REFRESH] - before.get(lsp.WORKSPACE_CODE_LENS_REFRESH, 0)
    if client.profile == "neovim":  # claims inlayHint.refreshSupport, not codeLens's
        assert (inlay, lens) == (1, 0)
    else:  # VS Code 1.65 claims codeLens.refreshSupport only
        assert (inlay, lens) == (0, 1)
