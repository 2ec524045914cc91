"""The kernel module's fused linear cross-entropy (`codegen/runtime/linear_loss.py`) against eager's
`F.cross_entropy(F.linear(x, W, b), t)`: the loss and the gradients of the input, the weight and the bias,
over several chunks, with ignored targets, label smoothing and every reduction; its rows in the Triton
interpreter and in torch's code (a CPU without the interpreter)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fuselens.codegen.runtime.linear_loss import linear_cross_entropy

TOKENS, HIDDEN, VOCABULARY = (2, 37), 16, 300  # 74 tokens: chunks of 16 leave a partial last one


def case(dtype, bias: bool, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(*TOKENS, HIDDEN, generator=generator).to(dtype)
    weight = (torch.randn(VOCABULARY, HIDDEN, generator=generator) * 0.3).to(dtype)
    b = (torch.randn(VOCABULARY, generator=generator) * 0.1).to(dtype) if bias else None
    target = torch.randint(0, VOCABULARY, TOKENS, generator=generator)
    target[0, :6] = -100  # padding
    return x, weight, b, target


def eager(x, weight, b, target, upcast, **loss):
    logits = F.linear(x, weight, b)
    logits = logits.float() if upcast else logits
    return F.cross_entropy(logits.view(-1, VOCABULARY), target.view(-1), **loss)


def loss_and_gradients(fn, tensors, upstream):
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in tensors]
    out = fn(*leaves)
    wrt = [t for t in leaves if t is not None]
    return out.detach(), [g.detach() for g in torch.autograd.grad(out, wrt, upstream(out))]


def upstream_of(out):
    return torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).reshape(out.shape)


@pytest.fixture(params=[pytest.param("interpreter", marks=pytest.mark.interpreter), "torch"])
def rows_in(request, monkeypatch):
    """Where each chunk's rows run: the Triton kernel (in the interpreter) or torch's code."""
    if request.param == "torch":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    return request.param


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_float32_matches_eager(rows_in, reduction, smoothing):
    x, weight, b, target = case(torch.float32, bias=True)
    loss = {"ignore_index": -100, "label_smoothing": smoothing, "reduction": reduction}
    want, want_grads = loss_and_gradients(lambda *t: eager(*t, target, False, **loss), [x, weight, b], upstream_of)
    got, got_grads = loss_and_gradients(
        lambda x, w, b: linear_cross_entropy(x, w, target.view(-1), b, chunk=16, **loss), [x, weight, b], upstream_of
    )
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for name, g, w in zip(("input", "weight", "bias"), got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
    assert (got_grads[0][0, :6] == 0).all()  # an ignored token's input gets no gradient


@pytest.mark.parametrize("upcast", [True, False], ids=["upcast", "bf16-loss"])
def test_bfloat16_is_as_close_to_float64_as_eager(rows_in, upcast):
    """Eager computes the logits in bf16 and (upcast) the loss in float32, or (not) its log-probabilities
    in bf16; the fused loss takes the bf16 logits of the same GEMM and computes the rest in float32.  Each
    is compared with the loss computed in float64 from the same bf16 inputs: the fused loss's error is
    within eager's, give or take one bf16 rounding."""
    x, weight, b, target = case(torch.bfloat16, bias=True, seed=1)
    loss = {"ignore_index": -100, "reduction": "mean"}
    exact, exact_grads = loss_and_gradients(
        lambda *t: eager(*t, target, True, **loss), [x.double(), weight.double(), b.double()], upstream_of
    )
    want, want_grads = loss_and_gradients(lambda *t: eager(*t, target, upcast, **loss), [x, weight, b], upstream_of)
    dtype = torch.float32 if upcast else None
    got, got_grads = loss_and_gradients(
        lambda x, w, b: linear_cross_entropy(x, w, target.view(-1), b, loss_dtype=dtype, chunk=16, **loss),
        [x, weight, b],
        upstream_of,
    )
    assert got.dtype == want.dtype == (torch.float32 if upcast else torch.bfloat16)
    unit = 2.0**-8  # bf16's rounding, relative
    assert abs(got.double() - exact) <= abs(want.double() - exact) + unit * abs(exact)
    for g, w, e in zip(got_grads, want_grads, exact_grads, strict=True):
        scale = e.abs().max()
        fused_error = (g.double() - e).abs().max() / scale
        eager_error = (w.double() - e).abs().max() / scale
        assert fused_error <= eager_error + 2 * unit, (fused_error, eager_error)


def test_no_gradient_wanted_writes_none_and_returns_the_loss():
    x, weight, _, target = case(torch.float32, bias=False)
    with torch.no_grad():
        got = linear_cross_entropy(x, weight, target.view(-1), chunk=16)
    torch.testing.assert_close(got, eager(x, weight, None, target, False))


def test_a_second_backward_through_the_same_loss_says_why_it_cannot():
    x, weight, _, target = case(torch.float32, bias=False)
    x.requires_grad_()
    loss = linear_cross_entropy(x, weight, target.view(-1), chunk=16)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="already used by a backward"):
        loss.backward()
