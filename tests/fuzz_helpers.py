"""A seeded protocol fuzzer and the real server on its stdio, byte for byte: what
tests/test_protocol_fuzz.py runs a few thousand messages of, and benchmarks/fuzz_memory.py 100,000.

The fuzzer sends requests for every method the server supports (and some it does not) with random
params, notifications, stray responses, JSON that is not JSON-RPC, bodies that are not JSON, and
broken framing (huge, negative and non-numeric lengths, a missing length, headers that never end,
bodies cut short).  The same seed sends the same bytes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import os
import random
from typing import Any

from pygls.protocol import default_converter
from pytest_lsp import client_capabilities

from fuselens.server import framing

from lsp_helpers import SERVER, example_text, uri_of

ANSWER_DEADLINE = 60.0

COMMANDS = [
    "fuselens.analyze",
    "fuselens.validateKernel",
    "fuselens.validateAll",
    "fuselens.showKernel",
    "fuselens.showInductorKernel",
    "fuselens.writeKernelModule",
]
NOTIFICATIONS = [
    "textDocument/didOpen",
    "textDocument/didChange",
    "textDocument/didSave",
    "textDocument/didClose",
    "workspace/didChangeWatchedFiles",
    "workspace/didChangeConfiguration",
    "$/cancelRequest",
    "$/setTrace",
    "initialized",
    "fuselens/noSuchNotification",
]
OTHER_REQUESTS = ["textDocument/definition", "textDocument/completion", "workspace/symbol", "fuselens/bogus", ""]


# ---- the server, over its stdio ------------------------------------------------------------------


class RawServer:
    """`fuselens serve` with the fuzzer on its stdin: what is sent is exactly the bytes given.  It
    answers the server's own requests at once (null, or nulls for workspace/configuration) unless
    `answering` is off, and records every answer by id and every notification by method."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.answering = True
        self.answers: dict[Any, list[dict]] = collections.defaultdict(list)
        self.notifications: collections.Counter[str] = collections.Counter()
        self.published: list[dict] = []
        self.logged: list[str] = []  # window/logMessage texts
        self.shown: list[str] = []  # window/showMessage texts
        self.server_requests: collections.Counter[str] = collections.Counter()
        self.arrived = asyncio.Event()
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, log_path: str) -> RawServer:
        with open(log_path, "wb") as log:
            proc = await asyncio.create_subprocess_exec(
                *SERVER, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log, limit=1 << 24
            )
        return cls(proc)

    async def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def message(self, message: dict) -> None:
        await self.send(frame(json.dumps(message).encode()))

    async def request(self, msg_id: Any, method: str, params: Any = None, timeout: float = ANSWER_DEADLINE) -> dict:
        await self.message({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        return (await self.wait_until(lambda: self.answers.get(msg_id), f"the answer to {method}", timeout))[0]

    async def wait_until(self, predicate, what: str, timeout: float = ANSWER_DEADLINE):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not (result := predicate()):
            remaining = deadline - loop.time()
            if remaining <= 0 or self.proc.returncode is not None:
                raise AssertionError(f"gave up waiting for {what} (server exit status {self.proc.returncode})")
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), min(remaining, 1.0))
        return result

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        stdout = self.proc.stdout
        while True:
            length = None
            while (line := await stdout.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if not line or length is None:
                return
            self._dispatch(json.loads(await stdout.readexactly(length)))
            self.arrived.set()

    def _dispatch(self, message: dict) -> None:
        if "method" not in message:
            self.answers[message.get("id")].append(message)
        elif "id" in message:  # the server asks: answer as a client that has nothing to say would
            self.server_requests[message["method"]] += 1
            if not self.answering:
                return
            items = (message.get("params") or {}).get("items", [])
            result = [None] * len(items) if message["method"] == "workspace/configuration" else None
            self.proc.stdin.write(frame(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode()))
        else:
            self.notifications[message["method"]] += 1
            if message["method"] == "textDocument/publishDiagnostics":
                self.published.append(message["params"])
            elif message["method"] == "window/logMessage":
                self.logged.append(message["params"]["message"])
            elif message["method"] == "window/showMessage":
                self.shown.append(message["params"]["message"])


def frame(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


# ---- what the fuzzer sends -----------------------------------------------------------------------


class Sent:
    """One unit on the wire: its bytes, its kind, and the id that must be answered (if any)."""

    def __init__(self, data: bytes, kind: str, expects: Any = None):
        self.data, self.kind, self.expects = data, kind, expects


class Fuzzer(random.Random):
    """Seeded: the same seed sends the same bytes."""

    def __init__(self, seed: int, good: str, root: str):
        super().__init__(seed)
        self.good, self.root = good, root
        self.docs = [uri_of(os.path.join(root, f"fuzz_{i}.py")) for i in range(8)]
        self.ids = itertools.count(1000)
        self.in_flight: list[Any] = []  # ids sent, to cancel some of

    def next(self) -> Sent:
        roll = self.random()
        if roll < 0.45:
            return self.request()
        if roll < 0.52:
            return self.bad_request()
        if roll < 0.77:
            return self.notification()
        if roll < 0.81:
            return self.stray_response()
        if roll < 0.85:
            return Sent(frame(json.dumps(self.value(3)).encode()), "not JSON-RPC")
        if roll < 0.90:
            return Sent(frame(self.not_json()), "not JSON")
        return self.broken_frame()

    # -- requests ----------------------------------------------------------------------------------
    def request(self) -> Sent:
        method = self.choice(
            ["textDocument/hover", "textDocument/inlayHint", "textDocument/codeLens", "textDocument/codeAction"] * 3
            + ["workspace/executeCommand"] * 6
            + ["initialize", *OTHER_REQUESTS]
        )
        params = self.value(3) if self.random() < 0.15 else self.params_for(method)
        msg_id = self.new_id()
        self.in_flight = [*self.in_flight[-20:], msg_id]
        body = {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}
        if self.random() < 0.05:
            del body["params"]
        return Sent(frame(json.dumps(body).encode()), "request", msg_id)

    def bad_request(self) -> Sent:
        """Requests that are not valid JSON-RPC, but whose id can be read: each is answered."""
        msg_id = self.new_id()
        method = self.choice(["textDocument/hover", "fuselens/bogus", "shutdown", "exit"])
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": None}
        how = self.choice(["no jsonrpc", "jsonrpc 1.0", "method not a string", "a notification's method"])
        if how == "no jsonrpc":
            del body["jsonrpc"]
        elif how == "jsonrpc 1.0":
            body["jsonrpc"] = "1.0"
        elif how == "method not a string":
            body["method"] = self.choice([7, None, ["hover"], {"m": 1}])
        else:
            body["method"] = self.choice([m for m in NOTIFICATIONS if not m.startswith("fuselens/")] + ["exit"])
        return Sent(frame(json.dumps(body).encode()), "invalid request", msg_id)

    def new_id(self) -> Any:
        n = next(self.ids)
        return n if self.random() < 0.6 else f"fuzz-{n}-{self.choice(['a', 'ü', '∞', ' '])}"

    def params_for(self, method: str) -> Any:
        doc = {"uri": self.uri()}
        if method == "textDocument/hover":
            return {"textDocument": doc, "position": self.position()}
        if method == "textDocument/inlayHint":
            return {"textDocument": doc, "range": self.range()}
        if method == "textDocument/codeLens":
            return {"textDocument": doc}
        if method == "textDocument/codeAction":
            return {"textDocument": doc, "range": self.range(), "context": {"diagnostics": self.maybe([], [{}])}}
        if method == "workspace/executeCommand":
            return {"command": self.choice([*COMMANDS, "fuselens.nope", ""]), "arguments": self.arguments()}
        if method == "initialize":
            return {"processId": None, "rootUri": None, "capabilities": {}}
        return self.value(2)

    def arguments(self) -> Any:
        if self.random() < 0.1:
            return self.value(2)
        arguments = [self.uri()]
        for _ in range(self.randrange(4)):
            arguments.append(
                self.choice(
                    [
                        self.choice(["c0", "c1", "c2", "c9", "ExampleNet", "", None]),
                        self.maybe(1, 2, -1, 2**40, True, 1.0),
                        self.maybe(["c0"], [], [0, None], "c0"),
                        {self.choice(["clusters", "x", "ü"]): self.value(1)},  # (never "interpret": seconds of CPU)
                    ]
                )
            )
        return arguments

    def uri(self, good: bool = True) -> Any:
        """A document URI, or something in its place; `good`: the analyzed example among them."""
        return self.choice(
            [self.good] * (4 if good else 0)
            + self.docs
            + [
                uri_of(os.path.join(self.root, "never_opened.py")),
                uri_of(self.root),
                "file:///nonexistent/model.py",
                "untitled:Untitled-1",
                "file:///tmp/a%00b.py",
                "file://",
                "",
                "garbage",
                "file:///" + "x" * self.randrange(1, 3000) + ".py",
                7,
                None,
            ]
        )

    def position(self) -> Any:
        if self.random() < 0.1:
            return self.value(1)
        return {"line": self.number(), "character": self.number()}

    def range(self) -> Any:
        if self.random() < 0.1:
            return self.value(1)
        return {"start": self.position(), "end": self.position()}

    def number(self) -> Any:
        return self.choice(
            [0, 1, 18, 19, 23, 28, 40, self.randrange(100), -1, 2**31 - 1, 2**31, 2**53, "18", None, 1.5]
        )

    # -- notifications -----------------------------------------------------------------------------
    def notification(self) -> Sent:
        method = self.choice(NOTIFICATIONS[:4] * 4 + NOTIFICATIONS[4:])
        params = self.value(2) if self.random() < 0.15 else self.notification_params(method)
        body = {"jsonrpc": "2.0", "method": method, "params": params}
        return Sent(frame(json.dumps(body).encode()), "notification")

    def notification_params(self, method: str) -> Any:
        doc = self.choice(self.docs) if self.random() < 0.9 else self.uri(good=False)  # (the example stays as it is)
        if method == "textDocument/didOpen":
            item = {"uri": doc, "languageId": "python", "version": self.randrange(1, 50), "text": self.source()}
            return {"textDocument": item}
        if method == "textDocument/didChange":
            change = {"text": self.source()} if self.random() < 0.5 else {"range": self.range(), "text": self.words()}
            return {"textDocument": {"uri": doc, "version": self.randrange(1, 100)}, "contentChanges": [change]}
        if method in ("textDocument/didSave", "textDocument/didClose"):
            return {"textDocument": {"uri": doc}}
        if method == "workspace/didChangeWatchedFiles":
            return {"changes": [{"uri": self.uri(good=False), "type": self.choice([1, 2, 3, 9, "x"])}]}
        if method == "workspace/didChangeConfiguration":
            if self.random() < 0.8:  # (each one re-analyzes every open document)
                return {"settings": self.value(1)}
            settings = {
                self.choice(["severity", "show", "inlayHints", "codeLens", "device", "peakGbps", "nope"]): self.value(1)
            }
            return {"settings": {"fuselens": {"compareInductor": False, **settings}}}
        if method == "$/cancelRequest":
            return {"id": self.choice(self.in_flight) if self.in_flight and self.random() < 0.7 else self.value(0)}
        if method == "$/setTrace":
            return {"value": self.choice(["off", "messages", "verbose", "loud", 3])}
        return self.value(2)

    def source(self) -> str:
        """Text of a model file: the example with some lines broken (nothing that would do harm)."""
        lines = example_text().split("\n")
        for _ in range(self.randrange(4)):
            lines[self.randrange(len(lines))] = self.words()
        return "\n".join(lines)

    def words(self) -> str:
        vocabulary = ["x", "=", "(", ")", "torch.relu(x)", "def", ":", "\t", "é", "∑", "\x00", "\udc80", "#", "'''"]
        return " ".join(self.choice(vocabulary) for _ in range(self.randrange(8)))

    # -- the rest ----------------------------------------------------------------------------------
    def stray_response(self) -> Sent:
        body = {"jsonrpc": "2.0", "id": self.choice([10**9 + self.randrange(100), "nobody-asked", None])}
        body.update(self.choice([{"result": self.value(1)}, {"error": {"code": -1, "message": "no"}}, {}]))
        return Sent(frame(json.dumps(body).encode()), "stray response")

    def not_json(self) -> bytes:
        return self.choice(
            [
                b"{not json",
                b'{"jsonrpc": "2.0", "id": 1, "method": ',
                b"\xff\xfe\x00garbage",
                b"[" * self.randrange(1, 5000),
                b"",
                b"1" * 5000,  # (an integer past Python's digit limit: not a value it will read)
                bytes(self.randrange(32, 127) for _ in range(self.randrange(1, 200))).replace(b"C", b"c"),
            ]
        )

    def broken_frame(self) -> Sent:
        """Framing errors; nothing in them is answered.  (A body cut short claims at most 14 bytes more
        than it has: the next unit is longer, so the server never waits for bytes that never come.)"""
        body = json.dumps({"jsonrpc": "2.0", "id": "inside-a-broken-frame", "method": "shutdown"}).encode()
        how = self.choice(["huge", "negative", "not a number", "no length", "no colon", "no header", "cut short"])
        data = {
            "huge": b"Content-Length: %d\r\n\r\n" % self.choice([99999999999, framing.MAX_BODY_BYTES + 1, 10**30]),
            "negative": b"Content-Length: -%d\r\n\r\n" % len(body),
            "not a number": b"Content-Length: %s\r\n\r\n" % self.choice([b"x", b"1e3", b"0x10", b"", b"+5", b"\xff"]),
            "no length": b"Content-Type: application/vscode-jsonrpc\r\n\r\n",
            "no colon": b"Content-Length %d\r\n\r\n" % len(body),
            "no header": b"",
            "cut short": b"Content-Length: %d\r\n\r\n" % (len(body) + self.randrange(1, 15)),
        }[how] + body
        return Sent(data, "broken frame")

    def value(self, depth: int) -> Any:
        """Any JSON value."""
        kind = self.randrange(9 if depth > 0 else 6)
        if kind == 0:
            return None
        if kind == 1:
            return self.random() < 0.5
        if kind == 2:
            return self.choice([0, -1, 7, 2**31, -(2**63), 2**64, self.randrange(-1000, 1000)])
        if kind == 3:
            return self.choice([0.5, -1e308, 1e-300, 3.0])
        if kind in (4, 5):
            return self.choice(["", "x", "ü∞", "\x00", "\udc80", "file:///a.py", "a" * self.randrange(500)])
        if kind in (6, 7):
            return {self.choice(["uri", "textDocument", "position", "x", ""]): self.value(depth - 1) for _ in range(3)}
        return [self.value(depth - 1) for _ in range(self.randrange(4))]

    def maybe(self, *options: Any) -> Any:
        return self.choice(options)


# ---- a session -----------------------------------------------------------------------------------


async def initialize(server: RawServer, root: str, trusted: bool = True) -> None:
    capabilities = default_converter().unstructure(client_capabilities("visual-studio-code"))
    answer = await server.request(
        0,
        "initialize",
        {
            "processId": os.getpid(),
            "rootUri": uri_of(root),
            "workspaceFolders": [{"uri": uri_of(root), "name": "fuzz"}],
            "capabilities": capabilities,
            "initializationOptions": {"workspaceTrusted": trusted, "settings": {"compareInductor": False}},
        },
        timeout=60,
    )
    assert "result" in answer, answer
    await server.message({"jsonrpc": "2.0", "method": "initialized", "params": {}})


async def open_good(server: RawServer, root: str) -> str:
    """The example, opened and analyzed: requests about it have something to answer."""
    uri = uri_of(os.path.join(root, "good.py"))
    with open(os.path.join(root, "good.py"), "w", encoding="utf-8") as fh:
        fh.write(example_text())
    item = {"uri": uri, "languageId": "python", "version": 1, "text": example_text()}
    await server.message({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": item}})
    await server.wait_until(
        lambda: any(p["uri"] == uri and p["diagnostics"] for p in server.published), "the example's diagnostics", 180
    )
    return uri


async def deliver(server: RawServer, units: list[Sent], good: str, sentinel: str) -> list[Any]:
    """Send `units`, then a hover on the example `good` (its answer says that the stream is in step and
    that the server still analyzes), and wait until every request among them is answered; the ids of
    those left unanswered."""
    for unit in units:
        await server.send(unit.data)
    hover = {"textDocument": {"uri": good}, "position": {"line": 18, "character": 8}}
    last = await server.request(sentinel, "textDocument/hover", hover)
    assert "c0" in json.dumps(last.get("result")), last
    expected = [s.expects for s in units if s.expects is not None]

    def unanswered() -> list[Any]:
        return [i for i in expected if not server.answers.get(i)]

    with contextlib.suppress(AssertionError):
        await server.wait_until(lambda: not unanswered(), "every request's answer")
    return unanswered()


def summary(sent: list[Sent], server: RawServer, seed: int) -> dict[str, Any]:
    kinds = collections.Counter(s.kind for s in sent)
    expected = [s.expects for s in sent if s.expects is not None]
    answers = [a for msg_id in expected for a in server.answers.get(msg_id, [])]
    errors = collections.Counter(a["error"]["code"] for a in answers if "error" in a)
    return {
        "seed": seed,
        "sent": len(sent),
        "by_kind": dict(sorted(kinds.items())),
        "requests_to_answer": len(expected),
        "answered": len(answers),
        "results": sum("result" in a for a in answers),
        "errors_by_code": dict(sorted(errors.items())),
        "server_requests": sum(server.server_requests.values()),
        "notifications_received": sum(server.notifications.values()),
    }
