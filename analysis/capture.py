"""Capture: run a model's forward pass on meta tensors and record every torch call.

A `TorchFunctionMode` sees each call the user's code makes into torch (`x * 2`,
`F.gelu(x)`, `self.proj(x)` -> `linear`), before torch decomposes it, so the graph speaks
the user's vocabulary.  Tensors live on the meta device: shapes, strides and dtypes are
exact, no memory is touched, and a 65536x4096 input costs nothing.

Provenance comes from the Python stack at the moment of the call: the innermost frame
in the user's code is the op's source line; module forward hooks give the instance path
(`blocks.3.mlp`) so repeated layers can be recognised.

Meta tensors have no values.  When the user's code asks for one (`if h.mean() > 0:`,
`.item()`), that is exactly where torch.compile breaks the graph too: a branch is
recorded as a graph break and the trace follows the branch taken when the condition
holds (or the one `decisions` picks); reading a number stops the trace there, and what
was captured so far is still analyzed.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import sysconfig
import traceback
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
from torch.overrides import TorchFunctionMode

from fuselens.contracts.report import GraphBreak, SourceRef

from .graph import Frame, Graph, Node, Ref, TensorMeta
from .normalise import bind, dtype_name, norm_dim, normalise, opaque_params, values_and_indices
from .ops import ALIASES, DYNAMIC_SHAPES, FACTORIES, METADATA, VALUE_READS, OpClass, op_class
from .packages import package_of
from .scalars import ScalarSources
from .settings import class_identity, module_settings

_TORCH_DIR = os.path.dirname(torch.__file__)
_FUSELENS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Torch's code and the analysis's own, whose frames every op's stack holds: never a model's.
_TOOLCHAIN_DIRS = (_TORCH_DIR + os.sep, os.path.join(_FUSELENS_DIR, "analysis") + os.sep)
_SYSTEM_DIRS = tuple(
    {p for p in (sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")) if p}
)


def tensor_meta(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(
        tuple(int(d) for d in t.shape), tuple(int(s) for s in t.stride()), dtype_name(t.dtype), int(t.storage_offset())
    )


class CaptureError(Exception):
    """The user's forward pass failed; `frame` is the user's line it failed at."""

    def __init__(self, message: str, frame: Frame | None, kind: str = "trace"):
        super().__init__(message)
        self.frame = frame
        self.kind = kind


class _StopTrace(Exception):
    pass


# What the recorder itself reads of the tensors of a call (shapes, strides, views) is none of the model's
# calls: run with torch functions off, it skips the default-device mode under the recorder (a Python call
# for each read, several for each op).  Nothing it runs makes a tensor without naming the device.
_bookkeeping = torch._C.DisableTorchFunction


@dataclass
class UserCode:
    """Decides which source files are the user's (vs torch, the stdlib, installed packages), and which
    are a model library's (an installed package other than torch and its toolchain, wherever it was
    imported from: `packages.py`)."""

    roots: tuple[str, ...] = ()
    home: str = ""  # the analyzed file, for the line of it that reaches code elsewhere

    def __post_init__(self) -> None:
        self._cache: dict[str, bool] = {}
        self._library: dict[str, bool] = {}

    def __call__(self, filename: str) -> bool:
        hit = self._cache.get(filename)
        if hit is None:
            hit = self._cache[filename] = self._decide(filename)
        return hit

    def _decide(self, filename: str) -> bool:
        if filename.startswith("<"):
            return False
        path = os.path.abspath(filename)
        if path.startswith(_TORCH_DIR) or path.startswith(_FUSELENS_DIR + os.sep + "analysis"):
            return False
        if self.roots and any(path.startswith(r) for r in self.roots):
            return True
        if any(path.startswith(d) for d in _SYSTEM_DIRS):
            return False
        return package_of(path, self.home) is None

    def library(self, filename: str) -> bool:
        """Model code of an installed library: transformers' modeling files, timm's layers, ..."""
        hit = self._library.get(filename)
        if hit is None:
            if os.path.abspath(filename).startswith(_TOOLCHAIN_DIRS):
                hit = False  # (no package to look up: a namespace package's path is searched again then)
            else:
                found = package_of(filename, self.home)
                hit = found is not None and not found.toolchain
            self._library[filename] = hit
        return hit

    def model_code(self, filename: str) -> bool:
        """The user's code or a library's: where an op's line is looked for."""
        return self(filename) or self.library(filename)


# Ops whose numbers can be the model's state (`x * self.scale`, `F.group_norm(x, self.groups, eps=self.eps)`).
_TAKES_NUMBERS = frozenset({OpClass.UNARY, OpClass.BINARY, OpClass.TERNARY})
# Other ops whose numbers can be the model's state: a norm's eps and group count, a loss's ignored class
# and label smoothing, an embedding's padding row.
_NUMBERS_OF_STATE = frozenset(
    {"layer_norm", "rms_norm", "group_norm", "batch_norm", "cross_entropy", "nll_loss", "embedding"}
)

# Convolutions, by name, with the number of their spatial dims.
_CONVS = {"conv1d": 1, "conv2d": 2, "conv3d": 3}


def _conv_bias(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The bias tensor a convolution is called with (`torch.conv2d(input, weight, bias, ...)`)."""
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    return bias if isinstance(bias, torch.Tensor) else None


# Methods that cast a tensor; called with the dtype it has, they return it as it is.
_CASTS = frozenset({"to", "float", "half", "bfloat16", "double", "long", "int", "bool", "type", "type_as"})


def _callable_name(func: Callable) -> str:
    name = getattr(func, "__name__", None) or type(func).__name__
    if name == "__get__":  # a property such as x.T or x.mT
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    return name


_OPERATORS = {
    "__add__": "+",
    "__radd__": "+",
    "__iadd__": "+=",
    "__sub__": "-",
    "__rsub__": "-",
    "__isub__": "-=",
    "__mul__": "*",
    "__rmul__": "*",
    "__imul__": "*=",
    "__truediv__": "/",
    "__rtruediv__": "/",
    "__pow__": "**",
    "__rpow__": "**",
    "__neg__": "unary -",
    "__matmul__": "@",
    "__getitem__": "[]",
    "__setitem__": "[]=",
    "__lt__": "<",
    "__le__": "<=",
    "__gt__": ">",
    "__ge__": ">=",
    "__eq__": "==",
    "__ne__": "!=",
    "__and__": "&",
    "__or__": "|",
    "__invert__": "~",
    "__floordiv__": "//",
    "__mod__": "%",
}


def _display(func: Callable, name: str) -> str:
    if name in _OPERATORS:
        return f"operator {_OPERATORS[name]}"
    module = getattr(func, "__module__", None) or ""
    qual = getattr(func, "__qualname__", name)
    if qual.startswith(("TensorBase.", "Tensor.", "_TensorBase.")) or module == "torch._tensor":
        return "Tensor." + name
    if "getset_descriptor" in qual:
        return "Tensor." + name
    if module.startswith("torch.nn.functional") or module == "torch._C._nn":
        return "torch.nn.functional." + name
    if module in ("torch", "torch.functional", "torch._C._VariableFunctions") or qual.startswith(
        "_VariableFunctionsClass"
    ):
        return "torch." + name
    return f"{module}.{name}" if module else name


def conv_then_bias(mode: TorchFunctionMode, func, types, name: str, args: tuple, kwargs: dict) -> torch.Tensor:
    """A convolution with a bias, recorded as the convolution without it and then the add of the
    bias over the channels: on a GPU, torch adds cuDNN's bias in a kernel of its own, so that add
    is memory traffic the kernel after the convolution can take in."""
    bias = _conv_bias(args, kwargs)
    if len(args) > 2:
        args = (*args[:2], None, *args[3:])
    else:
        kwargs = {**kwargs, "bias": None}
    out = mode.__torch_function__(func, types, args, kwargs)
    spatial = (slice(None),) + (None,) * _CONVS[name]
    channels = mode.__torch_function__(torch.Tensor.__getitem__, types, (bias, spatial))
    return mode.__torch_function__(torch.Tensor.add, types, (out, channels))


class Recorder(TorchFunctionMode):
    """Records torch calls into a `Graph` while the user's forward runs."""

    def __init__(
        self,
        user_code: UserCode,
        sources: dict[int, tuple[str, str]],
        module_paths: dict[int, str],
        stop_at: Any,
        decisions: Sequence[bool] = (),
        real: bool = False,
        retain: bool = False,
    ):
        super().__init__()
        self.real = real  # the values are real tensors (otherwise meta: shapes without data)
        self.retain = retain  # keep a copy of every value (validation checks kernels on them)
        self.values: dict[int, torch.Tensor] = {}
        self._storage_copies: dict[tuple[int, int], Any] = {}  # (storage address, version) -> copy
        self.graph = Graph()
        self.user_code = user_code
        self.sources = sources  # id(tensor) -> (kind, name) for parameters and buffers
        self.module_paths = module_paths
        self.module_stack: list[str] = []
        # The modules running that are none of the model's: class name, class identity and settings.
        self.stray_stack: list[tuple[str, str, dict[str, Any]]] = []
        self.stop_at = stop_at  # code object of the driver frame: stack walks stop there
        self.decisions = list(decisions)
        self.branches_taken: list[bool] = []
        self.branch_breaks: list[GraphBreak] = []  # the break of each branch, in order
        self.piece = 0
        self.stopped: GraphBreak | None = None
        self._values: dict[int, int] = {}
        self._keep: list[Any] = []
        self._memo: dict[Any, tuple] = {}
        self._invocations: dict[int, int] = {}
        self._owners: list[str] = []  # by invocation: the module path of the frame's `self`
        # For each frame of each op, by its code object's id (hashing a code object hashes its contents,
        # a microsecond or two each time): the code itself (kept, so that its id is not reused), and its
        # instructions' source spans, or whether it is model code and whether a library's.
        self._positions: dict[int, tuple[types.CodeType, list[Any]]] = {}
        self._code_kinds: dict[int, tuple[types.CodeType, bool, bool]] = {}
        self._frame_refs: list[Any] = []
        self._caller: types.FrameType | None = None  # innermost user frame of the call being recorded
        self._scalars = ScalarSources(user_code.model_code, self._invocation, self._module_path, self._made_at, stop_at)
        # Profiling: a context each call runs inside (a profiler range named after it), and the nodes
        # each call recorded, by the call's number.
        self.around_call: Callable[[int], contextlib.AbstractContextManager] | None = None
        self.call_nodes: dict[int, range] = {}
        self._calls = 0

    # ---- inputs -------------------------------------------------------------------
    def add_input(self, tensor: torch.Tensor, name: str) -> int:
        node = self._new("input", OpClass.SOURCE, meta=tensor_meta(tensor), name=name, call="input")
        self._bind_value(tensor, node.id)
        return node.id

    def mark_outputs(self, out: Any) -> None:
        refs = [Ref(self._ref(t)) for t in tensors_in(out)]
        self._new("output", OpClass.OPAQUE, args=refs, call="return")

    # ---- the mode -----------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _callable_name(func)
        if name in METADATA:
            return func(*args, **kwargs)
        if name in VALUE_READS:
            return self._value_read(func, name, args, kwargs)
        if name in DYNAMIC_SHAPES or (name == "where" and len(args) + len(kwargs) == 1):
            self._dynamic_shape(name)
        if name in _CONVS and _conv_bias(args, kwargs) is not None:
            return self._conv_then_bias(func, types, name, args, kwargs)
        # Numbers read from the model's state (`self.eps`) carry where they come from: a kernel takes them
        # from its caller.  The call itself runs on the plain values.
        called_args, called_kwargs = args, kwargs
        with _bookkeeping():
            args, kwargs = self._tagged(func, name, args, kwargs)
            template = self._template((args, kwargs))  # the call as made: validation and the reference replay it
        number, first = self._calls, len(self.graph.nodes)
        self._calls += 1
        with self.around_call(number) if self.around_call else contextlib.nullcontext():
            out = self._call(func, called_args, called_kwargs)
            if name in _CASTS and isinstance(out, torch.Tensor) and args and out is args[0]:
                # A cast to the dtype the tensor has returns the tensor itself.  A new alias stands for
                # the result, so what reads the cast's result reads the cast (`x.to(input_dtype)` stays
                # in the graph, and a kernel's reference casts too in a model of another dtype), while
                # what reads the tensor elsewhere does not.
                out = out.view(out.shape)
        with _bookkeeping():
            if not tensors_in(out) and name not in ("__setitem__",):
                return out
            first_new = len(self.graph.nodes)
            try:
                self._record(func, name, args, kwargs, out)
                if template is not None:
                    self._attach_replay(func, template, out, first_new)
            except _StopTrace:
                raise
            except Exception as exc:  # a normalisation gap must never fail the user's trace
                self._record_opaque(func, name, args, kwargs, out, note=f"unrecognised call ({exc})")
            self.call_nodes[number] = range(first, len(self.graph.nodes))
        return out

    _conv_then_bias = conv_then_bias

    def _tagged(self, func, name: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        alias = ALIASES.get(name, name)
        canon = (alias[0] if isinstance(alias, tuple) else alias).rstrip("_")
        if op_class(canon) not in _TAKES_NUMBERS and canon not in _NUMBERS_OF_STATE:
            return args, kwargs
        return self._scalars.tag(func, sys._getframe(2), args, kwargs)

    def _made_at(self, tensor: Any, frame: types.FrameType) -> tuple[int, int, int, int] | None:
        """The span, in `frame`, of the expression whose op made `tensor` (None: not made there)."""
        node_id = self._values.get(id(tensor))
        invocation = self._invocations.get(id(frame))
        if node_id is None or invocation is None or self._frame_refs[invocation] is not frame:
            return None
        made = next((f for f in self.graph.nodes[node_id].stack if f.invocation == invocation), None)
        return made.span if made is not None and made.col >= 0 else None

    def _module_path(self, obj: Any) -> str | None:
        return self.module_paths.get(id(obj)) if isinstance(obj, torch.nn.Module) else None

    def _template(self, value: Any) -> Any:
        """The call's arguments with each tensor replaced by a Ref to the node holding it now."""
        if isinstance(value, torch.Tensor):
            node_id = self._values.get(id(value))
            return Ref(node_id) if node_id is not None else ("unbound", value)
        if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
            items = [self._template(v) for v in value]
            return items if isinstance(value, list) else tuple(items)
        if isinstance(value, dict):
            return {k: self._template(v) for k, v in value.items()}
        return value

    def _resolve(self, value: Any) -> Any:
        if isinstance(value, tuple) and len(value) == 2 and value[0] == "unbound":
            return Ref(self._values[id(value[1])])  # a parameter first seen by this call
        if isinstance(value, (list, tuple)):
            return type(value)(self._resolve(v) for v in value)
        if isinstance(value, dict):
            return {k: self._resolve(v) for k, v in value.items()}
        return value

    def _attach_replay(self, func, template, out, first_new: int) -> None:
        """Let validation re-run each recorded call on other tensors (eager timing, torch.compile)."""
        args, kwargs = self._resolve(template)
        outputs = tensors_in(out)
        for node in self.graph.nodes[first_new:]:
            if node.cls is OpClass.SOURCE and node.op in ("param", "buffer", "const"):
                continue
            index = None
            if not isinstance(out, torch.Tensor):  # one element of a tuple result
                index = next((i for i, t in enumerate(outputs) if self._values.get(id(t)) == node.id), None)
            node.replay = (func, args, kwargs, index)

    def _call(self, func, args, kwargs):
        """Run `func`, reusing the output metadata of an identical earlier call on meta tensors.

        Torch's meta kernels for elementwise ops are Python and cost ~0.5 ms a call; the
        12th identical transformer block computes exactly the shapes of the first.  Only
        fresh, non-view outputs are reused: views, in-place results and tuples run for real.
        """
        if self.real:
            return func(*args, **kwargs)
        with _bookkeeping():
            try:
                key = (func, _signature(args), _signature(kwargs))
                hash(key)
            except TypeError:
                key = None
            spec = self._memo.get(key) if key is not None else None
            if spec is not None:
                shape, stride, dtype = spec
                return torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        out = func(*args, **kwargs)
        with _bookkeeping():
            if (
                key is not None
                and type(out) is torch.Tensor
                and out.device.type == "meta"
                and not _aliases_inputs(out, args, kwargs)
            ):
                self._memo[key] = (tuple(out.shape), tuple(out.stride()), out.dtype)
        return out

    # ---- provenance ---------------------------------------------------------------
    def _frames(self) -> tuple[Frame, ...]:
        frames = []
        self._caller = None
        kinds = self._code_kinds
        f: types.FrameType | None = sys._getframe(2)
        while f is not None and f.f_code is not self.stop_at:
            code = f.f_code
            kind = kinds.get(id(code))
            if kind is None:
                model = self.user_code.model_code(code.co_filename)
                kind = kinds[id(code)] = (code, model, model and not self.user_code(code.co_filename))
            _, model, library = kind
            if model:
                if self._caller is None:
                    self._caller = f
                invocation, owner = self._invocation(f)
                line, col, end_line, end_col = self._position(f)
                frames.append(
                    Frame(code.co_filename, line, code.co_qualname, invocation, library, col, end_line, end_col, owner)
                )
            f = f.f_back
        return tuple(frames)

    def _position(self, frame: types.FrameType) -> tuple[int, int, int, int]:
        """The span of the expression `frame` is evaluating: the op, or the call leading to it."""
        code = frame.f_code
        known = self._positions.get(id(code))
        if known is None:
            known = self._positions[id(code)] = (code, list(code.co_positions()))
        positions = known[1]
        index = frame.f_lasti // 2
        if 0 <= index < len(positions):
            line, end_line, col, end_col = positions[index]
            if line is not None and col is not None and end_line is not None and end_col is not None:
                return line, col, end_line, end_col
        return frame.f_lineno, -1, frame.f_lineno, -1

    def _invocation(self, frame: types.FrameType) -> tuple[int, str]:
        """Which call of its function `frame` is (ops of one call share it), and its `self`'s module path."""
        known = self._invocations.get(id(frame))
        if known is not None and self._frame_refs[known] is frame:
            return known, self._owners[known]
        self._frame_refs.append(frame)  # keeps the frame alive so its id is not reused
        invocation = len(self._frame_refs) - 1
        self._invocations[id(frame)] = invocation
        owner = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames[:1] else None
        path = self.module_paths.get(id(owner), "") if isinstance(owner, torch.nn.Module) else ""
        self._owners.append(path)
        return invocation, path

    def _new(self, op: str, cls: OpClass, **fields) -> Node:
        stack = fields.pop("stack", None)
        if stack is None:
            stack = self._frames()
        node = Node(
            id=len(self.graph.nodes),
            op=op,
            cls=cls,
            stack=stack,
            source=stack[0] if stack else None,
            module=self.module_stack[-1] if self.module_stack else "",
            stray_module=self.stray_stack[-1][0] if self.stray_stack else "",
            stray_check=self.stray_stack[-1][1:] if self.stray_stack else None,
            piece=self.piece,
            **fields,
        )
        if stack and self._caller is not None and node.inputs:
            self._name_operands(node, self._caller)
            if cls is OpClass.VIEW and node.inputs[0] in node.operand_names:
                node.expr = _expression_at(self._caller)
            self._name_operands_in_callers(node, stack)
        return self.graph.add(node)

    def _name_operands_in_callers(self, node: Node, stack: tuple[Frame, ...]) -> None:
        """What each calling frame's locals call the operands: a cluster whose ops sit in a helper is
        rewritten at its caller, whose names the call's arguments are written in."""
        wanted = set(node.inputs)
        f: types.FrameType | None = self._caller
        for frame in stack:
            while f is not None and self._invocations.get(id(f)) != frame.invocation:
                f = f.f_back
            if f is None:
                return
            names = {}
            for name, value in f.f_locals.items():
                if isinstance(value, torch.Tensor) and name != "self":
                    vid = self._values.get(id(value))
                    if vid in wanted and vid not in names:
                        names[vid] = name
            node.names_at[frame.invocation] = names
            f = f.f_back

    def _name_operands(self, node: Node, frame) -> None:
        """Record what the calling frame calls each operand: a local name or `self.<param>`."""
        wanted = set(node.inputs)
        names: dict[int, str] = {}
        owner = frame.f_locals.get("self")
        owner_path = self.module_paths.get(id(owner)) if isinstance(owner, torch.nn.Module) else None
        if owner_path is not None:
            node.owner = owner_path
        for name, value in frame.f_locals.items():
            if isinstance(value, torch.Tensor) and name != "self":
                vid = self._values.get(id(value))
                if vid in wanted and vid not in names:
                    names[vid] = name
        if owner_path is not None:
            prefix = owner_path + "." if owner_path else ""
            for vid in wanted - set(names):
                src = self.graph.nodes[vid]
                if src.op in ("param", "buffer"):
                    own = next((n for n in self.graph.names_of(src.name) if n.startswith(prefix)), None)
                    if own is not None:
                        names[vid] = "self." + own[len(prefix) :]
        node.operand_names = names

    def _bind_value(self, tensor: Any, node_id: int) -> None:
        self._values[id(tensor)] = node_id
        self._keep.append(tensor)
        if self.retain:
            self.values[node_id] = self._snapshot(tensor)

    def _snapshot(self, tensor: torch.Tensor) -> torch.Tensor:
        """A copy of `tensor` as it is now.  Views of one storage share one copy of it (per
        version of the storage, so a later in-place write gets a fresh copy): recorded values
        alias and are laid out as the model's are, and a kernel replayed on them reads the
        bytes it would read in the model, not a private copy of each slice."""
        t = tensor.detach()
        try:
            storage = t.untyped_storage()
            key = (storage.data_ptr(), t._version)
        except (RuntimeError, NotImplementedError):  # inference tensors, sparse, ...
            return t.clone()
        copy = self._storage_copies.get(key)
        if copy is None:
            if storage.nbytes() > 2 * max(t.numel() * t.element_size(), 1):
                return t.clone()  # a small window into a big buffer: copy only the window
            copy = self._storage_copies[key] = storage.clone()
        return torch.empty(0, dtype=t.dtype, device=t.device).set_(copy, t.storage_offset(), t.size(), t.stride())

    def _ref(self, tensor: torch.Tensor) -> int:
        node_id = self._values.get(id(tensor))
        if node_id is None:
            kind, name = self.sources.get(id(tensor), ("const", ""))
            node = self._new(kind, OpClass.SOURCE, meta=tensor_meta(tensor), name=name, call=kind, stack=())
            node_id = node.id
            self._bind_value(tensor, node_id)
        return node_id

    def _arg(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return Ref(self._ref(value))
        if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
            return [self._arg(v) for v in value]
        if isinstance(value, torch.dtype):
            return dtype_name(value)
        if isinstance(value, (torch.device, torch.memory_format, torch.layout)):
            return str(value)
        if isinstance(value, (int, float, bool, str, type(None))):
            return value
        if isinstance(value, torch.Size):
            return [int(d) for d in value]
        return repr(value)

    # ---- data-dependent values ----------------------------------------------------
    def _value_read(self, func, name: str, args: Sequence, kwargs: dict) -> Any:
        """Python asks for a tensor's value: torch.compile breaks the graph here.  A branch takes the
        decision asked for (else the real value, else True on meta); any other read on meta ends the trace."""
        stack = self._frames()
        code = _source_line(stack[0] if stack else None)
        if name == "__bool__":
            if len(self.branches_taken) < len(self.decisions):
                take = self.decisions[len(self.branches_taken)]
            elif self.real:
                take = bool(func(*args, **kwargs))
            else:
                take = True
            self.branches_taken.append(take)
            reason = (
                "data-dependent branch: the condition needs a tensor's value, so torch.compile "
                f"splits the graph here; analyzed the path where it is {take}"
            )
            self.branch_breaks.append(_graph_break(stack, code, reason, self.user_code.home))
            self._break(self.branch_breaks[-1])
            return take
        if self.real:
            reason = f"`{name}` reads a tensor's value, so torch.compile splits the graph here"
            self._break(_graph_break(stack, code, reason + _RUN_NOTE, self.user_code.home))
            return func(*args, **kwargs)
        reason = (
            f"`{name}` reads a tensor's value; fuselens traces shapes without data, "
            "so the ops after this line are not analyzed"
        )
        self._stop(_graph_break(stack, code, reason, self.user_code.home))

    def _dynamic_shape(self, name: str) -> None:
        """An op whose output's size depends on values: torch.compile breaks the graph before it.  On
        real values it is then recorded like any other op; on meta the trace ends here."""
        stack = self._frames()
        code = _source_line(stack[0] if stack else None)
        reason = f"the size of `{name}`'s result depends on values, so torch.compile splits the graph here"
        if self.real:
            self._break(_graph_break(stack, code, reason + _RUN_NOTE, self.user_code.home))
            return
        reason += "; fuselens traces shapes without data, so the ops after this line are not analyzed"
        self._stop(_graph_break(stack, code, reason, self.user_code.home))

    def _break(self, brk: GraphBreak) -> None:
        self.graph.breaks.append(brk)
        self.piece += 1  # no cluster spans a break: torch.compile compiles each side apart

    def _stop(self, brk: GraphBreak) -> NoReturn:
        self.stopped = brk
        self.graph.breaks.append(brk)
        raise _StopTrace()

    # ---- recording ----------------------------------------------------------------
    def _record(self, func, name: str, args, kwargs, out) -> None:
        alias = ALIASES.get(name, name)
        swapped = False
        if isinstance(alias, tuple):
            alias, swapped = alias
        inplace = alias.endswith("_") and not alias.startswith("_")
        canon = alias[:-1] if inplace else alias
        call = _display(func, name)
        first = args[0] if args else next(iter(kwargs.values()), None)

        if canon in FACTORIES:
            self._output(out, canon, OpClass.SOURCE, [], {}, call)
            return
        if (
            canon in ("split", "chunk", "unbind", "split_with_sizes", "unsafe_split", "hsplit", "vsplit")
            and isinstance(out, (tuple, list))
            and isinstance(first, torch.Tensor)
        ):
            self._record_split(canon, args, kwargs, out, call)
            return
        if isinstance(out, torch.Tensor) and out is first and not inplace:
            cls = op_class(canon)
            if cls.free:
                return  # returned its input unchanged: nothing happened
            inplace = cls.absorbable  # F.relu(x, inplace=True) and friends
        pair = values_and_indices(canon, func, args, kwargs, out)
        if pair is not None:  # torch.max(x, dim): a reduction for the values, another for the indices
            for (op, cls, op_args, params), tensor in zip(pair, out, strict=True):
                self._output(tensor, op, cls, [self._arg(a) for a in op_args], params, call)
            return
        normalised = normalise(canon, func, args, kwargs, out, swapped)
        if normalised is None:
            self._record_opaque(func, name, args, kwargs, out)
            return
        op, cls, op_args, params = normalised
        op_args = [self._arg(a) for a in op_args]
        if inplace:
            target = op_args[0]
            params = dict(params, mutates=target.node if isinstance(target, Ref) else None)
        node = self._output(out if out is not None else first, op, cls, op_args, params, call, inplace=inplace)
        if inplace and isinstance(first, torch.Tensor):
            self._bind_value(first, node.id)

    def _output(self, out, op, cls, op_args, params, call, inplace=False) -> Node:
        if isinstance(out, torch.Tensor):
            node = self._new(op, cls, args=op_args, params=params, meta=tensor_meta(out), call=call, inplace=inplace)
            self._bind_value(out, node.id)
            return node
        tensors = tensors_in(out)
        node = self._new(
            op,
            cls if cls is not OpClass.VIEW else OpClass.OPAQUE,
            args=op_args,
            params=dict(params, outputs=[tensor_meta(t) for t in tensors]),
            call=call,
        )
        for i, t in enumerate(tensors):
            item = self._new(
                "item",
                OpClass.IDENTITY,
                args=[Ref(node.id)],
                params={"index": i},
                meta=tensor_meta(t),
                call=call,
                stack=node.stack,
            )
            self._bind_value(t, item.id)
        return node

    def _record_opaque(self, func, name, args, kwargs, out, note: str = "") -> None:
        refs = [self._arg(t) for t in tensors_in((args, kwargs))]
        canon = ALIASES.get(name, name)
        canon = canon[0] if isinstance(canon, tuple) else canon
        params = {"note": note} if note else opaque_params(canon, func, args, kwargs)
        if out is None and args and isinstance(args[0], torch.Tensor):  # __setitem__ and other in-place writes
            node = self._new(
                canon,
                OpClass.OPAQUE,
                args=refs,
                params=params,
                meta=tensor_meta(args[0]),
                call=_display(func, name),
                inplace=True,
            )
            self._bind_value(args[0], node.id)
            return
        self._output(out, canon, OpClass.OPAQUE, refs, params, _display(func, name))

    def _record_split(self, canon, args, kwargs, out, call) -> None:
        bound = bind(None, args, kwargs, ["input", "split_size", "dim"])
        src = bound["input"]
        ndim = src.dim()
        if canon == "chunk":
            dim = bound.get("dim", kwargs.get("dim", 0))
        elif canon == "unbind":
            dim = bound.get("split_size", kwargs.get("dim", 0))  # unbind(input, dim)
        else:
            dim = bound.get("dim", 0)
        dim = norm_dim(int(dim), ndim)
        ref = [Ref(self._ref(src))]
        stack = self._frames()
        offset = 0
        for i, piece in enumerate(out):
            steps: list[tuple]
            if canon == "unbind":
                steps = [("select", dim, i)]
            else:
                steps = [("slice", dim, offset, 1)]
                offset += int(piece.shape[dim])
            node = self._new(
                "getitem" if canon != "unbind" else "select",
                OpClass.VIEW,
                args=list(ref),
                params={"steps": steps, "from": canon},
                meta=tensor_meta(piece),
                call=call,
                stack=stack,
            )
            self._bind_value(piece, node.id)


# How a break on real values goes on: the trace continues with the values of the run.
_RUN_NOTE = "; analyzed past it with the values of a run on random weights"


def _graph_break(stack: tuple[Frame, ...], code: str, reason: str, home: str) -> GraphBreak:
    """A break at the innermost frame of model code, and, when that is not in the analyzed file `home`,
    the line of `home` that reaches it."""
    frame = stack[0] if stack else None
    if frame is None:
        return GraphBreak("", 0, reason, code)
    reached = None
    if home and os.path.abspath(frame.file) != home:
        entry = next((f for f in stack if os.path.abspath(f.file) == home), None)
        reached = SourceRef(entry.file, entry.line) if entry is not None else None
    return GraphBreak(frame.file, frame.line, reason, code, reached)


def _aliases_inputs(out: torch.Tensor, args, kwargs) -> bool:
    """Does `out` share memory with an input (an in-place result or a view of one)?"""
    inputs = tensors_in((args, kwargs))
    base = out._base if out._is_view() else None
    return any(out is t or (base is not None and (base is t or base is t._base)) for t in inputs)


def _signature(value: Any) -> Any:
    """A hashable description of call arguments: tensors by metadata, the rest by value."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "meta":
            raise TypeError("only meta tensors are described by metadata alone")
        return ("T", tuple(value.shape), value.stride(), value.dtype, value.storage_offset())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *tuple(_signature(v) for v in value))
    if isinstance(value, dict):
        return tuple(sorted((k, _signature(v)) for k, v in value.items()))
    if isinstance(value, float) and value != value:
        return ("nan",)
    return value


def tensors_in(value: Any) -> list[torch.Tensor]:
    """Every tensor in a value: a tensor, or lists, tuples and dicts of them, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


def _expression_at(frame) -> str:
    """The source text of the expression the frame is evaluating right now (one line only)."""
    try:
        positions = list(frame.f_code.co_positions())
        line, end_line, col, end_col = positions[frame.f_lasti // 2]
    except (IndexError, ValueError, TypeError):
        return ""
    if line is None or line != end_line or col is None or end_col is None:
        return ""
    import linecache

    return linecache.getline(frame.f_code.co_filename, line)[col:end_col]


def _source_line(frame: Frame | None) -> str:
    if frame is None:
        return ""
    import linecache

    return linecache.getline(frame.file, frame.line).strip()


# ---- driving a trace ----------------------------------------------------------------


class _DynamoStandIn(types.ModuleType):
    """Answers `torch._dynamo.disable` without importing torch._dynamo.

    Meta kernels written in Python are wrapped in `torch._disable_dynamo`, whose first
    call imports all of torch._dynamo (over a second) only to mark them untraceable.
    Capture never runs dynamo, so until something really needs it this stand-in
    answers; any other attribute loads the real module, and so does `__path__`, which
    the import system reads to import a submodule (`torch._dynamo.utils`).  Any other
    dunder (`__file__`, `__spec__`) is a question about the module, not a use of it:
    `inspect.getmodule` asks every module for `__file__`, sometimes halfway through
    importing torch.distributed, where importing dynamo would be a circular import.
    Those are answered as a module without the attribute would answer them.
    """

    @staticmethod
    def disable(fn=None, recursive=True, wrapping=True, reason=None):
        return fn if fn is not None else (lambda f: f)

    @staticmethod
    def is_compiling() -> bool:
        return torch.compiler.is_compiling()

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__") and name != "__path__":
            raise AttributeError(name)
        _drop_stand_in(self)
        return getattr(importlib.import_module("torch._dynamo"), name)


def _drop_stand_in(stand_in) -> None:
    if sys.modules.get("torch._dynamo") is stand_in:
        del sys.modules["torch._dynamo"]
    if torch.__dict__.get("_dynamo") is stand_in:
        del torch._dynamo


@contextlib.contextmanager
def without_dynamo_import():
    if "torch._dynamo" in sys.modules:
        yield
        return
    stand_in = _DynamoStandIn("torch._dynamo")
    sys.modules["torch._dynamo"] = stand_in
    try:
        yield
    finally:
        _drop_stand_in(stand_in)


@contextlib.contextmanager
def as_torch_compile_traces() -> Iterator[None]:
    """Code that asks whether it is being compiled gets torch.compile's answer while it is traced.

    Libraries branch on it to skip checks that read values (transformers' mask code asks
    `is_compiling()` before inspecting a mask): answering "not compiling" would report a graph
    break torch.compile never makes, and analyse code it never runs.  `torch.compiler.is_compiling()`
    reads this flag (torch.export sets it the same way); `is_dynamo_compiling()` is a constant
    that Dynamo folds to True, so it is answered for the duration too.
    """
    compiler = torch.compiler
    flag, dynamo_compiling = compiler._is_compiling_flag, compiler.is_dynamo_compiling
    compiler._is_compiling_flag = True
    compiler.is_dynamo_compiling = _dynamo_compiling
    try:
        yield
    finally:
        compiler._is_compiling_flag = flag
        compiler.is_dynamo_compiling = dynamo_compiling


def _dynamo_compiling() -> bool:
    return True


@dataclass
class Trace:
    graph: Graph
    complete: bool  # False when a data-dependent value stopped the trace early
    branches: list[bool]  # the branch taken at each data-dependent `if`
    values: dict[int, torch.Tensor] | None = None  # node id -> value, when traced on real tensors
    stopped: GraphBreak | None = None  # where a meta trace ended, when it did not reach the output
    branch_breaks: list[GraphBreak] = field(default_factory=list)  # the break at each branch of `branches`
    call_nodes: dict[int, range] = field(default_factory=dict)  # the nodes each torch call recorded
    output: Any = None  # what the forward returned, when traced with autograd on (`grad`)


def _other_names(model: torch.nn.Module) -> dict[str, tuple[str, ...]]:
    """The other names of each parameter or buffer several modules share, by its first name."""
    names: dict[int, list[str]] = {}
    for name, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        names.setdefault(id(tensor), []).append(name)
    return {first: tuple(rest) for first, *rest in names.values() if rest}


def trace(
    model: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    input_names: Sequence[str],
    user_code: UserCode,
    decisions: Sequence[bool] = (),
    real: bool = False,
    keep_values: bool | None = None,
    around_call: Callable[[int], contextlib.AbstractContextManager] | None = None,
    grad: bool = False,
) -> Trace:
    """Run `model(*inputs)` and record the graph: on meta tensors, or on real ones (`real=True`),
    keeping every value (`keep_values`, by default when real: validation checks kernels on them)."""
    retain = real if keep_values is None else keep_values
    sources: dict[int, tuple[str, str]] = {}
    for name, p in model.named_parameters(remove_duplicate=True):
        sources.setdefault(id(p), ("param", name))
    for name, b in model.named_buffers(remove_duplicate=True):
        sources.setdefault(id(b), ("buffer", name))
    module_paths = {id(m): name for name, m in model.named_modules()}
    recorder = Recorder(
        user_code, sources, module_paths, stop_at=trace.__code__, decisions=decisions, real=real, retain=retain
    )
    modules = list(model.named_modules(remove_duplicate=False))
    recorder.graph.module_types = {name: f"{type(m).__module__}.{type(m).__qualname__}" for name, m in modules}
    recorder.graph.passthrough = frozenset(name for name, m in modules if _returns_its_input(m))
    recorder.graph.module_settings = {name: module_settings(m) for name, m in modules}
    recorder.graph.module_training = {name: m.training for name, m in modules}
    recorder.graph.module_classes = {name: class_identity(type(m)) for name, m in modules}
    recorder.graph.other_names = _other_names(model)
    recorder.around_call = around_call
    for tensor, name in zip(inputs, input_names, strict=True):
        recorder.add_input(tensor, name)

    def push(module, _args):
        path = module_paths.get(id(module))
        if path is not None:
            recorder.module_stack.append(path)
        else:
            recorder.stray_stack.append((type(module).__name__, class_identity(type(module)), module_settings(module)))

    def pop(module, _args, _out):
        if module_paths.get(id(module)) is not None:
            if recorder.module_stack:
                recorder.module_stack.pop()
        elif recorder.stray_stack:
            recorder.stray_stack.pop()

    from torch.nn.modules import module as module_hooks

    # For the forward's duration this process is changed for everyone in it, and put back after: global
    # module hooks (every nn.Module call passes through them), the default device (meta), a stand-in
    # for `torch._dynamo` in sys.modules (`without_dynamo_import`) and torch.compile's "compiling" flag
    # (`as_torch_compile_traces`).  A worker job runs one trace at a time, so nothing else sees them;
    # an embedding process (a test, the CLI) must not trace from two threads at once.
    pre = module_hooks.register_module_forward_pre_hook(push)
    post = module_hooks.register_module_forward_hook(pop, always_call=True)
    complete = True
    try:
        device = contextlib.nullcontext() if real else torch.device("meta")
        autograd = torch.enable_grad() if grad else torch.no_grad()  # (grad: a profiled training step)
        with without_dynamo_import(), as_torch_compile_traces(), autograd, device, recorder:
            try:
                out = model(*inputs)
            except _StopTrace:
                complete = False
                out = None
            except CaptureError:
                raise
            except SystemExit as exc:
                raise CaptureError(f"forward() called sys.exit({exc.code!r})", user_frame(exc, user_code)) from exc
            except Exception as exc:
                raise CaptureError(
                    describe_failure(exc), user_frame(exc, user_code), "memory" if out_of_memory(exc) else "trace"
                ) from exc
        if out is not None:
            with recorder:
                recorder.mark_outputs(out)
    finally:
        pre.remove()
        post.remove()
    values = recorder.values if retain else None
    return Trace(
        recorder.graph,
        complete,
        recorder.branches_taken,
        values,
        recorder.stopped,
        recorder.branch_breaks,
        recorder.call_nodes,
        out if grad else None,
    )


def _returns_its_input(module: torch.nn.Module) -> bool:
    """A module whose call is its input in training as in eval."""
    if type(module) is torch.nn.Identity:
        return True
    return isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p == 0


def user_frame(exc: BaseException, user_code: UserCode) -> Frame | None:
    """The innermost frame of the user's code in an exception's traceback."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if user_code(f.filename)]
    if not frames:
        return None
    last = frames[-1]
    return Frame(last.filename, last.lineno or 0, last.name)


def out_of_memory(exc: BaseException) -> bool:
    """Whether the user's code failed for want of memory (the worker runs under a memory limit)."""
    return isinstance(exc, MemoryError) or "DefaultCPUAllocator" in str(exc) or "can't allocate memory" in str(exc)


def wants_integer_inputs(exc: BaseException) -> bool:
    """Whether the forward failed because an op that indexes (an embedding) was given float values."""
    text = str(exc.__cause__ or exc)
    return "'indices'" in text and ("Long" in text or "Int" in text)


def describe_failure(exc: BaseException) -> str:
    """One line for a diagnostic: what went wrong in the user's code, in the user's terms."""
    if out_of_memory(exc):
        return (
            "the model's code allocated more memory than the worker may use (real tensors: fuselens "
            "traces on meta tensors, so only tensors created with an explicit device take memory)"
        )
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "meta" in text.lower() and ("data" in text.lower() or "item" in text.lower() or "numpy" in text.lower()):
        return f"{type(exc).__name__}: {text} (fuselens traces on meta tensors, which have shapes but no values)"
    return f"{type(exc).__name__}: {text}"
