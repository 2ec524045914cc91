"""Normalisation: one torch call -> the graph's vocabulary.

The recorder sees a call as torch received it: a function, its positional and keyword
arguments, its result.  Here that becomes (op, op class, operands, params) in one spelling
for all the ways the user can write it: `x.sum(-1)`, `torch.sum(x, dim=-1)` and
`x.sum(dim=[-1])` are all a reduction over the last dim of x; `2 - x` is a `sub` with its
operands swapped; a view gives the steps (slice, select, reshape, ...) that derive it from
its base.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .graph import is_named, keep_float, keep_int
from .ops import CASTS, POOLS, OpClass, op_class


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def bind(func: Callable | None, args: Sequence, kwargs: dict, names: Sequence[str]) -> dict[str, Any]:
    """Name the arguments of a call: by signature for Python functions, else (and for no
    `func`) by `names`."""
    if inspect.isfunction(func):
        try:
            sig = inspect.signature(func)
            bound = sig.bind_partial(*args, **kwargs)
            out = dict(bound.arguments)
            params = list(sig.parameters)
            if params and params[0] != "input" and params[0] in out:
                out["input"] = out.pop(params[0])
            return out
        except (TypeError, ValueError):
            pass
    out = dict(zip(names, args, strict=False))
    out.update(kwargs)
    if "self" in out:
        out["input"] = out.pop("self")
    return out


def norm_dim(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim


def _norm_dims(dim: Any, ndim: int) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(ndim))
    if isinstance(dim, (list, tuple)):
        return sorted(norm_dim(int(d), ndim) for d in dim)
    return [norm_dim(int(dim), max(ndim, 1))]


_UNARY_PARAMS: dict[str, list[tuple[str, Any]]] = {
    "gelu": [("approximate", "none")],
    "softplus": [("beta", 1.0), ("threshold", 20.0)],
    "elu": [("alpha", 1.0)],
    "celu": [("alpha", 1.0)],
    "leaky_relu": [("negative_slope", 0.01)],
    "hardtanh": [("min_val", -1.0), ("max_val", 1.0)],
    "nan_to_num": [("nan", 0.0), ("posinf", None), ("neginf", None)],
    "round": [("decimals", 0)],
}


def normalise(canon: str, func, args, kwargs, out, swapped: bool):
    """(op, op class, operands, params) for a call of `func` under its canonical name `canon`
    that returned `out`, or None where the graph has no op for it (`torch.where(cond)`).
    `swapped`: the call was a reflected operator (`2 - x` reaches torch as `x.__rsub__(2)`)."""
    cls = op_class(canon)
    out_t = out if isinstance(out, torch.Tensor) else None

    if canon in CASTS or canon in ("to", "type", "type_as"):
        return _normalise_cast(canon, func, args, kwargs, out_t)
    if canon in ("max", "min"):
        bound = bind(func, args, kwargs, ["input", "dim", "keepdim"])
        other = bound.get("dim", bound.get("other"))
        if isinstance(other, torch.Tensor):
            return ("maximum" if canon == "max" else "minimum", OpClass.BINARY, [bound["input"], other], {})
        if other is None and out_t is not None:
            x = bound["input"]
            return (
                "amax" if canon == "max" else "amin",
                OpClass.REDUCTION,
                [x],
                {"dims": list(range(x.dim())), "keepdim": False},
            )
        return None  # max(dim) -> (values, indices): opaque
    if canon in ("clamp", "clamp_min", "clamp_max"):
        names = {"clamp": ["input", "min", "max"], "clamp_min": ["input", "min"], "clamp_max": ["input", "max"]}[canon]
        bound = bind(func, args, kwargs, names)
        lo, hi = bound.get("min"), bound.get("max")
        if isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor):
            return "clamp_tensor", OpClass.TERNARY, [bound["input"], lo, hi], {}
        return "clamp", OpClass.UNARY, [bound["input"]], {"min": lo, "max": hi}
    if canon == "relu6":
        bound = bind(func, args, kwargs, ["input"])
        return "hardtanh", OpClass.UNARY, [bound["input"]], {"min_val": 0.0, "max_val": 6.0}
    if canon == "dropout":
        bound = bind(func, args, kwargs, ["input", "p", "train"])
        training = bound.get("training", bound.get("train", True))
        if training and bound.get("p", 0.5) > 0:
            return None  # random masking: opaque
        return "dropout", OpClass.IDENTITY, [bound["input"]], {"p": bound.get("p", 0.5)}
    if canon in ("detach", "alias", "clone"):
        return canon, OpClass.IDENTITY, [args[0]], {}
    if canon == "batch_norm":
        return _normalise_batch_norm(func, args, kwargs, out_t)
    if canon == "instance_norm":
        return _normalise_instance_norm(func, args, kwargs, out_t)
    if canon in POOLS:
        return _normalise_pool(canon, func, args, kwargs, out_t)
    if canon == "contiguous":
        x = args[0]
        if x.is_contiguous():
            return "contiguous", OpClass.IDENTITY, [x], {}
        return "copy", OpClass.UNARY, [x], {"from": "contiguous"}
    if cls is OpClass.UNARY:
        bound = bind(func, args, kwargs, ["input"] + [n for n, _ in _UNARY_PARAMS.get(canon, [])])
        params = {n: bound.get(n, d) for n, d in _UNARY_PARAMS.get(canon, [])}
        return canon, cls, [bound["input"]], params
    if cls is OpClass.BINARY:
        return _normalise_binary(canon, func, args, kwargs, swapped)
    if cls is OpClass.TERNARY:
        names = {
            "where": ["condition", "input", "other"],
            "masked_fill": ["input", "mask", "value"],
            "lerp": ["input", "end", "weight"],
            "addcmul": ["input", "tensor1", "tensor2", "value"],
            "addcdiv": ["input", "tensor1", "tensor2", "value"],
        }[canon]
        bound = bind(func, args, kwargs, names)
        if canon == "where" and "other" not in bound:
            return None  # where(cond) -> indices
        operands = [bound.get(n) for n in names[:3]]
        params = {"value": bound.get("value", 1)} if canon in ("addcmul", "addcdiv") else {}
        return canon, cls, operands, params
    if canon == "cat":
        if out_t is None:
            return None  # torch.cat always returns a tensor; anything else is not a concatenation we model
        bound = bind(func, args, kwargs, ["tensors", "dim"])
        # Empty pieces add nothing (a partial rotary's pass-through half when the rotary dim is the
        # head's, a fresh cache's legacy 1-D `torch.tensor([])`): no kernel reads them.  One of another
        # dtype still takes part in the result's type promotion.
        pieces = list(bound["tensors"])
        tensors = [t for t in pieces if t.numel() > 0 or t.dtype != out_t.dtype] or pieces[-1:]
        return "cat", OpClass.CONCAT, [list(tensors)], {"dim": norm_dim(int(bound.get("dim", 0)), out_t.dim())}
    if canon in ("gather", "take_along_dim"):
        return _normalise_row_pick(canon, func, args, kwargs, out_t)
    if canon == "cross_entropy":
        return _normalise_cross_entropy(func, args, kwargs, out_t)
    if canon == "embedding":
        return _normalise_embedding(func, args, kwargs, out_t)
    if canon == "one_hot":
        return _normalise_one_hot(func, args, kwargs, out_t)
    if cls is OpClass.REDUCTION:
        return _normalise_reduction(canon, func, args, kwargs, out_t)
    if cls is OpClass.VIEW or canon == "mT":
        return _normalise_view(canon, func, args, kwargs, out_t)
    return None


def opaque_params(canon: str, func, args, kwargs) -> dict[str, Any]:
    """The numbers an opaque op takes that a pattern reads: a triangle's diagonal (`torch.triu(x, 1)`: a
    causal mask), the count and dim of `repeat_interleave` (a grouped key's heads repeated)."""
    try:
        if canon in ("tril", "triu"):
            bound = bind(func, args, kwargs, ["input", "diagonal"])
            return {"diagonal": int(bound.get("diagonal", 0))}
        if canon == "repeat_interleave":
            bound = bind(func, args, kwargs, ["input", "repeats", "dim"])
            repeats, dim = bound.get("repeats"), bound.get("dim")
            if isinstance(repeats, int) and isinstance(dim, int):
                return {"repeats": int(repeats), "dim": int(dim)}
    except (TypeError, ValueError):
        pass
    return {}


def _normalise_cast(canon, func, args, kwargs, out_t):
    x = args[0]
    if out_t is None:
        return None
    if out_t.dtype == x.dtype:
        return "to_same", OpClass.IDENTITY, [x], {}
    return "cast", OpClass.UNARY, [x], {"dtype": dtype_name(out_t.dtype), "from": canon}


def _normalise_batch_norm(func, args, kwargs, out_t):
    """`F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)` (bound by
    its signature) or `torch.batch_norm(input, weight, bias, running_mean, running_var, training, ...)`.

    With running statistics and `training=False` (eval mode) it is an affine map per channel,
    (x - running_mean) * rsqrt(running_var + eps) * weight + bias: pointwise, its [C] operands read
    at x's dim 1.  With batch statistics (training, or no running statistics) each channel's mean
    and variance are reduced over the batch and every spatial position (and the running statistics
    updated in place): a reduction over every dim but dim 1."""
    bound = bind(
        func,
        args,
        kwargs,
        ["input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps", "cudnn_enabled"],
    )
    x = bound.get("input")
    if out_t is None or not isinstance(x, torch.Tensor) or x.dim() < 2:
        return None
    mean, var = bound.get("running_mean"), bound.get("running_var")
    operands = [x, mean, var, bound.get("weight"), bound.get("bias")]
    eps = keep_float(bound.get("eps", 1e-5))
    tracked = isinstance(mean, torch.Tensor) and isinstance(var, torch.Tensor)
    if not bound.get("training", False) and tracked:
        return "batch_norm", OpClass.CHANNEL, operands, {"eps": eps}
    dims = [0, *range(2, x.dim())]
    # In training with running statistics it also updates them in place (`updates`), by `momentum`.
    params = {"dims": dims, "keepdim": True, "eps": eps, "training": True, "updates": tracked}
    return "batch_norm", OpClass.REDUCTION, operands, params


def _normalise_instance_norm(func, args, kwargs, out_t):
    """`F.instance_norm(input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)`:
    each (sample, channel) normalised over its spatial dims, then the per-channel weight and bias, a
    reduction over every dim past the channel.  With running statistics and `use_input_stats` it also
    updates them in place (`updates`); without `use_input_stats` (eval mode, tracking statistics) it
    normalises with the running ones: an affine map per channel, as eval-mode batch norm."""
    names = ["input", "running_mean", "running_var", "weight", "bias", "use_input_stats", "momentum", "eps"]
    bound = bind(func, args, kwargs, names)
    x = bound.get("input")
    if out_t is None or not isinstance(x, torch.Tensor) or x.dim() < 3:
        return None
    mean, var = bound.get("running_mean"), bound.get("running_var")
    operands = [x, mean, var, bound.get("weight"), bound.get("bias")]
    eps = keep_float(bound.get("eps", 1e-5))
    tracked = isinstance(mean, torch.Tensor) and isinstance(var, torch.Tensor)
    if not bound.get("use_input_stats", True):
        if not tracked:
            return None  # torch refuses it: nothing to normalise with
        return "instance_norm", OpClass.CHANNEL, operands, {"eps": eps}
    dims = list(range(2, x.dim()))
    return "instance_norm", OpClass.REDUCTION, operands, {"dims": dims, "keepdim": True, "eps": eps, "updates": tracked}


# A pooling call's arguments, in torch's order.
_POOL_ARGS = ["input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"]
_AVG_POOL_ARGS = ["input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"]


def _spatial(value: Any, n: int, default: Any = None) -> list[int] | None:
    """A pooling argument as one int per pooled dim (`2` and `(2, 2)` alike)."""
    if value is None:
        return default
    if isinstance(value, int):
        return [value] * n
    items = list(value)
    if len(items) == 1:
        items = items * n
    return [int(v) for v in items] if len(items) == n and all(isinstance(v, int) for v in items) else None


def _normalise_pool(canon, func, args, kwargs, out_t):
    """`max_pool2d`, `avg_pool2d` (1d, 3d): each output element the max (mean) of one window of the
    last 1-3 dims, a reduction over it (`window`: each pooled dim's kernel, stride, padding and
    dilation).  `adaptive_*_pool` to one element a dim (`adaptive_avg_pool2d(x, 1)`, a global
    average) is a reduction over the whole of those dims; to more, its windows' sizes follow the
    input's, and it stays opaque (reported with a reason).  `return_indices` returns a tuple:
    opaque."""
    n = int(canon[-2])
    kind = canon.split("_pool")[0]
    if out_t is None:
        return None
    if kind.startswith("adaptive"):
        # By position: F.max_pool2d and friends are dispatchers whose signature is (*args, **kwargs).
        bound = bind(None, args, kwargs, ["input", "output_size", "return_indices"])
        x, size = bound.get("input"), bound.get("output_size")
        if not isinstance(x, torch.Tensor) or bound.get("return_indices") or x.dim() < n + 1:
            return None
        sizes = [1 if s is None else s for s in ([size] * n if not isinstance(size, (list, tuple)) else size)]
        dims = list(range(x.dim() - n, x.dim()))
        params = {"dims": dims, "keepdim": True, "output_size": [int(s) for s in sizes]}
        return canon, OpClass.REDUCTION, [x], params
    bound = bind(None, args, kwargs, _POOL_ARGS if kind == "max" else _AVG_POOL_ARGS)
    x = bound.get("input")
    if not isinstance(x, torch.Tensor) or bound.get("return_indices") or x.dim() < n + 1:
        return None
    kernel = _spatial(bound.get("kernel_size"), n)
    stride = _spatial(bound.get("stride"), n, kernel) or kernel
    padding = _spatial(bound.get("padding", 0), n, [0] * n)
    dilation = _spatial(bound.get("dilation", 1), n, [1] * n)
    if kernel is None or stride is None or padding is None or dilation is None:
        return None
    window = {
        "kernel": kernel,
        "stride": stride,
        "padding": padding,
        "dilation": dilation,
        "ceil_mode": bool(bound.get("ceil_mode", False)),
    }
    if kind == "avg":
        window["count_include_pad"] = bool(bound.get("count_include_pad", True))
        divisor = bound.get("divisor_override")
        window["divisor_override"] = int(divisor) if divisor else None
    dims = list(range(x.dim() - n, x.dim()))
    return canon, OpClass.REDUCTION, [x], {"dims": dims, "keepdim": True, "window": window}


def values_and_indices(canon, func, args, kwargs, out) -> list[tuple[str, OpClass, list, dict]] | None:
    """`torch.max(x, dim)` / `torch.min(x, dim)` (and their methods), which return (values, indices):
    one reduction for each, `max` (`min`) for the values and `argmax` (`argmin`) for the indices of
    their first occurrence, or None for any other call."""
    if canon not in ("max", "min") or not isinstance(out, tuple) or len(out) != 2:
        return None
    bound = bind(func, args, kwargs, ["input", "dim", "keepdim"])
    x, dim = bound.get("input"), bound.get("dim")
    if not isinstance(x, torch.Tensor) or not isinstance(dim, int) or isinstance(dim, bool):
        return None
    params = {"dims": [norm_dim(dim, max(x.dim(), 1))], "keepdim": bool(bound.get("keepdim", False))}
    # `pair`: which of the call's results the node is (a call site gives both at once).
    return [
        (canon, OpClass.REDUCTION, [x], dict(params, pair=0)),
        ("arg" + canon, OpClass.REDUCTION, [x], dict(params, pair=1)),
    ]


def _normalise_binary(canon, func, args, kwargs, swapped):
    if swapped:  # x.__rsub__(other) and friends: positional (self, other), whatever the names
        a, b = (args[1] if len(args) > 1 else kwargs.get("other")), args[0]
        return canon, OpClass.BINARY, [a, b], {}
    names = {"pow": ["input", "exponent"]}.get(canon, ["input", "other", "alpha"])
    bound = bind(func, args, kwargs, names)
    a = bound.get("input", bound.get("self"))
    b = bound.get(names[1])
    params: dict[str, Any] = {}
    if canon in ("add", "sub") and bound.get("alpha", 1) != 1:
        params["alpha"] = bound["alpha"]
    if canon == "div" and bound.get("rounding_mode"):
        params["rounding_mode"] = bound["rounding_mode"]
    return canon, OpClass.BINARY, [a, b], params


def _normalise_row_pick(canon, func, args, kwargs, out_t):
    """`x.gather(-1, index)` (or `take_along_dim`) with one index per row, `index` shaped like `x`
    but 1 along the last dim: the row reduction that picks one element of each row, as a loss picks
    the target's log-probability.  A gather with more indices, or along another dim, reads across
    rows: opaque."""
    names = ["input", "dim", "index"] if canon == "gather" else ["input", "indices", "dim"]
    bound = bind(func, args, kwargs, names)
    x, index, dim = bound.get("input"), bound.get("index", bound.get("indices")), bound.get("dim")
    if not (isinstance(x, torch.Tensor) and isinstance(index, torch.Tensor)) or out_t is None or x.dim() == 0:
        return None
    if dim is None or bound.get("sparse_grad") or norm_dim(int(dim), x.dim()) != x.dim() - 1:
        return None
    if tuple(index.shape) != (*x.shape[:-1], 1) or index.dtype not in (torch.int64, torch.int32):
        return None
    return "gather", OpClass.REDUCTION, [x, index], {"dims": [x.dim() - 1], "keepdim": True}


def _normalise_embedding(func, args, kwargs, out_t):
    """`F.embedding(ids, weight)`: the rows of `weight` at `ids`, operands (weight, ids).  With
    `max_norm` it also renormalises the rows it reads in place: opaque."""
    names = ["input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse"]
    bound = bind(func, args, kwargs, names)
    ids, weight = bound.get("input"), bound.get("weight")
    if not (isinstance(ids, torch.Tensor) and isinstance(weight, torch.Tensor)) or out_t is None:
        return None
    if bound.get("max_norm") is not None or weight.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
        return None
    if bound.get("sparse"):
        return None
    # What the table's gradient needs: the row it leaves at zero, and whether rows are scaled by
    # how often they are looked up.
    padding = bound.get("padding_idx")
    params = {
        "padding_idx": -1 if padding is None else _row_index(padding, weight.shape[0]),
        "scale_grad_by_freq": bool(bound.get("scale_grad_by_freq", False)),
    }
    return "embedding", OpClass.LOOKUP, [weight, ids], params


def _row_index(index, rows: int) -> int:
    """A row of a table counted from its start; one the model's state holds (`self.padding_idx`, already
    counted so by `nn.Embedding`) keeps its provenance."""
    if is_named(index) and index >= 0:
        return index
    return int(index) % rows


def _normalise_one_hot(func, args, kwargs, out_t):
    """`F.one_hot(index, num_classes)`: 1 where the element's last coordinate is its index, a lookup
    of the index alone.  Without `num_classes` the width is the largest index, a value: opaque."""
    bound = bind(func, args, kwargs, ["tensor", "num_classes"])
    index, classes = bound.get("tensor"), bound.get("num_classes", -1)
    if not isinstance(index, torch.Tensor) or out_t is None or not isinstance(classes, int) or classes <= 0:
        return None
    return "one_hot", OpClass.LOOKUP, [index], {"classes": classes}


_CROSS_ENTROPY = ["input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction", "label_smoothing"]


def _normalise_cross_entropy(func, args, kwargs, out_t):
    """`F.cross_entropy` of [N, C] logits against N class indices: a reduction over each row (its
    log-sum-exp and the target's logit), then over the rows for "mean" and "sum".  Class weights,
    probabilities as targets, the legacy size_average/reduce, and logits with more dims (classes in
    dim 1, not last): opaque."""
    bound = bind(func, args, kwargs, _CROSS_ENTROPY)
    x, target = bound.get("input"), bound.get("target")
    if not (isinstance(x, torch.Tensor) and isinstance(target, torch.Tensor)) or out_t is None:
        return None
    if x.dim() != 2 or not x.is_floating_point() or target.dim() != 1 or target.dtype not in (torch.int64, torch.int32):
        return None
    if bound.get("weight") is not None or bound.get("size_average") is not None or bound.get("reduce") is not None:
        return None
    reduction = bound.get("reduction", "mean")
    if reduction not in ("none", "mean", "sum"):
        return None
    params = {
        "dims": [1],
        "keepdim": False,
        "reduction": reduction,
        "ignore_index": keep_int(bound.get("ignore_index", -100)),
        "label_smoothing": keep_float(bound.get("label_smoothing", 0.0)),
    }
    return "cross_entropy", OpClass.REDUCTION, [x, target], params


def _normalise_reduction(canon, func, args, kwargs, out_t):
    if canon in ("softmax", "log_softmax"):
        bound = bind(func, args, kwargs, ["input", "dim", "dtype"])
        x = bound["input"]
        dim = bound.get("dim")
        if dim is None:
            dim = 0 if x.dim() in (0, 1, 3) else 1  # torch's legacy implicit dim
        return (
            canon,
            OpClass.REDUCTION,
            [x],
            {"dims": [norm_dim(int(dim), x.dim())], "keepdim": True, "dtype": dtype_name(out_t.dtype)},
        )
    if canon == "layer_norm":
        bound = bind(func, args, kwargs, ["input", "normalized_shape", "weight", "bias", "eps"])
        x = bound["input"]
        k = len(bound["normalized_shape"])
        return (
            canon,
            OpClass.REDUCTION,
            [x, bound.get("weight"), bound.get("bias")],
            {"dims": list(range(x.dim() - k, x.dim())), "eps": keep_float(bound.get("eps", 1e-5)), "keepdim": True},
        )
    if canon == "rms_norm":
        bound = bind(func, args, kwargs, ["input", "normalized_shape", "weight", "eps"])
        x = bound["input"]
        k = len(bound["normalized_shape"])
        eps = bound.get("eps")
        if eps is None:
            eps = float(torch.finfo(x.dtype).eps) if x.is_floating_point() else 1e-6
        return (
            canon,
            OpClass.REDUCTION,
            [x, bound.get("weight")],
            {"dims": list(range(x.dim() - k, x.dim())), "eps": keep_float(eps), "keepdim": True},
        )
    if canon == "group_norm":
        bound = bind(func, args, kwargs, ["input", "num_groups", "weight", "bias", "eps"])
        x = bound["input"]
        return (
            canon,
            OpClass.REDUCTION,
            [x, bound.get("weight"), bound.get("bias")],
            {
                "dims": list(range(1, x.dim())),
                "groups": keep_int(bound["num_groups"]),
                "eps": keep_float(bound.get("eps", 1e-5)),
                "keepdim": True,
            },
        )
    if canon in ("var", "std"):
        bound = bind(func, args, kwargs, ["input", "dim", "unbiased", "keepdim"])
        x = bound["input"]
        dim = bound.get("dim")
        unbiased = bound.get("unbiased", True)
        if isinstance(dim, bool):  # var(input, unbiased)
            unbiased, dim = dim, None
        correction = bound.get("correction")
        if correction is None:
            correction = 1 if unbiased else 0
        return (
            canon,
            OpClass.REDUCTION,
            [x],
            {
                "dims": _norm_dims(dim, x.dim()),
                "keepdim": bool(bound.get("keepdim", False)),
                "correction": float(correction),
            },
        )
    if canon == "norm":
        bound = bind(func, args, kwargs, ["input", "p", "dim", "keepdim"])
        x = bound["input"]
        p = bound.get("p", bound.get("ord", 2))
        if p in (None, "fro"):
            p = 2
        if not isinstance(p, (int, float)):
            return None
        return (
            canon,
            OpClass.REDUCTION,
            [x],
            {
                "dims": _norm_dims(bound.get("dim"), x.dim()),
                "keepdim": bool(bound.get("keepdim", False)),
                "p": float(p),
            },
        )
    if canon in ("cumsum", "cumprod"):
        bound = bind(func, args, kwargs, ["input", "dim"])
        x = bound["input"]
        return (
            canon,
            OpClass.REDUCTION,
            [x],
            {"dims": [norm_dim(int(bound["dim"]), x.dim())], "keepdim": True, "scan": True},
        )
    bound = bind(func, args, kwargs, ["input", "dim", "keepdim", "dtype"])
    x = bound["input"]
    params = {"dims": _norm_dims(bound.get("dim"), x.dim()), "keepdim": bool(bound.get("keepdim", False))}
    if out_t is not None:
        params["dtype"] = dtype_name(out_t.dtype)
    return canon, OpClass.REDUCTION, [x], params


def _normalise_view(canon, func, args, kwargs, out_t):
    x = args[0] if args else kwargs.get("input")
    if out_t is None or not isinstance(x, torch.Tensor):
        return None
    shape = tuple(int(d) for d in out_t.shape)
    ndim = x.dim()
    rest = list(args[1:])
    steps: list[tuple]
    if canon in ("transpose",):
        bound = bind(func, args, kwargs, ["input", "dim0", "dim1"])
        perm = list(range(ndim))
        d0, d1 = norm_dim(int(bound["dim0"]), ndim), norm_dim(int(bound["dim1"]), ndim)
        perm[d0], perm[d1] = perm[d1], perm[d0]
        steps = [("permute", perm)]
    elif canon == "permute":
        dims = rest[0] if len(rest) == 1 and isinstance(rest[0], (list, tuple)) else rest or kwargs.get("dims")
        steps = [("permute", [norm_dim(int(d), ndim) for d in dims])]
    elif canon == "t":
        steps = [("permute", list(reversed(range(ndim))))]
    elif canon == "mT":
        perm = list(range(ndim))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        steps = [("permute", perm)]
    elif canon == "movedim":
        bound = bind(func, args, kwargs, ["input", "source", "destination"])
        src = bound["source"] if isinstance(bound["source"], (list, tuple)) else [bound["source"]]
        dst = bound["destination"] if isinstance(bound["destination"], (list, tuple)) else [bound["destination"]]
        src = [norm_dim(int(d), ndim) for d in src]
        dst = [norm_dim(int(d), ndim) for d in dst]
        perm = [-1] * ndim
        for s, d in zip(src, dst, strict=True):
            perm[d] = s
        others = iter(d for d in range(ndim) if d not in src)
        perm = [p if p >= 0 else next(others) for p in perm]
        steps = [("permute", perm)]
    elif canon == "unsqueeze":
        bound = bind(func, args, kwargs, ["input", "dim"])
        steps = [("unsqueeze", norm_dim(int(bound["dim"]), ndim + 1))]
    elif canon == "squeeze":
        bound = bind(func, args, kwargs, ["input", "dim"])
        dim = bound.get("dim")
        candidates = range(ndim) if dim is None else _norm_dims(dim, ndim)
        removed = [d for d in candidates if int(x.shape[d]) == 1]
        steps = [("squeeze", d) for d in sorted(removed, reverse=True)]
    elif canon == "expand":
        steps = [("expand", list(shape))]
    elif canon == "narrow":
        bound = bind(func, args, kwargs, ["input", "dim", "start", "length"])
        dim = norm_dim(int(bound["dim"]), ndim)
        start = int(bound["start"])
        start = start + int(x.shape[dim]) if start < 0 else start
        steps = [("slice", dim, start, 1)]
    elif canon == "select":
        bound = bind(func, args, kwargs, ["input", "dim", "index"])
        dim = norm_dim(int(bound["dim"]), ndim)
        index = int(bound["index"])
        steps = [("select", dim, index + int(x.shape[dim]) if index < 0 else index)]
    elif canon == "getitem":
        basic = _index_steps(x, args[1] if len(args) > 1 else kwargs.get("indices"))
        if basic is None:
            return None  # advanced indexing: a gather
        steps = basic
    else:  # view, reshape, flatten, unflatten, view_as, reshape_as
        if not out_t._is_view() and out_t.untyped_storage() is not x.untyped_storage():
            return "reshape", OpClass.OPAQUE, [x], {"shape": list(shape), "copies": True}
        steps = [("reshape", list(shape))]
    return canon, OpClass.VIEW, [x], {"steps": steps}


def _index_steps(x: torch.Tensor, index: Any) -> list[tuple] | None:
    """Basic indexing (ints, slices, None, ...) as a list of view steps; None if advanced."""
    items = list(index) if isinstance(index, tuple) else [index]
    if any(isinstance(i, (torch.Tensor, list, bool)) for i in items):
        return None
    consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
    if consumed > x.dim():
        return None
    steps: list[tuple] = []
    d = 0  # dim of the input being indexed
    od = 0  # dim in the evolving result
    for item in items:
        if item is Ellipsis:
            skip = x.dim() - consumed
            d += skip
            od += skip
        elif item is None:
            steps.append(("unsqueeze", od))
            od += 1
        elif isinstance(item, int):
            size = int(x.shape[d])
            steps.append(("select", od, item + size if item < 0 else item))
            d += 1
        elif isinstance(item, slice):
            size = int(x.shape[d])
            start, stop, step = item.indices(size)
            if step <= 0:
                return None
            if (start, step) != (0, 1) or stop != size:
                steps.append(("slice", od, start, step))
            d += 1
            od += 1
        else:
            return None
    return steps
