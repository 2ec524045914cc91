"""An applied fix runs a kernel only where it computes what the lines it replaced compute.

Each test applies a user's file, then runs the applied model beside the original, with the kernels
in the Triton interpreter: the kernels must run where they fit (every kernel launch is counted) and
the original lines everywhere else (another rank, another module set up otherwise, training mode),
and the outputs, gradients and running statistics must be the original's.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import textwrap
from dataclasses import dataclass, field

import pytest

from fuselens.contracts.options import AnalyzeOptions
from fuselens.pipeline.apply import apply_file

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

pytestmark = [pytest.mark.slow, pytest.mark.interpreter]


@dataclass
class Applied:
    original: object  # the user's module as written
    patched: object  # the same file after `fuselens apply`
    kernels: object  # its kernel module
    text: str  # the applied file's text
    fits: dict[str, list[bool]] = field(default_factory=dict)  # kernel -> what each call's `fits` answered
    launches: dict[str, int] = field(default_factory=dict)  # kernel -> launches of its forward kernel

    def reset(self) -> None:
        for answers in self.fits.values():
            answers.clear()
        self.launches.clear()


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def apply_source(tmp_path, source: str, stem: str, **options) -> Applied:
    """`source` written as `<stem>.py`, applied, and loaded beside its original, with its kernels watched."""
    text = textwrap.dedent(source).lstrip()
    (tmp_path / f"original_{stem}.py").write_text(text)
    path = tmp_path / f"{stem}.py"
    path.write_text(text)
    result = apply_file(str(path), AnalyzeOptions(**options), None, lambda r: True)
    assert result.applied and not result.refused, (result.refused, result.skipped)
    original = _load(str(tmp_path / f"original_{stem}.py"), f"original_{stem}")
    sys.modules.pop(f"{stem}_kernels", None)
    sys.path.insert(0, str(tmp_path))
    try:
        patched = _load(str(path), f"patched_{stem}")
    finally:
        sys.path.remove(str(tmp_path))
    kernels = sys.modules.pop(f"{stem}_kernels")
    applied = Applied(original, patched, kernels, path.read_text())
    for name, kernel in list(vars(kernels).items()):
        if callable(getattr(kernel, "fits", None)):
            kernel.fits = functools.partial(_answer, kernel.fits, applied.fits.setdefault(name, []))
            call = getattr(kernels, f"_{name}_call")  # what the public function runs its kernel through
            setattr(kernels, f"_{name}_call", functools.partial(_count, applied.launches, name, call))
    return applied


def _answer(fits, answers: list[bool], *args, **kwargs) -> bool:
    answer = fits(*args, **kwargs)
    answers.append(answer)
    return answer


def _count(launches: dict[str, int], name: str, call, *args):
    launches[name] = launches.get(name, 0) + 1
    return call(*args)


def _pair(applied: Applied, cls: str, *args, **kwargs):
    """The original's model and the applied file's, with the same weights."""
    torch.manual_seed(0)
    a = getattr(applied.original, cls)(*args, **kwargs)
    b = getattr(applied.patched, cls)(*args, **kwargs)
    b.load_state_dict(a.state_dict())
    return a, b


NORMS = """
import torch
import torch.nn as nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h.type_as(x) * self.weight


class Attention(nn.Module):  # fuselens: input=(2, 16, 64)
    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm = RMSNorm(dim)
        self.q_norm = RMSNorm(dim // heads)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        h = self.norm(x)
        q = self.proj(h).view(b, s, self.heads, d // self.heads)
        q = self.q_norm(q)
        return q.reshape(b, s, d) + h
"""


def test_one_function_called_at_two_ranks_asks_each_kernel(tmp_path):
    """The norm's lines run on the hidden states (rank 3) and on each head (rank 4): one kernel for
    each, asked in turn, both running; a rank neither was made for runs the lines."""
    applied = apply_source(tmp_path, NORMS, "norms")
    assert "        if cluster0.fits(" in applied.text and "        elif cluster1.fits(" in applied.text
    a, b = _pair(applied, "Attention")
    for shape in [(2, 16, 64), (3, 5, 64)]:  # the analyzed shape, and another batch and length
        x = torch.randn(*shape)
        applied.reset()
        with torch.no_grad():
            want, got = a(x), b(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert applied.launches == {"cluster0": 1, "cluster1": 1}, applied.launches
    applied.reset()
    flat = torch.randn(7, 64)  # rank 2: no kernel was made for it
    with torch.no_grad():
        assert torch.equal(b.norm(flat), a.norm(flat))
    assert applied.launches == {} and applied.fits == {"cluster0": [False], "cluster1": [False]}


BATCH_NORM = """
import torch
import torch.nn as nn


class ConvBN(nn.Module):  # fuselens: input=(4, 8, 12, 12)
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)

    def forward(self, x):
        x = self.conv(x)
        x = self.bn(x)
        return torch.relu(x) * 2.0
"""


def test_a_batch_norm_kernel_runs_in_eval_mode_and_the_lines_in_training(tmp_path):
    """Analyzed in eval mode, the batch norm is the running statistics' scale and shift: in training
    the lines run, normalising by the batch and updating the running statistics as eager does."""
    applied = apply_source(tmp_path, BATCH_NORM, "convbn")
    a, b = _pair(applied, "ConvBN")
    x = torch.randn(4, 8, 12, 12)
    with torch.no_grad():
        a.eval(), b.eval()
        torch.testing.assert_close(b(x), a(x), rtol=1e-5, atol=1e-5)
    assert applied.launches == {"cluster0": 1}
    applied.reset()
    a.train(), b.train()
    for step in range(2):
        x = torch.randn(4, 8, 12, 12)
        want, got = a(x), b(x)
        assert torch.equal(got, want), step
        (want.square().sum() + got.square().sum()).backward()
    assert applied.launches == {} and applied.fits == {"cluster0": [False, False]}
    assert torch.equal(b.conv.weight.grad, a.conv.weight.grad) and torch.equal(b.bn.weight.grad, a.bn.weight.grad)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.equal(getattr(b.bn, name), getattr(a.bn, name)), name
    assert int(b.bn.num_batches_tracked) == 2


MLP = """
import torch
import torch.nn as nn


class MLP(nn.Module):  # fuselens: input=(4, 32)
    def __init__(self, act: str = "silu", dim: int = 32, hidden: int = 64):
        super().__init__()
        self.gate = nn.Linear(dim, hidden)
        self.up = nn.Linear(dim, hidden)
        self.act = {"silu": nn.SiLU(), "gelu": nn.GELU(), "tanh-gelu": nn.GELU(approximate="tanh")}[act]
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        return self.drop(self.act(self.gate(x))) * self.up(x)
"""


def test_another_configuration_of_the_same_class_runs_its_own_lines(tmp_path):
    """The kernel was made for the analyzed MLP (SiLU, dropout in eval mode).  In the same process an
    MLP built with a GELU, or with a GELU set up otherwise, is left to the lines; so is the analyzed
    one in training, where its dropout drops."""
    applied = apply_source(tmp_path, MLP, "mlp")
    assert "module=self" in applied.text
    x = torch.randn(4, 32)
    for act in ("silu", "gelu", "tanh-gelu"):
        a, b = _pair(applied, "MLP", act=act)
        a.eval(), b.eval()
        applied.reset()
        with torch.no_grad():
            want, got = a(x), b(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert applied.launches == ({"cluster0": 1} if act == "silu" else {}), (act, applied.launches)
    a, b = _pair(applied, "MLP")
    a.train(), b.train()
    applied.reset()
    torch.manual_seed(1)
    got = b(x)
    torch.manual_seed(1)
    want = a(x)
    assert torch.equal(got, want) and applied.launches == {}
    assert (got == 0).any()  # it dropped


CONV_LAYERS = """
import torch
import torch.nn as nn


class ConvLayer(nn.Module):
    def __init__(self, channels: int, norm: bool = True, act: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm = nn.BatchNorm2d(channels) if norm else None
        self.act = nn.SiLU() if act else None

    def forward(self, x):
        x = self.conv(x)
        if self.norm is not None:
            x = self.norm(x)
        if self.act is not None:
            x = self.act(x)
        return x


class Net(nn.Module):  # fuselens: input=(2, 8, 6, 6)
    def __init__(self):
        super().__init__()
        self.first = ConvLayer(8)
        self.last = ConvLayer(8, act=False)

    def forward(self, x):
        return self.last(self.first(x))
"""


def test_lines_inside_ifs_run_the_kernel_where_the_ifs_take_that_branch(tmp_path):
    """The layer's norm and activation sit in `if`s; the kernel stands for both where both are there,
    and the question asks the `if`s' tests too: the layer without an activation runs its lines."""
    applied = apply_source(tmp_path, CONV_LAYERS, "conv_layers")
    assert "        if self.norm is not None and self.act is not None and cluster0.fits(" in applied.text
    a, b = _pair(applied, "Net")
    a.eval(), b.eval()
    x = torch.randn(2, 8, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(b(x), a(x), rtol=1e-5, atol=1e-5)
    assert applied.launches == {"cluster0": 1}, applied.launches  # `first`; `last` has no activation
    assert applied.fits["cluster0"] == [True]  # `last` was not asked: its `if` failed first


NORM_CASTS = """
import torch
import torch.nn as nn


class T5Norm(nn.Module):  # fuselens: input=(2, 5, 32)
    def __init__(self, dim: int = 32, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight.dtype in [torch.float16, torch.bfloat16]:
            hidden_states = hidden_states.to(self.weight.dtype)
        return self.weight * hidden_states
"""


def test_a_cast_that_changes_nothing_and_an_if_that_ran_nothing_stay_out_of_the_way(tmp_path):
    """T5's norm: `.to(torch.float32)` of a float32 input is no input computed in the middle, and the
    `if` for half-precision weights, which ran nothing, is asked false beside `fits`.  With bf16 weights
    the lines run, casting as the code says."""
    applied = apply_source(tmp_path, NORM_CASTS, "t5_norm")
    assert "if not (self.weight.dtype in [torch.float16, torch.bfloat16]) and cluster0.fits(" in applied.text
    a, b = _pair(applied, "T5Norm")
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        torch.testing.assert_close(b(x), a(x), rtol=1e-5, atol=1e-6)
        assert applied.launches == {"cluster0": 1}
        applied.reset()
        a.bfloat16(), b.bfloat16()
        assert torch.equal(b(x), a(x)) and applied.launches == {}


TWO_WIDTHS = """
import torch
import torch.nn as nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return h * self.weight


class Net(nn.Module):  # fuselens: input=(2, 6, 64)
    def __init__(self):
        super().__init__()
        self.wide = RMSNorm(64)
        self.down = nn.Linear(64, 32)
        self.narrow = RMSNorm(32)

    def forward(self, x):
        return self.narrow(self.down(self.wide(x)))
"""


def test_gradients_at_a_width_the_backward_was_not_made_for_take_that_widths_kernel(tmp_path):
    """The mean's derivative holds the row width the backward was made for (1/64): the kernel made for
    the 64-wide norm computes the 32-wide norm's forward, but in training it leaves the call to the
    kernel made for 32, so every gradient is the original's."""
    applied = apply_source(tmp_path, TWO_WIDTHS, "two_widths")
    a, b = _pair(applied, "Net")
    torch.manual_seed(0)
    for m in (a, b):
        m.train()
    for p in (*a.wide.parameters(), *a.narrow.parameters()):
        p.data.normal_()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 6, 64)
    want, got = a(x), b(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert applied.launches == {"cluster0": 1, "cluster1": 1}, applied.launches  # each width its own kernel
    want.square().sum().backward()
    got.square().sum().backward()
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
    applied.reset()
    with torch.no_grad():  # no gradient wanted: the first kernel computes the narrow norm too
        b.eval()(x)
    assert applied.launches == {"cluster0": 2}, applied.launches


ROTARY_POSITIONS = """
import torch
import torch.nn as nn


class Rotary(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim)))

    def forward(self, positions):
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        return freqs.cos() * 2.0, freqs.sin() * 2.0


class Net(nn.Module):  # fuselens: input=(16, 32)
    def __init__(self):
        super().__init__()
        self.rotary = Rotary(32)
        self.past = []

    def forward(self, x, positions=None):
        if positions is None:
            past = len(self.past)
            positions = torch.arange(x.shape[0]) + past
        cos, sin = self.rotary(positions)
        return x[:, :16] * cos + x[:, 16:] * sin
"""


def test_a_cluster_no_call_can_stand_in_for_runs_in_pieces_that_can(tmp_path, analyze):
    """The positions' add, the rotary embedding's ops and the product they feed are one cluster, but the
    add sits in an `if` that also runs other code: the rotary's ops (in the call `Net.forward` makes)
    and the product (made there directly) apply as two kernels, the add runs as written, and says why."""
    path = tmp_path / "model.py"
    path.write_text(ROTARY_POSITIONS.lstrip())
    report = analyze(str(path))
    (model,) = [m for m in report.models if m.name == "Net"]
    assert [(c.op_chain, c.applies) for c in model.clusters] == [
        ("cast → mul → cos → mul → sin → mul", "edit"),
        ("mul → mul → add", "edit"),
    ]
    (left,) = [r for r in model.rejections if r.lines == [24, 24]]
    assert "left out of the kernels of" in left.detail and "in the `if` on line 22" in left.detail
    applied = apply_source(tmp_path, ROTARY_POSITIONS, "rotary")
    assert "        if positions is None:\n            past = len(self.past)\n" in applied.text
    a, b = _pair(applied, "Net")
    x = torch.randn(16, 32, requires_grad=True)
    want = a(x)
    got = b(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert applied.launches == {"cluster0": 1, "cluster1": 1}
    (grad_got,) = torch.autograd.grad(got.sum(), x)
    (grad_want,) = torch.autograd.grad(want.sum(), x)
    torch.testing.assert_close(grad_got, grad_want)
    a.past, b.past = [1, 2], [1, 2]  # another past length: the positions move, the kernels still fit
    torch.testing.assert_close(b(x[:8]), a(x[:8]), rtol=1e-5, atol=1e-5)


TWO_LENGTHS = """
import torch
import torch.nn as nn


class Positions(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(64, 16)
        self.offset = 2

    def forward(self, x):
        ids = torch.arange(x.shape[1]) + self.offset
        return x + self.table(ids) * 2.0


class Net(nn.Module):  # fuselens: input=(2, 12, 16)
    def __init__(self):
        super().__init__()
        self.encoder = Positions()
        self.decoder = Positions()

    def forward(self, x):
        return self.encoder(x).sum() + self.decoder(x[:1, :5]).sum()
"""


def test_a_lookup_whose_kernel_takes_other_lengths_gets_the_gradient_of_each(tmp_path):
    """The encoder's and the decoder's positions are one function's lines at two sizes: the first
    kernel made for them fits both (the ids and the rows they read may be any number), and the
    table's gradient is summed to each call's own lookup, not to the analyzed one's."""
    applied = apply_source(tmp_path, TWO_LENGTHS, "lengths")
    a, b = _pair(applied, "Net")
    x = torch.randn(2, 12, 16)
    a(x).backward()
    b(x).backward()
    assert sum(applied.launches.values()) == 2, applied.launches
    for (name, want), got in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, msg=name)


EXPERTS_LOOP = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Experts(nn.Module):  # fuselens: input=(12, 32)
    def __init__(self):
        super().__init__()
        self.up = nn.Parameter(torch.randn(3, 32, 64) * 0.1)

    def forward(self, x):
        out = []
        for k, size in enumerate((5, 4, 3)):
            gate, up = (x[:size] @ self.up[k]).chunk(2, dim=-1)
            out.append(F.silu(gate) * up)
        return tuple(out)
"""


def test_lines_a_loop_runs_again_apply_once_for_every_iteration(tmp_path, analyze):
    """A loop evaluates `F.silu(gate) * up` once per expert, at each expert's token count: each
    evaluation's ops are a cluster of the same lines, not ops another call runs there, so the line
    is replaced and every iteration asks the kernels."""
    path = tmp_path / "model.py"
    path.write_text(EXPERTS_LOOP.lstrip())
    (model,) = analyze(str(path)).models
    assert [(c.op_chain, c.applies) for c in model.clusters] == [("silu → mul", "edit")] * 3, [
        c.apply_detail for c in model.clusters
    ]
    applied = apply_source(tmp_path, EXPERTS_LOOP, "experts")
    a, b = _pair(applied, "Experts")
    x = torch.randn(12, 32)
    want, got = a(x), b(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert sum(applied.launches.values()) == 3, applied.launches
    sum(w.sum() for w in want).backward()
    sum(g.sum() for g in got).backward()
    torch.testing.assert_close(b.up.grad, a.up.grad, rtol=1e-5, atol=1e-6)


SOFTCAP = """
import torch
import torch.nn as nn


class Scores(nn.Module):  # fuselens: input=(4, 32)
    def __init__(self, softcap=30.0):
        super().__init__()
        self.proj = nn.Linear(32, 32)
        self.softcap = softcap

    def forward(self, x):
        scores = self.proj(x) * 0.125
        if self.softcap is not None:
            scores = scores / self.softcap
            scores = torch.tanh(scores) * self.softcap
        return torch.softmax(scores, dim=-1)
"""


def _called(calls: list[int], *_) -> None:
    calls.append(1)


def test_an_input_computed_where_the_lines_sit_in_an_if_runs_once_where_the_if_holds(tmp_path):
    """The kernel's input `self.proj(x)` is computed on its first line, and the rest sits in an `if`:
    the rewrite asks the `if`'s test first, then computes the input once, for the kernel or for the
    lines; without a soft cap the lines run as written."""
    applied = apply_source(tmp_path, SOFTCAP, "softcap")
    assert "        if self.softcap is not None:\n            if cluster0.fits(proj := self.proj(x)" in applied.text
    x = torch.randn(4, 32)
    for softcap, launches in ((30.0, {"cluster0": 1}), (5.0, {"cluster0": 1}), (None, {})):
        a, b = _pair(applied, "Scores", softcap=softcap)
        applied.reset()
        calls: list[int] = []
        b.proj.register_forward_hook(functools.partial(_called, calls))
        with torch.no_grad():
            torch.testing.assert_close(b(x), a(x), rtol=1e-5, atol=1e-6)
        assert applied.launches == launches, (softcap, applied.launches)
        assert len(calls) == 1  # the projection runs once, kernel or not


SHORTCUT = """
import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x):
        h = self.conv(x)
        if self.shortcut is not None:
            x = x.contiguous()
            x = self.shortcut(x)
        return (x + h) * 0.5


class Net(nn.Module):  # fuselens: input=(2, 4, 6, 6)
    def __init__(self):
        super().__init__()
        self.widen = Block(4, 8)
        self.keep = Block(8, 8)

    def forward(self, x):
        return self.keep(self.widen(x))
"""


def test_a_block_with_and_without_its_shortcut_runs_each_kernel_where_its_if_holds(tmp_path):
    """The shortcut convolution sits in an `if` with other code: that `if` stays whole, running the
    convolution without its bias, which the kernel adds.  The block without a shortcut has a kernel of
    its own for the same lines: the `if`'s test chooses which rewrite runs."""
    applied = apply_source(tmp_path, SHORTCUT, "shortcut")
    assert "        if self.shortcut is not None:\n" in applied.text
    assert "        elif not (self.shortcut is not None):\n" in applied.text or (
        "        if not (self.shortcut is not None):\n" in applied.text
    )
    a, b = _pair(applied, "Net")
    x = torch.randn(2, 4, 6, 6)
    a.eval(), b.eval()
    with torch.no_grad():
        torch.testing.assert_close(b(x), a(x), rtol=1e-5, atol=1e-5)
    assert sum(applied.launches.values()) == 2, applied.launches  # each layer runs a kernel
    a.train(), b.train()
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    a(xa).square().sum().backward()
    b(xb).square().sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-5, msg=name)


STRAY_MODULE = """
import torch.nn as nn

ACTIVATIONS = {"silu": nn.SiLU, "gelu": nn.GELU}


def activated(x, kind):
    return ACTIVATIONS[kind]()(x * 2.0)


class Net(nn.Module):  # fuselens: input=(4, 32)
    def __init__(self, kind: str = "silu"):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        return activated(x, self.kind)
"""


def test_a_module_made_where_it_is_called_is_asked_again_and_checked(tmp_path):
    """`ACTIVATIONS[kind]()` makes its module at each call, none of the model's: the rewrite asks the
    expression again and the kernel runs only where it gives the SiLU the kernel computes; a net set up
    with a GELU runs its lines."""
    applied = apply_source(tmp_path, STRAY_MODULE, "stray")
    assert "made=(ACTIVATIONS[kind](),)" in applied.text
    x = torch.randn(4, 32)
    for kind, launches in (("silu", {"cluster0": 1}), ("gelu", {})):
        a, b = _pair(applied, "Net", kind=kind)
        applied.reset()
        with torch.no_grad():
            torch.testing.assert_close(b(x), a(x), rtol=1e-5, atol=1e-6)
        assert applied.launches == launches, (kind, applied.launches)


METHOD_OF_A_COMPUTED_VALUE = """
import torch
import torch.nn as nn


class Positions(nn.Module):  # fuselens: input=(2, 16)
    def forward(self, x):
        return torch.cumsum(x, dim=1).tanh() * 2.0 + 1.0
"""


def test_a_method_called_on_a_computed_value_takes_that_value_as_its_input(tmp_path):
    """`torch.cumsum(x, dim=1).tanh()`: the cumsum is the kernel's input, computed once where it stands."""
    applied = apply_source(tmp_path, METHOD_OF_A_COMPUTED_VALUE, "method_of_computed")
    assert "cluster0.fits(cumsum := torch.cumsum(x, dim=1))" in applied.text, applied.text
    a, b = _pair(applied, "Positions")
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(b(x), a(x), rtol=1e-5, atol=1e-6)
    assert applied.launches == {"cluster0": 1}


DROP_PATHS = """
import torch
import torch.nn as nn


class DropPath(nn.Module):
    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training:
            return x
        keep = (torch.rand(x.shape[0], 1, 1) >= self.p).to(x.dtype)
        return x * keep / (1 - self.p)


class Layer(nn.Module):
    def __init__(self, width: int, p: float):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.drop_path = DropPath(p) if p > 0 else nn.Identity()

    def forward(self, x, h):
        x = x + self.drop_path(h)
        return self.norm(x)


class Net(nn.Module):  # fuselens: input=(2, 8, 16)
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.first = Layer(16, 0.0)
        self.up = nn.Linear(16, 32)
        self.proj2 = nn.Linear(32, 32)
        self.second = Layer(32, 0.25)

    def forward(self, x):
        x = self.up(self.first(x, self.proj(x)))
        return self.second(x, self.proj2(x))
"""


def test_layers_whose_drop_path_is_an_identity_or_a_module_share_one_rewrite(tmp_path):
    """One layer's drop path is an `nn.Identity` (its kernel leaves the call out and checks for it), the
    other's a module of its own (its kernel takes the call's result): one rewrite passes the call to
    both kernels, and each layer runs one.  In training the module's drop path drops, and the kernel
    adds what it gave."""
    applied = apply_source(tmp_path, DROP_PATHS, "drop_paths")
    assert applied.text.count("drop_path := self.drop_path(h)") == 1, applied.text
    assert "cluster0.fits(x, drop_path," in applied.text and "cluster1(x, drop_path," in applied.text
    a, b = _pair(applied, "Net")
    x = torch.randn(2, 8, 16)
    a.eval(), b.eval()
    with torch.no_grad():
        torch.testing.assert_close(b(x), a(x), rtol=1e-5, atol=1e-5)
    assert sum(applied.launches.values()) == 2, applied.launches  # each layer runs a kernel
    a.train(), b.train()
    torch.manual_seed(3)
    want = a(x)
    torch.manual_seed(3)
    got = b(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
