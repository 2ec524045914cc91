"""The kernel module's runtime (`codegen/runtime/`), tested as the modules it is written as: the tile
and layout choices of the launchers, what a kernel's `fits` asks, the backward's helpers, and
`install()` of a library patch.  Every kernel module carries a copy of their text
(`codegen/runtime_source.py`); `tests/test_codegen_golden.py` checks those copies."""

from __future__ import annotations

import ast
import sys
import textwrap
import types

import pytest
import torch

from fuselens.analysis.code_identity import fingerprint
from fuselens.analysis.settings import class_identity
from fuselens.codegen.runtime import fits, ops, patches, tiles
from fuselens.codegen.runtime_source import runtime_source

# ---- tiles ---------------------------------------------------------------------------------------


def test_a_row_width_that_is_not_a_multiple_of_16_is_told_the_power_of_two_it_is_one_of():
    """The kernels' ALIGN (Whisper's 3000-wide rows move eight bf16 elements at once)."""
    assert (tiles._align(3000), tiles._align(768), tiles._align(75), tiles._align(0)) == (8, 16, 1, 1)


def test_a_tile_that_reads_one_value_an_element_gives_each_thread_32_bytes():
    """A convolution's bias + GELU at Whisper's [8, 768, 3000] in bf16 takes 2 x 1024 tiles over 4
    warps (float32: 1 x 1024, already 32 bytes a thread); a RoPE reading five values an element keeps
    8 x 128 tiles, 16 bytes a thread."""
    assert tiles._pointwise_tile(8 * 768, 3000, 2, 1) == (2, 1024, 4)
    assert tiles._pointwise_tile(8 * 768, 3000, 4, 1) == (1, 1024, 4)
    assert tiles._pointwise_tile(2 * 32 * 2048, 128, 2, 5) == (8, 128, 4)


def test_narrow_rows_run_one_warp_to_a_few_rows_and_read_across_in_half_tiles():
    """Rows of up to 512 columns (a ConvNeXt LayerNorm's 96-384 channels) run one warp to up to 8
    rows, as torch.compile's autotuned reductions do, unless the kernel also sums columns over its
    rows; the across row kernel, down an NCHW tensor's 56-wide spatial rows, takes 32 x 128 tiles
    with 8 warps; rows as wide as BERT's keep their tiles, and lookups run one warp a row."""
    assert tiles._row_tile(32 * 56 * 56, 96, 2) == (8, 128, 1, True)
    assert tiles._row_tile(32 * 14 * 14, 384, 2) == (4, 512, 1, True)
    assert tiles._row_tile(32 * 56 * 56, 96, 2, totals=True)[2] > 1
    assert tiles._row_tile(32 * 512, 768, 2) == (1, 1024, 2, True)
    assert tiles._row_tile(16384, 768, 2, gathers=True)[2] == 1
    assert tiles._across_rows_tile(56, 128, 2) == (32, 8)


def test_rows_up_to_the_whole_row_kernels_width_run_whole_and_wider_ones_loop_in_column_blocks():
    assert tiles._row_tile(4, tiles.MAX_BLOCK_ROW, 4)[3]
    block_r, block_c, _, whole_row = tiles._row_tile(4, tiles.MAX_BLOCK_ROW + 1, 4)
    assert (block_r, block_c, whole_row) == (1, tiles.LOOP_BLOCK, False)


def test_small_views_of_huge_tensors_get_64_bit_offsets():
    """A 10-column slice of a 2**16 x 2**16 tensor has few elements but offsets past 2**31."""
    huge = torch.empty(2**16, 2**16, device="meta")
    assert tiles._needs_int64(huge[:, :10])
    assert tiles._needs_int64(torch.empty(2**31, device="meta"))
    assert not tiles._needs_int64(torch.empty(2**16, 2**14, device="meta")[:, :10], torch.empty(64, 10))


def test_magic_numbers_divide_like_floor_division_for_every_31_bit_offset():
    """The kernels' `_div` finds n // d as umulhi(2n, m) >> l from the packed (m, l): checked here in
    Python on the boundary offsets of a few divisors."""
    for d in (1, 3, 7, 768, 1000, 2**16 + 1, 2**30 + 1, 2**31 - 1):
        (packed,) = tiles._magic(d)
        m, shift = packed >> 5, packed & 31
        for n in (0, 1, d - 1, d, d + 1, 2**31 - 1, (2**31 - 1) // d * d):
            assert ((2 * n * m) >> 32) >> shift == n // d, (d, n)


def test_rows_are_numbered_in_the_memory_order_of_the_full_size_inputs():
    """A transposed view is walked front to back, and the outputs take its layout; a slice that is
    not dense still runs along memory but its outputs are not like it."""
    x = torch.empty(2, 8, 4, 32).transpose(1, 2)  # [2, 4, 8, 32]
    pitches, dense, like = tiles._row_pitches((x,), tuple(x.shape))
    assert (pitches, dense, like) == ([32, 1, 4], True, True)
    contiguous = torch.empty(2, 4, 8, 32)
    assert tiles._row_pitches((contiguous,), tuple(contiguous.shape)) == ([32, 8, 1], True, True)
    assert tiles._row_pitches((x,), tuple(x.shape), row_major=True) == ([32, 8, 1], False, False)


# ---- a kernel's fits -----------------------------------------------------------------------------


def test_fits_asks_ranks_kinds_of_numbers_and_the_modules_the_lines_call():
    assert fits._tensors_of_ranks((torch.empty(2, 3), torch.empty(3)), (2, 1))
    assert not fits._tensors_of_ranks((torch.empty(2, 3), 1.0), (2, 0))
    assert fits._numbers_fit((1e-5, 3), ("float", "int"))
    assert not fits._numbers_fit((True,), ("int",)) and not fits._numbers_fit((0.5,), ("int",))

    class Block(torch.nn.Module):
        def __init__(self, approximate):
            super().__init__()
            self.act = torch.nn.GELU(approximate=approximate)

    made_for = (("act", class_identity(torch.nn.GELU), {"approximate": "tanh"}, (), None),)
    assert fits._modules_match(Block("tanh"), made_for)
    assert not fits._modules_match(Block("none"), made_for)
    assert not fits._modules_match(None, made_for)


# ---- the backward's helpers ----------------------------------------------------------------------


def test_a_gradient_is_summed_to_its_broadcast_input_and_cast_to_its_dtype():
    raw = torch.ones(4, 3)
    assert torch.equal(ops._fit(raw, torch.Size([3]), torch.float16), torch.full((3,), 4.0, dtype=torch.float16))
    bias = ops._fit(torch.ones(2, 5, 7, 7), torch.Size([5]), torch.float32, lead=1)  # read as bias[:, None, None]
    assert torch.equal(bias, torch.full((5,), 98.0))


def test_group_statistics_the_forward_kept_give_the_group_norm():
    """Each (sample, group)'s mean and reciprocal deviation, as the forward kernel keeps them, spread
    over the group's channels: x * scale + shift is the norm."""
    x = torch.randn(2, 6, 5, 4, dtype=torch.float64)
    weight, bias = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    groups = x.reshape(2, 3, -1)
    mean = groups.mean(-1)
    rstd = torch.rsqrt(groups.var(-1, unbiased=False) + 1e-5)
    scale, shift, _, _ = ops._group_statistics(mean, rstd, weight, bias, x.shape)
    want = torch.nn.functional.group_norm(x, 3, weight, bias, 1e-5)
    torch.testing.assert_close(x * scale + shift, want, rtol=1e-5, atol=1e-6)  # the weights are taken in float32


# ---- library patches -----------------------------------------------------------------------------


@pytest.fixture
def library(tmp_path, monkeypatch):
    """A library module `tinylib` on the path, with `scaled(x)`; `patches`' registry left as it was."""
    (tmp_path / "tinylib.py").write_text("def scaled(x):\n    return x * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import tinylib

    yield tinylib
    patches.uninstall()
    patches._PATCHES.clear()
    del sys.modules["tinylib"]


def _copy_of(source: str) -> types.FunctionType:
    """The function `source` defines, as a kernel module's patched copy is."""
    namespace: dict = {}
    exec(compile(textwrap.dedent(source), "<kernel module>", "exec"), namespace)
    return next(v for v in namespace.values() if isinstance(v, types.FunctionType))


def test_install_swaps_in_the_patched_code_where_the_library_is_the_code_it_was_made_for(library):
    made_for = fingerprint(library.scaled.__code__)
    patches._library_patch("tinylib", "scaled", 1, _copy_of("def scaled(x):\n    return x * 3\n"), made_for)
    assert patches.install() == ["tinylib.scaled"]
    assert library.scaled(1) == 3
    patches.uninstall()
    assert library.scaled(1) == 2


def test_install_leaves_a_library_whose_code_changed_alone_and_says_what_differs(library):
    made_for = dict(fingerprint(library.scaled.__code__), bytecode="0" * 16, source="0" * 16)
    patches._library_patch("tinylib", "scaled", 1, _copy_of("def scaled(x):\n    return x * 3\n"), made_for)
    with pytest.warns(UserWarning, match="tinylib.scaled is not the code its fused kernels were made for"):
        assert patches.install() == []
    assert library.scaled(1) == 2


# ---- the copies --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ops", "fits", "tiles", "patches"])
def test_each_runtime_copy_is_python_that_imports_nothing_of_fuselens(name):
    copy = runtime_source(name, inline=("MAX_BLOCK_ROW", "LOOP_BLOCK") if name == "tiles" else ())
    imported = [
        n.module if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(ast.parse(copy))
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    ]
    assert not [m for m in imported if (m or "").startswith("fuselens")]


def test_the_tiles_copy_holds_the_widths_themselves():
    copy = runtime_source("tiles", inline=("MAX_BLOCK_ROW", "LOOP_BLOCK"))
    assert "MAX_BLOCK_ROW" not in copy and "LOOP_BLOCK" not in copy
    assert f"if width <= {tiles.MAX_BLOCK_ROW}:" in copy and f"return 1, {tiles.LOOP_BLOCK}," in copy
