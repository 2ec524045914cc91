"""The worker host runs a file's imports of installed packages before the file's job, never the user's.

A file opened for the first time has no analysis yet to say which library its model is built from;
its syntax tree does (`server/libraries.py::file_imports`).  The server's WorkerClient sends those
imports ahead of the job and the host runs the ones that name packages installed in a site-packages
folder (`worker/preload.py`), so that even the file's first job starts with its library imported.
Here a real host runs real jobs; the libraries are small packages in a temporary `site-packages`
folder on PYTHONPATH (as `pip install --target` leaves them), each writing down the pid of every
process that imports it, and the model's files write down what their job found imported.
"""

from __future__ import annotations

import asyncio
import os
import textwrap

import pytest
import pytest_asyncio

from fuselens.contracts.options import AnalyzeOptions
from fuselens.server.libraries import file_imports
from fuselens.server.workers import JobFailed, WorkerClient
from fuselens.worker.protocol import AnalyzeJob, Limits, ModuleImport

from conftest import chains, only_model

in_module_loop = pytest.mark.asyncio(loop_scope="module")  # the async tests share the module's worker

LIMITS = Limits(60.0, 2048)

# A library's module: it writes down who imports it, and holds a block of three fusable ops.
LIBRARY = """
    import os

    import torch
    import torch.nn as nn

    with open(os.path.join(os.path.dirname(__file__), "imports.log"), "a") as log:
        log.write(f"{{os.getpid()}}\\n")


    class Block(nn.Module):
        def forward(self, x):
            x = x * 2.0
            x = torch.{op}(x)
            return x + 1.0
    """
# A user's file built from `module`'s Block; it writes down whether its job found `module` imported,
# and whether Python's garbage collector was on as its code ran.
MODEL = """
    import gc
    import os
    import sys

    with open(os.path.join(os.path.dirname(os.path.realpath(__file__)), "found.txt"), "w") as fh:
        fh.write(str({module!r} in sys.modules))
    with open(os.path.join(os.path.dirname(os.path.realpath(__file__)), "collector.txt"), "w") as fh:
        fh.write(str(gc.isenabled()))

    import torch.nn as nn

    from {module} import Block


    class Net(nn.Module):  # fuselens: input=(64, 64)
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(x)
    """


def install(folder: str, name: str, op: str = "relu") -> None:
    """The library `name` as a package in `folder`."""
    package = os.path.join(folder, name)
    os.makedirs(package)
    with open(os.path.join(package, "__init__.py"), "w", encoding="utf-8") as fh:
        fh.write(textwrap.dedent(LIBRARY.format(op=op)).lstrip("\n"))


def importers(folder: str, name: str) -> list[int]:
    """The pids of the processes that imported the library `name` installed in `folder`, in order."""
    try:
        with open(os.path.join(folder, name, "imports.log"), encoding="utf-8") as fh:
            return [int(line) for line in fh.read().split()]
    except FileNotFoundError:
        return []


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> dict[str, str]:
    """Where the libraries lie: `installed`, a site-packages folder; `project`, a folder of the
    user's own packages (a checkout on PYTHONPATH, as an editable install puts it on the path)."""
    root = tmp_path_factory.mktemp("site")
    folders = {
        "installed": str(root / "prefix" / "lib" / "python3" / "site-packages"),
        "project": str(root / "my-project" / "src"),
    }
    for folder in folders.values():
        os.makedirs(folder)
    install(folders["installed"], "instlib")
    install(folders["installed"], "shadowed")
    install(folders["installed"], "crashlib")
    with open(os.path.join(folders["installed"], "crashlib", "__init__.py"), "a", encoding="utf-8") as fh:
        fh.write("\nimport ctypes\n\nctypes.string_at(0)  # a library whose import crashes the interpreter\n")
    install(folders["project"], "projlib")
    return folders


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def worker(site):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join(site.values()))  # (each host's environment comes from it)
        client = WorkerClient()
        await client.ensure_started()
        yield client
        await client.stop()


async def analyze(worker: WorkerClient, path, text: str):
    """The job of the file `path` with the text `text`, its imports sent ahead as the server does."""
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    job = AnalyzeJob(str(path), AnalyzeOptions(source_text=text))
    return await worker.run(job, LIMITS, imports=file_imports(text))


def model(module: str) -> str:
    return textwrap.dedent(MODEL.format(module=module)).lstrip("\n")


@in_module_loop
async def test_a_first_job_finds_the_files_installed_library_already_imported(worker, site, tmp_path):
    report = await analyze(worker, tmp_path / "models" / "net.py", model("instlib"))
    assert chains(only_model(report)) == ["mul → relu → add"]  # (the library's code, analyzed as ever)
    assert (tmp_path / "models" / "found.txt").read_text() == "True"  # the job started with it imported
    assert importers(site["installed"], "instlib") == [worker.info.pid]  # the host imported it, no job did


@in_module_loop
async def test_the_worker_host_never_imports_a_module_of_the_users_project(worker, site, tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    install(str(folder), "mylib", op="sigmoid")  # beside the model, as a project's own package is
    report = await analyze(worker, folder / "uses_mylib.py", model("mylib"))
    assert chains(only_model(report)) == ["mul → sigmoid → add"]
    assert (folder / "found.txt").read_text() == "False"
    assert worker.info.pid not in importers(str(folder), "mylib") and len(importers(str(folder), "mylib")) == 1

    report = await analyze(worker, folder / "uses_projlib.py", model("projlib"))  # on the path, not installed
    assert chains(only_model(report)) == ["mul → relu → add"]
    assert (folder / "found.txt").read_text() == "False"
    (job,) = importers(site["project"], "projlib")
    assert job != worker.info.pid


@in_module_loop
async def test_an_installed_package_the_models_folder_shadows_is_not_imported_for_it(worker, site, tmp_path):
    folder = tmp_path / "own"
    folder.mkdir()
    install(str(folder), "shadowed", op="tanh")  # the project's own package of the installed one's name
    report = await analyze(worker, folder / "uses_shadowed.py", model("shadowed"))
    assert chains(only_model(report)) == ["mul → tanh → add"]  # the project's, as Python would import it
    assert importers(site["installed"], "shadowed") == []  # neither the host nor the job ran the installed one
    assert len(importers(str(folder), "shadowed")) == 1


@in_module_loop
async def test_a_library_whose_import_crashes_the_host_costs_it_once(worker, site, tmp_path):
    path = tmp_path / "models" / "uses_crashlib.py"
    text = model("crashlib")
    starts = worker.starts
    with pytest.raises(JobFailed) as first:
        await analyze(worker, path, text)
    assert first.value.kind == "crash" and "exited unexpectedly" in str(first.value)
    # From then on its jobs import it themselves: the crash is theirs, at the file's import line, and
    # the host started again once stays up.
    for _ in range(2):
        with pytest.raises(JobFailed) as later:
            await analyze(worker, path, text)
        error = later.value.error
        assert (error.kind, error.line) == ("crash", text.split("\n").index("from crashlib import Block") + 1), error
        assert "SIGSEGV" in error.message
    assert worker.starts == starts + 1
    assert file_imports(text)[-1] == ModuleImport("crashlib", ["Block"])  # (what the host was asked first)


@pytest.mark.asyncio
async def test_a_job_sent_as_the_host_is_ready_runs_before_its_warm_up(site, tmp_path):
    """A file opened as the server starts does not wait for the host's warm-up (an analysis of its own
    model, over half a second on a laptop): its job runs first, and the host warms up once idle.  The
    host imports with the garbage collector off until then (`worker/collector.py`); the model's code
    runs with it on all the same, before the warm-up as after."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join(site.values()))
        fresh = WorkerClient()
        try:
            await fresh.ensure_started()
            report = await analyze(fresh, tmp_path / "models" / "net.py", model("instlib"))
            assert chains(only_model(report)) == ["mul → relu → add"]
            assert not [line for line in fresh.stderr_tail if "warmed up" in line], fresh.stderr_tail
            assert (tmp_path / "models" / "collector.txt").read_text() == "True"
            async with asyncio.timeout(60):
                while not [line for line in fresh.stderr_tail if "warmed up in" in line]:
                    await asyncio.sleep(0.05)  # (polling the host's log for the line, not a wait in its place)
            (tmp_path / "models" / "collector.txt").unlink()
            report = await analyze(fresh, tmp_path / "models" / "again.py", model("instlib"))
            assert chains(only_model(report)) == ["mul → relu → add"]
            assert (tmp_path / "models" / "collector.txt").read_text() == "True"
            assert fresh.starts == 1
        finally:
            await fresh.stop()


# ---- which imports a file names ---------------------------------------------------------------------

SOURCE = """
    from __future__ import annotations

    import os
    from typing import TYPE_CHECKING

    import numpy as np
    import torch.nn as nn
    from transformers import LlamaConfig, LlamaForCausalLM as Llama
    from transformers.models.llama import modeling_llama

    from . import sibling
    from .utils import helper

    try:
        import flash_attn
    except ImportError:
        from einops import rearrange
    if os.environ.get("X"):
        import timm
    else:
        import timm
    with open(os.devnull):
        import safetensors.torch
    if TYPE_CHECKING:
        import never_at_run_time
    else:
        import diffusers


    def build():
        import inside_a_function


    class Net(nn.Module):
        import inside_a_class
    """


def test_the_imports_named_are_those_importing_the_file_runs():
    assert file_imports(textwrap.dedent(SOURCE)) == [
        ModuleImport("numpy"),
        ModuleImport("transformers", ["LlamaConfig", "LlamaForCausalLM"]),
        ModuleImport("transformers.models.llama", ["modeling_llama"]),
        ModuleImport("flash_attn"),
        ModuleImport("einops", ["rearrange"]),
        ModuleImport("timm"),
        ModuleImport("safetensors.torch"),
        ModuleImport("diffusers"),
        ModuleImport("inside_a_class"),
    ]


@pytest.mark.parametrize("text", ["import transformers\ndef broken(:\n", "import a\x00\n", "x = (" * 1000 + "\n"])
def test_a_file_that_does_not_parse_names_no_imports(text: str):
    assert file_imports(text) == []
