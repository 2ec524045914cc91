"""The kernels of a row plan (reductions over the row: norms, softmax, losses, pools): the whole-row
and the looped kernel every such plan gets, and the across row kernels for an input laid out along
the last row dim (whole rows down a tile, or blocks of rows walked in column blocks)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..code_buffer import CodeBuffer
from ..kernel_args import KernelArgs
from ..kernel_text import (
    Divisors,
    closure,
    coords,
    delinearize,
    in_64_bits,
    kernel_text,
    outputs_by_statement,
    permuted_offset,
    stmt_line,
    store,
    used_coords,
)
from ..launcher import WARPS, constexprs, layouts_display, widest_item
from ..lowering import tuple_display
from ..plan import (
    KernelPlan,
    Stmt,
    channels_last_groups,
    column_totals,
    gathers,
    identity_inputs,
    row_layouts,
)
from .base import Context, Launch, Variant


class RowKernels(Variant):
    """One program a block of rows: the whole-row kernel (`_block`), which holds a row in registers and
    reads it once, where a row fits (the module's `_row_tile` decides), else the looped one (`_loop`),
    one row a program, which walks it in column blocks: one pass per reduction level, where a mean and
    its centred squares (shifted sums) and a max and its exp-sum (online softmax) share a pass, then
    one pass that writes the outputs.  With CONTIG (the full-size inputs are contiguous) those inputs
    are read at rows * C + cols, the same flat offset the outputs use."""

    suffix = "block"
    strategy = "row-block/row-loop"

    @staticmethod
    def applies(plan: KernelPlan) -> bool:
        return True

    def arguments(self, context: Context) -> KernelArgs:
        """The whole-row and the looped kernel's: they take the same, launched by one call."""
        return context.record(self.suffix, lambda args: args.constexpr("CONTIG", *_group_layout(context.plan)))

    def kernels(self, context: Context) -> str:
        args = self.arguments(context)
        return "\n\n".join([_row_kernel(context, "block", args), _row_kernel(context, "loop", args, looped=True)])

    def launch(self, context: Context, otherwise: Launch) -> Launch:
        """The tile (`prelude`, which the across row kernel's launch reads too), then the launch."""
        plan, names = context.plan, context.input_names
        direct = [names[k] for k in identity_inputs(plan)]
        contiguous = " and ".join(f"{x}.is_contiguous()" for x in direct) or "True"
        layout = {}
        if channels_last_groups(plan):  # the inputs laid out as the group is walked
            laid_out = " and ".join(f"{x}.is_contiguous(memory_format=torch.channels_last)" for x in direct) or "True"
            contiguous = f"({laid_out}) if cl else ({contiguous})"
            layout = {"CL": "cl", "CG": "d1 // G"}
        rows_only = all(o.row_only for o in plan.outputs)  # one pass over each row: fewer warps a row
        switches = (
            ("rows_only", rows_only),
            ("gathers", gathers(plan)),
            ("totals", bool(column_totals(plan))),
            ("windows", bool(plan.windows)),
        )
        flags = "".join(f", {flag}=True" for flag, on in switches if on)
        tile = CodeBuffer([f"block_r, block_c, warps, whole_row = _row_tile(R, C, {widest_item(plan)}{flags})"])
        if plan.groups:
            # A group walked in column blocks runs best with 8 warps a block: bf16 GroupNorm (+ SiLU)
            # over [32, 256, 64, 64] on an H200 took 61.0 µs instead of 63.2 with 16 (with the residual
            # add, 74.9 instead of 80.6).  A whole 32768-wide group in registers spilled: 190 µs.
            with tile.block("if not whole_row:"):
                tile.write("warps = 8")
        launch = CodeBuffer(["grid = ((R + block_r - 1) // block_r,)", *_column_total_buffers(plan, names)])
        launch.write(f"kernel = {context.name('block')} if whole_row else {context.name('loop')}")
        own = constexprs(plan, CONTIG=contiguous, **layout)
        launch.write(*self.arguments(context).call("kernel", "grid", own, WARPS))
        launch.write(*_column_totals_added(plan))
        return Launch(tile.lines(), launch.lines())


class AcrossRowKernel(Variant):
    """For an input laid out along the last row dim (a LayerNorm over the channels of an NCHW tensor
    seen as NHWC): a block of the last row dim's positions down the tile's rows
    (`_across_row_head`), so that input is read in runs of memory; whole rows, as the whole-row
    kernel holds them (`_across`), or, where too few of them fit a tile, the rows walked in column
    blocks as the looped kernel walks one (`_across_loop`: a GroupNorm backward's sums over each
    (sample, channel)'s 4096 pixels of a channels-last gradient, which the whole-row kernel read
    one element a row, 256 pixels apart)."""

    suffix = "across"
    strategy = "across/across-loop"

    @staticmethod
    def applies(plan: KernelPlan) -> bool:
        return bool(row_layouts(plan))

    def gather_divisors(self, context: Context) -> None:
        across_row_coords(context.plan, set(range(context.plan.row_dims)), context.divisors)

    def arguments(self, context: Context) -> KernelArgs:
        layout = _group_layout(context.plan)
        return context.record(
            self.suffix, lambda args: args.add_each(["fast_blocks", "F"]).constexpr("CONTIG", *layout)
        )

    def kernels(self, context: Context) -> str:
        args = self.arguments(context)
        whole = _row_kernel(context, self.suffix, args, across=True)
        return "\n\n".join([whole, _row_kernel(context, "across_loop", args, looped=True, across=True)])

    def launch(self, context: Context, otherwise: Launch) -> Launch:
        """Where an input runs along the last row dim (`_down_rows`): whole rows where the whole-row
        kernel would run with tiles of at least 4 of them (`_across_rows_tile`), else blocks of rows
        walked in column blocks (`_across_loop_tile`); the whole-row or looped launch otherwise."""
        plan = context.plan
        domain = tuple_display([f"d{i}" for i in range(len(plan.domain))])
        last = f"d{plan.row_dims - 1}"
        layouts = layouts_display(row_layouts(plan), context.input_names)
        grid = "((R // F) * fast_blocks,)"
        args, own = self.arguments(context), constexprs(plan, CONTIG="False")
        tile = CodeBuffer(otherwise.prelude)
        tile.write(f"across = _down_rows({layouts}, {domain}, {plan.row_dims})")
        tile.write(f"tile = _across_rows_tile({last}, block_c, {widest_item(plan)}) if across and whole_row else None")
        down = CodeBuffer([f"(block_r, warps), F = tile, {last}", "fast_blocks = (F + block_r - 1) // block_r"])
        down.write(*args.call(context.name(self.suffix), grid, own, WARPS))
        looped = CodeBuffer(
            [f"F = {last}", f"block_r, block_c, warps = _across_loop_tile(R, F, C, {widest_item(plan)})"]
        )
        looped.write("fast_blocks = (F + block_r - 1) // block_r")
        looped.write(*args.call(context.name("across_loop"), grid, own, WARPS))
        note = "an input runs along the last row dim: down the tiles' rows"
        wide = "rows too wide for a tile of several: walked in column blocks"
        rest = CodeBuffer().branches("across", looped, CodeBuffer(otherwise.body), wide)
        branches = CodeBuffer().branches("tile is not None", down, rest, note)
        return Launch(tile.lines(), branches.lines())


def _group_layout(plan: KernelPlan) -> tuple[str, ...]:
    """A group norm's row kernels' own constexprs: CL (a channels-last input) and CG (a group's channels)."""
    return ("CL", "CG") if channels_last_groups(plan) else ()


def _row_kernel(context: Context, suffix: str, args: KernelArgs, looped: bool = False, across: bool = False) -> str:
    """A row kernel: the whole-row one, the looped one (`looped`), or the across row one (`across`),
    which holds whole rows too, its tiles' rows down the last row dim."""
    plan, divs = context.plan, context.divisors
    every = context.statements()
    used = used_coords(every, plan)
    row = _RowKernel(plan, context.comments, every, coords(plan, used, "c", divs), _TILES if across else _ONE_ROW)
    body = _loop_body(row) if looped else _block_body(row)
    if column_totals(plan) and not looped:
        walked = _row_head(plan, used, divs, "blk * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]")
        return kernel_text(plan, context.name(suffix), args, _totalling_rows(plan, walked, body))
    # The loop kernel owns one row a program and keeps it 1-D: the same code over [1, BLOCK_C]
    # tiles took 126 µs instead of 97 µs on an H200 (GroupNorm, 32768-wide rows).  The across one
    # owns a block of rows, [BLOCK_R, BLOCK_C] tiles (`_TILES`).
    first = "pid" if looped else "pid * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]"
    if across:
        head = _across_row_head(plan, used, divs)
    else:
        head = ["pid = tl.program_id(0)", *_row_head(plan, used, divs, first)]
    return kernel_text(plan, context.name(suffix), args, head + body)


_IDENTITY = {"sum": "0.0", "max": "float('-inf')", "min": "float('inf')"}


@dataclass(frozen=True)
class _Lanes:
    """How a looped kernel's column blocks are shaped: one row a program, its block 1-D and its row
    values scalars (`_ONE_ROW`), or a block of rows, [BLOCK_R, BLOCK_C] tiles and [BLOCK_R, 1] row
    values (`_TILES`, the across loop kernel)."""

    block: str  # an accumulator's shape: a lane per element of a block
    row: str  # a row value's shape
    columns: str  # a block's column indices
    axis: str  # the axis along a row: "1" keeps each row's reduction a column of the tile

    def reduced(self, how: str, x: str) -> str:
        """`x` reduced along the row (`how`: "tl.sum", "tl.max"), a row value."""
        return f"{how}({x}, axis={self.axis})" if self.axis == "0" else f"{how}({x}, axis=1)[:, None]"

    def full(self, value: str) -> str:
        """A row value as a block of the row's elements."""
        return f"tl.zeros({self.block}, tl.float32) + {value}"


_ONE_ROW = _Lanes("[BLOCK_C]", "[]", "col0 + tl.arange(0, BLOCK_C)", "0")
_TILES = _Lanes("[BLOCK_R, BLOCK_C]", "[BLOCK_R, 1]", "col0 + tl.arange(0, BLOCK_C)[None, :]", "1")
_COMBINE = {"sum": "{acc} + {x}", "max": "tl.maximum({acc}, {x})", "min": "tl.minimum({acc}, {x})"}
_FINAL = {"sum": "tl.sum", "max": "tl.max", "min": "tl.min"}


@dataclass
class _RowKernel:
    """What every part of a row kernel's text reads."""

    plan: KernelPlan
    comments: dict[str, str]  # statement name -> the source it comes from, for the trailing comment
    every: list[Stmt]  # the statements the outputs need, in order
    col_coords: list[str]  # the column coordinates, defined again for each column block
    lanes: _Lanes  # a looped kernel's blocks: one row's, or a tile of rows'
    by_name: dict[str, Stmt] = field(init=False)
    contiguous: set[int] = field(init=False)  # the full-size inputs, read at the output's offset under CONTIG

    def __post_init__(self) -> None:
        self.by_name = {s.name: s for s in self.plan.stmts}
        self.contiguous = set(identity_inputs(self.plan))

    def statement(self, s: Stmt) -> str:
        """`s` with no cache policy: the whole-row kernel reads its row once, and a looped kernel's
        row values load no full-size input."""
        return stmt_line(self.plan, s, self.comments, self.contiguous)

    def reduction_pass_statement(self, s: Stmt) -> str:
        """`s` in a pass of a looped kernel that accumulates reductions."""
        # A looped kernel reads its rows once per pass: ask L2 to keep them until the last pass,
        # which then streams them out.
        return stmt_line(self.plan, s, self.comments, self.contiguous, "evict_last")

    def output_pass_statement(self, s: Stmt) -> str:
        """`s` in the last pass of a looped kernel, the one that writes the outputs."""
        return stmt_line(self.plan, s, self.comments, self.contiguous, "evict_first")


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
        in_64_bits("outer", "last"),
        "rows = outer * F + last",
        "rmask = last < F",
        *across_row_coords(plan, used, divs),
    ]


def across_row_coords(plan: KernelPlan, used: set[int], divs: Divisors) -> list[str]:
    """The row coordinates of the across row kernel: the last is `last`, the others come from `outer`."""
    k = plan.row_dims
    out = [f"c{k - 1} = last"] if k - 1 in used else []
    return out + delinearize("outer", list(range(k - 1)), [i for i in used if i < k - 1], divs)


def _row_head(plan: KernelPlan, used: set[int], divs: Divisors, first: str) -> list[str]:
    """The rows `first` (their index), their mask and the row coordinates the statements use."""
    return [
        f"rows = {first}",
        in_64_bits("rows"),
        "rmask = rows < R",
        *coords(plan, used, "r", divs),
    ]


def _block_body(row: _RowKernel) -> list[str]:
    """The whole row's columns and coordinates, then every statement in order, each reduction
    over the tile's columns, each output stored right after its value."""
    body = ["cols = tl.arange(0, BLOCK_C)[None, :]", "cmask = cols < C", "mask = rmask & cmask", *row.col_coords]
    # Each output is stored as soon as it is computed: the write is under way while the
    # row's reductions run, and the value need not stay live across them (GPT's embedding
    # add + LayerNorm, which also returns the sum, in bf16 on an H200: 41.6 -> 40.1 µs).
    stores = outputs_by_statement(row.plan)
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
        return store(plan, k, value)
    v = value.name if value.axes >= {"r", "c"} else f"tl.broadcast_to({value.name}, [BLOCK_R, BLOCK_C])"
    return f"total{k} += tl.sum(tl.where(mask, {v}, 0.0), axis=0)[None, :]"


def _block_reduction(s: Stmt, comments: dict[str, str]) -> str:
    """The reduction `s` over a row held whole, masked lanes at its identity, kept [BLOCK_R, 1]."""
    reduced = f"{_FINAL[s.how]}(tl.where(mask, {s.expr}, {_IDENTITY[s.how]}), axis=1)[:, None]"
    return f"{s.name} = {reduced}{_note(s, comments)}"


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
    operands = closure(row.plan, [r.reduced for r in reductions], _varies_along_columns)
    loop = [row.reduction_pass_statement(s) for s in operands]
    loop += [line for r in reductions for line in _accumulate(r, folded.get(r.name), row.lanes)]
    body = _accumulators(row, reductions, folded) + _column_loop(row, loop)
    for r in reductions:
        body += _finish(r, folded.get(r.name), _note(r, row.comments), row.lanes)
    return body


def _accumulators(row: _RowKernel, reductions: list[Stmt], folded: dict[str, Stmt]) -> list[str]:
    """Before a pass: each reduction's accumulator, a lane per column of a block, at its identity
    (a folded one's at 0); a shifted sum first finds its shift."""
    lines = []
    block, row_value = row.lanes.block, row.lanes.row
    for r in reductions:
        later = folded.get(r.name)
        if later is not None and later.centered:
            operands = closure(row.plan, [r.reduced], _varies_along_columns)
            lines += _shift_prologue(r, [row.reduction_pass_statement(s) for s in operands], row)
        lanes = row_value if later is not None and later.online else block  # an online max is the row's so far
        lines.append(f"{r.name}_acc = tl.full({lanes}, {_IDENTITY[r.how]}, tl.float32)")
        if later is not None:
            lines.append(f"{later.name}_acc = tl.full({block}, 0.0, tl.float32)")
    return lines


def _shift_prologue(r: Stmt, operand_lines: list[str], row: _RowKernel) -> list[str]:
    """`{r}_shift`: the mean of the row's first column block.  Sums of (x - shift) and its square
    give the mean and the centred sum of squares in one pass without the cancellation that
    sum(x^2) - sum(x)^2 / n suffers when the mean is large against the spread."""
    lanes = row.lanes
    total = lanes.reduced("tl.sum", f"tl.where(mask, {r.expr}, 0.0)")
    shift = f"{r.name}_shift = {total} / tl.maximum({lanes.reduced('tl.sum', 'mask.to(tl.float32)')}, 1.0)"
    first_block = "for col0 in range(0, BLOCK_C, BLOCK_C):  # the first column block only"
    start = "0.0" if lanes is _ONE_ROW else f"tl.zeros({lanes.row}, tl.float32)"  # a loop keeps its values' shape
    return [f"{r.name}_shift = {start}", *_column_loop(row, [*operand_lines, shift], first_block)]


def _accumulate(r: Stmt, folded: Stmt | None, lanes: _Lanes) -> list[str]:
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
        f"{new} = tl.maximum({acc}, {lanes.reduced('tl.max', xm)})",
        f"{safe} = tl.where({new} == float('-inf'), 0.0, {new})  # no -inf - -inf",
        f"{folded.name}_acc = {folded.name}_acc * tl.exp({acc} - {safe}) + tl.exp({xm} - {safe})",
        f"{acc} = {new}",
    ]


def _finish(r: Stmt, folded: Stmt | None, note: str, lanes: _Lanes) -> list[str]:
    """After the loop: `r` (and `folded`) as the row's values."""
    if folded is None:
        return [f"{r.name} = {lanes.reduced(_FINAL[r.how], f'{r.name}_acc')}{note}"]
    if folded.centered:
        dsum = f"{r.name}_dsum"
        return [
            f"{dsum} = {lanes.reduced('tl.sum', f'{r.name}_acc')}",
            f"{r.name} = {dsum} + {r.name}_shift * C{note}",
            f"{folded.name} = tl.maximum({lanes.reduced('tl.sum', f'{folded.name}_acc')} - {dsum} * {dsum} / C, 0.0)",
        ]
    return [  # every lane's sum is already relative to the row's max
        f"{r.name} = {r.name}_acc{note}",
        f"{folded.name} = {lanes.reduced('tl.sum', f'{folded.name}_acc')}",
    ]


def _output_pass(row: _RowKernel) -> list[str]:
    """The last pass: the full-size outputs, recomputed column block by column block from the
    inputs and the row's values, and stored."""
    full = [(k, o) for k, o in enumerate(row.plan.outputs) if not o.row_only]
    if not full:
        return []
    operands = closure(row.plan, [o.stmt for _, o in full], _varies_along_columns)
    nhwc = channels_last_groups(row.plan)
    stores = [_loop_store(k, row.by_name[o.stmt], row.lanes, dims=o.dims, channels_last=nhwc) for k, o in full]
    return _column_loop(row, [row.output_pass_statement(s) for s in operands] + stores)


def _row_output_stores(row: _RowKernel) -> list[str]:
    """The stores of the outputs of one value per row (a reduction's result), after every pass."""
    return [
        _loop_store(k, row.by_name[o.stmt], row.lanes, row=True) for k, o in enumerate(row.plan.outputs) if o.row_only
    ]


def _column_loop(row: _RowKernel, lines: list[str], header: str = "for col0 in range(0, C, BLOCK_C):") -> list[str]:
    """A loop over the row's column blocks: each block's columns, masks and column coordinates, then `lines`."""
    code = CodeBuffer()
    with code.block(header):
        code.write(f"cols = {row.lanes.columns}", "cmask = cols < C", "mask = rmask & cmask")
        code.write(*row.col_coords, *lines)
    return code.lines()


def _loop_store(
    k: int,
    value: Stmt,
    lanes: _Lanes,
    row: bool = False,
    dims: tuple[int, ...] | None = None,
    channels_last: bool = False,
) -> str:
    """A store of a looped kernel, of a row value or of a column block (`lanes`); `dims`: a permuted
    output's domain dim for each of its dims, addressed by its own strides; `channels_last`: a group
    norm's output, channels-last under CL."""
    cast = f".to(out{k}_ptr.dtype.element_ty)"
    if row:
        return f"tl.store(out{k}_ptr + rows, {value.name}{cast}, mask=rmask)"
    v = value.name if "c" in value.axes else lanes.full(value.name)
    if dims is not None:
        return f"tl.store(out{k}_ptr + ({permuted_offset(k, dims)}), {v}{cast}, mask=mask)"
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


def _column_total_buffers(plan: KernelPlan, input_names: list[str]) -> list[str]:
    """For each output summed over the rows, what the kernel writes: the whole-row kernel's programs
    (as many as `_total_tile` chooses, each walking blocks of rows) one float32 row of partial sums each; the
    looped kernel every row's values."""
    totals = column_totals(plan)
    if not totals:
        return []
    device = f"{input_names[0]}.device"
    code = CodeBuffer()
    # 16 warps of programs a multiprocessor keep enough rows in flight; their partial sums are
    # that many float32 rows, not one for every row.  Summing them is a column reduction torch
    # runs slowly (on an H200, 8 x 132 rows of 4096 took 19.7 µs a sum beside a 111 µs bf16
    # LayerNorm backward), so the programs take bigger tiles with more warps (`_total_tile`).
    with code.block("if whole_row:"):
        code.write(f"block_r, warps, programs = _total_tile(R, block_r, warps, {len(identity_inputs(plan))})")
        code.write("grid = (programs,)")
    for k in totals:
        code.write(f"out{k} = torch.empty((grid[0] if whole_row else R, C), device={device}, dtype=torch.float32)")
    return code.lines()


def _column_totals_added(plan: KernelPlan) -> list[str]:
    n, k_rows = len(plan.domain), plan.row_dims
    shape = tuple_display([f"d{i}" for i in range(k_rows, n)])
    return [f"out{k} = out{k}.sum(0).reshape({shape})" for k in column_totals(plan)]
