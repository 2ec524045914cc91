"""The rewrite of examples/gpt_loss.py's head and loss into one fused loss: the lines it writes, and the
rewritten model against the original on a CPU (loss and gradients, in training and eval mode), with
torch's `F.linear_cross_entropy` and with the kernel module's chunked loss."""

from __future__ import annotations

import importlib.util
import shutil
import sys

import pytest
import torch

from fuselens.analysis.linear_loss import find_linear_losses
from fuselens.analysis.loss_rewrite import loss_rewrite
from fuselens.codegen.loss_module import LOSS_SECTION, fused_loss_section
from fuselens.codegen.module import render_module
from fuselens.contracts.options import AnalyzeOptions
from fuselens.pipeline import analyze as analyze_mod

from conftest import example

SMALL = {"vocab": 1000, "d_model": 64, "n_heads": 4, "n_layers": 1, "max_len": 64}


def traced(path, monkeypatch):
    """The example's main trace and its source index, as the analysis hands them to the pattern finder."""
    seen = []
    findings = analyze_mod.findings

    def keep(model, paths, source, profile):
        seen.append((paths[0][0].graph, source))
        return findings(model, paths, source, profile)

    monkeypatch.setattr(analyze_mod, "findings", keep)
    analyze_mod.analyze_file(path, AnalyzeOptions())
    (found,) = seen
    return found


def rewritten(tmp_path, monkeypatch, torch_has_it: bool):
    path = shutil.copy(example("gpt_loss.py"), tmp_path / "gpt_loss.py")
    graph, source = traced(str(path), monkeypatch)
    (found,) = find_linear_losses(graph)
    rewrite = loss_rewrite(graph, found, source, torch_has_it, f"from gpt_loss_kernels import {LOSS_SECTION}")
    lines = source.text.splitlines(keepends=True)
    assert "".join(lines[rewrite.start_line - 1 : rewrite.end_line]) == rewrite.original
    lines[rewrite.start_line - 1 : rewrite.end_line] = [rewrite.text]
    text = "".join(lines).replace("import torch\n", "import torch\n" + "\n".join(rewrite.imports) + "\n", 1)
    out = tmp_path / "gpt_loss_rewritten.py"
    out.write_text(text)
    if rewrite.uses_kernel_module:
        (tmp_path / "gpt_loss_kernels.py").write_text(
            render_module("gpt_loss.py", {LOSS_SECTION: fused_loss_section()})
        )
    return rewrite, path, out


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def test_the_two_statements_become_one_call_of_torchs_fused_loss(tmp_path, monkeypatch):
    rewrite, _, _ = rewritten(tmp_path, monkeypatch, torch_has_it=True)
    assert rewrite.original == (
        "        logits = self.lm_head(x)\n"
        "        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1), ignore_index=self.pad_id)\n"
    )
    assert rewrite.text == (
        "        loss = F.linear_cross_entropy(x.flatten(0, -2), self.lm_head.weight, targets.view(-1), "
        "ignore_index=self.pad_id, options=torch.nn.LinearCrossEntropyOptions()).float()\n"
    )


@pytest.mark.parametrize("torch_has_it", [True, False], ids=["torch", "kernel-module"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_the_rewritten_model_computes_the_original_loss_and_gradients(tmp_path, monkeypatch, torch_has_it, training):
    _, path, out = rewritten(tmp_path, monkeypatch, torch_has_it)
    torch.manual_seed(0)
    original = load(path, f"original_{tmp_path.name}").TinyLM(**SMALL)
    fused = load(out, f"fused_{tmp_path.name}").TinyLM(**SMALL)
    fused.load_state_dict(original.state_dict())
    original.train(training)
    fused.train(training)
    idx = torch.randint(0, SMALL["vocab"], (2, 48))
    targets = torch.roll(idx, -1, dims=1)
    targets[:, -5:] = -100
    want, got = original(idx, targets), fused(idx, targets)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    want_grads = torch.autograd.grad(want, list(original.parameters()))
    got_grads = torch.autograd.grad(got, list(fused.parameters()))
    for (name, _), g, w in zip(original.named_parameters(), got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")


def test_fuselens_apply_rewrites_the_example_and_restore_puts_it_back(tmp_path):
    """`fuselens apply --cluster r0` (validated on the CPU first) writes the fused loss, and `fuselens
    restore` the two statements as they were."""
    import subprocess

    path = shutil.copy(example("gpt_loss.py"), tmp_path / "gpt_loss.py")
    before = path.read_text()
    applied = subprocess.run(
        [sys.executable, "-m", "fuselens.cli.main", "apply", str(path), "--cluster", "r0", "--yes"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert applied.returncode == 0 and "applied r0" in applied.stdout, applied.stdout + applied.stderr
    assert "F.linear_cross_entropy(x.flatten(0, -2), self.lm_head.weight" in path.read_text()
    assert "logits = self.lm_head(x)" not in path.read_text()
    restored = subprocess.run(
        [sys.executable, "-m", "fuselens.cli.main", "restore", str(path), "--yes"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert path.read_text() == before


def test_where_torch_has_no_fused_loss_apply_writes_the_kernel_modules(tmp_path, monkeypatch):
    """torch 2.11 has no `F.linear_cross_entropy`: the rewrite calls the kernel module's chunked loss (its
    rows in the Triton interpreter here), which `apply` writes into the module, and the model computes
    the original's loss and gradients."""
    from fuselens.pipeline.apply import apply_file

    monkeypatch.delattr(torch.nn.functional, "linear_cross_entropy")
    path = shutil.copy(example("gpt_loss.py"), tmp_path / "gpt_loss.py")
    original = load(path, f"before_{tmp_path.name}").TinyLM
    result = apply_file(str(path), AnalyzeOptions(), None, lambda _: True)
    assert result.applied == ["r0"] or "r0" in result.applied, result.skipped
    text = path.read_text()
    assert "loss = linear_cross_entropy(x, self.lm_head.weight, targets.view(-1), ignore_index=self.pad_id, " in text
    assert "def linear_cross_entropy(" in (tmp_path / "gpt_loss_kernels.py").read_text()
    torch.manual_seed(0)
    want_model = original(**SMALL)
    got_model = load(path, f"after_{tmp_path.name}").TinyLM(**SMALL)
    got_model.load_state_dict(want_model.state_dict())
    idx = torch.randint(0, SMALL["vocab"], (2, 48))
    targets = torch.roll(idx, -1, dims=1)
    targets[:, -5:] = -100
    want, got = want_model(idx, targets), got_model(idx, targets)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(
        torch.autograd.grad(got, list(got_model.parameters())),
        torch.autograd.grad(want, list(want_model.parameters())),
        strict=True,
    ):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
