"""The kernel module's text for a cluster that starts with a GEMM.

The section holds the epilogue's own kernel (`<name>_epilogue`, emitted as any elementwise cluster's,
with its backward), then the fused kernel (`variants.gemm.GemmKernel`) and what runs it:

- `_<name>_fused`: the product's sizes and operands as the kernel reads them (`_gemm_problem`), the
  outputs, each epilogue input's strides along the product's batch, rows and columns
  (`_gemm_operand`), then the launch with the tile that ran fastest at the shape (`_gemm_tile`);
- `_<name>_library`: the library's GEMM (the model's own call), then `<name>_epilogue`;
- `_<name>_cublaslt`, where the cluster is a bias and a ReLU or tanh-GELU after the GEMM: cuBLASLt's
  GEMM with that epilogue (`torch._addmm_activation`);
- `_<name>_launch`, registered as the op `<name>` as every kernel is (torch.compile and torch.export
  see one op for the cluster): whichever of those ran fastest the first time the shape came
  (`_gemm_fastest`), its outputs laid out as the fused kernel's;
- `<name>`, the public function: the op where no gradient is wanted; with gradients, the library's
  path, which trains through torch's GEMM gradients and the epilogue's backward kernel; elsewhere
  (another device, another dtype) the reference.
"""

from __future__ import annotations

import textwrap

from .code_buffer import CodeBuffer
from .gemm_plan import GemmPlan, operand_relations, result_dims
from .lowering import dtype_tuple, tuple_display
from .plan import KernelPlan
from .terms import literal
from .variants import GEMM, Context
from .variants.gemm import epilogue_inputs, input_reads


def gemm_kernels(plan: KernelPlan, name: str, input_names: list[str], comments: dict[str, str]) -> tuple[str, str]:
    """The fused kernel's text, and the launch lines that run it with a tile (`run(tile)`)."""
    context = Context(plan, f"_{name}_kernel", input_names, comments)
    variants = GEMM.variants(plan)
    return "\n\n".join(v.kernels(context) for v in variants), "\n".join(GEMM.launch(variants, context))


def gemm_launcher_text(
    plan: KernelPlan,
    name: str,
    input_names: list[str],
    number_names: list[str],
    doc: str,
    launch: str,
    reference: str,
    library_call: str,
    activation: str | None,
    trains: bool = True,
) -> str:
    """`_<name>_launch`, `_<name>_library` (`library_call`: the GEMM's call on the inputs, then the
    epilogue's), `_<name>_cublaslt` where `activation` is one cuBLASLt applies, the reference, the op
    and the public function.  `trains`: a call that wants gradients runs the library's path (else,
    the cluster measured slower in training, its reference)."""
    gemm = _gemm(plan)
    parts = [
        _fused_function(plan, gemm, name, input_names, launch),
        _library_function(name, input_names, number_names, library_call),
    ]
    if activation:
        parts.append(_cublaslt_function(plan, gemm, name, input_names, activation))
    parts.append(_launch_function(plan, gemm, name, input_names, number_names, bool(activation)))
    parts.append(reference)
    runtime = [slot.type for slot in plan.scalars if slot.runtime]
    tail = f", {tuple(runtime)!r}" if runtime else ""
    parts.append(
        f"_{name}_op = _kernel_op({name!r}, _{name}_launch, {len(plan.inputs)}, {len(plan.outputs)}{tail})\n"
        f"_{name}_call = _kernel_call(_{name}_op, _{name}_launch)"
    )
    parts.append(_public_function(plan, gemm, name, input_names, number_names, doc, bool(activation), trains))
    if trains:
        every = tuple(range(len(plan.inputs)))
        parts.append(
            f"# Training: every input's gradient, through torch's GEMM and the epilogue's kernels (`_{name}_library`).\n"
            f"_{name}_trains = {every!r}\n_{name}_folded = {{}}"
        )
    return "\n\n\n".join(parts)


def _gemm(plan: KernelPlan) -> GemmPlan:
    if plan.gemm is None:
        raise ValueError("not a GEMM cluster's plan")
    return plan.gemm


def _operands(gemm: GemmPlan, input_names: list[str]) -> tuple[str, str]:
    return input_names[gemm.operands[0]], input_names[gemm.operands[1]]


def _fused_function(plan: KernelPlan, gemm: GemmPlan, name: str, input_names: list[str], launch: str) -> str:
    """`_<name>_fused`: the fused kernel, with the tile that ran fastest at the shape."""
    a, b = _operands(gemm, input_names)
    form = gemm.form
    groups = tuple_display([tuple_display([str(d) for d in dims]) for dims in (form.batch, form.rows, form.cols)])
    device = f"{a}.device"
    layout = f", memory_format=_gemm_image_format({b})" if form.image else ""
    params = input_names + [slot.name for slot in plan.scalars if slot.runtime]
    code = CodeBuffer([f"def _{name}_fused({', '.join(params)}):"])
    outs = [f"out{k}" for k in range(len(plan.outputs))]
    returned = outs[0] if len(outs) == 1 else tuple_display(outs)
    with code.indent():
        code.write('"""The fused kernel, with the tile that ran fastest at the shape."""')
        code.write(f"a, b, batch, M, N, K, sa, sb, shape = _gemm_problem({gemm_form_name(gemm)!r}, {a}, {b})")
        for k, out in enumerate(plan.outputs):
            code.write(f"out{k} = torch.empty(shape, device={device}, dtype=torch.{out.dtype}{layout})")
        with code.block(f"if _shapes_only({a}) or out0.numel() == 0:  # shapes only, or nothing to do"):
            code.write(f"return {returned}")
        code.write(f"groups = {groups}  # the result's dims that are the batch, the rows and the columns")
        for j in epilogue_inputs(plan):
            reads = tuple_display([str(d) for d in input_reads(plan, j)])
            code.write(f"{input_names[j]}, st{j} = _gemm_operand({input_names[j]}, {reads}, shape, groups)")
        every = tuple_display([str(d) for d in range(len(plan.domain))])
        code.write(f"so = _gemm_operand(out0, {every}, shape, groups)[1]")
        tensors = ["a", "b", *[input_names[j] for j in epilogue_inputs(plan)], *outs]
        code.write(f"index_64 = _needs_int64({', '.join(tensors)})", "precision = _gemm_precision(a)", "")
        code.write(*launch.splitlines())
        code.write(
            "",
            f"return run(_gemm_tile(_gemm_key({name!r}, {gemm_form_name(gemm)!r}, {a}, {b}), run, a.dtype, M, N, K))",
        )
    return code.text()


def _launch_function(
    plan: KernelPlan, gemm: GemmPlan, name: str, input_names: list[str], number_names: list[str], cublaslt: bool
) -> str:
    """`_<name>_launch`, the op: on tensors that carry shapes only, the outputs as the fused kernel
    allocates them; else whichever of the fused kernel, the library's path (and cuBLASLt's) ran fastest
    at the shape, its outputs laid out as the fused kernel's."""
    a, b = _operands(gemm, input_names)
    runtime = [slot.name for slot in plan.scalars if slot.runtime]
    numbers = [
        slot.name if slot.runtime else literal(slot.value) for n, slot in zip(number_names, plan.scalars, strict=True)
    ]
    layout = f"_gemm_image_format({b})" if gemm.form.image else "torch.contiguous_format"
    code = CodeBuffer([f"def _{name}_launch({', '.join(input_names + runtime)}):"])
    with code.indent():
        code.write(
            '"""The op: the fastest way at the shape (`_gemm_fastest`), its outputs laid out as the fused '
            'kernel\'s, which allocates them on shapes alone."""'
        )
        with code.block(f"if _shapes_only({a}):"):
            code.write(f"return _{name}_fused({', '.join(input_names + runtime)})")
        code.write(f"layout = {layout}")
        code.write("paths = {")
        code.write(f'    "fused": lambda: _{name}_fused({", ".join(input_names + runtime)}),')
        code.write(
            f'    "library": lambda: _gemm_laid_out(_{name}_library({", ".join(input_names + numbers)}), layout),'
        )
        if cublaslt:
            code.write(f'    "cublaslt": lambda: _gemm_laid_out(_{name}_cublaslt({", ".join(input_names)}), layout),')
        code.write("}")
        code.write(f"return _gemm_fastest({name!r}, {gemm_form_name(gemm)!r}, {a}, {b}, paths)")
    return code.text()


def gemm_form_name(gemm: GemmPlan) -> str:
    """The form `_gemm_sizes` and `_gemm_problem` take: linear, conv2d, or a product of A by B as given."""
    return gemm.form.op if gemm.form.op in ("linear", "conv2d") else "matmul"


def _library_function(name: str, input_names: list[str], number_names: list[str], library_call: str) -> str:
    code = CodeBuffer([f"def _{name}_library({', '.join(input_names + number_names)}):"])
    with code.indent():
        code.write(
            '"""The library\'s GEMM, then the epilogue\'s own kernel: where the fused kernel does not run, or is the slower."""'
        )
        code.write(*library_call.splitlines())
    return code.text()


def _cublaslt_function(plan: KernelPlan, gemm: GemmPlan, name: str, input_names: list[str], activation: str) -> str:
    a, b = _operands(gemm, input_names)
    bias = input_names[gemm.operands[2]]
    use_gelu = activation == "gelu"
    code = CodeBuffer([f"def _{name}_cublaslt({', '.join(input_names)}):"])
    with code.indent():
        code.write(f'"""cuBLASLt\'s GEMM with the bias and the {activation} applied in its epilogue."""')
        if gemm.form.op == "linear":
            code.write(f"rows = {a}.reshape(-1, {a}.shape[-1])")
            code.write(
                f"out = torch._addmm_activation({bias}, rows, {b}.t(), use_gelu={use_gelu})",
                f"return out.view(*{a}.shape[:-1], {b}.shape[0])",
            )
        else:
            code.write(f"return torch._addmm_activation({bias}, {a}, {b}, use_gelu={use_gelu})")
    return code.text()


def _public_function(
    plan: KernelPlan,
    gemm: GemmPlan,
    name: str,
    input_names: list[str],
    number_names: list[str],
    doc: str,
    cublaslt: bool,
    trains: bool,
) -> str:
    scalars = list(zip(number_names, plan.scalars, strict=True))
    defaults = [f"{n}={literal(slot.value)}" for n, slot in scalars]
    passed = input_names + [n for n, slot in scalars if slot.runtime]
    baked = "".join(f" and {n} == {literal(slot.value)}" for n, slot in scalars if not slot.runtime)
    dtypes = dtype_tuple(slot.dtype for slot in plan.inputs)
    every = tuple(range(len(plan.inputs))) if trains else ()
    args = ", ".join(input_names + number_names)
    code = CodeBuffer([f"def {name}({', '.join(input_names + defaults)}):"])
    with code.indent():
        lines = doc.strip().splitlines()
        code.write('"""' + lines[0], *lines[1:], "", *_ways(cublaslt, trains), '"""')
        code.write(f"tensors = {tuple_display(input_names)}")
        with code.block(f"if _kernel_runs(tensors, {dtypes}, trains={every!r}){baked}:"):
            with code.block("if _no_gradients(tensors):  # the fastest at the shape"):
                code.write(f"return _{name}_call({', '.join(passed)})")
            if trains:
                code.write(f"return _{name}_library({args})  # torch's GEMM gradients, the epilogue's kernels")
        code.write(f"return _{name}_reference({args})")
    return code.text()


def _ways(cublaslt: bool, trains: bool) -> list[str]:
    """What the public function's docstring says it runs."""
    library = "the library's GEMM and then the epilogue's kernel"
    if cublaslt:
        library += ", or cuBLASLt's GEMM with its own epilogue"
    training = "the library's GEMM and the epilogue's kernels" if trains else "the ops as the model wrote them"
    text = (
        f"Where no gradient is wanted it runs the fused kernel, or {library}: whichever ran fastest the first "
        "time the shape (its rows rounded up to a power of two), dtype and device came.  Where gradients are "
        f"wanted, {training}."
    )
    return textwrap.wrap(text, 96)


def gemm_result_sizes(plan: KernelPlan, input_names: list[str]) -> list[str]:
    """Each dim of the GEMM's result as an expression over its operands' run-time shapes."""
    gemm = _gemm(plan)
    a, b = _operands(gemm, input_names)
    return [f"{(a, b)[which]}.shape[{d}]" for which, d in result_dims(gemm.form, len(plan.domain))]


def gemm_relations(plan: KernelPlan, input_names: list[str]) -> list[str]:
    """The operands' size relations, then each epilogue input's sizes, that the kernel's `fits` checks."""
    gemm = _gemm(plan)
    a, b = _operands(gemm, input_names)
    sizes = gemm_result_sizes(plan, input_names)
    conditions = operand_relations(gemm.form, a, b)
    for j in epilogue_inputs(plan):
        slot = plan.inputs[j]
        for d, along in enumerate(input_reads(plan, j)):
            conditions.append(f"{input_names[j]}.shape[{d}] == {sizes[along] if along >= 0 else slot.shape[d]}")
    return conditions
