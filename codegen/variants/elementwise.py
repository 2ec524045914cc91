"""The kernels of an elementwise plan: the 2-D tile kernel every such plan gets, and the flat, across
and wide kernels for the layouts and widths it serves badly."""

from __future__ import annotations

from ..code_buffer import CodeBuffer
from ..kernel_args import KernelArgs
from ..kernel_text import Divisors, closure, coords, in_64_bits, kernel_text, stmt_line, store, used_coords
from ..launcher import WARPS, constexprs, layouts_display, magic_numbers, widest_item
from ..lowering import FLOAT, tuple_display
from ..plan import (
    KernelPlan,
    element_loads,
    flat_inner_dim,
    folds_a_row_dim,
    full_rank_loads,
    identity_inputs,
    row_views,
)
from .base import Context, Launch, Variant


class TileKernel(Variant):
    """A program a tile of (row block, column block), the rows numbered in the memory order of the
    full-size inputs (the launcher's `pitches`), so that a permuted view is read front to back."""

    suffix = strategy = "tile"

    @staticmethod
    def applies(plan: KernelPlan) -> bool:
        return True

    def arguments(self, context: Context) -> KernelArgs:
        return context.record(self.suffix, lambda args: args.add("col_blocks").constexpr("CONTIG"))

    def kernels(self, context: Context) -> str:
        head = [
            # The launcher passes the column-block count: triton specialises a 1 to a constant,
            # which spares each program a division (bf16 RoPE on an H200: 34.6 -> 33.7 µs).
            "pid = tl.program_id(0)",
            "rows = (pid // col_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]",
            "cols = (pid % col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]",
            in_64_bits("rows", "cols"),
            "rmask = rows < R",
            "cmask = cols < C",
            "mask = rmask & cmask",
        ]
        return _tile_kernel(context, self.suffix, self.arguments(context), head, row_coordinates=True)

    def launch(self, context: Context, otherwise: Launch) -> Launch:
        """One program a (row block, column block), numbered row-block major; the kernel takes the
        column-block count to split its program id."""
        plan = context.plan
        own = constexprs(plan, CONTIG=_contig_condition(plan, context.input_names))
        tile = [
            f"block_r, block_c, warps = _pointwise_tile(R, C, {widest_item(plan)}, {element_loads(plan)})",
            "col_blocks = (C + block_c - 1) // block_c",
            "grid = (((R + block_r - 1) // block_r) * col_blocks,)",
            *self.arguments(context).call(context.name(self.suffix), "grid", own, WARPS),
        ]
        return Launch(body=tile)  # the kernel every plan can run: nothing after it


class FlatKernel(Variant):
    """One flat offset a program's elements, where it addresses every full-size input and the output
    (they share a layout), as Inductor's pointwise kernels do: for plans that need no coordinate, or
    only the one of the dim every tensor lays innermost (`plan.flat_inner_dim`)."""

    suffix = strategy = "flat"

    @staticmethod
    def applies(plan: KernelPlan) -> bool:
        return flat_ok(plan) or flat_inner_dim(plan) is not None

    def arguments(self, context: Context) -> KernelArgs:
        return context.record(self.suffix, lambda args: args)

    def kernels(self, context: Context) -> str:
        plan, comments = context.plan, context.comments
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
        direct = set(identity_inputs(plan))
        inner = flat_inner_dim(plan)
        if inner is not None:  # the permuted views share the offset too: the launcher checks their layout
            direct |= {k for k, _ in full_rank_loads(plan)}
            body.append(f"c{inner} = offs % d{inner}")  # the dim laid out innermost: plain `%` lets triton see its runs
        for st in context.statements():
            if st.load_input in direct:
                note = comments.get(st.name) or st.comment
                convert = ".to(tl.float32)" if st.kind == FLOAT else ""
                body.append(
                    f"{st.name} = tl.load(in{st.load_input}_ptr + offs, mask=mask, other=0){convert}"
                    + (f"  # {note}" if note else "")
                )
            else:
                body.append(stmt_line(plan, st, comments, direct))
        by_name = {st.name: st for st in plan.stmts}
        for k, o in enumerate(plan.outputs):
            value = by_name[o.stmt]
            v = value.name if value.axes else f"tl.broadcast_to({value.name}, [BLOCK_C])"
            body.append(f"tl.store(out{k}_ptr + offs, {v}.to(out{k}_ptr.dtype.element_ty), mask=mask)")
        return kernel_text(plan, context.name(self.suffix), self.arguments(context), body)

    def launch(self, context: Context, otherwise: Launch) -> Launch:
        """Where the full-size inputs are dense in one layout (and, with an inner dim, lay it innermost)."""
        plan, names = context.plan, context.input_names
        inner = flat_inner_dim(plan)
        condition = "dense"
        if inner is not None:  # the one dim the smaller loads index must lie innermost
            leads = tuple_display([names[k] for k in identity_inputs(plan)])
            domain = tuple_display([f"d{i}" for i in range(len(plan.domain))])
            layouts = layouts_display(full_rank_loads(plan), names)
            condition = f"like and _flat_over({leads}, {domain}, {layouts}, {inner})"
        grid = "((R * C + block - 1) // block,)"
        call = self.arguments(context).call(context.name(self.suffix), grid, constexprs(plan, "1", "block"), WARPS)
        launch = CodeBuffer([f"block, warps = _flat_tile(R * C, {widest_item(plan)})", *call])
        note = "one flat offset addresses every full-size input and the output"
        return Launch(body=CodeBuffer().branches(condition, launch, CodeBuffer(otherwise.lines()), note).lines())


class AcrossKernel(Variant):
    """For an input laid out along a row dim (channels-last values added to channels-first ones): one
    position of the other row dims (`outer`), a block of that dim's positions (FAST) down the tile's
    rows and a block of columns across it.  FAST's coordinate is an `arange`, so Triton can see that
    input is contiguous down the tile's rows, as the outputs are along its columns, and reads each way
    in runs of memory (moving the tile between the two layouts on chip).  Each row is written at its
    offset in the outputs' own layout (`orow`, from the outputs' element strides `o<i>`; its columns
    are `oc` apart)."""

    suffix = strategy = "across"
    every_row_coordinate = True

    @staticmethod
    def applies(plan: KernelPlan) -> bool:
        return bool(full_rank_loads(plan))

    def arguments(self, context: Context) -> KernelArgs:
        return context.record(
            self.suffix, lambda args: args.add_each(["col_blocks", "fast_blocks", "F"]).constexpr("FAST")
        )

    def kernels(self, context: Context) -> str:
        plan = context.plan
        head = [
            "pid = tl.program_id(0)",
            "tiles = fast_blocks * col_blocks",
            "outer = pid // tiles",
            "fast = ((pid % tiles) // col_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]",
            "cols = (pid % col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]",
            in_64_bits("outer", "fast", "cols"),
            "rmask = fast < F",
            "cmask = cols < C",
            "mask = rmask & cmask",
        ]
        # `p<i>` here is dim i's step in `outer`, which counts the positions of the other row dims.
        head += _outer_coords(plan, context.divisors, "FAST", "fast")
        head.append("orow = " + " + ".join(f"c{i} * o{i}" for i in range(plan.row_dims)))
        # Rows come from divisions here: every load by its strides.
        return _tile_kernel(context, self.suffix, self.arguments(context), head, by_strides=True, rows="orow")

    def launch(self, context: Context, otherwise: Launch) -> Launch:
        """Where an input is laid out along a row dim (`fast`, the module's `_row_order`)."""
        plan = context.plan
        rows = tuple_display([f"d{i}" for i in range(plan.row_dims)])
        call = self.arguments(context).call(context.name(self.suffix), "grid", constexprs(plan, FAST="fast"), WARPS)
        launch = CodeBuffer([f"F = {rows}[fast]", f"block_r, block_c, warps = _across_tile(F, C, {widest_item(plan)})"])
        launch.write("col_blocks = (C + block_c - 1) // block_c", "fast_blocks = (F + block_r - 1) // block_r")
        launch.write("grid = ((R // F) * fast_blocks * col_blocks,)", *call)
        note = "an input is laid out along row dim `fast`: down the tiles' rows"
        return Launch(body=CodeBuffer().branches("fast >= 0", launch, CodeBuffer(otherwise.lines()), note).lines())


class WideKernel(Variant):
    """For rows of a width the model fixes that is no power of two (Phi-3's 96-wide heads), whose
    full-size inputs lay a row dim one row's width apart (the heads of q sliced from a fused qkv
    projection; FOLD, the launcher's `_folded_row_dim`): a block of positions of the other row dims
    (`outer`) by a block of `wide` columns, which run over FOLD's positions and each one's row, so each
    of `outer`'s rows is one run of memory F rows long, read in tiles with no idle lanes.  With the
    width a constant, FOLD's coordinate and the column are a division and a remainder by it, which
    Triton sees run in blocks, so the loads still move in vectors.  `p<i>` here is dim i's step in
    `outer`; `r<i>` its step in the outputs' own row numbering, from which `rows`, each element's row
    there, is built, so loads under CONTIG and the stores read as the tile kernel's."""

    suffix = strategy = "wide"
    every_row_coordinate = True

    @staticmethod
    def applies(plan: KernelPlan) -> bool:
        return folds_a_row_dim(plan)

    def arguments(self, context: Context) -> KernelArgs:
        rows = [f"r{i}" for i in range(context.plan.row_dims)]
        return context.record(
            self.suffix,
            lambda args: args.add_each(["col_blocks", "F"]).unpacked(rows, "row_pitches").constexpr("FOLD", "CONTIG"),
        )

    def kernels(self, context: Context) -> str:
        plan = context.plan
        head = [
            "pid = tl.program_id(0)",
            "outer = (pid // col_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]",
            "wide = (pid % col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]",
            in_64_bits("outer", "wide"),
            # FOLD's coordinate varies along the columns: a load of one value a row reads at it too, so
            # every mask covers both ways.
            "cmask = wide < F * C",
            "rmask = (outer < R // F) & cmask",
            "mask = rmask",
            "cols = wide % C",
        ]
        head += _outer_coords(plan, context.divisors, "FOLD", "wide // C")
        head.append("rows = " + " + ".join(f"c{i} * r{i}" for i in range(plan.row_dims)))
        return _tile_kernel(context, self.suffix, self.arguments(context), head)

    def launch(self, context: Context, otherwise: Launch) -> Launch:
        """Where the full-size inputs lay a row dim out one row's width apart (`fold`).  The kernel counts
        the other row dims' positions (`pitches` becomes their steps there, and the magic numbers
        follow) and takes the outputs' own row steps (`row_pitches`) besides."""
        plan, names = context.plan, context.input_names
        leads = tuple_display([names[k] for k in identity_inputs(plan)])
        domain = tuple_display([f"d{i}" for i in range(len(plan.domain))])
        own = constexprs(plan, FOLD="fold", CONTIG=_contig_condition(plan, names))
        call = self.arguments(context).call(context.name(self.suffix), "grid", own, WARPS, break_before="CONTIG")
        launch = CodeBuffer([f"row_pitches, pitches = pitches, _outer_steps(pitches, {domain}, fold)"])
        launch.write(*magic_numbers(context.divisor_values()), f"F = {domain}[fold]")
        launch.write(f"block_r, block_c, warps = _wide_tile(R // F, F * C, {widest_item(plan)})")
        launch.write("col_blocks = (F * C + block_c - 1) // block_c")
        launch.write("grid = (((R // F + block_r - 1) // block_r) * col_blocks,)", *call)
        code = CodeBuffer([f"fold = _folded_row_dim({leads}, {domain})"])
        note = "a row dim whose rows lie one after another: read with each row as one"
        return Launch(body=code.branches("fold >= 0", launch, CodeBuffer(otherwise.lines()), note).lines())


def flat_ok(plan: KernelPlan) -> bool:
    """Whether the 1-D kernel can run the plan: every load is of a full-size input at the
    output's own position (or of a single value), so no coordinate is ever computed."""
    direct = set(identity_inputs(plan))
    stmts = closure(plan, [o.stmt for o in plan.outputs], lambda s: True)
    return not used_coords([s for s in stmts if s.load_input not in direct], plan)


def _tile_kernel(
    context: Context,
    suffix: str,
    args: KernelArgs,
    head: list[str],
    row_coordinates: bool = False,
    by_strides: bool = False,
    rows: str = "rows",
) -> str:
    """A tile kernel from its `head` (its program's positions and masks): the row coordinates where
    the head does not find them (`row_coordinates`), the column coordinates, each statement (every load
    by its strides with `by_strides`, else the full-size inputs' at the output's offset under CONTIG),
    and each output stored at its row (`rows`: each row's index, or "orow", its offset)."""
    plan, comments, divs = context.plan, context.comments, context.divisors
    stmts = context.statements()
    direct = set(identity_inputs(plan))
    views = set(row_views(plan))
    lines = [
        stmt_line(plan, st, comments) if by_strides else stmt_line(plan, st, comments, direct, views=views)
        for st in stmts
    ]
    used = used_coords(stmts, plan)
    body = list(head)
    if row_coordinates:
        body += coords(plan, used, "r", divs)
    body += coords(plan, used, "c", divs) + lines
    by_name = {st.name: st for st in plan.stmts}
    body += [store(plan, k, by_name[o.stmt], rows) for k, o in enumerate(plan.outputs)]
    return kernel_text(plan, context.name(suffix), args, body)


def _outer_coords(plan: KernelPlan, divs: Divisors, flag: str, value: str) -> list[str]:
    """Each row coordinate: `value` for the row dim the constant `flag` names, else its position in
    `outer`, the count of the other row dims' positions (`p<i>` being each one's step there)."""
    code = CodeBuffer()
    for i in range(plan.row_dims):
        outer = CodeBuffer([f"c{i} = {divs.mod(divs.div('outer', (f'p{i}',)), (f'd{i}',))}"])
        code.branches(f"{flag} == {i}", CodeBuffer([f"c{i} = {value}"]), outer)
    return code.lines()


def _contig_condition(plan: KernelPlan, names: list[str]) -> str:
    """The tile kernel's CONTIG: the full-size inputs share one dense layout (`dense`) and
    every row view has their strides, so that one row offset addresses them all."""
    views = row_views(plan)
    if not views:
        return "dense"

    def stride(k: int) -> str:  # the launcher already holds st{k} when the kernel takes strides
        return f"st{k}" if plan.inputs[k].strides_used else f"_strides({names[k]})"

    lead = identity_inputs(plan)[0]
    return " and ".join(["dense"] + [f"{stride(k)} == {stride(lead)}" for k in views])
