"""Language server: the worker keeps a model's library imported, so a save does not import it again.

A model built from an installed library (transformers' Llama) spent most of each save importing the
library's modeling code in a fresh job.  After the first analysis the worker host imports the
library modules that hold the model's code, once, and every job forked after that starts with them.
Here the library is a small package on PYTHONPATH, outside the workspace, that writes the pid of each
process that imports it; a project's own module of the same name still wins in its folder.
"""

from __future__ import annotations

import os
import textwrap

import pytest

from lsp_helpers import Client, children, server_fixture, server_pid

pytestmark = pytest.mark.asyncio(loop_scope="module")

LIBRARY = {
    "__init__.py": "from .block import Block\n",
    "block.py": """
        import os

        import torch
        import torch.nn as nn

        with open(os.path.join(os.path.dirname(__file__), "imports.log"), "a") as log:
            log.write(f"{os.getpid()}\\n")


        class Block(nn.Module):
            def forward(self, x):
                x = x * 2.0
                x = torch.relu(x)
                return x + 1.0
        """,
}
MODEL = """
    import torch.nn as nn

    from fakelib import Block


    class Net(nn.Module):  # fuselens: input=(64, 64)
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(x)
    """
# The project's own module named like the library, beside a model that imports it.
OWN_MODULE = """
    import torch
    import torch.nn as nn


    class Block(nn.Module):
        def forward(self, x):
            x = x * 2.0
            x = torch.sigmoid(x)
            return x + 1.0
    """


def site(root: str) -> str:
    """Where the library is installed: a folder on PYTHONPATH beside the workspace."""
    return os.path.join(os.path.dirname(root), "site")


def install_library(root: str) -> None:
    folder = os.path.join(site(root), "fakelib")
    os.makedirs(folder)
    for name, text in LIBRARY.items():
        with open(os.path.join(folder, name), "w", encoding="utf-8") as fh:
            fh.write(textwrap.dedent(text).lstrip("\n"))


client = server_fixture(prepare=install_library, server_env=lambda root: {"PYTHONPATH": site(root)})


def importers(client: Client) -> list[int]:
    """The pids of the processes that imported the library, in order."""
    try:
        with open(os.path.join(site(client.root), "fakelib", "imports.log"), encoding="utf-8") as fh:
            return [int(line) for line in fh.read().split()]
    except FileNotFoundError:
        return []


def chains(diags) -> list[str]:
    """The chain of ops of each cluster's diagnostic ("fusable: mul → relu → add, 96 KB → 32 KB ...")."""
    return [d.message.split(":", 1)[1].split(",")[0].strip() for d in diags if d.message.startswith("fusable:")]


async def test_the_worker_imports_the_library_once_and_later_jobs_do_not(client: Client):
    (host,) = children(server_pid(client))
    uri = client.open("uses_fakelib.py", textwrap.dedent(MODEL).lstrip("\n"))
    assert chains(await client.diagnostics_of(uri, 1)) == ["mul → relu → add"]
    # The first job imported it; then the host, between jobs.
    await client.wait_until(lambda: len(importers(client)) == 2, "the worker host to import the library", poll=0.05)
    assert importers(client)[1] == host
    await client.wait_until(
        lambda: any("keeping fakelib.block loaded for the jobs" in m.message for m in client.log_messages),
        "the worker to say it keeps the library loaded",
    )
    for _ in range(2):
        version = client.save_text(uri, client.texts[uri] + "\n")
        assert chains(await client.diagnostics_of(uri, version)) == ["mul → relu → add"]
    assert len(importers(client)) == 2  # the jobs of both saves started with it imported
    client.close(uri)


async def test_a_projects_own_module_of_the_librarys_name_is_still_imported_in_its_folder(client: Client):
    uri = client.open("warm_fakelib.py", textwrap.dedent(MODEL).lstrip("\n"))
    await client.diagnostics_of(uri, 1)
    await client.wait_until(lambda: len(importers(client)) >= 2, "the worker host to import the library", poll=0.05)
    own = os.path.join(client.root, "own")
    os.makedirs(own, exist_ok=True)
    with open(os.path.join(own, "fakelib.py"), "w", encoding="utf-8") as fh:
        fh.write(textwrap.dedent(OWN_MODULE).lstrip("\n"))
    mine = client.open(os.path.join("own", "uses_own.py"), textwrap.dedent(MODEL).lstrip("\n"))
    assert chains(await client.diagnostics_of(mine, 1)) == ["mul → sigmoid → add"]  # the project's, not the library's
    client.close(mine)
    client.close(uri)
