"""Training with the generated kernels: backward kernels, their gradients checked, and a patched model
that trains like the original.

Each case is a small model file whose cluster is one of the kinds the kernels cover.  `validate_file`
(in the Triton interpreter) runs the cluster's forward kernel under autograd on the values a real trace
recorded, backpropagates seeded random gradients through the backward kernel, and compares every
input's and parameter's gradient with eager autograd's.  Shapes are small and ragged (odd widths, a
transposed input, a broadcast weight) so masks, strides and the sums of broadcast gradients are
exercised.
"""

from __future__ import annotations

import os
import re
import textwrap

import pytest

from fuselens.contracts.config import InputSpec
from fuselens.contracts.options import AnalyzeOptions, ValidateOptions
from fuselens.pipeline.analyze import analyze_file
from fuselens.pipeline.validate import validate_file

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.interpreter, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

HEADER = "import math\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"


def case(name, source, inputs, ops, wrt):
    """`inputs`: [(shape, dtype)]; `ops`: the cluster's op chain; `wrt`: the inputs (as the validation
    names them) whose gradients the backward kernel computes."""
    return pytest.param(source, inputs, ops, wrt, id=name)


KINDS = [
    case(
        "elementwise-broadcast-weight-and-bias",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.rand(777) + 0.5)
                self.b = nn.Parameter(torch.randn(777))

            def forward(self, x, y):
                return torch.tanh(x * self.w + self.b) * torch.sigmoid(y) - torch.exp(y * 0.1)
        """,
        [("5,777", "float32"), ("5,777", "float32")],
        "mul → add → tanh",
        ["x", "self.w", "self.b", "y"],
    ),
    case(
        "bounded-periodic-and-log-activations",
        """
        class M(nn.Module):
            def forward(self, x, y):
                a = torch.clamp(x, -0.5, 0.7) + F.hardtanh(y) + F.leaky_relu(x, 0.2)
                b = torch.erf(x) * torch.log1p(y.abs()) + torch.expm1(x * 0.1) + torch.sin(y) * torch.cos(x)
                return a * (b + F.relu6(y))
        """,
        [("4,33", "float32"), ("4,33", "float32")],
        "clamp → hardtanh → add → leaky_relu",
        ["x", "y"],
    ),
    case(
        # A ConvNeXt block's layer scale: channels-last values scaled, permuted back, added.
        "layer-scale-permuted-back",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.gamma = nn.Parameter(torch.rand(20) + 0.5)

            def forward(self, x, y):
                return x + (self.gamma * y).permute(0, 3, 1, 2)
        """,
        [("2,20,5,9", "float32"), ("2,5,9,20", "float32")],
        "mul → add",
        ["x", "self.gamma", "y"],
    ),
    case(
        # A residual sum with a convolution's bias: every gradient is the output's own (the bias's
        # summed over the batch and the pixels), so the backward passes it on and runs no kernel.
        "residual-sum-with-a-channel-bias",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.b = nn.Parameter(torch.randn(20))

            def forward(self, x, y):
                return x + self.b[:, None, None] + y
        """,
        [("2,20,5,9", "float32"), ("2,20,5,9", "float32")],
        "add → add",
        ["x", "self.b[:, None, None]", "y"],
    ),
    case(
        # The cluster starts by scaling its input in place, then adds to it in place (the input is a
        # projection's result, which autograd lets the model overwrite); the check differentiates
        # through the same in-place calls.
        "in-place-scale-and-add-into-the-input",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(33, 33)
                self.scale = nn.Parameter(torch.rand(33) + 0.5)

            def forward(self, x):
                h = self.proj(x)
                h.mul_(self.scale)
                h += x
                return torch.tanh(h) @ self.proj.weight
        """,
        [("5,33", "float32")],
        "mul → add → tanh",
        ["input0", "scale", "x"],
    ),
    case(
        # Falcon's parallel attention: the MLP's output takes the attention's in place, then the residual.
        "in-place-sum-of-two-branches-then-residual",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.mlp = nn.Linear(33, 33)
                self.attn = nn.Linear(33, 33)

            def forward(self, x):
                mlp_output = self.mlp(x)
                mlp_output += self.attn(x)
                return torch.sigmoid(mlp_output * 2.0 + x)
        """,
        [("5,33", "float32")],
        "linear → add → mul → add → sigmoid",
        # The first projection starts the cluster: its operands, and the other's result, are the call's.
        ["x", "self.mlp.weight", "self.mlp.bias", "self.attn(x)"],
    ),
    case(
        # ConvNeXt's LayerNorm over the channels of a depthwise convolution, read channels-last:
        # the input's gradient is written back channels-first, and the convolution's bias's is summed.
        "layernorm-over-permuted-channels-of-a-convolution",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(20, 20, 3, padding=1, groups=20)
                self.norm = nn.LayerNorm(20, eps=1e-6)
                with torch.no_grad():
                    self.norm.weight.uniform_(0.5, 1.5)
                    self.norm.bias.uniform_(-1, 1)

            def forward(self, x):
                return self.norm(self.conv(x).permute(0, 2, 3, 1))
        """,
        [("2,20,5,9", "float32")],
        "add → layer_norm",
        ["self.conv._conv_forward(x, self.conv.weight, None)", "self.conv.bias", "self.norm.weight", "self.norm.bias"],
    ),
    case(
        # Token and position embeddings: the tables' gradients are scattered by torch as eager
        # autograd does (the padding row left at zero), after the forward kernel.
        "embeddings-scaled-and-added",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.tok = nn.Embedding(50, 24, padding_idx=0)
                self.pos = nn.Embedding(16, 24)

            def forward(self, ids, positions):
                return self.tok(ids) * 2.0 + self.pos(positions)
        """,
        [("3,16", "int64"), ("16", "int64")],
        "embedding → mul → embedding → add",
        ["self.tok.weight", "self.pos.weight"],
    ),
    case(
        # BART's positions are moved to the embeddings' device: the device the model runs on, which
        # the reference and the gradients' torch code read from an input, never the analysis's meta.
        "embeddings-moved-to-the-model-s-device-then-normalised",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.tok = nn.Embedding(50, 24)
                self.pos = nn.Embedding(16, 24)
                self.norm = nn.LayerNorm(24)

            def forward(self, ids, positions):
                embeds = self.tok(ids) * 2.0
                return self.norm(embeds + self.pos(positions).to(embeds.device))
        """,
        [("3,16", "int64"), ("16", "int64")],
        "embedding → mul → embedding → add → layer_norm",
        ["self.tok.weight", "self.pos.weight", "self.norm.weight", "self.norm.bias"],
    ),
    case(
        "swiglu",
        """
        class M(nn.Module):
            def forward(self, gate, up):
                return F.silu(gate) * up
        """,
        [("3,7,333", "float32"), ("3,7,333", "float32")],
        "silu → mul",
        ["gate", "up"],
    ),
    case(
        "geglu-tanh",
        """
        class M(nn.Module):
            def forward(self, gate, up):
                return F.gelu(gate, approximate="tanh") * up
        """,
        [("9,500", "float32"), ("9,500", "float32")],
        "gelu → mul",
        ["gate", "up"],
    ),
    case(
        "gelu-erf-with-relu-and-division",
        """
        class M(nn.Module):
            def forward(self, x, y):
                return F.gelu(x) / (torch.relu(y) + 1.5) + torch.rsqrt(y * y + 1.0)
        """,
        [("6,130", "float32"), ("6,130", "float32")],
        "gelu → relu → add → div",
        ["x", "y"],
    ),
    case(
        "rope-rotate-half-transposed-q",
        """
        def rotate_half(x):
            x1 = x[..., : x.shape[-1] // 2]
            x2 = x[..., x.shape[-1] // 2 :]
            return torch.cat((-x2, x1), dim=-1)


        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("cos", torch.randn(5, 48))
                self.register_buffer("sin", torch.randn(5, 48))

            def forward(self, proj):
                q = proj.transpose(1, 2)
                return q * self.cos + rotate_half(q) * self.sin
        """,
        [("2,5,3,48", "float32")],
        "mul → neg → cat → mul → add",
        ["q"],
    ),
    case(
        "scaled-softmax",
        """
        class M(nn.Module):
            def forward(self, scores):
                return F.softmax(scores / 3.0, dim=-1)
        """,
        [("2,3,7,777", "float32")],
        "div → softmax",
        ["scores"],
    ),
    case(
        "log-softmax",
        """
        class M(nn.Module):
            def forward(self, logits):
                return F.log_softmax(logits * 1.0 + 0.5, dim=-1)
        """,
        [("11,1000", "float32")],
        "mul → add → log_softmax",
        ["logits"],
    ),
    case(
        # A language model's loss: the logits' gradient from the row log-sum-exp the forward kept,
        # over the targets that are not ignored (the recorded targets are 0-15, so some are 3).
        "cross-entropy-mean-ignore-index",
        """
        class M(nn.Module):
            def forward(self, logits, target):
                return F.cross_entropy(logits.float(), target, ignore_index=3)
        """,
        [("37,1000", "bfloat16"), ("37", "int64")],
        "cast → cross_entropy",
        ["logits"],
    ),
    case(
        "cross-entropy-sum-label-smoothing-rows-wider-than-a-block",
        """
        class M(nn.Module):
            def forward(self, logits, target):
                return F.cross_entropy(logits * 2.0, target, reduction="sum", label_smoothing=0.1)
        """,
        [("6,9000", "float32"), ("6", "int64")],
        "mul → cross_entropy",
        ["logits"],
    ),
    case(
        "cross-entropy-per-token",
        """
        class M(nn.Module):
            def forward(self, logits, target):
                return F.cross_entropy(logits, target, reduction="none", ignore_index=5) * 0.5
        """,
        [("13,333", "float32"), ("13", "int64")],
        "cross_entropy → mul",
        ["logits"],
    ),
    case(
        # The same loss spelled out per token: the pick's gradient is a one-hot, and the log-softmax's
        # backward takes its row sum from the pick and its softmax from the kept log-sum-exp.
        "log-softmax-pick-per-token",
        """
        class M(nn.Module):
            def forward(self, logits, target):
                return -F.log_softmax(logits.float(), dim=-1).gather(-1, target[..., None])
        """,
        [("2,7,1000", "bfloat16"), ("2,7", "int64")],
        "cast → log_softmax → gather → neg",
        ["logits"],
    ),
    case(
        "rmsnorm-module",
        """
        class RMSNorm(nn.Module):
            def __init__(self, dim, eps=1e-6):
                super().__init__()
                self.eps = eps
                self.weight = nn.Parameter(torch.rand(dim) + 0.5)

            def forward(self, x):
                h = x.float()
                h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
                return h.type_as(x) * self.weight


        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = RMSNorm(1000)

            def forward(self, x):
                return self.norm(x)
        """,
        [("3,5,1000", "float32")],
        "pow → mean → add → rsqrt → mul → mul",
        ["h", "self.weight"],
    ),
    case(
        # Rows wider than a whole-row kernel holds: the looped kernel, its weight gradient summed
        # by the launcher.
        "layernorm-rows-wider-than-a-block",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(8200)
                with torch.no_grad():
                    self.norm.weight.uniform_(0.5, 1.5)

            def forward(self, x):
                return self.norm(x * 2.0)
        """,
        [("3,8200", "float32")],
        "mul → layer_norm",
        ["x", "self.norm.weight", "self.norm.bias"],
    ),
    case(
        "residual-layernorm-two-outputs",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(300)
                with torch.no_grad():
                    self.norm.weight.uniform_(0.5, 1.5)
                    self.norm.bias.uniform_(-1, 1)

            def forward(self, x, y):
                h = x + y
                return h, self.norm(h)
        """,
        [("4,9,300", "float32"), ("4,9,300", "float32")],
        "add → layer_norm",
        ["x", "y", "self.norm.weight", "self.norm.bias"],
    ),
    # A diffusion block's norm: the convolution's bias and a time embedding added per channel, then
    # GroupNorm + SiLU; its groups hold 4 channels of 5 x 7 pixels, and the input's mean is far from 0.
    case(
        "embedding-add-groupnorm-silu",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.bias = nn.Parameter(torch.randn(16))
                self.norm = nn.GroupNorm(4, 16)
                with torch.no_grad():
                    self.norm.weight.uniform_(0.5, 1.5)
                    self.norm.bias.uniform_(-1, 1)

            def forward(self, h, emb):
                h = h * 3.0 + 5.0 + self.bias[:, None, None] + emb[:, :, None, None]
                return F.silu(self.norm(h))
        """,
        [("3,16,5,7", "float32"), ("3,16", "float32")],
        "group_norm → silu",
        ["h", "self.bias[:, None, None]", "emb[:, :, None, None]", "self.norm.weight", "self.norm.bias"],
    ),
    case(
        "groupnorm-without-weights-bf16",
        """
        class M(nn.Module):
            def forward(self, x):
                return F.group_norm(x, 2, eps=1e-3) * 2.0
        """,
        [("2,6,9,11", "bfloat16")],
        "group_norm → mul",
        ["x"],
    ),
]


@pytest.mark.parametrize("source, inputs, ops, wrt", KINDS)
def test_each_kind_of_cluster_trains_through_a_backward_kernel_that_matches_autograd(
    write_model, source, inputs, ops, wrt
):
    path = write_model(HEADER + textwrap.dedent(source).lstrip("\n"))
    options = AnalyzeOptions(input_shapes=[s for s, _ in inputs], dtypes=[d for _, d in inputs])
    report = analyze_file(path, options)
    (model,) = [m for m in report.models if m.status == "analyzed"]
    cluster = max(model.clusters, key=lambda c: len(c.ops))
    chain = cluster.op_chain.split(" → ")
    assert all(op in chain for op in ops.split(" → ")), cluster.op_chain
    assert cluster.backward, cluster.backward_detail
    specs = [InputSpec([int(n) for n in s.split(",")], d) for s, d in inputs]
    result = validate_file(path, options, ValidateOptions(interpret=True, shapes=specs))
    assert not result.problems, result.problems
    (checked,) = [c for m in result.models for c in m.clusters if c.id == cluster.id]
    assert checked.status == "verified", checked.message
    assert checked.backward is not None
    assert checked.backward.status == "verified", (checked.backward.message, checked.backward.max_abs)
    assert checked.backward.inputs == wrt


def _generated(write_model, source: str, inputs):
    """The kernel module generated for the single cluster of `source`, imported, and that cluster."""
    from fuselens.validate.runner import load_kernel_module

    path = write_model(HEADER + textwrap.dedent(source).lstrip("\n"))
    report = analyze_file(path, AnalyzeOptions(input_shapes=[s for s, _ in inputs], dtypes=[d for _, d in inputs]))
    (model,) = report.models
    (cluster,) = model.clusters
    module = load_kernel_module(report, os.path.join(os.path.dirname(path), "kernels_for_training.py"))
    return module, cluster


ROPE = """
    class M(nn.Module):
        def forward(self, q, cos, sin):
            return q * cos + torch.cat((-q[..., 8:], q[..., :8]), dim=-1) * sin
    """


def test_the_backward_check_catches_a_wrong_gradient(write_model, monkeypatch):
    """A backward kernel whose gradients are off by 5% is reported as a mismatch, not verified."""
    import fuselens.validate.runner as runner

    load = runner.load_kernel_module

    def load_wrong_backward(*args, **kwargs):
        module = load(*args, **kwargs)
        fit = module._fit
        module._fit = lambda *args: fit(*args) * 1.05
        return module

    monkeypatch.setattr(runner, "load_kernel_module", load_wrong_backward)
    path = write_model(HEADER + textwrap.dedent(ROPE).lstrip("\n"))
    options = AnalyzeOptions(input_shapes=["2,3,5,16", "5,16", "5,16"], dtypes=["float32"] * 3)
    result = validate_file(path, options, ValidateOptions(interpret=True))
    ((checked,),) = [m.clusters for m in result.models]
    assert checked.status == "verified"  # the forward is right
    assert checked.backward is not None and checked.backward.status == "mismatch"
    assert "exceeds" in checked.backward.message
    # Every input's gradient is compared, and the message names the one that is off.
    assert set(checked.backward.per_input) == set(checked.backward.inputs)
    assert checked.backward.message.startswith(f"the gradient of {checked.backward.worst_input}: ")


def test_the_backward_kernel_gives_the_gradients_autograd_asks_for(write_model):
    """RoPE's tables are model inputs here, so the backward kernel computes their gradients and q's
    (the halves of q it also takes are views of q: their gradients are in q's); whichever of them
    autograd wants, the gradients are eager's."""
    module, cluster = _generated(write_model, ROPE, [("2,3,5,16", "float32"), ("5,16", "float32"), ("5,16", "float32")])
    assert cluster.backward, cluster.backward_detail
    assert module._cluster0_trains == (0, 1, 4) and module._cluster0_folded == {2: 0, 3: 0}
    gen = torch.Generator().manual_seed(0)
    tensors = [torch.randn(s, generator=gen) for s in ((2, 3, 5, 16), (5, 16), (5, 16))]
    for needs in [(True, False, False), (True, True, True), (False, True, False)]:
        got = _grads(_with_halves(module.cluster0), tensors, needs)
        want = _grads(_with_halves(module._cluster0_reference), tensors, needs)
        for g, w in zip(got, want, strict=True):
            assert (g is None) == (w is None)
            if g is not None:
                torch.testing.assert_close(g, w)


def _with_halves(fn):
    """`fn(q, cos, q[..., 8:], q[..., :8], sin)`, as the applied edit calls the RoPE cluster."""
    return lambda q, cos, sin: fn(q, cos, q[..., 8:], q[..., :8], sin)


def _grads(fn, tensors, needs):
    leaves = [t.detach().clone().requires_grad_(n) for t, n in zip(tensors, needs, strict=True)]
    out = fn(*leaves)
    out.backward(torch.ones_like(out) * torch.arange(float(out.shape[-1])))
    return [leaf.grad for leaf in leaves]


BUFFER_ROPE = """
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cos", torch.randn(5, 16))
            self.register_buffer("sin", torch.randn(5, 16))

        def forward(self, q):
            return q * self.cos + torch.cat((-q[..., 8:], q[..., :8]), dim=-1) * self.sin
    """


def test_an_input_the_backward_does_not_cover_sends_the_cluster_to_its_reference(write_model, monkeypatch):
    """Buffers need no gradient, so the backward kernel computes q's alone; a caller who makes the
    table learnable gets the reference under autograd, with every gradient right."""
    module, _ = _generated(write_model, BUFFER_ROPE, [("2,3,5,16", "float32")])
    assert module._cluster0_trains == (0,) and module._cluster0_folded == {2: 0, 3: 0}
    launched = []
    decide = module._kernel_runs

    def recorded(*args, **kwargs):
        launched.append(decide(*args, **kwargs))
        return launched[-1]

    monkeypatch.setattr(module, "_kernel_runs", recorded)
    gen = torch.Generator().manual_seed(1)
    q, cos, sin = (torch.randn(s, generator=gen) for s in ((2, 3, 5, 16), (5, 16), (5, 16)))
    fused, reference = _with_halves(module.cluster0), _with_halves(module._cluster0_reference)
    got = _grads(fused, (q, cos, sin), (True, False, False))
    assert launched == [True, True]  # the forward kernel, then the backward kernel
    torch.testing.assert_close(got[0], _grads(reference, (q, cos, sin), (True, False, False))[0])
    launched.clear()
    got = _grads(fused, (q, cos, sin), (True, True, False))
    assert launched == [False]
    want = _grads(reference, (q, cos, sin), (True, True, False))
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


def _heads_gradient(fn, projected, upstream, cos, sin):
    """(the projection's gradient, the gradient's strides as the heads view receives it, the view's
    strides) when `fn`, RoPE, runs on a projection's [2, 5, 48] output viewed as [2, 3, 5, 16] heads
    and `upstream` flows back into it."""
    x = projected.clone().requires_grad_()
    heads = x.view(2, 5, 3, 16).transpose(1, 2)
    strides = []
    heads.register_hook(lambda g: strides.append(g.stride()))
    _with_halves(fn)(heads, cos, sin).backward(upstream)
    return x.grad, strides[0], heads.stride()


def test_the_gradient_of_a_view_of_heads_is_written_in_the_projection_s_layout(write_model):
    """q as attention reads it is a projection's [batch, seq, heads, dim] output viewed as
    [batch, heads, seq, dim]; its upstream gradient comes from a matmul, row-major.  The backward
    kernel writes q's gradient in q's own layout, so autograd's view back to the projection's shape
    is free (written row-major, the view would copy it), and it is eager's gradient."""
    module, _ = _generated(write_model, BUFFER_ROPE, [("2,3,5,16", "float32")])
    gen = torch.Generator().manual_seed(2)
    projected = torch.randn(2, 5, 3 * 16, generator=gen)
    upstream = torch.randn(2, 3, 5, 16, generator=gen)
    tables = torch.randn(5, 16, generator=gen), torch.randn(5, 16, generator=gen)
    got, got_strides, q_strides = _heads_gradient(module.cluster0, projected, upstream, *tables)
    want, want_strides, _ = _heads_gradient(module._cluster0_reference, projected, upstream, *tables)
    assert got_strides == q_strides and want_strides != q_strides  # eager's is row-major
    torch.testing.assert_close(got, want)


def test_a_transposed_upstream_gradient_is_read_down_its_memory_into_the_projection_s_layout(write_model, monkeypatch):
    """k's gradient from `q @ k.transpose(2, 3)` comes from the matmul transposed: stride 1 along the
    sequence, not the head's width.  The backward kernel reads it down the sequence and writes k's
    gradient along the width in k's projection layout (the across kernel), where the tile kernel
    would read it one element a row; the gradient is eager's."""
    module, _ = _generated(write_model, BUFFER_ROPE, [("2,3,5,16", "float32")])
    monkeypatch.setattr(module, "_ACROSS_MIN_BYTES", 0)  # the rule's floor is GPU-sized; these are tiny
    launched = []
    across = module._cluster0_backward_kernel_across

    class Recorded:
        def __getitem__(self, grid):
            launched.append("across")
            return across[grid]

    monkeypatch.setattr(module, "_cluster0_backward_kernel_across", Recorded())
    gen = torch.Generator().manual_seed(3)
    projected = torch.randn(2, 5, 3 * 16, generator=gen)
    upstream = torch.randn(2, 3, 16, 5, generator=gen).transpose(2, 3)  # as a matmul's transposed result
    tables = torch.randn(5, 16, generator=gen), torch.randn(5, 16, generator=gen)
    got, got_strides, k_strides = _heads_gradient(module.cluster0, projected, upstream, *tables)
    assert launched == ["across"] and got_strides == k_strides
    want, _, _ = _heads_gradient(module._cluster0_reference, projected, upstream, *tables)
    torch.testing.assert_close(got, want)


def test_gradients_that_are_the_output_s_own_are_passed_on_without_a_kernel(write_model):
    """A residual sum's backward computes nothing: the report says so, the module has no backward
    kernel, and the gradients (the bias's summed over batch and pixels) are eager's."""
    from fuselens.contracts.report import PASS_THROUGH_BACKWARD

    module, cluster = _generated(
        write_model,
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.b = nn.Parameter(torch.randn(6))

            def forward(self, x, y):
                return x + self.b[:, None, None] + y
        """,
        [("2,6,3,5", "float32"), ("2,6,3,5", "float32")],
    )
    assert cluster.backward == PASS_THROUGH_BACKWARD, cluster.backward_detail
    assert not hasattr(module, "_cluster0_backward_op")
    gen = torch.Generator().manual_seed(4)
    tensors = [
        torch.randn(2, 6, 3, 5, generator=gen),
        torch.randn(6, generator=gen),
        torch.randn(2, 6, 3, 5, generator=gen),
    ]
    # (the applied line passes the bias as it reads it: `cluster0(x, self.b[:, None, None], y)`)
    fused = lambda x, b, y: module.cluster0(x, b[:, None, None], y)  # noqa: E731
    reference = lambda x, b, y: module._cluster0_reference(x, b[:, None, None], y)  # noqa: E731
    wants = (True, True, True)
    for got, want in zip(_grads(fused, tensors, wants), _grads(reference, tensors, wants), strict=True):
        torch.testing.assert_close(got, want)


def test_the_backward_reference_runs_where_no_kernel_can(write_model, monkeypatch):
    """Without the interpreter (a CPU, no GPU) the forward and the backward are the reference code:
    the same gradients as eager to the last bit for a cluster whose derivative is written as torch
    computes it."""
    module, _ = _generated(
        write_model,
        """
        class M(nn.Module):
            def forward(self, gate, up):
                return F.silu(gate) * up
        """,
        [("4,64", "float32"), ("4,64", "float32")],
    )
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    gen = torch.Generator().manual_seed(3)
    gate, up, g = (torch.randn(4, 64, generator=gen) for _ in range(3))
    got = module._cluster0_gradients(gate, up, module._cluster0_reference(gate, up), g)
    a, b = gate.clone().requires_grad_(), up.clone().requires_grad_()
    want = torch.autograd.grad(module._cluster0_reference(a, b), (a, b), g)
    torch.testing.assert_close(list(got), list(want), rtol=0, atol=1e-6)


TRAINS = """
    class RMSNorm(nn.Module):
        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return h.type_as(x) * self.weight


    class Mlp(nn.Module):  # fuselens: input=(6, 96) float32
        def __init__(self, dim=96, hidden=160):
            super().__init__()
            self.norm = RMSNorm(dim)
            self.gate = nn.Linear(dim, hidden, bias=False)
            self.up = nn.Linear(dim, hidden, bias=False)
            self.down = nn.Linear(hidden, dim, bias=False)

        def forward(self, x):
            h = self.norm(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))
    """


def _applied_mlp(write_model, name: str):
    """(the original Mlp, the Mlp of the file after `fuselens apply`, with the original's weights, and
    the list that records each `_kernel_runs` answer of the kernel module, call by call)."""
    import importlib.util
    import sys

    from fuselens.pipeline.apply import apply_file

    path = write_model(HEADER + textwrap.dedent(TRAINS).lstrip("\n"), f"{name}.py")
    with open(path) as fh:
        original_source = fh.read()
    result = apply_file(path, AnalyzeOptions(), None, lambda r: True)
    assert result.applied and not result.refused, (result.refused, result.skipped)
    with open(path) as fh:
        patched_source = fh.read()
    folder = os.path.dirname(path)

    def load(module_name, text):
        file = os.path.join(folder, f"{module_name}.py")
        with open(file, "w") as fh:
            fh.write(text)
        spec = importlib.util.spec_from_file_location(module_name, file)
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, folder)  # the patched file imports its kernels from beside it
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(folder)
        return module

    original = load(f"original_{name}", original_source).Mlp()
    patched = load(f"patched_{name}", patched_source).Mlp()
    patched.load_state_dict(original.state_dict())
    kernels = sys.modules[f"{name}_kernels"]
    launched: list[bool] = []
    decide = kernels._kernel_runs

    def recorded(*args, **kwargs):
        launched.append(decide(*args, **kwargs))
        return launched[-1]

    kernels._kernel_runs = recorded
    return original, patched, launched


def test_a_patched_model_trains_like_the_original(write_model):
    """A few optimizer steps of the patched model (its RMSNorm, SwiGLU and residual kernels and their
    backward kernels, in the interpreter) follow the original's loss curve and end at its weights."""
    original, patched, launched = _applied_mlp(write_model, "mlp")
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(6, 96, generator=gen), torch.randn(6, 96, generator=gen)) for _ in range(4)]
    curves = []
    for model in (original, patched):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for x, target in batches:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(losses)
    torch.testing.assert_close(curves[1], curves[0], rtol=1e-4, atol=1e-5)
    for (key, a), b in zip(original.state_dict().items(), patched.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=key)
    assert launched and all(launched)  # every forward and backward call ran a kernel


def test_a_compiled_patched_model_trains_through_the_kernel_ops(write_model):
    """torch.compile of the patched model, forward and backward: the kernels' ops are in the compiled
    graph (traced once, with their autograd formulas), and every gradient is eager's."""
    original, patched, traced = _applied_mlp(write_model, "compiled_mlp")
    x = torch.randn(6, 96, generator=torch.Generator().manual_seed(4))
    torch._dynamo.reset()
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = original(xa), torch.compile(patched)(xb)
    cotangent = torch.randn(want.shape, generator=torch.Generator().manual_seed(5))
    want.backward(cotangent)
    got.backward(cotangent)
    assert traced and all(traced)  # compile traced the kernel ops, not the reference
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-4, atol=1e-5)
    for (key, p), q in zip(original.named_parameters(), patched.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=key)


GROUP_NORM = """
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.GroupNorm(4, 16)

        def forward(self, x):
            return F.silu(self.norm(x))
    """


def test_a_compiled_group_norm_trains_through_its_two_backward_kernels(write_model):
    """A GroupNorm's gradients are two kernels with torch code before and between them (its forward
    keeps each group's statistics: no kernel gathers them again); compiled whole (fullgraph), the
    backward graph torch.compile builds runs the two kernels' ops, and its gradients are eager's."""
    from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

    module, cluster = _generated(write_model, GROUP_NORM, [("2,16,5,7", "float32")])
    assert cluster.backward and cluster.backward.count(" + ") == 1, cluster.backward_detail
    graphs: list[set[str]] = []  # the ops of the forward graph, then of the backward graph

    def record(gm, example_inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return make_boxed_func(gm.forward)

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=record, bw_compiler=record)

    gen = torch.Generator().manual_seed(6)
    tensors = (torch.randn(2, 16, 5, 7, generator=gen) * 2 + 3, torch.rand(16, generator=gen), torch.randn(16))

    def gradients(fn):
        leaves = [t.clone().requires_grad_() for t in tensors]
        (fn(*leaves, 1e-5, 4) * torch.arange(7.0)).square().sum().backward()
        return [leaf.grad for leaf in leaves]

    torch._dynamo.reset()
    got = gradients(torch.compile(module.cluster0, fullgraph=True, backend=backend))
    torch._dynamo.reset()
    backward_ops = {op.rsplit(".", 2)[-2] for op in graphs[-1] if "cluster0" in op}
    assert backward_ops == {"cluster0_backward_sums", "cluster0_backward_last"}
    for g, w in zip(got, gradients(module._cluster0_reference), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_a_group_norm_s_gradients_read_channels_last_tensors_along_their_memory(write_model, kernel_launches):
    """Between convolutions (a ResBlock's GroupNorm + SiLU) the upstream gradient is channels-last, as
    cuDNN returns it, and the norm's input channels-first (the block's input) or channels-last (a
    convolution's result).  The sums over each (sample, channel)'s pixels take a block of channels
    down the tile and walk the pixels in column blocks (`_across_loop`: rows too wide for the whole-row
    across kernel), and the input's gradient reads the channels-last tensor down its tiles
    (`_across`), where the whole-row and tile kernels read it one element a row; the gradients are
    eager's."""
    module, _ = _generated(write_model, GROUP_NORM, [("2,16,33,33", "float32")])
    module._ACROSS_MIN_BYTES = 0  # (tensors this small go to the plain kernels otherwise)
    launched = kernel_launches(module)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, 33, 33, generator=gen) * 2 + 3
    weight, bias = torch.rand(16, generator=gen) + 0.5, torch.randn(16, generator=gen)
    upstream = torch.randn(2, 16, 33, 33, generator=gen).to(memory_format=torch.channels_last)

    def gradients(fn, x):
        leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
        return torch.autograd.grad(fn(*leaves, 1e-5, 4), leaves, upstream)

    for laid_out in (x, x.to(memory_format=torch.channels_last)):
        launched.clear()
        got = gradients(module.cluster0, laid_out)
        assert [k for k in launched if "_backward_" in k] == [
            "_cluster0_backward_sums_kernel_across_loop",
            "_cluster0_backward_last_kernel_across",
        ]
        for g, w in zip(got, gradients(module._cluster0_reference, laid_out), strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_what_is_added_before_a_group_norm_per_channel_gets_its_gradient_from_the_norm_s_sums(write_model):
    """A bias per channel and an embedding per (sample, channel) added before a GroupNorm (a
    ResBlock's convolution bias and time embedding): their gradients are the input gradient summed
    over each channel's pixels, which the norm's sums kernel gives with one more sum of what it reads
    anyway, so no torch reduction reads a full-size gradient again (two passes over it a ResBlock
    step, as eager autograd makes); they are eager's."""
    from torch.utils._python_dispatch import TorchDispatchMode

    module, _ = _generated(
        write_model, _kind("embedding-add-groupnorm-silu"), [("3,16,5,7", "float32"), ("3,16", "float32")]
    )
    gen = torch.Generator().manual_seed(4)
    tensors = [
        torch.randn(3, 16, 5, 7, generator=gen),
        torch.randn(16, 1, 1, generator=gen),
        torch.randn(3, 16, 1, 1, generator=gen),
        torch.rand(16, generator=gen) + 0.5,
        torch.randn(16, generator=gen),
    ]
    upstream = torch.randn(3, 16, 5, 7, generator=gen)
    summed: list[tuple[int, ...]] = []  # the shapes each torch sum read

    class Sums(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten.sum, torch.ops.aten.mean):
                summed.append(tuple(args[0].shape))
            return func(*args, **(kwargs or {}))

    def gradients(fn):
        leaves = [t.clone().requires_grad_() for t in tensors]
        out = fn(*leaves, 1e-5, 4)
        with Sums():
            return torch.autograd.grad(out, leaves, upstream)

    got = gradients(module.cluster0)
    assert (3, 16, 5, 7) not in summed, summed
    for g, w in zip(got, gradients(module._cluster0_reference), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


class _Chosen:
    """A kernel that records the tile and warps each launch picks (`kernel[grid](...)`), and launches
    nothing: the tensors are meta tensors, laid out as the model's would be."""

    def __init__(self, name: str, chosen: list):
        self.name, self.chosen = name, chosen

    def __getitem__(self, grid):
        def launch(*args, **constexprs):
            self.chosen.append(
                (self.name, constexprs.get("BLOCK_R"), constexprs.get("BLOCK_C"), constexprs.get("num_warps"))
            )

        return launch


def test_a_resblock_s_backward_kernels_at_gpu_size_read_channels_last_gradients_down_their_tiles(monkeypatch):
    """The ResBlock of examples/conv_block.py at [32, 256, 64, 64] in bf16, the GPU benchmarks' size:
    each GroupNorm's backward is its sums and its input's gradient (the forward kept the groups'
    statistics: no kernel gathers them again), and each reads the channels-last gradient cuDNN
    returns (and a channels-last input: a convolution's result) down its tiles, 32 channels of 64
    pixels a program, never the whole-row kernels that took 252-488 µs a launch on an H100 reading
    it one element a row.  The launchers run on meta tensors, their kernels recording what they
    were given."""
    from fuselens.contracts.config import model_settings
    from fuselens.validate.runner import load_kernel_module

    config = {"inputs": [[32, 256, 64, 64], [32, 512]], "init": {"channels": 256}, "param_dtype": "bfloat16"}
    config["inputs"] = [{"shape": s, "dtype": "bfloat16"} for s in config["inputs"]]
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "conv_block.py")
    report = analyze_file(path, AnalyzeOptions(models={"ResBlock": model_settings(config, "the test")}))
    (model,) = report.models
    assert [c.op_chain for c in model.clusters][:2] == ["group_norm → silu", "add → add → group_norm → silu"]
    module = load_kernel_module(report, os.path.join(os.environ["XDG_CACHE_HOME"], "resblock_kernels.py"))
    chosen: list = []
    for name in dir(module):
        if re.fullmatch(r"_cluster[01]_\w*kernel_\w+", name):
            monkeypatch.setattr(module, name, _Chosen(name, chosen))
    monkeypatch.setattr(module, "_shapes_only", lambda t: False)
    monkeypatch.setattr(module, "_sm_count", lambda: 132)  # an H100's multiprocessors
    bf16, last = torch.bfloat16, torch.channels_last

    def empty(*shape, layout=torch.contiguous_format):
        return torch.empty(*shape, device="meta", dtype=bf16, memory_format=layout).requires_grad_()

    norm = (empty(256), empty(256))
    upstream = torch.empty(32, 256, 64, 64, device="meta", dtype=bf16, memory_format=last)
    x = empty(32, 256, 64, 64)  # the block's input, channels-first
    h = empty(32, 256, 64, 64, layout=last)  # the first convolution's result, from channels-last values
    cases = {
        "cluster0": (x, *norm, 1e-5, 32),
        "cluster1": (h, empty(256), empty(32, 256, 1, 1), *norm, 1e-5, 32),
    }
    for name, args in cases.items():
        out = getattr(module, name)(*args)
        assert out.is_contiguous(memory_format=last)  # for the next convolution
        chosen.clear()
        torch.autograd.grad(out, [a for a in args if isinstance(a, torch.Tensor)], upstream)
        assert chosen == [
            (f"_{name}_backward_sums_kernel_across_loop", 32, 64, 4),
            (f"_{name}_backward_last_kernel_across", 64, 64, 4),
        ], chosen


def test_the_forward_keeps_only_what_the_backward_reads(write_model):
    """RoPE's gradient is RoPE's transpose: it reads the tables, never q, so the kernel op keeps the
    tables alone, as eager autograd does.  An RMSNorm's keeps its input, weight and per-row scale,
    where eager keeps the float copy and the normalised rows too; a residual + LayerNorm's, the sum
    it returns, the weight and each row's mean and reciprocal deviation; a GroupNorm's, its input and
    each (sample, group)'s mean and reciprocal deviation, which its gradients read instead of a
    pass over the input of their own."""
    rope = analyze_file(
        write_model(HEADER + textwrap.dedent(BUFFER_ROPE).lstrip("\n"), "rope.py"),
        AnalyzeOptions(input_shapes=["2,3,5,16"], dtypes=["float32"]),
    )
    ((cluster,),) = [m.clusters for m in rope.models]
    assert cluster.saved_bytes_fused == 0 and cluster.saved_bytes_eager == 0  # the tables are buffers: not counted
    assert cluster.backward_bytes_fused < cluster.backward_bytes_unfused
    norm = analyze_file(
        write_model(HEADER + textwrap.dedent(_kind("rmsnorm-module")).lstrip("\n"), "norm.py"),
        AnalyzeOptions(input_shapes=["3,5,1000"], dtypes=["bfloat16"]),
    )
    ((cluster,),) = [m.clusters for m in norm.models if m.status == "analyzed"]
    assert cluster.saved_bytes_fused == 3 * 5 * 1000 * 2 + 3 * 5 * 4  # (the weight is a parameter: not counted)
    assert cluster.saved_bytes_eager > 2 * cluster.saved_bytes_fused
    # A residual sum the cluster also returns: the backward reads the sum, not the two inputs again.
    residual = analyze_file(
        write_model(HEADER + textwrap.dedent(_kind("residual-layernorm-two-outputs")).lstrip("\n"), "residual.py"),
        AnalyzeOptions(input_shapes=["4,9,300", "4,9,300"], dtypes=["float32", "float32"]),
    )
    ((cluster,),) = [m.clusters for m in residual.models if m.status == "analyzed"]
    assert cluster.saved_bytes_fused == 4 * 9 * 300 * 4 + 4 * 9 * 2 * 4  # the sum and the row stats
    group = analyze_file(
        write_model(HEADER + textwrap.dedent(GROUP_NORM).lstrip("\n"), "group.py"),
        AnalyzeOptions(input_shapes=["2,16,5,7"], dtypes=["float32"]),
    )
    ((cluster,),) = [m.clusters for m in group.models if m.status == "analyzed"]
    assert cluster.saved_bytes_fused == 2 * 16 * 5 * 7 * 4 + 2 * 4 * 2 * 4  # the input and the group stats
    assert cluster.backward.count(" + ") == 1  # the sums, then the input's gradient


def test_an_input_the_gradients_do_not_read_is_not_kept_whatever_it_is_called(write_model):
    """`e`'s gradient is the upstream one times 1e-05, which reads no value: the forward keeps `x` (tanh's
    gradient reads it) and not `e`, though `e` is spelled inside that literal.  What the gradients read is
    what they are made of, never names picked out of their text."""
    source = """
        class M(nn.Module):
            def forward(self, x, e):
                return torch.tanh(x) + e * 1e-05
    """
    report = analyze_file(
        write_model(HEADER + textwrap.dedent(source).lstrip("\n"), "scaled.py"),
        AnalyzeOptions(input_shapes=["4,33", "4,33"], dtypes=["float32", "float32"]),
    )
    ((cluster,),) = [m.clusters for m in report.models if m.status == "analyzed"]
    assert cluster.backward and [i.name for i in cluster.inputs] == ["x", "e"]
    assert cluster.saved_bytes_fused == 4 * 33 * 4  # x alone


EMBEDDING_THEN_RESIDUAL = """
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(5000, 64)
            self.norm = nn.LayerNorm(64)
            self.proj = nn.Linear(64, 64)
            self.norm2 = nn.LayerNorm(64)

        def forward(self, ids):
            x = self.norm(self.emb(ids) * 8.0)
            h = self.proj(x)
            return self.norm2(h + x)
"""


def test_what_lives_anyway_is_not_counted_as_kept_for_the_backward(write_model):
    """An embedding's table is a parameter, alive as long as the model: the fused forward reading it
    again in the backward costs no memory.  A residual + LayerNorm keeps both addends where eager
    keeps their sum, but one addend is also kept by the projection that reads it: the fused forward
    adds one tensor, as eager does.  So neither cluster, nor the training line, says the fused
    forward keeps more than eager autograd."""
    report = analyze_file(
        write_model(HEADER + textwrap.dedent(EMBEDDING_THEN_RESIDUAL).lstrip("\n"), "embedded.py"),
        AnalyzeOptions(input_shapes=["2,32"], dtypes=["int64"]),
    )
    (model,) = [m for m in report.models if m.status == "analyzed"]
    embedding, residual = sorted(model.clusters, key=lambda c: c.lines[0])
    assert "embedding" in embedding.op_chain and embedding.backward
    assert embedding.saved_bytes_fused <= embedding.saved_bytes_eager < 5000 * 64 * 4
    assert residual.backward and residual.saved_bytes_fused <= residual.saved_bytes_eager
    assert residual.saved_bytes_fused == 2 * 32 * 64 * 4  # the projection's output alone


def _kind(name: str) -> str:
    """The model source of the case `name` in KINDS."""
    return next(p.values[0] for p in KINDS if p.id == name)


DROPOUT = """
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.1)
            self.norm = nn.LayerNorm(256)

        def forward(self, x):
            h = self.drop(F.gelu(x * 2.0))
            return self.norm(h + x)
    """


def test_training_mode_leaves_dropout_out_of_the_clusters(write_model):
    """In eval mode dropout is the identity and one kernel runs across it; analyzed as the model
    trains, dropout draws a random mask, and the clusters stop at it on both sides."""
    path = write_model(HEADER + textwrap.dedent(DROPOUT).lstrip("\n"))
    shapes = dict(input_shapes=["64,256"], dtypes=["float32"])
    (evaluated,) = analyze_file(path, AnalyzeOptions(**shapes)).models
    (trained,) = analyze_file(path, AnalyzeOptions(train=True, **shapes)).models
    assert not evaluated.training and trained.training
    assert [c.op_chain for c in evaluated.clusters] == ["mul → gelu → add → layer_norm"]
    assert [c.op_chain for c in trained.clusters] == ["mul → gelu", "add → layer_norm"]
    assert all(c.backward for c in trained.clusters)


def test_generating_backward_kernels_leaves_no_files_behind(write_model, tmp_path, monkeypatch):
    """The gradients' code is traced from a file of its own; every analysis of a training cluster
    would otherwise leave one more folder in the machine's temporary directory."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    path = write_model(HEADER + textwrap.dedent(_kind("rmsnorm-module")).lstrip("\n"), "norm.py")
    report = analyze_file(path, AnalyzeOptions(input_shapes=["3,5,1000"], dtypes=["float32"]))
    assert any(c.backward for m in report.models for c in m.clusters)
    assert list(scratch.iterdir()) == []


# Clusters that take numbers of the model's state, each with other values than the analyzed instance's
# for them.  A number the kernels take as an argument (`kernel=True`: a scale, an eps) keeps the kernels
# running, forward and backward, with the caller's value; one that shapes them (a clamp's bounds, a group
# count, an ignored class) sends the call to the reference.
NUMBERS = [
    pytest.param(
        """
        class M(nn.Module):
            def __init__(self, hd=128):
                super().__init__()
                self.hd = hd

            def forward(self, scores):
                return F.softmax(scores / self.hd ** 0.5, dim=-1)
        """,
        [("2,3,5,7", "float32")],
        {"value0": 64**0.5},
        True,
        id="softmax-scale-of-another-head-width",
    ),
    pytest.param(
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(48, eps=1e-5)

            def forward(self, x):
                return F.gelu(self.norm(x))
        """,
        [("4,48", "float32")],
        {"eps": 0.5},
        True,
        id="layer-norm-eps-row-recomputed",
    ),
    pytest.param(
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.eps = 1e-6
                self.weight = nn.Parameter(torch.ones(300))

            def forward(self, x, y):
                return F.rms_norm(x, x.shape[-1:], self.weight, self.eps) * torch.sigmoid(y)
        """,
        [("3,300", "float32"), ("3,300", "float32")],
        {"eps": 0.7},
        True,
        id="rms-norm-eps-row-statistics-kept",
    ),
    pytest.param(
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.gain, self.lo, self.hi = 1.5, -0.5, 0.5

            def forward(self, x):
                return torch.clamp(x * self.gain, self.lo, self.hi).exp()
        """,
        [("4,33", "float32")],
        {"gain": 0.75},
        True,
        id="scale-before-a-clamp",
    ),
    pytest.param(
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.gain, self.lo, self.hi = 1.5, -0.5, 0.5

            def forward(self, x):
                return torch.clamp(x * self.gain, self.lo, self.hi).exp()
        """,
        [("4,33", "float32")],
        {"lo": -0.1, "hi": 0.9},
        False,
        id="clamp-bounds",
    ),
    pytest.param(
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.GroupNorm(3, 6)

            def forward(self, x):
                return self.norm(x) * 2.0
        """,
        [("2,6,3,5", "float32")],
        {"num_groups": 2},
        False,
        id="group-count",
    ),
    pytest.param(
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.GroupNorm(3, 6)

            def forward(self, x):
                return self.norm(x) * 2.0
        """,
        [("2,6,3,5", "float32")],
        {"eps": 0.5},
        True,
        id="group-norm-eps",
    ),
    pytest.param(
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.temperature, self.ignored = 2.0, 3

            def forward(self, logits, target):
                return F.cross_entropy(logits / self.temperature, target, ignore_index=self.ignored)
        """,
        [("6,7", "float32"), ("6", "int64")],
        {"ignored": 5},
        False,
        id="cross-entropy-ignore-index",
    ),
    pytest.param(
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.temperature, self.ignored = 2.0, 3

            def forward(self, logits, target):
                return F.cross_entropy(logits / self.temperature, target, ignore_index=self.ignored)
        """,
        [("6,7", "float32"), ("6", "int64")],
        {"temperature": 0.5},
        True,
        id="cross-entropy-temperature",
    ),
    pytest.param(
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(7, 12, padding_idx=2)

            def forward(self, ids):
                return self.emb(ids) * 3.0
        """,
        [("4,5", "int64")],
        {"padding_idx": 4},
        False,
        id="embedding-padding-row",
    ),
]


@pytest.mark.parametrize("source, inputs, others, kernel", NUMBERS)
def test_gradients_compute_with_the_numbers_the_forward_was_called_with(
    write_model, monkeypatch, kernel_launches, source, inputs, others, kernel
):
    """The public function called with the analyzed numbers runs its kernels both ways; called with
    others, it runs them with those (`kernel`) or the reference, and either way every gradient is eager
    autograd's for the numbers it was called with, not for the analyzed ones."""
    import inspect

    module, cluster = _generated(write_model, source, inputs)
    assert cluster.backward, cluster.backward_detail
    assert set(others) <= {n.name for n in cluster.numbers}, cluster.numbers
    launched = kernel_launches(module)
    referenced: list[str] = []
    for name in ("_cluster0_reference", "_cluster0_backward_reference"):
        monkeypatch.setattr(module, name, _Called(getattr(module, name), name, referenced))
    trained_by_kernels = any(name.startswith("_cluster0_backward") and "_kernel" in name for name in vars(module))
    public = module.cluster0
    defaults = {p.name: p.default for p in inspect.signature(public).parameters.values() if p.default is not p.empty}
    gen = torch.Generator().manual_seed(4)
    tensors = [  # the cluster's inputs: the model's, and its parameters
        torch.randint(0, 7, info.shape, generator=gen)
        if info.dtype == "int64"
        else torch.randn(info.shape, generator=gen)
        for info in cluster.inputs
    ]
    for numbers in (defaults, {**defaults, **others}):
        launched.clear()
        referenced.clear()
        got = _gradients(public, tensors, numbers)
        if kernel or numbers == defaults:  # the kernels, both ways
            assert any("backward" not in k for k in launched), launched
            # (Without a backward kernel, torch's code is the backward: an embedding's table's scatter.)
            assert any("backward" in k for k in launched) == trained_by_kernels, launched
            assert referenced == [], referenced
        else:  # the model's own ops, under autograd
            assert launched == [] and referenced == ["_cluster0_reference"], (launched, referenced)
        want = _gradients(module._cluster0_reference.function, tensors, numbers)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def _gradients(fn, tensors, numbers):
    """The gradients of every floating tensor of `fn(*tensors, **numbers)`, for a seeded upstream one."""
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]
    out = fn(*leaves, **numbers)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    out.backward(upstream)
    return [leaf.grad for leaf in leaves if leaf.requires_grad]


class _Called:
    """A function of the module that records its name at each call."""

    def __init__(self, function, name: str, called: list[str]):
        self.function, self.name, self.called = function, name, called

    def __call__(self, *args, **kwargs):
        self.called.append(self.name)
        return self.function(*args, **kwargs)
