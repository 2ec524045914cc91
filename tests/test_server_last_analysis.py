"""Language server: a file opened again in a new editor session shows its last analysis at once.

A new server's first analysis waits for the worker host to start (torch imported) and for the model's
own imports.  The server keeps each file's last analysis in the user's cache folder; opening the same
text with the same settings shows it before the worker is ready, and the new analysis then replaces
it.  A changed text, a changed module the clusters' code is in, or a kept file that is not one shows
nothing early.
"""

from __future__ import annotations

import os
import textwrap

import pytest

from lsp_helpers import PROFILES, Client, make_workspace, running_server

pytestmark = pytest.mark.asyncio

PROFILE = PROFILES[0]
BLOCKS = """
    import torch
    import torch.nn as nn


    class Block(nn.Module):
        def forward(self, x):
            x = x * 2.0
            x = torch.relu(x)
            return x + 1.0
    """
MODEL = """
    import torch.nn as nn

    from blocks import Block


    class Net(nn.Module):  # fuselens: input=(64, 64)
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(x)
    """


def logged(client: Client, needle: str) -> int | None:
    """The index of the first log line holding `needle`, if any."""
    return next((i for i, m in enumerate(client.log_messages) if needle in m.message), None)


def messages(diags) -> list[str]:
    return sorted(d.message for d in diags)


async def analyze_once(root: str, name: str, text: str | None = None) -> list[str]:
    """Open `name` in a server of its own and return its diagnostics' messages once analyzed."""
    async with running_server(PROFILE, root) as client:
        uri = client.open(name, text)
        return messages(await client.diagnostics_of(uri, 1))


@pytest.fixture
def workspace(tmp_path) -> str:
    root = make_workspace(str(tmp_path / "ws"))
    for name, text in (("blocks.py", BLOCKS), ("net.py", MODEL)):
        with open(os.path.join(root, name), "w", encoding="utf-8") as fh:
            fh.write(textwrap.dedent(text).lstrip("\n"))
    return root


async def test_a_file_opened_again_shows_its_last_analysis_before_the_worker_is_ready(workspace):
    want = await analyze_once(workspace, "example_net.py")
    async with running_server(PROFILE, workspace, wait_ready=False) as client:
        uri = client.open("example_net.py")
        first = await client.diagnostics_of(uri, 1)
        assert messages(first) == want
        await client.wait_until(lambda: logged(client, "worker ready") is not None, "the worker to warm up", 180)
        shown, ready = logged(client, "showing the last analysis of example_net.py"), logged(client, "worker ready")
        assert shown is not None and shown < ready  # the diagnostics came before the worker could analyze
        # The file is analyzed again all the same, and that analysis replaces the kept one.
        await client.wait_until(lambda: logged(client, "analyzed example_net.py v1") is not None, "the new analysis")
        await client.wait_until(lambda: len(client.published_for(uri)) == 2, "the new analysis's diagnostics")
        assert messages(client.latest(uri) or []) == want


async def assert_nothing_shown_early(root: str, name: str, text: str | None = None) -> Client:
    """Open `name` in a new server: its first diagnostics are the new analysis's, none kept."""
    async with running_server(PROFILE, root, wait_ready=False) as client:
        uri = client.open(name, text)
        await client.diagnostics_of(uri, 1)
        assert logged(client, "showing the last analysis") is None
        assert logged(client, f"analyzed {name} v1") is not None
        assert len(client.published_for(uri)) == 1
        return client


async def test_another_text_shows_nothing_early(workspace):
    await analyze_once(workspace, "net.py")
    with open(os.path.join(workspace, "net.py"), encoding="utf-8") as fh:
        edited = fh.read() + "\n# edited while the editor was closed\n"
    await assert_nothing_shown_early(workspace, "net.py", edited)


async def test_a_changed_module_of_the_clusters_code_shows_nothing_early(workspace):
    assert any("mul → relu → add" in m for m in await analyze_once(workspace, "net.py"))
    with open(os.path.join(workspace, "blocks.py"), "w", encoding="utf-8") as fh:
        fh.write(textwrap.dedent(BLOCKS).lstrip("\n").replace("torch.relu", "torch.sigmoid"))
    client = await assert_nothing_shown_early(workspace, "net.py")
    assert any("mul → sigmoid → add" in m for m in messages(client.latest(client.published[0].uri) or []))


async def test_a_kept_file_that_is_not_an_analysis_is_skipped_with_a_log_line(workspace):
    from fuselens.server.last_analysis import entry_path

    await analyze_once(workspace, "net.py")
    with open(entry_path(os.path.join(workspace, "net.py")), "w", encoding="utf-8") as fh:
        fh.write('{"format": 1, "file": "/etc/passwd"')  # cut short
    client = await assert_nothing_shown_early(workspace, "net.py")
    assert logged(client, "last analysis") is not None and logged(client, "skipped: ") is not None
