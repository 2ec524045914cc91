"""Clusters that start with a GEMM: which GEMMs take the elementwise ops after them, the bytes that
saves, the fused kernel's numbers in the Triton interpreter (forward and gradients, against eager, at
shapes no tile divides), and the examples applied through the CLI."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from fuselens.codegen.module import module_for_report
from fuselens.contracts.validation import Timing
from fuselens.validate.gemms import kept_line

from conftest import EXAMPLES, chains, only_model

GEMMS = os.path.join(EXAMPLES, "gemm_epilogues.py")


def nbytes(*shape: int, itemsize: int = 2) -> int:
    """The bytes of a bfloat16 tensor of `shape`."""
    n = itemsize
    for d in shape:
        n *= d
    return n


# ---- detection and bytes ---------------------------------------------------------------------------


def test_the_examples_are_gemm_clusters_that_save_the_products_round_trip(analyze):
    """At 16k tokens of 768 in bf16: each GEMM takes the ops after it, and its cluster counts the
    GEMM's own reads and write on both sides, so what it saves is the product's round trip (and the
    epilogue's intermediates)."""
    report = analyze(GEMMS)
    models = {m.name: m for m in report.models}
    x, w1, b1, out1 = nbytes(16384, 768), nbytes(3072, 768), nbytes(3072), nbytes(16384, 3072)
    (mlp,) = models["GeluMLP"].clusters
    assert (mlp.kind, mlp.op_chain, mlp.regime) == ("gemm-epilogue", "linear → gelu", "compute-bound")
    gemm, gelu = x + w1 + b1 + out1, 2 * out1
    assert (mlp.bytes_unfused, mlp.bytes_fused) == (gemm + gelu, x + w1 + b1 + out1)
    assert [i.name for i in mlp.inputs] == ["x", "self.fc1.weight", "self.fc1.bias"]

    (logits,) = models["ClampedLogits"].clusters
    assert logits.op_chain == "matmul → mul → add → clamp"
    assert [i.name for i in logits.inputs] == ["x", "self.weight.t()", "self.bias"]
    assert [n.text for n in logits.numbers] == ["self.scale", "-self.cap", "self.cap"]
    out2, w2, b2 = nbytes(16384, 4096), nbytes(4096, 768), nbytes(4096)
    unfused = (x + w2 + out2) + 2 * out2 + (2 * out2 + b2) + 2 * out2
    assert (logits.bytes_unfused, logits.bytes_fused) == (unfused, x + w2 + b2 + out2)

    (residual,) = models["LayerScaleResidual"].clusters
    assert residual.op_chain == "linear → mul → add"
    assert [i.name for i in residual.inputs] == ["h", "self.fc2.weight", "self.fc2.bias", "x", "self.gamma"]
    h, w3, b3, out3 = nbytes(16384, 3072), nbytes(768, 3072), nbytes(768), nbytes(16384, 768)
    unfused = (h + w3 + b3 + out3) + (nbytes(768) + 2 * out3) + 3 * out3
    assert (residual.bytes_unfused, residual.bytes_fused) == (unfused, h + w3 + b3 + x + nbytes(768) + out3)
    for cluster in (mlp, logits, residual):
        assert cluster.applies == "edit" and cluster.backward  # it trains with the epilogue's backward kernel
        assert "torch's GEMM gradients after the epilogue's backward kernel" in cluster.backward_detail


KEPT_APART = """
import torch, torch.nn as nn, torch.nn.functional as F


class Projection(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 32)

    def forward(self, x):
        return self.proj(torch.tanh(x))


class Net(nn.Module):  # fuselens: input=(4, 8, 32)
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.norm = nn.LayerNorm(32)
        self.inner = Projection()
        self.out = nn.Linear(32, 32)

    def forward(self, x):
        h = self.fc(x)
        kept = torch.relu(h)  # the product is also returned: it must be written anyway
        y = self.norm(self.out(kept) + x)  # a norm reduces each row: no GEMM's epilogue
        z = x * 2.0 + self.inner(y)  # the projection is the submodule's, the add the caller's
        return h, kept, z
"""

WHOLE_CALL = KEPT_APART.replace("return self.proj(torch.tanh(x))", "return self.proj(x)")


def test_a_gemm_whose_product_is_read_elsewhere_or_reduced_or_added_by_the_caller_stays_apart(write_model, analyze):
    model = only_model(analyze(write_model(KEPT_APART)))
    assert "gemm-epilogue" not in [c.kind for c in model.clusters], chains(model)
    assert chains(model) == ["tanh", "add → layer_norm", "mul → add"][1:]
    relu = next(r for r in model.rejections if r.ops[0].target == "relu")
    assert relu.reason == "no-neighbour"


def test_a_submodule_whose_whole_call_is_the_gemm_fuses_into_the_callers_add(write_model, analyze):
    """`x * 2.0 + self.inner(y)`, where `inner` only projects: the call stands in for the submodule's
    call too, which its `fits` checks is the module it was made for."""
    model = only_model(analyze(write_model(WHOLE_CALL)))
    cluster = next(c for c in model.clusters if c.kind == "gemm-epilogue")
    assert cluster.op_chain == "mul → linear → add"
    assert [i.name for i in cluster.inputs] == ["y", "self.inner.proj.weight", "self.inner.proj.bias", "x"]
    assert "_modules_match(module, _cluster1_modules)" in cluster.kernel.source


# ---- the fused kernel in the interpreter -----------------------------------------------------------

FORMS = """
import torch, torch.nn as nn, torch.nn.functional as F


class Forms(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(37, 97)
        self.w = nn.Parameter(torch.randn(29, 97) * 0.2)
        self.b = nn.Parameter(torch.randn(29))
        self.scale = 0.75
        self.out = nn.Linear(29, 37)
        self.gamma = nn.Parameter(torch.randn(37))
        self.pw = nn.Conv2d(37, 19, 1)
        self.mix = nn.Parameter(torch.randn(37, 23) * 0.2)
        self.shift = nn.Parameter(torch.randn(23))

    def forward(self, x, images, a, b):
        h = F.gelu(self.fc(x))
        z = torch.clamp(h @ self.w.t() * self.scale + self.b, -1.5, 1.5)
        y = x + self.gamma * self.out(z)
        c = torch.relu(self.pw(images))
        m = torch.tanh(torch.bmm(a, b)) * 2.0
        n = torch.sigmoid(torch.addmm(self.shift, y.reshape(-1, 37), self.mix))
        return y, c, m, n
"""

INPUTS = {"x": (3, 7, 37), "images": (2, 37, 5, 3), "a": (3, 9, 41), "b": (3, 41, 11)}
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def forms(request, tmp_path_factory):
    """The kernel module of FORMS analyzed in `dtype` (inputs and weights), imported."""
    from fuselens.contracts.config import model_settings
    from fuselens.contracts.options import AnalyzeOptions
    from fuselens.pipeline.analyze import analyze_file

    dtype = str(request.param).removeprefix("torch.")
    folder = tmp_path_factory.mktemp(f"forms_{dtype}")
    path = folder / "forms.py"
    path.write_text(textwrap.dedent(FORMS).lstrip())
    entry = {"inputs": [{"shape": list(s), "dtype": dtype} for s in INPUTS.values()], "param_dtype": dtype}
    report = analyze_file(str(path), AnalyzeOptions(models={"Forms": model_settings(entry, "the test")}))
    module_path = folder / "forms_kernels.py"
    module_path.write_text(module_for_report(report))
    spec = importlib.util.spec_from_file_location(f"forms_kernels_{dtype}", module_path)
    kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernels)
    return request.param, only_model(report), kernels


def random(*shape: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape) * scale).to(dtype)


def kernel_of(model, chain: str) -> str:
    cluster = next(c for c in model.clusters if c.op_chain == chain)
    assert cluster.kind == "gemm-epilogue" and cluster.kernel is not None, cluster
    return cluster.kernel.name


def check(kernels, name: str, args: list[torch.Tensor], eager, dtype: torch.dtype, launched: list[str]) -> None:
    """The public function against `eager` on `args`: forward (the fused kernel runs) and the gradients
    of every input (torch's GEMM, then the epilogue's backward kernel), each within the dtype's
    tolerance, or, where bf16's rounding of eager's intermediates moves a value across a clamp's bound,
    as close to the float64 gradient as eager's is."""
    tol = TOLERANCE[dtype]
    with torch.no_grad():
        got, want = getattr(kernels, name)(*args), eager(*args)
    assert f"_{name}_kernel_gemm" in launched, launched
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    launched.clear()
    upstream = torch.randn(want.shape, generator=torch.Generator().manual_seed(1))
    wanted, exact = gradients(eager, args, upstream), gradients(eager, [a.double() for a in args], upstream)
    got_grads = gradients(getattr(kernels, name), args, upstream)
    assert f"_{name}_kernel_gemm" not in launched and any(k.startswith(f"_{name}_epilogue_backward") for k in launched)
    for g, w, x in zip(got_grads, wanted, exact, strict=True):
        if not torch.allclose(g.float(), w.float(), atol=tol * 10, rtol=tol):
            scale = x.norm()
            assert (g.double() - x).norm() / scale <= 2 * (w.double() - x).norm() / scale + tol, (g, w)


def gradients(fn, args: list[torch.Tensor], upstream: torch.Tensor) -> list[torch.Tensor]:
    """The gradients of every input of `fn(*args)`, weighted by `upstream`."""
    leaves = [a.detach().clone().requires_grad_() for a in args]
    out = fn(*leaves)
    torch.autograd.backward(out, upstream.to(out.dtype))
    return [leaf.grad for leaf in leaves]


ROWS = [(1, 1), (1, 5), (3, 7), (2, 33)]  # M = 1, a few rows, rows no tile divides, more than a tile


@pytest.mark.interpreter
@pytest.mark.parametrize("rows", ROWS, ids=lambda r: "x".join(map(str, r)))
def test_bias_and_gelu_after_a_linear(forms, rows, kernel_launches):
    dtype, model, kernels = forms
    name = kernel_of(model, "linear → gelu")
    args = [random(*rows, 37, dtype=dtype), random(97, 37, dtype=dtype, scale=0.2), random(97, dtype=dtype)]
    check(kernels, name, args, lambda x, w, b: F.gelu(F.linear(x, w, b)), dtype, kernel_launches(kernels))


@pytest.mark.interpreter
def test_a_linear_of_a_transposed_activation(forms, kernel_launches):
    """x's leading dims do not lie one after another (a transposed batch): A is read as torch reads it."""
    dtype, model, kernels = forms
    name = kernel_of(model, "linear → gelu")
    x = random(7, 3, 37, dtype=dtype).transpose(0, 1)
    args = [x, random(97, 37, dtype=dtype, scale=0.2), random(97, dtype=dtype)]
    check(kernels, name, args, lambda x, w, b: F.gelu(F.linear(x, w, b)), dtype, kernel_launches(kernels))


@pytest.mark.interpreter
@pytest.mark.parametrize("rows", ROWS, ids=lambda r: "x".join(map(str, r)))
def test_scale_bias_and_clamp_after_a_product_by_a_transposed_weight(forms, rows, kernel_launches):
    """K = 97 is no multiple of the tile's K: its last step is masked; the weight is read transposed."""
    dtype, model, kernels = forms
    name = kernel_of(model, "matmul → mul → add → clamp")
    w = random(29, 97, dtype=dtype, scale=0.2)
    args = [random(*rows, 97, dtype=dtype), w.t(), random(29, dtype=dtype)]

    def eager(h, wt, b):
        return torch.clamp(h @ wt * 0.75 + b, -1.5, 1.5)

    check(kernels, name, args, eager, dtype, kernel_launches(kernels))


@pytest.mark.interpreter
@pytest.mark.parametrize("transposed", [False, True], ids=["residual", "transposed-residual"])
def test_a_layer_scaled_residual(forms, transposed, kernel_launches):
    """x + gamma * out(z): the residual read at the tile's positions (a copy laid out as the product
    where its own layout cannot be walked so), gamma along the columns."""
    dtype, model, kernels = forms
    name = kernel_of(model, "linear → mul → add")
    residual = random(7, 3, 37, dtype=dtype).transpose(0, 1) if transposed else random(3, 7, 37, dtype=dtype)
    args = [
        random(3, 7, 29, dtype=dtype),
        random(37, 29, dtype=dtype, scale=0.2),
        random(37, dtype=dtype),
        residual,
        random(37, dtype=dtype),
    ]
    cluster = next(c for c in model.clusters if c.kernel and c.kernel.name == name)
    assert [i.name for i in cluster.inputs] == ["z", "self.out.weight", "self.out.bias", "x", "self.gamma"]
    check(kernels, name, args, lambda z, w, b, x, g: x + g * F.linear(z, w, b), dtype, kernel_launches(kernels))


@pytest.mark.interpreter
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels-last"])
def test_a_pointwise_convolution_with_its_bias_and_relu(forms, channels_last, kernel_launches):
    """A 1x1 convolution is a GEMM per image (its weight by the image's pixels); its result takes the
    images' layout, as cuDNN's does."""
    dtype, model, kernels = forms
    name = kernel_of(model, "conv2d → add → relu")
    images = random(2, 37, 5, 3, dtype=dtype)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    args = [random(19, 37, 1, 1, dtype=dtype, scale=0.2), images, random(19, dtype=dtype)]
    check(
        kernels,
        name,
        args,
        lambda w, x, b: torch.relu(F.conv2d(x, w) + b[:, None, None]),
        dtype,
        kernel_launches(kernels),
    )
    with torch.no_grad():
        out = getattr(kernels, name)(*args)
    assert out.is_contiguous(memory_format=torch.channels_last) == channels_last


@pytest.mark.interpreter
def test_a_batched_product(forms, kernel_launches):
    dtype, model, kernels = forms
    name = kernel_of(model, "bmm → tanh → mul")
    args = [random(3, 9, 41, dtype=dtype, scale=0.3), random(3, 41, 11, dtype=dtype, scale=0.3)]
    check(kernels, name, args, lambda a, b: torch.tanh(torch.bmm(a, b)) * 2.0, dtype, kernel_launches(kernels))


@pytest.mark.interpreter
def test_addmm_and_its_bias(forms, kernel_launches):
    dtype, model, kernels = forms
    name = kernel_of(model, "addmm → sigmoid")
    args = [random(21, 37, dtype=dtype), random(37, 23, dtype=dtype, scale=0.2), random(23, dtype=dtype)]
    check(kernels, name, args, lambda y, w, b: torch.sigmoid(torch.addmm(b, y, w)), dtype, kernel_launches(kernels))


@pytest.mark.interpreter
def test_the_library_path_computes_the_same(forms):
    """The library's GEMM then the epilogue's own kernel: what runs where gradients are wanted, and where
    the fused kernel is the slower."""
    dtype, model, kernels = forms
    name = kernel_of(model, "linear → gelu")
    x, w, b = random(2, 5, 37, dtype=dtype), random(97, 37, dtype=dtype, scale=0.2), random(97, dtype=dtype)
    with torch.no_grad():
        torch.testing.assert_close(
            getattr(kernels, f"_{name}_library")(x, w, b).float(),
            getattr(kernels, f"_{name}_fused")(x, w, b).float(),
            atol=TOLERANCE[dtype],
            rtol=TOLERANCE[dtype],
        )


TRAINS_SLOWER = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class M(nn.Module):  # fuselens: input=(3, 7, 37) float32
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(37, 53)

    def forward(self, x):
        return F.gelu(self.fc(x))
"""


@pytest.mark.interpreter
def test_a_gemm_cluster_measured_slower_in_training_trains_through_its_original_code(tmp_path):
    """Where the user's validation measured the cluster's training step slower than torch.compile's, the
    applied module keeps the fused kernel for a forward without gradients, and a training step runs the
    lines it replaced (no kernel at all: its `fits` says no), with eager's gradients."""
    from test_training_policy import _applied, validated

    path = tmp_path / "model.py"
    path.write_text(TRAINS_SLOWER.lstrip("\n"))
    validated(str(path), 0.8, ops="linear → gelu")
    done = subprocess.run(
        [sys.executable, "-m", "fuselens.cli.main", "apply", str(path), "--yes", "--no-check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "training c0 (linear → gelu): trains through the original code" in " ".join(done.stdout.split())
    counts: list[str] = []
    model_class, kernels = _applied(str(path), counts)
    assert not hasattr(kernels, "_cluster0_trains")
    model = model_class()
    x = torch.randn(3, 7, 37, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(x), F.gelu(model.fc(x)), atol=1e-4, rtol=1e-4)
    assert counts == ["_cluster0_kernel_gemm"]
    counts.clear()
    leaf, plain = x.clone().requires_grad_(), x.clone().requires_grad_()
    model(leaf).sum().backward()
    F.gelu(model.fc(plain)).sum().backward()
    assert counts == []  # the lines as written, no kernel
    torch.testing.assert_close(leaf.grad, plain.grad)


# ---- the examples, applied ---------------------------------------------------------------------------

SMALL = """
[tool.fuselens.models.GeluMLP]
inputs = [[2, 9, 48]]
init = {dim = 48, hidden = 80}

[tool.fuselens.models.ClampedLogits]
inputs = [[2, 9, 48]]
init = {dim = 48, vocab = 72}

[tool.fuselens.models.LayerScaleResidual]
inputs = [[2, 9, 48], [2, 9, 80]]
init = {dim = 48, hidden = 80}
"""

RUN_BOTH = """
import importlib.util, os, sys, torch
os.environ["TRITON_INTERPRET"] = "1"
from triton.runtime.jit import KernelInterface


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


original, patched = load(sys.argv[1], "original"), load(sys.argv[2], "patched")
kernels = sys.modules["gemm_epilogues_kernels"]
launched = []


class Counted:
    def __init__(self, kernel, name):
        self.kernel, self.name = kernel, name

    def __getitem__(self, grid):
        launched.append(self.name)
        return self.kernel[grid]


for name, kernel in list(vars(kernels).items()):
    if isinstance(kernel, KernelInterface) and name.startswith("_cluster"):  # not the helpers kernels call
        setattr(kernels, name, Counted(kernel, name))
cases = {
    "GeluMLP": ({"dim": 48, "hidden": 80}, [(3, 5, 48)]),
    "ClampedLogits": ({"dim": 48, "vocab": 72}, [(3, 5, 48)]),
    "LayerScaleResidual": ({"dim": 48, "hidden": 80}, [(3, 5, 48), (3, 5, 80)]),
}
for cls, (init, shapes) in cases.items():
    torch.manual_seed(0)
    a = getattr(original, cls)(**init).eval()
    b = getattr(patched, cls)(**init).eval()
    b.load_state_dict(a.state_dict())
    inputs = [torch.randn(s) for s in shapes]
    with torch.no_grad():
        want, got = a(*inputs), b(*inputs)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    fused = [n for n in launched if n.endswith("_kernel_gemm")]
    assert len(fused) == 1, launched
    launched.clear()
    leaves = [[x.clone().requires_grad_() for x in inputs] for _ in range(2)]
    upstream = torch.randn(want.shape)
    torch.autograd.backward(a.train()(*leaves[0]), upstream)
    torch.autograd.backward(b.train()(*leaves[1]), upstream)
    assert not [n for n in launched if n.endswith("_kernel_gemm")] and any("_epilogue_backward" in n for n in launched)
    launched.clear()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-4, rtol=1e-4)
    for x, y in zip(*leaves):
        torch.testing.assert_close(y.grad, x.grad, atol=1e-4, rtol=1e-4)
    print(cls, "matches, forward and gradients")
"""


@pytest.mark.interpreter
@pytest.mark.slow
def test_the_examples_applied_by_the_cli_compute_what_they_did(tmp_path):
    """`fuselens apply` rewrites each model's lines to call its GEMM cluster; the patched models compute
    what the originals do, in eval mode (the fused kernel) and in a training step (torch's GEMM and the
    epilogue's backward kernel), with the kernels in the interpreter."""
    work = tmp_path / "project"
    work.mkdir()
    shutil.copy(GEMMS, work / "gemm_epilogues.py")
    (work / "pyproject.toml").write_text(SMALL)
    original = tmp_path / "original.py"
    shutil.copy(GEMMS, original)
    done = subprocess.run(
        [sys.executable, "-m", "fuselens.cli.main", "apply", "gemm_epilogues.py", "--yes"],
        capture_output=True,
        text=True,
        cwd=work,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    patched = (work / "gemm_epilogues.py").read_text()
    assert "        return self.fc2(cluster0(x, self.fc1.weight, self.fc1.bias) if cluster0.fits(" in patched
    assert "cluster1.fits(x, t := self.weight.t(), self.bias, self.scale, -self.cap, self.cap)" in patched
    assert "cluster2(h, self.fc2.weight, self.fc2.bias, x, self.gamma)" in patched
    module = (work / "gemm_epilogues_kernels.py").read_text()
    assert all(f"def _cluster{k}_kernel_gemm(" in module for k in range(3))
    run = subprocess.run(
        [sys.executable, "-c", RUN_BOTH, str(original), str(work / "gemm_epilogues.py")],
        capture_output=True,
        text=True,
        cwd=work,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("matches, forward and gradients") == 3, run.stdout


def test_the_validation_says_which_path_runs_at_the_shape_and_what_it_beat():
    """On a GPU each GEMM cluster's check says what the kernel module keeps at the validated shape: the
    fused kernel where it was the fastest, else the library's path, with the times it was chosen by."""
    fused = Timing(gemm_fused_us=1900.0, gemm_library_us=2100.0, gemm_kept="fused")
    assert kept_line(fused) == (
        "GEMM: the fused kernel 1900.0 µs, the library's GEMM and the epilogue's kernel 2100.0 µs; "
        "the fused kernel runs at this shape"
    )
    slower = Timing(gemm_fused_us=2300.0, gemm_library_us=2100.0, gemm_cublaslt_us=2050.0, gemm_kept="cublaslt")
    assert kept_line(slower).endswith(
        "cuBLASLt's GEMM with its epilogue runs at this shape (the fused kernel is not faster here, so it is not used)"
    )


def test_the_benchmarks_cpu_check_runs_every_cluster_in_the_interpreter(tmp_path):
    """`benchmarks/gemm_epilogue.py --cpu-check`: its steps (analysis at a size, the module, the traced
    inputs, each way of running a cluster checked against eager) on a CPU, small."""
    script = os.path.join(os.path.dirname(EXAMPLES), "benchmarks", "gemm_epilogue.py")
    done = subprocess.run(
        [sys.executable, script, "--cpu-check", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for model in ("GeluMLP", "ClampedLogits", "LayerScaleResidual"):
        assert f"{model} c" in done.stdout and "library ok, fused ok, offered ok; offers fused" in done.stdout
    assert (tmp_path / "results.md").exists()
