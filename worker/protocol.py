"""The pipe protocol between the language server and its worker host.

Newline-delimited JSON, one object per line, in both directions.  No torch here: the
server imports this module.

server -> host
    {"op": "run", "id": 7, "job": {...}, "limits": {"seconds": 60, "memory_mb": 8192}}
    {"op": "cancel", "id": 7}
    {"op": "shutdown"}

host -> server
    {"event": "ready", "pid": 123, "python": "3.11.7", "torch": "2.13.0", "warmup_ms": 900}
    {"event": "progress", "id": 7, "message": "...", "fraction": 0.5}
    {"event": "done", "id": 7, "result": {...}}
    {"event": "failed", "id": 7, "error": {"kind": "...", "message": "...", "file": ..., "line": ...}}

Jobs are {"kind": "analyze", "path", "text", "options"} or {"kind": "validate", "path",
"options", "validate"}.  Failure kinds: "timeout", "memory", "crash", "cancelled",
"internal" (a fuselens bug), "unavailable" (the worker could not start).
"""

from __future__ import annotations

import json
from typing import Any

FAILURES = ("timeout", "memory", "crash", "cancelled", "internal", "unavailable")


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def decode(line: bytes | str) -> dict[str, Any]:
    return json.loads(line)
