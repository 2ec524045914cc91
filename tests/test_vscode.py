"""The VS Code extension (editors/vscode) in a real VS Code against the real server.

The extension is packaged as a user would install it and put into a fresh code-server profile
whose settings point `fuselens.server.python` at this interpreter; `tests/vscode/test_script.mjs`
drives code-server in headless Chromium the way a user would (Ctrl+. on a diagnostic's line, a
save, a `git checkout` from outside the editor, the "Validate all" lens) and writes what the page
showed (the status bar, the Problems panel, the notifications, the results view) and what is on
disk to a JSON file; these tests assert on that file.

code-server is not installed by the test run: `editors/code-server/install.sh install` puts it in
~/.cache/fuselens-code-server (builds native modules, a few minutes); without it, or without Node
and Chromium, these tests skip, saying which is missing. CI does not install it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import example
from library_corpus import CORPUS
from lsp_helpers import time_limit

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
INSTALL = os.path.join(REPO, "editors", "code-server", "install.sh")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def _code_server() -> tuple[str | None, str]:
    """The code-server cache folder, or None and why it cannot be used."""
    if shutil.which("bash") is None:
        return None, "bash is not on PATH"
    probe = subprocess.run(
        ["bash", INSTALL, "check"],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "CHROMIUM": CHROMIUM},
    )
    if probe.returncode != 0:
        return None, probe.stderr.strip()
    return probe.stdout.strip(), ""


CACHE, WHY_NOT = _code_server()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(CACHE is None, reason=f"no VS Code to drive: {WHY_NOT}")]


@pytest.fixture(scope="module")
def vsix(tmp_path_factory) -> str:
    """The extension, compiled and packaged as a user installs it."""
    out = str(tmp_path_factory.mktemp("vsix") / "fuselens.vsix")
    proc = subprocess.run(
        ["bash", INSTALL, "package", out], capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 0 and os.path.exists(out), proc.stdout + proc.stderr
    return out


def run_vscode(tmp_path, vsix: str, mode: str, model: str, **extra_env: str) -> dict:
    """Run test_script.mjs in `mode` on the workspace holding `model`; `extra_env` goes to
    code-server and from it to the server."""
    results = tmp_path / "results.json"
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),  # the server's kernel cache and history: the test's own
        **extra_env,
    }
    command = [
        "node",
        os.path.join(HERE, "vscode", "test_script.mjs"),
        *("--mode", mode, "--cache", CACHE, "--chromium", CHROMIUM, "--vsix", vsix),
        *("--python", sys.executable, "--dir", str(tmp_path / "session"), "--model", model),
        *("--results", str(results)),
    ]
    # A process group of its own, stopped whole however the script ends: on a timeout, SIGTERM first
    # (the script then stops code-server's group: its extension host, and the server, which ends its worker).
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=1200)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        output = "timed out\n" + proc.communicate(timeout=60)[0]
    finally:
        with contextlib.suppress(ProcessLookupError):  # (nothing was left)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert results.exists(), f"the script wrote no results (exit {proc.returncode})\n{output}"
    data = json.loads(results.read_text())
    data["_output"] = output
    return data


def _steps(session: dict, *names: str) -> None:
    for name in names:
        assert name in session["steps"], f"step {name!r} failed: {session['errors']}\n{session['_output'][-4000:]}"


def _fusable(rows: list[str]) -> list[str]:
    """The Problems panel's cluster diagnostics (not the files' rows, nor their related information)."""
    return [row for row in rows if row.startswith("fusable:")]


@pytest.fixture(scope="module")
def library_session(tmp_path_factory, vsix):
    """The corpus' transformers Llama: the quick fix of its RMSNorm (in the library's code), the model
    saved, then the quick fix of its MLP."""
    pytest.importorskip("transformers", exc_type=ImportError)
    tmp_path = tmp_path_factory.mktemp("vscode-library")
    llama = next(case for case in CORPUS if case.id == "llama")
    model = llama.write(str(tmp_path / "ws"))
    return run_vscode(tmp_path, vsix, "library", model, HF_HUB_OFFLINE="1")


def test_library_quick_fix_from_the_lightbulb_menu(library_session):
    _steps(library_session, "library diagnostics", "first library fix")
    titles = library_session["action_titles"]
    norm = [t for t in titles if "LlamaRMSNorm.forward (library code)" in t]
    assert len(norm) == 1 and norm[0].startswith("Fuse pow → mean → "), titles
    assert any(re.fullmatch(r"Fuse all \d+ applicable clusters in \S+", t) for t in titles), titles
    model = library_session["model_on_disk"].splitlines()
    assert "    from .llama_kernels import install" in model and "    from llama_kernels import install" in model
    assert any(line.startswith("install()  # fused kernels inside the library's code") for line in model), model
    module = library_session["first_module"]
    assert "# ---- library patch: transformers.models.llama.modeling_llama.LlamaRMSNorm.forward: " in module
    assert "\ndef install():" in module


def test_two_library_fixes_in_a_row_are_both_on_disk_without_saving_the_module(library_session):
    """The second fix (the kernel module exists by then) reaches the module on disk though nothing
    but the model was saved, and no editor is left for the user to save."""
    _steps(library_session, "first library fix", "analysis after saving", "second library fix")
    module = library_session["second_module"]
    assert "modeling_llama.LlamaRMSNorm.forward: " in module and "modeling_llama.LlamaMLP.forward: " in module
    assert module.count("# ---- library patch: ") == 2
    assert library_session["dirty_after_second"] == [] and library_session["unsaved_after_second"] == 0
    assert "llama_kernels.py" not in library_session["tabs"]  # never opened for the user to save
    model = library_session["model_after_second"]
    assert model.count("install()  # fused kernels inside the library's code") == 1, model


def test_each_library_fix_takes_its_clusters_off_the_problems_panel(library_session):
    _steps(library_session, "library diagnostics", "analysis after saving", "second library fix")
    before, between, after = (library_session[f"clusters_{when}"] for when in ("before", "between", "after"))
    print(f"clusters in the status bar: {before} → {between} → {after}")
    # The norm's patch takes its cluster (and the decoder layer's, around the same norm), the MLP's one more.
    assert before > between and after == between - 1
    rows = {when: _fusable(library_session[f"problems_{when}"]) for when in ("before", "between", "after")}
    assert any("patch of LlamaRMSNorm.forward (" in row for row in rows["before"]), rows["before"]
    assert not any("patch of LlamaRMSNorm.forward (" in row for row in rows["between"]), rows["between"]
    assert any("patch of LlamaMLP.forward (" in row for row in rows["between"]), rows["between"]
    assert not any("patch of LlamaMLP.forward (" in row for row in rows["after"]), rows["after"]
    assert len(rows["before"]) == before and len(rows["between"]) == between and len(rows["after"]) == after


@pytest.fixture(scope="module")
def checkout_session(tmp_path_factory, vsix):
    """example_net.py in a git repository: a syntax error saved, then `git checkout` of the file from
    outside the editor; then a validation that cannot check the whole model."""
    tmp_path = tmp_path_factory.mktemp("vscode-checkout")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "pyproject.toml").write_text('[project]\nname = "ws"\n')
    model = workspace / "example_net.py"
    shutil.copy(example("example_net.py"), model)
    git = ["git", "-C", str(workspace), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "a model"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    return run_vscode(tmp_path, vsix, "checkout", str(model))


def test_a_checkout_refreshes_the_problems_panel(checkout_session):
    """The syntax error listed in the Problems panel goes once VS Code reloads the file checked out,
    and the clusters' diagnostics are back."""
    _steps(checkout_session, "diagnostics", "syntax error saved", "checkout")
    # (what a file not saved looks like, to the checks of the library session)
    assert (
        checkout_session["dirty_before_saving"] == ["example_net.py"] and checkout_session["unsaved_before_saving"] == 1
    )
    assert "        x = F.relu(x\n" in checkout_session["on_disk_with_the_error"]
    assert checkout_session["status_with_the_error"] == "fuselens: syntax error"
    assert _fusable(checkout_session["problems_with_the_error"]) == []
    assert checkout_session["status_after_checkout"] == "fuselens: 3 clusters"
    rows = checkout_session["problems_after_checkout"]
    assert len(_fusable(rows)) == 3 and not any("syntax" in row.lower() for row in rows), rows
    assert "x = F.relu(x)" in checkout_session["editor_after_checkout"]
    print(f"git checkout → fresh diagnostics in VS Code: {checkout_session['checkout_seconds']:.2f} s")


@pytest.mark.timing
def test_a_checkout_refreshes_the_problems_panel_within_a_second(checkout_session):
    _steps(checkout_session, "checkout")
    assert checkout_session["checkout_seconds"] < time_limit(1.0)


def test_a_validation_that_ends_in_an_error_tells_why(checkout_session):
    """The whole-model check cannot run (`example_net_kernels.py` is the user's own file): the
    notification and the results view give the reason, not only a pointer to the log."""
    _steps(checkout_session, "validation error")
    reason = "example_net_kernels.py exists and was not written by fuselens"
    told = [n for n in checkout_session["notifications"] if "ExampleNet as a whole: error" in n]
    assert len(told) == 1 and reason in told[0], checkout_session["notifications"]
    text = checkout_session["results_text"]
    assert any(
        line.startswith("whole model with c0, c1, c2 applied: error (") and reason in line for line in text.splitlines()
    ), text
