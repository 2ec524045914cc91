"""Emission: a `KernelPlan` -> the text of its `@triton.jit` kernel(s) and, through
`launcher.py`, of its launcher.

Elementwise plans get one kernel over a 2-D tile of (rows, columns).  Reduction plans
get two kernels: `_block`, which holds a whole row in registers and reads it once, and
`_loop`, which walks the row in column blocks (for rows too wide for registers): one pass
per reduction level, where a mean and its centred squares (shifted sums) and a max and its
exp-sum (online softmax) share a pass, then one pass that writes the outputs.  The
launcher picks one from the row length it sees.

The launcher reads every size and stride at call time, so one generated kernel serves
every shape; the only constants are the model's own (slice offsets, head splits), and
the launcher checks those before launching.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from .code_buffer import CodeBuffer
from .kernel_args import KernelArgs
from .launcher import launcher_text
from .lowering import FLOAT, helpers_used
from .plan import (
    KernelPlan,
    Stmt,
    channels_last_groups,
    column_totals,
    flat_inner_dim,
    folds_a_row_dim,
    full_rank_loads,
    identity_inputs,
    is_loaded_index,
    padded_windows,
    permuted_outputs,
    row_layouts,
    row_views,
    split_groups,
)
from .terms import Bin, Dim, Load, Name, Term, TermLike, call, dims, paren, term

MAX_BLOCK_ROW = 8192  # widest row the `_block` variant holds in registers
LOOP_BLOCK = 4096  # column block of the `_loop` variant

_IDENTITY = {"sum": "0.0", "max": "float('-inf')", "min": "float('inf')"}
_COMBINE = {"sum": "{acc} + {x}", "max": "tl.maximum({acc}, {x})", "min": "tl.minimum({acc}, {x})"}
_FINAL = {"sum": "tl.sum", "max": "tl.max", "min": "tl.min"}


# A divisor: the kernel arguments it is the product of (`("d2", "d3")`, `("p0",)`).
Factors = tuple[str, ...]


def _product(factors: Factors) -> Term:
    product: Term = Name(factors[0])
    for f in factors[1:]:
        product = product * Name(f)
    return product


class Divisors:
    """The run-time divisors a plan's row coordinates use.  Each travels with its magic number
    `q<j>` (the module's `_magic`), so that while offsets fit in 32 bits a division by a size
    read at call time is a multiply-high and a shift, as a division by a constant would be:
    a true 32-bit division is a few dozen instructions, and a bf16 kernel at full bandwidth
    has about that many for each element."""

    def __init__(self) -> None:
        self.exprs: list[Factors] = []

    def _magic(self, d: Factors) -> Name:
        if d not in self.exprs:
            self.exprs.append(d)
        return Name(f"q{self.exprs.index(d)}")

    def div(self, n: TermLike, d: Factors) -> Term:
        return call("_div", n, _product(d), self._magic(d), Name("INDEX_64"))

    def mod(self, n: TermLike, d: Factors) -> Term:
        return call("_mod", n, _product(d), self._magic(d), Name("INDEX_64"))

    def launcher_exprs(self, args: KernelArgs) -> list[str]:
        """The divisors as the launcher computes them, from what it passes the kernels for each factor
        (`args`: `pitches[0]` for `p0`)."""
        return [" * ".join(args.value_of(f) for f in d) for d in self.exprs]


def _operand(x: Term) -> Term:
    return paren(x) if isinstance(x, Bin) else x


class PlainDivision:
    """Column coordinates keep `//` and `%`.  A GroupNorm's channel is cols // (H * W), and
    Triton's axis analysis can see that it is constant over runs of lanes, so the weight it
    indexes is loaded once a run; with multiply-highs (and evict_last on those loads) the
    bf16 kernel at DRAM size took 104 µs instead of 81 on an H200."""

    @staticmethod
    def div(n: TermLike, d: Factors) -> Term:
        return _operand(term(n)) // _operand(_product(d))

    @staticmethod
    def mod(n: TermLike, d: Factors) -> Term:
        return _operand(term(n)) % _operand(_product(d))


@dataclass
class Emitted:
    kernels: str  # the @triton.jit function(s)
    launcher: str  # the Python launcher, the reference, the op registration and the public function
    strategy: str
    helpers: list[str]


def emit(
    plan: KernelPlan,
    name: str,
    input_names: list[str],
    output_names: list[str],
    doc: str,
    comments: dict[str, str],
    reference: str | None,
    number_names: list[str] | None = None,
    trains: list[int] | None = None,
) -> Emitted:
    """The kernels and launcher of `plan` as the public function `name`, which takes `input_names`,
    then `number_names` (one for each of `plan.scalars`)."""
    kernel_name = f"_{name}_kernel"
    flat = plan.kind == "elementwise" and (flat_ok(plan) or flat_inner_dim(plan) is not None)
    # Every kernel of a plan takes the same arguments, so the divisors are gathered up front.
    divs = Divisors()
    used = _used_coords(_closure(plan, [o.stmt for o in plan.outputs], lambda s: True), plan)
    if full_rank_loads(plan) or folds_a_row_dim(plan):  # the across and wide kernels find every row coordinate
        used |= set(range(plan.row_dims))
    _coords(plan, used, "r", divs)
    if plan.kind != "elementwise" and row_layouts(plan):  # the across row kernel's, so that every kernel takes them
        _across_row_coords(plan, set(range(plan.row_dims)), divs)
    args = _kernel_args(plan, input_names, divs)
    taken = len(divs.exprs)
    if plan.kind == "elementwise":
        kernels = _elementwise(plan, kernel_name + "_tile", comments, divs, args["tile"], flat=False)
        strategy = "elementwise-tile"
        if full_rank_loads(plan):
            kernels += "\n\n" + _elementwise(
                plan, kernel_name + "_across", comments, divs, args["across"], flat=False, across=True
            )
            strategy = "elementwise-tile/across"
        if folds_a_row_dim(plan):
            kernels += "\n\n" + _elementwise(
                plan, kernel_name + "_wide", comments, divs, args["wide"], flat=False, wide=True
            )
            strategy = "elementwise-tile/wide"
        if flat:
            kernels = (
                _elementwise(plan, kernel_name + "_flat", comments, divs, args["flat"], flat=True) + "\n\n" + kernels
            )
            strategy = "elementwise-flat/" + strategy.removeprefix("elementwise-")
    else:
        kernels = _rows(plan, kernel_name + "_block", comments, divs, args["block"], looped=False)
        kernels += "\n\n" + _rows(plan, kernel_name + "_loop", comments, divs, args["loop"], looped=True)
        strategy = "row-block/row-loop"
        if split_groups(plan):
            kernels += "\n\n" + _split_groups(plan, kernel_name, comments, args)
            strategy += "/group-split"
        if row_layouts(plan):
            kernels += "\n\n" + _rows(
                plan, kernel_name + "_across", comments, divs, args["across"], looped=False, across=True
            )
            strategy = "row-block/row-loop/across"
    if len(divs.exprs) != taken:
        raise AssertionError("a kernel divides by a size its arguments do not take the magic number of")
    numbers = number_names if number_names is not None else [slot.name for slot in plan.scalars]
    text = launcher_text(
        plan,
        name,
        kernel_name,
        input_names,
        numbers,
        doc,
        flat,
        divs.launcher_exprs(args["base"]),
        reference,
        trains,
        args,
    )
    return Emitted(kernels, text, strategy, helpers_used(kernels))


# ---- arguments ----------------------------------------------------------------------------


def _plan_args(plan: KernelPlan, input_names: list[str], divs: Divisors) -> KernelArgs:
    """The arguments every kernel of `plan` takes first, as the launcher passes them (its locals are
    named as the kernels' parameters, but for the inputs, their strides `st<k>` and what it gathers
    in one sequence), then the constexprs every kernel takes."""
    args = KernelArgs()
    for k, x in enumerate(input_names):
        args.add(f"in{k}_ptr", x)
    for k in range(len(plan.outputs)):
        args.add(f"out{k}_ptr", f"out{k}")
    args.add_each(f"d{i}" for i in range(len(plan.domain)))
    for k, slot in enumerate(plan.inputs):
        for j in sorted(slot.strides_used):
            args.add(f"in{k}_s{j}", f"st{k}[{j}]")
    for k in permuted_outputs(plan):
        for j in range(len(plan.domain)):
            args.add(f"out{k}_s{j}", f"out{k}.stride({j})")
    args.add_each(["R", "C"])
    if plan.kind == "elementwise":
        args.unpacked([f"p{i}" for i in range(plan.row_dims)], "pitches")
        if full_rank_loads(plan):
            args.unpacked([f"o{i}" for i in range(plan.row_dims)] + ["oc"], "out_strides")
    if plan.groups:
        args.add("G")
    args.add_each(f"e{k}" for k in padded_windows(plan))
    if divs.exprs:
        args.unpacked([f"q{j}" for j in range(len(divs.exprs))], "magic")
    args.add_each(slot.name for slot in plan.scalars if slot.runtime)
    return args.constexpr("BLOCK_R", "BLOCK_C", "INDEX_64", "WIDTH" if plan.fixed_width else "ALIGN")


def _kernel_args(plan: KernelPlan, input_names: list[str], divs: Divisors) -> dict[str, KernelArgs]:
    """Each kernel's arguments (by its name's suffix): the plan's, then its own."""
    base = _plan_args(plan, input_names, divs)
    args = {"base": base}
    if plan.kind == "elementwise":
        args["flat"] = base.copy()
        args["tile"] = base.copy().add("col_blocks").constexpr("CONTIG")
        args["across"] = base.copy().add_each(["col_blocks", "fast_blocks", "F"]).constexpr("FAST")
        rows = [f"r{i}" for i in range(plan.row_dims)]
        args["wide"] = base.copy().add_each(["col_blocks", "F"]).unpacked(rows, "row_pitches")
        args["wide"].constexpr("FOLD", "CONTIG")
        return args
    layout = ("CL", "CG") if channels_last_groups(plan) else ()
    args["block"] = base.copy().constexpr("CONTIG", *layout)
    args["loop"] = args["block"]
    args["across"] = base.copy().add_each(["fast_blocks", "F"]).constexpr("CONTIG", *layout)
    split = ("BLOCK_P", "GP", "CG", "CGP")
    args["stats"] = base.copy().add("ws_ptr", "ws").add_each(["HW", "PB"]).add("PLANE", "d0 * PB * GP")
    args["stats"].constexpr(*split)
    args["apply"] = base.copy().add("stats_ptr", "stats").add_each(["HW", "PB"]).add("N", "d0")
    for k in range(len(plan.outputs)):
        for j in (0, 1, 3):
            args["apply"].add(f"out{k}_s{j}", f"out{k}.stride({j})")
    args["apply"].constexpr(*split)
    args["combine"] = KernelArgs().add("ws_ptr", "ws").add("stats_ptr", "stats").add("PB")
    args["combine"].add("PLANE", "d0 * PB * GP").add("N", "d0").add("G").constexpr("GP", "BLOCK_B")
    return args


# ---- kernel text --------------------------------------------------------------------------


def _in_64_bits(*names: str) -> str:
    """With 64-bit offsets (INDEX_64), `names` (the program's positions) in 64 bits, so that every
    offset computed from them is."""
    code = CodeBuffer()
    with code.block("if INDEX_64:"):
        code.write(*[f"{name} = {name}.to(tl.int64)" for name in names])
    return code.text()


def _kernel_text(plan: KernelPlan, kernel_name: str, args: KernelArgs, body: list[str]) -> str:
    """A kernel: its `def` from its arguments, what it knows of the row width, then `body`."""
    code = CodeBuffer(args.signature(kernel_name))
    with code.indent():
        # Told the width (a constant of the model's) or what power of two it is a multiple of (the
        # launcher's `_align`), Triton moves rows, and masks them, in vectors of up to 16 bytes.
        if plan.fixed_width:
            code.write("C = WIDTH  # the row width, fixed by the model: a constant to triton")
        else:
            code.write("C = (C // ALIGN) * ALIGN  # the width, a multiple of ALIGN: rows move in vectors")
        code.write(*body)
    return code.text()


def _coords(plan: KernelPlan, used: set[int], axis: str, divs: Divisors) -> list[str]:
    """Statements defining the domain coordinates `used` that derive from `axis` ("r"/"c")."""
    n = len(plan.domain)
    k = plan.row_dims
    out = []
    divide = divs if axis == "r" else PlainDivision
    if plan.groups:
        if axis == "r":
            if 0 in used or channels_last_groups(plan):
                out.append(f"c0 = {divide.div('rows', ('G',))}")
            if 1 in used:
                out.append(f"g = {divide.mod('rows', ('G',))}")
            return out
        # Columns run over (channel-in-group, *spatial); the channel is g * (C / G) + that.
        spatial = list(range(2, n))
        hw = tuple(f"d{i}" for i in spatial) or ("1",)
        if channels_last_groups(plan):
            # Or, under CL, (spatial, channel-in-group), as a channels-last input lies; `flat`: the
            # offset of an element of the outputs (and of the inputs, under CONTIG), channels-last or
            # not.  CG (the group's channels) is a constant, so Triton sees runs of CG channels in
            # memory and moves each as one vector (bf16 GroupNorm + SiLU over a channels-last
            # [32, 256, 64, 64] on an H200: 159 µs, against 239 with CG a run-time divisor).
            nchw = [f"c1 = g * CG + {divide.div('cols', hw)}", f"hw = {divide.mod('cols', hw)}"]
            nhwc = ["c1 = g * CG + cols % CG", "hw = cols // CG"]
            out.append(CodeBuffer().branches("CL", CodeBuffer(nhwc), CodeBuffer(nchw)).text())
            out.append(f"flat = c0 * (d1 * {_product(hw)}) + hw * d1 + c1 if CL else rows * C + cols")
            return out + _delinearize("hw", spatial, [i for i in used if i >= 2], divide)
        if 1 in used:
            out.append(f"c1 = g * (d1 // G) + {divide.div('cols', hw)}")
        wanted = [i for i in used if i >= 2]
        if wanted:
            out.append(f"hw = {divide.mod('cols', hw)}")
            out += _delinearize("hw", spatial, wanted, divide)
        return out
    dims = list(range(0, k)) if axis == "r" else list(range(k, n))
    index = "rows" if axis == "r" else "cols"
    if plan.kind == "elementwise" and axis == "r":
        # Rows are numbered in the memory order of the inputs (the launcher's pitches), so a
        # permuted view such as x.transpose(1, 2) is read and written front to back.
        return [f"c{i} = {divide.mod(divide.div('rows', (f'p{i}',)), (f'd{i}',))}" for i in sorted(used) if i < k]
    return out + _delinearize(index, dims, [i for i in used if i in dims], divide)


def _delinearize(index: str, dims: list[int], wanted: list[int], divide: Divisors | type[PlainDivision]) -> list[str]:
    out = []
    for i in sorted(wanted):
        inner = tuple(f"d{j}" for j in dims if j > i)
        value = divide.div(index, inner) if inner else term(index)
        if i != dims[0]:
            value = divide.mod(value, (f"d{i}",))
        out.append(f"c{i} = {value}")
    return out


def _used_coords(stmts: list[Stmt], plan: KernelPlan | None = None) -> set[int]:
    """The domain coordinates `stmts` read; every one when `plan` stores an output by its own
    strides (a permuted output is addressed from all of them)."""
    used: set[int] = set()
    for s in stmts:
        used |= dims(s.expr) | dims(s.load_guard)
    if plan is not None and permuted_outputs(plan):
        used |= set(range(len(plan.domain)))
    return used


def _mask_for(axes: frozenset) -> str | None:
    if axes >= {"r", "c"}:
        return "mask"
    if axes == {"r"}:
        return "rmask"
    if axes == {"c"}:
        return "cmask"
    return None


def _broadcast(plan: KernelPlan, s: Stmt) -> bool:
    """Whether the load `s` reads the same elements for many positions of the domain (cos and
    sin tables, positional embeddings, a LayerNorm's weight) along the columns as they run,
    rather than gathering them (a GroupNorm's weight, indexed by a channel derived from the column).
    A table read at loaded ids is one only when it has fewer rows than the domain (positions, token
    types): a vocabulary's rows are each read about once, and kept in L2 they only push out what
    streams past (BERT's embeddings + LayerNorm, [32, 512] ids over 30522 words, bf16 on an H100:
    16.4 µs with the word rows read plainly, 18.9 kept in L2)."""
    used = {i for c in s.load_coords for i in dims(c)}
    n = len(plan.domain)
    along_columns = used & set(range(plan.row_dims, n)) <= {n - 1}
    if used >= set(range(n)) or not along_columns or plan.groups:
        return False
    assert s.load_input is not None
    table = plan.inputs[s.load_input].shape
    picked = [table[j] for j, c in enumerate(s.load_coords) if is_loaded_index(c) and j < len(table)]
    return not picked or math.prod(picked) < math.prod(plan.domain[: plan.row_dims])


def _stmt_line(
    plan: KernelPlan,
    s: Stmt,
    comments: dict[str, str],
    contiguous: AbstractSet[int] = frozenset(),
    evict: str = "",
    views: AbstractSet[int] = frozenset(),
) -> str:
    """One statement; a load of a full-size input in `contiguous` gets a flat-address branch
    (and the cache `evict` policy, when given), as does one of a row view in `views`, at its
    own column."""
    note = comments.get(s.name) or s.comment
    tail = f"  # {note}" if note else ""
    if s.load_input is not None:
        mask = _mask_for(s.axes)
        if s.load_guard is not None:
            mask = f"{mask} & {s.load_guard}" if mask else str(s.load_guard)
        masked = f", mask={mask}, other=0" if mask else ""
        if evict and s.load_input in contiguous:
            masked += f", eviction_policy='{evict}'"
        elif _broadcast(plan, s):
            # Read again and again while the full-size operands stream past once: keep them in
            # L2 (RoPE in fp32 at DRAM size: 68.9 -> 66.4 µs on an H200).
            masked += ", eviction_policy='evict_last'"
        convert = ".to(tl.float32)" if s.kind == FLOAT else ""
        strided = f"{s.name} = tl.load({s.expr}{masked}){convert}{tail}"
        col = _flat_column(plan, s) if s.load_input in contiguous or s.load_input in views else None
        if col is not None:
            offset = "flat" if channels_last_groups(plan) and col == "cols" else f"(rows * C + {col})"
            flat = f"{s.name} = tl.load(in{s.load_input}_ptr + {offset}{masked}){convert}{tail}"
            return CodeBuffer().branches("CONTIG", CodeBuffer([flat]), CodeBuffer([strided])).text()
        return strided
    return f"{s.name} = {s.expr}{tail}"


def _flat_column(plan: KernelPlan, s: Stmt) -> str | None:
    """The column a load reads in its row under CONTIG, where its input's rows are the output's:
    `cols`, or a column moved along the row (`(c3 + 64)`, a half of `rotate_half(q)`).  None for a
    load at other rows (a broadcast, a gather), which must use the strides."""
    n = len(plan.domain)
    coords = s.load_coords
    if len(coords) != n or list(coords[:-1]) != [Dim(i) for i in range(n - 1)]:
        return None
    return "cols" if coords[-1] == Dim(n - 1) else str(coords[-1])


def _store(plan: KernelPlan, k: int, value: Stmt, rows: str = "rows") -> str:
    """The store of output `k`; `rows`: the name holding each row's index in the output, or "orow"
    (the across kernel): each row's offset in elements, its columns `oc` apart."""
    out = plan.outputs[k]
    cast = f".to(out{k}_ptr.dtype.element_ty)"
    if out.row_only:
        v = value.name if value.axes == {"r"} else f"tl.broadcast_to({value.name}, [BLOCK_R, 1])"
        return f"tl.store(out{k}_ptr + rows, {v}{cast}, mask=rmask)"
    v = value.name if value.axes >= {"r", "c"} else f"tl.broadcast_to({value.name}, [BLOCK_R, BLOCK_C])"
    if out.dims is not None:  # a permutation of the domain, addressed by its own strides
        return f"tl.store(out{k}_ptr + ({_permuted_offset(k, out.dims)}), {v}{cast}, mask=mask)"
    if channels_last_groups(plan):
        offset = "flat"
    else:
        offset = "(orow + cols * oc)" if rows == "orow" else f"({rows} * C + cols)"
    return f"tl.store(out{k}_ptr + {offset}, {v}{cast}, mask=mask)"


def _permuted_offset(k: int, dims: tuple[int, ...]) -> str:
    """The offset into output `k`, a permutation of the domain (`dims`: the domain dim of each of its
    dims), by its own strides."""
    return " + ".join(f"c{d} * out{k}_s{j}" for j, d in enumerate(dims))


def _closure(plan: KernelPlan, targets: list[str], keep) -> list[Stmt]:
    """The statements `targets` need, in order, not looking past those `keep` rejects."""
    by_name = {s.name: s for s in plan.stmts}
    seen: set[str] = set()
    stack = list(targets)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if keep(by_name[name]):
            stack.extend(by_name[name].deps)
    return [s for s in plan.stmts if s.name in seen and keep(s)]


def flat_ok(plan: KernelPlan) -> bool:
    """Whether the 1-D kernel can run the plan: every load is of a full-size input at the
    output's own position (or of a single value), so no coordinate is ever computed."""
    direct = set(identity_inputs(plan))
    stmts = _closure(plan, [o.stmt for o in plan.outputs], lambda s: True)
    return not _used_coords([s for s in stmts if s.load_input not in direct], plan)


def _elementwise(
    plan: KernelPlan,
    kernel_name: str,
    comments: dict[str, str],
    divs: Divisors,
    args: KernelArgs,
    flat: bool,
    across: bool = False,
    wide: bool = False,
) -> str:
    """The 2-D tile kernel; or (`flat`) the 1-D kernel for plans that need no coordinates: one
    flat offset addresses every full-size input and the output when they share a layout, as
    Inductor's pointwise kernels do (or need one, the dim laid out innermost: `flat_inner_dim`);
    or (`across`) the tile kernel for an input laid out along a row dim (`_across_head`); or
    (`wide`) the tile kernel over rows that take in a row dim (`_wide_head`)."""
    if flat:
        body = [
            "offs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)",
            CodeBuffer()
            .branches(
                "INDEX_64",
                CodeBuffer(["offs = offs.to(tl.int64)", "numel = R.to(tl.int64) * C"]),
                CodeBuffer(["numel = R * C"]),
            )
            .text(),
            "mask = offs < numel",
            "rmask = mask",
            "cmask = mask",
        ]
    elif across:
        body = _across_head(plan, divs)
    elif wide:
        body = _wide_head(plan, divs)
    else:
        body = [
            # The launcher passes the column-block count: triton specialises a 1 to a constant,
            # which spares each program a division (bf16 RoPE on an H200: 34.6 -> 33.7 µs).
            "pid = tl.program_id(0)",
            "rows = (pid // col_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]",
            "cols = (pid % col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]",
            _in_64_bits("rows", "cols"),
            "rmask = rows < R",
            "cmask = cols < C",
            "mask = rmask & cmask",
        ]
    stmts = _closure(plan, [o.stmt for o in plan.outputs], lambda s: True)
    direct = set(identity_inputs(plan))
    inner = flat_inner_dim(plan) if flat else None
    if inner is not None:  # the permuted views share the offset too: the launcher checks their layout
        direct |= {k for k, _ in full_rank_loads(plan)}
    views = set() if flat else set(row_views(plan))
    lines = []
    for st in stmts:
        if flat and st.load_input in direct:
            note = comments.get(st.name) or st.comment
            convert = ".to(tl.float32)" if st.kind == FLOAT else ""
            lines.append(
                f"{st.name} = tl.load(in{st.load_input}_ptr + offs, mask=mask, other=0){convert}"
                + (f"  # {note}" if note else "")
            )
        elif across:  # rows come from divisions here: every load by its strides
            lines.append(_stmt_line(plan, st, comments))
        else:
            lines.append(_stmt_line(plan, st, comments, direct, views=views))
    if flat:
        if inner is not None:  # the dim laid out innermost: plain `%` lets triton see its runs
            body.append(f"c{inner} = offs % d{inner}")
        return _flat_kernel(plan, kernel_name, args, body + lines)
    used = _used_coords(stmts, plan)
    if not (across or wide):  # their heads define every row coordinate themselves
        body += _coords(plan, used, "r", divs)
    body += _coords(plan, used, "c", divs) + lines
    by_name = {st.name: st for st in plan.stmts}
    for k, o in enumerate(plan.outputs):
        body.append(_store(plan, k, by_name[o.stmt], "orow" if across else "rows"))
    return _kernel_text(plan, kernel_name, args, body)


def _flat_kernel(plan: KernelPlan, kernel_name: str, args: KernelArgs, body: list[str]) -> str:
    """The 1-D kernel from its head and loads: each output stored at the flat offset."""
    by_name = {st.name: st for st in plan.stmts}
    for k, o in enumerate(plan.outputs):
        value = by_name[o.stmt]
        v = value.name if value.axes else f"tl.broadcast_to({value.name}, [BLOCK_C])"
        body.append(f"tl.store(out{k}_ptr + offs, {v}.to(out{k}_ptr.dtype.element_ty), mask=mask)")
    return _kernel_text(plan, kernel_name, args, body)


def _across_head(plan: KernelPlan, divs: Divisors) -> list[str]:
    """The across kernel's program: one position of the row dims other than FAST (`outer`), a block
    of FAST's positions down the tile's rows and a block of columns across it.  FAST is the row dim
    along which an input is laid out (the launcher's `_row_order` finds it at call time): its
    coordinate is an `arange`, so Triton can see that input is contiguous down the tile's rows, as
    the outputs are along its columns, and reads each way in runs of memory (moving the tile
    between the two layouts on chip).  Each row is written at its offset in the outputs' own
    layout (`orow`, from the outputs' element strides `o<i>`; its columns are `oc` apart)."""
    k = plan.row_dims
    head = [
        "pid = tl.program_id(0)",
        "tiles = fast_blocks * col_blocks",
        "outer = pid // tiles",
        "fast = ((pid % tiles) // col_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]",
        "cols = (pid % col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]",
        _in_64_bits("outer", "fast", "cols"),
        "rmask = fast < F",
        "cmask = cols < C",
        "mask = rmask & cmask",
    ]
    # `p<i>` here is dim i's step in `outer`, which counts the positions of the other row dims.
    head += _outer_coords(plan, divs, "FAST", "fast")
    return [*head, "orow = " + " + ".join(f"c{i} * o{i}" for i in range(k))]


def _outer_coords(plan: KernelPlan, divs: Divisors, flag: str, value: str) -> list[str]:
    """Each row coordinate: `value` for the row dim the constant `flag` names, else its position in
    `outer`, the count of the other row dims' positions (`p<i>` being each one's step there)."""
    code = CodeBuffer()
    for i in range(plan.row_dims):
        outer = CodeBuffer([f"c{i} = {divs.mod(divs.div('outer', (f'p{i}',)), (f'd{i}',))}"])
        code.branches(f"{flag} == {i}", CodeBuffer([f"c{i} = {value}"]), outer)
    return code.lines()


def _wide_head(plan: KernelPlan, divs: Divisors) -> list[str]:
    """The wide kernel's program: a block of positions of the row dims other than FOLD (`outer`) by
    a block of `wide` columns, which run over FOLD's positions and each one's row: FOLD is the row
    dim along which the full-size inputs step one row's width (the launcher's `_folded_row_dim`), so
    each of `outer`'s rows is one run of memory F rows long, read in tiles with no idle lanes.  With
    the width a constant, FOLD's coordinate and the column are a division and a remainder by it,
    which Triton sees run in blocks, so the loads still move in vectors.  `p<i>` here is dim i's
    step in `outer`; `r<i>` its step in the outputs' own row numbering, from which `rows`, each
    element's row there, is built, so loads under CONTIG and the stores read as the tile kernel's."""
    k = plan.row_dims
    head = [
        "pid = tl.program_id(0)",
        "outer = (pid // col_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]",
        "wide = (pid % col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]",
        _in_64_bits("outer", "wide"),
        # FOLD's coordinate varies along the columns: a load of one value a row reads at it too, so
        # every mask covers both ways.
        "cmask = wide < F * C",
        "rmask = (outer < R // F) & cmask",
        "mask = rmask",
        "cols = wide % C",
    ]
    head += _outer_coords(plan, divs, "FOLD", "wide // C")
    return [*head, "rows = " + " + ".join(f"c{i} * r{i}" for i in range(k))]


# ---- row kernels --------------------------------------------------------------------------


@dataclass
class _RowKernel:
    """What every part of a row kernel's text reads."""

    plan: KernelPlan
    comments: dict[str, str]  # statement name -> the source it comes from, for the trailing comment
    every: list[Stmt]  # the statements the outputs need, in order
    col_coords: list[str]  # the column coordinates, defined again for each column block
    by_name: dict[str, Stmt] = field(init=False)
    contiguous: set[int] = field(init=False)  # the full-size inputs, read at the output's offset under CONTIG

    def __post_init__(self) -> None:
        self.by_name = {s.name: s for s in self.plan.stmts}
        self.contiguous = set(identity_inputs(self.plan))

    def statement(self, s: Stmt) -> str:
        """`s` with no cache policy: the whole-row kernel reads its row once, and a looped kernel's
        row values load no full-size input."""
        return _stmt_line(self.plan, s, self.comments, self.contiguous)

    def reduction_pass_statement(self, s: Stmt) -> str:
        """`s` in a pass of a looped kernel that accumulates reductions."""
        # A looped kernel reads its rows once per pass: ask L2 to keep them until the last pass,
        # which then streams them out.
        return _stmt_line(self.plan, s, self.comments, self.contiguous, "evict_last")

    def output_pass_statement(self, s: Stmt) -> str:
        """`s` in the last pass of a looped kernel, the one that writes the outputs."""
        return _stmt_line(self.plan, s, self.comments, self.contiguous, "evict_first")


def _rows(
    plan: KernelPlan,
    kernel_name: str,
    comments: dict[str, str],
    divs: Divisors,
    args: KernelArgs,
    looped: bool,
    across: bool = False,
) -> str:
    """A row kernel: `_block` holds a whole row in registers, `_loop` (`looped`) walks it in column
    blocks, `_across` (`across`) holds whole rows too, its tiles' rows down the last row dim.  With
    CONTIG (the launcher checks the full-size inputs are contiguous) those inputs are read at
    rows * C + cols, the same flat offset the output uses."""
    every = _closure(plan, [o.stmt for o in plan.outputs], lambda s: True)
    used = _used_coords(every, plan)
    # The loop kernel owns one row a program and keeps it 1-D: the same code over [1, BLOCK_C]
    # tiles took 126 µs instead of 97 µs on an H200 (GroupNorm, 32768-wide rows).
    first = "pid" if looped else "pid * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]"
    row = _RowKernel(plan, comments, every, _coords(plan, used, "c", divs))
    body = _loop_body(row) if looped else _block_body(row)
    if column_totals(plan) and not looped:
        walked = _row_head(plan, used, divs, "blk * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]")
        return _kernel_text(plan, kernel_name, args, _totalling_rows(plan, walked, body))
    head = (
        _across_row_head(plan, used, divs)
        if across
        else ["pid = tl.program_id(0)", *_row_head(plan, used, divs, first)]
    )
    return _kernel_text(plan, kernel_name, args, head + body)


def _totalling_rows(plan: KernelPlan, walked: list[str], body: list[str]) -> list[str]:
    """A whole-row kernel with outputs summed over the rows: each program walks blocks of rows
    (pid, pid + programs, ...), adds each block's columns into float32 accumulators, and writes its
    partial sums once, as row `pid` of a [programs, C] buffer the launcher adds up.  One program a
    block of rows would write a partial for every block: as much as the full-size product.
    `walked`: each block's rows (`blk`'s), their mask and coordinates."""
    totals = column_totals(plan)
    code = CodeBuffer(
        ["pid = tl.program_id(0)", *[f"total{k} = tl.zeros([1, BLOCK_C], dtype=tl.float32)" for k in totals]]
    )
    with code.block("for blk in range(pid, tl.cdiv(R, BLOCK_R), tl.num_programs(0)):"):
        code.write(*walked, *body)
    code.write("cols = tl.arange(0, BLOCK_C)[None, :]")
    code.write(*[f"tl.store(out{k}_ptr + (pid * C + cols), total{k}, mask=cols < C)" for k in totals])
    return code.lines()


def _across_row_head(plan: KernelPlan, used: set[int], divs: Divisors) -> list[str]:
    """The across row kernel's program: one position of the row dims before the last (`outer`)
    and a block of the last row dim's positions (`last`, of F) down the tile's rows.  An input
    laid out along that dim (the launcher's `_down_rows` finds it at call time) then has an
    `arange` for its stride-1 coordinate, so Triton can see it is contiguous down the tile and
    reads it in runs of memory, where the block kernel's rows, found by division, read it one
    element a row."""
    return [
        "pid = tl.program_id(0)",
        "outer = pid // fast_blocks",
        "last = (pid % fast_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]",
        _in_64_bits("outer", "last"),
        "rows = outer * F + last",
        "rmask = last < F",
        *_across_row_coords(plan, used, divs),
    ]


def _across_row_coords(plan: KernelPlan, used: set[int], divs: Divisors) -> list[str]:
    """The row coordinates of the across row kernel: the last is `last`, the others come from `outer`."""
    k = plan.row_dims
    out = [f"c{k - 1} = last"] if k - 1 in used else []
    return out + _delinearize("outer", list(range(k - 1)), [i for i in used if i < k - 1], divs)


def _row_head(plan: KernelPlan, used: set[int], divs: Divisors, first: str) -> list[str]:
    """The rows `first` (their index), their mask and the row coordinates the statements use."""
    return [
        f"rows = {first}",
        _in_64_bits("rows"),
        "rmask = rows < R",
        *_coords(plan, used, "r", divs),
    ]


# ---- the whole-row kernel (_block) --------------------------------------------------------


def _block_body(row: _RowKernel) -> list[str]:
    """The whole row's columns and coordinates, then every statement in order, each reduction
    over the tile's columns, each output stored right after its value."""
    body = ["cols = tl.arange(0, BLOCK_C)[None, :]", "cmask = cols < C", "mask = rmask & cmask", *row.col_coords]
    # Each output is stored as soon as it is computed: the write is under way while the
    # row's reductions run, and the value need not stay live across them (GPT's embedding
    # add + LayerNorm, which also returns the sum, in bf16 on an H200: 41.6 -> 40.1 µs).
    stores = _outputs_by_statement(row.plan)
    for s in _loads_first(row.every):
        body.append(_block_reduction(s, row.comments) if s.reduce else row.statement(s))
        body += [_store_or_total(row.plan, k, s) for k in stores.get(s.name, [])]  # `every` holds each output
    return body


def _loads_first(stmts: list[Stmt]) -> list[Stmt]:
    """`stmts` with every load whose address needs no computed value first.  A reduction across a
    tile's warps is a barrier that no memory access crosses, so a load written after one starts
    only when the reduction ends: a LayerNorm backward reading x and y after the row sum of the
    gradient waited for memory twice a block of rows."""
    first = [s for s in stmts if s.load_input is not None and not s.deps]
    return first + [s for s in stmts if s.load_input is None or s.deps]


def _store_or_total(plan: KernelPlan, k: int, value: Stmt) -> str:
    """The store of output `k`, or for one summed over the rows its block's columns added in."""
    if not plan.outputs[k].col_total:
        return _store(plan, k, value)
    v = value.name if value.axes >= {"r", "c"} else f"tl.broadcast_to({value.name}, [BLOCK_R, BLOCK_C])"
    return f"total{k} += tl.sum(tl.where(mask, {v}, 0.0), axis=0)[None, :]"


def _outputs_by_statement(plan: KernelPlan) -> dict[str, list[int]]:
    """Statement name -> the outputs it is (one value may be returned twice)."""
    outputs: dict[str, list[int]] = {}
    for k, o in enumerate(plan.outputs):
        outputs.setdefault(o.stmt, []).append(k)
    return outputs


def _block_reduction(s: Stmt, comments: dict[str, str]) -> str:
    """The reduction `s` over a row held whole, masked lanes at its identity, kept [BLOCK_R, 1]."""
    reduced = f"{_FINAL[s.how]}(tl.where(mask, {s.expr}, {_IDENTITY[s.how]}), axis=1)[:, None]"
    return f"{s.name} = {reduced}{_note(s, comments)}"


# ---- the looped kernel (_loop) ------------------------------------------------------------


def _loop_body(row: _RowKernel) -> list[str]:
    """One pass over the row's column blocks per reduction level, accumulating that level's
    reductions (and those folded into them); the row values, scalars here, computed as soon as
    the reductions they need are; then one pass that recomputes and stores the full-size
    outputs, and the stores of the row outputs."""
    done: set[str] = set()
    body = [row.statement(s) for s in _ready_row_values(row, done, 0)]
    for level in range(1, row.plan.levels + 1):
        reductions = [s for s in row.every if s.reduce and s.level == level and s.name not in done]
        if reductions:
            folded = _folded_into(reductions, row.every)
            body += _reduction_pass(row, reductions, folded)
            done |= {r.name for r in reductions} | {f.name for f in folded.values()}
        body += [row.statement(s) for s in _ready_row_values(row, done, level)]
    return body + _output_pass(row) + _row_output_stores(row)


def _ready_row_values(row: _RowKernel, done: set[str], level: int) -> list[Stmt]:
    """The row values (not reductions) of `level` or below not yet computed whose row operands all
    are, in order; they are added to `done` as found, so one that needs another found here follows it."""
    ready = []
    for s in row.every:
        pending = _is_row_value(s) and not s.reduce and s.level <= level and s.name not in done
        if pending and all(d in done or not _is_row_value(row.by_name[d]) for d in s.deps):
            ready.append(s)
            done.add(s.name)
    return ready


def _folded_into(reductions: list[Stmt], every: list[Stmt]) -> dict[str, Stmt]:
    """Reduction name -> the later reduction accumulated in the same pass (`_folds`)."""
    return {r.name: f for r in reductions for f in every if _folds(f, r)}


def _reduction_pass(row: _RowKernel, reductions: list[Stmt], folded: dict[str, Stmt]) -> list[str]:
    """A pass that accumulates `reductions` (and those `folded` into them) lane by lane over the
    row's column blocks, then reduces the lanes to the row's values."""
    operands = _closure(row.plan, [r.reduced for r in reductions], _varies_along_columns)
    loop = [row.reduction_pass_statement(s) for s in operands]
    loop += [line for r in reductions for line in _accumulate(r, folded.get(r.name))]
    body = _accumulators(row, reductions, folded) + _column_loop(row.col_coords, loop)
    for r in reductions:
        body += _finish(r, folded.get(r.name), _note(r, row.comments))
    return body


def _accumulators(row: _RowKernel, reductions: list[Stmt], folded: dict[str, Stmt]) -> list[str]:
    """Before a pass: each reduction's accumulator, a lane per column of a block, at its identity
    (a folded one's at 0); a shifted sum first finds its shift."""
    lines = []
    for r in reductions:
        later = folded.get(r.name)
        if later is not None and later.centered:
            operands = _closure(row.plan, [r.reduced], _varies_along_columns)
            lines += _shift_prologue(r, [row.reduction_pass_statement(s) for s in operands], row.col_coords)
        lanes = "[]" if later is not None and later.online else "[BLOCK_C]"  # an online max is the row's so far
        lines.append(f"{r.name}_acc = tl.full({lanes}, {_IDENTITY[r.how]}, tl.float32)")
        if later is not None:
            lines.append(f"{later.name}_acc = tl.full([BLOCK_C], 0.0, tl.float32)")
    return lines


def _shift_prologue(r: Stmt, operand_lines: list[str], col_coords: list[str]) -> list[str]:
    """`{r}_shift`: the mean of the row's first column block.  Sums of (x - shift) and its square
    give the mean and the centred sum of squares in one pass without the cancellation that
    sum(x^2) - sum(x)^2 / n suffers when the mean is large against the spread."""
    shift = (
        f"{r.name}_shift = tl.sum(tl.where(mask, {r.expr}, 0.0), axis=0) / "
        "tl.maximum(tl.sum(mask.to(tl.float32), axis=0), 1.0)"
    )
    first_block = "for col0 in range(0, BLOCK_C, BLOCK_C):  # the first column block only"
    return [f"{r.name}_shift = 0.0", *_column_loop(col_coords, [*operand_lines, shift], first_block)]


def _accumulate(r: Stmt, folded: Stmt | None) -> list[str]:
    """Loop-body lines that add one column block to `r`'s accumulator (and `folded`'s)."""
    x, acc = r.expr, f"{r.name}_acc"
    if folded is None:
        return [f"{acc} = " + _COMBINE[r.how].format(acc=acc, x=f"tl.where(mask, {x}, {_IDENTITY[r.how]})")]
    if folded.centered:
        d = f"{r.name}_d"
        return [
            f"{d} = tl.where(mask, {x} - {r.name}_shift, 0.0)",
            f"{acc} = {acc} + {d}",
            f"{folded.name}_acc = {folded.name}_acc + {d} * {d}",
        ]
    # Online softmax: the row's running max, and a running sum per lane rescaled whenever the max
    # grows.  One max per column block, not per lane, so that an element costs one exp, not two:
    # at bf16 and DRAM speed the exps, not the bytes, would bound the kernel.
    xm, new, safe = f"{r.name}_x", f"{r.name}_new", f"{r.name}_safe"
    return [
        f"{xm} = tl.where(mask, {x}, float('-inf'))",
        f"{new} = tl.maximum({acc}, tl.max({xm}, axis=0))",
        f"{safe} = tl.where({new} == float('-inf'), 0.0, {new})  # no -inf - -inf",
        f"{folded.name}_acc = {folded.name}_acc * tl.exp({acc} - {safe}) + tl.exp({xm} - {safe})",
        f"{acc} = {new}",
    ]


def _finish(r: Stmt, folded: Stmt | None, note: str) -> list[str]:
    """After the loop: `r` (and `folded`) as the row's values."""
    if folded is None:
        return [f"{r.name} = {_FINAL[r.how]}({r.name}_acc, axis=0){note}"]
    if folded.centered:
        dsum = f"{r.name}_dsum"
        return [
            f"{dsum} = tl.sum({r.name}_acc, axis=0)",
            f"{r.name} = {dsum} + {r.name}_shift * C{note}",
            f"{folded.name} = tl.maximum(tl.sum({folded.name}_acc, axis=0) - {dsum} * {dsum} / C, 0.0)",
        ]
    return [  # every lane's sum is already relative to the row's max
        f"{r.name} = {r.name}_acc{note}",
        f"{folded.name} = tl.sum({folded.name}_acc, axis=0)",
    ]


def _output_pass(row: _RowKernel) -> list[str]:
    """The last pass: the full-size outputs, recomputed column block by column block from the
    inputs and the row's values, and stored."""
    full = [(k, o) for k, o in enumerate(row.plan.outputs) if not o.row_only]
    if not full:
        return []
    operands = _closure(row.plan, [o.stmt for _, o in full], _varies_along_columns)
    nhwc = channels_last_groups(row.plan)
    stores = [_loop_store(k, row.by_name[o.stmt], dims=o.dims, channels_last=nhwc) for k, o in full]
    return _column_loop(row.col_coords, [row.output_pass_statement(s) for s in operands] + stores)


def _row_output_stores(row: _RowKernel) -> list[str]:
    """The stores of the outputs of one value per row (a reduction's result), after every pass."""
    return [_loop_store(k, row.by_name[o.stmt], row=True) for k, o in enumerate(row.plan.outputs) if o.row_only]


def _column_loop(
    col_coords: list[str], lines: list[str], header: str = "for col0 in range(0, C, BLOCK_C):"
) -> list[str]:
    """A loop over the row's column blocks: each block's columns, masks and column coordinates, then `lines`."""
    code = CodeBuffer()
    with code.block(header):
        code.write("cols = col0 + tl.arange(0, BLOCK_C)", "cmask = cols < C", "mask = rmask & cmask")
        code.write(*col_coords, *lines)
    return code.lines()


def _loop_store(
    k: int, value: Stmt, row: bool = False, dims: tuple[int, ...] | None = None, channels_last: bool = False
) -> str:
    """A store of the loop kernel, where a row value is a scalar and a column block 1-D; `dims`: a
    permuted output's domain dim for each of its dims, addressed by its own strides; `channels_last`:
    a group norm's output, channels-last under CL."""
    cast = f".to(out{k}_ptr.dtype.element_ty)"
    if row:
        return f"tl.store(out{k}_ptr + rows, {value.name}{cast}, mask=rmask)"
    v = value.name if "c" in value.axes else f"tl.zeros([BLOCK_C], tl.float32) + {value.name}"
    if dims is not None:
        return f"tl.store(out{k}_ptr + ({_permuted_offset(k, dims)}), {v}{cast}, mask=mask)"
    offset = "flat" if channels_last else "(rows * C + cols)"
    return f"tl.store(out{k}_ptr + {offset}, {v}{cast}, mask=mask)"


def _folds(later: Stmt, r: Stmt) -> bool:
    """Whether the reduction `later` can be accumulated in the same pass as `r`."""
    if later.centered:
        return r.reduce == "sum" and later.centered == (r.reduced, r.name)
    if later.online:
        return r.reduce == "max" and later.online == (r.reduced, r.name)
    return False


def _is_row_value(s: Stmt) -> bool:
    """Whether `s` is one value per row: it does not vary along the columns."""
    return "c" not in s.axes


def _varies_along_columns(s: Stmt) -> bool:
    """Whether `s` differs from column to column, so that a looped kernel computes it inside a pass."""
    return not _is_row_value(s)


def _note(s: Stmt, comments: dict[str, str]) -> str:
    """`s`'s trailing comment: the source it comes from, or the planner's own note."""
    note = comments.get(s.name) or s.comment
    return f"  # {note}" if note else ""


# ---- the split group kernels (_stats, _combine, _apply) ----------------------------------------
#
# A group norm walked one group a program reads a channels-last tensor 16 bytes a pixel (bf16, 8
# channels a group) and 512 bytes apart.  These kernels take a block of pixels with every channel,
# as a [BLOCK_P, GP, CGP] tile (pixels, groups, channels of a group): `_stats` writes each block's
# sum and centered sum of squares per group, `_combine` adds a sample's blocks up (Chan's parallel
# variance), and `_apply` recomputes the tile's values and normalises them.  Each tile is whole
# pixel rows of memory in either layout, and Triton moves it between the layout it is read in and
# the one it is written in.


def _split_groups(plan: KernelPlan, kernel_name: str, comments: dict[str, str], args: dict[str, KernelArgs]) -> str:
    every = _closure(plan, [o.stmt for o in plan.outputs], lambda s: True)
    first, second = [s for s in every if s.reduce]
    before = every[: every.index(first)]
    stats = [*_split_tile(), *_split_lines(plan, before, comments)]
    stats += [
        f"u = tl.where(mask, {first.expr}, 0.0)",
        "count = tl.zeros([GP], tl.float32) + (tl.minimum(HW - pb * BLOCK_P, BLOCK_P) * CG).to(tl.float32)",
        "total = tl.sum(tl.sum(u, axis=2), axis=0)",
        "centered = tl.where(mask, u - (total / tl.maximum(count, 1.0))[None, :, None], 0.0)",
        "squares = tl.sum(tl.sum(centered * centered, axis=2), axis=0)",
        "g1 = tl.arange(0, GP)",
        "at = (c0 * PB + pb) * GP + g1",
        "tl.store(ws_ptr + at, total, mask=g1 < G)",
        "tl.store(ws_ptr + PLANE + at, squares, mask=g1 < G)",
        "tl.store(ws_ptr + 2 * PLANE + at, count, mask=g1 < G)",
    ]
    apply = [*_split_tile(), *_split_lines(plan, before, comments)]
    apply += [
        "g3 = tl.arange(0, GP)[None, :, None]",
        f"{first.name} = tl.load(stats_ptr + c0 * GP + g3, mask=g3 < G, other=0.0)",
        f"{second.name} = tl.load(stats_ptr + N * GP + c0 * GP + g3, mask=g3 < G, other=0.0)",
    ]
    stores = _outputs_by_statement(plan)
    for s in every[every.index(first) + 1 :]:
        if s is not second:
            apply.append(_split_statement(plan, s, comments))
        for k in stores.get(s.name, []):
            v = s.name if s.axes >= {"r", "c"} else f"tl.zeros([BLOCK_P, GP, CGP], tl.float32) + {s.name}"
            offset = f"c0 * out{k}_s0 + c1 * out{k}_s1 + hw * out{k}_s3"
            apply.append(f"tl.store(out{k}_ptr + ({offset}), {v}.to(out{k}_ptr.dtype.element_ty), mask=mask)")
    return "\n\n".join(
        [
            _kernel_text(plan, kernel_name + "_stats", args["stats"], stats),
            _split_combine(kernel_name + "_combine", args["combine"]),
            _kernel_text(plan, kernel_name + "_apply", args["apply"], apply),
        ]
    )


def _split_tile() -> list[str]:
    """A program's tile: sample c0, pixels `hw` of block `pb`, every group `g` and its channels."""
    return [
        "pid = tl.program_id(0)",
        "c0 = pid // PB",
        "pb = pid % PB",
        "hw = pb * BLOCK_P + tl.arange(0, BLOCK_P)[:, None, None]",
        "g = tl.arange(0, GP)[None, :, None]",
        "cg = tl.arange(0, CGP)[None, None, :]",
        _in_64_bits("c0", "hw"),
        "rows = c0 * G + g",
        "rmask = (g < G) & (hw < HW)",
        "cmask = cg < CG",
        "mask = rmask & cmask",
        "c1 = g * CG + cg",
        "c2 = hw // d3",
        "c3 = hw % d3",
    ]


def _split_lines(plan: KernelPlan, stmts: list[Stmt], comments: dict[str, str]) -> list[str]:
    return [_split_statement(plan, s, comments) for s in stmts]


def _split_statement(plan: KernelPlan, s: Stmt, comments: dict[str, str]) -> str:
    """`s` over the split tile.  A load's spatial dims are one (the launcher checks every input's
    are dense), so the pixel index addresses them and Triton sees the runs of pixels in memory."""
    if isinstance(s.expr, Load):
        at = list(s.expr.at)
        for k in range(len(at) - 1):
            if at[k] == (2, Dim(2)) and at[k + 1] == (3, Dim(3)):
                pixels = Load(s.expr.input, (*at[:k], (3, Name("hw")), *at[k + 2 :]))
                return _stmt_line(plan, dataclasses.replace(s, expr=pixels), comments)
    return _stmt_line(plan, s, comments)


def _split_combine(name: str, args: KernelArgs) -> str:
    """One program a sample: its blocks' sums and centered squares, added up per group (Chan's
    parallel variance), written as the group's sum and centered sum of squares."""
    code = CodeBuffer(args.signature(name, wrap=False))
    with code.indent():
        code.write("n = tl.program_id(0)", "g1 = tl.arange(0, GP)[None, :]")
        code.write("total = tl.zeros([GP], tl.float32)", "count = tl.zeros([GP], tl.float32)")
        with code.block("for b0 in range(0, PB, BLOCK_B):"):
            code.write(*_combined_block())
            code.write("total += tl.sum(tl.load(ws_ptr + at, mask=m, other=0.0), axis=0)")
            code.write("count += tl.sum(tl.load(ws_ptr + 2 * PLANE + at, mask=m, other=0.0), axis=0)")
        code.write("mean = total / tl.maximum(count, 1.0)", "squares = tl.zeros([GP], tl.float32)")
        with code.block("for b0 in range(0, PB, BLOCK_B):"):
            code.write(*_combined_block())
            code.write(
                "s = tl.load(ws_ptr + at, mask=m, other=0.0)", "k = tl.load(ws_ptr + 2 * PLANE + at, mask=m, other=0.0)"
            )
            code.write("d = tl.where(k > 0, s / tl.maximum(k, 1.0) - mean[None, :], 0.0)")
            code.write("squares += tl.sum(tl.load(ws_ptr + PLANE + at, mask=m, other=0.0) + k * d * d, axis=0)")
        code.write("g = tl.arange(0, GP)", "tl.store(stats_ptr + n * GP + g, total, mask=g < G)")
        code.write("tl.store(stats_ptr + N * GP + n * GP + g, squares, mask=g < G)")
    return code.text()


def _combined_block() -> list[str]:
    """A block of a sample's programs' partial results, as `_combine` walks them."""
    return ["b = b0 + tl.arange(0, BLOCK_B)[:, None]", "m = (b < PB) & (g1 < G)", "at = (n * PB + b) * GP + g1"]
