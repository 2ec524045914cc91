"""A cluster's backward pass as torch code: the gradients of its inputs, given its outputs' gradients.

`backward_text` writes `_<name>_backward_reference(inputs, numbers, outputs, grads)`: what the
derivatives need of the cluster's forward, recomputed with the reference's own statements (or read
from its outputs, where one is an intermediate the derivatives need), then each op's derivative
applied last op first, in the same vocabulary the forward uses (`mul`, `sigmoid`,
`sum(-1, keepdim=True)`, `cat`, slices).  It is the code that runs where the backward kernel cannot
(a CPU, no Triton), and, captured like a model's forward, the graph the backward kernel is planned
from: one kernel that reads what it needs once and writes each wanted input gradient once.

Gradients that only broadcast (a weight of [C] multiplied into [N, C] rows, `cos` read by every head)
leave the function unreduced, at the size the cluster used them: the backward row kernel sums a
row-wide one over the rows itself (`OutputSlot.col_total`), and the caller sums any other to the
input's shape (`_fit`).  Sums along a row (the gradient of an RMSNorm's per-row scale) stay inside.

Derivatives follow torch's autograd formulas (tools/autograd/derivatives.yaml) for the ops the
kernels lower; an op without one here raises `NoBackward`, and the cluster trains through its
reference under autograd instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from fuselens.analysis.graph import Graph, Node, Ref, is_named, plain
from fuselens.analysis.ops import OpClass

from .lowering import dtype_tuple, tuple_display
from .plan import KernelPlan, reduced_dims, saved_counts
from .reference import forward_statements
from .torch_code import Assign, Code, code, joined, lit, var


class NoBackward(Exception):
    """A cluster whose gradients this module cannot write (an op without a derivative here)."""


@dataclass
class BackwardText:
    text: str  # `def _<name>_backward_reference(...)`
    grads_of: list[int]  # the plan inputs (their positions) whose gradients it returns, in order
    grad_params: list[str]  # its gradient parameters, one per cluster output
    # Inputs that are views of another input (position -> the base's): their gradients are in the base's.
    folded: dict[int, int] = field(default_factory=dict)
    keeps: list[int] = field(default_factory=list)  # the inputs (positions) the gradients read
    result_params: list[str] = field(default_factory=list)  # its parameters for the cluster's outputs
    keeps_results: list[int] = field(default_factory=list)  # the outputs (positions) the gradients read
    # Inputs read through unsqueezes (a convolution's bias as `bias[:, None, None]`): position -> the
    # dim of the domain their first dim runs along, where their broadcast gradient is summed to them.
    leads: dict[int, int] = field(default_factory=dict)
    # Gradients that are more than one kernel (a group norm's): the kernels before the last, each
    # followed by torch code over its small results, and the torch code before them (`prelude`, over
    # what the forward kept).  Empty: the whole backward is one kernel.
    stages: list[Stage] = field(default_factory=list)
    prelude: list[str] = field(default_factory=list)
    # With stages: the last kernel (None when the torch code computes every gradient wanted), and
    # what the backward reference returns, as its statements name them.
    last: Stage | None = None
    returned: list[str] = field(default_factory=list)
    # Whether the gradients hold a size of the forward's reduced dims as the analyzed one (a mean's 1/N):
    # they are right only at that width, which the kernel's `fits` then holds a training call to.
    sized: bool = False


@dataclass
class Stage:
    """One kernel of a backward in stages: `def _<name>_backward_<suffix>(...)`, taking the cluster's
    inputs, numbers, outputs and gradients and then `extras` (what the torch code between kernels
    computed: one float32 value a (sample, channel)), returning `returns`; `glue` are the statements
    that run on its results before the next kernel."""

    suffix: str
    text: str
    extras: list[str]
    returns: list[str]
    glue: list[str]


def needs_grad(graph: Graph) -> set[int]:
    """Nodes whose value can need a gradient in training: the model's parameters, its floating inputs
    (a block's input is another block's output), and whatever is computed from them.  Buffers,
    constants and factories (a RoPE table, a causal mask) do not."""
    wanted: set[int] = set()
    for node in graph:
        if _takes_gradients(node) or (_computed(node) and any(i in wanted for i in node.inputs)):
            wanted.add(node.id)
    return wanted


def backward_text(
    graph: Graph, plan: KernelPlan, name: str, params: list[str], number_params: list[str], wanted: set[int]
) -> BackwardText:
    """`_<name>_backward_reference(params, number_params, result0, ..., grad0, ...)` for the inputs in
    `wanted`.  The cluster's outputs are parameters too: where a derivative reads one (a residual sum
    that a norm then reads), the backward reads it from memory instead of recomputing it from
    inputs, which then need not be kept."""
    counts = saved_counts(plan)
    returned_by_op = len(plan.outputs) + len(counts)  # the cluster's outputs, then what it keeps
    results = _fresh([f"result{k}" for k in range(returned_by_op)], params + number_params)
    inputs = {s.node for s in plan.inputs}
    given = {
        out.node: results[k]
        for k, out in enumerate(plan.outputs)
        if out.saved in (None, "row") and out.node not in inputs
    }
    saved = {(out.node, out.saved): results[k] for k, out in enumerate(plan.outputs) if out.saved}
    saved |= {(plan.outputs[k].node, "count"): results[len(plan.outputs) + j] for j, k in enumerate(counts)}
    body, names = forward_statements(graph, plan, params, number_params, given)
    grads = _fresh([f"grad{k}" for k in range(returned_by_op)], params + number_params)
    numbers = {id(slot.value): p for slot, p in zip(plan.scalars, number_params, strict=True)}
    staging = _group_staging(graph, plan, body, names, grads, numbers, saved) if plan.groups else None
    writer = _Writer(graph, plan, names, numbers, saved=saved, staging=staging)
    for k, out in enumerate(plan.outputs):
        if out.saved is None:
            writer.add(out.node, var(grads[k]))
    folded = _slices_of_inputs(graph, plan)
    for member in sorted(set(plan.members) | {plan.inputs[k].node for k in folded}, reverse=True):
        node = graph[member]
        if member in writer.adjoint and (member not in inputs or node.cls is OpClass.VIEW):
            writer.at = node
            _RULES.get(node.op, _no_rule)(writer, node)
    returned, grads_of = [], []
    for k, slot in enumerate(plan.inputs):
        if k not in folded and slot.node in wanted and slot.node in writer.adjoint:
            returned.append(writer.adjoint[slot.node])
            grads_of.append(k)
    if not returned:
        raise NoBackward("no input of the cluster needs a gradient")
    statements = _live([*body, *writer.lines], returned)
    read = set(returned).union(*(s.reads for s in statements), (s.target for s in statements))
    keeps = [k for k, p in enumerate(params) if p in read]
    keeps_results = [k for k, r in enumerate(results) if r in read]
    lines = [
        f"def _{name}_backward_reference({', '.join(params + number_params + results + grads)}):",
        f'    """The gradients of {", ".join(params[k] for k in grads_of)} from those of the outputs: the '
        'forward recomputed where they need it, then each op\'s derivative."""',
        *map(str, statements),
        f"    return {', '.join(returned)}" + ("," if len(returned) == 1 else ""),
    ]
    folded_in = {k: b for k, b in folded.items() if b in grads_of}
    leads = {k: writer.leads[slot.node] for k, slot in enumerate(plan.inputs) if slot.node in writer.leads}
    text = BackwardText("\n".join(lines), grads_of, grads, folded_in, keeps, results, keeps_results, leads)
    text.sized = writer.sized
    if staging is not None:
        signature = params + number_params + results + grads
        _split_stages(text, staging, name, signature, statements, returned)
    return text


def _fresh(names: list[str], taken: list[str]) -> list[str]:
    """`names`, each with underscores added until it is none of `taken` (the cluster's parameters)."""
    out = []
    for n in names:
        while n in taken:
            n = f"_{n}"
        out.append(n)
    return out


def _live(statements: list[Assign], returned: list[str]) -> list[Assign]:
    """The statements that the returned values (variables) need, in order: the forward's values no
    derivative reads are not recomputed (RoPE's gradient never reads q * cos), and the inputs only
    they read need not be kept for the backward."""
    live = set(returned)
    kept = []
    for statement in reversed(statements):
        if statement.target in live:
            kept.append(statement)
            live.discard(statement.target)
            live |= statement.reads
    return kept[::-1]


@dataclass
class _Staging:
    """A group norm's backward in two kernels (`_group_norm`): with the group statistics the forward
    kept, the sums of the gradient and of the gradient times the input over each channel (`sums`);
    and the input gradient, which with those sums is elementwise.  Before and between them, torch
    code over [N, C] values (`glue`: the statements it assigns) turns groups into channels and
    channels into groups."""

    xf: Code  # the group norm's input in float32
    mean: Code  # the group's mean, one value a (sample, channel), [N, C, 1, ...]
    rstd: Code  # its reciprocal standard deviation
    count: Code  # the elements of a channel: an expression over a gradient's shape
    sums: list[Code] = field(default_factory=list)
    glue: set[str] = field(default_factory=set)


def _group_staging(
    graph: Graph,
    plan: KernelPlan,
    body: list[Assign],
    names: dict[int, str],
    grads: list[str],
    numbers: dict[int, str],
    saved: dict[tuple[int, str], str],
) -> _Staging:
    """Replace the group norm's recomputed output in `body` by one from the group statistics its
    forward kept (`saved`: each (sample, group)'s mean and reciprocal deviation), spread over each
    group's channels by torch; the names of those values."""
    (gn,) = [graph[m] for m in plan.members if graph[m].op == "group_norm"]
    domain = [k for k, out in enumerate(plan.outputs) if tuple(out.shape) == tuple(plan.domain)]
    if not domain:
        raise NoBackward("a group norm whose cluster has no output of the norm's shape")
    if (gn.id, "mean") not in saved or (gn.id, "rstd") not in saved:
        raise NoBackward("a group norm whose forward kept no group statistics")
    x, weight, bias = [*_operands(gn), None, None][:3]
    meta = graph[x.node].meta
    assert meta is not None
    if len(meta.shape) < 3:  # no spatial dims to reduce a channel over (and `dim=[]` means every dim)
        raise NoBackward("a group norm over [N, C] alone")
    v = f"v{gn.id}"
    xv = var(names[x.node])
    xf = xv if meta.dtype in ("float32", "float64") else code("{}.float()", xv)

    def operand(arg) -> Code:
        return var(names[arg.node]) if isinstance(arg, Ref) else lit("None")

    grad = var(grads[domain[0]])  # of the norm's shape
    kept = [var(saved[(gn.id, "mean")]), var(saved[(gn.id, "rstd")])]
    t = var(f"{v}t")
    # The norm's output stays in float32, as the forward kernel keeps it for what follows in the cluster.
    statements = [
        Assign(f"{v}x", xf),
        Assign(
            f"{v}t", code("_group_statistics({}, {}, {}, {}, {}.shape)", *kept, operand(weight), operand(bias), grad)
        ),
        Assign(f"{v}scale", code("{}[0]", t)),
        Assign(f"{v}shift", code("{}[1]", t)),
        Assign(f"{v}mean", code("{}[2]", t)),
        Assign(f"{v}rstd", code("{}[3]", t)),
        Assign(v, code("{} * {} + {}", var(f"{v}x"), var(f"{v}scale"), var(f"{v}shift"))),
    ]
    at = next(k for k, statement in enumerate(body) if statement.target == v)
    body[at : at + 1] = statements
    staging = _Staging(var(f"{v}x"), var(f"{v}mean"), var(f"{v}rstd"), code("{}[0, 0].numel()", grad))
    staging.glue |= {f"{v}t", f"{v}scale", f"{v}shift", f"{v}mean", f"{v}rstd"}
    return staging


def _split_stages(
    text: BackwardText,
    staging: _Staging,
    name: str,
    signature: list[str],
    statements: list[Assign],
    returned: list[str],
) -> None:
    """The backward reference's statements as kernels (`text.stages`, `text.last`) and the torch code
    before and between them (`text.prelude`, each stage's `glue`): each kernel's statements are the
    ones its results need, and what the torch code computed is passed to it.  Torch code is what the staging names, and any statement that reads
    only its values (a weight's gradient cast to the weight's dtype)."""
    if not staging.sums:
        raise NoBackward("a group norm whose gradient does not reach its input")
    targets = [s.target for s in statements]
    glue = set(staging.glue)
    for statement in statements:
        read = statement.reads & set(targets)
        if read and read <= glue:
            glue.add(statement.target)
    kernel_lines = [s for s in statements if s.target not in glue]
    # The torch code before the sums (over the statistics the forward kept), and the rest, after them
    # (what reads them).
    after_sums: list[str] = []
    before_sums: list[str] = []
    sums = [str(total) for total in staging.sums]
    later = set(sums)
    for statement in statements:
        if statement.target in glue:
            on_sums = bool(statement.reads & later)
            (after_sums if on_sums else before_sums).append(str(statement))
            if on_sums:
                later.add(statement.target)
    order = {t: k for k, t in enumerate(targets)}

    def stage(suffix: str, returns: list[str], glue_after: list[str]) -> Stage:
        body = _live(kernel_lines, returns)
        read = set(returns).union(*(s.reads for s in body), (s.target for s in body))
        extras = sorted(read & glue, key=order.__getitem__)
        lines = [
            f"def _{name}_backward_{suffix}({', '.join(signature + extras)}):",
            f'    """A kernel of {name}\'s backward: {", ".join(returns)}."""',
            *map(str, body),
            f"    return {', '.join(returns)}" + ("," if len(returns) == 1 else ""),
        ]
        return Stage(suffix, "\n".join(lines), extras, returns, glue_after)

    text.prelude = before_sums
    text.stages = [stage("sums", sums, after_sums)]
    kept = [r for r in returned if r not in glue]
    text.last = stage("last", kept, []) if kept else None
    text.returned = returned


def _slices_of_inputs(graph: Graph, plan: KernelPlan) -> dict[int, int]:
    """Inputs of the cluster that are views of another of its inputs (q and the halves of q that
    `rotate_half` reads): input position -> its base's.  Their gradients are folded into the base's
    (autograd carries a view's gradient to its base anyway), so the kernel writes q's once."""
    position = {s.node: k for k, s in enumerate(plan.inputs)}
    folded = {}
    for k, slot in enumerate(plan.inputs):
        node = graph[slot.node]
        if node.cls is OpClass.VIEW and node.inputs and node.inputs[0] in position:
            folded[k] = position[node.inputs[0]]
    return folded


def _takes_gradients(node: Node) -> bool:
    """A parameter, or a floating input of the model."""
    return node.op == "param" or (node.op == "input" and node.meta is not None and _floating(node.meta.dtype))


def _computed(node: Node) -> bool:
    """A floating value computed by an op (not a buffer, constant or factory)."""
    if node.op in ("buffer", "const", "factory", "input", "param"):
        return False
    return node.meta is None or _floating(node.meta.dtype)


def gradients_text(
    name: str,
    params: list[str],
    number_params: list[str],
    text: BackwardText,
    kernel: KernelPlan,
    kernel_inputs: list[str],
    returned: list[str],
    layout_of: int | None = None,
) -> str:
    """`_<name>_gradients(params, numbers, grads)`: the backward kernel (`kernel`, taking the tensors
    `kernel_inputs`) where it runs: the tensors and numbers it was generated for, no gradient of the
    gradients wanted; else the backward reference.  `layout_of`: the input whose layout the kernel's
    outputs take (`KernelPlan.grad_layout`), from the strides the forward saw (`layouts`)."""
    signature = params + number_params + text.result_params + text.grad_params
    dtypes = tuple(slot.dtype for slot in kernel.inputs)
    same = "".join(f" and {s.text} == {s.value!r}" for s in kernel.scalars if not s.runtime)
    passed = kernel_inputs + [s.text for s in kernel.scalars if s.runtime]
    parameters = signature
    if layout_of is not None:
        passed.append(f"layouts[{layout_of}] if layouts else ()")
        parameters = [*signature, "layouts=None"]
    call = f"_{name}_backward_op({', '.join(passed)})"
    kernel_tensors = tuple_display(kernel_inputs)
    lines = [
        f"def _{name}_gradients({', '.join(parameters)}):",
        f'    """The gradients of {name}\'s inputs {", ".join(params[k] for k in text.grads_of)}: one kernel '
        'where it runs, else the backward reference."""',
        f"    if _kernel_runs({kernel_tensors}, {dtype_tuple(dtypes)}){same}:",
        f"        raws = {call}" if len(kernel.outputs) > 1 else f"        raws = ({call},)",
        f"        return {', '.join(returned)},",
        f"    return _{name}_backward_reference({', '.join(signature)})",
    ]
    return "\n".join(lines)


def registration_text(
    name: str,
    tensors: int,
    text: BackwardText,
    gradients: str | None = None,
    layouts: bool = False,
    constants: dict[int, object] | None = None,
) -> str:
    """The registration of `gradients` (by default `_<name>_gradients`) as the op's backward;
    `layouts`: it takes the inputs' strides too; `constants`: the numbers the kernel bakes in
    (position among the numbers -> value), which the op is not passed."""
    gradients = gradients or f"_{name}_gradients"
    tail = f", {text.leads!r}" if text.leads else ""
    if layouts:
        tail += ", layouts=True"
    if constants:
        tail += f", constants={constants!r}"
    return (
        f"# Training: the op's backward is {gradients}, for the inputs it computes gradients of;\n"
        "# an input that is a view of another (position: the other's) has its gradient in that one's;\n"
        "# the forward keeps for the backward only the inputs and outputs it reads.\n"
        f"_{name}_trains = {tuple(text.grads_of)!r}\n"
        f"_{name}_folded = {text.folded!r}\n"
        f"_register_backward({name!r}, {gradients}, {tensors}, _{name}_trains, {tuple(text.keeps)!r}, "
        f"{tuple(text.keeps_results)!r}{tail})"
    )


def _floating(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))


def spelled(value, numbers: dict[int, str], kind: type | None = None) -> Code:
    """A number an op took, as the gradients' code writes it: for one of the model's state (`eps`, a
    head width's scale), the parameter the cluster's functions take it as (`numbers`: its id -> the
    parameter), so the gradients compute with the value the forward ran with, never the analyzed
    one; any other as its literal (`kind` converts it first: an int bound written as a float)."""
    if is_named(value) and id(value) in numbers:
        return var(numbers[id(value)])
    value = plain(value)
    if kind is not None:
        value = kind(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise NoBackward("a derivative through a non-finite constant")
    return lit(repr(value))


def _dims(dims: list[int] | tuple[int, ...]) -> Code:
    """Dims as the code writes them: `[-1]`, `[2, 3]`."""
    return lit(str(dims))


def _literal(value: float | int) -> Code:
    return lit(repr(value))


@dataclass
class _Writer:
    graph: Graph
    plan: KernelPlan
    names: dict[int, str]  # node -> its name in the recomputed forward
    numbers: dict[int, str]  # a number of the model's state (by id) -> its parameter (`spelled`)
    adjoint: dict[int, str] = field(default_factory=dict)  # node -> the variable holding its gradient
    lines: list[Assign] = field(default_factory=list)
    slices: dict[int, list[tuple[int, int, Node]]] = field(default_factory=dict)  # input -> (dim, start, view)
    leads: dict[int, int] = field(default_factory=dict)  # input -> where it runs along the domain (`BackwardText`)
    at: Node | None = None  # the op whose derivative is being written: its contributions have its shape
    # What the forward kept for the backward (`OutputSlot.saved`): (node, "lse" | "mean" | "rstd" |
    # "count") -> its parameter.
    saved: dict[tuple[int, str], str] = field(default_factory=dict)
    # Nodes whose gradient's row sum is known without summing it (a pick's: the picked gradient).
    row_totals: dict[int, Code] = field(default_factory=dict)
    # Gradients (their variables) whose sum over a group norm's spatial dims is known from the sums its
    # backward reduces anyway (`_group_norm`): what writes that sum, [N, C, 1, ...], on first use.
    spatial_totals: dict[str, Callable[[], Code]] = field(default_factory=dict)
    spatial_dims: list[int] = field(default_factory=list)  # those dims
    staging: _Staging | None = None  # a group norm's backward in stages
    sized: bool = False  # a derivative was written with a reduced dim's analyzed size (`BackwardText.sized`)

    def value(self, arg) -> Code:
        """An operand as the recomputed forward names it, or a number as `spelled`."""
        if isinstance(arg, Ref):
            return var(self.names[arg.node])
        return self.number(arg)

    def output(self, node: Node) -> Code:
        """The op's own value, as the recomputed forward names it."""
        return var(self.names[node.id])

    def number(self, value, kind: type | None = None) -> Code:
        return spelled(value, self.numbers, kind)

    def dtype(self, arg) -> str:
        """The dtype of an operand's value (a number's: float32, as a kernel computes it)."""
        if isinstance(arg, Ref):
            meta = self.graph[arg.node].meta
            return meta.dtype if meta is not None else "float32"
        return "float32"

    def wide(self, value: Code, dtype: str) -> Code:
        """`value` (of `dtype`) in float32, as torch's own backward formulas compute narrow dtypes."""
        return value if dtype in ("float32", "float64") else code("{}.float()", value)

    def narrow(self, value: Code, dtype: str, like: Code, like_dtype: str) -> Code:
        """`value` (of `dtype`) in `like`'s dtype, `like_dtype`: no cast where they are the same (a cast
        to the same dtype would be a view of the kernel's value, not a value of its own).  The dtype is
        written out, not read from `like`, so the backward keeps no value alive only for its dtype:
        the op runs, and so its backward, only for the dtypes the kernel was generated for."""
        del like
        same = dtype == like_dtype or (dtype == "float32" and like_dtype == "float64")
        return value if same else code("({}).to({})", value, lit(f"torch.{like_dtype}"))

    def grad(self, node: Node) -> Code:
        return var(self.adjoint[node.id])

    def saved_value(self, node: Node, what: str) -> Code | None:
        """What the forward kept of `node` for the backward (`saved`), None where it kept nothing."""
        name = self.saved.get((node.id, what))
        return var(name) if name is not None else None

    def let(self, value: Code) -> Code:
        """A fresh variable holding `value`."""
        name = f"d{len(self.lines)}"
        self.lines.append(Assign(name, value))
        return var(name)

    def add(self, node_id: int, value: Code) -> None:
        """Accumulate `value` into `node_id`'s gradient."""
        if node_id in self.adjoint:
            self.row_totals.pop(node_id, None)  # a sum of contributions: its row sum is no longer known
            self.spatial_totals.pop(f"g{node_id}", None)  # (nor its spatial sum)
            self.lines.append(Assign(f"g{node_id}", code("{} + {}", var(self.adjoint[node_id]), value)))
        else:
            self.lines.append(Assign(f"g{node_id}", value))
            if value.text in self.spatial_totals:  # a gradient passed on as it is: its spatial sum is the same
                self.spatial_totals[f"g{node_id}"] = self.spatial_totals[value.text]
        self.adjoint[node_id] = f"g{node_id}"

    def to(self, arg, value: Code, over_row: bool = True) -> None:
        """A contribution `value` to operand `arg`'s gradient (a number has none).  Where the operand
        is smaller than the contribution along row dims (a per-row scale), it is summed along them."""
        if not isinstance(arg, Ref):
            return
        node = self.graph[arg.node]
        if node.meta is None or not _floating(node.meta.dtype):
            return
        if value.text in self.spatial_totals and self._broadcast_over_spatial(node):
            # Only its sum over those dims reaches it: the one the group norm's sums give, no full-size
            # value (a convolution's bias, a time embedding added before a GroupNorm).
            self.add(arg.node, self.spatial_totals[value.text]())
            return
        reduced = self._row_dims_reduced(node) if over_row else []
        if reduced:
            value = code("({}).sum(dim={}, keepdim=True)", value, _dims(reduced))
        self.add(arg.node, value)

    def _broadcast_over_spatial(self, node: Node) -> bool:
        """Whether `node` (as its user broadcasts it, its dims to the right) is 1 along every spatial dim
        of the group norm (`spatial_totals`)."""
        if node.meta is None or not self.spatial_dims:
            return False
        rank = max(self.spatial_dims) + 1
        shape = node.meta.shape
        aligned = (1,) * (rank - len(shape)) + tuple(shape)
        return len(shape) <= rank and all(aligned[d] == 1 for d in self.spatial_dims)

    def _row_dims_reduced(self, operand: Node) -> list[int]:
        """The reduced dims (the row's: the last ones, or those the plan reduces) along which `operand`
        (a member, not an input) is 1 where the op using it is not: the dims its gradient must be
        summed over inside the kernel."""
        if operand.id in {s.node for s in self.plan.inputs} or operand.meta is None:
            return []
        if self.at is None or self.at.meta is None:
            return []
        shape, used = operand.meta.shape, self.at.meta.shape
        if len(shape) != len(used):
            return []
        return [d for d in reduced_dims(self.plan) if d < len(used) and shape[d] == 1 and used[d] != 1]


def _shape(node: Node) -> tuple[int, ...]:
    if node.meta is None:
        raise NoBackward(f"`{node.op}` made a value with no recorded shape")
    return node.meta.shape


def _no_rule(w: _Writer, node: Node) -> None:
    raise NoBackward(f"`{node.op}` has no derivative in fuselens yet")


def _operands(node: Node) -> list:
    return list(node.args)


def _add(w: _Writer, node: Node) -> None:
    a, b = _operands(node)[:2]
    g = w.grad(node)
    w.to(a, g)
    w.to(b, _times_alpha(w, node, g))


def _sub(w: _Writer, node: Node) -> None:
    a, b = _operands(node)[:2]
    g = w.grad(node)
    w.to(a, g)
    w.to(b, code("(-{})", _times_alpha(w, node, g)))


def _times_alpha(w: _Writer, node: Node, g: Code) -> Code:
    """`g` times the `alpha` of `add(a, b, alpha=...)` (b's factor); `g` itself for a literal 1."""
    alpha = node.params.get("alpha", 1)
    return g if alpha == 1 and not is_named(alpha) else code("({} * {})", g, w.number(alpha))


def _mul(w: _Writer, node: Node) -> None:
    a, b = _operands(node)[:2]
    g = w.grad(node)
    w.to(a, code("{} * {}", g, w.value(b)))
    w.to(b, code("{} * {}", g, w.value(a)))


def _div(w: _Writer, node: Node) -> None:
    a, b = _operands(node)[:2]
    if node.params.get("rounding_mode"):
        raise NoBackward("`div` with a rounding mode")
    g = w.grad(node)
    w.to(a, code("{} / {}", g, w.value(b)))
    if isinstance(b, Ref):
        w.to(b, code("(-{}) * {} / {}", g, w.output(node), w.value(b)))


def _pow(w: _Writer, node: Node) -> None:
    base, exponent = _operands(node)[:2]
    if isinstance(exponent, Ref) or not isinstance(base, Ref):
        raise NoBackward("`pow` with a tensor exponent")
    g, x = w.grad(node), w.value(base)
    if is_named(exponent):  # the model's, passed by the caller: written for any value, not the analyzed one's
        p = w.number(exponent)
        w.to(base, code("{} * {} * {}.pow({} - 1)", g, p, x, p))
    elif exponent == 2:
        w.to(base, code("{} * 2.0 * {}", g, x))
    elif exponent != 0:
        w.to(base, code("{} * {} * {}.pow({})", g, _literal(float(exponent)), x, _literal(float(exponent) - 1)))


def _unary(derivative: str):
    """A rule for y = f(x) whose derivative is `derivative`, written in x and y (the op's output):
    `{x}` and `{y}` mark where they go."""
    order = [piece[0] for piece in derivative.split("{")[1:]]  # "x" and "y", as they come
    template = derivative.replace("{x}", "{}").replace("{y}", "{}")

    def rule(w: _Writer, node: Node) -> None:
        x = _operands(node)[0]
        values = {"x": w.value(x), "y": w.output(node)}
        local = code(template, *(values[k] for k in order))
        w.to(x, code("{} * ({})", w.grad(node), local))

    return rule


def _neg(w: _Writer, node: Node) -> None:
    w.to(_operands(node)[0], code("(-{})", w.grad(node)))


def _pass_through(w: _Writer, node: Node) -> None:
    """An op whose gradient is its output's: identities (eval-mode dropout, clone, contiguous)."""
    w.to(_operands(node)[0], w.grad(node), over_row=False)


def _cast(w: _Writer, node: Node) -> None:
    x = _operands(node)[0]
    w.to(x, w.narrow(w.grad(node), w.dtype(Ref(node.id)), w.value(x), w.dtype(x)), over_row=False)


def _activation(w: _Writer, node: Node, local: Code) -> None:
    """The gradient through an activation whose derivative `local` is in float32 (as torch's own
    silu and gelu backward compute it in every dtype), in the output's dtype."""
    g, d = w.grad(node), w.dtype(Ref(node.id))
    w.to(_operands(node)[0], w.narrow(code("{} * ({})", w.wide(g, d), local), "float32", g, d))


def _silu(w: _Writer, node: Node) -> None:
    x = _operands(node)[0]
    xf = w.let(w.wide(w.value(x), w.dtype(x)))
    s = w.let(code("torch.sigmoid({})", xf))
    _activation(w, node, code("{} * (1.0 + {} * (1.0 - {}))", s, xf, s))


def _gelu(w: _Writer, node: Node) -> None:
    x = w.let(w.wide(w.value(_operands(node)[0]), w.dtype(_operands(node)[0])))
    if node.params.get("approximate", "none") == "tanh":
        k = _literal(math.sqrt(2.0 / math.pi))
        inner = w.let(code("{} * ({} + 0.044715 * {} * {} * {})", k, x, x, x, x))
        t = w.let(code("torch.tanh({})", inner))
        local = code(
            "0.5 * (1.0 + {}) + 0.5 * {} * (1.0 - {} * {}) * {} * (1.0 + 0.134145 * {} * {})", t, x, t, t, k, x, x
        )
    else:
        cdf = code("0.5 * (1.0 + torch.erf({} * {}))", x, _literal(1 / math.sqrt(2.0)))
        local = code("{} + {} * torch.exp(-0.5 * {} * {}) * {}", cdf, x, x, x, _literal(1 / math.sqrt(2.0 * math.pi)))
    _activation(w, node, local)


def _relu(w: _Writer, node: Node) -> None:
    w.to(_operands(node)[0], code("torch.where({} > 0, {}, 0.0)", w.output(node), w.grad(node)))


def _where(w: _Writer, node: Node) -> None:
    cond, a, b = _operands(node)[:3]
    g = w.grad(node)
    c = w.value(cond)
    w.to(a, code("torch.where({}, {}, 0.0)", c, g))
    w.to(b, code("torch.where({}, 0.0, {})", c, g))


def _masked_fill(w: _Writer, node: Node) -> None:
    x, mask = _operands(node)[:2]
    w.to(x, code("{}.masked_fill({}, 0.0)", w.grad(node), w.value(mask)))


def _reduced(node: Node, g: Code) -> Code:
    """`g`, a reduction's gradient, with the dims it removed put back (keepdim=False)."""
    if node.params.get("keepdim", False):
        return g
    dims = sorted(node.params.get("dims", []))
    return code("{}[{}]", g, lit(", ".join("None" if d in dims else ":" for d in range(max(dims) + 1))))


def _sum(w: _Writer, node: Node) -> None:
    x = _operands(node)[0]
    w.to(x, _reduced(node, w.grad(node)), over_row=False)


def _mean(w: _Writer, node: Node) -> None:
    x = _operands(node)[0]
    n = 1
    meta = w.graph[x.node].meta
    assert meta is not None
    for d in node.params["dims"]:
        n *= meta.shape[d]
    w.sized = True
    w.to(x, code("{} * {}", _reduced(node, w.grad(node)), _literal(1.0 / n)), over_row=False)


def _last_dims(node: Node) -> Code:
    return _dims(node.params.get("dims", [-1]))


def _softmax(w: _Writer, node: Node) -> None:
    y, g, dims = w.output(node), w.grad(node), _last_dims(node)
    total = w.let(code("({} * {}).sum(dim={}, keepdim=True)", g, y, dims))
    w.to(_operands(node)[0], code("{} * ({} - {})", y, g, total), over_row=False)


def _log_softmax(w: _Writer, node: Node) -> None:
    """g - softmax * (g summed over the row).  Where the forward kept the row's log-sum-exp (the
    log-probabilities are only picked from), the softmax comes from it, and a pick's gradient
    brings its own row sum (`_pick`): one pass over the logits."""
    x, g, dims = _operands(node)[0], w.grad(node), _last_dims(node)
    total = w.row_totals.get(node.id) or w.let(code("{}.sum(dim={}, keepdim=True)", g, dims))
    lse = w.saved_value(node, "lse")
    if lse is None:
        w.to(x, code("{} - torch.exp({}) * {}", g, w.output(node), total), over_row=False)
        return
    p = _softmax_from(w, x, lse)
    w.to(x, w.narrow(code("{} - {} * {}", g, p, total), "float32", w.value(x), w.dtype(x)), over_row=False)


def _softmax_from(w: _Writer, x: Ref, lse: Code) -> Code:
    """The softmax of the logits `x` over their rows, in float32, from the row log-sum-exp `lse` the
    forward kept: one elementwise pass, no reduction."""
    return w.let(code("torch.exp({} - {}.unsqueeze(-1))", w.wide(w.value(x), w.dtype(x)), lse))


def _pick(w: _Writer, node: Node) -> None:
    """A gather of one element per row (a loss picking the target's log-probability): the gradient
    is the picked one at the index and 0 elsewhere, a one-hot; its row sum is the picked gradient."""
    x, index = _operands(node)[:2]
    classes, g = _shape(w.graph[x.node])[-1], w.grad(node)
    w.sized = True  # the class count is the analyzed one's: a call with gradients must have it
    hot = w.let(code("torch.nn.functional.one_hot({}[..., 0], {})", w.value(index), _literal(classes)))
    alone = x.node not in w.adjoint
    w.to(x, code("{} * {}", hot, g), over_row=False)
    if alone:
        w.row_totals[x.node] = g


def _norm(w: _Writer, node: Node, centered: bool) -> None:
    """LayerNorm (`centered`) or RMSNorm over the row: y = xhat * weight (+ bias) with
    xhat = (x - mean) * rstd, in float32 as torch computes it."""
    x, weight = _operands(node)[:2]
    dims, eps, g = _dims(node.params["dims"]), w.number(node.params["eps"], float), w.grad(node)
    xv = w.value(x)
    xf = w.let(w.wide(xv, w.dtype(x)))
    # The row statistics the forward kept (`OutputSlot.saved`), one number a row: put back the
    # normalised dims; else recomputed from the row.
    put_back = lit(", ".join(["..."] + ["None"] * len(node.params["dims"])))
    kept = {
        what: code("{}[{}]", saved, put_back)
        for what in ("mean", "rstd")
        if (saved := w.saved_value(node, what)) is not None
    }
    if centered:
        xc = w.let(code("{} - {}", xf, kept.get("mean") or code("{}.mean(dim={}, keepdim=True)", xf, dims)))
        rstd = kept.get("rstd") or w.let(
            code("torch.rsqrt(({} * {}).mean(dim={}, keepdim=True) + {})", xc, xc, dims, eps)
        )
    else:
        xc = xf
        rstd = kept.get("rstd") or w.let(
            code("torch.rsqrt(({} * {}).mean(dim={}, keepdim=True) + {})", xf, xf, dims, eps)
        )
    xhat = w.let(code("{} * {}", xc, rstd))
    gf = w.let(w.wide(g, w.dtype(Ref(node.id))))
    gxhat = w.let(code("{} * {}", gf, w.wide(w.value(weight), w.dtype(weight)))) if isinstance(weight, Ref) else gf
    inner = code("{} - {} * ({} * {}).mean(dim={}, keepdim=True)", gxhat, xhat, gxhat, xhat, dims)
    if centered:
        inner = code(
            "{} - {}.mean(dim={}, keepdim=True) - {} * ({} * {}).mean(dim={}, keepdim=True)",
            gxhat, gxhat, dims, xhat, gxhat, xhat, dims,
        )  # fmt: skip
    w.to(x, w.narrow(code("{} * ({})", rstd, inner), "float32", xv, w.dtype(x)), over_row=False)
    if isinstance(weight, Ref):
        w.to(weight, w.narrow(code("{} * {}", gf, xhat), "float32", w.value(weight), w.dtype(weight)), over_row=False)
    if centered and len(_operands(node)) > 2 and isinstance(_operands(node)[2], Ref):
        bias = _operands(node)[2]
        # Through float32 (a value the kernel computes, so it can sum it over the rows itself).
        w.to(bias, w.narrow(gf, "float32", w.value(bias), w.dtype(bias)), over_row=False)


def _channel_norm(w: _Writer, node: Node) -> None:
    """Instance norm (each sample's channel normalised over its spatial dims) or batch norm with the
    batch's statistics (each channel over the batch and its spatial dims): y = xhat * weight + bias
    with xhat = (x - mean) * rstd over `dims`, weight and bias per channel (dim 1), in float32 as
    torch computes it.  The weight's and bias's gradients are summed over `dims` in the kernel
    (one number a row); an instance norm's still has a number a sample, which the caller sums
    (`leads`: the weight's dim runs along dim 1)."""
    x, _, _, weight, bias = [*_operands(node), None, None, None, None][:5]
    dims, eps, g = _dims(list(node.params["dims"])), _literal(float(node.params["eps"])), w.grad(node)
    ndim = len(_shape(node))
    xv = w.value(x)
    xf = w.let(w.wide(xv, w.dtype(x)))
    xc = w.let(code("{} - {}.mean(dim={}, keepdim=True)", xf, xf, dims))
    rstd = w.let(code("torch.rsqrt(({} * {}).mean(dim={}, keepdim=True) + {})", xc, xc, dims, eps))
    xhat = w.let(code("{} * {}", xc, rstd))
    gf = w.let(w.wide(g, w.dtype(Ref(node.id))))
    gxhat = gf
    if isinstance(weight, Ref):
        gxhat = w.let(code("{} * {}", gf, _per_channel(w.wide(w.value(weight), w.dtype(weight)), ndim)))
    inner = code(
        "{} - {}.mean(dim={}, keepdim=True) - {} * ({} * {}).mean(dim={}, keepdim=True)",
        gxhat, gxhat, dims, xhat, gxhat, xhat, dims,
    )  # fmt: skip
    w.to(x, w.narrow(code("{} * ({})", rstd, inner), "float32", xv, w.dtype(x)), over_row=False)
    for arg, grad in ((weight, code("({} * {})", gf, xhat)), (bias, gf)):
        if isinstance(arg, Ref):
            summed = code("{}.sum(dim={}, keepdim=True)", grad, dims)
            w.to(arg, w.narrow(summed, "float32", w.value(arg), w.dtype(arg)), over_row=False)
            w.leads[arg.node] = 1


def _per_channel(value: Code, ndim: int) -> Code:
    """A [C] value read along dim 1 of an `ndim`-dim tensor."""
    return value if ndim == 2 else code("{}[:, {}]", value, lit(", ".join(["None"] * (ndim - 2))))


def _group_norm(w: _Writer, node: Node) -> None:
    """GroupNorm: with the sums of the gradient g and of g times x over each (sample, channel) (A and
    B, one kernel's reductions), torch gathers the groups' terms and the weight's and bias's
    gradients, and the input's gradient is alpha * g + beta * x + gamma, per (sample, channel)
    coefficients: torch's own formula (native_group_norm_backward), in two passes over x (the
    groups' statistics are the forward's)."""
    s = w.staging
    if s is None:
        raise NoBackward("a group norm outside a kernel over its groups")
    x, weight, bias = [*_operands(node), None, None][:3]
    meta = w.graph[x.node].meta
    assert meta is not None
    dims = list(range(2, len(meta.shape)))
    gf = w.let(w.wide(w.grad(node), w.dtype(Ref(node.id))))
    s.sums = [
        w.let(code("({} * {}).sum(dim={}, keepdim=True)", gf, s.xf, _dims(dims))),
        w.let(code("{}.sum(dim={}, keepdim=True)", gf, _dims(dims))),
    ]
    weight_value = w.value(weight) if isinstance(weight, Ref) else lit("None")
    groups = w.number(node.params["groups"], int)
    t = w.let(
        code("_group_coefficients({}, {}, {}, {}, {}, {}, {})", *s.sums, s.mean, s.rstd, weight_value, groups, s.count)
    )
    alpha, beta, gamma, dweight, dbias = (w.let(code("{}[{}]", t, _literal(k))) for k in range(5))
    s.glue |= {str(v) for v in (t, alpha, beta, gamma, dweight, dbias)}
    dx = code("{} * {} + {} * {} + {}", alpha, gf, beta, s.xf, gamma)
    fresh = x.node not in w.adjoint
    w.to(x, w.narrow(dx, "float32", w.value(x), w.dtype(x)), over_row=False)
    if fresh:  # the input's gradient summed over a channel's pixels is known from the sums' terms
        w.spatial_dims = dims
        w.spatial_totals[w.adjoint[x.node]] = _spatial_total(w, s, dims, alpha, beta, gamma)
    if isinstance(weight, Ref):
        w.to(weight, w.narrow(dweight, "float32", w.value(weight), w.dtype(weight)), over_row=False)
    if isinstance(bias, Ref):
        w.to(bias, w.narrow(dbias, "float32", w.value(bias), w.dtype(bias)), over_row=False)


def _spatial_total(
    w: _Writer, s: _Staging, dims: list[int], alpha: Code, beta: Code, gamma: Code
) -> Callable[[], Code]:
    """What writes, on first use, the group norm input's gradient alpha * g + beta * x + gamma summed
    over each (sample, channel)'s pixels: alpha times the gradient's sum (the sums kernel's), beta times
    the input's (one more sum in the same kernel, no more reads) and gamma times the pixels, in
    torch between the kernels.  Without it, an input added before the norm that is one value a
    (sample, channel) or a channel would have its gradient summed from a full-size one by torch."""
    made: list[Code] = []

    def total() -> Code:
        if not made:
            s.sums.append(w.let(code("{}.sum(dim={}, keepdim=True)", s.xf, _dims(dims))))
            made.append(w.let(code("{} * {} + {} * {} + {} * {}", alpha, s.sums[1], beta, s.sums[-1], gamma, s.count)))
            s.glue.add(str(made[0]))
        return made[0]

    return total


def _cross_entropy(w: _Writer, node: Node) -> None:
    """The logits' gradient: softmax less the (smoothed) one-hot target, times each row's share of
    the upstream gradient (its own for "none", all of it for "sum", over the targets counted for
    "mean"), 0 on rows whose target is ignored.  The softmax comes from the row log-sum-exp the
    forward kept, so the gradient is one pass over the logits."""
    x, target = _operands(node)[:2]
    lse = w.saved_value(node, "lse")
    if lse is None:
        raise NoBackward("a cross-entropy whose forward kept no row log-sum-exp")
    reduction, ignored = node.params["reduction"], w.number(node.params["ignore_index"], int)
    smoothing, classes = node.params["label_smoothing"], _shape(w.graph[x.node])[-1]
    w.sized = True  # the class count is the analyzed one's: a call with gradients must have it
    t, g = w.value(target), w.grad(node)
    valid = w.let(code("{} != {}", t, ignored))
    share = code("{} / {}", g, var(w.saved[(node.id, "count")])) if reduction == "mean" else g
    row = w.let(code("torch.where({}, {}, 0.0).unsqueeze(-1)", valid, share))
    hot = w.let(code("torch.nn.functional.one_hot(torch.where({}, {}, 0), {})", valid, t, _literal(classes)))
    if is_named(smoothing):  # the model's, passed by the caller: written for any value, not the analyzed one's
        e = w.number(smoothing)
        aim = code("(1.0 - {}) * {} + {} / {}", e, hot, e, _literal(classes))
    else:
        smoothing = float(smoothing)
        aim = code("{} * {} + {}", _literal(1.0 - smoothing), hot, _literal(smoothing / classes)) if smoothing else hot
    p = _softmax_from(w, x, lse)
    w.to(x, w.narrow(code("({} - {}) * {}", p, aim, row), "float32", w.value(x), w.dtype(x)), over_row=False)


def _cat(w: _Writer, node: Node) -> None:
    (parts,) = _operands(node)[:1]
    dim, g = node.params["dim"], w.grad(node)
    start = 0
    for part in parts:
        size = _shape(w.graph[part.node])[dim]
        index = ", ".join([":"] * dim + [f"{start}:{start + size}"])
        w.to(part, code("{}[{}]", g, lit(index)), over_row=False)
        start += size


def _view(w: _Writer, node: Node) -> None:
    """A view of an input (a slice of q, cos unsqueezed): its gradient lands in the input's.  Slices
    that tile one dim of the input are joined back with `cat`; other views keep the view's shape and
    the caller fits it to the input."""
    (x,) = _operands(node)[:1]
    steps = node.params.get("steps", [])
    of_input = x.node in {s.node for s in w.plan.inputs}
    if of_input and all(s[0] in ("unsqueeze", "squeeze", "reshape", "expand") for s in steps):
        w.to(x, w.grad(node), over_row=False)  # the caller reshapes or sums it to the input's shape
        if all(s[0] == "unsqueeze" for s in steps):
            first = 0  # where the input's first dim ends up in the view
            for _, dim in steps:
                first += dim <= first
            w.leads[x.node] = len(w.plan.domain) - len(_shape(node)) + first
        return
    if len(steps) == 1 and steps[0][0] == "slice" and steps[0][3] == 1:
        w.slices.setdefault(x.node, []).append((steps[0][1], steps[0][2], node))
        _join_slices(w, x.node)
        return
    if not of_input and all(s[0] in ("unsqueeze", "squeeze", "reshape") for s in steps):
        # A view of a value the cluster computes, that only regroups its dims: the gradient regrouped back.
        w.to(x, code("{}.reshape({}.shape)", w.grad(node), w.value(x)), over_row=False)
        return
    raise NoBackward(f"the gradient through a `{node.op}` view")


def _join_slices(w: _Writer, base: int) -> None:
    """Once the slices of `base` read in the cluster tile one of its dims, their gradients become
    one contribution: their `cat` along that dim."""
    pieces = sorted(w.slices[base], key=lambda p: p[1])
    meta = w.graph[base].meta
    assert meta is not None
    dims = {p[0] for p in pieces}
    if len(dims) != 1:
        raise NoBackward("slices of one input along different dims")
    (dim,) = dims
    covered = 0
    for _, start, view in pieces:
        if start != covered or view.id not in w.adjoint:
            return  # not yet a tiling: more slices are still to come (they are visited last op first)
        covered += _shape(view)[dim]
    if covered != meta.shape[dim]:
        return
    grads = joined([w.grad(v) for _, _, v in pieces])
    w.add(base, code("torch.cat(({},), dim={})", grads, _literal(dim)))


def _bounded(w: _Writer, node: Node) -> None:
    """clamp / hardtanh: the gradient passes where the input is inside the bounds (at them too, as
    torch's own formula has it), and is zero outside."""
    x = _operands(node)[0]
    lo = node.params.get("min", node.params.get("min_val"))
    hi = node.params.get("max", node.params.get("max_val"))
    bounds = [code("({} >= {})", w.value(x), w.number(lo, float)) for _ in [0] if lo is not None]
    bounds += [code("({} <= {})", w.value(x), w.number(hi, float)) for _ in [0] if hi is not None]
    if bounds:
        w.to(x, code("torch.where({}, {}, 0.0)", joined(bounds, " & "), w.grad(node)))
    else:
        w.to(x, w.grad(node))


def _leaky_relu(w: _Writer, node: Node) -> None:
    x, slope = _operands(node)[0], w.number(node.params.get("negative_slope", 0.01), float)
    g = w.grad(node)
    w.to(x, code("torch.where({} > 0, {}, {} * {})", w.value(x), g, g, slope))


def _abs(w: _Writer, node: Node) -> None:
    x = _operands(node)[0]
    g, v = w.grad(node), w.value(x)
    w.to(x, code("torch.where({} > 0, {}, torch.where({} < 0, -{}, 0.0))", v, g, v, g))


def _permute(w: _Writer, node: Node) -> None:
    """A permuted view: its gradient is the output's, permuted back.  Of a value the cluster computes
    (ConvNeXt's `(gamma * y).permute(0, 3, 1, 2)`), not of an input, whose gradient must be a value the
    kernel writes, not a view of one."""
    (x,) = _operands(node)[:1]
    steps = node.params.get("steps", [])
    if x.node in {s.node for s in w.plan.inputs} or len(steps) != 1 or steps[0][0] != "permute":
        raise NoBackward(f"the gradient through a `{node.op}` view of an input")
    order = list(steps[0][1])
    inverse = [order.index(d) for d in range(len(order))]
    w.to(x, code("{}.permute({})", w.grad(node), _dims(inverse)), over_row=False)


def _embedding(w: _Writer, node: Node) -> None:
    """The table's gradient: each looked-up row's gradient added into the table at its id, as eager
    autograd computes it (`embedding_dense_backward`); a scatter, so torch runs it, not a kernel."""
    table, ids = _operands(node)[:2]
    padding = w.number(node.params.get("padding_idx", -1), int)
    by_freq = _literal(bool(node.params.get("scale_grad_by_freq", False)))
    # The lookup's gradient as large as the lookup (a position embedding is broadcast over the batch):
    # the sizes of the call's ids and table, which a kernel made at other sizes may take.
    looked_up = code("tuple({}.shape) + ({}.shape[-1],)", w.value(ids), w.value(table))
    rows = code("{}.shape[0]", w.value(table))
    g = code("{}.sum_to_size({})", w.grad(node), looked_up)
    w.to(
        table,
        code("torch.ops.aten.embedding_dense_backward({}, {}, {}, {}, {})", g, w.value(ids), rows, padding, by_freq),
        over_row=False,
    )


_RULES = {
    "add": _add,
    "sub": _sub,
    "mul": _mul,
    "div": _div,
    "pow": _pow,
    "neg": _neg,
    "exp": _unary("{y}"),
    "log": _unary("1.0 / {x}"),
    "sigmoid": _unary("{y} * (1.0 - {y})"),
    "tanh": _unary("1.0 - {y} * {y}"),
    "rsqrt": _unary("-0.5 * {y} * {y} * {y}"),
    "sqrt": _unary("0.5 / {y}"),
    "reciprocal": _unary("-{y} * {y}"),
    "square": _unary("2.0 * {x}"),
    "erf": _unary(f"{2 / math.sqrt(math.pi)!r} * torch.exp(-{{x}} * {{x}})"),
    "log1p": _unary("1.0 / (1.0 + {x})"),
    "expm1": _unary("{y} + 1.0"),
    "sin": _unary("torch.cos({x})"),
    "cos": _unary("-torch.sin({x})"),
    "abs": _abs,
    "clamp": _bounded,
    "hardtanh": _bounded,
    "leaky_relu": _leaky_relu,
    "silu": _silu,
    "gelu": _gelu,
    "relu": _relu,
    "where": _where,
    "masked_fill": _masked_fill,
    "cast": _cast,
    "to_same": _pass_through,
    "dropout": _pass_through,
    "clone": _pass_through,
    "contiguous": _pass_through,
    "alias": _pass_through,
    "sum": _sum,
    "mean": _mean,
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "cross_entropy": _cross_entropy,
    "gather": _pick,
    "layer_norm": lambda w, node: _norm(w, node, centered=True),
    "rms_norm": lambda w, node: _norm(w, node, centered=False),
    "group_norm": _group_norm,
    "instance_norm": lambda w, node: _channel_norm(w, node) if node.cls is OpClass.REDUCTION else _no_rule(w, node),
    "batch_norm": lambda w, node: _channel_norm(w, node) if node.cls is OpClass.REDUCTION else _no_rule(w, node),
    **{f"adaptive_avg_pool{n}d": _mean for n in (1, 2, 3)},
    "cat": _cat,
    "embedding": _embedding,
    **{op: _view for op in ("getitem", "slice", "narrow", "unsqueeze", "squeeze", "view", "reshape", "expand")},
    **{op: _permute for op in ("permute", "transpose", "t", "movedim")},
}
