"""The GEMM calls a probe sketches: which torch calls they are, their two operands, the dims along which
each is reduced and has its channels, their FLOPs, and the call made again with other operands."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

# A torch callable's name -> the op a site reports.
GEMM_NAMES = {
    "linear": "linear",
    "matmul": "matmul",
    "__matmul__": "matmul",
    "__rmatmul__": "matmul",
    "mm": "mm",
    "bmm": "bmm",
    "addmm": "addmm",
    "conv1d": "conv1d",
    "conv2d": "conv2d",
    "einsum": "einsum",
}


@dataclass
class GemmCall:
    """One GEMM call: its operands (`a` the input, `b` the weight or second operand), the dims each is
    reduced along and has its channels along, and the size of the reduction."""

    op: str
    a: torch.Tensor
    b: torch.Tensor
    a_reduction: int
    b_reduction: int
    a_channel: int
    b_channel: int
    output_channel: int
    reduced: int  # the length of the dot product each output element is

    def flops(self, out: torch.Tensor) -> int:
        return 2 * out.numel() * self.reduced


def gemm_call(name: str, args: tuple, kwargs: dict) -> GemmCall | None:
    """The GEMM `name(*args, **kwargs)` is, or None when it is none (or one a probe does not read)."""
    op = GEMM_NAMES.get(name)
    if op is None:
        return None
    try:
        if op == "linear":
            a, b = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "weight")
            return _checked(GemmCall(op, a, b, -1, -1, -1, 0, -1, a.shape[-1]))
        if op in ("matmul", "mm", "bmm"):
            a, b = (args[1], args[0]) if name == "__rmatmul__" else (args[0], args[1])
            b_reduction = -2 if b.dim() >= 2 else 0
            return _checked(GemmCall(op, a, b, -1, b_reduction, -1, -1, -1, a.shape[-1]))
        if op == "addmm":
            a, b = _arg(args, kwargs, 1, "mat1"), _arg(args, kwargs, 2, "mat2")
            return _checked(GemmCall(op, a, b, -1, 0, -1, -1, -1, a.shape[-1]))
        if op in ("conv1d", "conv2d"):
            a, b = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "weight")
            return _checked(GemmCall(op, a, b, 1, 1, 1, 0, 1, math.prod(b.shape[1:])))
        return _einsum(args)
    except (IndexError, KeyError, AttributeError, TypeError, ValueError):
        return None


def _arg(args: tuple, kwargs: dict, index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs[name]


def _checked(call: GemmCall) -> GemmCall | None:
    ok = all(isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() >= 1 for t in (call.a, call.b))
    return call if ok and call.a.numel() and call.b.numel() else None


def _einsum(args: tuple) -> GemmCall | None:
    """A two-operand einsum without an ellipsis: reduced along the first letter its output lacks."""
    equation = args[0].replace(" ", "")
    operands = list(args[1]) if len(args) == 2 and isinstance(args[1], (list, tuple)) else list(args[1:])
    if len(operands) != 2 or "..." in equation:
        return None
    inputs, _, output = equation.partition("->")
    left, right = inputs.split(",")
    if not _:
        output = "".join(sorted(c for c in set(left + right) if (left + right).count(c) == 1))
    contracted = [c for c in left if c in right and c not in output]
    if not contracted:
        return None
    a, b = operands
    sizes = dict(zip(left, a.shape, strict=True)) | dict(zip(right, b.shape, strict=True))
    return _checked(
        GemmCall(
            "einsum", a, b, left.index(contracted[0]), right.index(contracted[0]), -1, -1, -1,
            math.prod(sizes[c] for c in contracted),
        )
    )  # fmt: skip


def with_operands(name: str, args: tuple, kwargs: dict, a: torch.Tensor, b: torch.Tensor) -> tuple[tuple, dict]:
    """The call's arguments with its two operands replaced (the way `gemm_call` read them)."""
    op = GEMM_NAMES[name]
    changed, named = list(args), dict(kwargs)
    positions = {"linear": (0, 1, "input", "weight"), "addmm": (1, 2, "mat1", "mat2")}
    positions |= {"conv1d": (0, 1, "input", "weight"), "conv2d": (0, 1, "input", "weight")}
    if op in positions:
        first, second, first_name, second_name = positions[op]
        for index, key, value in ((first, first_name, a), (second, second_name, b)):
            if len(changed) > index:
                changed[index] = value
            else:
                named[key] = value
    elif op == "einsum":
        changed = [args[0], [a, b]] if len(args) == 2 else [args[0], a, b]
    else:
        changed[0], changed[1] = (b, a) if name == "__rmatmul__" else (a, b)
    return tuple(changed), named
