"""What a job's code can reach outside its own process: never the server's or the worker host's
descriptors (reopened through /proc), never a module from a folder anyone may create in /tmp.

(tests/test_hostile_worker.py covers what the job forks and what it writes to its own descriptors.)
"""

from __future__ import annotations

import json
import os
import tempfile
import textwrap
import uuid

import pytest
import pytest_asyncio

from fuselens.contracts.options import AnalyzeOptions
from fuselens.server.host_process import scrubbed_environment
from fuselens.server.workers import JobFailed, WorkerClient
from fuselens.worker.protocol import AnalyzeJob, Limits

from conftest import chains, only_model
from lsp_helpers import example_text, make_workspace, running_server
from robust_helpers import fusable

in_module_loop = pytest.mark.asyncio(loop_scope="module")

LIMITS = Limits(60.0, 2048)
GOOD = ["mul → relu → add", "linear → gelu → sigmoid → mul", "tanh → mul → softmax"]


def with_prologue(prologue: str) -> str:
    """examples/example_net.py with `prologue` run right after its imports."""
    lines = example_text().split("\n")
    return "\n".join([*lines[:8], textwrap.dedent(prologue), *lines[8:]])


async def analyze(worker: WorkerClient, path, text: str):
    path.write_text(text)
    return await worker.run(AnalyzeJob(str(path), AnalyzeOptions(source_text=text)), LIMITS)


@pytest_asyncio.fixture(loop_scope="module")
async def own_worker():
    client = WorkerClient()
    await client.ensure_started()
    yield client
    await client.stop()


# ---- the descriptors of the processes that talk to the editor -------------------------------------

# The model's code, at import: every descriptor of the worker host (its parent) and of the language
# server (the host's parent), reopened through /proc and written with what either would say: a worker
# event that answers for a job, an LSP notification straight to the editor.  Each try is written down.
REOPENS = """
import os as _os

def _parent_of(pid):
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])

def _descriptors(pid):
    try:
        return sorted(int(fd) for fd in _os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return list(range(64))  # not listable: try them by number

_FORGED_EVENT = b'{"event":"done","id":1,"result":{"pong":true}}\\n'
_BODY = b'{"jsonrpc":"2.0","method":"window/showMessage","params":{"type":1,"message":"forged by the model"}}'
_FORGED_LSP = b"Content-Length: %d\\r\\n\\r\\n%s" % (len(_BODY), _BODY)
_host = _os.getppid()
with open(RECORD, "a") as _record:
    for _who, _pid, _data in (("host", _host, _FORGED_EVENT), ("server", _parent_of(_host), _FORGED_LSP)):
        for _fd in _descriptors(_pid):
            try:
                _opened = _os.open(f"/proc/{_pid}/fd/{_fd}", _os.O_WRONLY | _os.O_NONBLOCK)
            except OSError as _exc:
                _record.write(f"{_who} {_fd} refused {_exc.errno}\\n")
                continue
            try:
                _os.write(_opened, _data)
            except OSError:
                pass
            _os.close(_opened)
            _record.write(f"{_who} {_fd} opened\\n")
"""


async def test_the_model_cannot_reopen_the_servers_or_the_hosts_descriptors(tmp_path):
    """Nothing the model's code sends through /proc/<pid>/fd reaches the editor or answers a job: every
    reopening is refused, whoever runs the server (root included), and the file's real diagnostics
    arrive."""
    root = make_workspace(str(tmp_path / "ws"))
    record = tmp_path / "reopened"
    text = with_prologue(f"RECORD = {str(record)!r}\n{REOPENS}")
    async with running_server("visual-studio-code", root) as client:
        uri = client.open("reopens.py", text)
        diagnostics = await client.diagnostics_of(uri)
        await client.roundtrip()
        tries = [line.split() for line in record.read_text().splitlines()]
        assert {who for who, *_ in tries} == {"host", "server"}, tries  # it did try both
        assert [t for t in tries if t[2] == "opened"] == [], "a descriptor of the server or the host was reopened"
        assert client.messages_matching("forged") == []
        assert [chain for *_, chain in fusable(diagnostics)] == GOOD


# ---- the job's search path -----------------------------------------------------------------------

RECORDS_ITS_PATH = """
import json as _json, os as _os, sys as _sys
with open(RECORD, "w") as _fh:
    _json.dump({"path": _sys.path, "cwd": _os.getcwd()}, _fh)
"""


def planted(folder: str, name: str, marker) -> None:
    """A module `name` in `folder` that, imported, leaves `marker` behind."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{name}.py"), "w", encoding="utf-8") as fh:
        fh.write(f"open({str(marker)!r}, 'w').write('imported')\n")


@in_module_loop
async def test_no_deleted_temporary_folder_stays_on_a_jobs_path(own_worker, tmp_path):
    """The warm-up's folder (deleted, and free for anyone to create again in /tmp) is not on a later
    job's sys.path: a module planted in it, named like a standard module the host never imported,
    does not run when the model imports that name.  The job works in the model's folder."""
    record, marker = tmp_path / "path.json", tmp_path / "planted-ran"
    (tmp_path / "model").mkdir()
    model = tmp_path / "model" / "records.py"
    await analyze(own_worker, model, with_prologue(f"RECORD = {str(record)!r}\n{RECORDS_ITS_PATH}"))
    seen = json.loads(record.read_text())
    assert [p for p in seen["path"] if "fuselens-warm-" in p] == []
    assert os.path.realpath(seen["cwd"]) == os.path.realpath(model.parent)
    # The attack itself: every folder on that path that is gone is created again, with a module in it.
    recreated = [p for p in seen["path"] if p.startswith(tempfile.gettempdir()) and not os.path.exists(p)]
    try:
        for folder in recreated:
            planted(folder, "colorsys", marker)
        result = await analyze(own_worker, tmp_path / "model" / "imports.py", with_prologue("import colorsys"))
        assert chains(only_model(result)) == GOOD
        assert not marker.exists(), "a module planted in a deleted temporary folder ran in a job"
    finally:
        for folder in recreated:
            for name in os.listdir(folder):
                os.unlink(os.path.join(folder, name))
            os.rmdir(folder)


@in_module_loop
async def test_an_empty_pythonpath_entry_puts_no_shared_folder_on_the_path(monkeypatch, tmp_path):
    """`PYTHONPATH=$PYTHONPATH:/x` with PYTHONPATH unset starts with an empty entry, which Python reads
    as the working directory: no module planted in /tmp (or in the folder the editor started in)
    runs in a job."""
    name = f"fuselens_planted_{uuid.uuid4().hex[:12]}"
    marker = tmp_path / "planted-ran"
    started_in = tmp_path / "editor-cwd"
    shared = [tempfile.gettempdir(), str(started_in)]
    for folder in shared:
        planted(folder, name, marker)
    monkeypatch.setenv("PYTHONPATH", os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.chdir(started_in)
    worker = WorkerClient()
    try:
        await worker.ensure_started()
        text = with_prologue(f"try:\n    import {name}\nexcept ImportError:\n    pass\n")
        (tmp_path / "model").mkdir()
        assert chains(only_model(await analyze(worker, tmp_path / "model" / "imports.py", text))) == GOOD
        assert not marker.exists(), "a module planted in a shared folder ran in a job"
    except JobFailed as exc:
        pytest.fail(f"the job failed: {exc.error}")
    finally:
        await worker.stop()
        for folder in shared:
            os.unlink(os.path.join(folder, f"{name}.py"))


def test_the_worker_environment_keeps_only_absolute_search_path_entries():
    env = scrubbed_environment({"PYTHONPATH": f"{os.pathsep}/opt/lib{os.pathsep}relative", "LD_LIBRARY_PATH": ":"})
    assert env["PYTHONPATH"] == "/opt/lib"
    assert env["LD_LIBRARY_PATH"] == ""
