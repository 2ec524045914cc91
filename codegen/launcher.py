"""The launcher text of a `KernelPlan`: the Python that reads sizes and strides at call time,
allocates the outputs in the inputs' layout, picks a tile and launches the kernel, then the
autograd wrapper and the public function the user's code calls."""

from __future__ import annotations

from fuselens.analysis.graph import DTYPE_BYTES

from .plan import KernelPlan, identity_inputs, row_views


def _contig_condition(plan: KernelPlan, names: list[str]) -> str:
    """The tile kernel's CONTIG: the full-size inputs share one dense layout (`dense`) and
    every row view has their strides, so that one row offset addresses them all."""
    views = row_views(plan)
    if not views:
        return "dense"

    def stride(k: int) -> str:  # the launcher already holds st{k} when the kernel takes strides
        return f"st{k}" if plan.inputs[k].strides_used else f"{names[k]}.stride()"

    lead = identity_inputs(plan)[0]
    return " and ".join(["dense"] + [f"{stride(k)} == {stride(lead)}" for k in views])


def _size_exprs(plan: KernelPlan, names: list[str]) -> list[str]:
    """Each domain dim as an expression over the inputs' run-time shapes."""
    exprs = []
    for i, size in enumerate(plan.domain):
        found = None
        for s in plan.stmts:
            if s.load_input is None:
                continue
            slot = plan.inputs[s.load_input]
            for j, c in enumerate(s.load_coords):
                if c == f"c{i}" and slot.shape[j] == size:
                    found = f"{names[s.load_input]}.shape[{j}]"
                    break
            if found:
                break
        exprs.append(found or str(size))
    return exprs


def launcher_text(plan: KernelPlan, name: str, kernel_name: str, input_names: list[str], doc: str,
                  flat: bool, divisors: list[str]) -> str:
    """The launcher text; `flat`: the module has the elementwise `_flat` kernel to launch too;
    `divisors`: the kernels' run-time divisors over the launcher's names, whose magic numbers
    it passes (see `emit.Divisors`)."""
    params = ", ".join(input_names)
    n = len(plan.domain)
    sizes = _size_exprs(plan, input_names)
    lines = [f"def _{name}_launch({params}):"]
    body = []
    for k, slot in enumerate(plan.inputs):
        for j in sorted(slot.guarded_dims):
            body.append(f"if {input_names[k]}.shape[{j}] != {slot.shape[j]}:")
            body.append(f"    raise ValueError(\"{name}: input {input_names[k]!s} needs size {slot.shape[j]} in dim {j} "
                        f"(the model's own constant), got %d\" % {input_names[k]}.shape[{j}])")
    for i in range(n):
        body.append(f"d{i} = {sizes[i]}")
    device = f"{input_names[0]}.device" if input_names else "'cuda'"
    k_rows = plan.row_dims
    direct = [input_names[k] for k in identity_inputs(plan)]
    elementwise = plan.kind == "elementwise"
    if elementwise:
        leads = "(" + ", ".join(direct) + ("," if len(direct) == 1 else "") + ")"
        domain = "(" + ", ".join(f"d{i}" for i in range(n)) + ("," if n == 1 else "") + ")"
        body.append(f"pitches, dense = _row_pitches({leads}, {domain})")
    for k, out in enumerate(plan.outputs):
        if out.row_only:
            dims = [f"d{i}" for i in range(k_rows)] + (["1"] * (len(out.shape) - k_rows))
        else:
            dims = [f"d{i}" for i in range(n)]
        shape = "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
        fresh = f"torch.empty({shape}, device={device}, dtype=torch.{out.dtype})"
        if elementwise and direct:  # the layout of the inputs, as eager's result would have
            fresh = f"torch.empty_like({direct[0]}, dtype=torch.{out.dtype}) if dense else {fresh}"
        body.append(f"out{k} = {fresh}")
    if plan.groups:
        body.append(f"G = {plan.groups}")
        body.append("R = d0 * G")
        body.append("C = (" + " * ".join(f"d{i}" for i in range(1, n)) + ") // G")
    else:
        rows = " * ".join(f"d{i}" for i in range(k_rows)) or "1"
        cols = " * ".join(f"d{i}" for i in range(k_rows, n)) or "1"
        body.append(f"R = {rows}")
        body.append(f"C = {cols}")
    meta = f"{input_names[0]}.device.type == 'meta' or " if input_names else ""
    body.append(f"if {meta}R == 0 or C == 0:  # shapes only (re-analysis) or nothing to do")
    body.append("    return " + _returns(plan))
    tensors = ", ".join(input_names + [f"out{k}" for k in range(len(plan.outputs))])
    body.append(f"index_64 = _needs_int64({tensors})")
    strides = []
    for k, slot in enumerate(plan.inputs):
        if slot.strides_used:  # one call per tensor: the launcher's own time is part of every call
            body.append(f"st{k} = {input_names[k]}.stride()")
            strides += [f"st{k}[{j}]" for j in sorted(slot.strides_used)]
    args = input_names + [f"out{k}" for k in range(len(plan.outputs))] + [f"d{i}" for i in range(n)] + strides + ["R", "C"]
    if elementwise:
        args.append("*pitches")
    if plan.groups:
        args.append("G")
    if divisors:
        body.append(f"magic = _magic({', '.join(divisors)})")
        args.append("*magic")
    call_args = ", ".join(args)
    if elementwise:
        contig = _contig_condition(plan, input_names)
        tile = [
            f"block_r, block_c, warps = _pointwise_tile(R, C, {_widest_item(plan)})",
            "col_blocks = (C + block_c - 1) // block_c",
            "grid = (((R + block_r - 1) // block_r) * col_blocks,)",
            f"{kernel_name}_tile[grid]({call_args}, col_blocks,",
            f"    BLOCK_R=block_r, BLOCK_C=block_c, INDEX_64=index_64, CONTIG={contig}, num_warps=warps)",
        ]
        if flat:
            body.append("if dense:  # one flat offset addresses every full-size input and the output")
            body.append(f"    block, warps = _flat_tile(R * C, {_widest_item(plan)})")
            body.append(f"    {kernel_name}_flat[((R * C + block - 1) // block,)]({call_args},")
            body.append("        BLOCK_R=1, BLOCK_C=block, INDEX_64=index_64, num_warps=warps)")
            body.append("else:")
            body += ["    " + line for line in tile]
        else:
            body += tile
    else:
        contiguous = " and ".join(f"{n}.is_contiguous()" for n in direct) or "True"
        body.append(f"block_r, block_c, warps, whole_row = _row_tile(R, C, {_widest_item(plan)})")
        body.append("grid = ((R + block_r - 1) // block_r,)")
        body.append(f"kernel = {kernel_name}_block if whole_row else {kernel_name}_loop")
        body.append(f"kernel[grid]({call_args},")
        body.append(f"    BLOCK_R=block_r, BLOCK_C=block_c, INDEX_64=index_64, CONTIG={contiguous}, num_warps=warps)")
    body.append("return " + _returns(plan))
    lines += ["    " + b for b in body]
    cls = "_" + "".join(p.capitalize() for p in name.split("_")) + "Function"
    lines += [
        "",
        "",
        f"class {cls}(torch.autograd.Function):",
        "    @staticmethod",
        f"    def forward(ctx, {params}):",
        f"        return _{name}_launch({params})",
        "",
        "    @staticmethod",
        "    def backward(ctx, *grads):",
        f"        raise RuntimeError(\"{name} is an inference-only fused kernel: run the model under torch.no_grad() \"",
        "                           \"or keep the original code where gradients are needed\")",
        "",
        "",
        f"def {name}({params}):",
        _docstring(doc),
        f"    if torch.is_grad_enabled() and any(t.requires_grad for t in ({params}{',' if len(input_names) == 1 else ''})):",
        f"        return {cls}.apply({params})",
        f"    return _{name}_launch({params})",
    ]
    return "\n".join(lines)


def _widest_item(plan: KernelPlan) -> int:
    """Bytes per element of the widest full-size tensor the kernel streams."""
    dtypes = [plan.inputs[k].dtype for k in identity_inputs(plan)] + [o.dtype for o in plan.outputs]
    return max(DTYPE_BYTES.get(d, 4) for d in dtypes)


def _returns(plan: KernelPlan) -> str:
    outs = [f"out{k}" for k in range(len(plan.outputs))]
    return outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"


def _docstring(doc: str) -> str:
    lines = doc.strip().splitlines() or [""]
    if len(lines) == 1:
        return f'    """{lines[0]}"""'
    return '    """' + lines[0] + "\n" + "\n".join(("    " + l) if l else "" for l in lines[1:]) + '\n    """'
