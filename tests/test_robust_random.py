"""Robustness, a randomised editor session: a few hundred seeded operations on four documents
(copies of the examples and a broken one) — open, type (incremental edits, syntax errors mid-edit,
non-ASCII), paste whole variants (models that raise, fail to import, are slow, or are fine), save, close —
interleaved with hovers, inlay hints, code lenses and code actions while analyses run.

Checked throughout: the server never dies; every publishDiagnostics carries a version the
document had while the server could have published it (none stale: see Tracker), for a
version that was opened or saved, with ranges inside that version's text; every request is
answered.  At the end, after a final save of each document, its diagnostics are those of a fresh
document with the same text.  That every request was answered within LATENCY_S is asserted by the
same session run again in the `timing` test (`pytest -m timing`).

The pauses between operations only set the pace (which operations land mid-analysis); no check
depends on how long anything took.

FUSELENS_ROBUST_SEED and FUSELENS_ROBUST_OPERATIONS change the session; the figures (operations
by kind, publications, stale ones, worst latency per request) are printed and written to JSON
(see the `figures` fixture in tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter, defaultdict

import pytest
from lsprotocol import types as lsp

from lsp_helpers import TIMEOUT, Client, end_position, example_text, replace_line, time_limit
from robust_helpers import descendants, single_server, worker_host, worker_starts

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

SEED = int(os.environ.get("FUSELENS_ROBUST_SEED", "20240917"))
OPERATIONS = int(os.environ.get("FUSELENS_ROBUST_OPERATIONS", "300"))
LATENCY_S = time_limit(1.0)  # asserted by the `timing` test only

client = single_server(
    ("visual-studio-code", "neovim"),
    init_options={"workspaceTrusted": True, "settings": {"worker": {"timeoutSeconds": 20}}},
)

DOCUMENTS = {
    "rnd_net.py": example_text(),
    "rnd_branchy.py": example_text("branchy.py"),
    "rnd_conv.py": example_text("conv_block.py"),
    "rnd_broken.py": replace_line(example_text(), 19, "        x = F.relu(x"),  # a syntax error
}
TYPED = [" ", "(", ")", ":", "#", ",", "x", "_", ".", "\n", "    ", "ü", "🚀", "# note ü 🚀\n", "'"]  # no digits:
# a typed digit could turn a size into a 10x larger one; deleting one only shrinks it


def variants(text: str, rng: random.Random) -> dict[str, str]:
    """Whole texts a user might paste over a document."""
    lines = text.split("\n")
    forward = next(i for i, line in enumerate(lines) if line.lstrip().startswith("def forward("))
    raises = [*lines[: forward + 1], '        raise ValueError("boom")', *lines[forward + 1 :]]
    slow = [*lines[: forward + 1], '        __import__("time").sleep(0.8)', *lines[forward + 1 :]]
    unclosed = lines[:]
    unclosed[forward + 1] += " ("
    return {
        "original": text,
        "shifted": "# a line the user added on top\n" + text,
        "raises": "\n".join(raises),
        "slow": "\n".join(slow),  # its analysis is still running when the next requests come
        "syntax error": "\n".join(unclosed),
        "import error": "import not_a_module_xyz\n" + text,
        "another example": example_text(rng.choice(["example_net.py", "branchy.py", "conv_block.py"])),
    }


def position_at(text: str, index: int) -> lsp.Position:
    """The LSP position (UTF-16 columns) of a string index."""
    line = text.count("\n", 0, index)
    start = text.rfind("\n", 0, index) + 1
    return lsp.Position(line, len(text[start:index].encode("utf-16-le")) // 2)


class Tracker:
    """Everything sent to and received from the server, to judge each publication when it arrives.

    Operations are numbered in the order they are sent (`seq`).  When the answer to a request sent
    after operation k arrives, the server has handled operations 1..k (it handles messages in
    order and answers after handling).  So a publication arriving at a moment when the latest
    answered request was sent after operation `acked`, and `seq` operations have been sent, was
    published while the server's view of the document was one of its states from `acked` to
    `seq`: it is stale if its version is none of them.  Versions increase across close and reopen,
    so a version names one text.
    """

    def __init__(self, client: Client):
        self.client = client
        self.seq = 0
        self.acked = 0
        self.states: dict[str, list[tuple[int, int | None]]] = defaultdict(list)  # uri -> [(seq, version | None)]
        self.last_version: dict[str, int] = defaultdict(int)
        self.text_of: dict[tuple[str, int], str] = {}
        self.analyzable: dict[str, set[int]] = defaultdict(set)  # versions opened or saved
        self.ops: Counter[str] = Counter()
        self.pasted: Counter[str] = Counter()  # which variants
        self.latency: dict[str, float] = defaultdict(float)
        self.requests = 0
        self.publications = 0
        self.stale: list[str] = []
        self.raced = 0  # published for a version the client had just left: legitimate, counted for interest
        self.bad_ranges: list[str] = []
        tracker = self

        class Published(list):
            def append(self, params):
                tracker.on_publish(params)
                super().append(params)

        client.published = Published(client.published)

    # -- operations ----------------------------------------------------------------------------
    def _state(self, uri: str, version: int | None) -> None:
        self.states[uri].append((self.seq, version))

    def open(self, uri: str, text: str) -> None:
        self.seq += 1
        self.ops["didOpen"] += 1
        version = self.last_version[uri] = self.last_version[uri] + 1
        self.text_of[(uri, version)] = text
        self.analyzable[uri].add(version)
        self._state(uri, version)
        self.client.texts[uri], self.client.versions[uri] = text, version
        self.client.text_document_did_open(
            lsp.DidOpenTextDocumentParams(
                lsp.TextDocumentItem(uri=uri, language_id="python", version=version, text=text)
            )
        )

    def edit(self, uri: str, start: int, end: int, new: str, kind: str) -> None:
        """Replace text[start:end] with `new`, sent as one incremental change with its exact range."""
        self.seq += 1
        self.ops[kind] += 1
        old = self.client.texts[uri]
        text = old[:start] + new + old[end:]
        version = self.last_version[uri] = self.last_version[uri] + 1
        self.text_of[(uri, version)] = text
        self._state(uri, version)
        self.client.texts[uri], self.client.versions[uri] = text, version
        self.client.text_document_did_change(
            lsp.DidChangeTextDocumentParams(
                lsp.VersionedTextDocumentIdentifier(uri=uri, version=version),
                [
                    lsp.TextDocumentContentChangePartial(
                        range=lsp.Range(position_at(old, start), position_at(old, end)), text=new
                    )
                ],
            )
        )

    def save(self, uri: str) -> None:
        self.seq += 1
        self.ops["didSave"] += 1
        self.analyzable[uri].add(self.client.versions[uri])
        self.client.save(uri)

    def close(self, uri: str) -> None:
        self.seq += 1
        self.ops["didClose"] += 1
        self._state(uri, None)
        self.client.close(uri)

    async def request(self, kind: str, method: str, params):
        sent_after = self.seq
        self.ops[kind] += 1
        self.requests += 1
        started = time.perf_counter()
        future = self.client.protocol.send_request(method, params)
        future.add_done_callback(lambda _: self._answered(sent_after))  # (runs as the answer is read)
        result = await asyncio.wait_for(asyncio.wrap_future(future), TIMEOUT)
        self.latency[kind] = max(self.latency[kind], round(time.perf_counter() - started, 4))
        return result

    def _answered(self, sent_after: int) -> None:
        self.acked = max(self.acked, sent_after)

    # -- what arrives --------------------------------------------------------------------------
    def possible_states(self, uri: str) -> set[int | None]:
        history = self.states[uri]
        before = [v for s, v in history if s <= self.acked]
        return {before[-1] if before else None} | {v for s, v in history if self.acked < s <= self.seq}

    def on_publish(self, params: lsp.PublishDiagnosticsParams) -> None:
        self.publications += 1
        uri, version = params.uri, params.version
        possible = self.possible_states(uri)
        name = os.path.basename(uri)
        if version is None:  # the clearing that follows a close
            if params.diagnostics or None not in possible:
                self.stale.append(f"{name}: unversioned {len(params.diagnostics)} diagnostics, states {possible}")
            return
        if version not in possible or version not in self.analyzable[uri]:
            self.stale.append(
                f"{name} v{version}: server could have been at {sorted(possible, key=str)}, "
                f"analyzable {sorted(self.analyzable[uri])}"
            )
            return
        if version != self.client.versions.get(uri):
            self.raced += 1
        lines = self.text_of[(uri, version)].split("\n")
        for d in params.diagnostics:
            start, end = d.range.start, d.range.end
            if not (
                (start.line, start.character) <= (end.line, end.character)
                and end.line < len(lines)
                and end.character <= len(lines[end.line].encode("utf-16-le")) // 2
                and start.character <= len(lines[start.line].encode("utf-16-le")) // 2
            ):
                self.bad_ranges.append(f"{name} v{version}: {d.code} {d.range} in a {len(lines)}-line text")


def signature(diags) -> list[tuple]:
    return sorted(
        (
            d.range.start.line,
            d.range.start.character,
            d.range.end.line,
            d.range.end.character,
            d.severity,
            d.code,
            d.message,
        )
        for d in diags
    )


async def one_operation(
    rng: random.Random, tracker: Tracker, client: Client, uris: dict[str, str], originals: dict[str, str]
) -> None:
    """One operation on one of `uris` (by file name); `originals` are their texts at the start."""
    name = rng.choice(list(uris))
    uri = uris[name]
    is_open = uri in client.texts
    roll = rng.random()
    if not is_open:
        if roll < 0.5:
            with open(client.path(name), encoding="utf-8") as fh:  # an editor opens what is on disk
                tracker.open(uri, fh.read())
        else:  # a request about a closed document
            await tracker.request(
                "hover",
                lsp.TEXT_DOCUMENT_HOVER,
                lsp.HoverParams(lsp.TextDocumentIdentifier(uri), lsp.Position(rng.randrange(40), rng.randrange(20))),
            )
        return
    text = client.texts[uri]
    lines = text.split("\n")
    if roll < 0.22:  # typing: insert or delete a little, anywhere
        at = rng.randrange(len(text) + 1)
        if rng.random() < 0.6 or at == len(text):
            tracker.edit(uri, at, at, rng.choice(TYPED), "type")
        else:
            tracker.edit(uri, at, min(len(text), at + rng.randint(1, 3)), "", "delete")
    elif roll < 0.32:  # paste a whole variant over it
        pasted = variants(originals[name] if rng.random() < 0.7 else text, rng)
        which = rng.choice(list(pasted))
        tracker.pasted[which] += 1
        tracker.edit(uri, 0, len(text), pasted[which], "paste")
    elif roll < 0.47:
        tracker.save(uri)
    elif roll < 0.50:
        tracker.close(uri)
    elif roll < 0.65:
        await tracker.request(
            "hover",
            lsp.TEXT_DOCUMENT_HOVER,
            lsp.HoverParams(
                lsp.TextDocumentIdentifier(uri), lsp.Position(rng.randrange(len(lines) + 3), rng.randrange(100))
            ),
        )
    elif roll < 0.74:
        first = rng.randrange(len(lines))
        end = end_position(text) if rng.random() < 0.5 else lsp.Position(min(len(lines) - 1, first + 10), 0)
        await tracker.request(
            "inlayHint",
            lsp.TEXT_DOCUMENT_INLAY_HINT,
            lsp.InlayHintParams(
                lsp.TextDocumentIdentifier(uri), lsp.Range(lsp.Position(first if end.line >= first else 0, 0), end)
            ),
        )
    elif roll < 0.83:
        await tracker.request(
            "codeLens", lsp.TEXT_DOCUMENT_CODE_LENS, lsp.CodeLensParams(lsp.TextDocumentIdentifier(uri))
        )
    elif roll < 0.94:
        line = rng.randrange(len(lines))
        here = lsp.Range(lsp.Position(line, 0), lsp.Position(line, 0))
        diags = [d for d in client.latest(uri) or [] if d.range.start.line <= line <= d.range.end.line]
        await tracker.request(
            "codeAction",
            lsp.TEXT_DOCUMENT_CODE_ACTION,
            lsp.CodeActionParams(lsp.TextDocumentIdentifier(uri), here, lsp.CodeActionContext(diagnostics=diags)),
        )
    else:  # the user pauses: analyses get to finish (or not)
        tracker.ops["pause"] += 1
        await asyncio.sleep(rng.choice([0.01, 0.05, 0.2, 0.5]))


async def random_session(client: Client, figures, prefix: str = ""):
    """The session, on documents named `prefix` + DOCUMENTS' names; the figures go under the profile.
    Returns (the tracker, the worker starts before it, {uri: its final diagnostics}, {uri: its twin's URI})."""
    rng = random.Random(f"{SEED}-{client.profile}")
    tracker = Tracker(client)
    originals = {prefix + name: text for name, text in DOCUMENTS.items()}
    uris = {}
    for name, text in originals.items():
        uris[name] = client.write(name, text)
        tracker.open(uris[name], text)
    starts = worker_starts(client)
    loop = asyncio.get_running_loop()
    started = loop.time()

    for i in range(OPERATIONS):
        await one_operation(rng, tracker, client, uris, originals)
        if rng.random() < 0.3:
            await asyncio.sleep(rng.random() * 0.03)  # typing speed: some operations land mid-analysis
        assert client._server.returncode is None, f"the server died after operation {i + 1}"
    session_s = loop.time() - started

    # The end: every document open and saved, then compared with a fresh twin of the same text.
    for name, uri in uris.items():
        if uri not in client.texts:
            with open(client.path(name), encoding="utf-8") as fh:
                tracker.open(uri, fh.read())
    marks = {uri: len(client.published) for uri in uris.values()}
    for uri in uris.values():
        tracker.save(uri)
    finals = {uri: await client.diagnostics_of(uri, client.versions[uri], after=marks[uri]) for uri in uris.values()}
    twins = {}
    for name, uri in uris.items():
        twins[uri] = client.write(f"twin_{name}", client.texts[uri])
        tracker.open(twins[uri], client.texts[uri])
    for twin in twins.values():
        await client.diagnostics_of(twin, 1)

    # Settled: each document's (and twin's) last publication is of its current version, and no job is
    # left in the worker, so no analysis is still on its way; what did arrive was judged as it came.
    # The request after that is answered only once the server has handled everything sent before it.
    def settled() -> bool:
        last = {p.uri: p.version for p in client.published}
        return all(
            last.get(uri) == client.versions[uri] for uri in [*uris.values(), *twins.values()]
        ) and not descendants(worker_host(client))

    await client.wait_until(settled, "every document's current version published and no job running", poll=0.05)
    await tracker.request(
        "hover",
        lsp.TEXT_DOCUMENT_HOVER,
        lsp.HoverParams(lsp.TextDocumentIdentifier(uris[prefix + "rnd_net.py"]), lsp.Position(0, 0)),
    )

    figures[client.profile] = {
        "seed": SEED,
        "operations": sum(v for k, v in tracker.ops.items() if k != "pause"),
        "operations_by_kind": dict(sorted(tracker.ops.items())),
        "pasted": dict(sorted(tracker.pasted.items())),
        "documents": len(uris),
        "requests": tracker.requests,
        "publications": tracker.publications,
        "stale_publications": len(tracker.stale),
        "publications_for_a_version_just_left": tracker.raced,
        "ranges_outside_their_text": len(tracker.bad_ranges),
        "worst_latency_s": dict(sorted(tracker.latency.items())),
        "session_seconds": round(session_s, 1),
        "server_alive": client._server.returncode is None,
        "worker_restarts": worker_starts(client) - starts,
    }
    return tracker, starts, finals, twins


async def test_a_random_session(client: Client, figures):
    tracker, starts, finals, twins = await random_session(client, figures)
    assert client._server.returncode is None
    assert tracker.stale == [], tracker.stale[:10]
    assert tracker.bad_ranges == [], tracker.bad_ranges[:10]
    assert worker_starts(client) == starts  # nothing here should have cost the worker its life
    for uri, final in finals.items():
        name = os.path.basename(uri)
        latest = [p for p in client.published if p.uri == uri][-1]
        assert latest.version == client.versions[uri], (name, latest.version, client.versions[uri])
        assert signature(latest.diagnostics) == signature(final)
        assert signature(final) == signature(client.latest(twins[uri])), name


@pytest.mark.timing
async def test_a_random_session_answers_every_request_promptly(client: Client, figures):
    """The same session (the same seed), on documents of its own: every request answered within LATENCY_S."""
    tracker, _, _, _ = await random_session(client, figures, "timed_")
    assert client._server.returncode is None
    assert tracker.requests > 0 and max(tracker.latency.values()) <= LATENCY_S, dict(tracker.latency)
