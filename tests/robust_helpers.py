"""Helpers for the robustness suite (tests/test_robust_*.py), on top of lsp_helpers.

- `single_server(...)`: like lsp_helpers.server_fixture, but for chosen client profiles only
  (hostile model code and load do not depend on what the editor supports).
- `raw_request` / `raw_notify` / `raw_bytes`: send JSON (or bytes) exactly as given, bypassing
  the client's typed serialisation, so a test can send what no well-behaved client would.
- process memory readers (/proc, Linux).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import itertools
import json
from typing import Any

import pytest_asyncio
from lsprotocol import types as lsp

from lsp_helpers import TIMEOUT, Client, children, make_workspace, running_server

_ids = itertools.count(1)


def single_server(
    profiles: tuple[str, ...] = ("visual-studio-code",),
    init_options: dict | None = None,
    configuration: dict | None = None,
    prepare=None,
    scope: str = "module",
):
    """A fixture: one server per profile in `profiles`, on a fresh copy of the examples."""

    @pytest_asyncio.fixture(scope=scope, loop_scope=scope, params=list(profiles), ids=list(profiles))
    async def client(request, tmp_path_factory):
        root = make_workspace(str(tmp_path_factory.mktemp("ws") / "robust ü"))
        if prepare:
            prepare(root)
        async with running_server(request.param, root, init_options, configuration) as client:
            yield client

    return client


# ---- raw JSON-RPC ---------------------------------------------------------------------------------


class Answer:
    """What the server answered to a raw request: a result, or a JSON-RPC error."""

    def __init__(self, result: Any = None, error: Exception | None = None):
        self.result, self.error = result, error

    @property
    def code(self) -> int | None:
        return getattr(self.error, "code", None) if self.error else None

    def __repr__(self) -> str:
        text = f"Answer(error={self.error!r})" if self.error else f"Answer(result={self.result!r})"
        return text if len(text) < 300 else text[:300] + "…"


async def raw_request(client: Client, method: str, params: Any, timeout: float = TIMEOUT) -> Answer:
    """Send a request with `params` as literal JSON; AssertionError if no answer comes in `timeout` s."""
    msg_id = f"raw-{next(_ids)}"
    future: concurrent.futures.Future = concurrent.futures.Future()
    client.protocol._request_futures[msg_id] = future
    client.protocol._send_data({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
    try:
        result = await asyncio.wait_for(asyncio.wrap_future(future), timeout)
    except TimeoutError:
        client.protocol._request_futures.pop(msg_id, None)
        raise AssertionError(f"no answer within {timeout:.0f}s to {method} {json.dumps(params)[:200]}") from None
    except Exception as exc:  # a JSON-RPC error response
        return Answer(error=exc)
    return Answer(result=result)


def raw_notify(client: Client, method: str, params: Any) -> None:
    client.protocol._send_data({"jsonrpc": "2.0", "method": method, "params": params})


_PENDING_WRITES: set[asyncio.Future] = set()


def _prune_writes() -> None:
    for task in [t for t in _PENDING_WRITES if t.done()]:
        _PENDING_WRITES.discard(task)


def raw_bytes(client: Client, body: bytes) -> None:
    """A framed message whose body is `body` exactly (which need not be JSON)."""
    written = client.protocol.writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    if inspect.isawaitable(written):
        _PENDING_WRITES.add(asyncio.ensure_future(written))  # held until done: the loop holds tasks weakly
        _prune_writes()


# ---- processes ------------------------------------------------------------------------------------


def status_kb(pid: int, key: str = "VmRSS") -> int:
    """A /proc/<pid>/status field in kB (0 if the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def pss_kb(pid: int) -> int:
    """Proportional set size: shared pages counted once across the processes that share them."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def worker_host(client: Client) -> int:
    from lsp_helpers import server_pid

    (host,) = children(server_pid(client))
    return host


def worker_starts(client: Client) -> int:
    return sum("worker ready" in m.message for m in client.log_messages)


def fusable(diags: list[lsp.Diagnostic]) -> list[tuple[int, int, str]]:
    """(first line, last line, op chain) of each cluster diagnostic, 1-based, sorted."""
    return sorted(
        (d.range.start.line + 1, d.range.end.line + 1, d.message.split(",")[0].removeprefix("fusable: "))
        for d in diags
        if d.message.startswith("fusable:")
    )


def errors(diags: list[lsp.Diagnostic]) -> list[lsp.Diagnostic]:
    return [d for d in diags if d.severity == lsp.DiagnosticSeverity.Error]
