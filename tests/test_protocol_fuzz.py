"""Robustness, a seeded protocol fuzzer: thousands of messages, valid and not, at the real server.

Over the server's own stdin, byte for byte (tests/fuzz_helpers.py): requests for every method it
supports (and some it does not) with random params, notifications, stray responses, JSON that is not
JSON-RPC, bodies that are not JSON, and broken framing (huge, negative and non-numeric lengths, a
missing length, headers that never end, bodies cut short).  Whatever comes, every request that arrived
in a readable frame gets exactly one answer, a result or an error; nothing else is answered; the
server stays up, logs each kind of malformed message once, still ends cleanly, and its memory after
the fuzz is within GROWTH_LIMIT_MB of what it was after the first fifth of it.

`FUSELENS_FUZZ_SEED` and `FUSELENS_FUZZ_MESSAGES` change the seed and the count; the summary
line (printed, and among the robustness figures) says what was sent and answered.
(benchmarks/fuzz_memory.py runs 100,000 messages, its memory read all along.)
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random

import pytest

from fuselens.server import framing

from fuzz_helpers import Fuzzer, RawServer, deliver, frame, initialize, open_good, summary
from lsp_helpers import make_workspace
from robust_helpers import status_kb

SEED = int(os.environ.get("FUSELENS_FUZZ_SEED", "20261201"))
MESSAGES = int(os.environ.get("FUSELENS_FUZZ_MESSAGES", "6000"))
GROWTH_LIMIT_MB = 20


@pytest.mark.asyncio
async def test_every_request_is_answered_once_whatever_else_comes(tmp_path, figures):
    root = make_workspace(str(tmp_path / "fuzz ü"))
    log_path = str(tmp_path / "server.log")
    server = await RawServer.start(log_path)
    try:
        await initialize(server, root)
        good = await open_good(server, root)
        fuzzer = Fuzzer(SEED, good, root)
        warm_up = [fuzzer.next() for _ in range(MESSAGES // 5)]
        assert not await deliver(server, warm_up, good, "after the warm-up")
        before = status_kb(server.proc.pid) / 1024
        rest = [fuzzer.next() for _ in range(MESSAGES - len(warm_up))]
        missing = await deliver(server, rest, good, "sentinel")
        after = status_kb(server.proc.pid) / 1024
        sent = warm_up + rest
        assert not missing, f"{len(missing)} requests never answered, e.g. " + "; ".join(
            next(s.data.decode(errors="replace")[:300] for s in sent if s.expects == i) for i in missing[:3]
        )
        twice = {i: len(a) for i, a in server.answers.items() if len(a) > 1}
        assert not twice, f"answered more than once: {twice}"
        expected = [s.expects for s in sent if s.expects is not None]
        strays = set(server.answers) - {*expected, 0, "after the warm-up", "sentinel"}
        assert not strays, f"answers to messages that were not requests: {sorted(map(str, strays))[:10]}"
        assert server.proc.returncode is None

        figures["fuzz"] = numbers = summary(sent, server, SEED)
        numbers["rss_mb"] = {"after_the_first_fifth": round(before, 1), "at_the_end": round(after, 1)}
        print(
            f"\nprotocol fuzz (seed {SEED}): sent {numbers['sent']} messages {numbers['by_kind']}; "
            f"{numbers['requests_to_answer']} requests, answered {numbers['answered']} "
            f"({numbers['results']} results, errors by code {numbers['errors_by_code']}); server alive, "
            f"{before:.1f} MB after the first fifth, {after:.1f} MB at the end"
        )
        assert after - before < GROWTH_LIMIT_MB, f"the server's memory grew from {before:.0f} MB to {after:.0f} MB"

        assert "result" in await server.request("bye", "shutdown")
        await server.message({"jsonrpc": "2.0", "method": "exit"})
        assert await asyncio.wait_for(server.proc.wait(), 30) == 0
    finally:
        if server.proc.returncode is None:
            server.proc.kill()
            await server.proc.wait()
        server.reader.cancel()

    # Thousands of malformed messages: no traceback, and each kind of them logged once, on one line.
    with open(log_path, encoding="utf-8", errors="replace") as fh:
        log = fh.read().splitlines()
    assert not [line for line in log if "Traceback" in line], "\n".join(log[-40:])
    malformed = [line for line in log if "ignored a malformed message" in line]
    assert len(malformed) == len({line.split("(")[1].split(")")[0] for line in malformed}) <= 12, malformed
    from_pygls = [line for line in log if " pygls." in line]
    assert len(from_pygls) <= 30, "\n".join(from_pygls)
    figures["fuzz_log"] = {"lines": len(log), "malformed": len(malformed), "pygls": len(from_pygls)}


@pytest.mark.asyncio
async def test_the_log_reaches_the_editor_once(tmp_path):
    """The server's lines reach the editor as window/logMessage.  Editors show stderr too (VS Code in
    the same output channel, so every line twice; Neovim as [ERROR] in lsp.log): it carries only
    warnings and errors."""
    root = make_workspace(str(tmp_path / "ws"))
    log_path = str(tmp_path / "server.log")
    server = await RawServer.start(log_path)
    try:
        await initialize(server, root)
        await open_good(server, root)
        await server.wait_until(lambda: any(m.startswith("analyzed good.py") for m in server.logged), "the log line")
        assert "result" in await server.request("bye", "shutdown")
        await server.message({"jsonrpc": "2.0", "method": "exit"})
        async with asyncio.timeout(30):
            assert await server.proc.wait() == 0
    finally:
        if server.proc.returncode is None:
            server.proc.kill()
            await server.proc.wait()
        server.reader.cancel()
    assert any(m.startswith("worker ready") for m in server.logged), server.logged
    with open(log_path, encoding="utf-8", errors="replace") as fh:
        stderr = fh.read()
    assert "analyzed good.py" not in stderr and "worker ready" not in stderr, stderr


# ---- the frame reader on its own -----------------------------------------------------------------


def bodies(frames: framing.Frames, data: bytes, split: random.Random | None = None) -> list[bytes | str]:
    """What `frames` makes of `data`, fed whole or in random pieces (problems by kind)."""
    out: list[bytes | str] = []
    pieces = [data] if split is None else _pieces(data, split)
    for piece in pieces:
        out += [item if isinstance(item, bytes) else item.kind for item in frames.feed(piece)]
    return out


def _pieces(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.randrange(len(data) + 1) for _ in range(rng.randrange(1, 40)))
    return [data[a:b] for a, b in itertools.pairwise([0, *cuts, len(data)])]


def test_frames_come_out_the_same_however_the_bytes_are_split():
    rng = random.Random(SEED)
    stream = b"".join(
        [
            frame(b'{"a": 1}'),
            b"Content-Length: 99999999999\r\n\r\n{}",
            frame("ü∞".encode()),
            b"Content-Length: -3\r\n\r\nabc",
            b"Content-Type: x\r\nContent-Length: 2\r\n\r\n[]",
            b"garbage" + frame(b"7"),
            b"X: " + b"a" * (framing.MAX_HEADER_BYTES + 10) + frame(b'"after a long header"'),
        ]
    )
    whole = bodies(framing.Frames(), stream)
    assert whole == [
        b'{"a": 1}',
        "too large",
        "ü∞".encode(),
        "length",
        b"[]",
        "header",
        b"7",
        "header",
        b'"after a long header"',
    ]
    for _ in range(200):
        assert bodies(framing.Frames(), stream, rng) == whole


def test_the_reader_holds_a_bounded_buffer():
    """A claimed length past the limit is refused at once: the bytes after it are scanned, not kept."""
    frames = framing.Frames()
    assert bodies(frames, b"Content-Length: 99999999999\r\n\r\n") == ["too large"]
    for _ in range(200):  # 200 MB that never name a next frame
        assert bodies(frames, b"x" * (1 << 20)) == []
        assert len(frames._buffer) < len(framing.MARKER)
    assert bodies(frames, frame(b"{}")) == [b"{}"]
