"""`fuselens apply`: the patched model computes what the original did, and nothing is lost."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from fuselens.contracts.options import AnalyzeOptions
from fuselens.pipeline.analyze import analyze_file
from fuselens.pipeline.apply import apply_file

from conftest import EXAMPLES

CASES = [  # example, class, small inputs for the numerical check, constructor kwargs
    ("example_net.py", "ExampleNet", "[torch.randn(48, 1024)]", "{}"),
    ("llama_block.py", "LlamaBlock", "[torch.randn(1, 24, 1024).bfloat16()]", "{}"),
    ("conv_block.py", "ResBlock", "[torch.randn(2, 128, 6, 10), torch.randn(2, 512)]", "{}"),
    ("branchy.py", "GatedNet", "[torch.randn(40, 1024)]", "{}"),
]

CHECK = textwrap.dedent("""
    import importlib.util, os, sys, torch
    os.environ["TRITON_INTERPRET"] = "1"
    def load(path, name):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    original, patched = load(sys.argv[1], "original"), load(sys.argv[2], "patched")
    torch.manual_seed(0)
    inputs = {inputs}
    a = getattr(original, "{cls}")(**{init}).eval()
    b = getattr(patched, "{cls}")(**{init}).eval()
    b.load_state_dict(a.state_dict())
    if a.__class__.__name__ == "LlamaBlock":
        a, b = a.bfloat16(), b.bfloat16()
    with torch.no_grad():
        want, got = a(*inputs), b(*inputs)
    tol = 2e-2 if want.dtype == torch.bfloat16 or "Llama" in "{cls}" else 1e-4
    err = (got.float() - want.float()).abs().max().item()
    print("max_err", err)
    assert torch.allclose(got.float(), want.float(), atol=tol, rtol=tol), err
""")


@pytest.mark.parametrize("name, cls, inputs, init", CASES)
def test_apply_then_run_matches_the_original(tmp_path, name, cls, inputs, init):
    work = tmp_path / "project"
    work.mkdir()
    shutil.copy(os.path.join(EXAMPLES, name), work / name)
    shutil.copy(os.path.join(EXAMPLES, "pyproject.toml"), work / "pyproject.toml")
    original = tmp_path / f"original_{name}"
    shutil.copy(os.path.join(EXAMPLES, name), original)
    cli = [sys.executable, "-m", "fuselens.cli.main", "apply", str(work / name), "--yes"]
    done = subprocess.run(cli, capture_output=True, text=True, cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "applied" in done.stdout
    patched = (work / name).read_text()
    module = work / name.replace(".py", "_kernels.py")
    assert module.exists() and "@triton.jit" in module.read_text()
    assert "import cluster" in patched and patched != original.read_text()
    check = CHECK.format(inputs=inputs, cls=cls, init=init)
    run = subprocess.run(
        [sys.executable, "-c", check, str(original), str(work / name)], capture_output=True, text=True, cwd=work
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_apply_refuses_when_the_file_changes_before_writing(tmp_path):
    path = tmp_path / "example_net.py"
    shutil.copy(os.path.join(EXAMPLES, "example_net.py"), path)

    def user_edits_meanwhile(result):
        path.write_text(path.read_text() + "\n# typed while the prompt was open\n")
        return True

    result = apply_file(str(path), AnalyzeOptions(), None, user_edits_meanwhile)
    assert result.refused and "changed on disk" in result.refused
    assert path.read_text().endswith("# typed while the prompt was open\n")  # the user's text survives
    assert not os.path.exists(tmp_path / "example_net_kernels.py")


MIXED = """
import torch
import torch.nn as nn


def mix(x, w):
    a = torch.sigmoid(x) * 2.0
    return a @ w, a + 1.0


class Mixer(nn.Module):  # fuselens: input=(64, 64) float32
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 64))

    def forward(self, x):
        y, z = mix(x, self.w)
        return y * 0.5 + 1.0, torch.tanh(z) * 3.0
"""


def test_apply_never_touches_clusters_that_cannot_be_applied(tmp_path):
    path = tmp_path / "mixed.py"
    path.write_text(MIXED.lstrip())
    options = AnalyzeOptions()
    # `mix`'s ops are c0, its caller's `tanh(z) * 3.0` c1 (one chain, split where the call's code ends);
    # `y * 0.5 + 1.0` (c2) stands on c1's line, whose rewrite asks c1's kernel only.
    result = apply_file(str(path), options, None, lambda r: True)
    assert result.applied == ["c0", "c1"]
    assert len(result.skipped) == 1 and "line 17 also holds c1" in result.skipped[0], result.skipped
    after = path.read_text().splitlines()
    assert "        return a @ w, fused_1" in after  # the matmul stays, on the kernel's result
    assert "        y, z = mix(x, self.w)" in after
    assert any("y * 0.5 + 1.0" in line and "cluster2" not in line for line in after)
    assert not any("cluster2" in line for line in after)


def test_clusters_never_span_two_layers(tmp_path):
    """GPT's residual add ends one block and the next block's LayerNorm begins it: fused, the blocks
    would no longer run the same code.  They are left apart (reason `layer-boundary`), so every
    cluster of the example has code of its own and applies."""
    path = tmp_path / "gpt.py"
    shutil.copy(os.path.join(EXAMPLES, "gpt.py"), path)
    options = AnalyzeOptions(input_shapes=["2,64"], dtypes=["int64"])
    model = next(m for m in analyze_file(str(path), options).models if m.name == "GPT")
    apart = [r for r in model.rejections if r.reason == "layer-boundary"]
    assert apart and all("across a layer's boundary" in r.detail for r in apart), model.rejections
    result = apply_file(str(path), options, None, lambda r: True)
    assert result.applied == ["c0", "c1", "c2"] and not result.skipped  # c2: the MLP's fc and its GELU
    after = path.read_text().splitlines()
    embeddings = "cluster0(idx, self.tok.weight, pos, self.pos.weight)"
    assert (
        f"        x = self.drop({embeddings} if cluster0.fits(idx, self.tok.weight, pos, self.pos.weight, module=self) else self.tok(idx) + self.pos(pos))"
        in after
    )
    norm = "self.ln2.weight, self.ln2.bias, self.ln2.eps"
    start = after.index(f"        if cluster1.fits(x, attn := self.attn(self.ln1(x)), {norm}, module=self):")
    assert after[start + 1 : start + 6] == [
        f"            x, fused_1 = cluster1(x, attn, {norm})",  # the attention runs once, either way
        "            x = x + self.mlp(fused_1)",
        "        else:",
        "            x = x + attn",
        "            x = x + self.mlp(self.ln2(x))",
    ]
    assert "            x = block(x)" in after and "        x = self.ln_f(x)" in after
    assert "            h = cluster2(x, self.fc.weight, self.fc.bias)" in after


def test_applying_one_cluster_then_another_merges_the_import(tmp_path):
    path = tmp_path / "example_net.py"
    shutil.copy(os.path.join(EXAMPLES, "example_net.py"), path)
    first = apply_file(str(path), AnalyzeOptions(), ["c1"], lambda r: True)
    assert first.applied == ["c1"]
    text = path.read_text()
    assert "    from example_net_kernels import cluster1" in text
    assert "x = cluster1(x, self.proj1.weight, self.proj1.bias)" in text
    second = apply_file(str(path), AnalyzeOptions(), None, lambda r: True)
    text = path.read_text()
    assert second.applied == ["c0", "c2"]  # cluster1 keeps its name and its kernel
    assert "    from example_net_kernels import cluster0, cluster1, cluster2" in text
    module = (tmp_path / "example_net_kernels.py").read_text()
    assert "fused kernel: cluster1: linear → gelu → sigmoid → mul" in module
    assert "fused kernel: cluster2: tanh → mul → softmax" in module


def _cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fuselens.cli.main", *args], capture_output=True, text=True, cwd=cwd)


def test_restore_puts_back_the_lines_apply_replaced(tmp_path):
    shutil.copy(os.path.join(EXAMPLES, "llama_block.py"), tmp_path / "llama_block.py")
    shutil.copy(os.path.join(EXAMPLES, "pyproject.toml"), tmp_path / "pyproject.toml")
    original = (tmp_path / "llama_block.py").read_text()
    assert _cli("apply", "--yes", "llama_block.py", cwd=tmp_path).returncode == 0
    applied = (tmp_path / "llama_block.py").read_text()
    assert "q = cluster1(q, cos, sin) if cluster1.fits(q, cos, sin) else q * cos + rotate_half(q) * sin" in applied
    assert "attn = F.scaled_dot_product_attention(" in applied  # the attention's rewrite, in place of cluster3
    one = _cli("restore", "--yes", "--kernel", "cluster1", "llama_block.py", cwd=tmp_path)
    assert one.returncode == 0 and "restored cluster1" in one.stdout, one.stdout + one.stderr
    text = (tmp_path / "llama_block.py").read_text()
    assert "        q = q * cos + rotate_half(q) * sin\n" in text
    assert "cluster1" not in text and "x, h = cluster4(" in text  # the others stay applied
    assert "attn = F.scaled_dot_product_attention(" in text
    every = _cli("restore", "--yes", "llama_block.py", cwd=tmp_path)
    assert every.returncode == 0, every.stdout + every.stderr
    assert (tmp_path / "llama_block.py").read_text() == original  # every line as it was, the import gone


def test_restore_reads_the_kernel_module_without_running_it(tmp_path):
    """A kernel module with code of someone else's appended: restore puts the lines back from its syntax
    tree, and the appended code never runs."""
    shutil.copy(os.path.join(EXAMPLES, "example_net.py"), tmp_path / "example_net.py")
    shutil.copy(os.path.join(EXAMPLES, "pyproject.toml"), tmp_path / "pyproject.toml")
    original = (tmp_path / "example_net.py").read_text()
    assert _cli("apply", "--yes", "example_net.py", cwd=tmp_path).returncode == 0
    marker = tmp_path / "module-ran"
    with open(tmp_path / "example_net_kernels.py", "a", encoding="utf-8") as fh:
        fh.write(f"\nopen({str(marker)!r}, 'w').write('ran')\n")
    restored = _cli("restore", "--yes", "example_net.py", cwd=tmp_path)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert (tmp_path / "example_net.py").read_text() == original
    assert not marker.exists()


def test_a_convolutions_bias_joins_the_kernel_after_it_and_restores_with_it(tmp_path):
    """`h = self.conv1(F.silu(self.norm1(x)))`: the bias add joins the next cluster, the convolution
    runs without it, and the GroupNorm cluster inside its argument is carried by that edit; restoring
    the innermost kernel puts back every line they share."""
    shutil.copy(os.path.join(EXAMPLES, "diffusion_block.py"), tmp_path / "diffusion_block.py")
    original = (tmp_path / "diffusion_block.py").read_text()
    done = apply_file(str(tmp_path / "diffusion_block.py"), AnalyzeOptions(), None, lambda r: True)
    assert done.applied == ["c0", "c1", "c2"], done.skipped
    body = [line.strip() for line in (tmp_path / "diffusion_block.py").read_text().splitlines()]
    start = body.index("def forward(self, x, emb):") + 1
    norm1, norm2 = (
        f"self.norm{k}.weight, self.norm{k}.bias, self.norm{k}.eps, self.norm{k}.num_groups" for k in (1, 2)
    )
    emb = "self.emb_proj(F.silu(emb))[:, :, None, None]"
    assert body[start : start + 12] == [
        f"h = self.conv1._conv_forward(cluster0(x, {norm1}) if cluster0.fits(x, {norm1}, module=self) "
        "else F.silu(self.norm1(x)), self.conv1.weight, None)",
        f"if cluster1.fits(h, self.conv1.bias, emb_proj := {emb}, {norm2}, module=self):",
        f"h = self.conv2._conv_forward(self.dropout(cluster1(h, self.conv1.bias, emb_proj, {norm2})), "
        "self.conv2.weight, None)",
        "else:",  # where cluster1 does not fit: the lines, with the first convolution's bias added back
        "h = h if self.conv1.bias is None else h + self.conv1.bias[:, None, None]",
        "h = h + emb_proj",
        "h = self.conv2._conv_forward(self.dropout(F.silu(self.norm2(h))), self.conv2.weight, None)",
        "if cluster2.fits(skip := self.skip._conv_forward(x, self.skip.weight, None), self.skip.bias, h, self.conv2.bias):",
        "return cluster2(skip, self.skip.bias, h, self.conv2.bias)",
        "else:",
        "h = h if self.conv2.bias is None else h + self.conv2.bias[:, None, None]",
        "return (skip if self.skip.bias is None else skip + self.skip.bias[:, None, None]) + h",
    ]
    back = _cli("restore", "--yes", "--kernel", "cluster0", "diffusion_block.py", cwd=tmp_path)
    assert back.returncode == 0 and "restored cluster0, cluster1, cluster2" in back.stdout, back.stdout + back.stderr
    assert (tmp_path / "diffusion_block.py").read_text() == original


def test_a_convolution_subclass_keeps_its_bias_and_says_why(write_model):
    """A module whose call may do more than the convolution cannot be called without its bias."""
    path = write_model(
        """
        import torch.nn as nn
        import torch.nn.functional as F

        class Conv(nn.Conv2d):
            pass

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = Conv(8, 8, 3, padding=1)

            def forward(self, x):
                h = self.conv(x)
                return F.silu(h) * 2.0

            @classmethod
            def example_inputs(cls):
                import torch
                return (torch.randn(2, 8, 16, 16),)
        """
    )
    (cluster,) = [c for m in analyze_file(path, AnalyzeOptions()).models for c in m.clusters]
    assert cluster.applies == "no"
    assert "`self.conv(x)` (line 13) adds its bias in the cluster, but a `Conv`'s call cannot" in cluster.apply_detail


def test_restore_refuses_a_call_the_user_changed(tmp_path):
    path = tmp_path / "example_net.py"
    shutil.copy(os.path.join(EXAMPLES, "example_net.py"), path)
    assert apply_file(str(path), AnalyzeOptions(), ["c0"], lambda r: True).applied == ["c0"]
    path.write_text(path.read_text().replace("x = cluster0(x)", "x = cluster0(x) * 1.0"))
    before = path.read_text()
    done = _cli("restore", "--yes", "--kernel", "cluster0", "example_net.py", cwd=tmp_path)
    assert done.returncode == 1 and "no longer as apply wrote it" in done.stdout
    assert path.read_text() == before


def test_a_kernel_module_the_user_wrote_is_never_overwritten(tmp_path):
    path = tmp_path / "example_net.py"
    shutil.copy(os.path.join(EXAMPLES, "example_net.py"), path)
    mine = tmp_path / "example_net_kernels.py"
    mine.write_text("def my_own_kernel():\n    pass\n")
    before = path.read_text()
    result = apply_file(str(path), AnalyzeOptions(), None, lambda r: True)
    assert result.refused and "was not written by fuselens" in result.refused and not result.applied
    assert mine.read_text() == "def my_own_kernel():\n    pass\n" and path.read_text() == before


def test_apply_never_writes_through_a_symbolic_link(tmp_path):
    path = tmp_path / "example_net.py"
    shutil.copy(os.path.join(EXAMPLES, "example_net.py"), path)
    elsewhere = tmp_path / "elsewhere.py"
    elsewhere.write_text("# someone else's file\n")
    (tmp_path / "example_net_kernels.py").symlink_to(elsewhere)
    result = apply_file(str(path), AnalyzeOptions(), None, lambda r: True)
    assert result.refused and "symbolic link" in result.refused
    assert elsewhere.read_text() == "# someone else's file\n"
    # The model file itself behind a link: refused too, before anything is written.
    (tmp_path / "example_net_kernels.py").unlink()
    real = tmp_path / "real_model.py"
    shutil.copy(os.path.join(EXAMPLES, "example_net.py"), real)
    (tmp_path / "linked.py").symlink_to(real)
    result = apply_file(str(tmp_path / "linked.py"), AnalyzeOptions(), None, lambda r: True)
    assert result.refused and "symbolic link" in result.refused
    assert real.read_text() == (tmp_path / "example_net.py").read_text()
    assert not (tmp_path / "linked_kernels.py").exists()


EXPORT = textwrap.dedent("""
    import os, sys, torch
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, os.getcwd())
    import llama_block
    model = llama_block.LlamaBlock(dim=256, n_heads=2, hidden=512, max_len=64).eval().bfloat16()
    x = torch.randn(1, 16, 256).bfloat16()
    with torch.no_grad():
        exported = torch.export.export(model, (x,))
        ops = sorted({n.target.name().split("::")[1] for n in exported.graph.nodes
                      if n.op == "call_function" and "fuselens_" in str(n.target)})
        print(" ".join(ops))
        assert torch.equal(exported.module()(x), model(x))
""")


def test_torch_export_captures_each_kernel_as_one_op(tmp_path):
    shutil.copy(os.path.join(EXAMPLES, "llama_block.py"), tmp_path / "llama_block.py")
    shutil.copy(os.path.join(EXAMPLES, "pyproject.toml"), tmp_path / "pyproject.toml")
    assert _cli("apply", "--yes", "llama_block.py", cwd=tmp_path).returncode == 0
    done = subprocess.run([sys.executable, "-c", EXPORT], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    names = done.stdout.split()
    # cluster3 (the softmax) is not applied: the attention's rewrite computes it, as one call of torch's;
    # cluster5 and cluster6 start with the MLP's projections (the gate's, and w_down's with the residual).
    assert [n.split(".")[0] for n in names] == [f"cluster{k}" for k in (0, 1, 2, 4, 5, 6)], names


def test_a_number_computed_inside_a_helper_is_not_baked_into_the_kernel(write_model):
    path = write_model(
        """
        import torch.nn as nn
        import torch.nn.functional as F

        def scaled_gelu(x):
            s = x.shape[-1] ** -0.5
            return F.gelu(x * s)

        class M(nn.Module):
            def forward(self, x):
                return scaled_gelu(x) + 1.0
        """
    )
    with open(path, encoding="utf-8") as fh:
        before = fh.read()
    report = analyze_file(path, AnalyzeOptions(input_shapes=["8,64"]))
    # No call of `forward` can pass `s`: the helper's own ops are the kernel, which `s` is passed to.
    (cluster,) = report.models[0].clusters
    assert cluster.op_chain == "mul → gelu" and cluster.applies == "edit"
    (add,) = [r for r in report.models[0].rejections if [o.target for o in r.ops] == ["add"]]
    assert "`s` is computed in code that `forward` calls" in add.detail
    result = apply_file(path, AnalyzeOptions(input_shapes=["8,64"]), None, lambda r: True)
    assert result.applied == ["c0"]
    with open(path, encoding="utf-8") as fh:
        after = fh.read()
    assert "    return cluster0(x, s) if cluster0.fits(x, s) else F.gelu(x * s)\n" in after
    assert after.replace("cluster0(x, s) if cluster0.fits(x, s) else ", "").endswith(before.split("\n\n", 1)[1])
    check = textwrap.dedent(f"""
        import os, sys, torch
        os.environ["TRITON_INTERPRET"] = "1"
        sys.path.insert(0, {os.path.dirname(path)!r})
        import model
        for width in (64, 16):  # `s` is the width's: another width, another scale
            x = torch.randn(8, width)
            expected = torch.nn.functional.gelu(x * width ** -0.5) + 1.0
            assert model.cluster0.fits(x, width ** -0.5)
            torch.testing.assert_close(model.M()(x), expected)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr[-3000:]


def test_a_replaced_statements_comment_stays_at_its_indentation(write_model):
    path = write_model(
        """
        import torch
        import torch.nn as nn

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.gamma = nn.Parameter(torch.ones(8))

            def forward(self, x, y):
                y = (self.gamma * y).permute(0, 3, 1, 2)  # back to (N, C, H, W)
                return x + y
        """
    )
    result = apply_file(path, AnalyzeOptions(input_shapes=["2,8,3,5", "2,3,5,8"]), None, lambda r: True)
    assert result.applied == ["c0"]
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    comment = lines.index("            # back to (N, C, H, W)")  # the statement's own indentation
    assert lines[comment - 1 : comment + 6] == [
        "        if cluster0.fits(x, self.gamma, y):",
        "            # back to (N, C, H, W)",
        "            return cluster0(x, self.gamma, y)",
        "        else:",
        "            y = (self.gamma * y).permute(0, 3, 1, 2)  # back to (N, C, H, W)",
        "            return x + y",
    ]


def test_an_apply_leaves_the_options_it_was_given_as_they_were(tmp_path):
    """The same options analyze the file again after the edit: they must not carry the text apply
    read before writing over it (the analysis would be of the code that is gone)."""
    path = tmp_path / "model.py"
    path.write_text(MIXED.lstrip())
    options = AnalyzeOptions()
    assert apply_file(str(path), options, None, lambda r: True).applied == ["c0", "c1"]
    assert options.source_text is None
    (model,) = [m for m in analyze_file(str(path), options).models if m.status == "analyzed"]
    # c0 and c1 are kernel calls now; the cluster c1's rewrite left out stands on its own line
    assert [c.op_chain for c in model.clusters if c.applies != "no"] == ["mul → add"]


DROPPED_RESIDUAL = """
import torch, torch.nn as nn


class Block(nn.Module):  # fuselens: input=(8, 64)
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.drop = nn.Dropout(0.5)
        self.norm = nn.LayerNorm(64)

    def forward(self, x):
        h = self.fc(x)
        x = x + self.drop(h)
        return self.norm(x)
"""

TRAIN_CHECK = textwrap.dedent("""
    import importlib.util, os, sys, torch
    os.environ["TRITON_INTERPRET"] = "1"
    def load(path, name):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    original, patched = load(sys.argv[1], "original"), load(sys.argv[2], "patched")
    a = original.Block().train()
    b = patched.Block().train()
    b.load_state_dict(a.state_dict())
    x = torch.randn(8, 64)
    results = []
    for model in (a, b):
        torch.manual_seed(1)
        out = model(x)
        out.backward(torch.ones_like(out))
        results.append((out.detach(), model.fc.weight.grad))
    (want, want_grad), (got, got_grad) = results
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert torch.allclose(got_grad, want_grad, atol=1e-4), (got_grad - want_grad).abs().max()
    with torch.no_grad():
        assert not torch.allclose(a.eval()(x), want, atol=1e-3)  # the dropout did drop
    print("ok")
""")


def test_a_dropout_of_a_kernel_input_stays_in_the_call_and_drops_in_training(write_model, tmp_path):
    """`x + self.drop(h)`: in eval mode the dropout returned `h` and ran no op; the kernel's call takes
    `self.drop(h)`, so the applied model still drops in training, with the same random numbers."""
    path = write_model(DROPPED_RESIDUAL)
    original = tmp_path / "original.py"
    shutil.copy(path, original)
    done = apply_file(path, AnalyzeOptions(), None, lambda r: True)
    assert done.applied == ["c0"], done.skipped
    assert "self.drop(h)" in (tmp_path / "model.py").read_text()
    run = subprocess.run(
        [sys.executable, "-c", TRAIN_CHECK, str(original), path],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(path),
    )
    assert run.returncode == 0 and "ok" in run.stdout, run.stdout + run.stderr


def test_the_kernel_module_leaves_the_users_linter_quiet(tmp_path):
    """The module `apply` writes is generated code, rewritten on every apply: a project's linter
    (here ruff with every rule on, but the one against file-wide `noqa` lines) passes over it
    instead of failing the project's CI on it."""
    pytest.importorskip("ruff")
    work = tmp_path / "project"
    work.mkdir()
    shutil.copy(os.path.join(EXAMPLES, "llama_block.py"), work / "llama_block.py")
    shutil.copy(os.path.join(EXAMPLES, "pyproject.toml"), work / "pyproject.toml")
    cli = [sys.executable, "-m", "fuselens.cli.main", "apply", str(work / "llama_block.py"), "--yes"]
    done = subprocess.run(cli, capture_output=True, text=True, cwd=work)
    assert done.returncode == 0, done.stderr
    kernels = work / "llama_block_kernels.py"
    lint = [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "ALL", "--ignore", "PGH004", str(kernels)]
    checked = subprocess.run(lint, capture_output=True, text=True, cwd=work)
    assert checked.returncode == 0, checked.stdout[-2000:]
    # Told nothing, the same rules find plenty in it: the module's own lines are what quiet them.
    unmarked = work / "unmarked.py"
    unmarked.write_text(kernels.read_text().replace("# ruff: noqa\n", "").replace("# flake8: noqa\n", ""))
    checked = subprocess.run([*lint[:-1], str(unmarked)], capture_output=True, text=True, cwd=work)
    assert checked.returncode != 0


MODULE_NUMBERS = """
import torch
import torch.nn as nn

min_value, max_value = 0.0, 1.0
scale = 0.5


def amplified(t, by=3.0):
    return t.clamp(min=-1.0) * by


class M(nn.Module):  # fuselens: input=(4, 33) float32
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(33, 33)

    def forward(self, x):
        h = torch.clamp(x, min=min_value, max=max_value) * scale + 1.0
        h = self.proj(h)
        gain = 2.0

        def shifted(t):
            return t * gain - scale

        return amplified(shifted(torch.relu(h)))
"""


def test_numbers_the_model_reads_from_its_module_come_from_there_after_apply(write_model, kernel_launches, monkeypatch):
    """The clamp's bounds and the scale are module globals, the gain a closure's, the amplification a
    helper's default: the applied calls pass them (`cluster0(x, scale, min_value, max_value)`), so a
    model whose numbers change after it is built computes what the original does with the new values:
    with a new scale or default in the kernels, with new bounds (which shape their kernel) in the
    reference."""
    import importlib.util
    import sys

    import torch

    if os.environ.get("TRITON_INTERPRET", "1") != "1":
        pytest.skip("TRITON_INTERPRET is set to something else than 1 in the environment")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the kernels run on CPU tensors, in the interpreter
    path = write_model(MODULE_NUMBERS, "globals_model.py")
    with open(path, encoding="utf-8") as fh:
        original_text = fh.read()
    result = apply_file(path, AnalyzeOptions(), None, lambda r: True)
    assert len(result.applied) == 2, (result.refused, result.skipped)
    with open(path, encoding="utf-8") as fh:
        applied_text = fh.read()
    assert "cluster0(x, scale, min_value, max_value)" in applied_text
    assert "cluster1(h, gain, scale, amplified.__defaults__[0])" in applied_text

    def load(name, text):
        file = os.path.join(os.path.dirname(path), f"{name}.py")
        with open(file, "w", encoding="utf-8") as fh:
            fh.write(text)
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, os.path.dirname(path))  # the applied file imports its kernels from beside it
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(os.path.dirname(path))
        return module

    original, applied = load("original_globals", original_text), load("applied_globals", applied_text)
    launched = kernel_launches(sys.modules.pop("globals_model_kernels"))
    a, b = original.M(), applied.M()
    b.load_state_dict(a.state_dict())
    x = torch.randn(4, 33, generator=torch.Generator().manual_seed(0)) * 2
    changes = {  # what changes in both modules -> the clusters whose kernels then run
        "nothing": (lambda module: None, ["cluster0", "cluster1"]),
        "the scale": (lambda module: setattr(module, "scale", 0.25), ["cluster0", "cluster1"]),
        "the default": (lambda module: setattr(module.amplified, "__defaults__", (0.5,)), ["cluster0", "cluster1"]),
        "the bounds": (lambda module: vars(module).update(min_value=-0.5, max_value=2.0), ["cluster1"]),
    }
    for changed, (change, kernels) in changes.items():
        for module in (original, applied):
            change(module)
        launched.clear()
        with torch.no_grad():
            want, got = a(x), b(x)
        assert sorted({k.split("_")[1] for k in launched}) == kernels, (changed, launched)
        torch.testing.assert_close(got, want, msg=f"with another value of {changed}")


TOY_LIBRARY = """
import torch
import torch.nn as nn

floor, ceiling = 0.0, 1.0
scale = 0.5


class Squash(nn.Module):
    def forward(self, x):
        return torch.clamp(x * scale, min=floor, max=ceiling) + 1.0
"""

TOY_USER = """
import torch.nn as nn

from toylib_numbers.layers import Squash


class M(nn.Module):  # fuselens: input=(4, 33) float32
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(33, 33)
        self.squash = Squash()

    def forward(self, x):
        return self.squash(self.proj(x))
"""


def test_a_library_patch_passes_the_numbers_the_library_reads_from_its_module(tmp_path, kernel_launches, monkeypatch):
    """A cluster in an installed library's code whose numbers are that library module's globals: the
    patched copy of the library function passes them (it runs with the library's globals), so a change
    of them after `install()` reaches the kernel as it reaches the library's own code."""
    import importlib
    import sys

    import torch

    if os.environ.get("TRITON_INTERPRET", "1") != "1":
        pytest.skip("TRITON_INTERPRET is set to something else than 1 in the environment")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    packages = tmp_path / "site-packages"  # an installed library: a folder on the path outside the project
    (packages / "toylib_numbers").mkdir(parents=True)
    (packages / "toylib_numbers" / "__init__.py").write_text("")
    (packages / "toylib_numbers" / "layers.py").write_text(TOY_LIBRARY)
    monkeypatch.syspath_prepend(str(packages))
    for name in ("toylib_numbers", "toylib_numbers.layers"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    project = tmp_path / "project"
    project.mkdir()
    path = project / "toy_user.py"
    path.write_text(TOY_USER)
    result = apply_file(str(path), AnalyzeOptions(), None, lambda r: True)
    assert result.applied == ["c0"], (result.refused, result.skipped)
    module_text = (project / "toy_user_kernels.py").read_text()
    assert "cluster0(x, scale, floor, ceiling)" in module_text  # the patched copy of Squash.forward
    monkeypatch.syspath_prepend(str(project))
    user = importlib.import_module("toy_user")  # its `install()` patches the library
    kernels = sys.modules["toy_user_kernels"]
    monkeypatch.delitem(sys.modules, "toy_user")
    monkeypatch.delitem(sys.modules, "toy_user_kernels")
    library = sys.modules["toylib_numbers.layers"]
    launched = kernel_launches(kernels)
    model = user.M()
    x = torch.randn(4, 33, generator=torch.Generator().manual_seed(0))
    try:
        for changed, kernel in (({}, True), ({"scale": 2.0}, True), ({"floor": -0.5, "ceiling": 0.25}, False)):
            vars(library).update(changed)
            launched.clear()
            with torch.no_grad():
                got = model(x)
                assert bool(launched) == kernel, (changed, launched)
                kernels.uninstall()
                want = model(x)  # the library's own code, with its globals as they are now
                kernels.install()
            torch.testing.assert_close(got, want, msg=f"with {changed}")
    finally:
        kernels.uninstall()


OVERFLOWS_IN_HALF = """
import torch
import torch.nn as nn


class Gate(nn.Module):  # fuselens: input=(64, 256) float16
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(256, 256)

    def forward(self, x):
        h = self.proj(x)
        e = torch.exp(h * 40.0)
        return e / (e + 1.0)
"""


def _apply_cli(path, *extra: str) -> subprocess.CompletedProcess:
    cli = [sys.executable, "-m", "fuselens.cli.main", "apply", str(path), "--yes", *extra]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # apply sets it itself on a CPU
    return subprocess.run(cli, capture_output=True, text=True, cwd=os.path.dirname(path), env=env)


def test_apply_validates_first_and_leaves_a_kernel_that_computes_otherwise_unwritten(tmp_path):
    """In float16 eager's `exp` overflows where the kernel, computing in float32 between its load and
    its store, does not: its output has NaN elsewhere than the code's, so it is not applied (the file
    and its folder stay as they were); with `--no-check` it would be."""
    path = tmp_path / "gate.py"
    path.write_text(OVERFLOWS_IN_HALF)
    done = _apply_cli(path, "--param-dtype", "float16")
    out = " ".join(done.stdout.split())
    assert done.returncode == 1, done.stdout + done.stderr  # asked to apply, it applied nothing
    assert "skip c0 (linear → mul → exp → add → div): its kernel does not compute what its lines do" in out, out
    assert "NaN in one and not the other" in out and "nothing applied" in out
    assert path.read_text() == OVERFLOWS_IN_HALF and sorted(os.listdir(tmp_path)) == ["gate.py"]
    unchecked = _apply_cli(path, "--param-dtype", "float16", "--no-check")
    assert "applied c0" in unchecked.stdout and "cluster0.fits(" in path.read_text()


def test_apply_validates_each_kernel_and_the_model_as_a_whole_before_writing(tmp_path):
    """What passes the check is written: every kernel of the example, run in the interpreter, and the
    example patched as a whole compute what the example computes as written."""
    path = tmp_path / "example_net.py"
    shutil.copy(os.path.join(EXAMPLES, "example_net.py"), path)
    done = _apply_cli(path, "--input-shape", "64,1024")
    assert done.returncode == 0, done.stdout + done.stderr
    checked = [line for line in done.stdout.splitlines() if line.startswith("… ExampleNet: ")]
    assert checked == [
        "… ExampleNet: c0 (mul → relu → add)",
        "… ExampleNet: c1 (linear → gelu → sigmoid → mul)",
        "… ExampleNet: c2 (tanh → mul → softmax)",
        "… ExampleNet: the whole model",
    ]
    assert "applied c0, c1, c2" in done.stdout and "skip" not in done.stdout


def test_kernels_cannot_be_interpreted_where_triton_was_imported_first_and_validation_says_so():
    """Triton's own functions (`tl.sigmoid`) are made interpreted or compiled when Triton is imported:
    a process that imported it before TRITON_INTERPRET=1 was set gets one clear problem, not a failure
    in every kernel that calls them."""
    code = (
        "import triton\n"
        "from fuselens.contracts.options import ValidateOptions\n"
        "from fuselens.validate.runner import start\n"
        "print(start('model.py', ValidateOptions(interpret=True)).problems)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert "imported in this process before TRITON_INTERPRET=1 was set" in done.stdout, done.stdout
    env["TRITON_INTERPRET"] = "1"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert "imported in this process" not in done.stdout, done.stdout


def test_a_validation_in_the_interpreter_leaves_triton_interpret_as_it_was(tmp_path):
    """A process that validates in the interpreter and then does something else (a benchmark of compiled
    kernels, a GPU test) must not find TRITON_INTERPRET=1 left behind by the validation."""
    shutil.copy(os.path.join(EXAMPLES, "example_net.py"), tmp_path / "model.py")
    code = (
        "import os\n"
        "from fuselens.contracts.options import AnalyzeOptions, ValidateOptions\n"
        "from fuselens.pipeline.validate import validate_file\n"
        "report = validate_file('model.py', AnalyzeOptions(input_shapes=['48,1024']), ValidateOptions(interpret=True))\n"
        "print(sorted({c.status for m in report.models for c in m.clusters}), report.problems)\n"
        "print('after:', os.environ.get('TRITON_INTERPRET'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, check=True
    )
    assert "['verified'] []" in done.stdout, done.stdout + done.stderr
    assert "after: None" in done.stdout, done.stdout
