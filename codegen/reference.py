"""A cluster's ops as torch code: what a generated kernel falls back to, and its shape function.

Every op was recorded with the callable the model's code called and its arguments (tensors as
the nodes that made them), so the reference replays the model's own calls in its own words:
`v3 = x * 2.0`, `v4 = torch.nn.functional.relu(v3)`, with the constants the model passed.  It
runs wherever the kernel cannot (CPU tensors, no Triton driver, gradients wanted, other dtypes),
and torch.compile traces it where the kernel does not run.
"""

from __future__ import annotations

import ast
import linecache
import math
from typing import Any

import torch

from fuselens.analysis.graph import Graph, Node, Ref, is_named

from .plan import KernelPlan, returned_outputs
from .torch_code import Assign, Code

_BINARY = {
    "__add__": "+", "__sub__": "-", "__mul__": "*", "__truediv__": "/", "__floordiv__": "//", "__mod__": "%",
    "__pow__": "**", "__matmul__": "@", "__and__": "&", "__or__": "|", "__xor__": "^", "__lt__": "<",
    "__le__": "<=", "__gt__": ">", "__ge__": ">=", "__eq__": "==", "__ne__": "!=",
}  # fmt: skip
_UNARY = {"__neg__": "-", "__invert__": "~", "__pos__": "+", "__abs__": "abs"}


class NoReference(Exception):
    """An op whose call cannot be written as a self-contained function of the cluster's inputs."""


def reference_text(
    graph: Graph, plan: KernelPlan, name: str, params: list[str], summary: str, number_params: list[str] | None = None
) -> str:
    """`_<name>_reference(params, number_params)`: the cluster's members, replayed as the model called
    them, with the numbers of the model's state (`plan.scalars`) as the caller passes them."""
    number_params = number_params if number_params is not None else [slot.name for slot in plan.scalars]
    statements, names = forward_statements(graph, plan, params, number_params)
    outputs = [names[o.node] for o in returned_outputs(plan)]
    body = [*map(str, statements), f"    return {', '.join(outputs)}"]
    doc = f'    """{summary} as the model computes it: what runs where the kernel cannot."""'
    return "\n".join([f"def _{name}_reference({', '.join(params + number_params)}):", doc, *body])


def forward_statements(
    graph: Graph, plan: KernelPlan, params: list[str], number_params: list[str], given: dict[int, str] | None = None
) -> tuple[list[Assign], dict[int, str]]:
    """The statements that compute the cluster's members from its inputs (`params`) and numbers, and
    the name each member's value gets (`v<node>`; an input's is its parameter).  Members in `given`
    (node -> name) are not computed: the caller has their values under those names."""
    names = {slot.node: params[k] for k, slot in enumerate(plan.inputs)} | (given or {})
    numbers = {id(slot.value): _Param(p) for slot, p in zip(plan.scalars, number_params, strict=True)}
    body = []
    for member in sorted(plan.members):
        node = graph[member]
        if member in names:
            continue
        names[member] = f"v{member}"
        body.append(Assign(f"v{member}", _call(node, names, graph, [slot.node for slot in plan.inputs], numbers)))
    return body, names


def member_call(graph: Graph, plan: KernelPlan, member: int, params: list[str]) -> str:
    """The model's call of one member on the cluster's inputs (`params`): a GEMM's, which the library
    path of a GEMM cluster makes before its epilogue."""
    names = {slot.node: params[k] for k, slot in enumerate(plan.inputs)}
    return str(_call(graph[member], names, graph, [slot.node for slot in plan.inputs], {}))


class _Param:
    """A number the reference takes as a parameter (`eps`), where the model's call passed `self.eps`."""

    def __init__(self, name: str):
        self.name = name


def _with_params(value: Any, numbers: dict[int, _Param]) -> Any:
    if is_named(value):
        return numbers.get(id(value), value)
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        return type(value)(_with_params(v, numbers) for v in value)
    if isinstance(value, dict):
        return {k: _with_params(v, numbers) for k, v in value.items()}
    return value


class _DtypeOf:
    """A cast's dtype that follows a kernel input's (`x.to(weight.dtype)`)."""

    def __init__(self, name: str):
        self.name = name


class _DeviceOf:
    """A device that follows a kernel input's (`x.to(in0.device)`)."""

    def __init__(self, name: str):
        self.name = name


def _following_device(value: Any, first_input: str) -> Any:
    """`value` with each device the trace read from a tensor (`positions.to(embeds.device)`: the meta
    device, where the analysis runs) read from the cluster's first input at run time instead, as the
    launcher places its outputs: the model's code moves values to the device the model runs on, never
    to the meta device."""
    if isinstance(value, torch.device) and value.type == "meta":
        return _DeviceOf(first_input)
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        return type(value)(_following_device(v, first_input) for v in value)
    if isinstance(value, dict):
        return {k: _following_device(v, first_input) for k, v in value.items()}
    return value


def _call(node: Node, names: dict[int, str], graph: Graph, inputs: list[int], numbers: dict[int, _Param]) -> Code:
    if node.replay is None:
        raise NoReference(f"`{node.op}` was recorded without its call")
    func, args, kwargs, index = node.replay
    args, kwargs = _with_params(args, numbers), _with_params(kwargs, numbers)
    if inputs:
        args, kwargs = _following_device(args, names[inputs[0]]), _following_device(kwargs, names[inputs[0]])
    if getattr(func, "__name__", "") in ("to", "type") and not _spells_dtype(node):
        args, kwargs = _following_dtype(args, kwargs, [(names[i], graph[i]) for i in inputs])
    if getattr(func, "__name__", "") in ("layer_norm", "rms_norm"):
        args, kwargs = _normalized_shape_of_input(args, kwargs)
    if node.op == "cat":
        args, kwargs = _without_empty_pieces(args, kwargs, names, graph)
    if _reads_only_metadata(func) and not (isinstance(args[1], Ref) and args[1].node in names):
        first = _value(args[0], names)
        text, same = _metadata_call(func, first, args[1], graph, [(names[i], graph[i]) for i in inputs])
        reads = _reads(args[0], names) | ({same} if same else set())
    else:
        text = _expression(func, [_value(a, names) for a in args], {k: _value(v, names) for k, v in kwargs.items()})
        reads = _reads(args, names) | _reads(kwargs, names)
    return Code(f"{text}[{index}]" if index is not None else text, frozenset(reads))


def _without_empty_pieces(args: tuple, kwargs: dict, names: dict[int, str], graph: Graph) -> tuple[tuple, dict]:
    """A concatenation's call without the empty pieces the cluster does not take (the graph's `cat`
    leaves them out: `normalise`), which add nothing to its result."""

    def empty(piece) -> bool:
        meta = graph[piece.node].meta if isinstance(piece, Ref) and piece.node not in names else None
        return meta is not None and meta.numel == 0

    def kept(pieces):
        return [p for p in pieces if not empty(p)]

    if "tensors" in kwargs:
        return args, {**kwargs, "tensors": kept(kwargs["tensors"])}
    if args and isinstance(args[0], (list, tuple)):
        return (kept(args[0]), *args[1:]), kwargs
    return args, kwargs


def _expression(func: Any, args: list[str], kwargs: dict[str, str]) -> str:
    name = getattr(func, "__name__", "") or type(func).__name__
    if name == "__get__":  # a property such as x.T
        owner = getattr(func, "__self__", None)
        return f"{args[0]}.{getattr(owner, '__name__', '')}"
    call_args = ", ".join(args[1:] + [f"{k}={v}" for k, v in kwargs.items()])
    if name in _BINARY and len(args) == 2 and not kwargs:
        return f"({args[0]} {_BINARY[name]} {args[1]})"
    if name.startswith("__r") and f"__{name[3:]}" in _BINARY and len(args) == 2 and not kwargs:
        return f"({args[1]} {_BINARY['__' + name[3:]]} {args[0]})"
    if name in _UNARY and len(args) == 1:
        return f"abs({args[0]})" if name == "__abs__" else f"({_UNARY[name]}{args[0]})"
    if name == "__getitem__":
        return f"{args[0]}[{args[1]}]"
    if _is_method(func):
        return f"{args[0]}.{name}({call_args})"
    return f"{_function_path(func, name)}({', '.join(args + [f'{k}={v}' for k, v in kwargs.items()])})"


def _is_method(func: Any) -> bool:
    qual = getattr(func, "__qualname__", "")
    module = getattr(func, "__module__", None) or ""
    return qual.startswith(("TensorBase.", "Tensor.", "_TensorBase.")) or module == "torch._tensor"


def _function_path(func: Any, name: str) -> str:
    module = getattr(func, "__module__", None) or ""
    if module.startswith("torch.nn.functional") or module == "torch._C._nn":
        return f"torch.nn.functional.{name}"
    if module in ("torch", "torch.functional", "torch._C._VariableFunctions", "torch._C") or getattr(
        func, "__qualname__", ""
    ).startswith("_VariableFunctionsClass"):
        return f"torch.{name}"
    if module.startswith("torch"):
        return f"{module}.{name}"
    raise NoReference(f"`{module}.{name}` is not a torch function")


def _reads_only_metadata(func: Any) -> bool:
    return getattr(func, "__name__", "") in ("type_as", "expand_as", "view_as", "reshape_as")


_METADATA_CALLS = {"type_as": "to", "expand_as": "expand", "view_as": "view", "reshape_as": "reshape"}


def _metadata_call(
    func: Any, first: str, other: Any, graph: Graph, inputs: list[tuple[str, Node]]
) -> tuple[str, str | None]:
    """`a.type_as(b)` reads only b's dtype (`expand_as` its shape), and b is not an input of the
    kernel: the reference reads it from an input that had the same dtype (shape) in the trace, so it
    follows the model into other dtypes (`a.to(x.dtype)`), else it says what was read.  The call, and
    the input it reads that from (None: none)."""
    meta = graph[other.node].meta if isinstance(other, Ref) else None
    if meta is None:
        raise NoReference(f"`{func.__name__}` of a value with no recorded metadata")
    if func.__name__ == "type_as":
        same = next((name for name, n in inputs if n.meta is not None and n.meta.dtype == meta.dtype), None)
        return (f"{first}.to({same}.dtype)" if same else f"{first}.to(torch.{meta.dtype})"), same
    same = next((name for name, n in inputs if n.meta is not None and n.meta.shape == meta.shape), None)
    if same:
        return f"{first}.{func.__name__}({same})", same
    return f"{first}.{_METADATA_CALLS[func.__name__]}({tuple(meta.shape)!r})", None


def _spells_dtype(node: Node) -> bool:
    """Whether the model's code names the dtype it casts to (`x.float()`, `x.to(torch.float32)`),
    rather than reading it from a value (`x.to(input_dtype)`, `x.to(y.dtype)`)."""
    frame = node.source
    if frame is None or not frame.end_line:
        return True
    lines = linecache.getlines(frame.file)[frame.line - 1 : frame.end_line]
    if not lines:
        return True
    chunk = [line.encode() for line in lines]
    chunk[-1] = chunk[-1][: frame.end_col]
    chunk[0] = chunk[0][frame.col :]
    try:
        call = ast.parse(b"".join(chunk).decode().strip(), mode="eval").body
    except (SyntaxError, UnicodeDecodeError):
        return True
    if not isinstance(call, ast.Call):
        return True
    written = [*call.args, *(k.value for k in call.keywords)]
    return any(
        (isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name) and a.value.id == "torch")
        or isinstance(a, ast.Constant)
        for a in written
    )


def _following_dtype(args: tuple, kwargs: dict, inputs: list[tuple[str, Node]]) -> tuple[tuple, dict]:
    """A cast to a dtype the code read from a value: the same dtype as a kernel input had in the
    trace, read from that input at run time (a weight's first: it is the model's dtype), so the
    reference follows the model into other dtypes."""

    def follow(value: Any) -> Any:
        if not isinstance(value, torch.dtype):
            return value
        same = [
            (name, n) for name, n in inputs if n.meta is not None and n.meta.dtype == str(value).removeprefix("torch.")
        ]
        same.sort(key=lambda item: item[1].op not in ("param", "buffer"))
        return _DtypeOf(same[0][0]) if same else value

    return tuple(follow(a) for a in args), {k: follow(v) for k, v in kwargs.items()}


class _TrailingShape:
    """A norm's `normalized_shape`, read from its input at run time (`x.shape[-1:]`): the kernel
    takes any width, and so does the reference."""

    def __init__(self, of: Any, dims: int):
        self.of, self.dims = of, dims


def _normalized_shape_of_input(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    shape = args[1] if len(args) > 1 else kwargs.get("normalized_shape")
    if not args or not isinstance(shape, (tuple, list, torch.Size)) or not shape:
        return args, kwargs
    trailing = _TrailingShape(args[0], len(shape))
    if len(args) > 1:
        return (args[0], trailing, *args[2:]), kwargs
    return args, {**kwargs, "normalized_shape": trailing}


def _reads(value: Any, names: dict[int, str]) -> set[str]:
    """The variables `_value`'s text of `value` reads: the tensors' names and the numbers' parameters."""
    if isinstance(value, _TrailingShape):
        return _reads(value.of, names)
    if isinstance(value, (_DtypeOf, _DeviceOf, _Param)):
        return {value.name}
    if isinstance(value, Ref):
        return {names[value.node]}
    if isinstance(value, slice):
        return _reads(value.start, names) | _reads(value.stop, names) | _reads(value.step, names)
    if isinstance(value, dict):
        return set().union(*(_reads(v, names) for v in value.values()))
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        return set().union(*(_reads(v, names) for v in value))
    return set()


def _value(value: Any, names: dict[int, str]) -> str:
    if isinstance(value, _TrailingShape):
        return f"{_value(value.of, names)}.shape[-{value.dims}:]"
    if isinstance(value, _DtypeOf):
        return f"{value.name}.dtype"
    if isinstance(value, _DeviceOf):
        return f"{value.name}.device"
    if isinstance(value, _Param):
        return value.name
    if isinstance(value, Ref):
        if value.node not in names:
            raise NoReference("an op reads a tensor that is not an input of the cluster")
        return names[value.node]
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "unbound":
        raise NoReference("an op reads a tensor recorded without its node")
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, torch.Size):
        return repr(tuple(value))
    if isinstance(value, (torch.device, torch.memory_format, torch.layout)):
        return f"torch.{value}" if not isinstance(value, torch.device) else f"torch.device({str(value)!r})"
    if isinstance(value, float):
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
        return repr(value)
    if isinstance(value, slice):
        return f"slice({_value(value.start, names)}, {_value(value.stop, names)}, {_value(value.step, names)})"
    if value is Ellipsis:
        return "..."
    if isinstance(value, list):
        return "[" + ", ".join(_value(v, names) for v in value) + "]"
    if isinstance(value, tuple):
        inner = ", ".join(_value(v, names) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, (bool, int, str, type(None))):
        return repr(value)
    raise NoReference(f"a constant of type {type(value).__name__} has no literal")
