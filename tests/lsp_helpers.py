"""Helpers for the end-to-end language server tests (tests/test_server_*.py).

Every test drives the real server (`python -m fuselens.cli.main serve`) over stdio with
pytest-lsp, once per client capability profile (VS Code and Neovim).  The client here
records everything the server sends, answers the requests a real editor answers, and
lets a test wait for what it expects (with a timeout) instead of sleeping.

A module gets its server from `server_fixture(...)`: one server per profile, shared by
the module's tests, in a fresh copy of the examples folder.  Tests that share a server
use their own document names so they do not see each other's state.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import glob
import inspect
import itertools
import json
import os
import shutil
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote

import pytest_asyncio
from lsprotocol import types as lsp
from pygls.protocol import default_converter
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities
from pytest_lsp.client import DEFAULT_CLIENT_FEATURES, register_lsp_features

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")
SERVER = [sys.executable, "-m", "fuselens.cli.main", "serve"]
PROFILES = ["visual-studio-code", "neovim"]
# The name each profile's editor gives in `initialize` (vscode-languageclient sends vscode.env.appName).
CLIENT_NAMES = {"visual-studio-code": "Visual Studio Code", "neovim": "Neovim"}
TIMEOUT = 60.0  # generous: a 2-core CI machine also runs a worker warm-up per server


def time_limit(seconds: float) -> float:
    """A wall-clock limit that a `timing` test asserts (those tests are left out of a plain `pytest`),
    times FUSELENS_TIMING_SCALE (default 1): a slow or busy machine loosens them all at once."""
    return seconds * float(os.environ.get("FUSELENS_TIMING_SCALE", "1"))


# What the server says about examples/example_net.py (1-based lines).
CLUSTERS = [
    {
        "lines": (18, 20),
        "chain": "mul → relu → add",
        "bytes": "384 MB → 128 MB",
        "saved": "256 MB",
        "kind": "elementwise",
        "ops": [18, 19, 20],
        "regime": "dram-bound",
    },
    {
        "lines": (22, 25),
        "chain": "linear → gelu → sigmoid → mul",
        "bytes": "290 MB → 98.0 MB",
        "saved": "192 MB",
        "kind": "gemm-epilogue",
        "ops": [22, 23, 24, 25],
        "regime": "compute-bound",  # proj1's multiply-adds take longer than the cluster's traffic
    },
    {
        "lines": (28, 30),
        "chain": "tanh → mul → softmax",
        "bytes": "192 MB → 64 MB",
        "saved": "128 MB",
        "kind": "reduction",
        "ops": [28, 29, 30],
        "regime": "dram-bound",
    },
]
MODEL_LINE = 11  # `class ExampleNet(nn.Module):`
INTERPRET = "Check numerics in the Triton interpreter"


def example_text(name: str = "example_net.py") -> str:
    with open(os.path.join(EXAMPLES, name), encoding="utf-8") as fh:
        return fh.read()


def replace_line(text: str, line: int, new: str) -> str:
    """`text` with its 1-based `line` replaced by `new` (which may hold several lines)."""
    lines = text.split("\n")
    lines[line - 1] = new
    return "\n".join(lines)


def uri_of(path: str) -> str:
    """A file URI, percent-encoded as editors send them."""
    return "file://" + quote(os.path.abspath(path))


def path_of(uri: str) -> str:
    assert uri.startswith("file://"), uri
    return unquote(uri[len("file://") :])


def make_workspace(folder: str) -> str:
    """A fresh copy of the examples (their .py files and pyproject.toml) in `folder`."""
    os.makedirs(folder, exist_ok=True)
    for path in [*glob.glob(os.path.join(EXAMPLES, "*.py")), os.path.join(EXAMPLES, "pyproject.toml")]:
        shutil.copy(path, folder)
    return os.path.realpath(folder)


# ---- text edits ---------------------------------------------------------------------------------


def _offset(text: str, position: lsp.Position) -> int:
    """The string index of an LSP position (0-based line, UTF-16 column) in `text`."""
    lines = text.split("\n")
    assert position.line <= len(lines), (position, len(lines))
    if position.line == len(lines):
        return len(text)
    start = sum(len(line) + 1 for line in lines[: position.line])
    line, units, index = lines[position.line], 0, 0
    while index < len(line) and units < position.character:
        units += 2 if ord(line[index]) > 0xFFFF else 1
        index += 1
    return start + index


def apply_text_edits(text: str, edits: list[lsp.TextEdit]) -> str:
    """Apply edits that all refer to the original text (as LSP requires), last first."""
    spans = sorted(
        ((_offset(text, e.range.start), _offset(text, e.range.end), e.new_text) for e in edits),
        key=lambda s: (s[0], s[1]),
        reverse=True,
    )
    for start, end, new in spans:
        text = text[:start] + new + text[end:]
    return text


def end_position(text: str) -> lsp.Position:
    lines = text.split("\n")
    return lsp.Position(len(lines) - 1, len(lines[-1].encode("utf-16-le")) // 2)


# ---- the client ---------------------------------------------------------------------------------

_together_ids = itertools.count(1)


def _framed(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class Client(LanguageClient):
    """A test client that records the server's notifications and requests and can wait for them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.root = ""
        self.init_result: lsp.InitializeResult | None = None
        self.profile = ""
        self.published: list[lsp.PublishDiagnosticsParams] = []
        self.message_requests: list[lsp.ShowMessageRequestParams] = []
        self.answer: Callable[[lsp.ShowMessageRequestParams], str | None] = lambda params: None
        self.registrations: list[lsp.Registration] = []
        self.refreshes: Counter[str] = Counter()
        self.configuration_requests = 0
        self.texts: dict[str, str] = {}
        self.versions: dict[str, int] = {}
        self.unsaved: dict[str, str] = {}  # path -> the text of a file an edit changed in a buffer, not on disk
        self._arrived = asyncio.Event()
        self._writes: set[asyncio.Future] = set()

    # -- waiting -------------------------------------------------------------------------------
    def arrived(self) -> None:
        self._arrived.set()

    async def wait_until(
        self, predicate: Callable[[], Any], what: str, timeout: float = TIMEOUT, poll: float | None = None
    ) -> Any:
        """Wait until predicate() is truthy: checked whenever the server sends something, and every
        `poll` seconds if given (for state outside the conversation, such as processes)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            result = predicate()
            if result:
                return result
            self._arrived.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), min(remaining, poll or remaining))

    def published_for(self, uri: str) -> list[lsp.PublishDiagnosticsParams]:
        return [p for p in self.published if p.uri == uri]

    async def diagnostics_of(
        self, uri: str, version: int | None = None, timeout: float = TIMEOUT, after: int = 0
    ) -> list[lsp.Diagnostic]:
        """The diagnostics the server publishes for `uri` at `version` (default: the current one)."""
        version = self.versions[uri] if version is None else version

        def found():
            hits = [p for p in self.published[after:] if p.uri == uri and p.version == version]
            return hits[-1] if hits else None

        params = await self.wait_until(found, f"diagnostics of {os.path.basename(uri)} v{version}", timeout)
        return list(params.diagnostics)

    def latest(self, uri: str, after: int = 0) -> list[lsp.Diagnostic] | None:
        """The diagnostics of the last publication for `uri` (after the first `after` of all), if any."""
        hits = [p for p in self.published[after:] if p.uri == uri]
        return list(hits[-1].diagnostics) if hits else None

    async def diagnostics_until(
        self,
        uri: str,
        check: Callable[[list[lsp.Diagnostic]], bool],
        what: str,
        after: int = 0,
        timeout: float = TIMEOUT,
    ) -> list[lsp.Diagnostic]:
        """Wait until the latest publication for `uri` passes `check` (earlier ones may be transient)."""

        def found():
            diags = self.latest(uri, after)
            return diags if diags is not None and check(diags) else None

        await self.wait_until(found, what, timeout)
        return self.latest(uri, after)

    async def roundtrip(self) -> None:
        """A request the server answers only after handling everything sent before it."""
        await self.text_document_hover_async(
            lsp.HoverParams(
                lsp.TextDocumentIdentifier(uri_of(os.path.join(self.root, "never-opened.py"))), lsp.Position(0, 0)
            )
        )

    def messages_matching(self, needle: str) -> list[lsp.ShowMessageParams]:
        return [m for m in self.messages if needle in m.message]

    # -- documents -----------------------------------------------------------------------------
    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def write(self, name: str, text: str) -> str:
        with open(self.path(name), "w", encoding="utf-8") as fh:
            fh.write(text)
        return uri_of(self.path(name))

    def open(self, name: str, text: str | None = None) -> str:
        """Open `name` in the workspace (writing `text` to disk first, if given); returns its URI."""
        if text is not None:
            self.write(name, text)
        with open(self.path(name), encoding="utf-8") as fh:
            text = fh.read()
        uri = uri_of(self.path(name))
        self.texts[uri], self.versions[uri] = text, 1
        self.text_document_did_open(
            lsp.DidOpenTextDocumentParams(lsp.TextDocumentItem(uri=uri, language_id="python", version=1, text=text))
        )
        return uri

    def change(self, uri: str, text: str) -> int:
        """Replace the buffer's text (an incremental change spanning the document); returns the new version."""
        self.text_document_did_change(self.changed(uri, text))
        return self.versions[uri]

    def changed(self, uri: str, text: str) -> lsp.DidChangeTextDocumentParams:
        """The buffer's text replaced by `text`: the change to send (an incremental one spanning the document)."""
        old = self.texts[uri]
        self.versions[uri] += 1
        self.texts[uri] = text
        return lsp.DidChangeTextDocumentParams(
            lsp.VersionedTextDocumentIdentifier(uri=uri, version=self.versions[uri]),
            [lsp.TextDocumentContentChangePartial(range=lsp.Range(lsp.Position(0, 0), end_position(old)), text=text)],
        )

    def edit(self, uri: str, edits: list[lsp.TextEdit]) -> int:
        """Apply text edits to the buffer; the server hears of it as one change."""
        return self.change(uri, apply_text_edits(self.texts[uri], edits))

    def save(self, uri: str) -> None:
        """Write the buffer to disk and tell the server (didSave carries no text: includeText is false)."""
        with open(path_of(uri), "w", encoding="utf-8") as fh:
            fh.write(self.texts[uri])
        self.text_document_did_save(lsp.DidSaveTextDocumentParams(lsp.TextDocumentIdentifier(uri)))

    def save_text(self, uri: str, text: str) -> int:
        version = self.change(uri, text)
        self.save(uri)
        return version

    def close(self, uri: str) -> None:
        self.text_document_did_close(lsp.DidCloseTextDocumentParams(lsp.TextDocumentIdentifier(uri)))
        self.texts.pop(uri, None)
        self.versions.pop(uri, None)

    # -- messages read together -------------------------------------------------------------------
    def request(self, method: str, params: Any) -> dict[str, Any]:
        """A request as JSON (`params` an lsprotocol object or plain JSON), for `send_together`."""
        return {
            "jsonrpc": "2.0",
            "id": f"together-{next(_together_ids)}",
            "method": method,
            "params": self._json(params),
        }

    def notification(self, method: str, params: Any) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "method": method, "params": self._json(params)}

    def _json(self, params: Any) -> Any:
        return self.protocol._converter.unstructure(params)

    def send_together(self, *messages: dict[str, Any]) -> list[asyncio.Future]:
        """Send `messages` in one write, so that the server reads them in one chunk and handles each
        before it answers any, as it handles the messages that piled up while it was busy; the future
        of each request's answer, in order."""
        answers = []
        for message in messages:
            if "id" in message:
                future: concurrent.futures.Future = concurrent.futures.Future()
                self.protocol._request_futures[message["id"]] = future
                self.protocol._result_types[message["id"]] = self.protocol.get_result_type(message["method"])
                answers.append(asyncio.wrap_future(future))
        frames = b"".join(_framed(json.dumps(m).encode()) for m in messages)
        written = self.protocol.writer.write(frames)
        if inspect.isawaitable(written):
            task = asyncio.ensure_future(written)
            self._writes.add(task)  # held until done: the loop holds tasks weakly
            task.add_done_callback(self._writes.discard)
        return answers

    # -- requests ------------------------------------------------------------------------------
    async def command(self, name: str, *arguments: Any) -> Any:
        return await self.workspace_execute_command_async(lsp.ExecuteCommandParams(name, list(arguments)))

    async def hover(self, uri: str, line: int, character: int = 8) -> lsp.Hover | None:
        """Hover at a 1-based line."""
        return await self.text_document_hover_async(
            lsp.HoverParams(lsp.TextDocumentIdentifier(uri), lsp.Position(line - 1, character))
        )

    async def inlay_hints(self, uri: str) -> list[lsp.InlayHint]:
        end = end_position(self.texts[uri])
        return (
            await self.text_document_inlay_hint_async(
                lsp.InlayHintParams(lsp.TextDocumentIdentifier(uri), lsp.Range(lsp.Position(0, 0), end))
            )
            or []
        )

    async def code_lenses(self, uri: str) -> list[lsp.CodeLens]:
        return await self.text_document_code_lens_async(lsp.CodeLensParams(lsp.TextDocumentIdentifier(uri))) or []

    async def code_actions(
        self, uri: str, line: int, diagnostics: list[lsp.Diagnostic] | None = None, resolve: bool = True
    ) -> list:
        """Code actions for a cursor on a 1-based line; each one offered without its edit resolved, as an
        editor resolves the one the user picks (`resolve=False`: as offered)."""
        here = lsp.Range(lsp.Position(line - 1, 0), lsp.Position(line - 1, 0))
        actions = (
            await self.text_document_code_action_async(
                lsp.CodeActionParams(
                    lsp.TextDocumentIdentifier(uri), here, lsp.CodeActionContext(diagnostics=diagnostics or [])
                )
            )
            or []
        )
        return [await self.resolved(a) for a in actions] if resolve else actions

    async def resolved(self, action: lsp.CodeAction) -> lsp.CodeAction:
        """The action with its edit, as the server resolves it (`codeAction/resolve`) when it was offered
        without one."""
        if not isinstance(action, lsp.CodeAction) or action.edit is not None or action.data is None:
            return action
        return await self.code_action_resolve_async(action)

    def supports_document_changes(self) -> bool:
        edit = self.capabilities.workspace.workspace_edit if self.capabilities and self.capabilities.workspace else None
        return bool(edit and edit.document_changes)

    def apply_workspace_edit(self, edit: lsp.WorkspaceEdit) -> None:
        """Apply an edit as the client would: open documents change in the buffer; another file
        changes on disk in VS Code (which saves a file a refactoring changed), and in a buffer of its
        own, left unsaved, in Neovim (as Emacs does too): see `unsaved`.  Uses `documentChanges` only
        if the profile claims them."""
        if self.supports_document_changes():
            assert edit.document_changes, edit
            steps = edit.document_changes
        else:
            assert edit.changes, "a client without documentChanges support needs `changes`"
            steps = [
                lsp.TextDocumentEdit(lsp.OptionalVersionedTextDocumentIdentifier(uri=uri, version=None), edits)
                for uri, edits in edit.changes.items()
            ]
        for step in steps:
            if isinstance(step, lsp.CreateFile):
                path = path_of(step.uri)
                exists = os.path.exists(path)
                assert not (
                    exists and step.options and not step.options.overwrite and not step.options.ignore_if_exists
                ), f"{path} exists"
                if not exists:
                    open(path, "w").close()
                continue
            assert isinstance(step, lsp.TextDocumentEdit), f"unexpected {type(step).__name__}"
            uri = step.text_document.uri
            edits = [e for e in step.edits if isinstance(e, lsp.TextEdit)]
            if uri in self.texts:  # an open buffer: the version must match, as an editor requires
                if step.text_document.version is not None:
                    assert step.text_document.version == self.versions[uri], (
                        f"edit for v{step.text_document.version}, buffer at v{self.versions[uri]}"
                    )
                self.edit(uri, edits)  # (not saved: the user saves when they like)
            else:
                path = path_of(uri)
                assert os.path.exists(path), f"edit to a file that does not exist: {path}"
                text = self.unsaved.get(path)
                if text is None:
                    with open(path, encoding="utf-8") as fh:
                        text = fh.read()
                if self.profile == "visual-studio-code":
                    with open(path, "w", encoding="utf-8") as fh:
                        fh.write(apply_text_edits(text, edits))
                else:
                    self.unsaved[path] = apply_text_edits(text, edits)


# ---- what the client answers --------------------------------------------------------------------


def _on_publish(ls: Client, params: lsp.PublishDiagnosticsParams):
    ls.diagnostics[params.uri] = params.diagnostics
    ls.published.append(params)
    ls.arrived()


def _on_show_message(ls: Client, params: lsp.ShowMessageParams):
    ls.messages.append(params)
    ls.arrived()


def _on_log_message(ls: Client, params: lsp.LogMessageParams):
    ls.log_messages.append(params)
    ls.arrived()


def _on_show_message_request(ls: Client, params: lsp.ShowMessageRequestParams):
    ls.message_requests.append(params)
    ls.arrived()
    title = ls.answer(params)
    return lsp.MessageActionItem(title) if title else None


def _on_register(ls: Client, params: lsp.RegistrationParams):
    ls.registrations += params.registrations
    ls.arrived()


def _on_configuration(ls: Client, params: lsp.ConfigurationParams):
    ls.configuration_requests += 1
    ls.arrived()
    return [ls.get_configuration(section=item.section, scope_uri=item.scope_uri) for item in params.items]


def _refresh(method: str):
    def handler(ls: Client, params: None):
        ls.refreshes[method] += 1
        ls.arrived()

    return handler


def _progress(ls: Client, params: lsp.ProgressParams):
    DEFAULT_CLIENT_FEATURES[lsp.PROGRESS](ls, params)
    ls.arrived()


FEATURES = {
    **DEFAULT_CLIENT_FEATURES,
    lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS: _on_publish,
    lsp.WINDOW_SHOW_MESSAGE: _on_show_message,
    lsp.WINDOW_LOG_MESSAGE: _on_log_message,
    lsp.WINDOW_SHOW_MESSAGE_REQUEST: _on_show_message_request,
    lsp.CLIENT_REGISTER_CAPABILITY: _on_register,
    lsp.WORKSPACE_CONFIGURATION: _on_configuration,
    lsp.WORKSPACE_CODE_LENS_REFRESH: _refresh(lsp.WORKSPACE_CODE_LENS_REFRESH),
    lsp.WORKSPACE_INLAY_HINT_REFRESH: _refresh(lsp.WORKSPACE_INLAY_HINT_REFRESH),
    lsp.PROGRESS: _progress,
}


def _converter():
    """pygls' converter, except that a CodeAction carrying a command stays a CodeAction.

    (lsprotocol reads any object with a "command" key as a Command; a Command's command is
    a string, a CodeAction's is an object.)
    """
    converter = default_converter()

    def command_or_action(obj: Any, _: type) -> lsp.Command | lsp.CodeAction:
        if isinstance(obj.get("command"), str):
            return converter.structure(obj, lsp.Command)
        return converter.structure(obj, lsp.CodeAction)

    converter.register_structure_hook(lsp.Command | lsp.CodeAction, command_or_action)
    return converter


def make_client() -> Client:
    client = Client(converter_factory=_converter)
    register_lsp_features(client, FEATURES)
    return client


# ---- starting servers ---------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def running_server(
    profile: str,
    root: str,
    init_options: dict | None = None,
    configuration: dict | None = None,
    server_env: dict[str, str] | None = None,
    wait_ready: bool = True,
    capabilities: lsp.ClientCapabilities | None = None,
):
    """A server started on workspace `root` and initialised as `profile` (with `capabilities` in place of
    the profile's, if given); shut down on leaving."""
    config = ClientServerConfig(
        server_command=SERVER, client_factory=make_client, server_env={**os.environ, **(server_env or {})}
    )
    client = await config.start()
    client.root, client.profile = root, profile
    for section, value in (configuration or {}).items():
        client.set_configuration(value, section=section)
    options = {"workspaceTrusted": True} if init_options is None else dict(init_options)
    if isinstance(options.get("settings", {}), dict):
        # The background torch.compile comparison (seconds of CPU per file) only where a test asks for it.
        options["settings"] = {"compareInductor": False, **options.get("settings", {})}
    client.init_result = await client.initialize_session(
        lsp.InitializeParams(
            capabilities=capabilities or client_capabilities(profile),
            client_info=lsp.ClientInfo(name=CLIENT_NAMES[profile]),
            initialization_options=options,
            root_uri=uri_of(root),
            workspace_folders=[lsp.WorkspaceFolder(uri=uri_of(root), name="examples")],
        )
    )
    try:
        if wait_ready:
            await client.wait_until(
                lambda: any("worker ready" in m.message for m in client.log_messages),
                "the worker to warm up",
                timeout=180,
            )
        yield client
    finally:
        if client._server is not None and client._server.returncode is None:
            await client.shutdown_session()
        await client.stop()


def server_fixture(
    init_options: dict | None = None,
    configuration: dict | None = None,
    server_env: Callable[[str], dict[str, str]] | None = None,
    prepare: Callable[[str], None] | None = None,
    wait_ready: bool = True,
    scope: str = "module",
):
    """A fixture: a server per client profile, initialised on a fresh copy of the examples.

    init_options: initializationOptions (default: a trusted workspace).
    configuration: what the client answers to workspace/configuration (e.g. {"fuselens": {...}}).
    server_env: workspace folder -> extra environment variables for the server process.
    prepare: called with the workspace folder before the server starts.
    wait_ready: wait until the server says its worker is warm.
    """

    @pytest_asyncio.fixture(scope=scope, loop_scope=scope, params=PROFILES, ids=PROFILES)
    async def client(request, tmp_path_factory):
        root = make_workspace(str(tmp_path_factory.mktemp("ws") / "my models ü"))  # URIs need encoding
        if prepare:
            prepare(root)
        async with running_server(
            request.param, root, init_options, configuration, server_env(root) if server_env else None, wait_ready
        ) as client:
            yield client

    return client


def analyzed_fixture(name: str = "example_net.py"):
    """A fixture: the example `name` opened in the module's `client`, once its first diagnostics are in."""

    @pytest_asyncio.fixture(scope="module", loop_scope="module")
    async def analyzed(client: Client) -> str:
        uri = client.open(name)
        await client.diagnostics_of(uri, 1)
        return uri

    return analyzed


def server_pid(client: Client) -> int:
    """The pid of the server process pytest-lsp started."""
    return client._server.pid


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except OSError:
        return []


def running(pid: int) -> bool:
    """Is process `pid` alive (a zombie is not)?"""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
