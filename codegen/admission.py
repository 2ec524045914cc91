"""When a kernel may stand in for the code it replaces: its `fits` function.

The rewritten code (`analysis/guarded.py`) asks `clusterN.fits(<the call's arguments>, module=self)`
before calling the kernel, and runs the original lines when the answer is no.  A kernel fits a call
where it computes exactly what those lines compute:

- every input is a tensor of the rank and dtype the kernel was made for, on a device it runs on,
  wanting gradients only where its backward computes them (the module's `_kernel_runs`);
- the sizes relate as they did: a dim the kernel reads along a domain dim has that dim's size (read
  at call time from the input the launcher takes it from), a table's rows read at the ids the kernel
  loads may be any number, and every other dim (a broadcast one, one read through a fixed offset, one
  the kernel never indexes) has the size it had; a GEMM's operands multiply (K agrees), and its
  epilogue's inputs have the sizes of the result's dims they are read along;
- the numbers of the model's state are numbers of the type the kernel takes (and those it bakes in
  have the value it baked);
- the modules the lines call are of the same class, set up the same way, and in the same mode where
  their computation depends on it (`analysis/module_checks.py`).

Text only, like the rest of codegen: the function is printed into the kernel module, whose
`runtime/fits.py` holds the helpers it calls.
"""

from __future__ import annotations

from fuselens.analysis.module_checks import ModuleCheck

from .code_buffer import CodeBuffer
from .gemm_launcher import gemm_relations
from .launcher import domain_size_exprs
from .lowering import dtype_tuple, tuple_display
from .plan import KernelPlan, is_loaded_index
from .terms import Dim, Term, literal


def fits_text(
    plan: KernelPlan,
    name: str,
    input_names: list[str],
    number_names: list[str],
    trains: list[int] | None,
    checks: list[ModuleCheck],
    sized: bool = False,
    made: list[ModuleCheck] | None = None,
) -> str:
    """`_<name>_fits(inputs, numbers, module=None)` and its registration as `<name>.fits`.

    `sized`: the backward holds the analyzed size of a dim the kernel reduces (a mean's 1/N), so where
    gradients are wanted the reduced dims must have their analyzed sizes."""
    tensors = tuple_display(input_names)
    ranks = tuple_display([str(len(slot.shape)) for slot in plan.inputs])
    dtypes = dtype_tuple(slot.dtype for slot in plan.inputs)
    trained = "" if trains is None else f", trains={tuple(trains)!r}"
    numbers = [f"{n}={literal(slot.value)}" for n, slot in zip(number_names, plan.scalars, strict=True)]
    sizes = gemm_relations(plan, input_names) if plan.gemm is not None else _size_conditions(plan, input_names)
    conditions = sizes + _number_conditions(plan, number_names)
    lines = []
    if checks:
        lines += [f"_{name}_modules = {_checks_literal(checks)}", "", ""]
    if checks:
        conditions.append(f"_modules_match(module, _{name}_modules)")
    if made:  # the modules the lines make where they call them, asked again by the call
        lines += [f"_{name}_made = {_checks_literal(made)}", "", ""]
        conditions.append(f"_made_match(made, _{name}_made)")
    pinned = _reduced_sizes(plan, input_names) if sized and trains is not None else []
    if pinned:
        conditions.append(f"(_no_gradients(tensors) or ({' and '.join(pinned)}))")
    code = CodeBuffer(lines)
    parameters = [*input_names, *numbers, "module=None", *(["made=()"] if made else [])]
    with code.block(f"def _{name}_fits({', '.join(parameters)}):"):
        code.write(
            f'"""Whether {name} computes, for these arguments, what the lines it stands in for compute (else they run)."""'
        )
        code.write(f"tensors = {tensors}")
        with code.block(f"if not _tensors_of_ranks(tensors, {ranks}) or not _kernel_runs(tensors, {dtypes}{trained}):"):
            code.write("return False")
        if conditions:
            with code.block("return ("):
                code.write(*[f"{'and ' if k else ''}{c}" for k, c in enumerate(conditions)])
            code.write(")")
        else:
            code.write("return True")
    code.write("", "", f"{name}.fits = _{name}_fits")
    return code.text()


def _size_conditions(plan: KernelPlan, names: list[str]) -> list[str]:
    """Each input dim's size: that of the domain dim it is read along (its size where the launcher
    reads it), or the size it had when the kernel reads it any other way, or not at all."""
    coords: dict[tuple[int, int], set[Term]] = {}
    for stmt in plan.stmts:
        if stmt.load_input is not None:
            for j, coord in enumerate(stmt.load_coords):
                coords.setdefault((stmt.load_input, j), set()).add(coord)
    sources = domain_size_exprs(plan, names)
    conditions = []
    for k, slot in enumerate(plan.inputs):
        for j, size in enumerate(slot.shape):
            own = f"{names[k]}.shape[{j}]"
            read = coords.get((k, j), set())
            along = next(iter(read)) if len(read) == 1 else None
            i = along.index if isinstance(along, Dim) else -1
            if i >= 0 and plan.domain[i] == size:
                if sources[i] != own:
                    conditions.append(f"{own} == {sources[i]}")
            elif read and all(is_loaded_index(c) for c in read):
                continue  # rows of a table read at the ids the kernel loads: any number of them
            else:
                conditions.append(f"{own} == {size}")
    return conditions


def _reduced_sizes(plan: KernelPlan, names: list[str]) -> list[str]:
    """Each input dim read along a reduced domain dim has its analyzed size."""
    pinned: list[str] = []
    for stmt in plan.stmts:
        if stmt.load_input is None:
            continue
        for j, coord in enumerate(stmt.load_coords):
            i = coord.index if isinstance(coord, Dim) else -1
            condition = f"{names[stmt.load_input]}.shape[{j}] == {plan.inputs[stmt.load_input].shape[j]}"
            if i >= plan.row_dims and condition not in pinned:
                pinned.append(condition)
    return pinned


def _number_conditions(plan: KernelPlan, names: list[str]) -> list[str]:
    """A number the kernel takes is a plain number of its type; one it bakes in has the baked value."""
    conditions = []
    taken = [(n, slot.type) for n, slot in zip(names, plan.scalars, strict=True) if slot.runtime]
    if taken:
        listed = tuple_display([n for n, _ in taken])
        conditions.append(f"_numbers_fit({listed}, {tuple_display([repr(t) for _, t in taken])})")
    conditions += [
        f"{n} == {literal(slot.value)}" for n, slot in zip(names, plan.scalars, strict=True) if not slot.runtime
    ]
    return conditions


def _checks_literal(checks: list[ModuleCheck]) -> str:
    """The module checks as the kernel module holds them: (path, class, settings, settings passed, mode) tuples."""
    rows = [f"({c.path!r}, {c.type_name!r}, {c.settings!r}, {c.taken!r}, {c.mode!r})" for c in checks]
    return "(\n" + "".join(f"    {row},\n" for row in rows) + ")"
