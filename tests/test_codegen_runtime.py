"""The kernel module's runtime (`codegen/runtime/`), tested as the modules it is written as: the tile
and layout choices of the launchers, what a kernel's `fits` asks, the backward's helpers, and
`install()` of a library patch.  Every kernel module carries a copy of their text
(`codegen/runtime_source.py`); `tests/test_codegen_golden.py` checks those copies."""

from __future__ import annotations

import ast
import json
import sys
import textwrap
import types

import pytest
import torch

from fuselens.analysis.code_identity import fingerprint
from fuselens.analysis.settings import class_identity
from fuselens.codegen.runtime import fits, gemm, ops, patches, tiles
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


# ---- GEMM clusters -----------------------------------------------------------------------------


def test_a_gemms_operands_are_read_as_its_form_multiplies_them():
    """(A, B, batch, M, N, K, A's strides, B's strides, the result's shape) for linear's x by its weight
    transposed, a product by a transposed weight, a batch of products and a 1x1 convolution."""
    x, w = torch.randn(3, 5, 7), torch.randn(11, 7)
    a, b, batch, m, n, k, sa, sb, shape = gemm._gemm_problem("linear", x, w)
    assert (batch, m, n, k, shape) == (1, 15, 11, 7, (3, 5, 11)) and sb == (0, 1, 7)  # B[k, n] = w[n, k]
    assert torch.equal((a @ w.t()).view(shape), x @ w.t()) and sa == (0, 7, 1)
    assert gemm._gemm_problem("matmul", x, w.t())[7] == (0, 1, 7)
    q, kt = torch.randn(2, 4, 6), torch.randn(2, 9, 6).transpose(1, 2)
    assert gemm._gemm_problem("matmul", q, kt)[2:8] == (2, 4, 9, 6, (24, 6, 1), (54, 1, 6))
    images, weight = torch.randn(2, 16, 5, 3).contiguous(memory_format=torch.channels_last), torch.randn(8, 16, 1, 1)
    a, b, batch, m, n, k, sa, sb, shape = gemm._gemm_problem("conv2d", weight, images)
    assert (batch, m, n, k, shape, sa) == (2, 8, 15, 16, (2, 8, 5, 3), (0, 16, 1))
    assert sb == (240, 1, 16) and b.data_ptr() == images.data_ptr()  # the pixels of a channels-last image, as they lie
    assert gemm._gemm_image_format(images) == torch.channels_last


def test_an_epilogue_input_is_read_along_the_batch_rows_and_columns_of_the_product():
    """A bias over the columns, a residual of the result's shape and a per-row scale collapse into one
    stride each along the rows (x's leading dims) and the columns; a transposed residual cannot, and is
    read as a copy laid out as the result."""
    shape, groups = (3, 5, 11), ((), (0, 1), (2,))
    bias = torch.randn(11)
    assert gemm._gemm_operand(bias, (2,), shape, groups) == (bias, (0, 0, 1))
    residual = torch.randn(3, 5, 11)
    assert gemm._gemm_operand(residual, (0, 1, 2), shape, groups)[1] == (0, 11, 1)
    per_row = torch.randn(3, 5, 1)
    assert gemm._gemm_operand(per_row, (0, 1, -1), shape, groups)[1] == (0, 1, 0)
    transposed = torch.randn(5, 3, 11).transpose(0, 1)
    copy, strides = gemm._gemm_operand(transposed, (0, 1, 2), shape, groups)
    assert strides == (0, 11, 1) and torch.equal(copy, transposed) and copy.data_ptr() != transposed.data_ptr()
    assert (gemm._collapsed([6, 2], [4, 3]), gemm._collapsed([6, 1], [4, 3]), gemm._collapsed([0, 0], [4, 3])) == (
        2,
        None,
        0,
    )


def test_in_the_interpreter_the_fused_kernel_runs_with_one_tile_that_fits_its_products(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for m, n, k in [(1, 29, 37), (66, 97, 97), (8, 3072, 768), (64, 768, 3072)]:
        ((block_m, block_n, block_k, *_),) = gemm._gemm_tiles(torch.bfloat16, m, n, k)
        assert block_m * block_n * block_k <= 1 << 20 and min(block_m, block_n, block_k) >= 16
    assert gemm._gemm_tiles(torch.float32, 66, 97, 97)[0][:3] == (64, 64, 64)  # small: edges inside the tiles
    assert gemm._gemm_by_elements()


def test_the_fastest_path_is_chosen_once_a_shape_and_kept_in_a_file_across_processes(monkeypatch, tmp_path):
    """Where nothing can be timed (the interpreter here) the fused kernel runs; a choice kept in the file
    FUSELENS_GEMM_TUNING names (timed by an earlier process on the device) is what runs for that key."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(gemm, "_GEMM_CHOSEN", {})
    monkeypatch.setattr(gemm, "_GEMM_FILE_READ", [])
    x, w = torch.randn(3, 5, 7), torch.randn(11, 7)
    ran: list[str] = []
    paths = {name: (lambda name=name: ran.append(name) or name) for name in ("fused", "library")}
    assert gemm._gemm_fastest("cluster4", "linear", x, w, paths) == "fused"
    key = ("path", *gemm._gemm_key("cluster4", "linear", x, w))
    assert key[1:] == ("cluster4", 1, 16, 11, 7, "torch.float32", "cpu", True, True)  # 15 rows: bucket 16
    tuning = tmp_path / "tuning.json"
    tuning.write_text(json.dumps({repr(key): "library"}))
    monkeypatch.setenv("FUSELENS_GEMM_TUNING", str(tuning))
    assert gemm._gemm_fastest("cluster4", "linear", x, w, paths) == "library"
    assert gemm._gemm_fastest("cluster4", "linear", torch.randn(2, 7, 7), w, paths) == "library"  # 14 rows: 16
    assert ran == ["fused", "library", "library"]


# ---- the copies --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ops", "fits", "tiles", "patches", "gemm"])
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
