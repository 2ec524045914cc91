"""The split group kernels of a group norm (`_stats`, `_combine`, `_apply`).

A group norm walked one group a program reads a channels-last tensor 16 bytes a pixel (bf16, 8
channels a group) and 512 bytes apart.  These kernels take a block of pixels with every channel,
as a [BLOCK_P, GP, CGP] tile (pixels, groups, channels of a group): `_stats` writes each block's
sum and centered sum of squares per group, `_combine` adds a sample's blocks up (Chan's parallel
variance), and `_apply` recomputes the tile's values and normalises them.  Each tile is whole
pixel rows of memory in either layout, and Triton moves it between the layout it is read in and
the one it is written in.
"""

from __future__ import annotations

import dataclasses

from ..code_buffer import CodeBuffer
from ..kernel_args import KernelArgs
from ..kernel_text import in_64_bits, kernel_text, outputs_by_statement, stmt_line
from ..launcher import WARPS, constexprs
from ..plan import KernelPlan, Stmt, split_groups
from ..terms import Dim, Load, Name
from .base import Context, Launch, Variant

# The kernels' own constexprs: the tile's pixels, groups (padded to a power of two), channels a
# group and those padded.
_SIZES = ("BLOCK_P", "GP", "CG", "CGP")


class SplitGroupKernels(Variant):
    """A group norm whose statistics gather in pieces (`plan.split_groups`): a block of pixels with
    every channel a program, for a channels-last input, or a channels-first one that only
    convolutions read, whose pixels are one dim in memory (the launcher's `split`)."""

    suffix = "stats"
    strategy = "group-split"

    @staticmethod
    def applies(plan: KernelPlan) -> bool:
        return split_groups(plan)

    def _stats_arguments(self, context: Context) -> KernelArgs:
        return context.record(
            "stats",
            lambda args: (
                args.add("ws_ptr", "ws").add_each(["HW", "PB"]).add("PLANE", "d0 * PB * GP").constexpr(*_SIZES)
            ),
        )

    def _apply_arguments(self, context: Context) -> KernelArgs:
        def build(args: KernelArgs) -> KernelArgs:
            args.add("stats_ptr", "stats").add_each(["HW", "PB"]).add("N", "d0")
            for k, out in enumerate(context.plan.outputs):
                for j in () if out.row_only else (0, 1, 3):  # a kept statistic is [N, G], contiguous
                    args.add(f"out{k}_s{j}", f"out{k}.stride({j})")
            return args.constexpr(*_SIZES)

        return context.record("apply", build)

    def _combine_arguments(self, context: Context) -> KernelArgs:
        """`_combine` reads the workspace, not the tensors: none of the plan's arguments."""
        return context.record(
            "combine",
            lambda args: (
                args.add("ws_ptr", "ws")
                .add("stats_ptr", "stats")
                .add("PB")
                .add("PLANE", "d0 * PB * GP")
                .add("N", "d0")
                .add("G")
                .constexpr("GP", "BLOCK_B")
            ),
            of_plan=False,
        )

    def kernels(self, context: Context) -> str:
        plan, comments = context.plan, context.comments
        every = context.statements()
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
        stores = outputs_by_statement(plan)
        for s in every[every.index(first) + 1 :]:
            if s is not second:
                apply.append(_split_statement(plan, s, comments))
            for k in stores.get(s.name, []):
                apply.append(_split_store(plan, k, s))
        return "\n\n".join(
            [
                kernel_text(plan, context.name("stats"), self._stats_arguments(context), stats),
                _split_combine(context.name("combine"), self._combine_arguments(context)),
                kernel_text(plan, context.name("apply"), self._apply_arguments(context), apply),
            ]
        )

    def launch(self, context: Context, otherwise: Launch) -> Launch:
        """The three kernels where the launcher decided to split (`split`): `_SPLIT_TILE` elements a tile,
        fewer warps for a channels-first input (whose pixels are the tile's contiguous runs)."""
        plan = context.plan
        device = f"{context.input_names[0]}.device"
        sizes = constexprs(plan, "1", "1", BLOCK_P="block_p", GP="GP", CG="d1 // G", CGP="CGP")
        stats = self._stats_arguments(context).call(context.name("stats"), "(d0 * PB,)", sizes, WARPS)
        apply = self._apply_arguments(context).call(context.name("apply"), "(d0 * PB,)", sizes, WARPS)
        combine = self._combine_arguments(context).call(
            context.name("combine"), "(d0,)", {"GP": "GP", "BLOCK_B": "max(1, 4096 // GP)"}, one_line=True
        )
        split = CodeBuffer(
            [
                "GP, CGP, HW = _next_pow2(G), _next_pow2(d1 // G), d2 * d3",
                "block_p = max(1, _SPLIT_TILE // (GP * CGP))",
                "warps = _SPLIT_WARPS_LAST if cl else _SPLIT_WARPS_FIRST",
                "PB = (HW + block_p - 1) // block_p",
                f"ws = torch.empty((3 * d0 * PB * GP,), device={device}, dtype=torch.float32)",
                f"stats = torch.empty((2 * d0 * GP,), device={device}, dtype=torch.float32)",
                *stats,
                *combine,
                *apply,
            ]
        )
        note = "pixels with every channel a program: either layout at streaming speed"
        return Launch(body=CodeBuffer().branches("split", split, CodeBuffer(otherwise.lines()), note).lines())


def _split_tile() -> list[str]:
    """A program's tile: sample c0, pixels `hw` of block `pb`, every group `g` and its channels."""
    return [
        "pid = tl.program_id(0)",
        "c0 = pid // PB",
        "pb = pid % PB",
        "hw = pb * BLOCK_P + tl.arange(0, BLOCK_P)[:, None, None]",
        "g = tl.arange(0, GP)[None, :, None]",
        "cg = tl.arange(0, CGP)[None, None, :]",
        in_64_bits("c0", "hw"),
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
                return stmt_line(plan, dataclasses.replace(s, expr=pixels), comments)
    return stmt_line(plan, s, comments)


def _split_store(plan: KernelPlan, k: int, s: Stmt) -> str:
    """The store of output `k`, the value of `s`: the tile's elements, or, for a value of each
    (sample, group) kept for the backward (its mean, its reciprocal deviation), the sample's groups,
    once, by the program of the sample's first block of pixels."""
    cast = f".to(out{k}_ptr.dtype.element_ty)"
    if plan.outputs[k].row_only:  # [1, GP, 1], as the groups' statistics are loaded
        return f"tl.store(out{k}_ptr + (c0 * G + g), {s.name}{cast}, mask=(g < G) & (pb == 0))"
    v = s.name if s.axes >= {"r", "c"} else f"tl.zeros([BLOCK_P, GP, CGP], tl.float32) + {s.name}"
    offset = f"c0 * out{k}_s0 + c1 * out{k}_s1 + hw * out{k}_s3"
    return f"tl.store(out{k}_ptr + ({offset}), {v}{cast}, mask=mask)"


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
