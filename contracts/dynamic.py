"""The report's dynamic-shape section: a model's costs over the declared ranges of its sizes.

Plain data (no torch, no sympy), so the language server reads it as it reads the rest of the
report.  An `Expression` is kept twice: as the text sympy prints for its canonical form (for
people), and as a tree (for programs), so that nobody parses the text back:

    an int               a number
    a str                a declared size ("seq")
    [op, operand, ...]   op one of OPERATORS

`evaluate` computes a tree at a binding of the sizes.  `DYNAMIC_VERSION` numbers this
section's own layout, inside the report's `schema_version`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .dims import DimRange

DYNAMIC_VERSION = 2  # 2: a cluster's GEMM FLOPs (`DynamicCluster.gemm_flop`, `gemm_dtype`)

Tree = Any  # int | str | list: see the module's docstring

_FOLDS: dict[str, Callable[[list[float]], float]] = {
    "+": lambda xs: sum(xs),
    "*": lambda xs: math.prod(xs),
    "min": min,
    "max": max,
}
_BINARY: dict[str, Callable[[float, float], Any]] = {
    "**": lambda a, b: a**b,
    "/": lambda a, b: a / b,
    "//": lambda a, b: a // b,
    "%": lambda a, b: a % b,
    "<=": lambda a, b: a <= b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    ">": lambda a, b: a > b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}
_UNARY: dict[str, Callable[[float], Any]] = {"floor": math.floor, "ceil": math.ceil, "not": lambda a: not a}
_LOGIC = {"and": all, "or": any}
OPERATORS = (*_FOLDS, *_BINARY, *_UNARY, *_LOGIC)


class ExpressionError(ValueError):
    """A tree that names a size the binding does not give, or an operator that is not one of OPERATORS."""


def evaluate(tree: Tree, binding: Mapping[str, int]) -> Any:
    """The value of `tree` with each size at its value in `binding`."""
    if isinstance(tree, bool) or not isinstance(tree, (int, float, str, list)):
        raise ExpressionError(f"not an expression: {tree!r}")
    if isinstance(tree, (int, float)):
        return tree
    if isinstance(tree, str):
        if tree not in binding:
            raise ExpressionError(f"no value for the size {tree!r}")
        return binding[tree]
    if not tree or not isinstance(tree[0], str):
        raise ExpressionError(f"not an expression: {tree!r}")
    op, operands = tree[0], [evaluate(t, binding) for t in tree[1:]]
    if op in _FOLDS and operands:
        return _FOLDS[op](operands)
    if op in _BINARY and len(operands) == 2:
        return _BINARY[op](*operands)
    if op in _UNARY and len(operands) == 1:
        return _UNARY[op](operands[0])
    if op in _LOGIC:
        return _LOGIC[op](bool(o) for o in operands)
    raise ExpressionError(f"unknown operator {op!r} with {len(operands)} operand(s)")


@dataclass
class Expression:
    text: str  # sympy's printing of the canonical form: "8192*seq + 64"
    tree: Tree  # the same expression as data (the module's docstring)

    def at(self, binding: Mapping[str, int]) -> Any:
        return evaluate(self.tree, binding)


@dataclass
class Size:
    """A declared size: its range, the sizes answered at, and the one the concrete analysis ran at."""

    name: str
    min: int
    max: int
    corpus: list[int]
    binding: int  # the analysis binding: the report's other numbers are at this size
    corpus_given: bool = True  # False: the default corpus (the ends and a few powers of two)
    where: str = ""  # where it was declared
    used_by: list[str] = field(default_factory=list)  # the input dims that are this size: "x[1]"

    @classmethod
    def of(cls, dim: DimRange, where: str, used_by: list[str]) -> Size:
        return cls(dim.name, dim.min, dim.max, list(dim.corpus), dim.binding, dim.corpus_given, where, used_by)


@dataclass
class Guard:
    """A condition the model's code puts on the sizes (slicing a cache of 2048 rows: `seq <= 2048`)."""

    condition: Expression  # true at every size the model runs at as traced
    file: str
    line: int
    code: str = ""  # the line's text (a declared range it fails on refuses the model, at this line)


@dataclass
class PointCost:
    """A cluster's (or pattern's) costs at one binding of the sizes."""

    binding: dict[str, int]
    bytes_unfused: int | None
    bytes_fused: int | None
    regime: str | None  # a report `Regime`
    speedup: float | None  # expected: the traffic ratio where DRAM-bound, less where launches dominate


@dataclass
class RegimeChange:
    """Where a cluster's regime changes along one size (the others at their analysis binding)."""

    size: str
    at: int  # the first size in `above`
    below: str  # the regime below `at`
    above: str
    text: str  # "launch-bound below seq = 96"


@dataclass
class DynamicCluster:
    cluster: str  # the cluster's id
    # True: the costs are expressions of the sizes; False: `points` come from analyzing again at each
    # size, and `note` says why.
    symbolic: bool
    note: str = ""
    bytes_unfused: Expression | None = None
    bytes_fused: Expression | None = None
    largest_op: Expression | None = None  # the largest unfused op's traffic (whether it stays in L2)
    # The FLOPs of the GEMM a cluster starts with (its time against its traffic: whether it is
    # compute-bound), and their dtype (which throughput); None without one.
    gemm_flop: Expression | None = None
    gemm_dtype: str = ""
    launches: int = 0  # the kernels its ops run unfused
    points: list[PointCost] = field(default_factory=list)
    changes: list[RegimeChange] = field(default_factory=list)


@dataclass
class DynamicPattern:
    pattern: int  # its place in the model's `patterns`
    name: str
    symbolic: bool
    note: str = ""
    bytes_before: Expression | None = None
    bytes_after: Expression | None = None
    points: list[PointCost] = field(default_factory=list)  # bytes before/after, and the bound as `speedup`


@dataclass
class DynamicShapes:
    """A model analyzed over declared size ranges: the report's numbers elsewhere are at `binding`."""

    sizes: list[Size]
    binding: dict[str, int]  # the analysis binding
    points: list[dict[str, int]]  # the bindings answered at, in table order
    guards: list[Guard] = field(default_factory=list)
    symbolic: bool = True  # the sizes were followed as symbols through the forward
    note: str = ""  # why not, when not
    clusters: list[DynamicCluster] = field(default_factory=list)
    patterns: list[DynamicPattern] = field(default_factory=list)
    version: int = DYNAMIC_VERSION

    def cluster(self, cluster_id: str) -> DynamicCluster | None:
        return next((c for c in self.clusters if c.cluster == cluster_id), None)


def describe_binding(binding: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in binding.items())
