"""The launcher text of a `KernelPlan`: the Python that reads sizes and strides at call time,
allocates the outputs in the inputs' layout, picks a tile and launches the kernel, then the
autograd wrapper and the public function the user's code calls.

`launcher_text` reads top to bottom as the generated `_<name>_launch` does: shape guards,
domain sizes, outputs, rows and columns, the early return, strides and magic numbers, the
launch (each kernel variant's, `variants/`), then the wrapper class and the public function.  The
names the text uses (`d<i>`, `out<k>`, `st<k>`, `R`, `C`, `G`, `dense`, `pitches`, `magic`,
`index_64`) are the launcher's locals, which each kernel's arguments (`kernel_args.KernelArgs`)
pass in the order its signature takes them; the helpers the variants' launches share are here too."""

from __future__ import annotations

from fuselens.analysis.graph import DTYPE_BYTES

from .code_buffer import CodeBuffer
from .lowering import dtype_tuple, tuple_display
from .plan import (
    KernelPlan,
    OutputSlot,
    channels_last_groups,
    full_rank_loads,
    identity_inputs,
    mergeable_row_end,
    padded_windows,
    returned_outputs,
    saved_counts,
    split_groups,
)
from .terms import Dim, literal


def launcher_text(
    plan: KernelPlan,
    name: str,
    input_names: list[str],
    number_names: list[str],
    doc: str,
    divisors: list[str],
    launch: list[str],
    reference: str | None,
    trains: list[int] | None,
) -> str:
    """The launcher text; `divisors`: the kernels' run-time divisors over the launcher's names, whose
    magic numbers it passes (see `kernel_text.Divisors`); `launch`: the lines that pick a kernel and
    launch it (the variants', `variants.Family.launch`); `reference`: the cluster's ops as torch code
    (`reference.reference_text`), which runs wherever the kernel cannot; None for a kernel the
    module calls only from its own code (a backward kernel): no reference, no public function.
    `trains`: the inputs whose gradients the cluster's backward computes, when it has one."""
    lines = _launch_function(plan, name, input_names, divisors, launch)
    if reference is None:
        return "\n".join([*lines, "", "", *_op_registration(plan, name)])
    lines += ["", "", *reference.splitlines()]
    lines += ["", "", *_op_registration(plan, name), f"_{name}_call = _kernel_call(_{name}_op, _{name}_launch)"]
    lines += ["", "", *_public_function(plan, name, input_names, number_names, doc, trains)]
    return "\n".join(lines)


# ---- _<name>_launch -----------------------------------------------------------------------


def _launch_function(
    plan: KernelPlan, name: str, input_names: list[str], divisors: list[str], launch: list[str]
) -> list[str]:
    """`_<name>_launch(inputs)`: everything from the inputs to the launched kernel and its outputs."""
    body = _shape_guards(plan, name, input_names)
    body += _domain_sizes(plan, input_names)
    body += _merge_row_end(plan, name, input_names)
    body += _memory_order(plan, input_names)
    body += _group_layout(plan, input_names)
    body += _output_allocations(plan, input_names)
    body += _target_counts(plan, input_names)
    body += _rows_and_columns(plan)
    body += _return_early(plan, input_names)
    body += _index_width(plan, input_names)
    body += _width_alignment(plan)
    body += _stride_reads(plan, input_names)
    body += magic_numbers(divisors)
    body += launch
    body.append("return " + _returns(plan))
    params = input_names + [slot.name for slot in plan.scalars if slot.runtime]
    if plan.grad_layout:
        params.append("layout")
    code = CodeBuffer([f"def _{name}_launch({', '.join(params)}):"])
    with code.indent():
        code.write(*body)
    return code.lines()


def _constant_sizes(plan: KernelPlan, input_names: list[str]) -> list[str]:
    """`x.shape[3] == 128` for every input dim the kernel reads through a fixed offset (a slice, a
    head split): those sizes are the model's own constants, baked into the kernel; with any other
    size the public function runs the reference instead."""
    return [
        f"{input_names[k]}.shape[{j}] == {slot.shape[j]}"
        for k, slot in enumerate(plan.inputs)
        for j in sorted(slot.guarded_dims)
    ]


def _shape_guards(plan: KernelPlan, name: str, input_names: list[str]) -> list[str]:
    """The same checks in the launcher, which the op runs: called directly with another size, it
    refuses instead of launching."""
    lines = []
    for k, slot in enumerate(plan.inputs):
        x = input_names[k]
        for j in sorted(slot.guarded_dims):
            lines.append(f"if {x}.shape[{j}] != {slot.shape[j]}:")
            lines.append(
                f'    raise ValueError("{name}: input {x} needs size {slot.shape[j]} in dim {j} '
                f"(the model's own constant), got %d\" % {x}.shape[{j}])"
            )
    return lines


def _domain_sizes(plan: KernelPlan, input_names: list[str]) -> list[str]:
    """`d<i> = ...`: each domain dim read from the inputs at call time, so one kernel serves every shape;
    `e<k>`: the pooled tensor's size along each padded window's dim, where the kernels mask the padding."""
    sizes = [f"d{i} = {size}" for i, size in enumerate(domain_size_exprs(plan, input_names))]
    return sizes + [f"e{k} = {_pooled_size(plan, input_names, k)}" for k in padded_windows(plan)]


def _pooled_size(plan: KernelPlan, names: list[str], k: int) -> str:
    """The size of the pooled dim of window `k`: of the input a load reads it from, else the analyzed one
    (the loads hold their inputs to it)."""
    w = plan.windows[k]
    if w.read is None:
        return str(w.size)
    slot, j = w.read
    return f"{names[slot]}.shape[{j}]"


def _merge_row_end(plan: KernelPlan, name: str, input_names: list[str]) -> list[str]:
    """Rows whose width is not a power of two, in an elementwise plan that only addresses memory along
    its last two dims (`mergeable_row_end`): where every tensor lays those out as one run of memory
    (the module's `_merged_row_end`), the launcher runs again on views that make them one dim, and
    gives the outputs back in the domain's shape."""
    layouts = mergeable_row_end(plan)
    if not layouts:
        return []
    n = len(plan.domain)
    listed = tuple_display([f"({k}, {tuple_display([str(d) for d in dims])})" for k, dims in layouts])
    numbers = "".join(f", {slot.name}" for slot in plan.scalars if slot.runtime)
    if plan.grad_layout:  # the merged views' layout is their own
        numbers += ", ()"
    shape = tuple_display([f"d{i}" for i in range(n)])
    back = "merged.view(shape)" if len(plan.outputs) == 1 else "tuple(out.view(shape) for out in merged)"
    code = CodeBuffer()
    with code.block(
        f"if d{n - 1} & (d{n - 1} - 1) and d{n - 2} > 1:  # short rows of an odd width: one long row, if memory allows"
    ):
        code.write(f"merged = _merged_row_end({tuple_display(input_names)}, {listed}, {n})")
        with code.block("if merged is not None:"):
            code.write(f"shape = {shape}", f"merged = _{name}_launch(*merged{numbers})", f"return {back}")
    return code.lines()


def domain_size_exprs(plan: KernelPlan, names: list[str]) -> list[str]:
    """Each domain dim as an expression over the inputs' run-time shapes (its analysis-time size
    when no input is loaded along it at that size)."""
    return [_size_expr(plan, names, i, size) or str(size) for i, size in enumerate(plan.domain)]


def _size_expr(plan: KernelPlan, names: list[str], i: int, size: int) -> str | None:
    """`<input>.shape[j]` of the first load that reads domain dim `i` as its dim `j` at the domain's size;
    for the positions of a pooling window's output, how many windows fit in the dim that load reads."""
    for w in plan.windows:
        if w.out == i and w.read is not None:
            k, j = w.read
            padded = f"{names[k]}.shape[{j}] + {2 * w.padding}" if w.padding else f"{names[k]}.shape[{j}]"
            return f"({padded} - {w.span}) // {w.stride} + 1"
    for s in plan.stmts:
        if s.load_input is None:
            continue
        slot = plan.inputs[s.load_input]
        for j, c in enumerate(s.load_coords):
            if c == Dim(i) and slot.shape[j] == size:
                return f"{names[s.load_input]}.shape[{j}]"
    return None


def _memory_order(plan: KernelPlan, input_names: list[str]) -> list[str]:
    """Elementwise only: `pitches` numbers the rows in the memory order of the full-size inputs and
    `dense` says whether they share one dense layout (the module's `_row_pitches`); with inputs
    read along every dim their own way (`full_rank_loads`), `out_strides` and `fast` too (the
    module's `_row_order`)."""
    if plan.kind != "elementwise":
        return []
    leads = tuple_display([input_names[k] for k in identity_inputs(plan)])
    domain = tuple_display([f"d{i}" for i in range(len(plan.domain))])
    flag = _layout_flag(plan)
    others = full_rank_loads(plan)
    if others:
        return [
            f"pitches, out_strides, dense, like, fast = _row_order({leads}, {domain}, {layouts_display(others, input_names)}{flag})"
        ]
    if flag == ", layout=layout":
        return [f"pitches, dense, like, out_strides = _laid_out_pitches({leads}, {domain}, layout)"]
    return [f"pitches, dense, like = _row_pitches({leads}, {domain}{flag})"]


def _layout_flag(plan: KernelPlan) -> str:
    """What decides the outputs' layout besides the full-size inputs', as the module's `_row_pitches`
    and `_row_order` take it: row-major for GEMMs to read (`row_major`), the forward input's for a
    gradient (`layout`), contiguous as eager's `cat` result (`cat`); "" for none."""
    if any(out.contiguous for out in plan.outputs):  # its readers are GEMMs: row-major, whatever the inputs
        return ", row_major=True"
    if plan.grad_layout:
        return ", layout=layout"
    return ", cat=True" if any(out.cat for out in plan.outputs) else ""


def _group_layout(plan: KernelPlan, input_names: list[str]) -> list[str]:
    """A group norm's kernels (`plan.channels_last_groups`) walk each group as its input lies (`cl`:
    channels-last).  Where a GroupNorm's statistics can be gathered in pieces (`plan.split_groups`),
    the split kernels run instead (`split`) for a channels-last input, or for a channels-first one
    that only convolutions read (cuDNN convolves channels-last fastest: bf16 3x3 over
    [32, 256, 64, 64] on an H200, 215 µs against 334), when every input's pixels are one dim in
    memory.  `out_cl`: the outputs are channels-last.  (Written channels-last from a channels-first
    input one group a program, the GroupNorm + SiLU took 529 µs instead of 65: each pixel's 8
    channels of a group land 512 bytes from the next pixel's.)"""
    if not channels_last_groups(plan):
        return []
    direct = [input_names[k] for k in identity_inputs(plan)]
    if not direct:
        return ["cl = split = out_cl = False"]
    x = direct[0]
    lines = [
        f"cl = {x}.dim() == 4 and {x}.is_contiguous(memory_format=torch.channels_last) and not {x}.is_contiguous()"
    ]
    if not split_groups(plan):
        return [*lines, "split = False", "out_cl = cl"]
    to_convolution = any(o.to_convolution for o in plan.outputs)
    spatial = [input_names[k] for k, slot in enumerate(plan.inputs) if {2, 3} <= set(slot.strides_used)]
    dense = " and ".join(f"{t}.stride(2) == {t}.shape[3] * {t}.stride(3)" for t in spatial) or "True"
    wanted = f"(cl or {x}.dim() == 4)" if to_convolution else "cl"
    return [
        *lines,
        f"split = {wanted} and {dense} and _next_pow2({plan.groups}) * _next_pow2(d1 // {plan.groups}) <= 8192",
        "out_cl = cl or split",
    ]


def _output_allocations(plan: KernelPlan, input_names: list[str]) -> list[str]:
    """`out<k> = ...`: each output, full-size or one value per row (a reduction's result)."""
    return [f"out{k} = {_output_allocation(plan, input_names, out)}" for k, out in enumerate(plan.outputs)]


def _output_allocation(plan: KernelPlan, input_names: list[str], out: OutputSlot) -> str:
    """A fresh tensor for `out`; an elementwise output takes the full-size inputs' layout when
    they share a dense one, as eager's result would, and is contiguous otherwise."""
    n, k_rows = len(plan.domain), plan.row_dims
    device = f"{input_names[0]}.device" if input_names else "'cuda'"
    if out.dims is not None:  # a permutation of the domain: its own shape, contiguous
        return f"torch.empty({tuple_display([f'd{d}' for d in out.dims])}, device={device}, dtype=torch.{out.dtype})"
    if out.col_total:  # summed over the rows: the columns' dims, in float32 (the launch adds partials)
        return (
            f"torch.empty({tuple_display([f'd{i}' for i in range(k_rows, n)])}, device={device}, dtype=torch.float32)"
        )
    if out.row_only and plan.groups:  # a group norm's rows: (sample, group)
        dims = ["d0", str(plan.groups)]
    elif out.row_only and out.row_at is not None:  # the row dims where the output has them, 1 elsewhere
        dims = [f"d{i}" if i >= 0 else "1" for i in out.row_at]
    elif out.row_only:  # the row dims, then 1 for each reduced dim the output keeps
        dims = [f"d{i}" for i in range(k_rows)] + (["1"] * (len(out.shape) - k_rows))
    else:
        dims = [f"d{i}" for i in range(n)]
    fresh = f"torch.empty({tuple_display(dims)}, device={device}, dtype=torch.{out.dtype})"
    if channels_last_groups(plan) and not out.row_only:
        nhwc = f"torch.empty({tuple_display(dims)}, device={device}, dtype=torch.{out.dtype}, memory_format=torch.channels_last)"
        return f"{nhwc} if out_cl else {fresh}"
    direct = [input_names[k] for k in identity_inputs(plan)]
    if plan.grad_layout:
        return f"torch.empty_strided({tuple_display(dims)}, out_strides, device={device}, dtype=torch.{out.dtype})"
    if plan.kind == "elementwise" and direct:
        return f"torch.empty_like({direct[0]}, dtype=torch.{out.dtype}) if like else {fresh}"
    return fresh


def _rows_and_columns(plan: KernelPlan) -> list[str]:
    """`R`, `C`: the domain as rows by columns.  A group norm's rows are (batch, group), its columns
    the group's channels by the spatial dims."""
    n = len(plan.domain)
    if plan.groups:
        return [f"G = {plan.groups}", "R = d0 * G", "C = (" + " * ".join(f"d{i}" for i in range(1, n)) + ") // G"]
    rows = " * ".join(f"d{i}" for i in range(plan.row_dims)) or "1"
    cols = " * ".join(f"d{i}" for i in range(plan.row_dims, n)) or "1"
    return [f"R = {rows}", f"C = {cols}"]


def _return_early(plan: KernelPlan, input_names: list[str]) -> list[str]:
    """Return the outputs without launching when the inputs carry shapes only (meta tensors in a
    re-analysis of code that already calls the kernel, fake ones in torch.compile's trace), or when
    there is nothing to do."""
    shapes = f"_shapes_only({input_names[0]}) or " if input_names else ""
    code = CodeBuffer()
    with code.block(f"if {shapes}R == 0 or C == 0:  # shapes only, or nothing to do"):
        code.write("return " + _returns(plan))
    return code.lines()


def _index_width(plan: KernelPlan, input_names: list[str]) -> list[str]:
    """`index_64`: whether an offset into any tensor can pass 32 bits (the module's `_needs_int64`)."""
    tensors = ", ".join(input_names + _output_names(plan))
    return [f"index_64 = _needs_int64({tensors})"]


def _width_alignment(plan: KernelPlan) -> list[str]:
    """`align`: the power of two the row width is a multiple of (the module's `_align`), which
    the kernels take as ALIGN so that Triton moves rows in vectors; none where they take the width
    itself (`KernelPlan.fixed_width`)."""
    return [] if plan.fixed_width else ["align = _align(C)"]


def constexprs(plan: KernelPlan, block_r: str = "block_r", block_c: str = "block_c", **own: str) -> dict[str, str]:
    """What a launch passes for the constexprs every kernel of the plan takes, then for its kernel's
    `own`: the tile, the offsets' width, and what the kernel knows of the row width, the width itself
    as a constant where it is the model's (`WIDTH=C`), else the power of two it is a multiple of
    (`ALIGN=align`)."""
    width = {"WIDTH": "C"} if plan.fixed_width else {"ALIGN": "align"}
    return {"BLOCK_R": block_r, "BLOCK_C": block_c, "INDEX_64": "index_64", **width, **own}


# Every launch's option.
WARPS = ("num_warps=warps",)


def _stride_reads(plan: KernelPlan, input_names: list[str]) -> list[str]:
    """`st<k> = _strides(<input>)` for each input the kernel addresses through strides: 0 along its
    dims of size 1, so a dim of size 1 at analysis time may be longer now (a batch), or broadcast."""
    # One call per tensor: the launcher's own time is part of every call.
    return [f"st{k} = _strides({input_names[k]})" for k, slot in enumerate(plan.inputs) if slot.strides_used]


def magic_numbers(divisors: list[str]) -> list[str]:
    """`magic`: the magic numbers of the kernels' run-time divisors (the module's `_magic`)."""
    return [f"magic = _magic({', '.join(divisors)})"] if divisors else []


def layouts_display(loads: list[tuple[int, tuple[int, ...]]], input_names: list[str]) -> str:
    """`((x, (0, 2, 3, 1)), ...)`: each input and the domain dim each of its dims runs along."""
    return tuple_display([f"({input_names[k]}, {tuple_display([str(d) for d in dims])})" for k, dims in loads])


def widest_item(plan: KernelPlan) -> int:
    """Bytes per element of the widest full-size tensor the kernel streams."""
    dtypes = [plan.inputs[k].dtype for k in identity_inputs(plan)] + [o.dtype for o in plan.outputs if not o.saved]
    return max(DTYPE_BYTES.get(d, 4) for d in dtypes)


def _output_names(plan: KernelPlan) -> list[str]:
    return [f"out{k}" for k in range(len(plan.outputs))]


def _returns(plan: KernelPlan) -> str:
    """The launcher's return value: the output, or a tuple of them, then what the backward keeps
    (`OutputSlot.saved`, and the count of targets of each mean, `saved_counts`)."""
    outs = [_result(k, out) for k, out in enumerate(plan.outputs)]
    outs += [f"count{k}" for k in saved_counts(plan)]
    return outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"


def _op_outputs(plan: KernelPlan) -> int:
    """How many tensors the op returns: the cluster's outputs, then what its backward keeps."""
    return len(plan.outputs) + len(saved_counts(plan))


def _result(k: int, out: OutputSlot) -> str:
    """Output `k` as the cluster returns it: a loss over the rows totals the kernel's per-row losses,
    a mean over the rows whose target is not ignored (`count<k>`; 0 / 0, NaN, when all are, as in torch)."""
    total = out.total
    if total is None:
        return f"out{k}"
    text = f"out{k}.sum()"
    if total.how == "mean":
        text += f" / count{k}"
    return f"({text}).to(torch.{total.dtype})"


def _target_counts(plan: KernelPlan, input_names: list[str]) -> list[str]:
    """`count<k>`: the number of targets mean loss `k` is over, those that are not `ignore_index`."""
    return [
        f"count{k} = ({input_names[out.total.target_input]} != {out.total.ignore_index}).sum()"
        for k, out in enumerate(plan.outputs)
        if out.total is not None and out.total.how == "mean"
    ]


# ---- the autograd wrapper and the public function -----------------------------------------


def _op_registration(plan: KernelPlan, name: str) -> list[str]:
    """The launcher as a torch.library op, so that torch.compile and torch.export see one op for the
    cluster (its output shapes, dtypes and strides from the launcher itself) instead of tracing into it."""
    numbers = tuple(slot.type for slot in plan.scalars if slot.runtime) + (("SymInt[]",) if plan.grad_layout else ())
    tail = f", {numbers!r}" if numbers else ""
    return [f"_{name}_op = _kernel_op({name!r}, _{name}_launch, {len(plan.inputs)}, {_op_outputs(plan)}{tail})"]


def _public_function(
    plan: KernelPlan, name: str, input_names: list[str], number_names: list[str], doc: str, trains: list[int] | None
) -> list[str]:
    """`<name>(inputs, numbers)`, the call the user's code makes: the kernel where it runs (CUDA tensors
    of the dtypes it was generated for, no gradients wanted, the numbers it has baked in; on meta
    tensors, its shapes), else the reference.  The numbers of the model's state default to the
    analyzed instance's."""
    numbers = [f"{n}={literal(slot.value)}" for n, slot in zip(number_names, plan.scalars, strict=True)]
    passed = input_names + [n for n, slot in zip(number_names, plan.scalars, strict=True) if slot.runtime]
    dtypes = tuple(slot.dtype for slot in plan.inputs)
    checks = _constant_sizes(plan, input_names) + [
        f"{n} == {literal(slot.value)}" for n, slot in zip(number_names, plan.scalars, strict=True) if not slot.runtime
    ]
    fits = "".join(f" and {check}" for check in checks)
    code = CodeBuffer()
    with code.block(f"def {name}({', '.join(input_names + numbers)}):"):
        code.write(*_docstring(doc))
        with code.block(
            f"if _kernel_runs({tuple_display(input_names)}, {dtype_tuple(dtypes)}{_trains(trains)}){fits}:"
        ):
            code.write(f"return _{name}_call({', '.join(passed)}){_returned_part(plan)}")
        code.write(f"return _{name}_reference({', '.join(input_names + number_names)})")
    return code.lines()


def _returned_part(plan: KernelPlan) -> str:
    """The index that takes the caller's outputs from the op's, which end with what the backward keeps."""
    returned = len(returned_outputs(plan))
    if returned == _op_outputs(plan):
        return ""
    return "[0]" if returned == 1 else f"[:{returned}]"


def _trains(trains: list[int] | None) -> str:
    """`_kernel_runs`'s last argument: the inputs that may want gradients (the backward computes them)."""
    return "" if trains is None else f", trains={tuple(trains)!r}"


def _docstring(doc: str) -> list[str]:
    """`doc` as a docstring's lines."""
    lines = doc.strip().splitlines() or [""]
    if len(lines) == 1:
        return [f'"""{lines[0]}"""']
    return ['"""' + lines[0], *lines[1:], '"""']
