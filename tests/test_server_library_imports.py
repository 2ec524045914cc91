"""Language server: the worker keeps a model's library imported, so a save does not import it again.

A model built from an installed library (transformers' Llama) spent most of each save importing the
library's modeling code in a fresh job.  After the first analysis the worker host imports the
library modules that hold the model's code, once, and every job forked after that starts with them.
Here the library is a small package on PYTHONPATH, outside the workspace, that writes the pid of each
process that imports it; a project's own module of the same name still wins in its folder.  A
package installed in a site-packages folder is imported by the host even before a file's first job,
from the file's own import statements.
"""

from __future__ import annotations

import asyncio
import os
import textwrap

import pytest

from library_corpus import CORPUS
from lsp_helpers import PROFILES, Client, children, running_server, server_fixture, server_pid, time_limit

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


def site_packages(root: str) -> str:
    """Where `pip install --target` installed another copy of it, as `instlib`: a site-packages folder."""
    return os.path.join(os.path.dirname(root), "prefix", "lib", "python3", "site-packages")


def install_library(root: str) -> None:
    for folder in (os.path.join(site(root), "fakelib"), os.path.join(site_packages(root), "instlib")):
        os.makedirs(folder)
        for name, text in LIBRARY.items():
            with open(os.path.join(folder, name), "w", encoding="utf-8") as fh:
                fh.write(textwrap.dedent(text).lstrip("\n"))


client = server_fixture(
    prepare=install_library, server_env=lambda root: {"PYTHONPATH": os.pathsep.join([site(root), site_packages(root)])}
)


def importers(client: Client, library: str = "fakelib") -> list[int]:
    """The pids of the processes that imported the library, in order."""
    folder = site(client.root) if library == "fakelib" else site_packages(client.root)
    try:
        with open(os.path.join(folder, library, "imports.log"), encoding="utf-8") as fh:
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


async def test_a_files_first_job_starts_with_its_installed_library_imported(client: Client):
    (host,) = children(server_pid(client))
    uri = client.open("uses_instlib.py", textwrap.dedent(MODEL).lstrip("\n").replace("fakelib", "instlib"))
    assert chains(await client.diagnostics_of(uri, 1)) == ["mul → relu → add"]
    assert importers(client, "instlib") == [host]  # the host, before the job: the job found it imported
    assert any("keeping instlib (Block) loaded for the jobs" in m.message for m in client.log_messages)
    client.close(uri)


FIRST_OPEN_S = 3.0  # a 2-core machine: the host's start, transformers' import and the analysis, after `initialize`


@pytest.mark.timing
@pytest.mark.parametrize("profile", PROFILES)
async def test_a_transformers_model_opened_as_the_server_starts_shows_its_diagnostics_within_3_s(profile, tmp_path):
    pytest.importorskip("transformers")
    llama = next(case for case in CORPUS if case.id == "llama")
    llama.write(str(tmp_path / "ws"))
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}  # (no analysis kept from an earlier run to show first)
    async with running_server(profile, str(tmp_path / "ws"), server_env=env, wait_ready=False) as client:
        started = asyncio.get_running_loop().time()
        uri = client.open("llama.py")
        diags = await client.diagnostics_of(uri, 1)
        elapsed = asyncio.get_running_loop().time() - started
    assert chains(diags), [d.message for d in diags]  # (the analysis was the real one)
    assert elapsed <= time_limit(FIRST_OPEN_S), f"{elapsed:.2f} s from the open to the first diagnostics"
