"""The Emacs configuration (editors/emacs/fuselens-eglot.el) in a real `emacs --batch` with Eglot.

`tests/emacs/test-eglot.el` opens a copy of examples/example_net.py with the user-facing
configuration and goes through Eglot's own paths: Flymake diagnostics, the ElDoc hover
function, `eglot-code-actions`; plus the fuselens-eglot validate command. It writes what it
saw to JSON. Skipped without Emacs and Eglot (Debian: apt-get install -y emacs-nox elpa-eglot).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from conftest import example
from lsp_helpers import time_limit

EMACS = shutil.which("emacs")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LISP = os.path.join(REPO, "editors", "emacs")


def _has_eglot() -> bool:
    if EMACS is None:
        return False
    probe = subprocess.run(
        [EMACS, "--batch", "-q", "--eval", "(progn (package-initialize) (require 'eglot))"],
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(
    not _has_eglot(), reason="emacs with eglot is not installed (Debian: apt-get install -y emacs-nox elpa-eglot)"
)


def _env(home) -> dict:
    return {**os.environ, "HOME": str(home)}  # no user init file takes part


def test_config_byte_compiles_without_warnings(tmp_path):
    out = tmp_path / "fuselens-eglot.elc"
    code = (
        "(progn (package-initialize) (setq byte-compile-error-on-warn t)"
        f" (setq byte-compile-dest-file-function (lambda (_) {json.dumps(str(out))}))"
        f" (unless (byte-compile-file {json.dumps(os.path.join(LISP, 'fuselens-eglot.el'))}) (kill-emacs 1)))"
    )
    proc = subprocess.run(
        [EMACS, "--batch", "-q", "-L", LISP, "--eval", code],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0 and out.exists(), proc.stderr


def run_emacs(tmp, name: str, text: str, **extra_env: str) -> dict:
    """Run test-eglot.el on a workspace holding the model `name` (`text`); `extra_env` goes to Emacs
    and from it to the server."""
    workspace = tmp / "ws"
    workspace.mkdir()
    (workspace / "pyproject.toml").write_text('[project]\nname = "ws"\n')
    model = workspace / name
    model.write_text(text, encoding="utf-8")
    results = tmp / "results.json"
    env = {
        **_env(tmp / "home"),
        "FUSELENS_PYTHON": sys.executable,
        "FUSELENS_TRUSTED": str(workspace),
        "FUSELENS_MODEL": str(model),
        "FUSELENS_RESULTS": str(results),
        **extra_env,
    }
    proc = subprocess.run(
        [EMACS, "--batch", "-q", "-L", LISP, "-l", os.path.join(HERE, "emacs", "test-eglot.el")],
        env=env,
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert results.exists(), f"emacs wrote no results (exit {proc.returncode})\n{proc.stdout}\n{proc.stderr}"
    data = json.loads(results.read_text())
    data["_output"] = proc.stdout + proc.stderr
    return data


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    return run_emacs(
        tmp_path_factory.mktemp("emacs"), "example_net.py", pathlib.Path(example("example_net.py")).read_text()
    )


def _steps(session, *names):
    for name in names:
        assert name in session["steps"], f"{name}: {session.get('error-' + name)}\n{session['_output'][-3000:]}"


def test_trust_and_settings_in_initialization_options(session):
    _steps(session, "start")
    print("Emacs", session["emacs"], "Eglot", session["eglot"])
    assert session["initialization-options"] == {
        "settings": {"severity": "warning", "compareInductor": False},
        "workspaceTrusted": True,
    }


def test_diagnostics_in_flymake(session):
    _steps(session, "diagnostics")
    clusters = sorted((d for d in session["diagnostics"] if "fusable:" in d["text"]), key=lambda d: d["line"])
    assert [d["line"] for d in clusters] == [18, 22, 28]
    assert "fusable: mul → relu → add, 384 MB → 128 MB" in clusters[0]["text"]
    assert all(d["type"] == "eglot-warning" for d in clusters), "severity = warning reached the server"


def test_hover_through_eldoc(session):
    _steps(session, "hover")
    assert "c0 · elementwise · `cluster0` · ExampleNet" in session["hover"]


def _kernel_view(view: dict, cluster: str, params: str = "x") -> None:
    """`view` is the server's read-only view of `cluster`'s kernel, at its definition."""
    assert view["file"].endswith(f"/kernels/example_net_{cluster}.py"), view
    assert os.stat(view["file"]).st_mode & 0o222 == 0 and view["read-only"], view
    assert view["line"] == f"def {cluster}({params}):", view


def test_the_hover_s_kernel_link_opens_the_kernel(session):
    """RET on "Open the kernel" in ElDoc's buffer runs the server's command: markdown-mode would
    have looked for a file named after the command."""
    _steps(session, "open the kernel from the hover")
    # The hover's first line ends at its text: markdown-mode underlines the spaces of a hard break.
    assert session["hover-buffer"].startswith("**⚡ c0 · elementwise · `cluster0` · ExampleNet**\n")
    assert session["hover-link-key"] == "fuselens-eglot-open-kernel-at-point"
    _kernel_view(session["kernel-from-hover"], "cluster0")


def test_open_kernel_at_point_on_a_cluster_s_line(session):
    _steps(session, "open the kernel at point")
    _kernel_view(session["kernel-at-point"], "cluster1", "x, weight, bias")  # it starts with proj1


def test_validate_command(session):
    _steps(session, "validate")
    assert session["validation-mode"] == "interpret"
    assert session["validation"] == [["c0", "verified"], ["c1", "verified"], ["c2", "verified"]]
    results = session["validation-results"]  # the file's results buffer, opened when it ended
    assert results["read-only"] and results["text"].startswith("### ExampleNet at ")
    assert "Triton interpreter" in results["text"].splitlines()[0]


def test_validation_leaves_emacs_free_while_it_runs(session):
    """The command returns at once (it froze Emacs until the validation ended): the mode line says it
    runs, a hover is answered meanwhile, and the answer comes later."""
    _steps(session, "validate")
    assert session["answered-when-command-returned"] is None
    assert session["running"] == "validating" and session["mode-line"] is True  # " fuselens: validating…"
    assert session["hover-while-validating"] is True
    assert session["running-after"] is None


def test_profile_command_shows_the_profile_in_the_file_s_results(session):
    _steps(session, "profile")
    assert session["profiling"] == "profiling"
    text = session["profile-results"]["text"]
    assert re.match(r"### ExampleNet at \d+×1024 \(smaller than the analyzed 16384×1024, ", text), text[:200]
    assert "| line | time | % of the forward |" in text
    assert session["results-again"] == session["profile-results"]  # M-x fuselens-eglot-results: the same


def test_the_mode_line_says_fuselens_works_until_the_last_of_two_commands_ends(session):
    """A validation and a profile of the file at once: the first answer left the mode line saying
    nothing while the other still ran."""
    _steps(session, "validate and profile at once")
    first, second = session["both-answers"]
    still = {"validation": "profiling", "profile": "validating"}[first["answered"]]
    assert first["running"] == still, session["both-answers"]
    assert second["running"] is None


def test_quick_fix_through_eglot_code_actions(session):
    _steps(session, "quick fix")
    assert session["actions"][0] == "Fuse lines 18–20 into Triton kernel cluster0"
    lines = session["buffer"].splitlines()
    assert "        if cluster0.fits(x):" in lines and "            x = cluster0(x)" in lines
    assert "            x = x * 2.0" in lines  # the lines, kept for the calls the kernel does not fit
    assert "    from .example_net_kernels import cluster0" in lines
    assert "    from example_net_kernels import cluster0" in lines
    assert session["module"] and "def cluster0(x):" in session["module"]


LLAMA = """from transformers import LlamaConfig, LlamaForCausalLM

config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
model = LlamaForCausalLM(config)  # fuselens: input=(2, 16)
"""


@pytest.fixture(scope="module")
def library_session(tmp_path_factory):
    """A transformers Llama: the quick fix of its RMSNorm (in the library's code), the model saved,
    then the quick fix of its MLP."""
    pytest.importorskip("transformers", exc_type=ImportError)
    tmp = tmp_path_factory.mktemp("emacs-library")
    return run_emacs(tmp, "llama_user.py", LLAMA, FUSELENS_MODE="library", HF_HUB_OFFLINE="1")


def test_two_library_fixes_in_a_row_are_both_on_disk(library_session):
    """The second fix (the kernel module exists by then) reaches the module on disk too: Eglot would
    leave an edit of the module in a buffer nobody saves, and the fix would do nothing."""
    _steps(library_session, "library diagnostics", "first library fix", "second library fix")
    assert library_session["first-module"].count("# ---- library patch: ") == 1
    module = library_session["second-module"]
    assert "modeling_llama.LlamaRMSNorm.forward: " in module and "modeling_llama.LlamaMLP.forward: " in module
    assert module.count("# ---- library patch: ") == 2
    assert library_session["modified-buffers"] == []
    # The norm's patch takes its cluster (and the decoder layer's, around the same norm), the MLP's one more.
    assert library_session["clusters-before"] > library_session["clusters-between"]
    assert library_session["clusters-after"] == library_session["clusters-between"] - 1


@pytest.fixture(scope="module")
def checkout_session(tmp_path_factory):
    """The model in a git repository: a syntax error saved, then `git checkout` of the file; then a
    validation that cannot check the whole model."""
    text = pathlib.Path(example("example_net.py")).read_text()
    return run_emacs(tmp_path_factory.mktemp("emacs-checkout"), "example_net.py", text, FUSELENS_MODE="checkout")


def test_a_checkout_refreshes_the_diagnostics(checkout_session):
    """The old syntax error goes once Emacs reverts the buffer of the file checked out."""
    _steps(checkout_session, "syntax error saved", "checkout")
    print(f"git checkout → fresh diagnostics in Emacs: {checkout_session['checkout-seconds']:.2f} s")


@pytest.mark.timing
def test_a_checkout_refreshes_the_diagnostics_within_a_second(checkout_session):
    _steps(checkout_session, "checkout")
    assert checkout_session["checkout-seconds"] < time_limit(1.0)


def test_a_validation_that_ends_in_an_error_tells_why(checkout_session):
    _steps(checkout_session, "validation error")
    assert checkout_session["whole-model"] == "error"
    reason = "example_net_kernels.py exists and was not written by fuselens"
    told = [m for m in checkout_session["messages"] if "ExampleNet as a whole: error" in m]
    assert len(told) == 1 and reason in told[0], checkout_session["messages"]
    assert "whole model with c0, c1, c2 applied: error (" in checkout_session["results-markdown"]
