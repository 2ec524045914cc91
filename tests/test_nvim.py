"""The Neovim plugin (editors/nvim) in a real, headless Neovim against the real server.

`tests/nvim/test_script.lua` drives Neovim the way a user would (open the file, hover,
run the "Validate all" lens, apply the quick fix through vim.lsp.buf.code_action) and
writes what it saw to a JSON file; these tests assert on that file. Neovim runs with a
minimal init (`tests/nvim/init.lua`: only the plugin) and a private HOME/XDG, so neither the
user's config nor a user-level fuselens trust file takes part.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import example

NVIM = os.environ.get("FUSELENS_NVIM") or shutil.which("nvim")  # FUSELENS_NVIM: try another build
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
pytestmark = pytest.mark.skipif(NVIM is None, reason="nvim is not on PATH (Debian: apt-get install -y neovim)")


def run_nvim(tmp_path, mode: str, trusted: bool) -> dict:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "pyproject.toml").write_text('[project]\nname = "ws"\n')  # the root marker
    model = workspace / "example_net.py"
    shutil.copy(example("example_net.py"), model)
    home = tmp_path / "home"
    results = tmp_path / "results.json"
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local/share"),
        "XDG_STATE_HOME": str(home / ".local/state"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "FUSELENS_PLUGIN": os.path.join(REPO, "editors", "nvim"),
        "FUSELENS_PYTHON": sys.executable,  # an interpreter with fuselens and torch: this one
        "FUSELENS_TRUSTED": str(workspace) if trusted else str(tmp_path / "elsewhere"),
        "FUSELENS_MODEL": str(model),
        "FUSELENS_RESULTS": str(results),
        "FUSELENS_MODE": mode,
    }
    proc = subprocess.run(
        [
            NVIM,
            "--headless",
            "-i",
            "NONE",
            "-u",
            os.path.join(HERE, "nvim", "init.lua"),
            "-c",
            f"luafile {os.path.join(HERE, 'nvim', 'test_script.lua')}",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert results.exists(), f"nvim wrote no results (exit {proc.returncode})\n{proc.stdout}\n{proc.stderr}"
    data = json.loads(results.read_text())
    data["_workspace"] = str(workspace)
    data["_output"] = proc.stdout + proc.stderr
    return data


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """One trusted Neovim session that goes through every step."""
    return run_nvim(tmp_path_factory.mktemp("nvim"), "full", trusted=True)


def _no_errors(session, *steps):
    for step in steps:
        assert step in session["steps"], f"step {step!r} failed: {session['errors'].get(step)}\n{session['_output']}"


def test_starts_the_server_with_trust_from_trusted_folders(session):
    _no_errors(session, "open")
    print("Neovim", session["nvim"])
    assert session["cmd"] == [sys.executable, "-m", "fuselens.cli.main", "serve", "--stdio"]
    assert os.path.realpath(session["root_dir"]) == os.path.realpath(session["_workspace"])
    assert session["workspace_trusted"] is True


def test_diagnostics_one_per_cluster(session):
    _no_errors(session, "diagnostics")
    clusters = [d for d in session["diagnostics"] if d["message"].startswith("fusable:")]
    assert [(d["lnum"], d["end_lnum"]) for d in clusters] == [(18, 20), (23, 25), (28, 30)]
    assert clusters[0]["message"].startswith("fusable: mul → relu → add, 384 MB → 128 MB (−67% DRAM traffic)")
    assert "gelu → sigmoid → mul" in clusters[1]["message"]
    assert "tanh → mul → softmax" in clusters[2]["message"]
    assert all(d["severity"] == 2 for d in clusters), "settings.severity = 'warning' reached the server"
    assert session["cluster_ids"] == ["c0", "c1", "c2"]
    assert session["status"] == "fuselens: 3 clusters"


def test_inlay_hints_where_neovim_has_them(session):
    _no_errors(session, "diagnostics")
    major, minor = (int(x) for x in session["nvim"].split(".")[:2])
    if (major, minor) < (0, 10):
        assert "inlay_hints" not in session  # nothing to show them with: the plugin leaves them off
        pytest.skip(f"Neovim {session['nvim']} has no inlay hints (0.10+)")
    assert session["inlay_hints"] == ["⚡ −256 MB", "⚡ −128 MB", "⚡ −128 MB"]


def test_hover_shows_the_cluster(session):
    _no_errors(session, "hover")
    hover = session["hover"]
    assert "c0 · elementwise · `cluster0` · ExampleNet" in hover
    assert "@triton.jit" in hover and "def _cluster0_kernel" in hover


def test_lens_runs_validation_with_progress(session):
    _no_errors(session, "codelens", "validate from the lens")
    titles = [lens["title"] for lens in session["lenses"]]
    assert titles[0].startswith("3 fusable clusters · 512 MB of 768 MB avoidable")
    assert {"Validate all", "Show kernels"} <= set(titles)
    assert all(lens["line"] == 11 for lens in session["lenses"])  # the class line
    validation = session["validation"]
    assert validation["mode"] == "interpret" and not validation.get("problems")
    assert validation["clusters"] == {"c0": "verified", "c1": "verified", "c2": "verified"}
    kinds = [p["kind"] for p in session["progress"]]
    assert kinds[0] == "begin" and kinds[-1] == "end" and "report" in kinds
    assert session["progress"][0]["title"] == "fuselens: validating c0, c1, c2"
    assert any("verified" in m for m in session["messages"]), "the server's summary reached the user"


def test_quick_fix_through_code_action(session):
    _no_errors(session, "quick fix")
    buffer = session["buffer"]
    assert "        x = cluster0(x)" in buffer
    assert "        x = x * 2.0" not in buffer
    assert "    from .example_net_kernels import cluster0" in buffer
    assert "    from example_net_kernels import cluster0" in buffer
    assert "        x = cluster0(x)" in session["model_on_disk"].splitlines()
    module = session["module"]
    assert "def cluster0(x):" in module and "@triton.jit" in module
    # Neovim (0.7.2, 0.12-dev) announces no documentChanges, so the server writes the module
    # itself (fuselens.writeKernelModule, run after the edit) rather than sending a CreateFile.
    assert session["module_on_disk_before_save"] is True


def test_untrusted_folder_is_not_analyzed(tmp_path):
    data = run_nvim(tmp_path, "untrusted", trusted=False)
    _no_errors(data, "open", "no analysis")
    assert data.get("workspace_trusted") is None, "not listed means 'not said', never 'trusted'"
    assert data["diagnostics"] == 0
    assert any("trusted_folders" in m for m in data["messages"]), data["messages"]
