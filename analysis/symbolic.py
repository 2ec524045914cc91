"""Symbolic sizes: the shape of every value of a trace as an expression in the declared sizes.

The concrete trace (`capture.py`) runs at one binding of the declared sizes.  This pass runs
the same forward again on fake tensors whose named dims are symbols of a live `ShapeEnv`
(each with its declared range), numbering torch's calls exactly as the recorder does, so that
call `n`'s outputs here are the values the recorder made from call `n` (`Trace.call_nodes`).
A value's shape comes from its `SymInt`s' own expressions (`node.expr`), with the declared
names substituted for the environment's symbols: nothing is printed and parsed back.

The guards the model puts on the sizes (slicing a RoPE cache of 2048 rows guards
`seq <= 2048`) are read from the environment as they appear, each with the model's line that
made it.

What the pass cannot follow (a value read, a data-dependent size) ends it with the reason;
the caller then answers from the concrete analysis at each size instead.
"""

from __future__ import annotations

import dataclasses
import linecache
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from torch._guards import GuardSource, Source
from torch.overrides import TorchFunctionMode

from fuselens.contracts.config import InputSpec
from fuselens.contracts.dims import DimRange

from .capture import (
    _CASTS,
    _CONVS,
    Trace,
    UserCode,
    _callable_name,
    _conv_bias,
    as_torch_compile_traces,
    conv_then_bias,
    tensors_in,
)
from .graph import Graph, Node, TensorMeta
from .ops import DYNAMIC_SHAPES, METADATA, VALUE_READS, OpClass

_UNBOUNDED = 2**62  # a size's upper bound while tracing: larger than any, yet a number the range arithmetic takes


def size_symbol(name: str) -> sympy.Symbol:
    """The symbol a declared size is written as in every expression."""
    return sympy.Symbol(name, integer=True, positive=True)


@dataclass
class FoundGuard:
    """A condition the model's code puts on the sizes, and the model's line that made it."""

    condition: sympy.Basic  # in the declared sizes: `seq <= 2048`
    file: str
    line: int
    code: str  # that line's text


@dataclass
class SymbolicShapes:
    """The main trace's values with their shapes as expressions (`graph`), or why there are none."""

    graph: Graph | None  # the trace's graph, each value's shape an expression (None: the pass failed)
    guards: list[FoundGuard] = field(default_factory=list)
    unmapped: set[int] = field(default_factory=set)  # values whose expression was not found
    error: str = ""  # why the pass did not reach the end of the forward


class _Unfollowable(Exception):
    """The forward did something whose size cannot be an expression of the declared sizes."""


def symbolic_shapes(
    model: torch.nn.Module,
    specs: Sequence[InputSpec],
    dims: dict[str, DimRange],
    main: Trace,
    user_code: UserCode,
) -> SymbolicShapes:
    """Trace `model` with the declared sizes as symbols; `main` is the concrete trace at their bindings."""
    fixed = [n for n, d in dims.items() if d.binding < 2 < d.max + 1]
    if fixed:  # torch takes a size of 0 or 1 for that number, not a symbol: no expression would follow it
        name = fixed[0]
        return SymbolicShapes(None, error=f"{name} is analyzed at {dims[name].binding}, which torch takes as a number")
    recorder, inputs, error = _run(model, specs, dims, user_code, {n: d.binding for n, d in dims.items()})
    if error:
        return SymbolicShapes(None, recorder.guards, error=error)
    pinned = next((g for g in recorder.guards if isinstance(g.condition, sympy.Eq)), None)
    if pinned is not None:  # the code made a size a number (`int(seq)`): shapes past it are that number's
        where = f" ({pinned.file}:{pinned.line}: {pinned.code})" if pinned.file else ""
        return SymbolicShapes(None, recorder.guards, error=f"the model's code fixes {pinned.condition}{where}")
    graph, unmapped = _expressed(main, recorder, inputs)
    return SymbolicShapes(graph, recorder.guards, unmapped)


def guards_at_small_sizes(
    model: torch.nn.Module, specs: Sequence[InputSpec], dims: dict[str, DimRange], user_code: UserCode
) -> list[FoundGuard]:
    """The guards of a trace with each size near its minimum (2 at least: torch takes sizes 0 and 1 for
    numbers): where the analysis binding fails (past a cache's rows), the bound it went past."""
    hints = {n: min(max(d.min, 2), d.max) for n, d in dims.items()}
    return _run(model, specs, dims, user_code, hints)[0].guards


def _run(
    model: torch.nn.Module,
    specs: Sequence[InputSpec],
    dims: dict[str, DimRange],
    user_code: UserCode,
    hints: dict[str, int],
) -> tuple[_ShapeRecorder, list[torch.Tensor], str]:
    """The forward on fake inputs whose declared sizes are symbols with these hints: the recorder, the
    inputs, and why the forward did not reach its end ("" when it did)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    env = ShapeEnv(duck_shape=False)  # two sizes bound alike stay two sizes
    names: dict[sympy.Symbol, sympy.Symbol] = {}
    ints: dict[str, Any] = {}
    for name, dim in dims.items():
        symbol = env.create_symbol(hints[name], _DeclaredSize(name), dynamic_dim=DimDynamic.DYNAMIC)
        # No upper bound: what the model allows is then a guard, found and placed at its line whatever
        # range was declared, and the declared range is checked against it (`pipeline/dynamic.py`).
        env.constrain_symbol_range(symbol, compiler_min=dim.min, compiler_max=_UNBOUNDED)
        names[symbol] = size_symbol(name)
        ints[name] = env.create_symintnode(symbol, hint=hints[name])
    recorder = _ShapeRecorder(env, names, user_code)
    fake = FakeTensorMode(shape_env=env, allow_non_fake_inputs=True)
    inputs: list[torch.Tensor] = []
    try:
        with fake, torch.device("meta"):
            inputs = [
                torch.empty([ints[n] if n else d for d, n in _dims_of(spec)], dtype=getattr(torch, spec.dtype))
                for spec in specs
            ]
            with as_torch_compile_traces(), torch.no_grad(), recorder:
                model(*inputs)
    except _Unfollowable as exc:
        return recorder, inputs, str(exc)
    except Exception as exc:  # a trace that runs concretely can still fail on symbols; say why, answer concretely
        return recorder, inputs, f"{type(exc).__name__}: {exc}{recorder.where()}".strip()
    return recorder, inputs, ""


@dataclass(frozen=True)
class _DeclaredSize(Source):
    """Where a symbol's value comes from, for the environment: a declared size, by name.  (As dynamo's
    `ConstantSource`, whose import, all of torch._dynamo, takes seconds.)"""

    size: str

    @property
    def guard_source(self) -> GuardSource:
        return GuardSource.CONSTANT

    @property
    def _name_template(self) -> str:
        return self.size


def _dims_of(spec: InputSpec) -> list[tuple[int, str | None]]:
    return list(zip(spec.shape, spec.symbols or [None] * len(spec.shape), strict=True))


class _ShapeRecorder(TorchFunctionMode):
    """Keeps each torch call's outputs by the number the concrete recorder gives that call, and the guards
    each call adds.  The numbering follows `capture.Recorder.__torch_function__`: metadata reads are not
    calls, a convolution with a bias is three (the convolution, the bias's view, the add)."""

    def __init__(self, env: Any, names: dict[sympy.Symbol, sympy.Symbol], user_code: UserCode):
        super().__init__()
        self.env = env
        self.names = names
        self.user_code = user_code
        self.outputs: dict[int, list[torch.Tensor]] = {}
        self.guards: list[FoundGuard] = []
        self._calls = 0
        self._seen_guards = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _callable_name(func)
        if name in METADATA:
            return func(*args, **kwargs)
        if name in VALUE_READS:
            raise _Unfollowable(f"the forward reads a value ({name}){self.where()}: its sizes are not followed")
        if name in DYNAMIC_SHAPES or (name == "where" and len(args) + len(kwargs) == 1):
            raise _Unfollowable(f"{name} makes a size that depends on the data{self.where()}")
        if name in _CONVS and _conv_bias(args, kwargs) is not None:
            return self._conv_then_bias(func, types, name, args, kwargs)
        number = self._calls
        self._calls += 1
        out = func(*args, **kwargs)
        if name in _CASTS and isinstance(out, torch.Tensor) and args and out is args[0]:
            out = out.view(out.shape)  # (as the recorder: a new alias stands for the cast)
        self.outputs[number] = tensors_in(out)
        self._take_guards()
        return out

    _conv_then_bias = conv_then_bias

    def _take_guards(self) -> None:
        new = self.env.guards[self._seen_guards :]
        self._seen_guards = len(self.env.guards)
        if not new:
            return
        file, line = self._user_line()
        for guard in new:
            # As the code asked it: simplified, a guard that pins a size (`Eq(s0, 256)`) is `True` once the
            # environment replaces the size by its number.
            condition = sympy.sympify(guard.expr).xreplace(self.names)
            if condition.free_symbols and condition is not sympy.true:
                code = linecache.getline(file, line).strip() if file else ""
                self.guards.append(FoundGuard(condition, file, line, code))

    def expression(self, expr: Any) -> sympy.Basic:
        """`expr` of the environment in the declared sizes' symbols."""
        return sympy.sympify(self.env.simplify(expr)).xreplace(self.names)

    def _user_line(self) -> tuple[str, int]:
        f: types.FrameType | None = sys._getframe(1)
        while f is not None:
            if self.user_code.model_code(f.f_code.co_filename):
                return f.f_code.co_filename, f.f_lineno
            f = f.f_back
        return "", 0

    def where(self) -> str:
        file, line = self._user_line()
        return f" at {file}:{line}" if file else ""


def _expressed(main: Trace, recorder: _ShapeRecorder, inputs: list[torch.Tensor]) -> tuple[Graph, set[int]]:
    """`main.graph` with each value's shape an expression; the ids of values none was found for."""
    graph = main.graph
    shapes: dict[int, tuple] = {}
    input_nodes = [n for n in graph if n.op == "input" and n.cls is OpClass.SOURCE]
    for node, tensor in zip(input_nodes, inputs, strict=False):
        shapes[node.id] = _shape(tensor, recorder)
    for number, made in main.call_nodes.items():
        outputs = recorder.outputs.get(number, [])
        used: set[int] = set()
        for node_id in made:
            node = graph[node_id]
            if node.meta is None or _static_source(node):
                continue
            match = next(
                (i for i, t in enumerate(outputs) if i not in used and _hints(t) == tuple(node.meta.shape)), None
            )
            if match is not None:
                used.add(match)
                shapes[node_id] = _shape(outputs[match], recorder)
    unmapped = {
        n.id for n in graph if n.meta is not None and not _static_source(n) and n.id not in shapes and n.op != "output"
    }
    nodes = [_with_shape(n, shapes.get(n.id)) for n in graph]
    return dataclasses.replace(graph, nodes=nodes), unmapped


def _static_source(node: Node) -> bool:
    """A parameter, buffer or constant: its size is the model's, whatever the inputs'."""
    return node.cls is OpClass.SOURCE and node.op in ("param", "buffer", "const")


def _hints(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(d.node.hint) if isinstance(d, torch.SymInt) else int(d) for d in tensor.shape)


def _shape(tensor: torch.Tensor, recorder: _ShapeRecorder) -> tuple:
    return tuple(
        recorder.expression(d.node.expr) if isinstance(d, torch.SymInt) else sympy.Integer(int(d)) for d in tensor.shape
    )


def _with_shape(node: Node, shape: tuple | None) -> Node:
    if shape is None or node.meta is None:
        return node
    meta = TensorMeta(shape, node.meta.stride, node.meta.dtype, node.meta.storage_offset)
    return dataclasses.replace(node, meta=meta)
