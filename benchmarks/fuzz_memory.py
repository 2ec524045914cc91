"""The language server under a long protocol fuzz, and its memory all along.

    python benchmarks/fuzz_memory.py [--messages 100000] [--every 10000] [--seed 20261201]

The fuzzer of tests/test_protocol_fuzz.py (tests/fuzz_helpers.py: requests with random params,
notifications, stray responses, JSON that is not JSON-RPC, bodies that are not JSON, broken frames) at
the real server over its stdio, `--every` messages at a time; after each batch, a hover on the analyzed
example (the stream is in step, the server still analyzes) and every request of the batch answered.
Prints the server's resident memory (VmRSS) after each batch, and its growth from the first batch (the
warm-up) to the last.  Exits 1 if a request went unanswered or was answered twice, the server died or
did not exit cleanly, its log holds a traceback, or its memory grew by GROWTH_LIMIT_MB or more.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from fuzz_helpers import Fuzzer, RawServer, deliver, initialize, open_good, summary  # noqa: E402  (the tests' fuzzer)
from lsp_helpers import make_workspace  # noqa: E402
from robust_helpers import status_kb  # noqa: E402

GROWTH_LIMIT_MB = 20


async def fuzz(messages: int, every: int, seed: int, folder: str) -> int:
    root = make_workspace(os.path.join(folder, "fuzz ü"))
    os.environ["XDG_CACHE_HOME"] = os.path.join(folder, "cache")  # (the views "Show kernel" writes)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    log_path = os.path.join(folder, "server.log")
    server = await RawServer.start(log_path)
    problems: list[str] = []
    try:
        await initialize(server, root)
        good = await open_good(server, root)
        fuzzer = Fuzzer(seed, good, root)
        sent, samples = [], []
        started = time.monotonic()
        while len(sent) < messages:
            batch = [fuzzer.next() for _ in range(min(every, messages - len(sent)))]
            missing = await deliver(server, batch, good, f"sentinel-{len(sent)}")
            sent += batch
            rss = status_kb(server.proc.pid) / 1024
            samples.append((len(sent), rss))
            print(f"{len(sent):>8} messages  {time.monotonic() - started:7.1f} s  server {rss:6.1f} MB", flush=True)
            if missing:
                problems.append(f"{len(missing)} requests of the batch never answered")
        twice = sum(len(a) > 1 for a in server.answers.values())
        if twice:
            problems.append(f"{twice} requests answered more than once")
        numbers = summary(sent, server, seed)
        if "result" not in await server.request("bye", "shutdown"):
            problems.append("shutdown failed")
        await server.message({"jsonrpc": "2.0", "method": "exit"})
        if await asyncio.wait_for(server.proc.wait(), 30) != 0:
            problems.append(f"the server exited {server.proc.returncode}")
    finally:
        if server.proc.returncode is None:
            server.proc.kill()
            await server.proc.wait()
        server.reader.cancel()

    with open(log_path, encoding="utf-8", errors="replace") as fh:
        log = fh.read().splitlines()
    if any("Traceback" in line for line in log):
        problems.append("a traceback in the server's log")
    warm, last = samples[0][1], samples[-1][1]
    growth = last - warm
    if growth >= GROWTH_LIMIT_MB:
        problems.append(f"the server's memory grew by {growth:.1f} MB")
    numbers["rss_mb"] = {"after_the_warm_up": round(warm, 1), "at_the_end": round(last, 1), "growth": round(growth, 1)}
    numbers["rss_mb_by_messages"] = {count: round(rss, 1) for count, rss in samples}
    numbers["log_lines"] = len(log)
    numbers["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(numbers, indent=1))
    print(
        f"protocol fuzz (seed {seed}): {numbers['sent']} messages "
        f"{dict(collections.Counter(s.kind for s in sent))}; {numbers['requests_to_answer']} requests, "
        f"{numbers['answered']} answered; server {warm:.1f} MB after the first {samples[0][0]} messages, "
        f"{last:.1f} MB after {samples[-1][0]} ({growth:+.1f} MB; limit {GROWTH_LIMIT_MB} MB)"
    )
    for problem in problems:
        print(f"FAILED: {problem}")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=10_000, help="messages per batch (the first is the warm-up)")
    parser.add_argument("--seed", type=int, default=20261201)
    args = parser.parse_args()
    if args.messages < 2 * args.every:
        parser.error("--messages must be at least twice --every: the first batch is the warm-up")
    with tempfile.TemporaryDirectory(prefix="fuselens-fuzz-") as folder:
        return asyncio.run(fuzz(args.messages, args.every, args.seed, folder))


if __name__ == "__main__":
    sys.exit(main())
