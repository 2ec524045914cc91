"""Robustness, what an editor (or a broken client) sends: malformed and out-of-range requests,
requests about documents that are not open, unknown commands and wrong arguments, stale
edits, broken framing, the lifecycle (initialize, shutdown, exit) and settings that arrive late.
Every request gets a JSON-RPC error or an empty/null answer, never silence or a crash;
afterwards the server still answers and analyzes normally; and nothing computed for an older
version of a document is written over what the user typed since.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import os

import pytest
import pytest_asyncio
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException
from pygls.protocol import default_converter
from pytest_lsp import ClientServerConfig, client_capabilities
from pytest_lsp.client import register_lsp_features

from fuselens.server import framing, views
from fuselens.server.app import create_server

from lsp_helpers import (
    FEATURES,
    SERVER,
    TIMEOUT,
    Client,
    end_position,
    example_text,
    make_client,
    make_workspace,
    replace_line,
    running_server,
    server_fixture,
    uri_of,
)
from robust_helpers import Answer, fusable, raw_bytes, raw_notify, raw_request

pytestmark = pytest.mark.asyncio(loop_scope="module")

client = server_fixture()

GOOD = [(18, 20, "mul → relu → add"), (22, 25, "linear → gelu → sigmoid → mul"), (28, 30, "tanh → mul → softmax")]
INVALID_PARAMS, METHOD_NOT_FOUND, INVALID_REQUEST, SERVER_NOT_INITIALIZED = -32602, -32601, -32600, -32002


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
    assert not os.path.exists(os.path.join(views.views_folder(client.root, "kernels"), "gpt_kernels.py"))
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


# ---- framing -----------------------------------------------------------------------------------------


def raw_stream(client: Client, data: bytes) -> None:
    """Bytes onto the server's stdin exactly as given: no framing of their own."""
    written = client.protocol.writer.write(data)
    assert not inspect.isawaitable(written)  # (the stdin of a subprocess: written at once)


BAD_FRAMES = {
    "huge length": b"Content-Length: 99999999999\r\n\r\n{}",
    "over the limit": b"Content-Length: %d\r\n\r\n{}" % (framing.MAX_BODY_BYTES + 1),
    "negative length": b'Content-Length: -5\r\n\r\n{"jsonrpc": "2.0"}',
    "non-numeric length": b"Content-Length: twelve\r\n\r\n{}",
    "exponent": b"Content-Length: 1e3\r\n\r\n{}",
    "no length": b"Content-Type: application/vscode-jsonrpc\r\n\r\n{}",
    "no colon": b"Content-Length 12\r\n\r\n{}",
    "no header": b'{"jsonrpc": "2.0", "id": "no-header", "method": "shutdown"}',
    "endless header": b"X-Filler: " + b"a" * (framing.MAX_HEADER_BYTES * 3),
    "truncated body": b'Content-Length: 90\r\n\r\n{"jsonrpc": "2.0", "method": "textDocument/didSave"',
    "not JSON": b"Content-Length: 9\r\n\r\n{not json",
    "not UTF-8": b'Content-Length: 4\r\n\r\n"\xff\xfe"',
    "too deep": b"Content-Length: 200000\r\n\r\n" + b"[" * 200000,
}


async def test_bad_frames_are_skipped_and_the_stream_recovers(client: Client, figures, good):
    """After each bad frame, the very next request is answered: the reader skipped that frame alone
    (a length it cannot take, a header block that never ends, a body cut short) and found the next."""
    for name, data in BAD_FRAMES.items():
        raw_stream(client, data)
        answer = await raw_request(
            client, "textDocument/hover", {"textDocument": {"uri": good}, "position": position(18)}
        )
        assert answer.error is None and "c0" in answer.result.contents.value, f"after {name}: {answer}"
    figures[f"bad_frames_{client.profile}"] = len(BAD_FRAMES)
    await still_serving(client, good)


# ---- lifecycle ---------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def fresh_server(tmp_path, name: str):
    """A server of its own (the test ends it), without waiting for its worker; killed if the test
    fails (a server that stopped answering would not answer `shutdown` either)."""
    async with running_server("visual-studio-code", make_workspace(str(tmp_path / name)), wait_ready=False) as client:
        try:
            yield client
        except BaseException:
            if client._server.returncode is None:
                client._server.kill()
                await client._server.wait()
            raise


async def test_initialize_is_answered_once(tmp_path):
    async with fresh_server(tmp_path, "initialize twice") as client:
        again = await raw_request(client, "initialize", {"capabilities": {}, "processId": None})
        assert again.code == INVALID_REQUEST and "already initialized" in str(again.error), again
        await still_answering(client)


async def test_requests_after_shutdown_are_refused_and_exit_is_0(tmp_path):
    async with fresh_server(tmp_path, "after shutdown") as client:
        assert await client.shutdown_async(None) is None
        for method, params in (
            ("textDocument/hover", {"textDocument": {"uri": uri_of(client.root)}, "position": position(0)}),
            ("workspace/executeCommand", {"command": "fuselens.analyze", "arguments": []}),
            ("shutdown", None),
            ("fuselens/bogus", None),
        ):
            answer = await raw_request(client, method, params, timeout=10)
            assert answer.code == INVALID_REQUEST and "after shutdown" in str(answer.error), answer
        raw_notify(client, "exit", None)
        assert await asyncio.wait_for(client._server.wait(), TIMEOUT) == 0


async def test_exit_without_shutdown_is_1(tmp_path):
    async with fresh_server(tmp_path, "no shutdown") as client:
        await still_answering(client)
        raw_notify(client, "exit", None)
        assert await asyncio.wait_for(client._server.wait(), TIMEOUT) == 1


async def still_answering(client: Client) -> None:
    answer = await raw_request(
        client, "textDocument/hover", {"textDocument": {"uri": uri_of(client.root)}, "position": position(0)}
    )
    assert answer.error is None and answer.result is None, answer


async def test_requests_before_initialize_are_refused(tmp_path):
    config = ClientServerConfig(server_command=SERVER, client_factory=make_client)
    client = await config.start()
    try:
        answer = await raw_request(
            client, "textDocument/hover", {"textDocument": {"uri": "file:///a.py"}, "position": position(0)}
        )
        assert answer.code == SERVER_NOT_INITIALIZED, answer
        raw_notify(client, "exit", None)
        assert await asyncio.wait_for(client._server.wait(), TIMEOUT) == 1
    finally:
        if client._server.returncode is None:
            client._server.kill()
        await client.stop()


# ---- settings before the first job -------------------------------------------------------------------


async def _answer_once_opened(ls: Client, params: lsp.ConfigurationParams):
    """A client slow to answer workspace/configuration: it answers only once the test has opened a
    document (so the didOpen surely arrives while the server waits for its settings)."""
    ls.configuration_requests += 1
    ls.arrived()
    await ls.opened.wait()
    return [ls.get_configuration(section=item.section) for item in params.items]


def slow_configuration_client() -> Client:
    client = Client(converter_factory=default_converter)
    client.opened = asyncio.Event()
    register_lsp_features(client, {**FEATURES, lsp.WORKSPACE_CONFIGURATION: _answer_once_opened})
    return client


async def test_a_document_opened_before_the_settings_arrive_is_analyzed_with_them(tmp_path):
    """timeoutSeconds 0.5 from workspace/configuration, answered only after a looping model was opened:
    its analysis still runs under 0.5 s, not the 60 s default."""
    root = make_workspace(str(tmp_path / "slow settings"))
    config = ClientServerConfig(server_command=SERVER, client_factory=slow_configuration_client)
    client = await config.start()
    client.root = root
    client.set_configuration({"worker": {"timeoutSeconds": 0.5}}, section="fuselens")
    try:
        await client.initialize_session(
            lsp.InitializeParams(
                capabilities=client_capabilities("visual-studio-code"),
                initialization_options={"workspaceTrusted": True, "settings": {"compareInductor": False}},
                root_uri=uri_of(root),
                workspace_folders=[lsp.WorkspaceFolder(uri=uri_of(root), name="slow")],
            )
        )
        await client.wait_until(lambda: client.configuration_requests, "the server to ask for its settings")
        uri = client.open("looping.py", replace_line(example_text(), 19, "        while x is not None: pass"))
        await client.roundtrip()  # the didOpen has been handled, the settings are not in yet
        client.opened.set()

        (error,) = await client.diagnostics_of(uri, 1, timeout=40)
        assert error.code == "timeout", error
        assert "worker.timeoutSeconds is 0.5 s" in error.message, error.message
    finally:
        if client._server.returncode is None:
            await asyncio.wait_for(client.shutdown_session(), TIMEOUT)
        await client.stop()


async def test_an_answer_to_a_request_the_server_cancelled_is_dropped():
    """`shutdown` cancels the server's own requests too (a workspace/configuration it waits for,
    say); the client's answer to one may still come, while the server's shutdown handler runs."""
    server, _ = create_server()
    protocol = server.protocol
    protocol.receive({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"capabilities": {}}})
    cancelled: concurrent.futures.Future = concurrent.futures.Future()
    cancelled.cancel()
    protocol._request_futures["the server's request"] = cancelled
    protocol.receive({"jsonrpc": "2.0", "id": "the server's request", "result": [None]})
    assert "the server's request" not in protocol._request_futures
    assert not protocol.complaints, protocol.complaints
