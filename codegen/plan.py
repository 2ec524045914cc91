"""Kernel planning: a cluster of graph nodes -> a `KernelPlan`, or why one kernel can't do it.

A kernel iterates over a *domain*: the shape every escaping output has (elementwise), or
the shape its reductions read, split into rows (the dims they keep) and columns (the dims they
reduce, put last: `KernelPlan.order`; a pool's, the offsets in each window: `KernelPlan.windows`).
Programs own a [BLOCK_R, BLOCK_C] tile of (row, column) positions; domain coordinates
`c0..c{n-1}` are derived from them.

Values are pulled from the outputs backwards: evaluating node N at coordinates C
evaluates its operands at the coordinates they broadcast or view to (`permute`, `slice`,
`unsqueeze`, a `reshape` on its analyzed sizes, ... are index arithmetic), down to loads of
external inputs through their run-time strides.  Every value becomes one `Stmt`; reductions
split into primitive sum/max statements, so a plan can be emitted straight-line (whole row in
registers) or as one loop per reduction level (wide rows).

The same code answers the detector's question "can one kernel do this?": `check()`
turns a `PlanError` into a (reason, detail) verdict.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fuselens.analysis.gemms import GEMM_OPS
from fuselens.analysis.graph import Graph, Node, Ref, TensorMeta, is_named
from fuselens.analysis.ops import GEMMS, OpClass
from fuselens.contracts.report import ClusterKind

from .lowering import (
    BOOL,
    FLOAT,
    INT,
    LoweringError,
    Operand,
    batch_norm_apply,
    batch_norm_scale,
    convert,
    kind_of,
    lower,
    operand_kind,
)
from .terms import NONE, Dim, Lit, Load, Name, Term, Value, all_of, call, compare, dims, literal, paren, reads_values
from .terms import values as values_read

if TYPE_CHECKING:
    from .gemm_plan import GemmPlan


class PlanError(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Coord:
    index: Term  # where along its dim: the domain's coordinate `c<i>`, an offset from one, a loaded index
    axes: frozenset = frozenset()  # tile axes it varies along: "r" (rows), "c" (columns)
    guard: Term | None = None  # lanes where this coordinate is in range (a `cat` piece); loads mask the rest
    # The guard checks the coordinate against the dim's run-time size (a picked index), so the dim
    # may have any size; a `cat` piece's guard holds the analyzed sizes, which the launcher checks.
    any_size: bool = False
    window: int = -1  # a pooled dim's coordinate: the index of its `Window` (the load that reads it sizes it)

    @staticmethod
    def const(value: int) -> Coord:
        return Coord(Lit(str(value)))

    @property
    def plain(self) -> bool:
        """Whether it is a domain coordinate itself (`c3`), not an offset from one or an index."""
        return isinstance(self.index, Dim)


ZERO = Coord(Lit("0"))


@dataclass
class Stmt:
    number: int  # the statement is `v<number>`
    expr: Term  # a reduction's: the value it reduces
    kind: str  # FLOAT | INT | BOOL
    axes: frozenset
    level: int = 0  # reduction phases it depends on
    reduce: str | None = None  # "sum" | "max" | "min"
    comment: str = ""
    deps: tuple[str, ...] = ()
    load_input: int | None = None
    load_coords: tuple[Term, ...] = ()  # a load's: where along each of its input's dims
    load_guard: Term | None = None  # extra load mask (lanes of another `cat` piece)
    # Reductions a looped kernel may fold into the pass of the one they depend on:
    centered: tuple[str, str] | None = None  # sum((x - sum_x / C)^2), as (x, sum_x): shifted sums
    online: tuple[str, str] | None = None  # sum(exp(x - max_x)), as (x, max_x): online softmax

    @property
    def name(self) -> str:
        return f"v{self.number}"

    @property
    def value(self) -> Value:
        """The statement's value, as other statements read it."""
        return Value(self.number)

    @property
    def how(self) -> str:
        """How a reduction statement reduces: "sum", "max" or "min"."""
        if self.reduce is None:
            raise ValueError(f"{self.name} is not a reduction")
        return self.reduce

    @property
    def reduced(self) -> str:
        """The name of the statement a reduction reduces."""
        if self.reduce is None:
            raise ValueError(f"{self.name} is not a reduction")
        return self.deps[0]


@dataclass
class InputSlot:
    node: int
    shape: tuple[int, ...]
    dtype: str
    strides_used: set[int] = field(default_factory=set)
    guarded_dims: set[int] = field(default_factory=set)  # dims read through a fixed offset


@dataclass
class OutputSlot:
    node: int
    stmt: str
    shape: tuple[int, ...]
    dtype: str
    row_only: bool  # written once per row (a reduction's result)
    # Written row-major whatever the inputs' layout: every reader is a GEMM, which would first copy a
    # permuted result (RoPE's q, still (batch, seq, heads, dim) in memory, into `q @ k.transpose(2, 3)`).
    contiguous: bool = False
    total: RowTotal | None = None  # a loss over the rows: the kernel writes each row's, the launcher totals them
    # A permuted output (a ConvNeXt block's residual, added back in NCHW to a norm over NHWC): the
    # domain dim each of its dims runs along; the kernel stores it by its own strides.
    dims: tuple[int, ...] | None = None
    # Summed over the rows (a norm's weight gradient, [C] from [N, C] rows): the whole-row kernel
    # writes each program's partial column sums in float32, the launcher adds them up.
    col_total: bool = False
    # Read only by 2-D convolutions (a GroupNorm + SiLU before a conv): written channels-last, the
    # layout cuDNN convolves fastest, by the kernels that can (`split_groups`).
    to_convolution: bool = False
    # A `cat`'s result, contiguous as eager's (Phi-3's RoPE, whose q is a permuted slice).
    cat: bool = False
    # A row output (`row_only`) of a reduction over dims that are not the last (`KernelPlan.order`): the
    # domain row dim each of its dims runs along, -1 for a reduced dim it keeps as 1 (`x.sum(1,
    # keepdim=True)` of NCHW, [N, 1, H, W]).  None: the row dims, then a 1 for each reduced dim kept.
    row_at: tuple[int, ...] | None = None
    # Kept for the backward only, never returned to the caller: a loss's row log-sum-exp ("lse"),
    # which its gradient reads instead of a second pass over a 32k-256k wide row, or a norm's row
    # "mean" and "rstd", or a hand-written one's row value ("row", `_row_values_read_along_rows`).
    # The op returns these after the cluster's outputs (`returned_outputs` are the others).
    saved: str | None = None


@dataclass(frozen=True)
class Window:
    """A pooling window along one dim of the pooled tensor (`max_pool2d(x, 2)`'s height): the output's
    position `o` along it (domain dim `out`) and the window's offset `k` (domain dim `offset`, a
    column) read the pooled tensor at `o * stride + k * dilation - padding`.  Without padding every
    window lies inside the tensor; with it, the positions outside (before 0 or from `e<k>`, the pooled
    dim's size, a kernel argument) are masked: no load there, and the pool leaves them out (a max)
    or counts them as zeros (a mean with count_include_pad).  `read`: (input slot, dim) of a load
    along it, from whose size the launcher finds the output's at call time; None where none reads it
    at any size (a slice's coordinate: the launcher holds that input to the analyzed size)."""

    dim: int  # the pooled tensor's dim
    out: int
    offset: int
    kernel: int
    stride: int
    dilation: int
    padding: int = 0
    size: int = 0  # the pooled dim's, at analysis
    read: tuple[int, int] | None = None

    @property
    def span(self) -> int:
        """How many positions of the pooled dim one window covers."""
        return self.dilation * (self.kernel - 1) + 1


@dataclass
class RowTotal:
    """How the launcher turns the kernel's per-row losses into a cross-entropy's "sum" or "mean" (over
    the rows whose target is not `ignore_index`, as torch counts them)."""

    how: str  # "sum" | "mean"
    target_input: int  # the input slot of the targets
    ignore_index: str  # its literal
    dtype: str  # the loss's dtype


@dataclass
class ScalarSlot:
    """A number of the model's state an op takes (`self.eps`, `math.sqrt(self.head_dim)`): the kernel's
    public function takes it from its caller.  A `runtime` one is a kernel argument (`name`); any other
    stays in the kernel as the analyzed value, and the public function runs the reference for another."""

    name: str  # `sc<k>`: the kernel's and the launcher's name for it
    value: float | int  # the analyzed instance's: the public function's default
    text: str  # as the op's call spells it
    at: dict[int, str]  # by invocation: what each frame of model code calls it
    runtime: bool

    @property
    def type(self) -> str:
        return "float" if isinstance(self.value, float) else "int"


# The narrowest row whose statistics (a norm's mean and reciprocal deviation) the forward keeps for
# the backward: 8 bytes a row are under 1% of what a bfloat16 forward reads and writes from 256
# columns, while below that the backward recomputes them from a row it holds on chip anyway.
_KEEP_ROW_STATISTICS_FROM = 256

# The row's width: the number of columns, which the kernels know at run time.
_WIDTH = Name("C")

# What a reduction computes, where its name says another thing: a pool its windows' (or its whole
# dims') max or mean, torch.max(x, dim)'s values their max.
_POOLS_COMPUTE = {"max": "amax", "avg": "mean", "adaptive_max": "amax", "adaptive_avg": "mean"}
_COMPUTES_AS = {
    **{f"{kind}_pool{n}d": how for kind, how in _POOLS_COMPUTE.items() for n in (1, 2, 3)},
    "max": "amax",
    "min": "amin",
}

# Reductions whose result is as large as their input (each element normalised by its row's values).
_FULL_SIZE = frozenset(
    {"softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm", "instance_norm", "batch_norm"}
)

# The most columns an argmax counts exactly: it counts them in float32.
_MAX_INDEXED_COLUMNS = 1 << 24

# Ops whose lowering writes a number operand as it is into the expression, so that it can be an argument.
_NUMBER_ARGUMENTS = frozenset({"add", "sub", "rsub", "mul", "div", "maximum", "minimum", "where", "masked_fill"})


@dataclass
class KernelPlan:
    kind: ClusterKind
    members: list[int]
    compute: list[int]
    domain: tuple[int, ...]
    row_dims: int  # leading domain dims that make up a row index
    inputs: list[InputSlot]
    outputs: list[OutputSlot]
    stmts: list[Stmt]
    groups: int | None = None  # group norm: rows are (batch, group)
    scalars: list[ScalarSlot] = field(default_factory=list)
    # The row width is a weight's or buffer's size (a norm's weight, an embedding table's width, a
    # RoPE table's) or a head's that the launcher holds to its analyzed size: a constant of the
    # model, which the kernels take as a constant.  BERT's bf16 embeddings + LayerNorm at
    # [32, 512, 768] on an H200 took 14.3 µs so (one warp a row), and 18.5 at best over the tiles
    # tried with the width an argument (torch.compile, which bakes every size in: 13.5).
    fixed_width: bool = False
    # A backward elementwise kernel whose outputs take the layout of the forward input they are the
    # gradients of (the launcher's `layout`), not the upstream gradient's (`codegen.backward`).
    grad_layout: bool = False
    # A reduction over dims that are not the last ones (a softmax over NCHW's channels, a batch norm's
    # statistics over (N, H, W)): the dim of the reduced tensor each domain dim runs along, its other
    # dims first, then the reduced ones.  Its rows are those other dims and its columns the reduced
    # ones, in whatever memory order the tensor has them: each value is loaded and stored through its
    # own strides at its own coordinates (a full-size output as a permuted one, `OutputSlot.dims`, in
    # the tensor's own shape).  None: the domain is the tensor's own dims.
    #
    # How the kernels walk memory on a GPU: where the tensor's stride-1 dim is a column (channels-last
    # under a softmax over C, a batch norm's pixels), a row's columns are runs of memory across a
    # warp's lanes, as for a reduction over the last dim.  Where it is the last row dim (NCHW's W under
    # a softmax over C), the across row kernel (`variants.rows.AcrossRowKernel`) takes a block of W positions
    # down its tile and the channels across: each channel's block of pixels is one run of memory,
    # which Triton sees (the block is an `arange` down the tile) and reads with its lanes along it,
    # then the reductions run across the tile's columns and the results are stored the same way.
    # Rows too wide for registers (more than 8192 columns) are walked one row a program in column
    # blocks (the looped kernel), where few rows keep few multiprocessors busy: a batch norm over 64
    # channels of a large batch, a sum down the rows of a tall matrix (`benchmarks/axis_reductions.py`
    # times both against torch.compile, which splits such reductions over many programs).
    order: tuple[int, ...] | None = None
    # Pooling: a reduction over each window (`Window`); the domain is the tensor's dims before the
    # pooled ones, the output's positions along those, then each window's offsets (the columns).
    windows: list[Window] = field(default_factory=list)
    # A cluster that starts with a GEMM (kind "gemm-epilogue"): the product and the elementwise ops
    # after it, whose statements are there (`gemm_plan.GemmPlan`).
    gemm: GemmPlan | None = None

    @property
    def levels(self) -> int:
        return max((s.level for s in self.stmts), default=0)


def check(graph: Graph, members: frozenset[int]) -> tuple[bool, str, str]:
    try:
        plan_cluster(graph, set(members))
    except PlanError as exc:
        return False, exc.reason, exc.detail
    return True, "", ""


def plan_cluster(graph: Graph, members: set[int], backward: bool = False) -> KernelPlan:
    """The kernel plan of `members`.  A `backward` cluster's (the gradients of a forward one) keeps
    nothing for a backward of its own, and a permute of a computed value may leave it, written as a
    permuted output (the gradient for an input the forward read permuted: ConvNeXt's
    `y.permute(0, 2, 3, 1)` before its LayerNorm).  Members that start with a GEMM are planned as
    its epilogue (`gemm_plan`)."""
    if any(graph[m].op in GEMM_OPS and not graph[m].cls.absorbable for m in members):
        # Imported here: the GEMM's plan wraps the plan of the ops after it, made by this module.
        from .gemm_plan import plan_gemm_cluster

        return plan_gemm_cluster(graph, members, backward)
    return _Planner(graph, members, backward).plan()


def _describe(node: Node) -> str:
    return f"`{node.op}` (line {node.line})" if node.line else f"`{node.op}`"


def _meta(node: Node) -> TensorMeta:
    """`node`'s tensor metadata.  Cluster members always have it (detect only groups ops with
    a tensor result, and views of tensors are tensors); an input without it is a tuple or
    non-tensor value that no kernel can load."""
    if node.meta is None:
        raise PlanError("no-lowering", f"{_describe(node)} does not produce a single tensor")
    return node.meta


def _shape(shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


class _Planner:
    def __init__(self, graph: Graph, members: set[int], backward: bool = False):
        self.g = graph
        self.members = members
        self.backward = backward
        self.compute = sorted(m for m in members if graph[m].cls.absorbable)
        self.stmts: list[Stmt] = []
        self.memo: dict[tuple, Stmt] = {}
        self.inputs: list[InputSlot] = []
        self.input_index: dict[int, int] = {}
        self.scalars: list[ScalarSlot] = []
        self.row_stats: dict[int, tuple[Stmt, Stmt]] = {}  # softmax / loss node -> its row (max, exp-sum)
        self.row_lse: dict[int, Stmt] = {}  # cross-entropy (or picked log-softmax) node -> its row's log-sum-exp
        self.norm_stats: dict[int, dict[str, Stmt]] = {}  # norm node -> its row's "mean" and "rstd"
        self.escaping: list[int] = []  # the members read outside the group
        self.reduced: dict[tuple[str, str], Stmt] = {}  # (how, operand) -> its reduction statement
        self.order: tuple[int, ...] | None = None  # `KernelPlan.order`
        self.windows: list[Window] = []  # `KernelPlan.windows`
        # The reduced tensor's shape, and the coordinates at which the kernel's position reads it: the
        # domain's own, but for a reduction over other dims than the last (`order`: permuted) or over
        # windows (each pooled dim's from the output's position and the window's offset).
        self.natural_shape: tuple[int, ...] = ()
        self.natural: tuple[Coord, ...] = ()
        # The domain dim each of that tensor's dims runs along (None for windows: no value of its size
        # is written).
        self.natural_dims: tuple[int, ...] | None = None

    # ---- structure --------------------------------------------------------------------
    def plan(self) -> KernelPlan:
        g = self.g
        outputs = self.escaping = self._escaping()
        reductions = [m for m in self.compute if g[m].cls is OpClass.REDUCTION]
        self.groups = None
        kind: ClusterKind
        if reductions:
            kind = "reduction"
            self.domain, self.row_dims = self._row_space(reductions)
        else:
            kind = "elementwise"
            shapes = {_meta(g[o]).shape for o in outputs}
            if len(shapes) > 1:
                small = min(outputs, key=lambda o: _meta(g[o]).numel)
                big = max(outputs, key=lambda o: _meta(g[o]).numel)
                if _meta(g[small]).numel < _meta(g[big]).numel:
                    raise PlanError(
                        "fan-out",
                        f"{_describe(g[small])} produces a {_shape(_meta(g[small]).shape)} "
                        f"value used outside the group, but the kernel runs over "
                        f"{_shape(_meta(g[big]).shape)}; it cannot be written once",
                    )
                raise PlanError(
                    "shape",
                    "the group's outputs have different shapes: " + ", ".join(_shape(s) for s in sorted(shapes)),
                )
            self.domain = next(iter(shapes))
            self.row_dims = max(len(self.domain) - 1, 0)
        n = len(self.domain)
        full = tuple(Coord(Dim(i), frozenset({"r" if i < self.row_dims else "c"})) for i in range(n))
        if self.groups and n > 1:  # the channel coordinate mixes the group (row) and the column
            full = (*full[:1], Coord(Dim(1), frozenset({"r", "c"})), *full[2:])
        self.full = full
        self._natural_coords()
        out_slots = []
        for o in outputs:
            node = g[o]
            meta = _meta(node)
            shape = meta.shape
            dims: tuple[int, ...] | None = None  # the domain's own layout
            row_at: tuple[int, ...] | None = None
            if shape == self.domain:
                dims = self._output_dims(o)
                if dims == tuple(range(len(shape))):
                    dims = None
                # Of the domain's shape, but maybe a permute of it (a square image's NHWC and NCHW).
                stmt = self.value(o, full if dims is None else tuple(full[d] for d in dims))
                row_only = False
            elif kind == "reduction" and self._is_row_shape(shape):
                stmt = self.value(o, self._row_coords_for(shape))
                row_only = True
                row_at = self._row_at(shape) if self.order is not None else None
            elif kind == "reduction" and node.op == "cross_entropy" and node.params["reduction"] != "none":
                shape = tuple(self.domain[: self.row_dims])
                stmt = self.value(o, self._row_coords_for(shape))
                row_only = True
            elif sorted(shape) == sorted(self.domain) and len(shape) > 1:
                dims = self._output_dims(o)
                if dims is None:
                    raise PlanError(
                        "layout",
                        f"{_describe(node)} produces a {_shape(shape)} value used outside the group, a "
                        f"layout of the kernel's {_shape(self.domain)} that no `permute` between them "
                        "explains: this kernel writes its own layout and permutations of it only",
                    )
                stmt = self.value(o, tuple(full[d] for d in dims))
                row_only = False
            else:
                raise PlanError(
                    "fan-out",
                    f"{_describe(node)} produces a {_shape(shape)} value used outside the "
                    f"group; a kernel over {_shape(self.domain)} cannot write it once",
                )
            try:
                kind_of(meta.dtype)
            except LoweringError as exc:
                raise PlanError("no-lowering", str(exc)) from None
            total = self._row_total(node) if shape != tuple(meta.shape) else None
            dtype = "float32" if total else meta.dtype  # the per-row losses, totalled in float32
            out_slot = OutputSlot(o, stmt.name, shape, dtype, row_only, self._read_by_gemms_only(o), total, dims)
            out_slot.cat = self.g[o].op == "cat"
            out_slot.row_at = row_at
            out_slot.to_convolution = self._read_by_convolutions_only(o)
            out_slots.append(out_slot)
        out_slots += self._saved_for_backward()
        self._baked_numbers()
        return KernelPlan(
            kind,
            sorted(self.members),
            self.compute,
            self.domain,
            self.row_dims,
            self.inputs,
            out_slots,
            self.stmts,
            self.groups,
            self.scalars,
            self._width_is_the_models(),
            order=self.order,
            windows=self.windows,
        )

    def _width_is_the_models(self) -> bool:
        """Whether the row (one domain dim) is as wide as a weight's or buffer's last dim, or as a dim
        the launcher already holds to the analyzed size (`InputSlot.guarded_dims`: RoPE's head,
        read at `c3 + 48`): a size that does not change from call to call, so that a kernel
        specialised to it is compiled once."""
        if self.groups or self.order or self.windows or len(self.domain) - self.row_dims != 1 or self.domain[-1] <= 1:
            return False
        width = self.domain[-1]
        if any(self.g[s.node].op in ("param", "buffer") and s.shape[-1:] == (width,) for s in self.inputs):
            return True
        last = len(self.domain) - 1
        return any(
            j in self.inputs[s.load_input].guarded_dims
            and self.inputs[s.load_input].shape[j] == width
            and last in dims(c)
            for s in self.stmts
            if s.load_input is not None
            for j, c in enumerate(s.load_coords)
        )

    def _saved_for_backward(self) -> list[OutputSlot]:
        """What the gradients read instead of a pass over the row of their own, 4 bytes a row each:
        a cross-entropy's row log-sum-exp (or a log-softmax's whose rows are only picked from), so
        that its gradient, softmax less the one-hot target, is one pass over the logits, not two; and
        a norm's row mean and reciprocal deviation, so that its gradient reduces the row twice (the
        gradient and its product with the normalised row), not four times.  A group norm's rows are
        its (sample, group) pairs: its gradients then need no kernel of their own to gather the
        groups' statistics again (a pass over the input: 252 µs of a bf16 ResBlock's training step
        at [32, 256, 64, 64] on an H100, for 8 KB kept)."""
        if self.backward:
            return []
        rows = tuple(self.domain[: self.row_dims])
        wide = math.prod(self.domain[self.row_dims :]) >= _KEEP_ROW_STATISTICS_FROM
        if self.groups:  # kept at any width: its backward kernels never hold a group's row
            rows, wide = (self.domain[0], self.groups), True
        lse = [(node, "lse", stmt) for node, stmt in self.row_lse.items()]
        stats = [(node, what, stmt) for node, kept in self.norm_stats.items() for what, stmt in kept.items()]
        kept = [
            OutputSlot(node, stmt.name, rows, "float32", row_only=True, saved=what)
            for node, what, stmt in sorted(lse + (stats if wide else []), key=lambda kept: kept[:2])
        ]
        for m in self._row_values_read_along_rows() if wide else []:
            meta = _meta(self.g[m])
            stmt = self.value(m, self._row_coords_for(meta.shape))
            kept.append(OutputSlot(m, stmt.name, meta.shape, meta.dtype, row_only=True, saved="row"))
        return kept

    def _row_values_read_along_rows(self) -> list[int]:
        """The members that are one number a row, reduced from the row inside the group and read
        along it (a hand-written norm's `torch.rsqrt(variance + eps)`, multiplied into `x`): kept for
        the backward, which reads them where it would reduce the row again."""
        if not self.row_dims or self.groups or self.order or self.windows:
            return []
        reduced: dict[int, bool] = {}

        def from_reduction(node_id: int) -> bool:
            if node_id not in reduced:
                node = self.g[node_id]
                reduced[node_id] = node_id in self.members and (
                    node.cls is OpClass.REDUCTION or any(from_reduction(i) for i in node.inputs)
                )
            return reduced[node_id]

        kept = []
        for m in self.compute:
            meta = self.g[m].meta
            if m in self.escaping or meta is None or not self._is_row_shape(meta.shape):
                continue
            if not meta.dtype.startswith(("float", "bfloat")) or not from_reduction(m):
                continue
            readers = [self.g[u] for u in self.g.users(m) if u in self.members]
            if any(r.meta is not None and r.meta.shape == self.domain for r in readers):
                kept.append(m)
        return kept

    # ---- numbers of the model's state ---------------------------------------------------
    def _number(self, value, runtime: bool) -> Term:
        """The kernel's term for a number an op takes: a literal, or for one of the model's state the
        argument `sc<k>` (`runtime`) or, where the lowering needs the value itself, the literal the
        public function checks the caller's value against."""
        if not is_named(value):
            return Lit(literal(value))
        slot = next((s for s in self.scalars if s.value is value), None)
        if slot is None:
            slot = ScalarSlot(f"sc{len(self.scalars)}", value, value.text, value.at, runtime)
            self.scalars.append(slot)
        elif runtime and not slot.runtime:
            slot.runtime = True
        plain = float(value) if isinstance(value, float) else int(value)
        return Name(slot.name) if slot.runtime else Lit(literal(plain))

    def _baked_numbers(self) -> None:
        """Every other number of the model's state the members take (a clamp's bounds, a group count)
        stays in the kernel, checked against the caller's value."""
        for m in sorted(self.members):
            node = self.g[m]
            for value in [*node.args, *node.params.values()]:
                if is_named(value):
                    self._number(value, runtime=False)

    def _output_dims(self, node_id: int) -> tuple[int, ...] | None:
        """For a member whose shape permutes the domain's: the domain dim each of its dims runs along,
        through the `permute`s between it and the domain-shaped values it is computed from; None when
        no such chain explains it."""
        node = self.g[node_id]
        if node_id not in self.members:
            return None
        shape = _meta(node).shape
        steps = node.params.get("steps") if node.cls is OpClass.VIEW else None
        if steps:
            if any(step[0] != "permute" for step in steps):
                return None
            dims = self._output_dims(node.inputs[0])
            for step in steps:
                dims = None if dims is None else tuple(dims[p] for p in step[1])
            return dims
        if node.cls is OpClass.REDUCTION:  # the reductions' rows are the domain's
            return self.natural_dims if shape == self.natural_shape else None
        for i in node.inputs:  # an elementwise op: along an operand of its own shape
            if i in self.members and _meta(self.g[i]).shape == shape:
                dims = self._output_dims(i)
                if dims is not None:
                    return dims
        if shape == self.natural_shape and self.natural_dims is not None:
            return self.natural_dims
        return tuple(range(len(shape))) if shape == self.domain else None

    def _read_by_gemms_only(self, node_id: int) -> bool:
        """Whether every reader outside the cluster is a GEMM, directly or through permutes."""
        readers = [u for u in self.g.users(node_id) if u not in self.members]
        for u in readers:
            user = self.g[u]
            if user.op in GEMMS:
                continue
            steps = user.params.get("steps") if user.cls is OpClass.VIEW else None
            if not steps or any(step[0] != "permute" for step in steps) or not self._read_by_gemms_only(u):
                return False
        return bool(readers)

    def _read_by_convolutions_only(self, node_id: int) -> bool:
        """Whether every reader outside the cluster is a 2-D convolution, reading it as its input."""
        readers = [self.g[u] for u in self.g.users(node_id) if u not in self.members]
        return bool(readers) and all(u.op == "conv2d" and u.inputs[:1] == [node_id] for u in readers)

    def _escaping(self) -> list[int]:
        g = self.g
        out = []
        for m in sorted(self.members):
            outside = [u for u in g.users(m) if u not in self.members]
            if not outside:
                continue
            if not g[m].cls.absorbable and not (self.backward and self._permute_of_computed(m)):
                raise PlanError(
                    "fan-out", f"the view {_describe(g[m])} of a fused value is also used outside the group"
                )
            out.append(m)
        if not out:
            raise PlanError("shape", "the group has no output")
        return out

    def _permute_of_computed(self, node_id: int) -> bool:
        """Whether `node_id` is a member's permutes only, down to a value the group computes."""
        node = self.g[node_id]
        while node.cls is OpClass.VIEW:
            steps = node.params.get("steps") or []
            if not steps or any(step[0] != "permute" for step in steps) or node.inputs[0] not in self.members:
                return False
            node = self.g[node.inputs[0]]
        return node.cls.absorbable

    def _row_space(self, reductions: list[int]) -> tuple[tuple[int, ...], int]:
        """The domain and its row dims, from the space every reduction runs over (one for them all)."""
        g = self.g
        spaces: dict[_Space, int] = {}
        for r in reductions:
            node = g[r]
            x = _meta(g[node.inputs[0]])
            if node.op == "group_norm":
                if len(reductions) > 1:
                    raise PlanError(
                        "reduction",
                        f"{_describe(node)} reduces over channel groups; it cannot share "
                        "a kernel with another reduction",
                    )
                groups = node.params["groups"]
                if x.shape[1] % groups:
                    raise PlanError("reduction", f"{_describe(node)}: channels are not divisible by groups")
                self.groups = groups
                self.natural_shape = x.shape
                return x.shape, 1
            spaces.setdefault(_space(node, x.shape), r)
        if len(spaces) > 1:
            listed = ", ".join(sorted(space.describe() for space in spaces))
            raise PlanError("reduction", f"the reductions run over different rows ({listed})")
        (space,) = spaces
        self.natural_shape = space.shape
        n = len(space.shape)
        if space.window:
            lead = n - len(space.window)
            self.windows = [
                Window(lead + p, lead + p, n + p, kernel, stride, dilation, padding, space.shape[lead + p])
                for p, (kernel, stride, dilation, padding) in enumerate(space.window)
            ]
            outs = tuple((space.shape[w.dim] + 2 * w.padding - w.span) // w.stride + 1 for w in self.windows)
            return (*space.shape[:lead], *outs, *(w.kernel for w in self.windows)), n
        kept = [d for d in range(n) if d not in space.dims]
        order = (*kept, *space.dims)
        self.order = None if order == tuple(range(n)) else order
        return tuple(space.shape[d] for d in order), len(kept)

    def _natural_coords(self) -> None:
        """`natural` and `natural_dims` (see `__init__`), once the domain's coordinates are known."""
        n = len(self.domain)
        if not self.natural_shape:  # an elementwise plan: its domain is its values' own shape
            self.natural_shape = self.domain
        if self.windows:
            coords = list(self.full[: len(self.natural_shape)])
            for k, w in enumerate(self.windows):
                at, offset = self.full[w.out].index, self.full[w.offset].index
                step = at * w.stride if w.stride != 1 else at
                reach = offset * w.dilation if w.dilation != 1 else offset
                index = paren(step + reach - w.padding) if w.padding else paren(step + reach)
                guard = (
                    paren(compare(index, ">=", 0)) & paren(compare(index, "<", Name(f"e{k}"))) if w.padding else None
                )
                coords[w.dim] = Coord(index, frozenset({"r", "c"}), guard, any_size=True, window=k)
            self.natural, self.natural_dims = tuple(coords), None
            return
        if self.order is None:
            self.natural, self.natural_dims = self.full, tuple(range(n))
            return
        dims = tuple(self.order.index(j) for j in range(n))  # the domain dim each of the tensor's runs along
        self.natural, self.natural_dims = tuple(self.full[d] for d in dims), dims

    def _row_at(self, shape: tuple[int, ...]) -> tuple[int, ...] | None:
        """For a value of one number a row (a reduction's result, its reduced dims dropped or kept as 1):
        the domain row dim each of its dims runs along, -1 for a reduced dim it keeps; None for a value
        of any other shape."""
        if self.groups:
            return None
        k, n = self.row_dims, len(self.domain)
        lead = tuple(self.domain[:k])
        if self.order is not None and self.natural_dims is not None and len(shape) == n:
            reduced = set(self.order[k:])
            kept_as_one = tuple(1 if j in reduced else self.natural_shape[j] for j in range(n))
            if shape == kept_as_one:
                return tuple(-1 if j in reduced else self.natural_dims[j] for j in range(n))
        if shape == lead:
            return tuple(range(k))
        if shape == lead + (1,) * (n - k):
            return tuple(range(k)) + (-1,) * (n - k)
        return None

    def _is_row_shape(self, shape: tuple[int, ...]) -> bool:
        return self._row_at(shape) is not None

    def _row_coords_for(self, shape) -> tuple[Coord, ...]:
        at = self._row_at(tuple(shape))
        if at is None:  # a loss's total: its rows, as one number each
            return tuple(self.full[: self.row_dims]) + (ZERO,) * (len(shape) - self.row_dims)
        return tuple(ZERO if i < 0 else self.full[i] for i in at)

    # ---- evaluation -------------------------------------------------------------------
    def value(self, node_id: int, coords: tuple[Coord, ...]) -> Stmt:
        key = (node_id, tuple(c.index for c in coords))
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        node = self.g[node_id]
        if node_id not in self.members:
            stmt = self._load(node, coords)
        elif node.cls is OpClass.VIEW:
            stmt = self.value(node.inputs[0], self._view_back(node, coords))
        elif node.cls is OpClass.IDENTITY:
            stmt = self.value(node.inputs[0], coords)
        elif node.cls is OpClass.REDUCTION:
            stmt = self._reduction(node, coords)
        elif node.cls is OpClass.CONCAT:
            stmt = self._concat(node, coords)
        elif node.cls is OpClass.CHANNEL:
            stmt = self._per_channel(node, coords)
        elif node.cls is OpClass.LOOKUP:
            stmt = self._lookup(node, coords)
        else:
            stmt = self._pointwise(node, coords)
        self.memo[key] = stmt
        return stmt

    def _emit(
        self,
        expr: Term,
        kind: str,
        deps: list[Stmt],
        comment: str = "",
        reduce: str | None = None,
        axes: frozenset | None = None,
        load_input: int | None = None,
    ) -> Stmt:
        level = max((d.level for d in deps), default=0) + (1 if reduce else 0)
        if axes is None:
            axes = frozenset().union(*(d.axes for d in deps)) if deps else frozenset()
        stmt = Stmt(len(self.stmts), expr, kind, axes, level, reduce, comment, tuple(d.name for d in deps), load_input)
        self.stmts.append(stmt)
        return stmt

    def _load(self, node: Node, coords: tuple[Coord, ...]) -> Stmt:
        meta = _meta(node)
        try:
            kind = kind_of(meta.dtype)
        except LoweringError as exc:
            raise PlanError("no-lowering", str(exc)) from None
        slot_index = self.input_index.get(node.id)
        if slot_index is None:
            slot_index = len(self.inputs)
            self.input_index[node.id] = slot_index
            self.inputs.append(InputSlot(node.id, meta.shape, meta.dtype))
        slot = self.inputs[slot_index]
        at: list[tuple[int, Term]] = []
        axes: set = set()
        for j, c in enumerate(coords):
            if c.index == ZERO.index:  # a broadcast dim (its stride is 0 at run time if it is one of size 1)
                continue
            if c.window >= 0 and self.windows[c.window].read is None:  # sizes the pooled output
                self.windows[c.window] = dataclasses.replace(self.windows[c.window], read=(slot_index, j))
            slot.strides_used.add(j)
            at.append((j, c.index))
            axes |= c.axes
            if not c.plain and not c.any_size:
                slot.guarded_dims.add(j)
        # A coordinate may be a value the kernel computed (the index a pick reads at): the load needs it.
        named = dict.fromkeys(name for c in coords for t in (c.index, c.guard) for name in values_read(t))
        stmt = self._emit(
            Load(slot_index, tuple(at)),
            kind,
            [self._stmt(name) for name in named],
            comment=self._input_comment(node),
            axes=frozenset(axes),
            load_input=slot_index,
        )
        stmt.load_coords = tuple(c.index for c in coords)
        # Sorted as the kernel's text has them, so that the same guards always read the same.
        stmt.load_guard = all_of(*sorted({c.guard for c in coords if c.guard is not None}, key=str))
        return stmt

    def _input_comment(self, node: Node) -> str:
        return node.name or node.op

    def _view_back(self, node: Node, coords: tuple[Coord, ...]) -> tuple[Coord, ...]:
        """Coordinates of the view's input that hold the view's element at `coords`."""
        src = self.g[node.inputs[0]]
        shapes = [tuple(_meta(src).shape)]
        for step in node.params.get("steps", []):
            shapes.append(_step_shape(shapes[-1], step))
        current = list(coords)
        for step, before in zip(reversed(node.params.get("steps", [])), reversed(shapes[:-1]), strict=True):
            current = _step_back(step, before, current)
        return tuple(current)

    def _broadcast(self, coords: tuple[Coord, ...], out_shape, in_shape) -> tuple[Coord, ...]:
        offset = len(out_shape) - len(in_shape)
        if offset < 0:
            raise PlanError("shape", f"an operand of shape {_shape(in_shape)} is larger than its result")
        # A dim of size 1 in the operand is broadcast when the result's is longer; when both are 1 it
        # follows the result's coordinate, so that both may be longer at run time (a batch of 1 at
        # analysis time): the launcher passes stride 0 for a dim that is still 1.
        return tuple(
            ZERO if in_shape[j] == 1 and out_shape[j + offset] != 1 else coords[j + offset]
            for j in range(len(in_shape))
        )

    def _operand(self, node: Node, arg, coords) -> Operand:
        if isinstance(arg, Ref):
            src = self.g[arg.node]
            stmt = self.value(arg.node, self._broadcast(coords, _meta(node).shape, _meta(src).shape))
            return Operand(stmt.value, stmt.kind)
        if arg is None:
            return Operand(NONE, FLOAT, True)
        if isinstance(arg, bool):
            return Operand(Lit(literal(arg)), BOOL, True, arg)
        if isinstance(arg, (int, float)):
            number = self._number(arg, runtime=node.op in _NUMBER_ARGUMENTS)
            value = (float(arg) if isinstance(arg, float) else int(arg)) if isinstance(number, Lit) else None
            return Operand(number, FLOAT if isinstance(arg, float) else "int", True, value)
        raise PlanError("no-lowering", f"{_describe(node)} takes a {type(arg).__name__} argument")

    def _pointwise(self, node: Node, coords) -> Stmt:
        out_kind = self._kind(node)
        operands = [self._operand(node, a, coords) for a in node.args]
        if node.op != "clamp_tensor" and any(o.left_out for o in operands):  # only clamp has optional operands
            raise PlanError("no-lowering", f"{_describe(node)} was recorded without one of its operands")
        deps = [self._read(o.term) for o in operands if not o.is_scalar]
        compute_kind = operand_kind(node.op, [o.kind for o in operands if not o.is_scalar] or [out_kind], out_kind)

        def converted(o: Operand, kind: str) -> Operand:
            return Operand(convert(o, kind), kind, o.is_scalar, o.number)

        if node.op in ("where",):
            operands = [converted(operands[0], BOOL)] + [converted(o, compute_kind) for o in operands[1:]]
        elif node.op == "masked_fill":
            operands = [
                converted(operands[0], compute_kind),
                converted(operands[1], BOOL),
                converted(operands[2], compute_kind),
            ]
        elif node.op != "cast":
            operands = [o if o.left_out else converted(o, compute_kind) for o in operands]
        try:
            expr = lower(node.op, operands, node.params, out_kind, _meta(node).dtype)
        except LoweringError as exc:
            raise PlanError("no-lowering", f"{_describe(node)}: {exc}") from None
        return self._emit(expr, out_kind, deps, comment=self._comment(node))

    def _lookup(self, node: Node, coords) -> Stmt:
        """An embedding at `coords` (..., d): the table's row at the index held at (...), column d.  The
        table's row count is the model's (its weight's shape, which the launcher checks), and an
        index outside it reads nothing (torch raises on it)."""
        if node.op == "one_hot":
            return self._one_hot(node, coords)
        table, ids = self.g[node.inputs[0]], self.g[node.inputs[1]]
        index = self.value(ids.id, tuple(coords[:-1]))
        if index.kind == FLOAT:
            raise PlanError("no-lowering", f"{_describe(node)} with float indices")
        row = _at_index(index, Lit(str(_meta(table).shape[0])), any_size=False)
        return self.value(table.id, (row, coords[-1]))

    def _one_hot(self, node: Node, coords) -> Stmt:
        """A one-hot at `coords` (..., k): 1 where k is the index held at (...), computed from the
        coordinate, nothing loaded but the index."""
        index = self.value(node.inputs[0], tuple(coords[:-1]))
        if index.kind != INT:
            raise PlanError("no-lowering", f"{_describe(node)} of {_meta(self.g[node.inputs[0]]).dtype} values")
        column = coords[-1]
        return self._emit(
            paren(compare(column.index, "==", index.value)).to("tl.int64"),
            INT,
            [index],
            comment=self._comment(node),
            axes=frozenset().union(index.axes, column.axes),
        )

    def _per_channel(self, node: Node, coords) -> Stmt:
        """Eval-mode batch norm: x at the element's coordinates, each [C] operand (running mean and
        variance, weight, bias) at the element's channel, dim 1; the scale per channel, then the map."""
        meta = _meta(node)
        if len(meta.shape) < 2 or len(node.args) != 5:
            raise PlanError("shape", f"{_describe(node)} has no channel dim")
        channels = meta.shape[1]
        out_kind = self._kind(node)
        x = self._operand(node, node.args[0], coords)
        if out_kind != FLOAT or x.kind != FLOAT:
            raise PlanError("no-lowering", f"{_describe(node)} on {meta.dtype} values")
        loaded: list[Stmt | None] = []
        for arg in node.args[1:]:
            if not isinstance(arg, Ref):
                loaded.append(None)  # no weight, or no bias
                continue
            shape = _meta(self.g[arg.node]).shape
            if shape != (channels,):
                raise PlanError(
                    "shape", f"{_describe(node)} reads a {_shape(shape)} operand per channel of {channels} channels"
                )
            loaded.append(self.value(arg.node, (coords[1],)))
        mean, var, weight, bias = loaded
        if mean is None or var is None:
            raise PlanError("no-lowering", f"{_describe(node)} was recorded without its running statistics")

        def as_float(s: Stmt | None) -> Term | None:
            return None if s is None else convert(Operand(s.value, s.kind), FLOAT)

        comment = self._comment(node)
        eps = self._number(node.params.get("eps", 1e-5), runtime=True)
        scale = self._emit(
            batch_norm_scale(convert(Operand(var.value, var.kind), FLOAT), as_float(weight), eps),
            FLOAT,
            [s for s in (var, weight) if s is not None],
            comment=comment + " (scale per channel)",
        )
        return self._emit(
            batch_norm_apply(
                convert(x, FLOAT), convert(Operand(mean.value, mean.kind), FLOAT), scale.value, as_float(bias)
            ),
            FLOAT,
            [s for s in (self._read(x.term), mean, scale, bias) if s is not None],
            comment=comment,
        )

    def _concat(self, node: Node, coords) -> Stmt:
        dim = node.params["dim"]
        pieces = node.args[0]
        c = coords[dim]
        offset = 0
        chosen: list[tuple[int, int, Stmt]] = []
        for piece in pieces:
            src = self.g[piece.node]
            size = _meta(src).shape[dim]
            shifted = list(coords)
            # Shifted, not clamped: an affine index keeps loads vectorised; lanes that belong
            # to another piece are masked off instead.
            index = paren(c.index - offset) if offset else c.index
            after = paren(compare(c.index, ">=", offset)) if offset else None
            before = paren(compare(c.index, "<", offset + size))
            guard = all_of(*[g for g in (c.guard, after, before) if g is not None])
            shifted[dim] = Coord(index, c.axes, guard)
            stmt = self.value(piece.node, tuple(shifted))
            chosen.append((offset, size, stmt))
            offset += size
        out_kind = self._kind(node)
        expr = convert(Operand(chosen[-1][2].value, chosen[-1][2].kind), out_kind)
        for start, size, stmt in reversed(chosen[:-1]):
            expr = call(
                "tl.where", compare(c.index, "<", start + size), convert(Operand(stmt.value, stmt.kind), out_kind), expr
            )
        return self._emit(
            expr,
            out_kind,
            [s for _, _, s in chosen],
            comment=self._comment(node),
            axes=frozenset().union(c.axes, *(s.axes for _, _, s in chosen)),
        )

    def _reduction(self, node: Node, coords) -> Stmt:
        if node.op == "gather":
            return self._pick(node, coords)
        if node.op == "cross_entropy":
            return self._cross_entropy(node, coords)
        x = self.g[node.inputs[0]]
        op = _COMPUTES_AS.get(node.op, node.op)
        shape = _meta(node).shape
        if op in ("softmax", "log_softmax") and (
            self._same_row(coords) or self._same_place(coords, self.natural, shape)
        ):
            return self._softmax_at(node, coords)
        if op in _FULL_SIZE:
            if not self._same_place(coords, self.natural, shape):
                raise PlanError("shape", f"{_describe(node)} is read through a view that reorders its rows")
        elif not self._is_row_shape(shape) or not self._same_place(coords, self._row_coords_for(shape), shape):
            raise PlanError("shape", f"the result of {_describe(node)} is read at positions of another row")
        x_meta = _meta(x)
        if x_meta.shape != self.natural_shape:
            raise PlanError(
                "reduction",
                f"{_describe(node)} reads {_shape(x_meta.shape)}, not the kernel's rows {_shape(self.natural_shape)}",
            )
        xs = self.value(x.id, self.natural)
        if xs.kind != FLOAT:
            raise PlanError("no-lowering", f"{_describe(node)} on {x_meta.dtype} values")
        comment = self._comment(node)
        if node.params.get("window") and any(w.padding for w in self.windows):
            return self._padded_pool(node, op, xs, comment)
        n = _WIDTH  # the runtime number of elements per row
        r = self._reduce
        if op == "sum":
            return r("sum", xs, comment)
        if op == "mean":
            divisor = (node.params.get("window") or {}).get("divisor_override")
            if divisor:  # avg_pool's divisor_override
                total = r("sum", xs, comment + " (sum)")
                return self._emit(total.value / float(divisor), FLOAT, [total], comment)
            return self._mean(xs, comment)
        if op in ("amax", "amin"):
            return r("max" if op == "amax" else "min", xs, comment)
        if op in ("argmax", "argmin"):
            return self._first_index(node, xs, comment)
        if op in ("var", "std"):
            mean = self._mean(xs, comment + " (mean)")
            _, ss = self._centered_squares(xs, mean, comment + " (squares)")
            corr = node.params.get("correction", 1.0)
            denom = paren(n - float(corr)) if corr else n
            var = self._emit(ss.value / denom, FLOAT, [ss], comment)
            return var if op == "var" else self._emit(call("tl.sqrt", var.value), FLOAT, [var], comment)
        if op == "logsumexp":
            m = r("max", xs, comment + " (max)")
            _, _, s = self._exp_sum(xs, m, comment + " (sum)")
            return self._emit(m.value + call("tl.log", s.value), FLOAT, [m, s], comment)
        if op == "norm":
            p = node.params.get("p", 2.0)
            if p == 2.0:
                sq = self._emit(xs.value * xs.value, FLOAT, [xs])
                ss = r("sum", sq, comment + " (squares)")
                return self._emit(call("tl.sqrt", ss.value), FLOAT, [ss], comment)
            if p in (1.0, float("inf")):
                a = self._emit(call("tl.abs", xs.value), FLOAT, [xs])
                return r("sum" if p == 1.0 else "max", a, comment)
            raise PlanError("no-lowering", f"{_describe(node)}: p={p} norm")
        if op in ("layer_norm", "group_norm", "instance_norm", "batch_norm"):
            mean = self._mean(xs, comment + " (mean)")
            d, ss = self._centered_squares(xs, mean, comment + " (variance) (sum)")
            var = self._emit(ss.value / _WIDTH, FLOAT, [ss], comment + " (variance)")
            inv = self._emit(call("tl.rsqrt", var.value + self._eps(node)), FLOAT, [var])
            if (op == "layer_norm" and self._over_whole_rows(node)) or op == "group_norm":
                self.norm_stats[node.id] = {"mean": mean, "rstd": inv}  # a group norm's rows are its groups
            y = self._emit(d.value * inv.value, FLOAT, [d, inv])
            if op in ("instance_norm", "batch_norm"):  # (x, running mean, running var, weight, bias)
                return self._per_channel_affine(node, y, node.args[3:5], comment)
            return self._affine(node, y, comment)
        if op == "rms_norm":
            sq = self._emit(xs.value * xs.value, FLOAT, [xs])
            ms = self._mean(sq, comment + " (mean square)")
            inv = self._emit(call("tl.rsqrt", ms.value + self._eps(node)), FLOAT, [ms])
            if self._over_whole_rows(node):
                self.norm_stats[node.id] = {"rstd": inv}
            y = self._emit(xs.value * inv.value, FLOAT, [xs, inv])
            return self._affine(node, y, comment)
        raise PlanError("no-lowering", f"{_describe(node)} has no row-kernel lowering")

    def _padded_pool(self, node: Node, op: str, xs: Stmt, comment: str) -> Stmt:
        """A pool whose windows reach past the tensor's edges (`max_pool2d(x, 3, 2, padding=1)`): the
        positions outside are left out of a max; a mean counts them as zeros and divides by the whole
        window (count_include_pad) or by the positions inside (`count_include_pad=False`)."""
        inside = all_of(*[c.guard for c in self.natural if c.guard is not None])
        assert inside is not None  # a padded window's coordinate is guarded
        axes = frozenset({"r", "c"})
        window = node.params["window"]
        if op == "amax":
            kept = self._emit(call("tl.where", inside, xs.value, Lit("float('-inf')")), FLOAT, [xs], axes=axes)
            return self._reduce("max", kept, comment)
        kept = self._emit(call("tl.where", inside, xs.value, 0.0), FLOAT, [xs], axes=axes)
        total = self._reduce("sum", kept, comment + " (sum)")
        if window.get("divisor_override"):
            return self._emit(total.value / float(window["divisor_override"]), FLOAT, [total], comment)
        if window.get("count_include_pad", True):
            return self._emit(total.value / _WIDTH, FLOAT, [total], comment)
        ones = self._emit(call("tl.where", inside, 1.0, 0.0), FLOAT, [], axes=axes)
        count = self._reduce("sum", ones, comment + " (positions inside)")
        return self._emit(total.value / count.value, FLOAT, [total, count], comment)

    def _first_index(self, node: Node, xs: Stmt, comment: str) -> Stmt:
        """argmax / argmin (and the indices of `torch.max(x, dim)`): the row's extreme, then the least
        column that holds it, so that ties go to the first index, as torch's do.  The columns are
        counted in float32, exact up to 2**24 of them (`_MAX_INDEXED_COLUMNS`)."""
        dims = node.params["dims"]
        if len(dims) != 1:
            raise PlanError("no-lowering", f"{_describe(node)} over {len(dims)} dims at once")
        if self.domain[-1] > _MAX_INDEXED_COLUMNS or len(self.domain) - self.row_dims != 1:
            raise PlanError("no-lowering", f"{_describe(node)} over more than {_MAX_INDEXED_COLUMNS} columns")
        extreme = self._reduce("max" if node.op in ("argmax", "max") else "min", xs, comment + " (extreme)")
        column = self.natural[dims[0]]
        at = self._emit(
            call(
                "tl.where", compare(xs.value, "==", extreme.value), column.index.to("tl.float32"), Lit("float('inf')")
            ),
            FLOAT,
            [xs, extreme],
            axes=frozenset(xs.axes | column.axes),
        )
        first = self._reduce("min", at, comment + " (first index)")
        return self._emit(first.value.to("tl.int64"), INT, [first], comment)

    def _per_channel_affine(self, node: Node, y: Stmt, operands: list, comment: str) -> Stmt:
        """`y` times the weight and plus the bias of a norm per channel (instance norm, batch norm), each
        read at the element's channel, dim 1 of the normalised tensor."""
        out = y
        channel = self.natural[1]
        for arg, sym in zip(operands, ("*", "+"), strict=False):
            if not isinstance(arg, Ref):
                continue
            ws = self.value(arg.node, (channel,))
            wv = convert(Operand(ws.value, ws.kind), FLOAT)
            out = self._emit(out.value * wv if sym == "*" else out.value + wv, FLOAT, [out, ws])
        out.comment = comment
        return out

    def _over_whole_rows(self, node: Node) -> bool:
        """A norm over the kernel's whole rows: its statistics are one number a row."""
        return len(node.params["dims"]) == len(self.domain) - self.row_dims

    def _same_row(self, coords) -> bool:
        """`coords` are the kernel's row coordinates and any column of that row (rows are whole last dims)."""
        k = self.row_dims
        plain = self.order is None and not self.windows
        return plain and k == len(self.domain) - 1 and self._same_place(coords[:k], self.full[:k])

    def _softmax_at(self, node: Node, coords) -> Stmt:
        """softmax / log_softmax over the row, at `coords` (the kernel's element, or the one element of
        each row a pick reads): the row's max and exp-sum once per node, then the element's value."""
        x = self.g[node.inputs[0]]
        if _meta(x).shape != self.natural_shape:
            raise PlanError(
                "reduction",
                f"{_describe(node)} reads {_shape(_meta(x).shape)}, not the kernel's rows {_shape(self.natural_shape)}",
            )
        comment = self._comment(node)
        m, total = self._row_max_and_exp_sum(node, x, comment)
        here = self.value(x.id, coords)
        shifted = self._emit(here.value - m.value, FLOAT, [here, m])
        if node.op == "softmax":
            return self._emit(call("tl.exp", shifted.value) / total.value, FLOAT, [shifted, total], comment)
        if node.id not in self.escaping and self.order is None:  # only picked from (a loss): keep the row's
            lse = self.row_lse.get(node.id)  # log-sum-exp for the backward (`_saved_for_backward`)
            if lse is None:
                lse = self.row_lse[node.id] = self._emit(m.value + call("tl.log", total.value), FLOAT, [m, total])
            return self._emit(here.value - lse.value, FLOAT, [here, lse], comment)
        return self._emit(shifted.value - call("tl.log", total.value), FLOAT, [shifted, total], comment)

    def _cross_entropy(self, node: Node, coords) -> Stmt:
        """Each row's loss: its log-sum-exp less the target's logit (with label smoothing e, (1 - e) of
        that and e of the log-sum-exp less the row's mean logit), 0 where the target is ignore_index;
        the row read once, the target's logit loaded on its own.  "mean" and "sum" are totalled by
        the launcher (`_row_total`)."""
        x, target = self.g[node.inputs[0]], self.g[node.inputs[1]]
        k = self.row_dims
        if len(coords) != k or not self._same_place(coords, self.full[:k]):
            raise PlanError("shape", f"the result of {_describe(node)} is read at positions of another row")
        comment = self._comment(node)
        m, total = self._row_max_and_exp_sum(node, x, comment)
        t = self.value(target.id, self.full[:k])
        xt = self.value(x.id, (*self.full[:k], _at_index(t, _WIDTH, any_size=True)))
        lse = self.row_lse[node.id] = self._emit(m.value + call("tl.log", total.value), FLOAT, [m, total])
        loss = self._emit(lse.value - xt.value, FLOAT, [lse, xt])
        smoothing = node.params["label_smoothing"]
        if float(smoothing):
            e = self._number(smoothing, runtime=False)
            row_sum = self._reduce("sum", self.value(x.id, self.full), comment + " (row sum)")
            smooth = e * paren(lse.value - row_sum.value / _WIDTH)
            loss = self._emit(paren(1.0 - e) * loss.value + smooth, FLOAT, [loss, lse, row_sum])
        ignored = self._number(node.params["ignore_index"], runtime=False)
        return self._emit(call("tl.where", compare(t.value, "!=", ignored), loss.value, 0.0), FLOAT, [loss, t], comment)

    def _row_total(self, node: Node) -> RowTotal:
        """The launcher's total of a cross-entropy's per-row losses; "mean" counts the targets, so they
        must be an input the launcher holds as the kernel reads it (not a view made in the group)."""
        target = node.inputs[1]
        if target in self.members or target not in self.input_index:
            raise PlanError("no-lowering", f"{_describe(node)}: a mean over targets made inside the group")
        ignored = self._number(node.params["ignore_index"], runtime=False)
        return RowTotal(node.params["reduction"], self.input_index[target], str(ignored), _meta(node).dtype)

    def _row_max_and_exp_sum(self, node: Node, x: Node, comment: str) -> tuple[Stmt, Stmt]:
        """The max of `x`'s row and the sum of exp(x - max), once per node that needs them."""
        stats = self.row_stats.get(node.id)
        if stats is None:
            xs = self.value(x.id, self.natural)
            if xs.kind != FLOAT:
                raise PlanError("no-lowering", f"{_describe(node)} on {_meta(x).dtype} values")
            m = self._reduce("max", xs, comment + " (row max)")
            _, _, total = self._exp_sum(xs, m, comment + " (row sum)")
            stats = self.row_stats[node.id] = (m, total)
        return stats

    def _pick(self, node: Node, coords) -> Stmt:
        """A gather of one element per row (`normalise._normalise_row_pick`): the row's sum of the
        element whose column is the row's index, so the row is read once, in a pass that reads it
        anyway (a loss's log-softmax), and nothing row-sized is written."""
        x, index = self.g[node.inputs[0]], self.g[node.inputs[1]]
        k = self.row_dims
        if not self._same_place(coords[:k], self.full[:k]) or any(c.index != ZERO.index for c in coords[k:]):
            raise PlanError("shape", f"the result of {_describe(node)} is read at positions of another row")
        if _meta(x).shape != self.domain:
            raise PlanError(
                "reduction",
                f"{_describe(node)} reads {_shape(_meta(x).shape)}, not the kernel's rows {_shape(self.domain)}",
            )
        at = self.value(index.id, self._broadcast(self.full, self.domain, _meta(index).shape))
        # The element at the row's index, computed there: one load of that element, no pass over the
        # row of its own.
        picked = self.value(x.id, (*self.full[:-1], _at_index(at, _WIDTH, any_size=True)))
        if picked.kind != FLOAT:
            raise PlanError("no-lowering", f"{_describe(node)} of {_meta(x).dtype} values")
        return self._emit(picked.value, FLOAT, [picked], self._comment(node))

    def _eps(self, node: Node) -> Term:
        eps = node.params["eps"]
        return self._number(eps if is_named(eps) else float(eps), runtime=True)

    def _same_place(self, coords, target, shape=None) -> bool:
        """Same coordinates of a value of `shape` (the domain's by default), where a coordinate along a
        dim of size 1 may also be written as 0."""
        shape = self.domain if shape is None else shape
        return len(coords) == len(target) and all(
            a.index == b.index or (shape[i] == 1 and ZERO.index in (a.index, b.index))
            for i, (a, b) in enumerate(zip(coords, target, strict=True))
        )

    def _affine(self, node: Node, y: Stmt, comment: str) -> Stmt:
        out = y
        for arg, sym in zip(node.args[1:], ("*", "+"), strict=False):
            if not isinstance(arg, Ref):
                continue
            w = self.g[arg.node]
            coords: tuple[Coord, ...]
            if node.op == "group_norm":
                coords = (self.full[1],)  # weight/bias are per channel
            else:
                coords = self._broadcast(self.natural, self.natural_shape, _meta(w).shape)
            ws = self.value(arg.node, coords)
            wv = convert(Operand(ws.value, ws.kind), FLOAT)
            out = self._emit(out.value * wv if sym == "*" else out.value + wv, FLOAT, [out, ws])
        out.comment = comment
        return out

    def _centered_squares(self, xs: Stmt, mean: Stmt, comment: str) -> tuple[Stmt, Stmt]:
        """(x - mean, its sum of squares over the row); the sum is marked so a looped kernel can
        accumulate it in the same pass as the mean's sum (shifted sums), not a pass of its own."""
        d = self._emit(xs.value - mean.value, FLOAT, [xs, mean])
        sq = self._emit(d.value * d.value, FLOAT, [d])
        ss = self._reduce("sum", sq, comment)
        ss.centered = (xs.name, mean.deps[0])
        return d, ss

    def _exp_sum(self, xs: Stmt, m: Stmt, comment: str) -> tuple[Stmt, Stmt, Stmt]:
        """(x - max, its exp, the row sum of that); the sum is marked so a looped kernel can
        keep a running max and rescale the sum in one pass (online softmax)."""
        shifted = self._emit(xs.value - m.value, FLOAT, [xs, m])
        e = self._emit(call("tl.exp", shifted.value), FLOAT, [shifted])
        s = self._reduce("sum", e, comment)
        s.online = (xs.name, m.name)
        return shifted, e, s

    def _mean(self, operand: Stmt, comment: str) -> Stmt:
        total = self._reduce("sum", operand, comment + " (sum)")
        return self._emit(total.value / _WIDTH, FLOAT, [total], comment)

    def _reduce(self, how: str, operand: Stmt, comment: str) -> Stmt:
        if "c" not in operand.axes:
            raise PlanError("reduction", "the reduced value does not vary along the row")
        done = self.reduced.get((how, operand.name))
        if done is not None:  # the same reduction of the same values (torch.max(x, dim)'s values and indices)
            return done
        stmt = self._emit(
            operand.value, FLOAT, [operand], comment=comment, reduce=how, axes=frozenset(operand.axes - {"c"})
        )
        self.reduced[(how, operand.name)] = stmt
        return stmt

    def _stmt(self, name: str) -> Stmt:
        return next(s for s in reversed(self.stmts) if s.name == name)

    def _read(self, value: Term) -> Stmt:
        """The statement whose value an operand is."""
        if not isinstance(value, Value):
            raise TypeError(f"{value} is not a statement's value")
        return self.stmts[value.number]

    def _kind(self, node: Node) -> str:
        try:
            return kind_of(_meta(node).dtype)
        except LoweringError as exc:
            raise PlanError("no-lowering", f"{_describe(node)}: {exc}") from None

    def _comment(self, node: Node) -> str:
        where = f"line {node.line}: " if node.line else ""
        return f"{where}{node.op}"


@dataclass(frozen=True)
class _Space:
    """What a reduction runs over: the dims `dims` of a tensor of `shape`, whole or (`window`: each
    pooled dim's kernel, stride and dilation) in windows.  Reductions share a kernel only over one."""

    shape: tuple[int, ...]
    dims: tuple[int, ...]
    window: tuple[tuple[int, int, int, int], ...] = ()  # (kernel, stride, dilation, padding) per pooled dim

    def describe(self) -> str:
        if self.window:
            sizes = " x ".join(str(kernel) for kernel, _, _, _ in self.window)
            return f"{_shape(self.shape)} in {sizes} windows"
        return f"{_shape(self.shape)} over dim {', '.join(map(str, self.dims))}"


def _space(node: Node, shape: tuple[int, ...]) -> _Space:
    """The space `node`, a reduction of a tensor of `shape`, runs over; a pooling the kernels cannot
    compute raises a `PlanError` that says what would fuse."""
    dims = tuple(node.params["dims"])
    if node.op.startswith("adaptive_") and any(size != 1 for size in node.params["output_size"]):
        raise PlanError(
            "no-lowering",
            f"{_describe(node)} pools to {_shape(node.params['output_size'])}, in windows whose size depends on "
            "the input's: fused to one element a dim (a global pool, `output_size=1`), or as a pool with a fixed "
            "kernel and stride (`avg_pool2d(x, k)`)",
        )
    window = node.params.get("window")
    if window is None:
        return _Space(shape, dims)
    if window["ceil_mode"]:
        raise PlanError(
            "no-lowering",
            f"{_describe(node)} rounds its output size up (ceil_mode=True), so its last windows start past "
            "the padding and are cut short: the window kernel takes whole windows; with ceil_mode=False it fuses",
        )
    per_dim = zip(window["kernel"], window["stride"], window["dilation"], window["padding"], strict=True)
    return _Space(shape, dims, tuple(per_dim))


def _at_index(index: Stmt, size: Term, any_size: bool) -> Coord:
    """The coordinate an `index` the kernel loaded names, in a dim of `size` (the row's run-time
    length C, `any_size`; or a model constant the launcher checks): loads there are masked to
    0 <= index < size, so an index outside reads nothing (torch raises on it)."""
    guard = paren(compare(index.value, ">=", 0)) & paren(compare(index.value, "<", size))
    return Coord(index.value, frozenset(index.axes), guard=guard, any_size=any_size)


def _step_shape(shape: tuple[int, ...], step: tuple) -> tuple[int, ...]:
    kind = step[0]
    s = list(shape)
    if kind == "permute":
        return tuple(s[p] for p in step[1])
    if kind == "unsqueeze":
        s.insert(step[1], 1)
        return tuple(s)
    if kind == "squeeze":
        del s[step[1]]
        return tuple(s)
    if kind == "expand":
        return tuple(step[1])
    if kind == "slice":
        _, dim, start, stepsize = step
        s[dim] = max(0, (s[dim] - start + stepsize - 1) // stepsize)
        return tuple(s)
    if kind == "select":
        del s[step[1]]
        return tuple(s)
    if kind == "reshape":
        return tuple(step[1])
    raise PlanError("shape", f"a `{kind}` view changes the iteration space")


def _step_back(step: tuple, before: tuple[int, ...], coords: list[Coord]) -> list[Coord]:
    kind = step[0]
    if kind == "permute":
        out = [ZERO] * len(coords)
        for i, p in enumerate(step[1]):
            out[p] = coords[i]
        return out
    if kind == "unsqueeze":
        return coords[: step[1]] + coords[step[1] + 1 :]
    if kind == "squeeze":
        return [*coords[: step[1]], ZERO, *coords[step[1] :]]
    if kind == "expand":
        offset = len(coords) - len(before)
        return [ZERO if before[j] == 1 else coords[j + offset] for j in range(len(before))]
    if kind == "slice":
        _, dim, start, stepsize = step
        c = coords[dim]
        index = c.index if stepsize == 1 else c.index * stepsize
        index = paren(index + start) if start else index
        out = list(coords)
        out[dim] = Coord(index, c.axes, c.guard)
        return out
    if kind == "select":
        return [*coords[: step[1]], Coord.const(step[2]), *coords[step[1] :]]
    if kind == "reshape":
        return _reshape_back(before, tuple(step[1]), coords)
    raise PlanError("shape", f"a `{kind}` view changes the iteration space")


def _reshape_back(before: tuple[int, ...], after: tuple[int, ...], coords: list[Coord]) -> list[Coord]:
    """The coordinates in `before` of the element a reshape to `after` has at `coords`.  Dims are
    matched in runs whose sizes multiply to the same (`_reshape_runs`): a dim split in two is the
    outer coordinate times the inner size plus the inner coordinate, dims merged into one are that
    coordinate divided and wrapped by the sizes inside it.  The sizes are the analyzed ones, a constant
    of the kernel; a load through such a coordinate holds its input to them (`InputSlot.guarded_dims`)."""
    out = [ZERO] * len(before)
    for run_before, run_after in _reshape_runs(before, after):
        terms: list[Term] = []
        axes: set[str] = set()
        guards: set[Term] = set()
        for a in run_after:
            c = coords[a]
            if c.index == ZERO.index:
                continue
            inner = math.prod(after[b] for b in run_after if b > a)
            terms.append(c.index if inner == 1 else c.index * inner)
            axes |= c.axes
            guards |= {c.guard} if c.guard is not None else set()
        if not terms:
            continue
        linear = terms[0]
        for t in terms[1:]:
            linear = linear + t
        guard = all_of(*sorted(guards, key=str))
        if len(run_before) == 1 and len(run_after) == 1:
            out[run_before[0]] = coords[run_after[0]]
            continue
        for b in run_before:
            inner = math.prod(before[d] for d in run_before if d > b)
            index = linear if inner == 1 else paren(linear) // inner
            if b != run_before[0]:
                index = paren(index) % before[b]
            out[b] = Coord(paren(index), frozenset(axes), guard)
    return out


def _reshape_runs(before: tuple[int, ...], after: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """The dims of `before` and of `after` (of more than one element) in runs of equal products, in
    order: ([6, 32] to [6, 4, 8] is ([0], [0]), ([1], [1, 2]))."""
    left = [d for d, n in enumerate(before) if n != 1]
    right = [d for d, n in enumerate(after) if n != 1]
    runs: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(left) and j < len(right):
        run_before, run_after = [left[i]], [right[j]]
        size_before, size_after = before[left[i]], after[right[j]]
        i, j = i + 1, j + 1
        while size_before != size_after:
            if size_before < size_after and i < len(left):
                size_before *= before[left[i]]
                run_before.append(left[i])
                i += 1
            elif size_after < size_before and j < len(right):
                size_after *= after[right[j]]
                run_after.append(right[j])
                j += 1
            else:
                raise PlanError("shape", f"a reshape of {_shape(before)} to {_shape(after)} has no runs of equal size")
        runs.append((run_before, run_after))
    if i < len(left) or j < len(right):
        raise PlanError("shape", f"a reshape of {_shape(before)} to {_shape(after)} has no runs of equal size")
    return runs


def padded_windows(plan: KernelPlan) -> list[int]:
    """The windows (their index) that reach past the pooled tensor's edges: the kernels take that
    dim's size (`e<k>`) to mask the positions outside."""
    return [k for k, w in enumerate(plan.windows) if w.padding]


def reduced_dims(plan: KernelPlan) -> list[int]:
    """The dims of the reduced tensor a row plan reduces: the last ones, those `order` puts last, or
    the pooled ones."""
    if plan.windows:
        return [w.dim for w in plan.windows]
    if plan.order is not None:
        return list(plan.order[plan.row_dims :])
    return list(range(plan.row_dims, len(plan.domain)))


def identity_inputs(plan: KernelPlan) -> list[int]:
    """Inputs read element for element over the whole domain (candidates for flat indexing)."""
    full = tuple(Dim(i) for i in range(len(plan.domain)))
    return sorted(
        {
            s.load_input
            for s in plan.stmts
            if s.load_input is not None and s.load_coords == full and plan.inputs[s.load_input].shape == plan.domain
        }
    )


def gathers(plan: KernelPlan) -> bool:
    """Whether a load reads at an index the kernel loaded first (an embedding's row, a pick's
    target): a chain of two memory latencies per row, which many small programs hide best."""
    return any(s.load_input is not None and any(map(is_loaded_index, s.load_coords)) for s in plan.stmts)


def is_loaded_index(coord: Term) -> bool:
    """Whether a load coordinate is a value the kernel loaded (`v3`: a token id), not a position."""
    return reads_values(coord)


def element_loads(plan: KernelPlan) -> int:
    """How many values an elementwise plan loads for each element: its loads that vary along the
    columns (RoPE's five: x, its two shifted halves, cos and sin), not those of one value a row."""
    return sum(1 for s in plan.stmts if s.load_input is not None and "c" in s.axes)


def row_views(plan: KernelPlan) -> list[int]:
    """Inputs of an elementwise plan read at the domain's own row coordinates and moved only
    along the last dim, such as RoPE's two halves of `q` (`q[..., :64]`, `q[..., 64:]`).
    When one shares the full-size inputs' strides it is a view of the same rows, and the
    offset that reads those inputs, shifted along the row, reads it too."""
    n = len(plan.domain)
    direct = set(identity_inputs(plan))
    if plan.kind != "elementwise" or not n or plan.row_dims != n - 1 or not direct:
        return []
    rows = tuple(Dim(i) for i in range(n - 1))
    fits: dict[int, bool] = {}
    for s in plan.stmts:
        if s.load_input is None or s.load_input in direct:
            continue
        coords = s.load_coords
        fits[s.load_input] = fits.get(s.load_input, True) and (
            len(coords) == n
            and coords[:-1] == rows
            and dims(coords[-1]) == {n - 1}
            and plan.inputs[s.load_input].shape[:-1] == plan.domain[:-1]
        )
    return sorted(k for k, ok in fits.items() if ok)


def _writes_the_domain(plan: KernelPlan) -> bool:
    """Whether an elementwise plan of two or more dims writes only full-size outputs, each at the
    domain's own offsets (no permuted, per-row, totalled or saved one): the outputs a launcher may
    give another layout of the same memory."""
    n = len(plan.domain)
    if plan.kind != "elementwise" or n < 2 or plan.row_dims != n - 1 or permuted_outputs(plan):
        return False
    return not any(o.row_only or o.col_total or o.total or o.saved for o in plan.outputs)


def flat_inner_dim(plan: KernelPlan) -> int | None:
    """The one leading domain dim that an elementwise plan's smaller loads index (a ConvNeXt layer
    scale's gamma, by channel), where every other load reads a whole input at plain coordinates: over
    a layout whose stride-1 dim that is (channels-last), a flat kernel runs the plan, each of those
    loads at `offset % size`.  (The layer scale over a channels-last [32, 96, 56, 56] in bf16 on an
    H200: 15.5 µs so, against 17.2 in the across kernel's 64-channel tiles and torch.compile's 15.2.)
    None for any other plan."""
    n = len(plan.domain)
    if not _writes_the_domain(plan) or any(o.contiguous or o.cat for o in plan.outputs):
        return None
    whole = set(identity_inputs(plan)) | {k for k, _ in full_rank_loads(plan)}
    coords_of: dict[int, tuple[Term, ...]] = {}
    indexed: set[int] = set()
    for s in plan.stmts:
        if s.load_input is None:
            if dims(s.expr):  # a value computed from a coordinate (a mask, a position)
                return None
            continue
        coords = s.load_coords
        if s.load_guard is not None or not all(isinstance(c, Dim) or c == ZERO.index for c in coords):
            return None
        if s.load_input in whole:
            if coords_of.setdefault(s.load_input, coords) != coords:  # one input read two ways
                return None
        else:
            indexed |= {c.index for c in coords if isinstance(c, Dim)}
    if len(indexed) != 1 or min(indexed) >= n - 1:
        return None
    return min(indexed)


def folds_a_row_dim(plan: KernelPlan) -> bool:
    """Whether the `_wide` kernel may run an elementwise plan: rows of a width the model fixes that is
    no power of two (Phi-3's 96-wide heads), which the tile kernel pads to the next one, leaving a
    quarter of its lanes idle, where a row dim may lie right outside each row in memory (the heads of
    q sliced from a fused qkv projection; the launcher's `_folded_row_dim` looks at call time): its
    rows are then read together as one longer row, in tiles with no idle lanes.  Only plans whose
    full-size inputs are read element for element and whose outputs are written at the domain's
    offsets (as `_writes_the_domain`), with no lookup and no layout of their own."""
    n = len(plan.domain)
    if n < 3 or not plan.fixed_width or plan.grad_layout or not _writes_the_domain(plan):
        return False
    if gathers(plan) or full_rank_loads(plan) or not identity_inputs(plan):
        return False
    width = plan.domain[-1]
    return width & (width - 1) != 0


def permuted_outputs(plan: KernelPlan) -> list[int]:
    """The outputs stored by their own strides at a permutation of the domain's coordinates."""
    return [k for k, o in enumerate(plan.outputs) if o.dims is not None]


def full_rank_loads(plan: KernelPlan) -> list[tuple[int, tuple[int, ...]]]:
    """(input, the domain dim each of its dims runs along) for the inputs of an elementwise tile
    plan read along every domain dim, one dim each, other than element for element: a permuted
    view read inside the cluster (`(gamma * y).permute(0, 3, 1, 2)` reads y at (c0, c2, c3, c1)),
    a piece of a `cat` (read at (c0, (c1 - 1), c2)).  Such an input may be laid out along a row
    dim of the domain, which the launcher sees at call time (`_row_order`)."""
    n = len(plan.domain)
    if plan.kind != "elementwise" or n < 2 or plan.row_dims != n - 1:
        return []
    # Full-size inputs read element for element may be laid out apart too (a convolution's
    # channels-last result added to a channels-first residual): all but the first are candidates.
    # A backward kernel whose outputs take a layout of their own (`grad_layout`) may find any of
    # them laid out apart from those outputs, the first included: the gradient of k in
    # `q @ k.transpose(2, 3)` comes from the matmul transposed, and its RoPE's gradient is written
    # in k's projection layout.
    direct = identity_inputs(plan)
    skip = set() if plan.grad_layout else set(direct if n < 3 else direct[:1])
    return _loads_along_every_dim(plan, skip=skip)


def mergeable_row_end(plan: KernelPlan) -> list[tuple[int, tuple[int, ...]]] | None:
    """(input, the domain dim each of its dims runs along, -1 where none) for every input of an
    elementwise plan whose last two domain dims only address memory: no statement, mask or fixed
    offset reads their coordinates, so where every tensor lays the two out as one run of memory
    the launcher may make them one dim (`_merged_row_end`).  None for any other plan, and for one
    that gathers (a table row picked by a loaded id follows the ids, not the position)."""
    n = len(plan.domain)
    if not _writes_the_domain(plan) or gathers(plan):
        return None
    ends = {n - 2, n - 1}
    dims_of: dict[int, tuple[int, ...]] = {}
    for s in plan.stmts:
        if s.load_input is None:
            if ends & dims(s.expr):
                return None
            continue
        if ends & dims(s.load_guard):
            return None
        along = []
        for c in s.load_coords:
            if not isinstance(c, Dim) and ends & dims(c):
                return None  # an offset along them (a slice, a `cat` piece)
            along.append(c.index if isinstance(c, Dim) else -1)
        slot = plan.inputs[s.load_input]
        if any(along[j] in (n - 2, n - 1) for j in slot.guarded_dims if j < len(along)):
            return None
        if dims_of.setdefault(s.load_input, tuple(along)) != tuple(along):
            return None  # read two ways
    return sorted(dims_of.items())


def row_layouts(plan: KernelPlan) -> list[tuple[int, tuple[int, ...]]]:
    """(input, the domain dim each of its dims runs along) for the inputs of a row plan read along
    every domain dim, one dim each (element for element too): the launcher looks at call time for
    one laid out along the last row dim, such as a LayerNorm over the channels of an NCHW tensor
    seen as NHWC, which the across row kernel reads down its tiles' rows."""
    if plan.kind == "elementwise" or plan.groups or not plan.row_dims or column_totals(plan):
        return []
    return _loads_along_every_dim(plan, skip=set())


def channels_last_groups(plan: KernelPlan) -> bool:
    """A group norm over [N, C, H, W], whose kernels also take a channels-last input (CL, which the
    launcher sets when its input is laid out so, as a channels-last convolution's result is): each
    group's columns then run channel fastest, as that layout stores them, and the outputs are
    channels-last too, as the input was."""
    return bool(plan.groups) and len(plan.domain) == 4


def split_groups(plan: KernelPlan) -> bool:
    """A group norm (`channels_last_groups`) whose statistics can be gathered in pieces: its two
    reductions are a sum and the centered sum of squares around that sum's mean (a GroupNorm's mean
    and variance), and every output is full-size but for the groups' statistics kept for the backward
    (`_apply` writes them).  Its kernels can then take a block of pixels and every channel at once
    (`variants.groups.SplitGroupKernels`), which reads and writes both layouts at streaming speed."""
    rows = any(o.row_only and not o.saved for o in plan.outputs)  # other than the statistics kept
    if not channels_last_groups(plan) or rows or any(o.col_total or o.dims for o in plan.outputs):
        return False
    reductions = [s for s in plan.stmts if s.reduce]
    return (
        len(reductions) == 2
        and reductions[0].how == "sum"
        and reductions[1].how == "sum"
        and reductions[1].centered == (reductions[0].reduced, reductions[0].name)
    )


def returned_outputs(plan: KernelPlan) -> list[OutputSlot]:
    """The cluster's outputs, as its caller receives them (not what the op keeps for the backward)."""
    return [o for o in plan.outputs if o.saved is None]


def saved_counts(plan: KernelPlan) -> list[int]:
    """The outputs that are a mean over the targets, when the op keeps values for the backward: the
    launcher returns each one's count of targets too, which the gradient divides by."""
    if not any(o.saved for o in plan.outputs):
        return []
    return [k for k, o in enumerate(plan.outputs) if o.total is not None and o.total.how == "mean"]


def column_totals(plan: KernelPlan) -> list[int]:
    """The outputs summed over the rows (`OutputSlot.col_total`)."""
    return [k for k, o in enumerate(plan.outputs) if o.col_total]


def _loads_along_every_dim(plan: KernelPlan, skip: set[int]) -> list[tuple[int, tuple[int, ...]]]:
    n = len(plan.domain)
    dims_of: dict[int, set[tuple[int, ...] | None]] = {}
    for s in plan.stmts:
        if s.load_input is None or s.load_input in skip:
            continue
        found = [[leaf.index for leaf in c.leaves() if isinstance(leaf, Dim)] for c in s.load_coords]
        along = tuple(f[0] for f in found if len(f) == 1)
        whole = len(s.load_coords) == n and len(along) == n and len(set(along)) == n
        dims_of.setdefault(s.load_input, set()).add(along if whole else None)
    loads = []
    for k, seen in sorted(dims_of.items()):
        only = next(iter(seen)) if len(seen) == 1 else None  # read two ways: neither is the input's own
        if only is not None:
            loads.append((k, only))
    return loads
