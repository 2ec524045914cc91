"""`fuselens apply` on every shipped example: the patched model computes what the original did.

Each example (and examples/pyproject.toml, which gives some of them their inputs) is copied into a
temporary folder and every cluster that applies is applied.  The original and the patched file are
loaded side by side, the patched model takes the original's weights, and on small inputs (the kernels
read sizes at call time) the two agree:

- in the Triton interpreter, where the kernels run (float32: to 1e-4; bfloat16: the patched model is
  no further from a float32 run than twice eager's distance from it);
- with TRITON_INTERPRET=0 on CPU, where every cluster runs its reference code: exactly;
- in another dtype than the kernels were generated for (they run the reference): exactly;
- under autograd: every gradient, the backward kernels running where the cluster has one;
- under torch.compile on CPU: close to eager.

And of all the clusters the examples have, at least 90% apply.
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.util
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from fuselens.contracts.options import AnalyzeOptions
from fuselens.pipeline.analyze import analyze_file
from fuselens.pipeline.apply import apply_file

from conftest import EXAMPLES, example

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.interpreter]

EXAMPLE_FILES = sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py") and not f.endswith("_kernels.py"))


@dataclass
class Case:
    file: str
    cls: str
    inputs: Callable[[torch.Generator], list[torch.Tensor]]  # small ones, float32 (or int64 token ids)
    dtype: torch.dtype = torch.float32  # the dtype the example is analyzed in (its kernels' dtype)
    init: dict = field(default_factory=dict)


def _tokens_and_targets(g: torch.Generator, vocab: int, shape: tuple[int, int]) -> list[torch.Tensor]:
    """Token ids and their next-token targets, the last position of each row ignored (-100)."""
    idx = torch.randint(0, vocab, shape, generator=g)
    targets = torch.roll(idx, -1, dims=1)
    targets[:, -1] = -100
    return [idx, targets]


CASES = {
    "branchy.py": Case("branchy.py", "GatedNet", lambda g: [torch.randn(8, 1024, generator=g)]),
    "conv_block.py": Case(
        "conv_block.py",
        "ResBlock",
        lambda g: [torch.randn(2, 128, 6, 10, generator=g), torch.randn(2, 512, generator=g)],
    ),
    "convnext_block.py": Case("convnext_block.py", "ConvNeXtBlock", lambda g: [torch.randn(2, 96, 6, 10, generator=g)]),
    "diffusion_block.py": Case(
        "diffusion_block.py",
        "DiffusionResBlock",
        lambda g: [torch.randn(2, 64, 6, 10, generator=g), torch.randn(2, 256, generator=g)],
    ),
    "example_net.py": Case("example_net.py", "ExampleNet", lambda g: [torch.randn(8, 1024, generator=g)]),
    "gemm_epilogues.py": Case(
        "gemm_epilogues.py", "GeluMLP", lambda g: [torch.randn(2, 9, 768, generator=g)], torch.bfloat16
    ),
    "gemma_norm.py": Case(
        "gemma_norm.py",
        "GemmaBlock",
        lambda g: [torch.randn(2, 12, 1024, generator=g), torch.randn(2, 12, 1024, generator=g)],
        torch.bfloat16,
    ),
    # A smaller vocabulary and two layers: the clusters are in the blocks, whose sizes stay the default.
    "gpt.py": Case(
        "gpt.py",
        "GPT",
        lambda g: [torch.randint(0, 512, (2, 16), generator=g)],
        init={"vocab": 512, "max_len": 64, "n_layers": 2},
    ),
    "llama_block.py": Case(
        "llama_block.py", "LlamaBlock", lambda g: [torch.randn(1, 24, 1024, generator=g)], torch.bfloat16
    ),
    "vit_block.py": Case("vit_block.py", "ViTBlock", lambda g: [torch.randn(2, 17, 1024, generator=g)]),
    # A small vocabulary: the loss's projection and its cross-entropy are rewritten as one fused loss.
    "gpt_loss.py": Case(
        "gpt_loss.py",
        "TinyLM",
        lambda g: _tokens_and_targets(g, vocab=512, shape=(2, 16)),
        init={"vocab": 512, "max_len": 64},
    ),
    "probe_planted.py": Case(
        "probe_planted.py", "Planted", lambda g: [torch.randn(32, 64, generator=g), torch.randn(8, 64, generator=g)]
    ),
    "nanogpt_attention.py": Case("nanogpt_attention.py", "Block", lambda g: [torch.randn(2, 16, 768, generator=g)]),
    "encoder_attention.py": Case(
        "encoder_attention.py",
        "EncoderLayer",
        lambda g: [
            torch.randn(2, 12, 768, generator=g),
            (torch.arange(12)[None, :] < torch.tensor([[12], [7]])).long(),
        ],
    ),
}


def test_every_example_has_a_case():
    assert sorted(CASES) == EXAMPLE_FILES


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Applied:
    case: Case
    original: type
    patched: type
    kernels: object  # the generated module
    applied: list[str]
    kernel_runs: Callable[..., bool]  # the module's own `_kernel_runs`
    launched: list[bool] = field(default_factory=list)  # what each call's `clusterN.fits` answered, in turn

    def models(self):
        """(original, patched) in eval mode, the patched one with the original's weights."""
        torch.manual_seed(0)
        a = self.original(**self.case.init).eval()
        b = self.patched(**self.case.init).eval()
        b.load_state_dict(a.state_dict())
        return a, b

    def inputs(self, dtype=None):
        xs = self.case.inputs(torch.Generator().manual_seed(1))
        dtype = dtype or self.case.dtype
        return [x.to(dtype) if x.is_floating_point() else x for x in xs]


@pytest.fixture(scope="module")
def applied(tmp_path_factory, monkeypatch_module):
    """applied(name) -> Applied; each example is copied, applied and loaded once for each setting of
    TRITON_INTERPRET it is first asked for under (Triton reads it as `@triton.jit` decorates: a
    module imported with it off launches compiled kernels, which a CPU cannot run), whichever of
    this file's tests asks first."""
    done: dict[tuple[str, str | None], Applied] = {}

    def get(name: str) -> Applied:
        key = (name, os.environ.get("TRITON_INTERPRET"))
        if key in done:
            return done[key]
        case = CASES[name]
        work = tmp_path_factory.mktemp(name.removesuffix(".py"))
        shutil.copy(example(name), work / name)
        shutil.copy(example("pyproject.toml"), work / "pyproject.toml")
        shutil.copy(example(name), work / f"original_{name}")
        result = apply_file(str(work / name), AnalyzeOptions(), None, lambda r: True)
        assert not result.refused and result.applied, (result.refused, result.skipped)
        stem = name.removesuffix(".py")
        kernels_name = f"{stem}_kernels"
        assert "@triton.jit" in (work / f"{kernels_name}.py").read_text()
        original = _load(work / f"original_{name}", f"original_{stem}")
        # The kernel module stays imported under its name, as in the user's process (torch.compile's
        # guards look it up there), until this file's tests are done: the monkeypatch then removes it.
        monkeypatch_module.delitem(sys.modules, kernels_name, raising=False)
        sys.path.insert(0, str(work))  # the patched file imports its kernels from beside it
        try:
            patched = _load(work / name, f"patched_{stem}")
        finally:
            sys.path.remove(str(work))
        kernels = sys.modules[kernels_name]
        decide = kernels._kernel_runs
        out = Applied(case, getattr(original, case.cls), getattr(patched, case.cls), kernels, result.applied, decide)

        def recorded(fits, *args, **kwargs):
            answer = fits(*args, **kwargs)
            out.launched.append(answer)
            return answer

        for kernel in [f for f in vars(kernels).values() if callable(getattr(f, "fits", None))]:
            monkeypatch_module.setattr(kernel, "fits", functools.partial(recorded, kernel.fits))
        done[key] = out
        return out

    return get


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _max_err(got, want) -> float:
    return (got.float() - want.float()).abs().max().item()


@pytest.mark.parametrize("name", EXAMPLE_FILES)
def test_kernels_in_the_interpreter_match_the_original(applied, name):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("TRITON_INTERPRET is set to something else than 1 in the environment")
    ex = applied(name)
    a, b = ex.models()
    xs = ex.inputs()
    ex.launched.clear()
    with torch.no_grad():
        if ex.case.dtype == torch.float32:
            want, got = a(*xs), b(*xs)
            assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), _max_err(got, want)
        else:  # bfloat16: both against a float32 run of the same weights on the same inputs
            exact = copy.deepcopy(a).float()(*[x.float() if x.is_floating_point() else x for x in xs])
            a, b = a.to(ex.case.dtype), b.to(ex.case.dtype)
            want, got = a(*xs), b(*xs)
            assert got.dtype == want.dtype
            eager_err, patched_err = _max_err(want, exact), _max_err(got, exact)
            assert patched_err <= 2 * eager_err, (patched_err, eager_err)
    assert ex.launched and all(ex.launched), ex.launched  # every fused call ran its kernel


@pytest.mark.parametrize("name", EXAMPLE_FILES)
def test_without_the_interpreter_the_lines_run_exactly(applied, name, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # read at call time: no kernel fits CPU tensors, the lines run
    ex = applied(name)
    a, b = (m.to(ex.case.dtype) for m in ex.models())
    xs = ex.inputs()
    ex.launched.clear()
    with torch.no_grad():
        want, got = a(*xs), b(*xs)
    _assert_computed_as_the_model(got, want, ex)
    assert ex.launched and not any(ex.launched)


@pytest.mark.parametrize("name", EXAMPLE_FILES)
def test_another_dtype_than_the_kernels_runs_the_lines_exactly(applied, name):
    ex = applied(name)
    other = torch.bfloat16 if ex.case.dtype == torch.float32 else torch.float32
    a, b = (m.to(other) for m in ex.models())
    xs = ex.inputs(other)
    ex.launched.clear()
    with torch.no_grad():
        want, got = a(*xs), b(*xs)
    assert got.dtype == want.dtype
    _assert_computed_as_the_model(got, want, ex, weights=other)
    assert ex.launched and not any(ex.launched)


def _assert_computed_as_the_model(got, want, ex, weights=None):
    """The lines run as written: the same bits, except where a convolution's bias is added after it
    (as on a GPU) rather than inside it (as a CPU's convolution does): one rounding; and where an
    attention was rewritten to `scaled_dot_product_attention`, which sums and normalises the scores in
    its own order: a few roundings of the output's dtype; and where a projection and its cross-entropy
    became one fused loss, which returns the loss in the logits' dtype before the code's upcast: one
    rounding of the weights' dtype."""
    with open(ex.patched.forward.__code__.co_filename, encoding="utf-8") as fh:
        applied_code = fh.read()
    if "linear_cross_entropy(" in applied_code:
        eps = torch.finfo(weights or ex.case.dtype).eps
        torch.testing.assert_close(got, want, rtol=eps, atol=0)
        return
    if "scaled_dot_product_attention(" in applied_code:
        eps = torch.finfo(want.dtype).eps
        torch.testing.assert_close(got, want, rtol=64 * eps, atol=64 * eps * float(want.abs().max()))
        return
    if "._conv_forward(" not in applied_code:
        assert torch.equal(got, want), _max_err(got, want)
        return
    eps = torch.finfo(want.dtype).eps
    torch.testing.assert_close(got, want, rtol=4 * eps, atol=4 * eps * float(want.abs().max()))


@pytest.mark.parametrize("name", EXAMPLE_FILES)
def test_autograd_runs_the_backward_kernels_and_every_gradient_matches(applied, name):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("TRITON_INTERPRET is set to something else than 1 in the environment")
    ex = applied(name)
    a, b = (m.to(ex.case.dtype) for m in ex.models())
    xa = [x.requires_grad_() if x.is_floating_point() else x for x in ex.inputs()]
    xb = [x.detach().clone().requires_grad_() if x.is_floating_point() else x for x in xa]
    ex.launched.clear()
    want, got = a(*xa), b(*xb)
    assert got.requires_grad
    cotangent = torch.randn(want.shape, generator=torch.Generator().manual_seed(2)).to(want.dtype)
    want.backward(cotangent)
    got.backward(cotangent)
    exact = _float64_gradients(a, xa, cotangent) if ex.case.dtype != torch.float32 else None
    pairs = [
        (y.grad, x.grad, f"input {k}") for k, (x, y) in enumerate(zip(xa, xb, strict=True)) if x.is_floating_point()
    ]
    grads = dict(b.named_parameters())
    pairs += [(grads[key].grad, p.grad, key) for key, p in a.named_parameters() if p.grad is not None]
    # A gradient that vanishes in exact arithmetic (a key projection's bias, which the softmax's invariance
    # to a shift of each row cancels) is rounding noise in both: it is judged against the largest gradient.
    largest = max(w.abs().max().item() for _, w, _ in pairs)
    for k, (g, w, what) in enumerate(pairs):
        assert g is not None, what
        if exact is None:
            scale = max(w.abs().max().item(), 1e-3 * largest)
            assert torch.allclose(g, w, atol=1e-4 * scale, rtol=1e-4), (what, _max_err(g, w))
        else:  # bfloat16: both against a float64 run, norm-wise (a weight's gradient sums many rows)
            truth = exact[k]
            eager_err, fused_err = ((w.double() - truth).norm()), ((g.double() - truth).norm())
            # The interpreter casts float32 to bfloat16 toward zero (torch and GPUs round to nearest):
            # each kernel's stores are off by up to one ulp, all the same way, and chained backward
            # kernels add up (3.7x eager's error at most on these examples, 1.3-2.9x kernel by kernel).
            assert fused_err <= 4 * eager_err, (what, fused_err.item(), eager_err.item())
    # Clusters with a backward kernel ran their kernels under autograd; the others their reference.
    assert any(ex.launched) == any(n.endswith("_trains") for n in vars(ex.kernels))


def _float64_gradients(model, inputs, cotangent):
    """The gradients of the inputs, then of the parameters that have one, of a float64 copy of `model`."""
    wide = copy.deepcopy(model).double()
    xs = [x.detach().double().requires_grad_() if x.is_floating_point() else x for x in inputs]
    wide(*xs).backward(cotangent.double())
    return [x.grad for x in xs if x.is_floating_point()] + [p.grad for p in wide.parameters() if p.grad is not None]


@pytest.mark.parametrize("name", EXAMPLE_FILES)
def test_torch_compile_on_cpu_is_close_to_eager(applied, name, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    ex = applied(name)
    monkeypatch.setattr(ex.kernels, "_kernel_runs", ex.kernel_runs)
    a, b = (m.to(ex.case.dtype) for m in ex.models())
    xs = ex.inputs()
    torch._dynamo.reset()
    compiled = torch.compile(b)
    with torch.no_grad():
        want, got = a(*xs), compiled(*xs)
        if ex.case.dtype == torch.float32:
            assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), _max_err(got, want)
        else:
            exact = copy.deepcopy(a).float()(*[x.float() if x.is_floating_point() else x for x in xs])
            assert _max_err(got, exact) <= 2 * _max_err(want, exact), (_max_err(got, exact), _max_err(want, exact))
    torch._dynamo.reset()


# Why a cluster of the examples may not apply: it spans two calls of a layer (the loop's `x = block(x)`
# also runs the rest of each block).
_SPANS_CALLS = "which is not part of the cluster"


def test_every_cluster_within_one_call_applies(capsys):
    rows, rewritten = [], set()
    for name in EXAMPLE_FILES:
        report = analyze_file(example(name), AnalyzeOptions())
        assert not report.problems, (name, report.problems)
        for model in report.models:
            rows += [(name, c.id, c.op_chain, c.applies, c.apply_detail) for c in model.clusters]
            # A cluster whose ops a pattern's rewrite computes (an attention's softmax) is fixed by it.
            rewritten |= {(name, cid) for p in model.patterns if p.rewrite for cid in p.rewrite.replaces}
    appliable = [r for r in rows if r[3] in ("edit", "patch")]
    with capsys.disabled():
        print(f"\nappliable clusters: {len(appliable)} of {len(rows)} ({len(appliable) / len(rows):.0%})")
        for name, cid, chain, applies, detail in rows:
            print(f"  {name} {cid} [{applies}] {chain}: {detail}")
    # Every other cluster applies (one on a branch the example inputs do not take too), and each one
    # that does not says so.
    unexplained = [
        f"{name} {cid} ({chain}): {detail}"
        for name, cid, chain, applies, detail in rows
        if applies == "no" and _SPANS_CALLS not in detail and (name, cid) not in rewritten
    ]
    assert not unexplained, unexplained
    assert all(applies != "no" or detail for _, _, _, applies, detail in rows)


def test_another_instance_computes_with_its_own_numbers(applied):
    """The numbers a kernel takes from the model's state (`self.eps`, `math.sqrt(self.head_dim)`) come
    from the caller at run time: an instance with other values gets its own results, in the kernel."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("TRITON_INTERPRET is set to something else than 1 in the environment")
    ex = applied("llama_block.py")  # analyzed in bf16: its kernels run on bf16 tensors
    a, b = ex.models()
    a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
    for model in (a, b):  # neither is the analyzed 1e-6, and the two norms differ: far beyond bf16's rounding
        model.attn_norm.eps, model.mlp_norm.eps = 0.5, 2.0
    xs = ex.inputs()
    ex.launched.clear()
    with torch.no_grad():
        exact = copy.deepcopy(a).float()(*[x.float() for x in xs])
        want, got = a(*xs), b(*xs)
    assert ex.launched and all(ex.launched)
    assert _max_err(got, exact) <= 2 * _max_err(want, exact), (_max_err(got, exact), _max_err(want, exact))


def test_a_group_count_the_kernel_was_not_made_for_runs_the_lines(applied, monkeypatch):
    """A group norm's group count shapes the kernel: with another, its `fits` says no and the lines run
    as written, and the result is the original's."""
    ex = applied("conv_block.py")
    launched = []
    for cid in ex.applied:
        call = f"_cluster{cid[1:]}_call"  # what the public function runs its kernel through
        monkeypatch.setattr(ex.kernels, call, functools.partial(_recording, getattr(ex.kernels, call), launched, cid))
    torch.manual_seed(0)
    a = ex.original(groups=16).eval()
    b = ex.patched(groups=16).eval()
    b.load_state_dict(a.state_dict())
    xs = ex.inputs()
    with torch.no_grad():
        want, got = a(*xs), b(*xs)
    _assert_computed_as_the_model(got, want, ex)
    chains = {
        c.id: c.op_chain for m in analyze_file(example("conv_block.py"), AnalyzeOptions()).models for c in m.clusters
    }
    assert [chains[cid] for cid in launched] == ["add → add → mul"]  # the group norms' lines ran


def _recording(call, launched, cid, *args):
    launched.append(cid)
    return call(*args)


def test_a_result_only_gemms_read_is_written_row_major(applied):
    """RoPE's q is a permuted view ((batch, seq, heads, dim) in memory); the matmul that reads the
    rotated q would copy it first, so the kernel writes it row-major instead, with the same values."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("TRITON_INTERPRET is set to something else than 1 in the environment")
    ex = applied("llama_block.py")
    rope = next(
        c
        for m in analyze_file(example("llama_block.py"), AnalyzeOptions()).models
        for c in m.clusters
        if c.op_chain == "mul → neg → cat → mul → add"
    )
    kernel = getattr(ex.kernels, rope.kernel.name)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 24, 8, 128, generator=g, dtype=torch.bfloat16).transpose(1, 2)
    cos, sin = (torch.randn(24, 128, generator=g, dtype=torch.bfloat16) for _ in range(2))
    reference = getattr(ex.kernels, f"_{rope.kernel.name}_reference")
    got, eager, exact = kernel(q, cos, sin), reference(q, cos, sin), reference(q.float(), cos.float(), sin.float())
    assert got.is_contiguous() and not eager.is_contiguous()
    assert _max_err(got, exact) <= 2 * _max_err(eager, exact)  # bf16 outputs: as in the interpreter test above


def test_a_cluster_on_the_branch_the_example_does_not_take_runs_when_it_is_taken(applied):
    """The branchy model's `else:` side is fused too; with weights that take it, its kernel runs and
    the patched model still computes what the original does."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("TRITON_INTERPRET is set to something else than 1 in the environment")
    ex = applied("branchy.py")
    a, b = ex.models()
    for model in (a, b):  # silu(-1.3) * 1.5 + 0.1 < 0: `h.mean() > 0` is False
        with torch.no_grad():
            model.inp.weight.zero_()
            model.inp.bias.fill_(-1.3)
    xs = ex.inputs()
    ex.launched.clear()
    with torch.no_grad():
        want, got = a(*xs), b(*xs)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), _max_err(got, want)
    assert len(ex.launched) == 3 and all(ex.launched)  # before the branch, the `else:` side, after it
