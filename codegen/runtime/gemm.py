"""What a GEMM cluster's launcher runs with (`codegen/gemm_launcher.py` writes it): the product's
sizes and the operands' strides for each form of GEMM (`_gemm_problem`), the strides that read an
epilogue's input, or write an output, at each (batch, row, column) of the product (`_gemm_operand`),
the tiles tried (`_gemm_tiles`), and the choices made once per shape and kept: the fused kernel's
tile (`_gemm_tile`) and, in the public function, the fused kernel or the library's GEMM with the
epilogue's own kernel after it (`_gemm_fastest`), each the one that ran fastest on the device the
first time that (shape bucket, dtype, device) came, as Triton's `autotune` with a key does."""

# ---- the kernel module's copy starts here
import json
import os

import torch

# (shape bucket, dtype, device, ...) -> what ran fastest there: a tile, or the path of the public function.
# Kept in the process; with FUSELENS_GEMM_TUNING naming a JSON file, read from it and written to it too.
_GEMM_CHOSEN = {}
_GEMM_FILE_READ = []


def _gemm_sizes(form, a, b):
    """(batch, M, N, K) of the product `form` computes from its operands `a` and `b`."""
    if form == "linear":  # a [..., K] by b [N, K], transposed
        return 1, a.numel() // max(1, a.shape[-1]), b.shape[0], a.shape[-1]
    if form == "conv2d":  # a [Cout, Cin, 1, 1] by each image of b [N, Cin, H, W]
        return b.shape[0], a.shape[0], b.shape[2] * b.shape[3], a.shape[1]
    if b.dim() == 3:  # batched: a [B, M, K] by b [B, K, N]
        return a.shape[0], a.shape[1], b.shape[2], a.shape[2]
    return 1, a.numel() // max(1, a.shape[-1]), b.shape[1], a.shape[-1]  # a [..., K] by b [K, N]


def _gemm_problem(form, a, b):
    """(A, B, batch, M, N, K, A's strides (batch, row, k), B's strides (batch, k, column), the result's
    shape): A and B as the kernel reads them (x's leading dims as one, an image's pixels as one: views
    where the layout allows, else copies, as torch's own GEMMs make)."""
    batch, m, n, k = _gemm_sizes(form, a, b)
    if form == "conv2d":
        shape = (b.shape[0], a.shape[0], b.shape[2], b.shape[3])
        pixels = b.reshape(b.shape[0], b.shape[1], n)
        return a, pixels, batch, m, n, k, (0, a.stride(0), a.stride(1)), pixels.stride(), shape
    if b.dim() == 3:
        return a, b, batch, m, n, k, a.stride(), b.stride(), (batch, m, n)
    rows = a.reshape(m, k)
    shape = (*a.shape[:-1], n)
    across = (0, b.stride(1), b.stride(0)) if form == "linear" else (0, b.stride(0), b.stride(1))
    return rows, b, 1, m, n, k, (0, rows.stride(0), rows.stride(1)), across, shape


def _gemm_image_format(images):
    """The layout a 1x1 convolution's result takes: channels-last for channels-last images, as cuDNN's."""
    if images.dim() == 4 and images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format


def _gemm_operand(t, reads, shape, groups):
    """(t, its strides along the product's batch, rows and columns): t's dim j runs along the result's dim
    `reads[j]` (-1: broadcast), and the result's dims are grouped into those three (`groups`).  Where
    t's strides cannot walk a group as one index (a transposed view of a residual), a copy laid out
    as the result is read instead."""
    along = [0] * len(shape)
    for j, d in enumerate(reads):
        if d >= 0 and t.shape[j] != 1:
            along[d] += t.stride(j)
    strides = [_collapsed([along[d] for d in dims], [shape[d] for d in dims]) for dims in groups]
    if None not in strides:
        return t, tuple(strides)
    copy = torch.as_strided(t, shape, along, t.storage_offset()).contiguous()
    return copy, tuple([_collapsed([copy.stride(d) for d in dims], [shape[d] for d in dims]) for dims in groups])


def _collapsed(strides, sizes):
    """The one stride that walks dims of `sizes` (row-major, as one index) at `strides`; None if none does."""
    step, inner = None, 1
    for s, n in zip(reversed(strides), reversed(sizes)):
        if n != 1:
            if step is None:
                step = s
            elif s != step * inner:
                return None
        inner *= n
    return 0 if step is None else step


def _gemm_precision(a):
    """What `tl.dot` multiplies float32 operands in: "ieee", as torch's matmuls do by default, or TF32
    where torch's may (`torch.backends.cuda.matmul.allow_tf32`).  For 16-bit operands, which it
    multiplies as they are, Triton's default."""
    if a.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def _gemm_by_elements():
    """Whether the kernel multiplies its tiles element by element and sums them, not by `tl.dot`: in the
    Triton interpreter only, whose dot multiplies a bfloat16 tile's bits (NumPy has no bfloat16) and
    float32 ones without BLAS."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _gemm_tiles(dtype, m, n, k):
    """The tiles tried: (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages).  Wide tiles with
    three or four stages for 16-bit operands, which keep an H100's tensor cores fed from shared
    memory; narrower K for float32 (twice the bytes a stage); a few rows for a product of few rows
    (decoding), which would otherwise leave most of each tile's rows idle.  In the interpreter: one
    tile, as large as the product allows (each program and K step costs the interpreter about the same
    whatever its size), small for small products, whose edges then fall inside tiles too."""
    if os.environ.get("TRITON_INTERPRET") == "1":  # (its products by elements: at most 2**20 of them a step)
        block_m, block_n = 32 if m <= 64 else 64, 64 if n <= 256 else 256
        return ((block_m, block_n, min(64 if k <= 256 else 128, (1 << 20) // (block_m * block_n)), 4, 4, 1),)
    if m <= 32:
        return ((16, 64, 128, 1, 4, 4), (16, 128, 64, 1, 4, 4), (32, 64, 64, 1, 4, 4), (32, 128, 64, 1, 4, 3))
    if dtype == torch.float32:
        return ((128, 128, 32, 8, 8, 3), (128, 64, 32, 8, 4, 4), (64, 128, 32, 8, 4, 4), (64, 64, 32, 8, 4, 4))
    return (
        (128, 256, 64, 8, 8, 3),
        (256, 128, 64, 8, 8, 3),
        (128, 128, 64, 8, 8, 4),
        (128, 128, 64, 8, 4, 4),
        (128, 64, 64, 8, 4, 4),
        (64, 128, 64, 8, 4, 4),
        (64, 64, 64, 8, 4, 4),
    )


def _gemm_key(name, form, a, b):
    """What a choice is kept under: the kernel, the product's batch, N, K, dtype and device, its M
    rounded up to a power of two (the tokens of a batch change from call to call), and whether A and B
    run along K in memory (a transposed operand reads otherwise)."""
    batch, m, n, k = _gemm_sizes(form, a, b)
    bucket = 1 << max(0, m - 1).bit_length()
    return (name, batch, bucket, n, k, str(a.dtype), str(a.device), a.stride(-1) == 1, b.stride(-1) == 1)


def _gemm_tile(key, run, dtype, m, n, k):
    """The tile `run(tile)` launches the fused kernel with at `key`: the fastest of `_gemm_tiles` the
    first time, timed on the device (the first one where nothing can be timed: the interpreter, a CUDA
    graph being captured)."""
    tiles = _gemm_tiles(dtype, m, n, k)
    chosen = _gemm_chosen(("tile", *key))
    if chosen is not None and tuple(chosen) in tiles:
        return tuple(chosen)
    if not _gemm_timeable():
        return tiles[0]
    times = _gemm_times({tile: (lambda tile=tile: run(tile)) for tile in tiles})
    best = min(times, key=times.get) if times else tiles[0]
    _gemm_keep(("tile", *key), list(best))
    return best


def _gemm_fastest(name, form, a, b, paths):
    """The result of the fastest of `paths` (name -> call) for cluster `name`'s product of `a` by `b`
    (`_gemm_key`), timed the first time on the device: "fused" where it beats "library" (the library's
    GEMM, then the epilogue's kernel) by 1% or more, its tile already tuned for the shape; "library"
    where nothing can be timed on CUDA (a graph being captured), "fused" in the interpreter."""
    key = ("path", *_gemm_key(name, form, a, b))
    chosen = _gemm_chosen(key)
    if chosen in paths:
        return paths[chosen]()
    if not _gemm_timeable():
        return paths["fused" if os.environ.get("TRITON_INTERPRET") == "1" else "library"]()
    usable = {}
    for path, call in paths.items():  # once each: the fused kernel's first call tunes its tile
        try:
            call()
        except Exception:  # a kernel this device cannot run (no tile fits its shared memory): no choice
            continue
        usable[path] = call
    times = _gemm_times(usable)
    if "fused" in times and "library" in times and times["fused"] > 0.99 * times["library"]:
        del times["fused"]  # within the timings' noise of the library: not worth a kernel of its own
    best = min(times, key=times.get) if times else "library"
    _gemm_keep(key, best)
    return paths[best]()


def _gemm_laid_out(outputs, layout):
    """`outputs` (a tensor or a tuple of them) in `layout`, as the fused kernel writes them (the op's
    outputs are laid out as its shapes-only call allocates them): a copy only of one laid out otherwise."""
    if isinstance(outputs, torch.Tensor):
        return outputs.contiguous(memory_format=layout)
    return tuple([out.contiguous(memory_format=layout) for out in outputs])


def _gemm_timeable():
    """Whether kernels can be timed here and now: on CUDA, outside a graph capture."""
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        return False
    return not torch.cuda.is_current_stream_capturing()


def _gemm_times(calls):
    """Median ms of each of `calls` (name -> call) on the device, a call that fails left out.  Timed as
    a CUDA graph replays them (Triton's `do_bench_cudagraph`): called one by one, a path of two kernels
    (the library's GEMM, then the epilogue's kernel) was timed at its host's launching, not its GPU's
    work, and a fused GEMM 40% slower on the GPU was chosen over it.  Where a graph cannot capture one
    of them, all are timed as launched (`do_bench`): the same way for each, or the choice means nothing."""
    from triton.testing import do_bench, do_bench_cudagraph

    try:
        return {name: do_bench_cudagraph(call, rep=20, return_mode="median") for name, call in calls.items()}
    except Exception:
        pass
    times = {}
    for name, call in calls.items():
        try:
            times[name] = do_bench(call, warmup=5, rep=25, return_mode="median")
        except Exception:  # a tile that does not fit the device (shared memory): not a choice
            continue
    return times


def _gemm_chosen(key):
    """What was chosen at `key`, in this process or (FUSELENS_GEMM_TUNING) an earlier one; None if nothing."""
    path = os.environ.get("FUSELENS_GEMM_TUNING")
    if path and not _GEMM_FILE_READ:
        _GEMM_FILE_READ.append(path)
        try:
            with open(path, encoding="utf-8") as fh:
                _GEMM_CHOSEN.update({k: v for k, v in json.load(fh).items() if k not in _GEMM_CHOSEN})
        except (OSError, ValueError, AttributeError):
            pass
    return _GEMM_CHOSEN.get(repr(key))


def _gemm_keep(key, choice):
    """Keep `choice` at `key` in the process and, with FUSELENS_GEMM_TUNING, in its file."""
    _GEMM_CHOSEN[repr(key)] = choice
    path = os.environ.get("FUSELENS_GEMM_TUNING")
    if not path:
        return
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(_GEMM_CHOSEN, fh, indent=1, sort_keys=True)
    except OSError:
        pass
