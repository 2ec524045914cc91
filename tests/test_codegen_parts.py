"""The code generator's parts on their own: the record of a kernel's arguments, the code buffer the
printers write into, the terms kernels' coordinates and values are made of, and the rules of which
kernel variants a plan gets."""

from __future__ import annotations

import pytest

from fuselens.codegen.code_buffer import CodeBuffer
from fuselens.codegen.kernel_args import KernelArgs
from fuselens.codegen.terms import Dim, Load, Name, Value, call, compare, dims, paren, values
from fuselens.codegen.variants import ELEMENTWISE, ROWS, Family
from fuselens.codegen.variants.elementwise import AcrossKernel, TileKernel, WideKernel


def _record() -> KernelArgs:
    args = KernelArgs().add("in0_ptr", "x").add_each(["d0", "d1"]).unpacked(["p0"], "pitches")
    return args.add("in0_s1", "st0[1]").constexpr("BLOCK_R", "CONTIG")


def test_a_kernels_signature_and_its_launch_are_written_from_one_record():
    args = _record()
    assert args.signature("_k") == [
        "@triton.jit",
        "def _k(in0_ptr, d0, d1, p0, in0_s1, BLOCK_R: tl.constexpr, CONTIG: tl.constexpr):",
    ]
    assert args.call("_k", "grid", {"BLOCK_R": "4", "CONTIG": "dense"}, ["num_warps=warps"]) == [
        "_k[grid](x, d0, d1, *pitches, st0[1],",
        "    BLOCK_R=4, CONTIG=dense, num_warps=warps)",
    ]
    # What the launcher passes for each parameter, one of an unpacked sequence included.
    assert [args.value_of(p) for p in ("in0_ptr", "d1", "p0", "in0_s1")] == ["x", "d1", "pitches[0]", "st0[1]"]


def test_a_launch_gives_every_constexpr_of_the_kernel_in_its_order():
    with pytest.raises(ValueError, match="takes constexprs"):
        _record().call("_k", "grid", {"CONTIG": "dense", "BLOCK_R": "4"})
    with pytest.raises(ValueError, match="takes constexprs"):
        _record().call("_k", "grid", {"BLOCK_R": "4"})


def test_a_long_signature_wraps_and_a_kernels_own_arguments_leave_the_plans_alone():
    plan = KernelArgs().add_each(f"in{k}_ptr" for k in range(12)).constexpr("BLOCK_R")
    tile = plan.copy().add("col_blocks").constexpr("CONTIG")
    lines = tile.signature("_cluster0_kernel_tile")
    assert all(len(line) <= 96 for line in lines) and len(lines) == 4
    assert lines[-2].endswith(" col_blocks, BLOCK_R: tl.constexpr,") and lines[-1] == "    CONTIG: tl.constexpr):"
    assert "col_blocks" not in plan.parameters()


def test_code_is_indented_by_the_blocks_it_is_written_in():
    inner = CodeBuffer(["x = 1", "if y:\n    z = 2"])
    code = CodeBuffer(["def f():"])
    with code.indent():
        with code.block("for i in range(3):"):
            code.splice(inner)
        code.write("", "return x")
    code.branches("CONTIG", CodeBuffer(["a = 1"]), CodeBuffer(["a = 2"]), note="dense")
    assert code.text() == "\n".join(
        [
            "def f():",
            "    for i in range(3):",
            "        x = 1",
            "        if y:",
            "            z = 2",
            "",  # a blank line stays blank
            "    return x",
            "if CONTIG:  # dense",
            "    a = 1",
            "else:",
            "    a = 2",
        ]
    )


def test_terms_print_as_the_kernel_spells_them_and_say_what_they_read():
    # A slice's offset into the coordinate along dim 3, and a row picked at a loaded token id.
    at = ((0, paren(Dim(3) + 48)), (1, Value(4)))
    load = Load(2, at)
    assert str(load) == "in2_ptr + ((c3 + 48) * in2_s0 + v4 * in2_s1)"
    assert dims(load) == {3} and values(load) == ["v4"]
    guard = paren(compare(Value(4), ">=", 0)) & paren(compare(Value(4), "<", Name("C")))
    assert str(guard) == "(v4 >= 0) & (v4 < C)"
    assert str(call("tl.where", guard, Value(1) * 0.5, 0.0)) == "tl.where((v4 >= 0) & (v4 < C), v1 * 0.5, 0.0)"


def test_a_term_whose_text_would_group_otherwise_is_refused():
    with pytest.raises(ValueError, match="group otherwise"):
        _ = (Dim(0) + 1) * Dim(1)  # would print `c0 + 1 * c1`
    with pytest.raises(ValueError, match="group otherwise"):
        compare(compare(Dim(0), "<", 1), "!=", 0)
    assert str(paren(Dim(0) + 1) * Dim(1)) == "(c0 + 1) * c1"


@pytest.mark.parametrize("family", [ELEMENTWISE, ROWS], ids=["elementwise", "rows"])
def test_every_variant_is_written_and_tried_and_the_last_tried_runs_any_plan(family):
    assert sorted(v.__name__ for v in family.written) == sorted(v.__name__ for v in family.tried)
    assert len(set(family.written)) == len(family.written)
    assert family.tried[-1].applies(None)  # the fallback takes any plan of its kind
    for a, b in family.exclusive:
        assert a in family.written and b in family.written


def test_variants_that_cannot_both_run_a_plan_are_refused_together():
    class AlwaysWide(WideKernel):
        @staticmethod
        def applies(plan):
            return True

    class AlwaysAcross(AcrossKernel):
        @staticmethod
        def applies(plan):
            return True

    family = Family(
        "",
        (TileKernel, AlwaysAcross, AlwaysWide),
        (AlwaysWide, AlwaysAcross, TileKernel),
        ((AlwaysWide, AlwaysAcross),),
    )
    with pytest.raises(AssertionError, match="both apply"):
        family.variants(None)
