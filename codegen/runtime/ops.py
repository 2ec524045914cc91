"""The kernel module's imports and its runtime: each kernel registered as a torch.library op that is
its own fake, whether a call's tensors can run a kernel, the dispatch to the op or straight to the
launcher, a kernel's backward as the op's autograd formula, and a group norm's statistics and
coefficients between its backward kernels."""

# ---- the kernel module's copy starts here
import functools
import itertools
import os
import types
import uuid

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton here: every cluster runs its reference code
    triton = types.SimpleNamespace(jit=lambda fn=None, **_: fn if fn is not None else (lambda f: f), cdiv=None)
    tl = types.SimpleNamespace(constexpr=None)
    _TRITON = False
else:
    _TRITON = True

# Each kernel is an op of this library, so torch.compile and torch.export see one op per cluster (its
# shapes from the reference) rather than trace into the launcher.  The namespace is this module
# object's own: a module imported twice (or reloaded) registers its ops apart.
_LIBRARY = torch.library.Library(f"fuselens_{uuid.uuid4().hex[:12]}", "DEF")


def _kernel_op(name, launch, inputs, outputs, numbers=()):
    """`launch` registered as the op `name` (CUDA, and CPU for the Triton interpreter), taking `inputs`
    tensors then one number of each type in `numbers`.  It is its own fake: on meta and fake tensors it
    allocates the outputs as the kernel would for those inputs (their strides too, which torch.compile
    holds the real outputs to) and launches nothing."""
    returns = "Tensor" if outputs == 1 else "(" + ", ".join(["Tensor"] * outputs) + ")"
    params = [f"Tensor in{k}" for k in range(inputs)] + [f"{kind} sc{k}" for k, kind in enumerate(numbers)]
    _LIBRARY.define(f"{name}({', '.join(params)}) -> {returns}")
    for key in ("CUDA", "CPU"):
        _LIBRARY.impl(name, launch, key)
    torch.library.register_fake(f"{_LIBRARY.ns}::{name}", launch, lib=_LIBRARY)
    return getattr(getattr(torch.ops, _LIBRARY.ns), name)


def _shapes_only(t):
    """Whether `t` carries no data to compute on: a meta tensor (a re-analysis of code that calls the
    kernel) or a fake one (torch.compile tracing)."""
    return t.device.type == "meta" or _is_fake(t)


def _is_fake(t):
    try:
        from torch._subclasses.fake_tensor import is_fake
    except ImportError:  # a torch without it has no fake tensors of this kind either
        return False
    return is_fake(t)


def _kernel_runs(tensors, dtypes, trains=()):
    """Whether the kernel takes these inputs: CUDA tensors (or CPU ones in the Triton interpreter,
    meta ones for their shapes) of the torch dtypes it was generated for, wanting no gradient but
    those of `trains` (the inputs the cluster's backward kernel computes gradients of)."""
    if not _TRITON:
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for k, t in enumerate(tensors) if k not in trains):
        return False
    if tuple([t.dtype for t in tensors]) != dtypes:
        return False
    if all([t.is_cuda for t in tensors]) or all([t.is_meta for t in tensors]):
        return True
    return all([t.is_cpu for t in tensors]) and os.environ.get("TRITON_INTERPRET") == "1"


def _kernel_call(op, launch):
    """How the public function runs its kernel: through `op` where autograd or a tracer needs the op
    (a tensor wants a gradient; torch.compile, torch.export or torch.jit is tracing), straight to
    `launch` everywhere else.  The dispatcher costs a Python op more than its launcher: timed on CPU
    tensors with the Triton launch left out, GPT's lookups took 30-35 us a call through the op and
    15 in the launcher alone, at best of nine runs."""

    def call(*args):
        traced = torch.compiler.is_compiling() or torch.jit.is_tracing()
        if traced or (torch.is_grad_enabled() and any(getattr(a, "requires_grad", False) for a in args)):
            return op(*args)
        return launch(*args)

    return call


def _register_backward(
    name, gradients, tensors, grads_of, keeps, keeps_results, leads=None, layouts=False, constants=None
):
    """`gradients(inputs, numbers, outputs, grads)` as the backward of the op `name`, whose first
    `tensors` inputs are tensors.  The forward keeps the inputs `keeps` and the outputs
    `keeps_results` (those the gradients read; never an intermediate: the backward recomputes what
    it needs) and passes None for the others.  `leads`: for an input the kernel reads unsqueezed
    (a bias over the channels), the dim of its gradient its first dim runs along.  `layouts`: the
    gradients also take the inputs' strides (`layouts=`), to write each gradient in its input's.
    `constants`: the numbers the kernel bakes in (position among the numbers -> value), which the
    op does not take but the gradients do (a group norm's group count)."""
    leads = leads or {}
    constants = constants or {}

    def setup_context(ctx, inputs, output):
        outputs = output if isinstance(output, tuple) else (output,)
        ctx.save_for_backward(*(inputs[k] for k in keeps), *(outputs[k] for k in keeps_results))
        ctx.numbers = inputs[tensors:]
        ctx.inputs = [(t.shape, t.dtype) for t in inputs[:tensors]]
        ctx.outputs = [(o.shape, o.dtype, o.device) for o in outputs]
        ctx.layouts = tuple(t.stride() for t in inputs[:tensors]) if layouts else None

    def backward(ctx, *grads):
        grads = [
            g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
            for g, (shape, dtype, device) in zip(grads, ctx.outputs)
        ]
        inputs, results = [None] * tensors, [None] * len(ctx.outputs)
        saved = list(ctx.saved_tensors)
        for k, t in zip(keeps, saved[: len(keeps)]):
            inputs[k] = t
        for k, t in zip(keeps_results, saved[len(keeps) :]):
            results[k] = t
        given = {"layouts": ctx.layouts} if layouts else {}
        numbers = list(ctx.numbers)
        for k in sorted(constants):
            numbers.insert(k, constants[k])
        raws = gradients(*inputs, *numbers, *results, *grads, **given)
        result = [None] * (tensors + len(ctx.numbers))
        for k, raw in zip(grads_of, raws):
            if ctx.needs_input_grad[k]:
                result[k] = _fit(raw, *ctx.inputs[k], leads.get(k))
        return tuple(result)

    torch.library.register_autograd(f"{_LIBRARY.ns}::{name}", backward, setup_context=setup_context, lib=_LIBRARY)


def _group_statistics(mean, rstd, weight, bias, shape):
    """A group norm's statistics, as its forward kept them (each (sample, group)'s mean and reciprocal
    deviation, [N, G] float32), for an input of `shape`: (scale, shift, mean, rstd), each one value a
    (sample, channel), [N, C, 1, ...], with the norm's output x * scale + shift."""
    n, groups = mean.shape
    c, ones = shape[1], (1,) * (len(shape) - 2)

    def per_channel(t):  # each group's value for each of its channels
        return t[:, :, None].expand(n, groups, c // groups).reshape(n, c, *ones)

    mean, rstd = per_channel(mean), per_channel(rstd)
    scale = rstd if weight is None else rstd * weight.float().reshape(1, c, *ones)
    shift = -mean * scale if bias is None else bias.float().reshape(1, c, *ones) - mean * scale
    return scale, shift, mean, rstd


def _group_coefficients(a, b, mean, rstd, weight, groups, count):
    """A group norm's gradients from the sums over each (sample, channel) of the output's gradient g
    times x (`a`) and of g (`b`), `count` elements a channel: (alpha, beta, gamma) with the input's
    gradient alpha * g + beta * x + gamma, then the weight's and the bias's gradients."""
    n, c = a.shape[:2]
    ones = (1,) * (a.dim() - 2)
    if weight is None:
        w = torch.ones((1, c, *ones), dtype=a.dtype, device=a.device)
    else:
        w = weight.float().reshape(1, c, *ones)
    centered = a - mean * b  # the sum of g * (x - mean) over the channel

    def per_group(t):  # summed over each group's channels, then one value a (sample, channel) again
        summed = t.reshape(n, groups, -1).sum(-1, keepdim=True)
        return summed.expand(n, groups, c // groups).reshape(n, c, *ones)

    s1, s2 = per_group(w * b), per_group(w * centered)
    size = count * (c // groups)  # the elements of a group
    alpha = rstd * w
    beta = -rstd * rstd * rstd * s2 / size
    gamma = rstd * (rstd * rstd * s2 * mean - s1) / size
    return alpha, beta, gamma, (rstd * centered).sum(0).reshape(c), b.sum(0).reshape(c)


def _fit(raw, shape, dtype, lead=None):
    """A gradient as its input (of `shape` and `dtype`) is: a broadcast input's summed over the dims
    it was broadcast along (from dim `lead` of the gradient on, for one read unsqueezed), a view's
    reshaped back, in the input's dtype."""
    if lead is not None and raw.dim() > len(shape):
        raw = raw.sum_to_size((1,) * lead + tuple(shape) + (1,) * (raw.dim() - lead - len(shape))).reshape(shape)
    if raw.shape != shape:
        if raw.numel() == shape.numel():
            raw = raw.reshape(shape)
        elif torch.broadcast_shapes(raw.shape, shape) == shape:
            raw = raw.expand(shape)
        else:
            raw = raw.sum_to_size(shape)
    return raw if raw.dtype == dtype else raw.to(dtype)
