"""The backward kernel of a cluster: its gradients as torch code, captured and planned like a forward.

`codegen.backward` writes the cluster's gradients as torch code; here that code is run on meta
tensors under the same capture that records a model's forward, and the graph it records is
planned and emitted as one kernel by the same code generator.  What comes back is the text the
kernel module adds for the cluster: the backward reference, the backward kernel and its launcher,
and the autograd registration that ties them to the forward op.  When the gradients cannot be
one kernel (an op without a derivative, a reduction down the rows), the cluster still trains:
its forward falls back to the reference under autograd, and `reason` says why.
"""

from __future__ import annotations

import importlib.util
import linecache
import os
import sys
import tempfile
from dataclasses import dataclass

import torch

from fuselens.analysis import capture
from fuselens.analysis.cost import cluster_bytes
from fuselens.analysis.graph import DTYPE_BYTES, Graph, plain
from fuselens.analysis.ops import GEMMS, SOURCE, OpClass
from fuselens.codegen import backward as bw
from fuselens.codegen.emit import emit
from fuselens.codegen.lowering import dtype_tuple, tuple_display
from fuselens.codegen.plan import KernelPlan, OutputSlot, PlanError, full_rank_loads, plan_cluster, saved_counts
from fuselens.contracts.report import PASS_THROUGH_BACKWARD, TORCH_BACKWARD

_HEADER = "import math\n\nimport torch\n\n\n"


@dataclass
class Backward:
    text: str  # what the kernel module gains: reference, kernel, launcher, gradients, registration
    grads_of: list[int]  # the cluster inputs whose gradients the kernel computes
    trains: list[int]  # the inputs that may want gradients: those, and views of them
    strategy: str
    bytes_unfused: int | None  # the backward's ops, one kernel each (None without a kernel)
    bytes_fused: int | None  # the backward kernel's
    saved_fused: int  # what the kernel op keeps for the backward: the inputs and outputs its gradients read
    held: frozenset[int] = frozenset()  # the inputs whose keeping costs no memory (`held_anyway`): not counted
    sized: bool = False  # its gradients hold the reduced dims' analyzed sizes (`BackwardText.sized`)


class NoBackwardKernel(Exception):
    """Why a cluster's gradients are not one kernel."""


def backward_for(graph: Graph, plan: KernelPlan, name: str, params: list[str], number_params: list[str]) -> Backward:
    """The backward of the cluster `name`, whose forward takes `params` then `number_params`."""
    try:
        text = bw.backward_text(graph, plan, name, params, number_params, bw.needs_grad(graph))
    except bw.NoBackward as exc:
        raise NoBackwardKernel(str(exc)) from exc
    # Plain values: the backward kernel bakes them, and `_<name>_gradients` runs it only for them.
    numbers = [plain(slot.value) for slot in plan.scalars]
    held = held_anyway(graph, plan)
    if text.stages:
        return _in_stages(text, name, graph, plan, params, number_params, numbers, held)
    captured, names = _capture(text, name, graph, plan, params, numbers)
    members = {n.id for n in captured if n.cls.absorbable or n.cls.free}
    opaque = [n.op for n in captured if n.cls is OpClass.OPAQUE and n.op != "output"]
    computes = any(captured[m].cls.absorbable for m in members)
    if opaque and not set(opaque) <= _TORCH_SCATTERS:
        raise NoBackwardKernel(f"the gradients need {', '.join(sorted(set(opaque)))}, which no kernel here computes")
    if opaque:  # the derivatives eager autograd runs, as torch code: the forward kernel still trains
        return _without_kernel(text, name, params, plan, TORCH_BACKWARD, held)
    if not computes:
        return _without_kernel(text, name, params, plan, PASS_THROUGH_BACKWARD, held)
    try:
        bplan = plan_cluster(captured, members, backward=True)
    except PlanError as exc:
        raise NoBackwardKernel(f"the gradients are not one kernel: {exc.detail or exc.reason}") from exc
    returned = _returned(captured, bplan, names)
    _total_over_rows(bplan, plan, returned, text.grads_of)
    layout_of = _layout_of(bplan, plan, returned, text.grads_of)
    bplan.grad_layout = layout_of is not None
    kernel_inputs = [captured[slot.node].name for slot in bplan.inputs]
    emitted = emit(bplan, f"{name}_backward", kernel_inputs, [f"d{k}" for k in range(len(bplan.outputs))], "", {}, None)
    gradients = bw.gradients_text(name, params, number_params, text, bplan, kernel_inputs, returned, layout_of)
    registration = bw.registration_text(
        name, len(params), text, layouts=layout_of is not None, constants=_constants(plan)
    )
    body = "\n\n\n".join([text.text, emitted.kernels, emitted.launcher, gradients, registration])
    unfused, fused = _traffic(captured, bplan)
    saved = _kept_bytes(plan, text, held)
    return Backward(
        body,
        text.grads_of,
        sorted([*text.grads_of, *text.folded]),
        emitted.strategy,
        unfused,
        fused,
        saved,
        held,
        text.sized,
    )


# Ops whose eager backward keeps their tensor inputs (a GEMM's input for its weight's gradient, a
# norm's for its own): a value one of them also reads is kept for the backward whatever the cluster does.
_KEEP_THEIR_INPUTS = GEMMS | {"conv1d", "conv2d", "conv3d", "layer_norm", "rms_norm", "group_norm", "batch_norm"}


def held_anyway(graph: Graph, plan: KernelPlan) -> frozenset[int]:
    """The cluster's inputs (positions) that its backward keeping them adds nothing to memory: the
    model's parameters, buffers and constants, which live as long as the model (an embedding's table),
    and values that an op outside the cluster also keeps for its own backward (a residual stream that
    the next block's projections read), directly or through views."""
    members = set(plan.members)

    def kept_elsewhere(node: int) -> bool:
        return any(graph[u].op in _KEEP_THEIR_INPUTS for u in _readers(graph, node) if u not in members)

    return frozenset(
        k
        for k, slot in enumerate(plan.inputs)
        if _lives_with_the_model(graph, slot.node) or kept_elsewhere(_base_of(graph, slot.node))
    )


def _base_of(graph: Graph, node: int) -> int:
    """The value a chain of views reads (`weight.t()`'s weight)."""
    while graph[node].cls is OpClass.VIEW and graph[node].inputs:
        node = graph[node].inputs[0]
    return node


def _lives_with_the_model(graph: Graph, node: int) -> bool:
    """A parameter, buffer or constant (or a view of one), as opposed to the model's input or a value it computes."""
    source = graph[_base_of(graph, node)]
    return source.op in SOURCE and source.op != "input"


def _readers(graph: Graph, node: int) -> list[int]:
    """The ops that read `node`'s value: its users, and the users of its views."""
    found, todo = [], list(graph.users(node))
    while todo:
        user = todo.pop()
        if graph[user].cls is OpClass.VIEW:
            todo += graph.users(user)
        else:
            found.append(user)
    return found


def _kept_bytes(plan: KernelPlan, text: bw.BackwardText, held: frozenset[int]) -> int:
    """What the cluster's op keeps for the backward that would not be kept otherwise: the inputs and
    outputs its gradients read, but for the inputs `held` anyway."""
    inputs = sum(
        _bytes(slot.shape, slot.dtype) for k, slot in enumerate(plan.inputs) if k in text.keeps and k not in held
    )
    return inputs + sum(_bytes(out.shape, out.dtype) for k, out in enumerate(plan.outputs) if k in text.keeps_results)


def _constants(plan: KernelPlan) -> dict[int, object]:
    """The cluster's numbers its kernels bake in (position -> value): its op is not passed them."""
    return {k: plain(slot.value) for k, slot in enumerate(plan.scalars) if not slot.runtime}


def _in_stages(
    text: bw.BackwardText,
    name: str,
    graph: Graph,
    plan: KernelPlan,
    params: list[str],
    number_params: list[str],
    numbers: list,
    held: frozenset[int],
) -> Backward:
    """A backward of several kernels with torch code before and between them (`text.prelude`,
    `text.stages`: a group norm's): each kernel captured and planned as a whole backward is, and
    `_<name>_gradients` runs them in turn, their small results through the torch code."""
    stages = [*text.stages, *([text.last] if text.last else [])]
    kernels = [_stage_kernel(text, stage, name, graph, plan, params, numbers, len(stages)) for stage in stages]
    calls: list[str] = [line.strip() for line in text.prelude]
    returned = list(text.returned)
    for stage, kernel in zip(stages, kernels, strict=True):
        calls.append(kernel.call)
        if stage is text.last:
            by_name = dict(zip(stage.returns, kernel.given, strict=True))
            returned = [by_name.get(r, r) for r in text.returned]
        else:
            calls += [f"{r} = {g}" for r, g in zip(stage.returns, kernel.given, strict=True)]
        calls += [line.strip() for line in stage.glue]
    # The first kernel takes the cluster's own tensors (and the torch code's, which are left out of the
    # check: they are computed once it passes): it decides for them all.
    checks = [kernels[0].runs] + [c for k in kernels for c in k.baked]
    signature = params + number_params + text.result_params + text.grad_params
    gradients = "\n".join(
        [
            f"def _{name}_gradients({', '.join(signature)}):",
            f'    """The gradients of {name}\'s inputs {", ".join(params[k] for k in text.grads_of)}: '
            f'{len(stages)} kernels where they run, else the backward reference."""',
            f"    if {' and '.join(checks)}:",
            *[f"        {line}" for line in calls],
            f"        return {', '.join(returned)},",
            f"    return _{name}_backward_reference({', '.join(signature)})",
        ]
    )
    registration = bw.registration_text(name, len(params), text, constants=_constants(plan))
    return Backward(
        "\n\n\n".join([text.text, *(k.text for k in kernels), gradients, registration]),
        text.grads_of,
        sorted([*text.grads_of, *text.folded]),
        " + ".join(k.strategy for k in kernels),
        sum(k.traffic[0] for k in kernels),
        sum(k.traffic[1] for k in kernels),
        _kept_bytes(plan, text, held),
        held,
        text.sized,
    )


@dataclass
class _StageKernel:
    text: str  # the kernel and its launcher
    strategy: str
    traffic: tuple[int, int]  # (unfused, fused) bytes
    runs: str  # whether it runs on the tensors it is given (`_kernel_runs`)
    baked: list[str]  # the numbers it bakes in, each held to its value
    call: str  # its launch in `_<name>_gradients`, into `raws`
    given: list[str]  # each of the stage's returns, as `raws` holds it


def _stage_kernel(
    text: bw.BackwardText,
    stage: bw.Stage,
    name: str,
    graph: Graph,
    plan: KernelPlan,
    params: list[str],
    numbers: list,
    count: int,
) -> _StageKernel:
    """One kernel of a backward in stages (`count` of them), from its function's captured graph."""
    captured, names = _capture(text, name, graph, plan, params, numbers, stage)
    members = {n.id for n in captured if n.cls.absorbable or n.cls.free}
    opaque = sorted({n.op for n in captured if n.cls is OpClass.OPAQUE and n.op != "output"})
    if opaque:
        raise NoBackwardKernel(f"the gradients need {', '.join(opaque)}, which no kernel here computes")
    try:
        bplan = plan_cluster(captured, members, backward=True)
    except PlanError as exc:
        raise NoBackwardKernel(f"the gradients are not {count} kernels: {exc.detail or exc.reason}") from exc
    kernel = f"{name}_backward_{stage.suffix}"
    inputs = [captured[slot.node].name for slot in bplan.inputs]
    emitted = emit(bplan, kernel, inputs, [f"d{k}" for k in range(len(bplan.outputs))], "", {}, None)
    passed = inputs + [s.text for s in bplan.scalars if s.runtime]
    own = [(x, slot.dtype) for x, slot in zip(inputs, bplan.inputs, strict=True) if x not in stage.extras]
    return _StageKernel(
        "\n\n\n".join([emitted.kernels, emitted.launcher]),
        emitted.strategy,
        _traffic(captured, bplan),
        f"_kernel_runs({tuple_display([x for x, _ in own])}, {dtype_tuple([d for _, d in own])})",
        [f"{s.text} == {s.value!r}" for s in bplan.scalars if not s.runtime],
        f"raws = _{kernel}_op({', '.join(passed)})" + ("" if len(bplan.outputs) > 1 else ","),
        _returned(captured, bplan, names),
    )


# Ops of gradients no kernel here writes, which torch runs as eager autograd does: an embedding's
# table's (its lookups' gradients, summed to the lookups' size, added into the table at the ids).
_TORCH_SCATTERS = frozenset({"embedding_dense_backward", "sum_to_size"})


def _without_kernel(
    text: bw.BackwardText, name: str, params: list[str], plan: KernelPlan, strategy: str, held: frozenset[int]
) -> Backward:
    """The backward of a cluster whose gradients need no kernel: its outputs' gradients as they are
    (a residual sum's, a bias's summed over the rows by `_fit`: PASS_THROUGH_BACKWARD), or those
    scattered into an embedding's table by torch (TORCH_BACKWARD).  The backward reference is the
    op's autograd formula."""
    registration = bw.registration_text(
        name, len(params), text, f"_{name}_backward_reference", constants=_constants(plan)
    )
    return Backward(
        "\n\n\n".join([text.text, registration]),
        text.grads_of,
        sorted([*text.grads_of, *text.folded]),
        strategy,
        None,
        None,
        _kept_bytes(plan, text, held),
        held,
        text.sized,
    )


def saved_by_autograd(
    reference: str, name: str, plan: KernelPlan, trains: list[int], held: frozenset[int] = frozenset()
) -> int | None:
    """What eager autograd keeps for the backward of the cluster's reference (`reference`, the text
    of `_<name>_reference`), run on meta tensors with the inputs `trains` wanting gradients: the
    bytes of the distinct tensors its ops save, views counted as their base, but for the inputs
    `held` anyway (as the fused op's figure leaves them out)."""
    namespace: dict = {"torch": torch, "math": __import__("math")}
    try:
        exec(compile(reference, f"<{name} reference>", "exec"), namespace)  # our generated text, not a file's
    except SyntaxError:
        return None
    function = namespace[f"_{name}_reference"]
    inputs = [
        torch.empty(slot.shape, dtype=getattr(torch, slot.dtype), device="meta").requires_grad_(k in trains)
        for k, slot in enumerate(plan.inputs)
    ]
    saved: dict[int, int] = {}
    free = {id(inputs[k]) for k in held}

    def keep(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if id(base) not in free:
            saved[id(base)] = base.numel() * base.element_size()
        return t

    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            function(*inputs, *[plain(slot.value) for slot in plan.scalars])
    except Exception:  # a reference that does not run on meta tensors: no figure, not a failure
        return None
    return sum(saved.values())


def _traffic(graph: Graph, plan: KernelPlan) -> tuple[int, int]:
    """(the backward's ops one kernel each, the backward kernel) in bytes; an output summed over the
    rows is written as its partial sums, a few float32 rows, not full-size."""
    totals = [o for o in plan.outputs if o.col_total]
    unfused, fused = cluster_bytes(
        graph, plan.compute, [s.node for s in plan.inputs], [o.node for o in plan.outputs if not o.col_total]
    )
    columns = 1
    for size in plan.domain[plan.row_dims :]:
        columns *= size
    return unfused, fused + 4 * columns * len(totals)


def _bytes(shape, dtype: str) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * DTYPE_BYTES.get(dtype, 4)


def _capture(
    text: bw.BackwardText,
    name: str,
    graph: Graph,
    plan: KernelPlan,
    params: list[str],
    numbers: list,
    stage: bw.Stage | None = None,
) -> tuple[Graph, list[str]]:
    """The graph the backward reference (or one `stage` of it) records on meta tensors shaped as the
    cluster's inputs and outputs (the gradients), with the model's numbers as the trace had them."""
    code, function = (text.text, "reference") if stage is None else (stage.text, stage.suffix)
    extras = [] if stage is None else stage.extras
    # The capture maps ops to lines of real files, so the code goes to one, removed once traced.
    with tempfile.TemporaryDirectory(prefix="fuselens-backward-") as folder:
        path = os.path.join(folder, f"{name}_backward.py")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(_HEADER + code + "\n")
        try:
            names = params + text.result_params + text.grad_params + extras
            return _traced(path, folder, name, function, graph, plan, names, len(params), numbers, len(extras))
        finally:
            linecache.checkcache(path)


def _traced(
    path: str,
    folder: str,
    name: str,
    function_name: str,
    graph: Graph,
    plan: KernelPlan,
    names: list[str],
    params: int,
    numbers: list,
    extras: int,
) -> tuple[Graph, list[str]]:
    """`_capture` once the code is in `path`: the first `params` names are the cluster's inputs, the
    last `extras` the torch code's values between kernels, float32 [N, C, 1, ...] (one number a
    sample and channel)."""
    spec = importlib.util.spec_from_file_location(f"fuselens_backward_{name}_{id(path)}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    function = getattr(module, f"_{name}_backward_{function_name}")
    tensors = [_meta(slot.shape, _strides(graph, slot.node), slot.dtype) for slot in plan.inputs]
    results = [_meta(shape, None, dtype) for shape, dtype in _op_outputs(plan)]
    grads = [_meta(shape, None, dtype) for shape, dtype in _op_outputs(plan)]
    per_channel = tuple(plan.domain[:2]) + (1,) * (len(plan.domain) - 2)
    grads += [_meta(per_channel, None, "float32") for _ in range(extras)]

    class _Gradients(torch.nn.Module):
        def forward(self, *values):
            return function(*values[:params], *numbers, *values[params:])

    try:
        traced = capture.trace(_Gradients(), tensors + results + grads, names, capture.UserCode(roots=(folder,)))
    except capture.CaptureError as exc:
        raise NoBackwardKernel(f"the gradients' code failed on the cluster's shapes: {exc}") from exc
    finally:
        sys.modules.pop(spec.name, None)
    if not traced.complete:
        raise NoBackwardKernel("the gradients' code reads a value")
    for node in traced.graph:  # lines of a temporary file: the kernel's comments name the ops alone
        node.source, node.stack = None, ()
    return traced.graph, names


def _op_outputs(plan: KernelPlan) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of each tensor the cluster's op returns: its outputs (a loss over the rows as
    its total), then the counts of targets its backward keeps (`saved_counts`)."""
    outputs = [((), out.total.dtype) if out.total else (out.shape, out.dtype) for out in plan.outputs]
    return outputs + [((), "int64") for _ in saved_counts(plan)]


def _strides(graph: Graph, node: int) -> tuple[int, ...] | None:
    meta = graph[node].meta
    return meta.stride if meta is not None else None


def _meta(shape, strides, dtype: str) -> torch.Tensor:
    t = torch.empty(tuple(shape), dtype=getattr(torch, dtype), device="meta")
    return t if strides is None else t.as_strided(tuple(shape), tuple(strides))


def _written(backward: KernelPlan, returned: list[str], grads_of: list[int]) -> list[tuple[OutputSlot, int]]:
    """(the kernel's output, the forward input it is the gradient of) for each gradient the backward
    kernel writes (`raws[k]`, as `_returned` names them), not one passed on as it is."""
    return [
        (backward.outputs[int(value[5:-1])], k)
        for value, k in zip(returned, grads_of, strict=True)
        if value.startswith("raws[")
    ]


def _total_over_rows(backward: KernelPlan, forward: KernelPlan, returned: list[str], grads_of: list[int]) -> None:
    """Mark the backward row kernel's outputs that are gradients of inputs one row wide (a norm's
    weight, [C] read by every row): the kernel sums them over the rows instead of writing each row's."""
    if backward.kind == "elementwise" or backward.groups or not backward.row_dims:
        return
    columns = 1
    for size in backward.domain[backward.row_dims :]:
        columns *= size
    for out, k in _written(backward, returned, grads_of):
        size = 1
        for d in forward.inputs[k].shape:
            size *= d
        if size == columns and tuple(out.shape) == tuple(backward.domain) and not out.row_only:
            out.col_total = True


def _layout_of(backward: KernelPlan, forward: KernelPlan, returned: list[str], grads_of: list[int]) -> int | None:
    """The forward input whose layout an elementwise backward kernel's outputs take: the first whose
    gradient the kernel writes at the input's own shape.  Written in the upstream gradient's layout
    instead, the gradient of a transposed view (RoPE's q, a projection's output viewed as heads, with
    the gradient from attention's matmul row-major) is copied back into the projection's order by
    autograd's view of it: two such copies a layer in a Llama block's training step."""
    if backward.kind != "elementwise" or full_rank_loads(backward) or any(o.contiguous for o in backward.outputs):
        return None
    for out, k in _written(backward, returned, grads_of):
        whole = not (out.row_only or out.col_total or out.dims is not None)
        if whole and tuple(forward.inputs[k].shape) == tuple(backward.domain) == tuple(out.shape):
            return k
    return None


def _returned(graph: Graph, plan: KernelPlan, names: list[str]) -> list[str]:
    """Each value the backward reference returns, as the gradients function names it: `raws[k]` for
    the kernel's k-th output, or the name of an input it returns as it is (the gradient of an add is
    the output's)."""
    (output,) = [n for n in graph if n.op == "output"]
    outs = [o.node for o in plan.outputs]
    returned = []
    for ref in output.refs:
        if ref.node in outs:
            returned.append(f"raws[{outs.index(ref.node)}]")
        else:
            root = graph[graph.view_root(ref.node)]
            if root.op != "input" or root.id != ref.node:
                raise NoBackwardKernel("a gradient is a view of an input")
            returned.append(root.name)
    return returned
