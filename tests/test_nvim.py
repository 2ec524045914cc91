"""The Neovim plugin (editors/nvim) in a real, headless Neovim against the real server.

`tests/nvim/test_script.lua` drives Neovim the way a user would (open the file, hover,
run the "Validate all" lens, apply the quick fix through vim.lsp.buf.code_action) and
writes what it saw to a JSON file; these tests assert on that file. A second session does the
same with a transformers model, whose clusters live in the library's code. Neovim runs with a
minimal init (`tests/nvim/init.lua`: only the plugin) and a private HOME/XDG, so neither the
user's config nor a user-level fuselens trust file takes part.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
from urllib.parse import unquote, urlparse

import pytest

from conftest import example
from lsp_helpers import time_limit

NVIM = os.environ.get("FUSELENS_NVIM") or shutil.which("nvim")  # FUSELENS_NVIM: try another build
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
pytestmark = pytest.mark.skipif(NVIM is None, reason="nvim is not on PATH (Debian: apt-get install -y neovim)")


def run_nvim(tmp_path, mode: str, trusted: bool, files: dict[str, str] | None = None, **extra_env: str) -> dict:
    """Run test_script.lua in `mode` on a workspace with `files` (name -> text; the first is the one
    opened), example_net.py when none; `extra_env` goes to Neovim and from it to the server."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "pyproject.toml").write_text('[project]\nname = "ws"\n')  # the root marker
    if files:
        for name, text in files.items():
            (workspace / name).write_text(text)
        model = workspace / next(iter(files))
    else:
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
        **extra_env,
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
            # A script that does not load or raises outside its steps quits with the error, rather
            # than leaving headless Neovim waiting for the timeout.
            f"lua local ok, err = pcall(dofile, {json.dumps(os.path.join(HERE, 'nvim', 'test_script.lua'))})"
            " if not ok then io.stderr:write(tostring(err) .. '\\n') vim.cmd('cquit 3') end",
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


EARLIER_RUN = "| 2025-01-31 12:03 UTC | NVIDIA H200 | 2.13.0 | — | 12.5 µs | 12.5 µs | 12.5 µs | — |"


def keep_an_earlier_run(tmp_path) -> None:
    """A validation of the session's model on a GPU, as if run before, in the session's cache folder
    (run_nvim's XDG_CACHE_HOME), where the server keeps each file's history."""
    from datetime import UTC, datetime

    from fuselens.contracts.validation import ClusterCheck, ModelValidation, Timing, ValidationReport
    from fuselens.server import history

    model = str(tmp_path / "ws" / "example_net.py")
    checks = [ClusterCheck(f"c{i}", f"cluster{i}", "verified", timing=Timing(fused_us=12.5)) for i in range(3)]
    report = ValidationReport(
        model,
        "cuda",
        "NVIDIA H200",
        [ModelValidation("ExampleNet", [[16384, 1024]], ["float32"], checks)],
        versions={"torch": "2.13.0"},
    )
    cache = os.environ["XDG_CACHE_HOME"]
    os.environ["XDG_CACHE_HOME"] = str(tmp_path / "home" / ".cache")
    try:
        history.record(model, report, print, now=datetime(2025, 1, 31, 12, 3, tzinfo=UTC))
    finally:
        os.environ["XDG_CACHE_HOME"] = cache


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """One trusted Neovim session that goes through every step, on a file validated once before."""
    tmp_path = tmp_path_factory.mktemp("nvim")
    keep_an_earlier_run(tmp_path)
    return run_nvim(tmp_path, "full", trusted=True)


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
    assert [(d["lnum"], d["end_lnum"]) for d in clusters] == [(18, 20), (22, 25), (28, 30)]
    assert clusters[0]["message"].startswith("fusable: mul → relu → add, 384 MB → 128 MB (−67% DRAM traffic)")
    assert "linear → gelu → sigmoid → mul" in clusters[1]["message"]
    assert "tanh → mul → softmax" in clusters[2]["message"]
    assert all(d["severity"] == 2 for d in clusters), "settings.severity = 'warning' reached the server"
    assert session["cluster_ids"] == ["c0", "c1", "c2"]
    assert session["status"] == "fuselens: 3 clusters"


def test_the_statusline_says_analyzing_until_the_diagnostics_come(session):
    _no_errors(session, "diagnostics")
    drawn = session["statuslines_at_open"]  # every text the statusline was drawn with, in order
    assert "fuselens: analyzing" in drawn and drawn[-1] == "fuselens: 3 clusters", drawn
    assert drawn.index("fuselens: analyzing") < drawn.index("fuselens: 3 clusters"), drawn


def test_the_statusline_names_a_syntax_error(session):
    _no_errors(session, "syntax error")
    assert session["syntax_status"] == "fuselens: syntax error"


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
    assert "`mul` 18 → `relu` 19 → `add` 20" in hover  # compact: the ops, and a link to the kernel
    assert "@triton.jit" not in hover
    window = session["hover_window"]
    assert window["width"] <= 100 and window["height"] <= 30, window  # the plugin's size cap
    major, minor = (int(x) for x in session["nvim"].split(".")[:2])
    if (major, minor) < (0, 11):  # (0.11+ draws its own float, bordered by 'winborder')
        assert window["bordered"], window


def test_the_hover_reads_as_text(session):
    """The float shows the markdown as text: no `###` before the cluster's line, and the kernel link as
    its label only. Its address (0.7 showed it whole; 0.11 hid it, and the rows it wrapped onto stayed
    blank) is gone, and the summary with the link takes one row. Lines break between words."""
    _no_errors(session, "hover")
    lines = session["hover"].split("\n")
    window = session["hover_window"]
    assert lines[0].startswith("**⚡ c0 · elementwise · `cluster0` · ExampleNet**"), lines[0]
    assert lines[1].endswith(" · Open the kernel"), lines[1]
    assert window["line_widths"][1] <= window["width"], window
    assert "command:" not in session["hover"] and "](" not in session["hover"]
    assert window["linebreak"], window


def test_k_shows_the_fuselens_hover(session):
    """K in the model's buffer: the hover (before 0.10 Neovim left K to 'keywordprg', pydoc here)."""
    _no_errors(session, "K")
    assert session["hover_from_k"] == session["hover"]


def test_the_hover_s_kernel_link_opens_the_kernel(session):
    """K twice (into the float), then <CR> on "Open the kernel": the cluster's kernel, in the read-only
    view the server writes, at its definition; the float is gone."""
    _no_errors(session, "open the kernel from the hover")
    view = session["kernel_view"]
    assert view["path"].endswith("/kernels/example_net_cluster0.py"), view
    assert os.stat(view["path"]).st_mode & 0o222 == 0 and view["readonly"], view
    assert view["line"] == "def cluster0(x):" and not view["floats"], view


def test_lens_runs_validation_with_progress(session):
    _no_errors(session, "codelens", "validate from the lens")
    titles = [lens["title"] for lens in session["lenses"]]
    assert titles[0].startswith("3 fusable clusters · 576 MB of 866 MB avoidable")
    assert {"Validate all", "Show kernels"} <= set(titles)
    assert all(lens["line"] == 11 for lens in session["lenses"])  # the class line
    validation = session["validation"]
    assert validation["mode"] == "interpret" and not validation.get("problems")
    assert validation["clusters"] == {"c0": "verified", "c1": "verified", "c2": "verified"}
    kinds = [p["kind"] for p in session["progress"]]
    assert kinds[0] == "begin" and kinds[-1] == "end" and "report" in kinds
    assert session["progress"][0]["title"] == "fuselens: validating c0, c1, c2"
    assert any("verified" in m for m in session["messages"]), "the server's summary reached the user"


def _percentages(statuslines: list[str], title: str) -> list[int]:
    return [int(m[1]) for line in statuslines if (m := re.fullmatch(re.escape(title) + r" (\d+)%", line))]


def test_the_statusline_is_drawn_again_as_a_validation_moves(session):
    """A statusline calling `status()` is redrawn at each step of the validation, which moves: not a
    status that stays as it was until something else redraws the screen."""
    _no_errors(session, "validate from the lens")
    drawn = session["statuslines_validating"]
    assert drawn[0] == "fuselens: validating…", drawn  # at once, before the server's first progress
    percentages = _percentages(drawn, "fuselens: validating c0, c1, c2")
    assert [p for p in percentages if 0 < p < 100], drawn
    assert percentages == sorted(percentages), drawn
    assert drawn[-1] == "fuselens: 3 clusters", drawn


def test_lenses_are_drawn_above_the_class_line_in_full(session):
    """The lenses sit on a virtual line of their own above the class line (not after its
    `# fuselens:` comment), their whole text there: wrapped at a separator in an 80-column window,
    on one line again once the editor is 200 columns wide."""
    _no_errors(session, "codelens", "lens drawing")
    full = " | ".join(lens["title"] for lens in session["lenses"])
    assert full.startswith("3 fusable clusters · 576 MB of 866 MB avoidable · 3 applicable | Validate all")
    narrow, wide = session["lens_drawing"]
    for drawing in (narrow, wide):
        assert [(mark["line"], mark["above"]) for mark in drawing["drawn"]] == [(11, True)]  # the class line
        assert drawing["at_line_end"] == [], "nothing is drawn after the class line's comment"
        rows = drawing["drawn"][0]["rows"]
        assert all(len(row) <= drawing["width"] for row in rows), rows
        assert " ".join(" ".join(row.split()) for row in rows) == full  # every word, in order
    assert narrow["width"] == 80 and len(narrow["drawn"][0]["rows"]) == 2, narrow
    assert narrow["drawn"][0]["rows"][0].endswith(("·", "|"))  # broken after a separator, not mid-word
    assert wide["width"] == 200 and wide["drawn"][0]["rows"] == [full], wide


def test_the_results_view_shows_the_validation_table(session):
    _no_errors(session, "results view")
    view = session["results_view"]
    assert view["filetype"] == "markdown" and not view["modifiable"]  # a scratch view, not a file to edit
    lines = view["lines"]
    assert lines[0].startswith("### ExampleNet at ") and "Triton interpreter" in lines[0]
    assert "| cluster | ops | status | max abs err | backward | eager µs | torch.compile (default) µs |" in lines[2]
    rows = [line for line in lines if re.match(r"\| c\d+ \|", line)]
    assert [row.split(" | ")[2] for row in rows] == ["verified"] * 3, rows
    assert all(row.split(" | ")[4].startswith("verified ") for row in rows), rows  # each backward kernel too
    assert rows[0].startswith("| c0 | mul → relu → add | verified | ")


def test_the_results_view_lists_the_earlier_runs_of_the_file(session):
    """Before any validation in the session, :FuselensResults shows the run the server kept; after
    one, the new table with the earlier runs under it (each cluster's fused µs or max error)."""
    _no_errors(session, "results before validating", "results view")
    kept = session["kept_results"]
    assert kept["lines"][0] == "### ExampleNet at 16384×1024 float32, on NVIDIA H200" and not kept["modifiable"]
    lines = session["results_view"]["lines"]
    at = lines.index("#### Earlier runs of this file")
    assert lines[at + 2] == "| run | device | torch | revision | c0 | c1 | c2 | whole model |"
    latest = lines[at + 4]
    assert latest.startswith("| latest | Triton interpreter | ") and latest.count("| err ") == 3, latest
    assert lines[at + 5] == EARLIER_RUN


def test_a_profile_of_another_file_is_that_file_s_status_lens_and_results(session):
    """The Profile lens of a second file: the progress shows in that file's status (the validated one
    keeps its own), the lens is drawn once and gives the measured time, and :FuselensResults shows the
    profile there and the validation in the validated file."""
    _no_errors(session, "validate from the lens", "profile another file")
    percentages = _percentages(session["profile_statuslines"], "fuselens: profiling ExampleNet")
    assert [p for p in percentages if 0 < p < 100], session["profile_statuslines"]
    assert set(session["validated_status_while_profiling"]) == {"fuselens: 3 clusters"}
    drawing = session["profile_lens_drawing"]
    assert drawing["at_line_end"] == [], "drawn once: not also by Neovim's own lens display"
    assert [(mark["line"], mark["above"]) for mark in drawing["drawn"]] == [(11, True)]
    assert "◔ " in " ".join(drawing["drawn"][0]["rows"])  # the lens now gives the measured time
    profile = session["profile_results"]
    assert profile["name"].startswith("fuselens://results/") and profile["name"].endswith("/other_net.py"), profile
    assert profile["lines"][0].startswith("### ExampleNet at 512×1024: where the time of a forward goes"), profile
    validated = session["validated_results"]
    assert validated["name"].startswith("fuselens://results/") and validated["name"].endswith("/example_net.py")
    assert validated["lines"][0].startswith("### ExampleNet at ") and "Triton interpreter" in validated["lines"][0]


def test_a_validation_and_a_profile_at_once_are_their_file_s_status_only(session):
    """Both started from one file's lenses before either ended: the other open file's status went on
    naming its clusters (it showed this file's profile), and this file's said it worked until both
    answers were in."""
    _no_errors(session, "validate and profile one file at once")
    seen = session["statuses_with_both"]
    assert seen["other"] == ["fuselens: 3 clusters"], seen
    working = seen["validated"][:-1]
    assert working and all(re.match(r"fuselens: (validating|profiling)", text) for text in working), seen
    assert seen["validated"][-1] == "fuselens: 3 clusters", seen


def test_quick_fix_through_code_action(session):
    _no_errors(session, "quick fix")
    buffer = session["buffer"]
    assert "        if cluster0.fits(x):" in buffer and "            x = cluster0(x)" in buffer
    # the lines stay, for the calls the kernel does not fit
    assert "        x = x * 2.0" not in buffer and "            x = x * 2.0" in buffer
    assert "    from .example_net_kernels import cluster0" in buffer
    assert "    from example_net_kernels import cluster0" in buffer
    assert "            x = cluster0(x)" in session["model_on_disk"].splitlines()
    module = session["module"]
    assert "def cluster0(x):" in module and "@triton.jit" in module
    # Neovim (0.7.2, 0.12-dev) announces no documentChanges, so the server writes the module
    # itself (fuselens.writeKernelModule, run after the edit) rather than sending a CreateFile.
    assert session["module_on_disk_before_save"] is True


SLOW = """import time

import torch.nn as nn


class Slow(nn.Module):  # fuselens: input=(8, 8)
    def forward(self, x):
        time.sleep(120)
        return x * 2.0 + 1.0
"""


def test_an_analysis_past_its_time_limit_says_so_in_the_statusline(tmp_path):
    data = run_nvim(tmp_path, "timeout", trusted=True, files={"slow.py": SLOW}, FUSELENS_ANALYSIS_TIMEOUT="5")
    _no_errors(data, "open", "analysis timed out")
    assert data["status"] == "fuselens: analysis timed out"  # not "0 clusters": nothing was analyzed
    assert data["statuslines"][-2:] == ["fuselens: analyzing", "fuselens: analysis timed out"], data["statuslines"]


def test_untrusted_folder_is_not_analyzed(tmp_path):
    data = run_nvim(tmp_path, "untrusted", trusted=False)
    _no_errors(data, "open", "no analysis")
    assert data.get("workspace_trusted") is None, "not listed means 'not said', never 'trusted'"
    assert data["diagnostics"] == 0
    assert any("trusted_folders" in m for m in data["messages"]), data["messages"]


@pytest.fixture(scope="module")
def checkout_session(tmp_path_factory):
    """A model in a git repository: a syntax error saved, then `git checkout` of the file from Neovim;
    then a validation that cannot check the whole model."""
    return run_nvim(tmp_path_factory.mktemp("nvim-checkout"), "checkout", trusted=True)


def test_a_checkout_refreshes_the_diagnostics(checkout_session):
    """The old syntax error goes as soon as Neovim reloads the file checked out, and the clusters are back."""
    _no_errors(checkout_session, "syntax error saved", "checkout")
    assert checkout_session["status_with_the_error"] == "fuselens: syntax error"
    assert checkout_session["status_after_checkout"] == "fuselens: 3 clusters"
    assert "        x = F.relu(x)" in checkout_session["buffer_after_checkout"]
    print(f"git checkout → fresh diagnostics in Neovim: {checkout_session['checkout_seconds']:.2f} s")


@pytest.mark.timing
def test_a_checkout_refreshes_the_diagnostics_within_a_second(checkout_session):
    _no_errors(checkout_session, "checkout")
    assert checkout_session["checkout_seconds"] < time_limit(1.0)


def test_a_validation_that_ends_in_an_error_tells_why(checkout_session):
    """The whole-model check cannot run (`example_net_kernels.py` is the user's own file): the message
    the user sees, and the results view, give the reason."""
    _no_errors(checkout_session, "validation error")
    reason = "example_net_kernels.py exists and was not written by fuselens"
    summaries = [m for m in checkout_session["validation_messages"] if "ExampleNet as a whole: error" in m]
    assert len(summaries) == 1 and reason in summaries[0], checkout_session["validation_messages"]
    lines = checkout_session["results_lines"]
    assert any(line.startswith("whole model with c0, c1, c2 applied: error (") and reason in line for line in lines)


LLAMA = """from transformers import LlamaConfig, LlamaForCausalLM

config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
model = LlamaForCausalLM(config)  # fuselens: input=(2, 16)
"""
MODEL_LINE = 5  # model = LlamaForCausalLM(config), 1-based as Neovim's results give it
RMSNORM = "LlamaRMSNorm.forward (library code)"


@pytest.fixture(scope="module")
def library_session(tmp_path_factory):
    """One trusted Neovim session on a transformers model: diagnostics, hover, the quick fix of a
    cluster in transformers' code, and the analysis after saving."""
    pytest.importorskip("transformers", exc_type=ImportError)  # not installed, or not importable here
    tmp_path = tmp_path_factory.mktemp("nvim-library")
    return run_nvim(tmp_path, "library", trusted=True, files={"llama_user.py": LLAMA}, HF_HUB_OFFLINE="1")


def _modeling_llama() -> tuple[str, list[str]]:
    """transformers' modeling_llama.py (its real path) and its lines."""
    import transformers.models.llama.modeling_llama as modeling_llama

    path = os.path.realpath(modeling_llama.__file__)
    with open(path, encoding="utf-8") as fh:
        return path, fh.read().splitlines()


def _uri_path(uri: str) -> str:
    parsed = urlparse(uri)
    assert parsed.scheme == "file", uri
    return os.path.realpath(unquote(parsed.path))


def test_library_diagnostics_on_the_model_line_with_links(library_session):
    _no_errors(library_session, "open", "library diagnostics")
    assert library_session["workspace_trusted"] is True
    diagnostics = library_session["diagnostics"]
    assert diagnostics and all(d["lnum"] == d["end_lnum"] == MODEL_LINE for d in diagnostics), diagnostics
    assert all(d["severity"] != 1 for d in diagnostics), diagnostics  # no error
    clusters = [d for d in diagnostics if d["message"].startswith("fusable:")]
    assert clusters and all("modeling_llama.py" in d["message"] for d in clusters), diagnostics
    # the norm's cluster says how it applies: as a patch of the library's function, at its file and line
    norm = [d for d in clusters if "applies as a patch of LlamaRMSNorm.forward (" in d["message"]]
    assert len(norm) == 1 and norm[0]["message"].startswith("fusable: pow → mean → add → rsqrt → mul → mul"), clusters

    path, library = _modeling_llama()
    linked = [r for d in diagnostics for r in d["related"] if _uri_path(r["uri"]) == path]
    assert linked, [d["related"] for d in diagnostics]
    for r in linked:
        assert r["uri"].endswith("/transformers/models/llama/modeling_llama.py"), r
        line = r["range"]["start"]["line"]  # 0-based
        assert 0 <= line < len(library) and library[line].strip(), r
    # The norm's own link: "in transformers/models/llama/modeling_llama.py:65–67 (LlamaRMSNorm.forward)"
    first = norm[0]["related"][0]
    assert _uri_path(first["uri"]) == path
    said = re.fullmatch(
        r"in transformers/models/llama/modeling_llama\.py:(\d+)–(\d+) \(LlamaRMSNorm\.forward\)", first["message"]
    )
    assert said, first
    start, end = first["range"]["start"], first["range"]["end"]  # 0-based; the end is the next line's start
    assert (start["line"] + 1, end["line"]) == (int(said[1]), int(said[2])), first
    assert library[start["line"]].strip() == "variance = hidden_states.pow(2).mean(-1, keepdim=True)"


def test_library_hover_points_into_modeling_llama(library_session):
    _no_errors(library_session, "library hover")
    hover = library_session["hover"]
    _, library = _modeling_llama()
    # It opens with one cluster, "in transformers/models/llama/modeling_llama.py line 147
    # (apply_rotary_pos_emb)", and its lines as they read there ...
    spans = re.findall(r"transformers/models/llama/modeling_llama\.py\W* lines? (\d+)(?:–(\d+))? \W*(\w[\w.]*)", hover)
    assert spans, hover
    first, last, _function = spans[0]
    code = [line.strip() for line in library[int(first) - 1 : int(last or first)] if line.strip()]
    assert code and all(line in hover for line in code), (code, hover)
    # ... then each other cluster of the line, the norm's among them, in a line with its kernel's link.
    norm = r"- \*\*c\d+\*\* · reduction · `LlamaRMSNorm\.forward` · .* · Open the kernel\n"
    assert re.search(norm, hover + "\n"), hover


def test_library_code_actions_offer_the_norm_and_all(library_session):
    _no_errors(library_session, "library quick fix")
    titles = library_session["action_titles"]
    norm = [t for t in titles if RMSNORM in t]
    assert len(norm) == 1, titles
    assert re.fullmatch(
        r"Fuse pow → mean → .* in LlamaRMSNorm\.forward \(library code\) into Triton kernel "
        r"cluster\d+, installed at run time",
        norm[0],
    ), norm
    assert any(re.fullmatch(r"Fuse all \d+ applicable clusters in \S+", t) for t in titles), titles


def test_library_quick_fix_installs_the_patch(library_session):
    _no_errors(library_session, "library quick fix")
    buffer = library_session["buffer"]
    assert "    from .llama_user_kernels import install" in buffer
    assert "    from llama_user_kernels import install" in buffer
    assert any(line.startswith("install()  # fused kernels inside the library's code") for line in buffer), buffer
    assert [line for line in buffer if line.strip() and line not in LLAMA.splitlines()] == [  # nothing else changed
        "try:  # the fused kernels beside this file, imported as a package's module or by a script",
        "    from .llama_user_kernels import install",
        "except ImportError:",
        "    from llama_user_kernels import install",
        "install()  # fused kernels inside the library's code (the kernel module's uninstall() undoes it)",
    ]
    assert library_session["model_on_disk"].splitlines() == buffer  # saved
    # Neovim 0.7.2 announces no documentChanges, so the server writes the module itself
    # (fuselens.writeKernelModule, run after the edit) rather than sending a CreateFile.
    assert library_session["module_on_disk_before_save"] is True
    module = library_session["module"]  # (the module on disk once the model was saved)
    assert "# ---- library patch: transformers.models.llama.modeling_llama.LlamaRMSNorm.forward: " in module
    assert "\ndef install():" in module
    assert module.count("# ---- library patch: ") == 1  # only the chosen cluster


def test_library_analysis_after_saving(library_session):
    _no_errors(library_session, "analysis after saving")
    assert library_session["server_running"] is True
    diagnostics = library_session["after_save"]["diagnostics"]
    assert diagnostics, library_session["after_save"]
    assert all(d["severity"] != 1 for d in diagnostics), diagnostics  # no error: the patched file analyzes
    model_line = 1 + library_session["buffer"].index("model = LlamaForCausalLM(config)  # fuselens: input=(2, 16)")
    assert all(d["line"] == model_line for d in diagnostics), diagnostics  # the model's line, moved down
    # The patched norm runs one kernel: its cluster is no longer there to fuse.
    assert not [d for d in diagnostics if "(LlamaRMSNorm.forward)" in d["message"]], diagnostics


def test_a_second_library_patch_lands_on_disk_without_saving_it(library_session):
    """The kernel module exists after the first patch: the second (LlamaMLP's) reaches it on disk all
    the same, with no buffer left to save, and the analysis that follows has one cluster fewer."""
    _no_errors(library_session, "analysis after saving", "second library quick fix")
    module = library_session["second_module"]
    assert "modeling_llama.LlamaRMSNorm.forward: " in module and "modeling_llama.LlamaMLP.forward: " in module
    assert module.count("# ---- library patch: ") == 2
    assert library_session["modified_after_second"] == []
    after = library_session["after_second"]["diagnostics"]
    assert after and not any("patch of LlamaMLP.forward (" in d["message"] for d in after), after
    before = int(re.fullmatch(r"fuselens: (\d+) clusters", library_session["status_after_save"])[1])
    assert library_session["status_after_second"] == f"fuselens: {before - 1} clusters"


@pytest.fixture(scope="module")
def kinds_session(tmp_path_factory):
    """The Llama block (a `rotate_half` helper, an RMSNorm module on the residual sum): one quick fix
    of each kind, then restore."""
    fixes = [
        ["expression", "scores = torch.matmul(q, k.transpose(2, 3))", "^Fuse lines", "probs = cluster3("],
        ["helper", "q = q * cos + rotate_half(q) * sin", "^Fuse line", "q = cluster1("],
        ["outputs", "x = x + self.wo(attn)", "^Fuse lines", "x, h = cluster4("],
    ]
    restore = {
        "one": ["probs = cluster3(", "^Restore the original code of cluster3$", "scores = torch.matmul"],
        "all": "q = cluster1(",
    }
    return _kinds(tmp_path_factory, "llama_block.py", 7, fixes, restore)


@pytest.fixture(scope="module")
def gemma_session(tmp_path_factory):
    """The Gemma-style block, whose norm rebinds `hidden_states` around a submodule's call."""
    fixes = [["rebinding", "hidden_states = residual + self.attn_out", "^Fuse lines", "fused_1 = cluster0("]]
    return _kinds(tmp_path_factory, "gemma_norm.py", 2, fixes, None)


@pytest.fixture(scope="module")
def diffusion_session(tmp_path_factory):
    """The diffusion ResBlock: GroupNorm -> SiLU -> conv on one line, each convolution's bias added in
    the kernel after it; every cluster fixed, then the last one restored (which restores all three)."""
    fixes = [["the residual", "return self.skip(x) + h", "^Fuse lines 26", "return cluster2("]]
    # cluster2's edit carries cluster1's (the second convolution's call, its bias passed on, in each of
    # cluster1's branches), which carries cluster0's: restoring cluster0 restores the lines of all three.
    restore = {
        "one": ["cluster0(x", "^Restore the original code of cluster0 %(and of", "return self.skip(x) + h"],
    }
    return _kinds(tmp_path_factory, "diffusion_block.py", 3, fixes, restore)


def _kinds(tmp_path_factory, name: str, clusters: int, fixes: list, restore: dict | None) -> dict:
    """A session on the example `name` (with the examples' pyproject.toml) that applies `fixes`, then
    (`restore`) restores one cluster and every cluster."""
    files = {
        name: pathlib.Path(example(name)).read_text(encoding="utf-8"),
        "pyproject.toml": '[project]\nname = "ws"\n\n'
        + pathlib.Path(example("pyproject.toml")).read_text(encoding="utf-8"),
    }
    return run_nvim(
        tmp_path_factory.mktemp("nvim-kinds"),
        "kinds",
        trusted=True,
        files=files,
        FUSELENS_CLUSTERS=str(clusters),
        FUSELENS_FIXES=json.dumps(fixes),
        FUSELENS_RESTORE=json.dumps(restore) if restore else "",
    )


def _changed(before: str, after: str) -> tuple[list[str], list[str]]:
    """The lines a fix removed and the lines it added (the kernels' import block aside)."""

    def code(text: str) -> list[str]:
        return [
            line
            for line in text.splitlines()
            if "_kernels import" not in line and not line.startswith(("try:", "except"))
        ]

    old, new = code(before), code(after)
    return [line for line in old if line not in new], [line for line in new if line not in old]


def test_pattern_hints_leave_every_cluster_s_message_in_view(kinds_session):
    """With Neovim's default diagnostic config, the llama block's pattern hints share the clusters' lines:
    the virtual text there (on by default before 0.11) shows a cluster's message, not the hint's, and the
    sign column a cluster's sign (the plugin sorts its namespace's diagnostics by severity)."""
    _no_errors(kinds_session, "diagnostics")
    lines = kinds_session["cluster_lines"]
    # The seven clusters, and the attention (its diagnostic reads as a cluster's: it has a fix of its own).
    assert len(lines) == 8 and kinds_session["patterns"] > 0, kinds_session["cluster_lines"]
    clusters_on = {}
    for entry in lines:
        clusters_on.setdefault(entry["line"], []).append(entry["message"])
    major, minor = (int(x) for x in kinds_session["nvim"].split(".")[:2])
    for entry in lines:
        if (major, minor) < (0, 11):
            assert any(entry["shown"].endswith(message) for message in clusters_on[entry["line"]]), entry
        # The sign shown is the one of the highest priority: a cluster's (a warning here), and no other's.
        top = max(sign["priority"] for sign in entry["signs"])
        assert {sign["kind"] for sign in entry["signs"] if sign["priority"] == top} == {"Warn"}, entry


def test_quick_fix_of_a_subexpression_keeps_the_matmul(kinds_session):
    _no_errors(kinds_session, "diagnostics", "fix expression")
    fix = kinds_session["fixes"]["expression"]
    removed, added = _changed(kinds_session["original"], fix["buffer"])
    assert removed == [
        "        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)",
        "        probs = F.softmax(scores.float(), dim=-1).type_as(q)",
    ]
    assert added == [
        "        if cluster3.fits(matmul := torch.matmul(q, k.transpose(2, 3)), math.sqrt(self.head_dim)):",
        "            probs = cluster3(matmul, math.sqrt(self.head_dim))",  # the matmul runs once, either way
        "        else:",
        "            scores = matmul / math.sqrt(self.head_dim)",
        "            probs = F.softmax(scores.float(), dim=-1).type_as(q)",
    ]


def test_quick_fix_across_a_helper_function(kinds_session):
    _no_errors(kinds_session, "fix expression", "fix helper")
    before, after = kinds_session["fixes"]["expression"]["buffer"], kinds_session["fixes"]["helper"]["buffer"]
    assert _changed(before, after) == (
        ["        q = q * cos + rotate_half(q) * sin"],
        ["        q = cluster1(q, cos, sin) if cluster1.fits(q, cos, sin) else q * cos + rotate_half(q) * sin"],
    )
    assert "def rotate_half(x):" in after  # the helper stays: others may call it


def test_quick_fix_binding_the_sum_and_the_norm_of_a_submodule(kinds_session):
    _no_errors(kinds_session, "fix helper", "fix outputs")
    before, after = kinds_session["fixes"]["helper"]["buffer"], kinds_session["fixes"]["outputs"]["buffer"]
    norm = "self.mlp_norm.weight, self.mlp_norm.eps"
    assert _changed(before, after) == (
        ["        x = x + self.wo(attn)", "        h = self.mlp_norm(x)"],
        [
            f"        if cluster4.fits(x, wo := self.wo(attn), {norm}, module=self):",
            f"            x, h = cluster4(x, wo, {norm})",
            "            x = x + wo",
            "            h = self.mlp_norm(x)",
        ],  # (`else:` is a line the file had already)
    )


def test_three_fixes_in_a_row_are_all_on_disk(kinds_session):
    """Each fix's kernels reach the module on disk, though only the model's buffer was saved: none is
    left in a buffer of the module for the user to save."""
    _no_errors(kinds_session, "fix expression", "fix helper", "fix outputs")
    module = kinds_session["module_after_fixes"]
    assert all(f"\ndef {name}(" in module for name in ("cluster3", "cluster1", "cluster4")), module[:2000]
    assert kinds_session["modified_after_fixes"] == []


def test_restore_one_cluster_then_every_cluster(kinds_session):
    _no_errors(kinds_session, "fix outputs", "restore one", "restore all")
    assert "Restore the original code of cluster3" in kinds_session["restore_titles"]
    one = kinds_session["restored_one"]
    assert "scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)" in one
    assert "q = cluster1(q, cos, sin) if" in one  # the others stay fused
    assert kinds_session["restored_all"] == kinds_session["original"]
    assert kinds_session["model_on_disk"] == kinds_session["original"]


def test_quick_fix_of_a_norm_that_rebinds_its_input(gemma_session):
    _no_errors(gemma_session, "diagnostics", "fix rebinding")
    removed, added = _changed(gemma_session["original"], gemma_session["fixes"]["rebinding"]["buffer"])
    norm = "self.post_attention_layernorm.weight, self.post_attention_layernorm.eps"
    assert removed == [
        "        hidden_states = residual + self.attn_out(hidden_states)",
        "        residual = hidden_states",
        "        hidden_states = self.post_attention_layernorm(hidden_states)",
    ]
    assert added == [
        f"        if cluster0.fits(residual, attn_out := self.attn_out(hidden_states), {norm}, module=self):",
        f"            hidden_states, fused_1 = cluster0(residual, attn_out, {norm})",
        "            residual = hidden_states",  # the sum, as before
        "            hidden_states = fused_1",
        "        else:",
        "            hidden_states = residual + attn_out",
        "            residual = hidden_states",
        "            hidden_states = self.post_attention_layernorm(hidden_states)",
    ]


def test_quick_fixes_on_a_line_of_three_calls_and_their_restore(diffusion_session):
    _no_errors(diffusion_session, "diagnostics", "fix the residual")
    removed, added = _changed(diffusion_session["original"], diffusion_session["fixes"]["the residual"]["buffer"])
    assert removed == [
        "        h = self.conv1(F.silu(self.norm1(x)))",
        "        h = h + self.emb_proj(F.silu(emb))[:, :, None, None]",
        "        h = self.conv2(self.dropout(F.silu(self.norm2(h))))",
        "        return self.skip(x) + h",
    ]
    # the first convolution without its bias, its argument cluster0's call where it fits
    assert added[0].startswith("        h = self.conv1._conv_forward(cluster0(x, self.norm1.weight"), added
    assert "else F.silu(self.norm1(x)), self.conv1.weight, None)" in added[0], added
    # the second convolution without its bias in both of cluster1's branches, then cluster2 or the lines
    assert sum("self.conv2._conv_forward(self.dropout(" in line for line in added) == 2, added
    assert "            return cluster2(skip, self.skip.bias, h, self.conv2.bias)" in added, added
    _no_errors(diffusion_session, "restore one")
    titles = diffusion_session["restore_titles"]
    assert "Restore the original code of cluster0 (and of cluster1, cluster2, whose code shares its lines)" in titles
    assert diffusion_session["restored_one"] == diffusion_session["original"]
    assert diffusion_session["model_on_disk"] == diffusion_session["original"]
