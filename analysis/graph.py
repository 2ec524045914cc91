"""The graph IR the analysis passes work on.

A `Graph` is what capture records from one forward pass: a list of `Node`s in execution
(hence topological) order.  Each node is one call the user's code made into torch,
normalised to a canonical op name (`ops.py`), with its tensor operands as `Ref`s to
earlier nodes, its other arguments as plain values, the metadata of the tensor it
produced, and where in the user's source it was called from.

Plain data only: no torch import, so passes can be unit-tested on hand-built graphs.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .ops import OpClass

DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "complex64": 8,
    "complex128": 16,
}


class _Named:
    """A Python number an op took that the model's code computed from its state (`self.eps`,
    `math.sqrt(self.head_dim)`, a local `scale`), not written as a literal: a kernel must take it
    from the caller at run time, not bake the value it had in the analyzed instance.  `at` says
    what each frame of model code (by invocation) calls it; `text` is how the op's call spells it."""

    at: dict[int, str]
    text: str


class NamedFloat(float, _Named):
    def __new__(cls, value: float, text: str, at: dict[int, str]) -> NamedFloat:
        obj = super().__new__(cls, value)
        obj.text, obj.at = text, at
        return obj

    def __reduce__(self):  # a plain float's reduction would drop the provenance
        return (NamedFloat, (float(self), self.text, self.at))


class NamedInt(int, _Named):
    def __new__(cls, value: int, text: str, at: dict[int, str]) -> NamedInt:
        obj = super().__new__(cls, value)
        obj.text, obj.at = text, at
        return obj

    def __reduce__(self):
        return (NamedInt, (int(self), self.text, self.at))


Named = NamedFloat | NamedInt


def is_named(value: Any) -> bool:
    return isinstance(value, (NamedFloat, NamedInt))


def plain(value: Any) -> Any:
    """`value` with every named number, in lists, tuples and dicts too, as a plain float or int."""
    if isinstance(value, NamedFloat):
        return float(value)
    if isinstance(value, NamedInt):
        return int(value)
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(plain(v) for v in value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def keep_float(value: Any) -> float:
    """`float(value)`, keeping a named number's provenance."""
    return value if isinstance(value, NamedFloat) else float(value)


def keep_int(value: Any) -> int:
    """`int(value)`, keeping a named number's provenance."""
    return value if isinstance(value, NamedInt) else int(value)


@dataclass(frozen=True)
class Ref:
    """A tensor operand: the value produced by node `node`."""

    node: int


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str  # qualified name, e.g. "RMSNorm.forward"
    invocation: int = 0  # which call of that function (ops of one call share it)
    library: bool = False  # in an installed library (transformers, timm, ...), not in the user's code
    # The span of the expression the frame was evaluating (the op itself in the innermost frame, the call
    # that leads to it in its callers): columns are UTF-8 byte offsets, as in `ast`; -1 when unknown.
    col: int = -1
    end_line: int = 0
    end_col: int = -1
    owner: str = ""  # the module path of the frame's `self` ("layers.3.mlp"), "" for the root or no module

    @property
    def span(self) -> tuple[int, int, int, int]:
        return self.line, self.col, self.end_line, self.end_col


@dataclass
class TensorMeta:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    storage_offset: int = 0

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES.get(self.dtype, 4)

    @property
    def is_contiguous(self) -> bool:
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True


@dataclass
class Node:
    id: int
    op: str  # canonical name from ops.py ("mul", "softmax", "linear", "input", ...)
    cls: OpClass
    args: list[Any] = field(default_factory=list)  # Ref for tensors, plain values otherwise
    params: dict[str, Any] = field(default_factory=dict)
    meta: TensorMeta | None = None  # None for tuple-producing or non-tensor nodes
    call: str = ""  # what the user called: "torch.nn.functional.gelu", "Tensor.mul", "x * y"
    source: Frame | None = None  # innermost frame of model code: the user's, or a library's they call
    stack: tuple[Frame, ...] = ()  # every frame of model code, innermost first
    module: str = ""  # module instance path ("blocks.3.attn"), "" for the root
    # The class of the innermost module it ran in when that is none of the model's (`ACT2FN[name](x)` makes
    # one at each call): nothing reached from the model can tell it is the same module next time.
    stray_module: str = ""
    stray_check: tuple[str, dict[str, Any]] | None = None  # that module's class identity and settings
    piece: int = 0  # which graph piece (between data-dependent breaks)
    inplace: bool = False  # writes into its first operand
    name: str = ""  # for sources: the input/parameter name ("x", "proj1.weight")
    operand_names: dict[int, str] = field(default_factory=dict)  # operand id -> the caller's name for it
    # For each frame of model code (by invocation), what its locals call the operands it can see.
    names_at: dict[int, dict[int, str]] = field(default_factory=dict)
    owner: str = ""  # module path of `self` in the calling frame ("blocks.3"), "" for the root
    expr: str = ""  # for views of a named value: the source text that made it ("e[:, :, None]")
    replay: Any = None  # (callable, args, kwargs, output index) with Refs for tensors; real traces only

    @property
    def refs(self) -> list[Ref]:
        return list(self._reads[0])

    @property
    def inputs(self) -> list[int]:
        """Ids of the distinct nodes this one reads, in argument order."""
        return list(self._reads[1])

    @functools.cached_property
    def _reads(self) -> tuple[tuple[Ref, ...], tuple[int, ...]]:
        """`refs` and `inputs`, asked for over and over by every pass: worked out once, from the
        arguments a node is made with (nothing changes them after)."""
        refs = tuple(a for a in _flatten(self.args) if isinstance(a, Ref))
        return refs, tuple(dict.fromkeys(r.node for r in refs))

    @property
    def line(self) -> int | None:
        return self.source.line if self.source else None

    @property
    def file(self) -> str:
        """The file of the model code that made this op ("" for one without a frame there)."""
        return self.source.file if self.source else ""

    @property
    def entry(self) -> Frame | None:
        """The innermost frame in the user's own code: where it reaches the library that made this op."""
        return next((f for f in self.stack if not f.library), None)


def _flatten(values: Any) -> Iterator[Any]:
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _flatten(v)
        else:
            yield v


@dataclass
class Graph:
    nodes: list[Node] = field(default_factory=list)
    breaks: list[Any] = field(default_factory=list)  # report.GraphBreak, in trace order
    # Each module's class ("torch.nn.modules.dropout.Dropout"), by module path, under every name it has.
    module_types: dict[str, str] = field(default_factory=dict)
    # The paths of those that return their input in any mode: `nn.Identity`, a dropout of rate 0.
    passthrough: frozenset[str] = frozenset()
    # Each module's settings (`settings.module_settings`), by module path: what a kernel call that stands
    # in for code calling the module checks it still finds.
    module_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    module_training: dict[str, bool] = field(default_factory=dict)  # each module's mode, by path
    module_classes: dict[str, str] = field(default_factory=dict)  # `settings.class_identity`, by path
    # A parameter's or buffer's other names, by the name its node has, where modules share it (an
    # embedding's weight tied to another module's: `shared.weight` is `decoder.embed_tokens.weight`).
    other_names: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # The buffers that hold a triangle of ones and zeros in their last two dims (a causal mask built once:
    # nanoGPT's `torch.tril(torch.ones(n, n))`), by name: "tril" (ones on and below the diagonal) or
    # "triu1" (ones above it).  Their values are known where the model was built (`loader.Built.values`).
    triangles: Mapping[str, str] = field(default_factory=dict)

    def names_of(self, name: str) -> tuple[str, ...]:
        """Every name of the parameter or buffer named `name`, that one first."""
        return (name, *self.other_names.get(name, ()))

    def __post_init__(self) -> None:
        self._users: dict[int, list[int]] | None = None
        self._calls: dict[int, list[tuple[Node, int]]] | None = None

    def add(self, node: Node) -> Node:
        assert node.id == len(self.nodes), "node ids are positions"
        self.nodes.append(node)
        self._users = None
        self._calls = None
        return node

    def __getitem__(self, node_id: int) -> Node:
        return self.nodes[node_id]

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def users(self, node_id: int) -> list[int]:
        """Ids of the nodes that read `node_id`, in execution order."""
        if self._users is None:
            users: dict[int, list[int]] = {n.id: [] for n in self.nodes}
            for n in self.nodes:
                for i in n.inputs:
                    users[i].append(n.id)
            self._users = users
        return self._users[node_id]

    def in_call(self, invocation: int) -> list[tuple[Node, int]]:
        """The nodes made inside call `invocation` of a function (its frame is in their stack), in
        execution order, each with where that frame is in its stack (0: the op's own line).  Indexed
        once: each cluster's source mapping asks for the call its code is in."""
        if self._calls is None:
            calls: dict[int, list[tuple[Node, int]]] = {}
            for n in self.nodes:
                for depth, frame in enumerate(n.stack):
                    calls.setdefault(frame.invocation, []).append((n, depth))
            self._calls = calls
        return self._calls.get(invocation, [])

    def view_root(self, node_id: int) -> int:
        """The non-view, non-identity node whose storage `node_id` reads."""
        node = self.nodes[node_id]
        while node.cls in (OpClass.VIEW, OpClass.IDENTITY) and node.inputs:
            node = self.nodes[node.inputs[0]]
        return node.id
