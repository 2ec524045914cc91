"""`fuselens apply` and `restore` on the file as it is on disk: every byte they do not mean to change
stays (line endings, a byte-order mark, an encoding named by a coding cookie), `restore` gives back
exactly the bytes `apply` found, and two applies at once never lose an edit."""

from __future__ import annotations

import fcntl
import os
import pty
import shutil
import subprocess
import sys

import pytest
from pygls.exceptions import JsonRpcException

from conftest import example
from lsp_helpers import Client, example_text, server_fixture

_INSTALLED = os.path.join(os.path.dirname(sys.executable), "fuselens")
COMMAND = [_INSTALLED] if os.path.exists(_INSTALLED) else [sys.executable, "-m", "fuselens.cli.main"]
SMALL = ["--input-shape", "64,1024"]  # the example at a size that analyzes quickly


def fuselens(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*COMMAND, *args], capture_output=True, text=True, cwd=cwd, stdin=subprocess.DEVNULL, timeout=600
    )


def example_as(tmp_path, transform) -> tuple[str, bytes]:
    """examples/example_net.py, its bytes passed through `transform`, in a folder of its own."""
    with open(example("example_net.py"), "rb") as fh:
        data = transform(fh.read())
    path = tmp_path / "example_net.py"
    path.write_bytes(data)
    return str(path), data


def apply_then_restore(path: str) -> bytes:
    """The file's bytes after `apply`; checks that `restore` then gives back the bytes it had."""
    with open(path, "rb") as fh:
        before = fh.read()
    folder = os.path.dirname(path)
    applied = fuselens("apply", path, "--yes", "--no-check", *SMALL, cwd=folder)
    assert applied.returncode == 0 and "applied c0, c1, c2" in applied.stdout, applied.stdout + applied.stderr
    with open(path, "rb") as fh:
        after = fh.read()
    restored = fuselens("restore", path, "--yes", cwd=folder)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    with open(path, "rb") as fh:
        assert fh.read() == before  # byte for byte
    return after


def assert_kept(before: bytes, after: bytes) -> None:
    """Every line of `before` that no cluster of the example holds is in `after`, its ending as it was."""
    ours = after.splitlines(keepends=True)
    for line in before.splitlines(keepends=True):
        if b"x = " not in line and b"return" not in line:  # the clusters' lines (and a few others)
            assert line in ours, line


def test_a_crlf_file_keeps_its_line_endings_and_restores_byte_for_byte(tmp_path):
    path, before = example_as(tmp_path, lambda data: data.replace(b"\n", b"\r\n"))
    after = apply_then_restore(path)
    assert after.count(b"\n") == after.count(b"\r\n")  # every line apply wrote ends as the file's do
    assert b"cluster0(x)" in after
    assert_kept(before, after)


def test_a_file_with_a_byte_order_mark_keeps_it_and_restores_byte_for_byte(tmp_path):
    path, _ = example_as(tmp_path, lambda data: b"\xef\xbb\xbf" + data)
    after = apply_then_restore(path)
    assert after.startswith(b"\xef\xbb\xbf") and after.count(b"\xef\xbb\xbf") == 1
    assert b"cluster0(x)" in after


def test_a_latin_1_file_stays_latin_1_and_restores_byte_for_byte(tmp_path):
    cookie = "# -*- coding: latin-1 -*-\n# Modèle d'exemple, café compris\n".encode("latin-1")
    path, _ = example_as(tmp_path, lambda data: cookie + data)
    after = apply_then_restore(path)
    assert after.startswith(cookie)  # its accents as latin-1 bytes, not UTF-8
    compile(after, path, "exec")  # Python still reads it


def test_a_file_without_a_final_line_ending_restores_byte_for_byte(tmp_path):
    path, _ = example_as(tmp_path, lambda data: data.rstrip(b"\n"))
    after = apply_then_restore(path)
    assert not after.endswith(b"\n")


def test_a_file_with_mixed_line_endings_keeps_each_line_it_does_not_change(tmp_path):
    def mixed(data: bytes) -> bytes:
        lines = data.split(b"\n")
        return b"".join(line + (b"\r\n" if k % 2 else b"\n") for k, line in enumerate(lines[:-1]))

    path, before = example_as(tmp_path, mixed)
    folder = os.path.dirname(path)
    assert fuselens("apply", path, "--yes", "--no-check", *SMALL, cwd=folder).returncode == 0
    with open(path, "rb") as fh:
        assert_kept(before, fh.read())
    assert fuselens("restore", path, "--yes", cwd=folder).returncode == 0
    with open(path, "rb") as fh:
        assert_kept(before, fh.read())  # (the lines restored end as the file's first line does)


# ---- two applies at once ---------------------------------------------------------------------------


def _start_at_the_prompt(path: str, cluster: str) -> tuple[subprocess.Popen, int, bytes]:
    """`fuselens apply --cluster <cluster>` on a terminal of its own, waited for until it asks: it has read
    and analyzed the file, and shown its diff."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [*COMMAND, "apply", path, "--no-check", "--cluster", cluster, *SMALL],
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=os.path.dirname(path),
    )
    os.close(terminal)
    assert process.stdout is not None
    said = b""
    while b"apply these edits? [y/N]" not in said:
        chunk = os.read(process.stdout.fileno(), 65536)
        assert chunk, said.decode()
        said += chunk
    return process, controller, said


def _outcome(process: subprocess.Popen, controller: int, said: bytes) -> tuple[int, str]:
    assert process.stdout is not None
    said += process.stdout.read()
    process.wait(timeout=600)
    os.close(controller)
    return process.returncode, said.decode()


def _check_nothing_lost(path: str, outcomes: dict[str, tuple[int, str]]) -> None:
    """Each apply that said it applied its cluster has its kernel's call in the file; each other one
    said that the file changed since it read it, and failed."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    for cluster, (code, said) in outcomes.items():
        kernel = "cluster" + cluster[1:]
        if f"applied {cluster} to" in said:
            assert code == 0 and f"{kernel}(" in text, (cluster, said, text)
        else:
            assert code == 1, said
            assert "example_net.py changed on disk since it was read (another apply?): nothing was written" in said
    compile(text, path, "exec")


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(3))
def test_two_applies_answered_at_once_never_lose_an_edit(tmp_path, trial):
    """Both have read the file and wait at their prompt; both are told yes at once.  The one that writes
    second finds the first one's edit and refuses; before, both said "applied" and one edit was gone."""
    path = shutil.copy(example("example_net.py"), tmp_path / "example_net.py")
    first = _start_at_the_prompt(str(path), "c0")
    second = _start_at_the_prompt(str(path), "c2")
    for _, controller, _ in (first, second):
        os.write(controller, b"y\n")
    outcomes = {"c0": _outcome(*first), "c2": _outcome(*second)}
    _check_nothing_lost(str(path), outcomes)
    assert sum(code == 0 for code, _ in outcomes.values()) == 1  # both had read the file before either wrote


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(3))
def test_two_applies_started_at_once_never_lose_an_edit(tmp_path, trial):
    path = str(shutil.copy(example("example_net.py"), tmp_path / "example_net.py"))
    started = {
        cluster: subprocess.Popen(
            [*COMMAND, "apply", path, "--yes", "--no-check", "--cluster", cluster, *SMALL],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            cwd=tmp_path,
        )
        for cluster in ("c0", "c2")
    }
    outcomes = {}
    for cluster, process in started.items():
        said, _ = process.communicate(timeout=600)
        outcomes[cluster] = (process.returncode, said)
    _check_nothing_lost(path, outcomes)
    assert any(code == 0 for code, _ in outcomes.values())


# ---- the editor's kernel module, written while an apply writes -------------------------------------

client = server_fixture()


@pytest.mark.asyncio(loop_scope="module")
async def test_the_editors_kernel_module_is_written_under_the_models_lock(client: Client):
    """The quick fix's `fuselens.writeKernelModule` merges the module on disk and writes it under the lock
    `fuselens apply` holds while it writes the same model and module: held (here by the test, as an apply
    would), the command waits, then refuses, and writes nothing; free, it writes."""
    uri = client.open("locked_model.py", example_text())
    await client.diagnostics_of(uri, 1)
    module = client.path("locked_model_kernels.py")
    with open(client.path("locked_model.py"), "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(JsonRpcException, match=r"another program has been writing locked_model\.py"):
            await client.command("fuselens.writeKernelModule", uri, 1, ["c0"])
        assert not os.path.exists(module)
    written = await client.command("fuselens.writeKernelModule", uri, 1, ["c0"])
    assert written["path"] == module and os.path.isfile(module)
