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
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from fuselens.analysis.graph import Graph, Node, Ref, is_named, plain
from fuselens.analysis.ops import OpClass

from .lowering import dtype_tuple, tuple_display
from .plan import KernelPlan, reduced_dims, saved_counts
from .reference import forward_lines


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
    body, names = forward_lines(graph, plan, params, number_params, given)
    grads = _fresh([f"grad{k}" for k in range(returned_by_op)], params + number_params)
    numbers = {id(slot.value): p for slot, p in zip(plan.scalars, number_params, strict=True)}
    staging = _group_staging(graph, plan, body, names, grads, numbers, saved) if plan.groups else None
    writer = _Writer(graph, plan, names, numbers, saved=saved, staging=staging)
    for k, out in enumerate(plan.outputs):
        if out.saved is None:
            writer.add(out.node, grads[k])
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
    read = _names_in(statements + returned)
    keeps = [k for k, p in enumerate(params) if p in read]
    keeps_results = [k for k, r in enumerate(results) if r in read]
    lines = [
        f"def _{name}_backward_reference({', '.join(params + number_params + results + grads)}):",
        f'    """The gradients of {", ".join(params[k] for k in grads_of)} from those of the outputs: the '
        'forward recomputed where they need it, then each op\'s derivative."""',
        *statements,
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


_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def _names_in(texts: list[str]) -> set[str]:
    return {m for t in texts for m in _NAME.findall(t)}


def _live(statements: list[str], returned: list[str]) -> list[str]:
    """The statements (`    name = expression`) that the returned values need, in order: the
    forward's values no derivative reads are not recomputed (RoPE's gradient never reads q * cos),
    and the inputs only they read need not be kept for the backward."""
    live = _names_in(returned)
    kept = []
    for line in reversed(statements):
        target, expression = _assignment(line)
        if target in live:
            kept.append(line)
            live.discard(target)
            live |= _names_in([expression])
    return kept[::-1]


def _assignment(line: str) -> tuple[str, str]:
    """(target, expression) of a statement `    name = expression`."""
    target, expression = line.strip().split(" = ", 1)
    return target, expression


@dataclass
class _Staging:
    """A group norm's backward in two kernels (`_group_norm`): with the group statistics the forward
    kept, the sums of the gradient and of the gradient times the input over each channel (`sums`);
    and the input gradient, which with those sums is elementwise.  Before and between them, torch
    code over [N, C] values (`glue`: the statements it assigns) turns groups into channels and
    channels into groups."""

    xf: str  # the group norm's input in float32
    mean: str  # the group's mean, one value a (sample, channel), [N, C, 1, ...]
    rstd: str  # its reciprocal standard deviation
    count: str  # the elements of a channel: an expression over a gradient's shape
    sums: list[str] = field(default_factory=list)
    glue: set[str] = field(default_factory=set)


def _group_staging(
    graph: Graph,
    plan: KernelPlan,
    body: list[str],
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
    xv = names[x.node]
    xf = xv if meta.dtype in ("float32", "float64") else f"{xv}.float()"

    def operand(arg) -> str:
        return names[arg.node] if isinstance(arg, Ref) else "None"

    # The norm's output stays in float32, as the forward kernel keeps it for what follows in the cluster.
    y = f"{v}x * {v}scale + {v}shift"
    grad = grads[domain[0]]  # of the norm's shape
    kept = f"{saved[(gn.id, 'mean')]}, {saved[(gn.id, 'rstd')]}"
    lines = [
        f"    {v}x = {xf}",
        f"    {v}t = _group_statistics({kept}, {operand(weight)}, {operand(bias)}, {grad}.shape)",
        f"    {v}scale = {v}t[0]",
        f"    {v}shift = {v}t[1]",
        f"    {v}mean = {v}t[2]",
        f"    {v}rstd = {v}t[3]",
        f"    {v} = {y}",
    ]
    at = next(k for k, line in enumerate(body) if line.startswith(f"    {v} = "))
    body[at : at + 1] = lines
    staging = _Staging(f"{v}x", f"{v}mean", f"{v}rstd", f"{grad}[0, 0].numel()")
    staging.glue |= {f"{v}t", f"{v}scale", f"{v}shift", f"{v}mean", f"{v}rstd"}
    return staging


def _split_stages(
    text: BackwardText, staging: _Staging, name: str, signature: list[str], statements: list[str], returned: list[str]
) -> None:
    """The backward reference's statements as kernels (`text.stages`, `text.last`) and the torch code
    before and between them (`text.prelude`, each stage's `glue`): each kernel's statements are the
    ones its results need, and what the torch code computed is passed to it.  Torch code is what the staging names, and any statement that reads
    only its values (a weight's gradient cast to the weight's dtype)."""
    if not staging.sums:
        raise NoBackward("a group norm whose gradient does not reach its input")
    assigned = [_assignment(s) for s in statements]
    targets = [target for target, _ in assigned]
    glue = set(staging.glue)
    for target, expression in assigned:
        read = _names_in([expression]) & set(targets)
        if read and read <= glue:
            glue.add(target)
    kernel_lines = [s for t, s in zip(targets, statements, strict=True) if t not in glue]
    # The torch code before the sums (over the statistics the forward kept), and the rest, after them
    # (what reads them).
    after_sums: list[str] = []
    before_sums: list[str] = []
    later = set(staging.sums)
    for (target, expression), statement in zip(assigned, statements, strict=True):
        if target in glue:
            on_sums = bool(_names_in([expression]) & later)
            (after_sums if on_sums else before_sums).append(statement)
            if on_sums:
                later.add(target)
    order = {t: k for k, t in enumerate(targets)}

    def stage(suffix: str, returns: list[str], glue_after: list[str]) -> Stage:
        body = _live(kernel_lines, returns)
        extras = sorted(_names_in(body + returns) & glue, key=order.__getitem__)
        lines = [
            f"def _{name}_backward_{suffix}({', '.join(signature + extras)}):",
            f'    """A kernel of {name}\'s backward: {", ".join(returns)}."""',
            *body,
            f"    return {', '.join(returns)}" + ("," if len(returns) == 1 else ""),
        ]
        return Stage(suffix, "\n".join(lines), extras, returns, glue_after)

    text.prelude = before_sums
    text.stages = [stage("sums", staging.sums, after_sums)]
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


def spelled(value, numbers: dict[int, str], kind: type | None = None) -> str:
    """A number an op took, as the gradients' code writes it: for one of the model's state (`eps`, a
    head width's scale), the parameter the cluster's functions take it as (`numbers`: its id -> the
    parameter), so the gradients compute with the value the forward ran with, never the analyzed
    one; any other as its literal (`kind` converts it first: an int bound written as a float)."""
    if is_named(value) and id(value) in numbers:
        return numbers[id(value)]
    value = plain(value)
    if kind is not None:
        value = kind(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise NoBackward("a derivative through a non-finite constant")
    return repr(value)


@dataclass
class _Writer:
    graph: Graph
    plan: KernelPlan
    names: dict[int, str]  # node -> its name in the recomputed forward
    numbers: dict[int, str]  # a number of the model's state (by id) -> its parameter (`spelled`)
    adjoint: dict[int, str] = field(default_factory=dict)  # node -> the variable holding its gradient
    lines: list[str] = field(default_factory=list)
    slices: dict[int, list[tuple[int, int, Node]]] = field(default_factory=dict)  # input -> (dim, start, view)
    leads: dict[int, int] = field(default_factory=dict)  # input -> where it runs along the domain (`BackwardText`)
    at: Node | None = None  # the op whose derivative is being written: its contributions have its shape
    # What the forward kept for the backward (`OutputSlot.saved`): (node, "lse" | "mean" | "rstd" |
    # "count") -> its parameter.
    saved: dict[tuple[int, str], str] = field(default_factory=dict)
    # Nodes whose gradient's row sum is known without summing it (a pick's: the picked gradient).
    row_totals: dict[int, str] = field(default_factory=dict)
    # Gradients (their variables) whose sum over a group norm's spatial dims is known from the sums its
    # backward reduces anyway (`_group_norm`): what writes that sum, [N, C, 1, ...], on first use.
    spatial_totals: dict[str, Callable[[], str]] = field(default_factory=dict)
    spatial_dims: list[int] = field(default_factory=list)  # those dims
    staging: _Staging | None = None  # a group norm's backward in stages
    sized: bool = False  # a derivative was written with a reduced dim's analyzed size (`BackwardText.sized`)

    def value(self, arg) -> str:
        """An operand as the recomputed forward names it, or a number as `spelled`."""
        if isinstance(arg, Ref):
            return self.names[arg.node]
        return self.number(arg)

    def number(self, value, kind: type | None = None) -> str:
        return spelled(value, self.numbers, kind)

    def dtype(self, arg) -> str:
        """The dtype of an operand's value (a number's: float32, as a kernel computes it)."""
        if isinstance(arg, Ref):
            meta = self.graph[arg.node].meta
            return meta.dtype if meta is not None else "float32"
        return "float32"

    def wide(self, text: str, dtype: str) -> str:
        """`text` (of `dtype`) in float32, as torch's own backward formulas compute narrow dtypes."""
        return text if dtype in ("float32", "float64") else f"{text}.float()"

    def narrow(self, text: str, dtype: str, like: str, like_dtype: str) -> str:
        """`text` (of `dtype`) in `like`'s dtype, `like_dtype`: no cast where they are the same (a cast
        to the same dtype would be a view of the kernel's value, not a value of its own).  The dtype is
        written out, not read from `like`, so the backward keeps no value alive only for its dtype:
        the op runs, and so its backward, only for the dtypes the kernel was generated for."""
        del like
        same = dtype == like_dtype or (dtype == "float32" and like_dtype == "float64")
        return text if same else f"({text}).to(torch.{like_dtype})"

    def grad(self, node: Node) -> str:
        return self.adjoint[node.id]

    def let(self, text: str) -> str:
        """A fresh variable holding `text`."""
        name = f"d{len(self.lines)}"
        self.lines.append(f"    {name} = {text}")
        return name

    def add(self, node_id: int, text: str) -> None:
        """Accumulate `text` into `node_id`'s gradient."""
        if node_id in self.adjoint:
            self.row_totals.pop(node_id, None)  # a sum of contributions: its row sum is no longer known
            self.spatial_totals.pop(f"g{node_id}", None)  # (nor its spatial sum)
            self.lines.append(f"    g{node_id} = {self.adjoint[node_id]} + {text}")
        else:
            self.lines.append(f"    g{node_id} = {text}")
            if text in self.spatial_totals:  # passed on as it is: its spatial sum is the same
                self.spatial_totals[f"g{node_id}"] = self.spatial_totals[text]
        self.adjoint[node_id] = f"g{node_id}"

    def to(self, arg, text: str, over_row: bool = True) -> None:
        """A contribution `text` to operand `arg`'s gradient (a number has none).  Where the operand
        is smaller than the contribution along row dims (a per-row scale), it is summed along them."""
        if not isinstance(arg, Ref):
            return
        node = self.graph[arg.node]
        if node.meta is None or not _floating(node.meta.dtype):
            return
        if text in self.spatial_totals and self._broadcast_over_spatial(node):
            # Only its sum over those dims reaches it: the one the group norm's sums give, no full-size
            # value (a convolution's bias, a time embedding added before a GroupNorm).
            self.add(arg.node, self.spatial_totals[text]())
            return
        reduced = self._row_dims_reduced(node) if over_row else []
        if reduced:
            text = f"({text}).sum(dim={reduced}, keepdim=True)"
        self.add(arg.node, text)

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
    w.to(b, f"(-{_times_alpha(w, node, g)})")


def _times_alpha(w: _Writer, node: Node, g: str) -> str:
    """`g` times the `alpha` of `add(a, b, alpha=...)` (b's factor); `g` itself for a literal 1."""
    alpha = node.params.get("alpha", 1)
    return g if alpha == 1 and not is_named(alpha) else f"({g} * {w.number(alpha)})"


def _mul(w: _Writer, node: Node) -> None:
    a, b = _operands(node)[:2]
    g = w.grad(node)
    w.to(a, f"{g} * {w.value(b)}")
    w.to(b, f"{g} * {w.value(a)}")


def _div(w: _Writer, node: Node) -> None:
    a, b = _operands(node)[:2]
    if node.params.get("rounding_mode"):
        raise NoBackward("`div` with a rounding mode")
    g = w.grad(node)
    w.to(a, f"{g} / {w.value(b)}")
    if isinstance(b, Ref):
        w.to(b, f"(-{g}) * {w.names[node.id]} / {w.value(b)}")


def _pow(w: _Writer, node: Node) -> None:
    base, exponent = _operands(node)[:2]
    if isinstance(exponent, Ref) or not isinstance(base, Ref):
        raise NoBackward("`pow` with a tensor exponent")
    g, x = w.grad(node), w.value(base)
    if is_named(exponent):  # the model's, passed by the caller: written for any value, not the analyzed one's
        p = w.number(exponent)
        w.to(base, f"{g} * {p} * {x}.pow({p} - 1)")
    elif exponent == 2:
        w.to(base, f"{g} * 2.0 * {x}")
    elif exponent != 0:
        w.to(base, f"{g} * {float(exponent)!r} * {x}.pow({float(exponent) - 1!r})")


def _unary(derivative: str):
    """A rule for y = f(x) whose derivative is `derivative`, written in x and y (the op's output)."""

    def rule(w: _Writer, node: Node) -> None:
        x = _operands(node)[0]
        local = derivative.format(x=w.value(x), y=w.names[node.id])
        w.to(x, f"{w.grad(node)} * ({local})")

    return rule


def _neg(w: _Writer, node: Node) -> None:
    w.to(_operands(node)[0], f"(-{w.grad(node)})")


def _pass_through(w: _Writer, node: Node) -> None:
    """An op whose gradient is its output's: identities (eval-mode dropout, clone, contiguous)."""
    w.to(_operands(node)[0], w.grad(node), over_row=False)


def _cast(w: _Writer, node: Node) -> None:
    x = _operands(node)[0]
    w.to(x, w.narrow(w.grad(node), w.dtype(Ref(node.id)), w.value(x), w.dtype(x)), over_row=False)


def _activation(w: _Writer, node: Node, local: str) -> None:
    """The gradient through an activation whose derivative `local` is in float32 (as torch's own
    silu and gelu backward compute it in every dtype), in the output's dtype."""
    g, d = w.grad(node), w.dtype(Ref(node.id))
    w.to(_operands(node)[0], w.narrow(f"{w.wide(g, d)} * ({local})", "float32", g, d))


def _silu(w: _Writer, node: Node) -> None:
    x = _operands(node)[0]
    xf = w.let(w.wide(w.value(x), w.dtype(x)))
    s = w.let(f"torch.sigmoid({xf})")
    _activation(w, node, f"{s} * (1.0 + {xf} * (1.0 - {s}))")


def _gelu(w: _Writer, node: Node) -> None:
    x = w.let(w.wide(w.value(_operands(node)[0]), w.dtype(_operands(node)[0])))
    if node.params.get("approximate", "none") == "tanh":
        k = math.sqrt(2.0 / math.pi)
        inner = w.let(f"{k!r} * ({x} + 0.044715 * {x} * {x} * {x})")
        t = w.let(f"torch.tanh({inner})")
        local = f"0.5 * (1.0 + {t}) + 0.5 * {x} * (1.0 - {t} * {t}) * {k!r} * (1.0 + 0.134145 * {x} * {x})"
    else:
        cdf = f"0.5 * (1.0 + torch.erf({x} * {1 / math.sqrt(2.0)!r}))"
        local = f"{cdf} + {x} * torch.exp(-0.5 * {x} * {x}) * {1 / math.sqrt(2.0 * math.pi)!r}"
    _activation(w, node, local)


def _relu(w: _Writer, node: Node) -> None:
    w.to(_operands(node)[0], f"torch.where({w.names[node.id]} > 0, {w.grad(node)}, 0.0)")


def _where(w: _Writer, node: Node) -> None:
    cond, a, b = _operands(node)[:3]
    g = w.grad(node)
    c = w.value(cond)
    w.to(a, f"torch.where({c}, {g}, 0.0)")
    w.to(b, f"torch.where({c}, 0.0, {g})")


def _masked_fill(w: _Writer, node: Node) -> None:
    x, mask = _operands(node)[:2]
    w.to(x, f"{w.grad(node)}.masked_fill({w.value(mask)}, 0.0)")


def _reduced(node: Node, g: str) -> str:
    """`g`, a reduction's gradient, with the dims it removed put back (keepdim=False)."""
    if node.params.get("keepdim", False):
        return g
    dims = sorted(node.params.get("dims", []))
    return f"{g}[{', '.join('None' if d in dims else ':' for d in range(max(dims) + 1))}]"


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
    w.to(x, f"{_reduced(node, w.grad(node))} * {1.0 / n!r}", over_row=False)


def _last_dims(node: Node) -> list[int]:
    return node.params.get("dims", [-1])


def _softmax(w: _Writer, node: Node) -> None:
    y, g, dims = w.names[node.id], w.grad(node), _last_dims(node)
    total = w.let(f"({g} * {y}).sum(dim={dims}, keepdim=True)")
    w.to(_operands(node)[0], f"{y} * ({g} - {total})", over_row=False)


def _log_softmax(w: _Writer, node: Node) -> None:
    """g - softmax * (g summed over the row).  Where the forward kept the row's log-sum-exp (the
    log-probabilities are only picked from), the softmax comes from it, and a pick's gradient
    brings its own row sum (`_pick`): one pass over the logits."""
    x, g, dims = _operands(node)[0], w.grad(node), _last_dims(node)
    total = w.row_totals.get(node.id) or w.let(f"{g}.sum(dim={dims}, keepdim=True)")
    lse = w.saved.get((node.id, "lse"))
    if lse is None:
        w.to(x, f"{g} - torch.exp({w.names[node.id]}) * {total}", over_row=False)
        return
    p = _softmax_from(w, x, lse)
    w.to(x, w.narrow(f"{g} - {p} * {total}", "float32", w.value(x), w.dtype(x)), over_row=False)


def _softmax_from(w: _Writer, x: Ref, lse: str) -> str:
    """The softmax of the logits `x` over their rows, in float32, from the row log-sum-exp `lse` the
    forward kept: one elementwise pass, no reduction."""
    return w.let(f"torch.exp({w.wide(w.value(x), w.dtype(x))} - {lse}.unsqueeze(-1))")


def _pick(w: _Writer, node: Node) -> None:
    """A gather of one element per row (a loss picking the target's log-probability): the gradient
    is the picked one at the index and 0 elsewhere, a one-hot; its row sum is the picked gradient."""
    x, index = _operands(node)[:2]
    classes, g = _shape(w.graph[x.node])[-1], w.grad(node)
    w.sized = True  # the class count is the analyzed one's: a call with gradients must have it
    hot = w.let(f"torch.nn.functional.one_hot({w.value(index)}[..., 0], {classes})")
    alone = x.node not in w.adjoint
    w.to(x, f"{hot} * {g}", over_row=False)
    if alone:
        w.row_totals[x.node] = g


def _norm(w: _Writer, node: Node, centered: bool) -> None:
    """LayerNorm (`centered`) or RMSNorm over the row: y = xhat * weight (+ bias) with
    xhat = (x - mean) * rstd, in float32 as torch computes it."""
    x, weight = _operands(node)[:2]
    dims, eps, g = node.params["dims"], w.number(node.params["eps"], float), w.grad(node)
    xv = w.value(x)
    xf = w.let(w.wide(xv, w.dtype(x)))
    # The row statistics the forward kept (`OutputSlot.saved`), one number a row: put back the
    # normalised dims; else recomputed from the row.
    kept = {
        what: f"{w.saved[(node.id, what)]}[{', '.join(['...'] + ['None'] * len(dims))}]"
        for what in ("mean", "rstd")
        if (node.id, what) in w.saved
    }
    if centered:
        xc = w.let(f"{xf} - {kept.get('mean') or f'{xf}.mean(dim={dims}, keepdim=True)'}")
        rstd = kept.get("rstd") or w.let(f"torch.rsqrt(({xc} * {xc}).mean(dim={dims}, keepdim=True) + {eps})")
    else:
        xc = xf
        rstd = kept.get("rstd") or w.let(f"torch.rsqrt(({xf} * {xf}).mean(dim={dims}, keepdim=True) + {eps})")
    xhat = w.let(f"{xc} * {rstd}")
    gf = w.let(w.wide(g, w.dtype(Ref(node.id))))
    gxhat = w.let(f"{gf} * {w.wide(w.value(weight), w.dtype(weight))}") if isinstance(weight, Ref) else gf
    inner = f"{gxhat} - {xhat} * ({gxhat} * {xhat}).mean(dim={dims}, keepdim=True)"
    if centered:
        inner = f"{gxhat} - {gxhat}.mean(dim={dims}, keepdim=True) - {xhat} * ({gxhat} * {xhat}).mean(dim={dims}, keepdim=True)"
    w.to(x, w.narrow(f"{rstd} * ({inner})", "float32", xv, w.dtype(x)), over_row=False)
    if isinstance(weight, Ref):
        w.to(weight, w.narrow(f"{gf} * {xhat}", "float32", w.value(weight), w.dtype(weight)), over_row=False)
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
    dims, eps, g = list(node.params["dims"]), float(node.params["eps"]), w.grad(node)
    ndim = len(_shape(node))
    xv = w.value(x)
    xf = w.let(w.wide(xv, w.dtype(x)))
    xc = w.let(f"{xf} - {xf}.mean(dim={dims}, keepdim=True)")
    rstd = w.let(f"torch.rsqrt(({xc} * {xc}).mean(dim={dims}, keepdim=True) + {eps!r})")
    xhat = w.let(f"{xc} * {rstd}")
    gf = w.let(w.wide(g, w.dtype(Ref(node.id))))
    gxhat = gf
    if isinstance(weight, Ref):
        gxhat = w.let(f"{gf} * {_per_channel(w.wide(w.value(weight), w.dtype(weight)), ndim)}")
    inner = (
        f"{gxhat} - {gxhat}.mean(dim={dims}, keepdim=True) - {xhat} * ({gxhat} * {xhat}).mean(dim={dims}, keepdim=True)"
    )
    w.to(x, w.narrow(f"{rstd} * ({inner})", "float32", xv, w.dtype(x)), over_row=False)
    for arg, grad in ((weight, f"({gf} * {xhat})"), (bias, gf)):
        if isinstance(arg, Ref):
            summed = f"{grad}.sum(dim={dims}, keepdim=True)"
            w.to(arg, w.narrow(summed, "float32", w.value(arg), w.dtype(arg)), over_row=False)
            w.leads[arg.node] = 1


def _per_channel(value: str, ndim: int) -> str:
    """A [C] value read along dim 1 of an `ndim`-dim tensor."""
    return value if ndim == 2 else f"{value}[:, {', '.join(['None'] * (ndim - 2))}]"


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
        w.let(f"({gf} * {s.xf}).sum(dim={dims}, keepdim=True)"),
        w.let(f"{gf}.sum(dim={dims}, keepdim=True)"),
    ]
    weight_value = w.value(weight) if isinstance(weight, Ref) else "None"
    groups = w.number(node.params["groups"], int)
    t = w.let(f"_group_coefficients({s.sums[0]}, {s.sums[1]}, {s.mean}, {s.rstd}, {weight_value}, {groups}, {s.count})")
    alpha, beta, gamma, dweight, dbias = (w.let(f"{t}[{k}]") for k in range(5))
    s.glue |= {t, alpha, beta, gamma, dweight, dbias}
    dx = f"{alpha} * {gf} + {beta} * {s.xf} + {gamma}"
    fresh = x.node not in w.adjoint
    w.to(x, w.narrow(dx, "float32", w.value(x), w.dtype(x)), over_row=False)
    if fresh:  # the input's gradient summed over a channel's pixels is known from the sums' terms
        w.spatial_dims = dims
        w.spatial_totals[w.adjoint[x.node]] = _spatial_total(w, s, dims, alpha, beta, gamma)
    if isinstance(weight, Ref):
        w.to(weight, w.narrow(dweight, "float32", w.value(weight), w.dtype(weight)), over_row=False)
    if isinstance(bias, Ref):
        w.to(bias, w.narrow(dbias, "float32", w.value(bias), w.dtype(bias)), over_row=False)


def _spatial_total(w: _Writer, s: _Staging, dims: list[int], alpha: str, beta: str, gamma: str) -> Callable[[], str]:
    """What writes, on first use, the group norm input's gradient alpha * g + beta * x + gamma summed
    over each (sample, channel)'s pixels: alpha times the gradient's sum (the sums kernel's), beta times
    the input's (one more sum in the same kernel, no more reads) and gamma times the pixels, in
    torch between the kernels.  Without it, an input added before the norm that is one value a
    (sample, channel) or a channel would have its gradient summed from a full-size one by torch."""
    made: list[str] = []

    def total() -> str:
        if not made:
            s.sums.append(w.let(f"{s.xf}.sum(dim={dims}, keepdim=True)"))
            made.append(w.let(f"{alpha} * {s.sums[1]} + {beta} * {s.sums[-1]} + {gamma} * {s.count}"))
            s.glue.add(made[0])
        return made[0]

    return total


def _cross_entropy(w: _Writer, node: Node) -> None:
    """The logits' gradient: softmax less the (smoothed) one-hot target, times each row's share of
    the upstream gradient (its own for "none", all of it for "sum", over the targets counted for
    "mean"), 0 on rows whose target is ignored.  The softmax comes from the row log-sum-exp the
    forward kept, so the gradient is one pass over the logits."""
    x, target = _operands(node)[:2]
    lse = w.saved.get((node.id, "lse"))
    if lse is None:
        raise NoBackward("a cross-entropy whose forward kept no row log-sum-exp")
    reduction, ignored = node.params["reduction"], w.number(node.params["ignore_index"], int)
    smoothing, classes = node.params["label_smoothing"], _shape(w.graph[x.node])[-1]
    w.sized = True  # the class count is the analyzed one's: a call with gradients must have it
    t, g = w.value(target), w.grad(node)
    valid = w.let(f"{t} != {ignored}")
    share = f"{g} / {w.saved[(node.id, 'count')]}" if reduction == "mean" else g
    row = w.let(f"torch.where({valid}, {share}, 0.0).unsqueeze(-1)")
    hot = w.let(f"torch.nn.functional.one_hot(torch.where({valid}, {t}, 0), {classes})")
    if is_named(smoothing):  # the model's, passed by the caller: written for any value, not the analyzed one's
        e = w.number(smoothing)
        aim = f"(1.0 - {e}) * {hot} + {e} / {classes}"
    else:
        smoothing = float(smoothing)
        aim = f"{1.0 - smoothing!r} * {hot} + {smoothing / classes!r}" if smoothing else hot
    p = _softmax_from(w, x, lse)
    w.to(x, w.narrow(f"({p} - {aim}) * {row}", "float32", w.value(x), w.dtype(x)), over_row=False)


def _cat(w: _Writer, node: Node) -> None:
    (parts,) = _operands(node)[:1]
    dim, g = node.params["dim"], w.grad(node)
    start = 0
    for part in parts:
        size = _shape(w.graph[part.node])[dim]
        index = ", ".join([":"] * dim + [f"{start}:{start + size}"])
        w.to(part, f"{g}[{index}]", over_row=False)
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
        w.to(x, f"{w.grad(node)}.reshape({w.value(x)}.shape)", over_row=False)
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
    w.add(base, f"torch.cat(({', '.join(w.adjoint[v.id] for _, _, v in pieces)},), dim={dim})")


def _bounded(w: _Writer, node: Node) -> None:
    """clamp / hardtanh: the gradient passes where the input is inside the bounds (at them too, as
    torch's own formula has it), and is zero outside."""
    x = _operands(node)[0]
    lo = node.params.get("min", node.params.get("min_val"))
    hi = node.params.get("max", node.params.get("max_val"))
    inside = " & ".join(
        [f"({w.value(x)} >= {w.number(lo, float)})" for _ in [0] if lo is not None]
        + [f"({w.value(x)} <= {w.number(hi, float)})" for _ in [0] if hi is not None]
    )
    w.to(x, f"torch.where({inside}, {w.grad(node)}, 0.0)" if inside else w.grad(node))


def _leaky_relu(w: _Writer, node: Node) -> None:
    x, slope = _operands(node)[0], w.number(node.params.get("negative_slope", 0.01), float)
    g = w.grad(node)
    w.to(x, f"torch.where({w.value(x)} > 0, {g}, {g} * {slope})")


def _abs(w: _Writer, node: Node) -> None:
    x = _operands(node)[0]
    g, v = w.grad(node), w.value(x)
    w.to(x, f"torch.where({v} > 0, {g}, torch.where({v} < 0, -{g}, 0.0))")


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
    w.to(x, f"{w.grad(node)}.permute({inverse})", over_row=False)


def _embedding(w: _Writer, node: Node) -> None:
    """The table's gradient: each looked-up row's gradient added into the table at its id, as eager
    autograd computes it (`embedding_dense_backward`); a scatter, so torch runs it, not a kernel."""
    table, ids = _operands(node)[:2]
    padding = w.number(node.params.get("padding_idx", -1), int)
    by_freq = bool(node.params.get("scale_grad_by_freq", False))
    # The lookup's gradient as large as the lookup (a position embedding is broadcast over the batch):
    # the sizes of the call's ids and table, which a kernel made at other sizes may take.
    looked_up, rows = f"tuple({w.value(ids)}.shape) + ({w.value(table)}.shape[-1],)", f"{w.value(table)}.shape[0]"
    g = f"{w.grad(node)}.sum_to_size({looked_up})"
    w.to(
        table,
        f"torch.ops.aten.embedding_dense_backward({g}, {w.value(ids)}, {rows}, {padding}, {by_freq})",
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
