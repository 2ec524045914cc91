"""Robustness, what an editor (or a broken client) sends: malformed and out-of-range requests,
requests about documents that are not open, unknown commands and wrong arguments, and stale
edits.  Every request gets a JSON-RPC error or an empty/null answer, never silence or a crash;
afterwards the server still answers and analyzes normally; and nothing computed for an older
version of a document is written over what the user typed since.
"""

from __future__ import annotations

import os

import pytest
import pytest_asyncio
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException

from lsp_helpers import Client, end_position, example_text, server_fixture, uri_of
from robust_helpers import Answer, fusable, raw_bytes, raw_notify, raw_request

pytestmark = pytest.mark.asyncio(loop_scope="module")

client = server_fixture()

GOOD = [(18, 20, "mul → relu → add"), (23, 25, "gelu → sigmoid → mul"), (28, 30, "tanh → mul → softmax")]
INVALID_PARAMS, METHOD_NOT_FOUND = -32602, -32601


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def good(client: Client) -> str:
    uri = client.open("protocol_good.py", example_text())
    assert fusable(await client.diagnostics_of(uri, 1)) == GOOD
    return uri


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def closed(client: Client) -> str:
    uri = client.open("protocol_closed.py", example_text())
    await client.diagnostics_of(uri, 1)
    client.close(uri)
    await client.roundtrip()
    return uri


def bad_uris(client: Client, closed: str) -> dict[str, str]:
    return {
        "untitled": "untitled:Untitled-1",
        "http": "http://example.com/model.py",
        "notebook cell": "vscode-notebook-cell:/model.ipynb#W0sZmlsZQ%3D%3D",
        "never opened": uri_of(client.path("gpt.py")),
        "closed": closed,
        "nonexistent": uri_of(client.path("no/such/folder/model.py")),
        "outside": "file:///nonexistent/model.py",
        "a folder": uri_of(client.root),
        "not a .py": uri_of(client.path("pyproject.toml")),
        "garbage": "garbage",
        "empty": "",
        "scheme only": "file://",
        "bad escapes": "file:///%ZZ%E2%28.py",
        "escaped NUL": "file:///tmp/a%00b.py",
        "raw NUL": "file:///tmp/a\u0000b.py",
        "huge": "file:///" + "x" * 20_000 + ".py",
    }


def position(line: int, character: int = 8) -> dict:
    return {"line": line, "character": character}


def span(first: dict, last: dict) -> dict:
    return {"start": first, "end": last}


def is_empty(answer: Answer) -> bool:
    return answer.error is None and answer.result in (None, [])


class Sent:
    """Counts what a test sends, by what it expects back."""

    def __init__(self, figures: dict, key: str):
        self.figures = figures
        self.counts = figures.setdefault(key, {})

    async def expect(
        self, client: Client, kind: str, method: str, params, code: int | None = None, match: str | None = None
    ) -> Answer:
        """kind: "empty" (null or []), "error" (a JSON-RPC error, of `code`, with `match` in its
        message), or "answer" (anything but silence)."""
        answer = await raw_request(client, method, params)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.figures["malformed_requests_sent"] = self.figures.get("malformed_requests_sent", 0) + 1
        where = f"{method} {str(params)[:160]}"
        if kind == "empty":
            assert is_empty(answer), f"{where}: {answer}"
        elif kind == "error":
            assert answer.error is not None, f"{where}: {answer}"
            if code is not None:
                assert answer.code == code, f"{where}: {answer}"
            if match is not None:
                assert match in str(answer.error), f"{where}: {answer}"
        return answer


async def still_serving(client: Client, good: str) -> None:
    """The server process is up, answers a normal request, and still analyzes."""
    assert client._server.returncode is None
    hover = await client.hover(good, 19)
    assert hover is not None and "c0" in hover.contents.value
    version = client.save_text(good, client.texts[good])
    assert fusable(await client.diagnostics_of(good, version, after=len(client.published))) == GOOD


async def test_requests_about_documents_that_are_not_open_files(client: Client, figures, good, closed):
    sent = Sent(figures, f"requests_bad_uri_{client.profile}")
    for uri in bad_uris(client, closed).values():
        document = {"uri": uri}
        await sent.expect(client, "empty", "textDocument/hover", {"textDocument": document, "position": position(18)})
        await sent.expect(
            client,
            "empty",
            "textDocument/inlayHint",
            {"textDocument": document, "range": span(position(0, 0), position(40, 0))},
        )
        await sent.expect(client, "empty", "textDocument/codeLens", {"textDocument": document})
        await sent.expect(
            client,
            "empty",
            "textDocument/codeAction",
            {"textDocument": document, "range": span(position(18), position(18)), "context": {"diagnostics": []}},
        )
        for command, arguments in (
            ("fuselens.analyze", [uri]),
            ("fuselens.showKernel", [uri]),
            ("fuselens.validateKernel", [uri, "c0", {"interpret": True}]),
            ("fuselens.validateAll", [uri]),
            ("fuselens.writeKernelModule", [uri, 1, ["c0"]]),
            ("fuselens.showInductorKernel", [uri, "c0"]),
        ):
            await sent.expect(
                client,
                "error",
                "workspace/executeCommand",
                {"command": command, "arguments": arguments},
                INVALID_PARAMS,
            )
    assert not os.path.exists(os.path.join(client.root, ".fuselens", "kernels", "gpt_kernels.py"))
    await still_serving(client, good)


async def test_out_of_range_and_malformed_requests(client: Client, figures, good):
    sent = Sent(figures, f"requests_malformed_{client.profile}")
    doc = {"uri": good}
    end = end_position(client.texts[good])
    huge = 2**31 - 1
    # Past the end of the document (or of a line), reversed ranges: empty, or what is there.
    for where in (position(10**6, 10**6), position(huge, huge), position(end.line + 1, 0)):
        await sent.expect(client, "empty", "textDocument/hover", {"textDocument": doc, "position": where})
        await sent.expect(
            client,
            "empty",
            "textDocument/codeAction",
            {"textDocument": doc, "range": span(where, where), "context": {"diagnostics": []}},
        )
    await sent.expect(client, "answer", "textDocument/hover", {"textDocument": doc, "position": position(18, 10**6)})
    for first, last in ((position(30, 0), position(2, 0)), (position(10**6, 0), position(huge, 0))):
        await sent.expect(client, "empty", "textDocument/inlayHint", {"textDocument": doc, "range": span(first, last)})
        await sent.expect(
            client,
            "empty",
            "textDocument/codeAction",
            {"textDocument": doc, "range": span(first, last), "context": {"diagnostics": []}},
        )
    # (lsprotocol's converter reads "18" as 18 and 42 as "42": lenient, and answered.)
    await sent.expect(
        client, "answer", "textDocument/hover", {"textDocument": doc, "position": {"line": "18", "character": 0}}
    )
    await sent.expect(client, "empty", "textDocument/hover", {"textDocument": {"uri": 42}, "position": position(18)})
    answer = await sent.expect(
        client,
        "answer",
        "textDocument/inlayHint",
        {"textDocument": doc, "range": span(position(0, 0), position(huge, huge))},
    )
    assert answer.result  # the whole document's hints
    # Negative numbers, missing or mistyped fields, params of the wrong shape: an InvalidParams error.
    for params in (
        {"textDocument": doc, "position": position(-1, 0)},
        {"textDocument": doc, "position": position(18, -5)},
        {"textDocument": doc, "position": position(2**32, 0)},
        {"textDocument": {}, "position": position(18)},
        {"position": position(18)},
        {"textDocument": doc},
        None,
        [],
        "hover",
    ):
        await sent.expect(client, "error", "textDocument/hover", params, INVALID_PARAMS)
    for rng in (span(position(-3, 0), position(-1, 0)), span(position(0, 0), None), {"start": position(0, 0)}):
        await sent.expect(
            client, "error", "textDocument/inlayHint", {"textDocument": doc, "range": rng}, INVALID_PARAMS
        )
        await sent.expect(
            client,
            "error",
            "textDocument/codeAction",
            {"textDocument": doc, "range": rng, "context": {"diagnostics": []}},
            INVALID_PARAMS,
        )
    await sent.expect(
        client,
        "error",
        "textDocument/codeAction",
        {"textDocument": doc, "range": span(position(18), position(18))},
        INVALID_PARAMS,
    )
    await sent.expect(client, "error", "textDocument/codeLens", {"textDocument": None}, INVALID_PARAMS)
    # Methods it does not have.
    for method, params in (
        ("fuselens/bogus", {"textDocument": doc}),
        ("", None),
        ("textDocument/definition", {"textDocument": doc, "position": position(18)}),
        ("workspace/symbol", {"query": "ExampleNet"}),
    ):
        await sent.expect(client, "error", method, params, METHOD_NOT_FOUND)
    await still_serving(client, good)


async def test_unknown_commands_and_wrong_arguments(client: Client, figures, good):
    sent = Sent(figures, f"requests_bad_command_{client.profile}")
    module = client.path("protocol_good_kernels.py")

    async def command(name, arguments, match=None):
        await sent.expect(
            client,
            "error",
            "workspace/executeCommand",
            {"command": name, "arguments": arguments},
            INVALID_PARAMS,
            match,
        )

    await command("fuselens.nope", [good], "is not defined")
    await command("", [], "is not defined")
    await command("fuselens.analyze", [], "missing argument 'uri'")
    await command("fuselens.analyze", [None], "missing argument 'uri'")
    await command("fuselens.analyze", [7], "argument 'uri' must be str")
    await command("fuselens.analyze", [{"uri": good}], "argument 'uri' must be str")
    await command("fuselens.analyze", [good, good], "expected at most 1 arguments")
    await command("fuselens.showKernel", [good, 5], "argument 'which' must be str")
    await command("fuselens.showKernel", [good, "c9"], "no model or cluster 'c9'")
    await command("fuselens.showKernel", [[good]], "argument 'uri' must be str")
    await command("fuselens.validateKernel", [good], "missing argument 'cluster'")
    await command("fuselens.validateKernel", [good, ["c0"]], "argument 'cluster' must be str")
    await command("fuselens.validateKernel", [good, "c0", "interpret"], "argument 'options' must be dict")
    await command("fuselens.validateKernel", [good, "c0", {}, "extra"], "expected at most 3 arguments")
    await command("fuselens.validateAll", [good, 7], "argument 'model' must be str")
    await command("fuselens.validateAll", [good, "NoSuchModel"], "no analyzed model 'NoSuchModel'")
    await command("fuselens.writeKernelModule", [good, "1", ["c0"]], "argument 'version' must be int")
    await command("fuselens.writeKernelModule", [good, 1.0, ["c0"]], "argument 'version' must be int")
    await command("fuselens.writeKernelModule", [good, True, ["c0"]], "argument 'version' must be int")
    await command("fuselens.writeKernelModule", [good, None, ["c0"]], "missing argument 'version'")
    await command("fuselens.writeKernelModule", [good, 1, "c0"], "argument 'clusters' must be list")
    await command("fuselens.writeKernelModule", [good, -1, ["c0"]], "changed since version -1; nothing written")
    await command("fuselens.writeKernelModule", [good, 2**40, ["c0"]], "changed since version")
    version = client.versions[good]
    await command("fuselens.writeKernelModule", [good, version, []], "no kernels for clusters")
    await command("fuselens.writeKernelModule", [good, version, [0, None, {"id": "c0"}]], "no kernels for clusters")
    await command("fuselens.showInductorKernel", [good, "c0"], "no torch.compile comparison for c0")
    await command("fuselens.showInductorKernel", [good], "missing argument 'cluster'")
    for arguments in ("abc", {"uri": good}, 5):  # not a list at all
        await sent.expect(
            client,
            "error",
            "workspace/executeCommand",
            {"command": "fuselens.analyze", "arguments": arguments},
            INVALID_PARAMS,
        )
    await sent.expect(client, "error", "workspace/executeCommand", {"arguments": [good]}, INVALID_PARAMS)
    assert not os.path.exists(module)  # none of that wrote anything
    await still_serving(client, good)


async def test_malformed_notifications_are_survived(client: Client, figures, good, closed):
    """Notifications get no answer; what matters is that nothing breaks, nothing is analyzed that
    should not be, and nothing pops up in the user's face for a URI it cannot read."""
    seen, told = len(client.published), len(client.messages)
    sent = 0
    for name, uri in bad_uris(client, closed).items():
        if name in ("closed", "never opened"):
            continue
        raw_notify(
            client,
            "textDocument/didOpen",
            {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": example_text()}},
        )
        raw_notify(client, "textDocument/didSave", {"textDocument": {"uri": uri}})
        raw_notify(client, "textDocument/didClose", {"textDocument": {"uri": uri}})
        sent += 3
    never = uri_of(client.path("branchy.py"))
    for method, params in (
        (
            "textDocument/didChange",
            {"textDocument": {"uri": never, "version": 2}, "contentChanges": [{"text": "x = 1\n"}]},
        ),
        ("textDocument/didSave", {"textDocument": {"uri": never}}),
        ("textDocument/didClose", {"textDocument": {"uri": never}}),
        ("textDocument/didOpen", {"textDocument": {"uri": never}}),  # no text, version or language
        ("textDocument/didChange", {"textDocument": {"uri": good, "version": 99}}),  # no changes
        ("textDocument/didOpen", None),
        ("workspace/didChangeWatchedFiles", {"changes": [{"uri": "garbage", "type": 2}]}),
        ("workspace/didChangeWatchedFiles", {"changes": [{"uri": uri_of(client.path("x\u0000.py")), "type": 1}]}),
        ("workspace/didChangeConfiguration", {"settings": "not an object"}),
        ("$/cancelRequest", {"id": "no-such-request"}),
        ("fuselens/bogusNotification", {"x": 1}),
    ):
        raw_notify(client, method, params)
        sent += 1
    raw_bytes(client, b"{this is not json")
    raw_bytes(client, b'{"jsonrpc": "2.0", "id": "orphan"}')  # neither request nor notification
    sent += 2
    figures[f"notifications_malformed_{client.profile}"] = sent
    await client.roundtrip()

    # Only the real .py files among them were analyzed: the ones outside the workspace, the
    # nonexistent one and the huge name, opened with a model's text (the editor's trust covers them).
    analyzed = {p.uri for p in client.published[seen:] if p.diagnostics}
    assert not analyzed & {
        "untitled:Untitled-1",
        "http://example.com/model.py",
        "garbage",
        "",
        "file:///tmp/a%00b.py",
        "file:///tmp/a\u0000b.py",
    }
    assert not [m.message for m in client.messages[told:] if "embedded null" in m.message]
    await still_serving(client, good)


# ---- stale edits -------------------------------------------------------------------------------------


def model_edits(action: lsp.CodeAction, uri: str) -> list[lsp.TextDocumentEdit]:
    return [
        c
        for c in action.edit.document_changes or []
        if isinstance(c, lsp.TextDocumentEdit) and c.text_document.uri == uri
    ]


def refused_by_a_versioned_client(client: Client, edit: lsp.WorkspaceEdit) -> list[str]:
    """What an editor honouring versions checks before applying a workspace edit (atomically: one
    stale document edit refuses all of it): the documents whose version no longer matches."""
    return [
        f"{c.text_document.uri} v{c.text_document.version} (buffer v{client.versions[c.text_document.uri]})"
        for c in edit.document_changes or []
        if isinstance(c, lsp.TextDocumentEdit)
        and c.text_document.uri in client.versions
        and c.text_document.version is not None
        and c.text_document.version != client.versions[c.text_document.uri]
    ]


async def test_a_quick_fix_for_an_older_version_is_refused(client: Client):
    uri = client.open("stale_fix.py", example_text())
    await client.diagnostics_of(uri, 1)
    (fix, _) = await client.code_actions(uri, 18)
    (edit,) = model_edits(fix, uri)
    assert edit.text_document.version == 1  # a versioned TextDocumentEdit, for the text it was computed from

    typed = "# the user typed this after the fix was offered\n" + example_text()
    assert client.change(uri, typed) == 2
    assert refused_by_a_versioned_client(client, fix.edit) == [f"{uri} v1 (buffer v2)"]
    if client.supports_document_changes():  # (lsp_helpers' client checks versions as such an editor does)
        with pytest.raises(AssertionError, match="edit for v1, buffer at v2"):
            client.apply_workspace_edit(lsp.WorkspaceEdit(document_changes=model_edits(fix, uri)))
    assert client.texts[uri] == typed
    with open(client.path("stale_fix.py"), encoding="utf-8") as fh:
        assert fh.read() == example_text()  # not saved, not touched
    assert await client.code_actions(uri, 19) == []  # and nothing new is offered for the typed text


async def test_write_kernel_module_refuses_a_stale_version(client: Client):
    """The command that follows a fix (for clients that cannot create files) carries the version the
    fix was computed for; once a newer version is analyzed, running it writes nothing."""
    uri = client.open("stale_module.py", example_text())
    await client.diagnostics_of(uri, 1)
    module = client.path("stale_module_kernels.py")
    mine = "# my notes on these kernels\n"
    with open(module, "w", encoding="utf-8") as fh:
        fh.write(mine)

    version = client.save_text(uri, "# typed and saved\n" + example_text())
    diags = await client.diagnostics_of(uri, version)
    assert [chain for *_, chain in fusable(diags)] == [chain for *_, chain in GOOD]
    with pytest.raises(JsonRpcException, match="changed since version 1; nothing written"):
        await client.command("fuselens.writeKernelModule", uri, 1, ["c0"])
    with open(module, encoding="utf-8") as fh:
        assert fh.read() == mine
    with open(client.path("stale_module.py"), encoding="utf-8") as fh:
        assert fh.read() == client.texts[uri]
