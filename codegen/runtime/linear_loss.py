"""A projection onto a vocabulary and its cross-entropy, without writing the logits: what the kernel module
runs in place of `F.cross_entropy(linear(x, W, b), t)` where torch has no `F.linear_cross_entropy`.

The tokens are taken a chunk at a time (`chunk_tokens`: a gigabyte of logits at most).  For each chunk,
the logits GEMM runs in the input's dtype, as eager's does; one Triton program a row then reads the row
twice, its log-sum-exp in float32 first, then writes the row's loss and, over the logits, their gradient
(softmax less the target's one-hot, with label smoothing's share, times the loss's scale; zero for an
ignored target).  In training the chunk's gradients go on at once: the input's rows (`grad_logits @ W`),
the weight's (`grad_logitsᵀ @ x`, accumulated over the chunks in the weight's dtype) and the bias's; the
backward only scales them by the upstream gradient.  For reduction "none" the upstream gradient is one
number a token, known only in the backward: the forward computes the losses, and the backward the chunks
again with each row scaled by its token's gradient.

The loss is computed in float32 and returned in the dtype eager's would have (the logits', or float32
where the code upcast them); on a CPU without the Triton interpreter, torch computes each chunk's rows."""

import torch

from .ops import _TRITON, tl, triton

# isort: split
# ---- the kernel module's copy starts here
import os

import torch.nn.functional as F

from fuselens.analysis.loss_chunks import chunk_tokens


@triton.jit
def _linear_loss_rows(
    logits, target, loss, scale, scale_stride, n_cols, ignore_index, smoothing, GRADS: tl.constexpr, BLOCK: tl.constexpr
):
    """Row `program_id` of a chunk's logits ([rows, n_cols], contiguous): its loss (float32) into `loss`,
    and with GRADS its gradient over the logits, times `scale[row * scale_stride]`."""
    row = tl.program_id(0).to(tl.int64)
    logits += row * n_cols
    t = tl.load(target + row)
    valid = t != ignore_index
    t = tl.where(valid, t, 0)
    running_max = -float("inf")
    total = 0.0
    logit_sum = 0.0
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(logits + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        new_max = tl.maximum(running_max, tl.max(x, 0))
        total = total * tl.exp(running_max - new_max) + tl.sum(tl.exp(x - new_max), 0)
        running_max = new_max
        logit_sum += tl.sum(tl.where(cols < n_cols, x, 0.0), 0)
    lse = running_max + tl.log(total)
    picked = tl.load(logits + t).to(tl.float32)
    row_loss = (1.0 - smoothing) * (lse - picked) + smoothing * (lse - logit_sum / n_cols)
    tl.store(loss + row, tl.where(valid, row_loss, 0.0))
    if GRADS:
        factor = tl.where(valid, tl.load(scale + row * scale_stride).to(tl.float32), 0.0)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(logits + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            grad = tl.exp(x - lse) - smoothing / n_cols - tl.where(cols == t, 1.0 - smoothing, 0.0)
            tl.store(logits + cols, (grad * factor).to(logits.dtype.element_ty), mask=cols < n_cols)


def _rows_in_kernel(logits):
    """Whether a chunk's rows run in the Triton kernel: on CUDA, or on a CPU in the Triton interpreter."""
    if not _TRITON:
        return False
    return logits.is_cuda or (logits.is_cpu and os.environ.get("TRITON_INTERPRET") == "1")


def _loss_rows(logits, target, loss, scale, ignore_index, smoothing, grads):
    """Each row's loss into `loss`, and with `grads` the logits' gradient over them, times `scale` (one
    number, or one a row)."""
    rows, cols = logits.shape
    if rows == 0:
        return
    if _rows_in_kernel(logits):
        block = min(16384, triton.next_power_of_2(cols))
        warps = 16 if block >= 8192 else 8 if block >= 2048 else 4
        _linear_loss_rows[(rows,)](
            logits, target, loss, scale, 1 if scale.numel() > 1 else 0, cols, ignore_index, smoothing,
            GRADS=grads, BLOCK=block, num_warps=warps,
        )  # fmt: skip
        return
    x = logits.float()
    lse = torch.logsumexp(x, -1)
    valid = target != ignore_index
    picked_at = torch.where(valid, target, 0)[:, None]
    row_loss = (1.0 - smoothing) * (lse - x.gather(1, picked_at)[:, 0]) + smoothing * (lse - x.mean(-1))
    loss.copy_(torch.where(valid, row_loss, 0.0))
    if grads:
        grad = torch.exp(x - lse[:, None]) - smoothing / cols
        grad.scatter_add_(1, picked_at, torch.full_like(lse[:, None], smoothing - 1.0))
        logits.copy_(grad * torch.where(valid, scale.float(), 0.0)[:, None])


def _chunks(x, weight, bias, target, scale, ignore_index, smoothing, wants, chunk):
    """Each token's loss (float32), and the gradients `wants` (input, weight, bias) asks for, with the
    rows' gradients times `scale`: one number, or one a token.  Every chunk's logits are written into
    one buffer: a chunk computed while the last one's logits were still held would double the peak."""
    tokens = x.shape[0]
    losses = torch.empty(tokens, dtype=torch.float32, device=x.device)
    grad_x = torch.empty_like(x) if wants[0] else None
    grad_w = torch.empty_like(weight) if wants[1] else None
    grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=x.device) if wants[2] else None
    grads = any(wants)
    buffer = torch.empty((min(chunk, tokens), weight.shape[0]), dtype=x.dtype, device=x.device)  # F.linear's
    for start in range(0, tokens, chunk):
        end = min(tokens, start + chunk)
        x_chunk = x[start:end]
        logits = buffer[: end - start]
        torch.mm(x_chunk, weight.t(), out=logits)
        if bias is not None:
            logits += bias
        row_scale = scale[start:end] if scale.numel() > 1 else scale
        _loss_rows(logits, target[start:end], losses[start:end], row_scale, ignore_index, smoothing, grads)
        if grad_x is not None:
            torch.mm(logits, weight, out=grad_x[start:end])
        if grad_w is not None and start == 0:  # the first chunk writes the weight's gradient, the others add
            torch.mm(logits.t(), x_chunk, out=grad_w)
        elif grad_w is not None:
            grad_w.addmm_(logits.t(), x_chunk)
        if grad_b is not None:
            grad_b += logits.sum(0, dtype=torch.float32)
    if grad_w is not None and tokens == 0:  # no chunk wrote it
        grad_w.zero_()
    return losses, grad_x, grad_w, grad_b


def _reduced(losses, target, ignore_index, reduction, dtype):
    if reduction == "none":
        return losses.to(dtype)
    total = losses.sum()
    if reduction == "sum":
        return total.to(dtype)
    return (total / (target != ignore_index).sum()).to(dtype)  # eager's mean: over the targets not ignored


def _scale(target, ignore_index, reduction):
    """What every row's gradient is multiplied by: 1 / the targets counted (a mean; 0 where none is, as
    eager's gradient is then), or 1."""
    if reduction == "mean":
        counted = (target != ignore_index).sum().clamp(min=1)
        return (1.0 / counted.float()).reshape(1)
    return torch.ones(1, dtype=torch.float32, device=target.device)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, target, ignore_index, smoothing, reduction, dtype, chunk):
        wants = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[2])
        ctx.wants, ctx.numbers = wants, (ignore_index, smoothing, chunk)
        ctx.bias_dtype = bias.dtype if bias is not None else None
        if reduction == "none":  # each token's gradient comes with the backward: the chunks run again there
            ones = torch.ones(1, dtype=torch.float32, device=x.device)
            losses = _chunks(x, weight, bias, target, ones, ignore_index, smoothing, (False,) * 3, chunk)[0]
            ctx.save_for_backward(x, weight, bias, target)
            ctx.gradients = None
            return losses.to(dtype)
        scale = _scale(target, ignore_index, reduction)
        losses, *gradients = _chunks(x, weight, bias, target, scale, ignore_index, smoothing, wants, chunk)
        ctx.gradients = gradients
        return _reduced(losses, target, ignore_index, reduction, dtype)

    @staticmethod
    def backward(ctx, grad):
        if ctx.gradients is None and ctx.saved_tensors:  # reduction "none": each row times its token's gradient
            x, weight, bias, target = ctx.saved_tensors
            ignore_index, smoothing, chunk = ctx.numbers
            scale = grad.float().contiguous()
            gradients = _chunks(x, weight, bias, target, scale, ignore_index, smoothing, ctx.wants, chunk)[1:]
        elif ctx.gradients is not None:
            gradients = [g.mul_(grad) if g is not None else None for g in ctx.gradients]
            ctx.gradients = None  # computed once, for one backward
        else:
            raise RuntimeError("the fused linear cross-entropy's gradients were already used by a backward")
        grad_x, grad_w, grad_b = gradients
        if grad_b is not None:
            grad_b = grad_b.to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None, None, None, None, None, None


def linear_cross_entropy(
    x, weight, target, bias=None, *, ignore_index=-100, label_smoothing=0.0, reduction="mean", loss_dtype=None,
    chunk=None,
):  # fmt: skip
    """`F.cross_entropy(F.linear(x, weight, bias).to(loss_dtype), target, ...)` over the last dim of `x`
    (any leading dims, flattened with `target`'s), without writing the logits of more than `chunk` tokens
    at once.  `loss_dtype`: the dtype the loss is returned in (the logits' by default; float32 where the
    code upcast them)."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction!r} is not a valid value for reduction")
    shape = target.shape
    x, target = x.reshape(-1, x.shape[-1]), target.reshape(-1)
    dtype = loss_dtype or torch.result_type(x, weight)
    chunk = chunk or chunk_tokens(x.shape[0], weight.shape[0], x.element_size())
    numbers = (int(ignore_index), float(label_smoothing), reduction, dtype, int(chunk))
    tensors = [x, weight] + ([bias] if bias is not None else [])
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        out = _LinearCrossEntropy.apply(x.contiguous(), weight.contiguous(), bias, target.contiguous(), *numbers)
    else:
        ones = torch.ones(1, dtype=torch.float32, device=x.device)
        losses = _chunks(x, weight, bias, target, ones, ignore_index, label_smoothing, (False,) * 3, chunk)[0]
        out = _reduced(losses, target, ignore_index, reduction, dtype)
    return out.reshape(shape) if reduction == "none" else out
