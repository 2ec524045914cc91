"""Whether an applied cluster trains with its kernels: the user's own validations decide.

`fuselens validate` times each cluster's training step on a GPU and the file's validation history
keeps it; a fix (`fuselens apply`, the editor's quick fix) writes a cluster whose kernels' step
measured slower than torch.compile's so that a call that wants gradients runs the original code, and
says so.  Without a measurement the kernels train.  Histories are written here as a validation on a
GPU writes them (`server/history.py`), into the run's own cache folder.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from fuselens.contracts.history import ValidationRun
from fuselens.contracts.results_view import results_view, view_markdown
from fuselens.contracts.training import measured_training, slower_in_training
from fuselens.contracts.validation import (
    BackwardCheck,
    ClusterCheck,
    ModelValidation,
    TrainingTiming,
    ValidationReport,
)
from fuselens.server import history

MODEL = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class M(nn.Module):  # fuselens: input=(2, 16, 5, 7) float32
        def __init__(self):
            super().__init__()
            self.norm = nn.GroupNorm(4, 16)

        def forward(self, x):
            return F.silu(self.norm(x))
    """
CHAIN = "group_norm → silu"
DEVICE = "NVIDIA H100 80GB HBM3"


def validated(path: str, step_vs_compiled: float, ops: str = CHAIN) -> ValidationReport:
    """A validation of `path` on a GPU whose cluster c0 (`ops`) trained at `step_vs_compiled` times
    torch.compile's step, kept in the file's history as `fuselens validate` keeps it."""
    timing = TrainingTiming(
        compiled_step_us=100.0, fused_step_us=round(100.0 / step_vs_compiled, 2), step_vs_compiled=step_vs_compiled
    )
    check = ClusterCheck("c0", "cluster0", "verified", ops, backward=BackwardCheck("verified", ["x"], timing=timing))
    report = ValidationReport(path, "cuda", DEVICE, [ModelValidation("M", [[2, 16, 5, 7]], ["float32"], [check])])
    history.record(path, report, print)
    return report


def test_the_latest_validation_of_a_cluster_decides_whether_it_trains_with_its_kernels(tmp_path):
    """A cluster measured slower trains through its original code, until a later validation measures
    its kernels faster; a measurement of other ops (the file changed since) says nothing of it."""
    path = str(tmp_path / "model.py")
    validated(path, 0.8)
    verdict = slower_in_training(history.measured(path, print), "M", "c0", CHAIN)
    assert verdict == (
        "trains through the original code: its kernels' training step (forward and backward) measured "
        f"0.80× torch.compile's (default) on {DEVICE}, validated " + verdict.rsplit("validated ", 1)[1]
    )
    assert verdict.endswith(" UTC")
    assert not slower_in_training(history.measured(path, print), "M", "c0", "group_norm → relu")
    assert not slower_in_training(history.measured(path, print), "M", "c1", CHAIN)
    validated(path, 1.3)
    assert not slower_in_training(history.measured(path, print), "M", "c0", CHAIN)
    validated(path, 0.95)
    assert "0.95×" in slower_in_training(measured_training(history.load(path, print)), "M", "c0", CHAIN)


def test_the_results_say_which_clusters_train_through_their_original_code_once_applied(tmp_path):
    path = str(tmp_path / "model.py")
    report = validated(path, 0.8)
    markdown = view_markdown(results_view(history.load(path, print)[-1]))
    assert "| 0.80× (trains through the original code once applied) |" in markdown, markdown
    timing = report.models[0].clusters[0].backward.timing  # type: ignore[union-attr]
    timing.step_vs_compiled = 1.25
    assert "| 1.25× |" in view_markdown(results_view(ValidationRun("", DEVICE, report)))


def _apply(path: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fuselens.cli.main", "apply", path, "--yes", "--no-check"],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _applied(path: str, counts: list[str]):
    """The applied model's class, imported from `path`, with every kernel launch of its module named in `counts`."""
    from triton.runtime.jit import KernelInterface

    folder = os.path.dirname(path)
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(f"applied_{abs(hash(folder))}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    kernels = sys.modules.pop("model_kernels")
    for name, kernel in list(vars(kernels).items()):
        if isinstance(kernel, KernelInterface) and name.startswith("_cluster0_"):
            setattr(kernels, name, _Counted(kernel, name, counts))
    return module.M, kernels


class _Counted:
    def __init__(self, kernel, name: str, counts: list[str]):
        self.kernel, self.name, self.counts = kernel, name, counts

    def __getitem__(self, grid):
        self.counts.append(self.name)
        return self.kernel[grid]


@pytest.mark.interpreter
def test_fuselens_apply_writes_a_cluster_measured_slower_in_training_to_train_through_its_original_code(tmp_path):
    """`fuselens apply` of a file whose validation measured c0's kernels at 0.80× torch.compile in
    training: the applied model runs the kernel in a forward without gradients, and a training step
    runs the lines it replaced, with eager's gradients; `apply` says so.  The same file never
    validated trains through its backward kernels."""
    torch = pytest.importorskip("torch")
    measured, unmeasured = tmp_path / "measured", tmp_path / "unmeasured"
    for folder in (measured, unmeasured):
        folder.mkdir()
        (folder / "model.py").write_text(textwrap.dedent(MODEL).lstrip("\n"))
    validated(str(measured / "model.py"), 0.8)
    done = _apply(str(measured / "model.py"))
    assert done.returncode == 0, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert f"training c0 ({CHAIN}): trains through the original code: its kernels' training step" in said
    assert "measured 0.80× torch.compile's (default) on NVIDIA H100 80GB HBM3" in said
    assert _apply(str(unmeasured / "model.py")).returncode == 0

    x = torch.randn(2, 16, 5, 7, generator=torch.Generator().manual_seed(0)) * 2 + 3
    leaf = x.clone().requires_grad_()
    (want,) = torch.autograd.grad(torch.nn.functional.silu(torch.nn.functional.group_norm(leaf, 4)).sum() ** 2, leaf)
    for folder, trains_with_kernels in ((measured, False), (unmeasured, True)):
        counts: list[str] = []
        model_class, kernels = _applied(str(folder / "model.py"), counts)
        assert hasattr(kernels, "_cluster0_trains") == trains_with_kernels
        model = model_class()
        with torch.no_grad():
            model(x)
        assert counts and all("_backward_" not in k for k in counts)  # the forward kernel runs
        counts.clear()
        leaf = x.detach().requires_grad_()
        (got,) = torch.autograd.grad(model(leaf).sum() ** 2, leaf)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        backward = [k for k in counts if "_backward_" in k]
        assert bool(backward) == trains_with_kernels, counts
        assert bool(counts) == trains_with_kernels, counts  # the original lines ran, no kernel at all
    module_text = (measured / "model_kernels.py").read_text()
    assert "# Training: cluster0 trains through the original code" in module_text
