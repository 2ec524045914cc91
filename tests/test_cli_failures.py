"""`fuselens` fails loudly: a command that could not do what it was asked exits non-zero with one line
that says why, never a traceback and never an exit 0 after doing nothing.  Each runs the installed
`fuselens` command, as a shell or a script would."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys

import pytest

from conftest import example

_INSTALLED = os.path.join(os.path.dirname(sys.executable), "fuselens")
COMMAND = [_INSTALLED] if os.path.exists(_INSTALLED) else [sys.executable, "-m", "fuselens.cli.main"]

RAISES = """
import torch


class Net(torch.nn.Module):  # fuselens: input=(8, 16) float32
    def forward(self, x):
        raise RuntimeError("boom")
"""

NO_INPUTS = """
import torch


class Net(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0
"""

SMALL = """
import torch


class Net(torch.nn.Module):  # fuselens: input=(8, 64) float32
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0
"""


def fuselens(*args: str, cwd=None) -> subprocess.CompletedProcess:
    """The command run as a script runs it: no terminal on any side."""
    return subprocess.run(
        [*COMMAND, *args], capture_output=True, text=True, cwd=cwd, stdin=subprocess.DEVNULL, timeout=600
    )


def lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line.rstrip() for line in (done.stdout + done.stderr).splitlines()]


def failed_with(done: subprocess.CompletedProcess, line: str, code: int = 1) -> None:
    """It exited with `code`, said `line` on a line of its own, and printed no traceback."""
    out = done.stdout + done.stderr
    assert done.returncode == code, out
    assert line in lines(done), out
    assert "Traceback" not in out, out


# ---- a model that could not be analyzed -------------------------------------------------------------

BOOM = "Net: forward() failed: RuntimeError: boom (model.py:6)"


def test_validate_of_a_model_whose_forward_raises_fails(write_model):
    failed_with(fuselens("validate", write_model(RAISES), "--interpret"), f"error {BOOM}")


def test_apply_of_a_model_whose_forward_raises_fails(write_model):
    done = fuselens("apply", write_model(RAISES), "--yes")
    failed_with(done, "nothing applied: no cluster could be applied (each skip above says why)")
    assert f"skip {BOOM}" in lines(done)


def test_profile_of_a_model_whose_forward_raises_fails(write_model):
    failed_with(fuselens("profile", write_model(RAISES)), f"not profiled: {BOOM}")


NO_SHAPES = "Net: no example inputs, so no shapes: costs are unknown (model.py:4); give example inputs:"


@pytest.mark.parametrize("command", ["validate", "apply", "profile", "analyze"])
def test_a_model_without_example_inputs_fails_every_command_and_says_how_to_give_them(write_model, command):
    extra = {"validate": ["--interpret"], "apply": ["--yes"]}.get(command, [])
    done = fuselens(command, write_model(NO_INPUTS), *extra)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    said = " ".join(done.stdout.split())
    assert "no example inputs" in said and "--input-shape on the command line" in said, done.stdout
    if command != "analyze":  # (analyze prints the report, the hint under the model)
        assert any(NO_SHAPES in line for line in lines(done)), done.stdout


NO_MODELS = "no models found in model.py (nn.Module classes, or model objects bound at module level)"


@pytest.mark.parametrize(
    "command, line",
    [
        ("analyze", "model.py: no models found (nn.Module classes, or model objects bound at module level)"),
        ("validate", f"error {NO_MODELS}"),
        ("apply", f"skip {NO_MODELS}"),
        ("profile", f"not profiled: {NO_MODELS}"),
    ],
)
def test_a_file_without_models_fails_every_command(write_model, command, line):
    path = write_model("x = 1\n")
    extra = {"validate": ["--interpret"], "apply": ["--yes"]}.get(command, [])
    failed_with(fuselens(command, "model.py", *extra, cwd=os.path.dirname(path)), line)


def test_validate_of_a_cluster_the_file_does_not_have_fails_and_names_those_it_has(write_model):
    path = write_model(SMALL)
    done = fuselens("validate", "model.py", "--interpret", "--cluster", "c9", cwd=os.path.dirname(path))
    failed_with(done, "error no cluster c9 in model.py (its clusters: c0)")


def test_apply_of_a_cluster_the_file_does_not_have_fails_and_names_those_it_has(write_model):
    path = write_model(SMALL)
    done = fuselens("apply", "model.py", "--yes", "--no-check", "--cluster", "c9", cwd=os.path.dirname(path))
    failed_with(done, "refused: no cluster c9 in model.py (its clusters: c0)")


# ---- option values the command line refuses ---------------------------------------------------------


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["analyze", "--device", "tpu"],
            "argument --device: unknown device 'tpu' (use one of h200, h100, a100, rtx4090)",
        ),
        (
            ["validate", "--device", "tpu"],
            "argument --device: unknown device 'tpu' (use one of h200, h100, a100, rtx4090)",
        ),
        (["analyze", "--peak-gbps", "-5"], "argument --peak-gbps: must be a number above 0, not '-5'"),
        (["analyze", "--peak-gbps", "0"], "argument --peak-gbps: must be a number above 0, not '0'"),
        (["analyze", "--peak-gbps", "nan"], "argument --peak-gbps: must be a number above 0, not 'nan'"),
        (["profile", "--iterations", "0"], "argument --iterations: must be at least 1, not '0'"),
        (["profile", "--warmup", "-1"], "argument --warmup: must be 0 or more, not '-1'"),
        (["profile", "--top", "zero"], "argument --top: must be a whole number, not 'zero'"),
    ],
)
def test_a_bad_option_value_is_refused_before_anything_runs(args, line):
    command, *options = args
    done = fuselens(command, example("example_net.py"), *options)
    failed_with(done, f"fuselens {command}: error: {line}", code=2)


def test_the_device_profile_names_the_command_line_takes_are_the_cost_models():
    from fuselens.analysis import cost
    from fuselens.contracts.options import DEVICE_PROFILES

    assert set(DEVICE_PROFILES) == set(cost.DEVICES) and DEVICE_PROFILES[0] == cost.DEFAULT_DEVICE


# ---- files that cannot be written -------------------------------------------------------------------


@pytest.mark.parametrize("command", ["analyze", "validate", "profile"])
def test_a_report_that_cannot_be_written_fails_in_one_line(write_model, command, tmp_path):
    out = str(tmp_path / "no-such-folder" / "report.json")
    extra = ["--interpret"] if command == "validate" else []
    done = fuselens(command, write_model(SMALL), "--json", out, *extra)
    failed_with(done, f"fuselens: {out}: No such file or directory")


def test_apply_on_a_read_only_file_system_fails_in_one_line_and_writes_nothing(tmp_path):
    """The model's folder mounted read-only (in a mount namespace of the test's own)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    probe = ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs tmpfs {folder}"]
    if shutil.which("unshare") is None or subprocess.run(probe, capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here for a read-only mount (unshare -rm)")
    shutil.copy(example("example_net.py"), tmp_path / "example_net.py")
    script = (
        f"mount -t tmpfs tmpfs {folder} && cp {tmp_path / 'example_net.py'} {folder} && "
        f"mount -o remount,ro {folder} && exec {' '.join(COMMAND)} apply {folder / 'example_net.py'} "
        "--yes --no-check --input-shape 64,1024"
    )
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=600)
    failed_with(done, f"refused: cannot write {folder / 'example_net_kernels.py'}: Read-only file system")


# ---- confirmation without a terminal, and diffs in a pipe ------------------------------------------


def test_apply_without_a_terminal_says_to_pass_yes(tmp_path):
    shutil.copy(example("example_net.py"), tmp_path / "example_net.py")
    before = (tmp_path / "example_net.py").read_bytes()
    done = fuselens("apply", "example_net.py", "--no-check", "--input-shape", "64,1024", cwd=tmp_path)
    failed_with(done, "not applied: no terminal to confirm on (pass --yes to apply without asking)")
    assert (tmp_path / "example_net.py").read_bytes() == before


def test_restoring_a_kernel_of_a_file_never_applied_fails(write_model):
    path = write_model(SMALL)
    done = fuselens("restore", "model.py", "--yes", "--kernel", "cluster0", cwd=os.path.dirname(path))
    failed_with(done, "nothing to restore: there is no model_kernels.py")


@pytest.mark.slow
def test_apply_while_another_program_keeps_the_files_lock_fails_and_writes_nothing(tmp_path):
    shutil.copy(example("example_net.py"), tmp_path / "example_net.py")
    with open(tmp_path / "example_net.py", "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        done = fuselens("apply", "example_net.py", "--yes", "--no-check", "--input-shape", "64,1024", cwd=tmp_path)
    failed_with(
        done,
        "refused: another program has been writing example_net.py for 10 s (it holds the lock fuselens writes "
        "under): nothing was written",
    )
    assert sorted(os.listdir(tmp_path)) == ["example_net.py"]


def test_restore_without_a_terminal_says_to_pass_yes(tmp_path):
    shutil.copy(example("example_net.py"), tmp_path / "example_net.py")
    assert fuselens("apply", "example_net.py", "--yes", "--no-check", cwd=tmp_path).returncode == 0
    applied = (tmp_path / "example_net.py").read_bytes()
    done = fuselens("restore", "example_net.py", cwd=tmp_path)
    failed_with(done, "not restored: no terminal to confirm on (pass --yes to restore without asking)")
    assert (tmp_path / "example_net.py").read_bytes() == applied


LONG_LINE = "        x = torch.relu(x * 2.0) + 1.0  # " + "a comment that runs on past any terminal's width " * 3


def test_a_piped_diff_keeps_every_line_whole(write_model, tmp_path):
    path = write_model(
        SMALL.replace("        return torch.relu(x * 2.0) + 1.0\n", LONG_LINE.rstrip() + "\n        return x\n")
    )
    done = fuselens("apply", path, "--yes", "--no-check", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "-" + LONG_LINE.rstrip() in lines(done), done.stdout  # the line apply replaced, whole
    restored = fuselens("restore", path, "--yes", cwd=tmp_path)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert "+" + LONG_LINE.rstrip() in lines(restored), restored.stdout  # the line restore puts back, whole


# ---- files Python runs, read as Python reads them ---------------------------------------------------


@pytest.mark.parametrize(
    "name, head",
    [
        ("a byte-order mark", b"\xef\xbb\xbf"),
        ("a latin-1 coding cookie", "# -*- coding: latin-1 -*-\n# café\n".encode("latin-1")),
    ],
)
def test_a_file_python_runs_is_analyzed(tmp_path, name, head):
    with open(example("example_net.py"), "rb") as fh:
        (tmp_path / "example_net.py").write_bytes(head + fh.read())
    done = fuselens("analyze", "example_net.py", "--input-shape", "64,1024", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 fusable cluster(s)" in done.stdout, done.stdout


def test_a_file_that_is_not_text_in_its_encoding_fails_in_one_line(write_model):
    path = write_model(SMALL)
    with open(path, "ab") as fh:
        fh.write(b"# caf\xe9\n")  # latin-1, in a file without a cookie: not UTF-8
    at = len(SMALL.lstrip("\n").encode()) + len(b"# caf")
    why = f"as Python source: invalid continuation byte at byte {at} for its encoding utf-8"
    folder = os.path.dirname(path)
    failed_with(fuselens("analyze", "model.py", cwd=folder), f"error model.py:1 cannot read {path} {why}")
    failed_with(fuselens("apply", "model.py", "--yes", cwd=folder), f"refused: cannot read model.py {why}")
