"""What every kernel's text is made of: its `def` and what it knows of the row width, the domain
coordinates it derives from its program's rows and columns (dividing by sizes read at call time, with
the magic numbers of `Divisors`), each statement of the plan as a line (a load masked and, where it
helps, read at the output's flat offset or kept in L2), and each output's store.  The kernel variants
(`variants/`) write their kernels from these.
"""

from __future__ import annotations

import math
from collections.abc import Set as AbstractSet

from .code_buffer import CodeBuffer
from .kernel_args import KernelArgs
from .lowering import FLOAT
from .plan import (
    KernelPlan,
    Stmt,
    channels_last_groups,
    is_loaded_index,
    permuted_outputs,
)
from .terms import Bin, Dim, Name, Term, TermLike, call, dims, paren, term

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


def in_64_bits(*names: str) -> str:
    """With 64-bit offsets (INDEX_64), `names` (the program's positions) in 64 bits, so that every
    offset computed from them is."""
    code = CodeBuffer()
    with code.block("if INDEX_64:"):
        code.write(*[f"{name} = {name}.to(tl.int64)" for name in names])
    return code.text()


def kernel_text(plan: KernelPlan, kernel_name: str, args: KernelArgs, body: list[str]) -> str:
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


def coords(plan: KernelPlan, used: set[int], axis: str, divs: Divisors) -> list[str]:
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
            return out + delinearize("hw", spatial, [i for i in used if i >= 2], divide)
        if 1 in used:
            out.append(f"c1 = g * (d1 // G) + {divide.div('cols', hw)}")
        wanted = [i for i in used if i >= 2]
        if wanted:
            out.append(f"hw = {divide.mod('cols', hw)}")
            out += delinearize("hw", spatial, wanted, divide)
        return out
    dims = list(range(0, k)) if axis == "r" else list(range(k, n))
    index = "rows" if axis == "r" else "cols"
    if plan.kind == "elementwise" and axis == "r":
        # Rows are numbered in the memory order of the inputs (the launcher's pitches), so a
        # permuted view such as x.transpose(1, 2) is read and written front to back.
        return [f"c{i} = {divide.mod(divide.div('rows', (f'p{i}',)), (f'd{i}',))}" for i in sorted(used) if i < k]
    return out + delinearize(index, dims, [i for i in used if i in dims], divide)


def delinearize(index: str, dims: list[int], wanted: list[int], divide: Divisors | type[PlainDivision]) -> list[str]:
    out = []
    for i in sorted(wanted):
        inner = tuple(f"d{j}" for j in dims if j > i)
        value = divide.div(index, inner) if inner else term(index)
        if i != dims[0]:
            value = divide.mod(value, (f"d{i}",))
        out.append(f"c{i} = {value}")
    return out


def used_coords(stmts: list[Stmt], plan: KernelPlan | None = None) -> set[int]:
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


def stmt_line(
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


def store(plan: KernelPlan, k: int, value: Stmt, rows: str = "rows") -> str:
    """The store of output `k`; `rows`: the name holding each row's index in the output, or "orow"
    (the across kernel): each row's offset in elements, its columns `oc` apart."""
    out = plan.outputs[k]
    cast = f".to(out{k}_ptr.dtype.element_ty)"
    if out.row_only:
        v = value.name if value.axes == {"r"} else f"tl.broadcast_to({value.name}, [BLOCK_R, 1])"
        return f"tl.store(out{k}_ptr + rows, {v}{cast}, mask=rmask)"
    v = value.name if value.axes >= {"r", "c"} else f"tl.broadcast_to({value.name}, [BLOCK_R, BLOCK_C])"
    if out.dims is not None:  # a permutation of the domain, addressed by its own strides
        return f"tl.store(out{k}_ptr + ({permuted_offset(k, out.dims)}), {v}{cast}, mask=mask)"
    if channels_last_groups(plan):
        offset = "flat"
    else:
        offset = "(orow + cols * oc)" if rows == "orow" else f"({rows} * C + cols)"
    return f"tl.store(out{k}_ptr + {offset}, {v}{cast}, mask=mask)"


def permuted_offset(k: int, dims: tuple[int, ...]) -> str:
    """The offset into output `k`, a permutation of the domain (`dims`: the domain dim of each of its
    dims), by its own strides."""
    return " + ".join(f"c{d} * out{k}_s{j}" for j, d in enumerate(dims))


def closure(plan: KernelPlan, targets: list[str], keep) -> list[Stmt]:
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


def outputs_by_statement(plan: KernelPlan) -> dict[str, list[int]]:
    """Statement name -> the outputs it is (one value may be returned twice)."""
    outputs: dict[str, list[int]] = {}
    for k, o in enumerate(plan.outputs):
        outputs.setdefault(o.stmt, []).append(k)
    return outputs
