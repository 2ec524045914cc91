"""Language server, watched files: a model is analyzed again when a file it depends on changes."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from lsprotocol import types as lsp

from lsp_helpers import Client, server_fixture, time_limit, uri_of

pytestmark = pytest.mark.asyncio(loop_scope="module")

client = server_fixture()

HELPER = '''"""Activations the model imports."""

import torch
import torch.nn.functional as F


def act(x):
    return {body}
'''

MODEL = """import torch
import torch.nn as nn

from {helper} import act


class {name}(nn.Module):  # fuselens: input=(16384, 1024) float32
    def forward(self, x):
        x = x * 2.0
        x = act(x)
        x = x + 1.0
        return x
"""


def chains(diags) -> list[str]:
    return [d.message.split(",")[0].removeprefix("fusable: ") for d in diags if d.message.startswith("fusable:")]


async def open_model(client: Client, stem: str, body: str = "F.relu(x)") -> str:
    client.write(f"{stem}_helper.py", HELPER.format(body=body))
    uri = client.open(f"{stem}.py", MODEL.format(helper=f"{stem}_helper", name=stem.title().replace("_", "")))
    assert chains(await client.diagnostics_of(uri, 1)) == ["mul → relu → add"]
    return uri


def notify(client: Client, name: str, kind: lsp.FileChangeType = lsp.FileChangeType.Changed) -> None:
    client.workspace_did_change_watched_files(
        lsp.DidChangeWatchedFilesParams([lsp.FileEvent(uri=uri_of(client.path(name)), type=kind)])
    )


async def test_file_watching_is_registered_where_the_client_can(client: Client):
    if client.profile == "visual-studio-code":  # dynamic registration: the client watches for us
        (registration,) = await client.wait_until(lambda: client.registrations, "the registration")
        assert registration.method == lsp.WORKSPACE_DID_CHANGE_WATCHED_FILES
        globs = [w["globPattern"] for w in registration.register_options["watchers"]]
        assert globs == ["**/*.py", "**/pyproject.toml"]
    else:  # Neovim 0.9 cannot register watchers: the server watches the folder itself
        await client.roundtrip()
        assert client.registrations == []


async def test_a_changed_local_import_is_analyzed_again(client: Client):
    uri = await open_model(client, "watched")
    seen = len(client.published)
    client.write("watched_helper.py", HELPER.format(body="torch.sigmoid(x)"))
    notify(client, "watched_helper.py")
    diags = await client.diagnostics_until(
        uri, lambda d: chains(d) == ["mul → sigmoid → add"], "the new helper's cluster", after=seen
    )
    assert {p.version for p in client.published_for(uri)} == {1}  # the document itself did not change
    assert len(diags) == 1


async def test_a_change_on_disk_is_noticed_without_the_client(client: Client):
    """Clients that do not watch files (Neovim 0.9) still get fresh results: the server watches too."""
    uri = await open_model(client, "unwatched")
    seen = len(client.published)
    client.write("unwatched_helper.py", HELPER.format(body="torch.tanh(x)"))  # and no notification
    await client.diagnostics_until(
        uri, lambda d: chains(d) == ["mul → tanh → add"], "the new helper's cluster", after=seen
    )


async def test_a_broken_import_is_reported_and_recovers(client: Client):
    uri = await open_model(client, "watched_broken")
    seen = len(client.published)
    client.write("watched_broken_helper.py", HELPER.format(body="F.relu(x"))
    notify(client, "watched_broken_helper.py")
    (error,) = await client.diagnostics_until(
        uri, lambda d: any("SyntaxError" in e.message for e in d), "the import error", after=seen
    )
    assert error.severity == lsp.DiagnosticSeverity.Error and error.code == "syntax"
    assert error.message == "SyntaxError: '(' was never closed (in watched_broken_helper.py:8)"
    seen = len(client.published)
    client.write("watched_broken_helper.py", HELPER.format(body="F.gelu(x)"))
    notify(client, "watched_broken_helper.py")
    await client.diagnostics_until(
        uri, lambda d: chains(d) == ["mul → gelu → add"], "the fixed helper's cluster", after=seen
    )


async def test_a_second_edit_within_the_same_second_is_seen(client: Client):
    """Python trusts a cached .pyc if its source has the same size and mtime in whole seconds: the
    worker must not leave one behind for the user's modules (nor litter the workspace with them)."""
    helper = client.path("watched_quick_helper.py")
    second = int(time.time()) - 10
    client.write("watched_quick_helper.py", HELPER.format(body="F.relu(x)"))
    os.utime(helper, ns=(second * 10**9 + 100_000_000,) * 2)
    uri = client.open("watched_quick.py", MODEL.format(helper="watched_quick_helper", name="WatchedQuick"))
    assert chains(await client.diagnostics_of(uri, 1)) == ["mul → relu → add"]
    seen = len(client.published)
    client.write("watched_quick_helper.py", HELPER.format(body="F.gelu(x)"))  # the same size...
    os.utime(helper, ns=(second * 10**9 + 200_000_000,) * 2)  # ... saved in the same second
    notify(client, "watched_quick_helper.py")
    await client.diagnostics_until(
        uri, lambda d: chains(d) == ["mul → gelu → add"], "the new helper's cluster", after=seen
    )
    assert not os.path.exists(client.path("__pycache__"))


async def test_unrelated_files_do_not_trigger_analysis(client: Client):
    await open_model(client, "watched_quiet")
    logged = len(client.log_messages)
    client.write("unrelated.py", "VALUE = 1\n")
    notify(client, "unrelated.py", lsp.FileChangeType.Created)
    await client.roundtrip()
    assert not [m for m in client.log_messages[logged:] if "re-analyzing watched_quiet.py" in m.message]


async def test_pyproject_inputs_are_watched(client: Client):
    uri = await open_model(client, "watched_inputs")
    seen = len(client.published)
    with open(client.path("pyproject.toml"), "a", encoding="utf-8") as fh:
        fh.write("\n[tool.fuselens.models.WatchedInputs]\ninputs = [[4096, 1024]]\n")
    notify(client, "pyproject.toml")
    # a quarter of the rows the inline comment asked for
    await client.diagnostics_until(
        uri, lambda d: len(d) == 1 and "96 MB → 32 MB" in d[0].message, "the cluster at the new shape", after=seen
    )


VALID = """import torch
import torch.nn as nn


class CheckedOut(nn.Module):  # fuselens: input=(16384, 1024) float32
    def forward(self, x):
        x = x * 2.0
        x = torch.relu(x)
        return x + 1.0
"""
BROKEN = VALID.replace("torch.relu(x)", "torch.relu(x")  # an edit saved, then thrown away


def git(client: Client, *args: str) -> None:
    folder = client.path("repo")
    os.makedirs(folder, exist_ok=True)
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args]
    subprocess.run(command, cwd=folder, check=True, capture_output=True)


def reload(client: Client, uri: str, name: str) -> None:
    """What the editor does when the file of a buffer without unsaved changes changes on disk: VS Code
    hears of it from its file watcher (which fuselens registered) and changes the buffer's text to the
    disk's; Neovim (`:checktime`, on focus or after a shell command) and Emacs (`revert-buffer`)
    reopen the document."""
    with open(client.path(name), encoding="utf-8") as fh:
        text = fh.read()
    if client.profile == "visual-studio-code":
        notify(client, name)
        client.change(uri, text)
    else:
        client.close(uri)
        client.open(name)


async def checked_out(client: Client, name: str) -> tuple[str, float]:
    """A model whose saved text has a syntax error, open and analyzed, then `git checkout` of its
    committed text, valid, and the editor's reload; returns its URI and when git was done."""
    path = os.path.join("repo", name)
    git(client, "init", "-q")
    client.write(path, VALID)
    git(client, "add", name)
    git(client, "commit", "-q", "-m", "a model")
    uri = client.open(path, BROKEN)
    await client.diagnostics_until(uri, lambda d: any(e.code == "syntax" for e in d), "the syntax error")
    git(client, "checkout", "--", name)
    done = time.monotonic()
    reload(client, uri, path)
    return uri, done


async def test_a_checkout_under_the_editor_is_analyzed_again(client: Client):
    """`git checkout` of an open file: once the editor has reloaded it, its diagnostics are those of
    the text on disk, not an old syntax error (VS Code reloads by changing the text, which no save
    follows)."""
    seen = len(client.published)
    uri, _ = await checked_out(client, "checked_out.py")
    diags = await client.diagnostics_until(
        uri, lambda d: chains(d) == ["mul → relu → add"], "the checked-out file's cluster", after=seen
    )
    assert not any(d.code == "syntax" for d in diags)


@pytest.mark.timing
async def test_a_checkout_refreshes_the_diagnostics_within_a_second(client: Client):
    seen = len(client.published)
    uri, done = await checked_out(client, "checked_out_timed.py")
    await client.diagnostics_until(
        uri, lambda d: chains(d) == ["mul → relu → add"], "the checked-out file's cluster", after=seen
    )
    latency = time.monotonic() - done
    print(f"git checkout → fresh diagnostics ({client.profile}): {latency:.2f} s")
    assert latency < time_limit(1.0)


async def test_a_buffer_with_unsaved_changes_keeps_them(client: Client):
    """A checkout under a buffer the user has changed: the editor keeps the buffer (VS Code marks the
    conflict), and the server neither analyzes the disk's text in its place nor asks for anything."""
    name = os.path.join("repo", "kept.py")
    git(client, "init", "-q")
    client.write(name, VALID)
    git(client, "add", "kept.py")
    git(client, "commit", "-q", "-m", "another model")
    uri = client.open(name)
    await client.diagnostics_of(uri, 1)
    typed = client.change(uri, VALID.replace("x * 2.0", "x * 3.0"))
    client.write(name, BROKEN)  # a checkout of another branch, say
    notify(client, name)
    await client.roundtrip()
    assert not [m for m in client.log_messages if "kept.py changed on disk" in m.message]
    assert [p.version for p in client.published_for(uri)] == [1] and client.versions[uri] == typed
