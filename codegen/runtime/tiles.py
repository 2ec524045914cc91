"""How the kernel module's launchers lay out and tile a call: the outputs' layout and the rows'
memory order (`_row_pitches`, `_row_order`), which kernel a layout takes (`_flat_over`,
`_folded_row_dim`, `_down_rows`, `_merged_row_end`), the tile and warps each kernel runs with (the
`_*_tile` functions: each one's measurements are in its docstring), the magic numbers of the
kernels' divisions (`_magic`) and the strides and offsets' width they are passed."""

import functools

import torch

MAX_BLOCK_ROW = 8192  # widest row the whole-row kernel holds in registers
LOOP_BLOCK = 4096  # column block of the looped kernel

# ---- the kernel module's copy starts here
_SM_COUNT = []


def _next_pow2(n):
    return 1 << (max(1, int(n)) - 1).bit_length()


def _align(cols):
    """The kernels' ALIGN: the largest power of two up to 16 that divides the row width.  Triton
    marks a width as a multiple of 16 by itself, and otherwise knows nothing of it, so the rows of a
    3000-wide bf16 tensor (each starting on a 16-byte boundary) were moved one element at a time;
    a kernel that knows the width is a multiple of 8 moves eight at once."""
    return min(16, cols & -cols) if cols > 0 else 1


def _sm_count():
    """Multiprocessors to keep busy; 1 without a GPU, where the interpreter prefers few big programs."""
    if not _SM_COUNT:
        props = torch.cuda.get_device_properties(torch.cuda.current_device()) if torch.cuda.is_available() else None
        _SM_COUNT.append(props.multi_processor_count if props else 1)
    return _SM_COUNT[0]


@functools.lru_cache(maxsize=256)  # a function of its arguments and the device; called every launch
def _flat_tile(numel, itemsize):
    """(BLOCK, num_warps) for a flat elementwise kernel: 4 KB of the widest tensor a program
    (two 16-byte loads a thread with 4 warps), fewer when that would leave multiprocessors idle."""
    block = max(128, 4096 // itemsize)
    while block > 128 and numel // block < 2 * _sm_count():
        block //= 2
    return block, 4 if block >= 512 else 2


@functools.lru_cache(maxsize=256)  # a function of its arguments; called every launch
def _magic(*divisors):
    """For each divisor d, the pair (m, l) packed as m << 5 | l, with which the kernels' _div
    finds n // d as umulhi(2n, m) >> l for every 0 <= n < 2**31: l = ceil(log2 d) and
    2**31 <= m = ceil(2**(31 + l) / d) < 2**32 (Granlund and Montgomery's division by
    invariant integers).  Packed, every value is past 2**32, so triton always types it i64.
    A divisor past 2**31 only occurs with 64-bit offsets, which divide."""
    out = []
    for d in divisors:
        d = max(1, int(d))
        shift = (d - 1).bit_length()
        m = -(-(1 << (31 + shift)) // d)
        out.append(m << 5 | shift if m < 2**32 else 1 << 40)
    return tuple(out)


@functools.lru_cache(maxsize=256)  # a function of its arguments; called every launch
def _pointwise_tile(rows, cols, itemsize, loads):
    """(BLOCK_R, BLOCK_C, num_warps) for an elementwise tile kernel: 4 warps, up to 1024 columns,
    then rows, each thread up to 32 bytes of the widest tensor: at most 16 elements where the plan
    reads at most two values an element (`loads`), 8 where it reads more.  Measured at DRAM size
    on an H200 in bf16 (`benchmarks/pointwise_tiles.py`), against 8 elements a thread: Whisper's
    bias + GELU over [8, 768, 3000] 31.7 us in 2 x 1024 tiles against 33.3 in 1 x 1024 (42.6 in
    1 x 2048, whose second block is mostly idle), GPT's two embedding lookups added, 768 wide,
    26.2 against 29.4; Llama's RoPE, five loads an element, 18.7 in 16 x 128 against 18.0 in
    8 x 128 (a thread also holds its rows' coordinates and each load's addresses, in registers)."""
    elements = 128 * min(16 if loads <= 2 else 8, 32 // itemsize)
    block_c = min(_next_pow2(cols), elements, 1024)
    block_r = max(1, min(_next_pow2(rows), elements // block_c))
    return block_r, block_c, 4 if block_r * block_c >= 512 else 2


def _row_pitches(leads, sizes, row_major=False, cat=False):
    """(pitches, dense, like): the step of each leading dim in an elementwise kernel's row index,
    whether one flat offset addresses every full-size input (`dense`), and whether the outputs take
    their layout (`like`: `torch.empty_like`, as eager's result would).

    When the full-size inputs `leads` share one layout whose last dim has stride 1 (a contiguous
    tensor, a permuted view of one such as `x.transpose(1, 2)`, or such a view of a slice: q of a
    fused qkv projection), rows are numbered in that memory order and the outputs are dense in the
    same order, the layout eager gives `q * cos`, so what reads them sees what it would without the
    kernel.  (For Phi-3's RoPE on an H200 in bf16 the order did not change the kernel's time: 16.4 us
    either way, against torch.compile's 12.9.)  Otherwise, or when the outputs go to GEMMs
    (`row_major`), rows run in row-major order into contiguous outputs.  So they do for a `cat`'s
    result (`cat`), as eager's is: a full-size input of a cluster that ends in `cat` is one whose
    other pieces are empty (Phi-3's `torch.cat((q_embed, q_pass), -1)` with every dim rotated), and
    eager's `cat` keeps a layout only where every piece has it."""
    if (row_major or cat) and not all(t.is_contiguous() for t in leads):
        return _row_major(sizes), False, False
    if leads and all(t.stride() == leads[0].stride() for t in leads):
        strides = leads[0].stride()
        if leads[0].is_contiguous():
            return _row_major(sizes), True, True
        order = _dims_inside_out(sizes, strides)
        if order is not None and (not sizes or sizes[-1] == 1 or (strides[-1] == 1 and order[0] == len(sizes) - 1)):
            dense_strides = _dense_strides(sizes, order)
            dense = _is_dense(sizes, strides, dense_strides)
            cols = max(1, sizes[-1]) if sizes else 1
            return [max(1, dense_strides[i] // cols) for i in range(len(sizes) - 1)], dense, True
    return _row_major(sizes), False, False


def _laid_out_pitches(leads, sizes, layout):
    """(pitches, dense, like, out_strides) for a backward kernel whose outputs take `layout`, the
    strides of the forward input they are the gradients of, rather than the layout of the upstream
    gradients `leads`: rows are numbered in that layout's memory order, and the outputs are dense in
    it.  The gradient of a transposed view (q of a projection, as attention reads it) is so written in
    the projection's own order, and autograd's view of it back to the projection's shape copies
    nothing.  A layout that is no dense order of `sizes` with the row innermost (a broadcast, an
    overlap) leaves the leads' own (`_row_pitches`)."""
    order = _dims_inside_out(sizes, layout) if len(layout) == len(sizes) else None
    if order is None or not (not sizes or sizes[-1] == 1 or (layout[-1] == 1 and order[0] == len(sizes) - 1)):
        pitches, dense, like = _row_pitches(leads, sizes)
        own = leads[0].stride() if like else _dense_strides(sizes, range(len(sizes) - 1, -1, -1))
        return pitches, dense, like, tuple(own)
    out = _dense_strides(sizes, order)
    cols = max(1, sizes[-1]) if sizes else 1
    dense = all(_is_dense(sizes, t.stride(), out) for t in leads)
    return [max(1, out[i] // cols) for i in range(len(sizes) - 1)], dense, dense, tuple(out)


def _dims_inside_out(sizes, strides):
    """The dims of more than one position from the innermost out, then those of one position in their
    own order, when each dim steps past the whole of the ones inside it (no overlap, no broadcast);
    None otherwise."""
    inner = sorted((i for i in range(len(sizes)) if sizes[i] != 1), key=lambda i: (strides[i], -i))
    reach = 1
    for i in inner:
        if strides[i] < reach:
            return None
        reach = strides[i] * sizes[i]
    return inner + [i for i in range(len(sizes)) if sizes[i] == 1]


def _dense_strides(sizes, order):
    """The strides of a dense tensor of `sizes` whose dims run `order` from the innermost out."""
    strides, step = [0] * len(sizes), 1
    for i in order:
        strides[i] = step
        step *= sizes[i]
    return strides


def _is_dense(sizes, strides, dense_strides):
    """Whether `strides` are `dense_strides` along every dim of more than one position."""
    return all(s == d for n, s, d in zip(sizes, strides, dense_strides) if n != 1)


def _shared_dense_order(leads, sizes):
    """The dims from the innermost out of the one dense layout the tensors `leads` share, or None
    when they lay out differently, overlap or leave gaps."""
    if not leads or any(t.stride() != leads[0].stride() for t in leads):
        return None
    strides = leads[0].stride()
    order = _dims_inside_out(sizes, strides)
    if order is None or not _is_dense(sizes, strides, _dense_strides(sizes, order)):
        return None
    return order


def _flat_over(leads, sizes, others, inner):
    """Whether one flat offset addresses every full-size tensor, so the flat kernel may run: `leads`
    (read element for element) and `others` (each a tensor and the domain dim each of its dims runs
    along) share one dense layout whose stride-1 dim is `inner`, the dim the kernel's other loads
    index as `offset % size` (a channels-last ConvNeXt stage: its layer scale's gamma, by channel).
    The outputs take the leads' layout (`torch.empty_like`).
    A load along a dim further out stays on the tile kernel, which finds it from the row: Whisper's
    conv bias + GELU over [8, 768, 3000] on an H200 in bf16 ran 36.1 us in 1 x 1024 tiles, while a
    flat kernel indexing `(offset // 3000) % 768` ran 53.8 with the sizes as arguments, 42.6 with
    `_div`'s multiply, and 33.3 with them as constants (torch.compile's way: 32.4)."""
    if _shared_dense_order(leads, sizes) is None:
        return False
    strides = leads[0].stride()
    if sizes[inner] > 1 and strides[inner] != 1:
        return False
    for t, dims in others:
        along = [0] * len(sizes)
        for j, d in enumerate(dims):
            along[d] = t.stride(j)
        if any(n > 1 and a != s for n, a, s in zip(sizes, along, strides)):
            return False
    return True


def _merged_row_end(tensors, layouts, n):
    """`tensors` with domain dims n-2 and n-1 made one, of their product, held in dim n-1 (dim n-2
    becomes 1), or None where some tensor does not lay the two out as one run of memory.  `layouts`
    gives, for each tensor the kernel reads, the domain dim each of its dims runs along (-1: none).
    Short rows whose width is not a power of two leave lanes of every tile idle; one long row per
    (batch, channel) does not: ConvNeXt's layer scale, a channels-last [32, 56, 56, 96] added to
    channels-first [32, 96, 56, 56] on an H200 in bf16, ran 20.1 us in 56-wide rows and 15.3 us in
    3136-wide ones (torch.compile: 16.3)."""
    a, b = n - 2, n - 1
    sizes = [1, 1]
    for k, dims in layouts:
        for j, d in enumerate(dims):
            if d in (a, b):
                sizes[d - a] = max(sizes[d - a], tensors[k].shape[j])
    if sizes[0] == 1 or sizes[1] == 1:
        return None
    views = list(tensors)
    for k, dims in layouts:
        t = tensors[k]
        ja, jb = (dims.index(d) if d in dims else -1 for d in (a, b))
        along = [t.shape[ja] if ja >= 0 else 1, t.shape[jb] if jb >= 0 else 1]
        if along == [1, 1]:
            continue  # broadcast along both
        if along != sizes or t.stride(ja) != t.stride(jb) * sizes[1]:
            return None
        shape = list(t.shape)
        shape[ja], shape[jb] = 1, sizes[0] * sizes[1]
        views[k] = t.as_strided(shape, t.stride(), t.storage_offset())
    return views


# An input laid out along a row dim is read across only from this size on: below it the plain
# tile kernel's scattered reads stay in L2 and its smaller tiles keep more multiprocessors busy.
# Measured on an H200 in bf16: a 2.3 MB channels-last layer scale ran 5.2 us plain, 6.1 across,
# RoPE's 0.5 MB transposed frequencies 4.6 against 9.1; a 4.6 MB one 12.5 plain, 6.7 across.
_ACROSS_MIN_BYTES = 3 << 20

# The split group kernels' tile (elements) and warps a program, for a channels-last input and a
# channels-first one.  Swept on an H200 in bf16 over [32, 256, 64, 64] (tiles of 2048 to 32768, 2 to
# 16 warps): GroupNorm + SiLU channels-last 92.6 us at 4096 and 4 warps (118.6 at 8192 and 8),
# channels-first into channels-last 117.0 at 4096 and 2 (165.9 at 8192 and 8).
_SPLIT_TILE, _SPLIT_WARPS_LAST, _SPLIT_WARPS_FIRST = 4096, 4, 2


def _row_order(leads, sizes, others, row_major=False, layout=None, cat=False):
    """(pitches, out_strides, dense, like, fast) for an elementwise kernel that also reads full-size
    inputs laid out their own way (`others`: each a tensor and the domain dim each of its dims runs
    along; `y.permute(0, 3, 1, 2)` read inside the kernel is (y, (0, 2, 3, 1))).

    The outputs take the layout `_row_pitches` gives them (`dense`, `like`), whose element strides
    are `out_strides`: one a leading dim, then the columns'.  When one of those inputs has its
    stride-1 dim along a leading dim of the domain (channels-last values added to channels-first
    ones, the transposed patches of a ViT), `fast` is that dim and the across kernel runs: walking
    rows in the outputs' order would read that input one element a row (for inputs of
    `_ACROSS_MIN_BYTES` or more).  So it does when the full-size inputs themselves share a dense
    layout with a leading dim innermost (a channels-last residual): the outputs then take that
    layout, as eager's would, and every tensor is read and written along its memory (ConvNeXt's
    layer scale over [32, 96, 56, 56] on an H200 in bf16: 18.6 us written channels-first, 17.2
    channels-last, against torch.compile's 15.2).  Where the full-size inputs lay out apart and the
    outputs are row-major, the first of them may be the one read across (`others` holds the rest): a
    GroupNorm backward's channels-last upstream gradient beside its channels-first input, which the
    tile kernel read one element a row (270 µs over [32, 256, 64, 64] in bf16 on an H100, against
    about 22 µs to read one such tensor).  `pitches` then holds each other leading dim's
    step in the across kernel's count of their positions; `fast` is -1 when no input asks for it
    and rows follow the outputs' order.

    A backward kernel's outputs take the forward input's `layout` instead (`_laid_out_pitches`),
    and its upstream gradient, among `others`, may run across them (k's gradient from
    `q @ k.transpose(2, 3)`, into RoPE's backward)."""
    n = len(sizes)
    cols = max(1, sizes[-1]) if sizes else 1
    if layout is None:
        row_pitches, dense, like = _row_pitches(leads, sizes, row_major, cat)
        out_strides = [p * cols for p in row_pitches] + [1]
    else:
        row_pitches, dense, like, laid_out = _laid_out_pitches(leads, sizes, layout)
        out_strides = list(laid_out)
    candidates = [(t, dims) for t, dims in others if _bytes(t) >= _ACROSS_MIN_BYTES]
    inner = None if like or row_major or cat or layout is not None else _innermost_row_dim(leads, sizes)
    if inner is not None:
        out_strides, like = list(leads[0].stride()), True
        candidates = [(leads[0], tuple(range(n)))]
    elif not like and layout is None and leads and _bytes(leads[0]) >= _ACROSS_MIN_BYTES:
        # The full-size inputs laid out apart, the outputs row-major: the first may be the one laid out
        # across them (a GroupNorm's channels-last upstream gradient beside its channels-first input).
        candidates.append((leads[0], tuple(range(n))))
    for t, dims in candidates:
        fast = _stride_one_dim(t, dims)
        if fast is not None and fast < n - 1 and sizes[-1] > 1:
            pitches, step = list(row_pitches), 1
            pitches[fast] = 1
            for i in sorted((i for i in range(n - 1) if i != fast), key=out_strides.__getitem__):
                pitches[i] = step
                step *= sizes[i]
            return pitches, out_strides, dense, like, fast
    return row_pitches, out_strides, dense, like, -1


def _folded_row_dim(leads, sizes):
    """The row dim the wide kernel reads as part of each row: the innermost one along which every
    full-size input in `leads` steps exactly one row's width, each row contiguous (the heads of q
    sliced from a fused qkv projection, [batch, heads, seq, 96] with heads 96 elements apart), so
    that a row of it is one run of memory; -1 where there is none.  Phi-3's RoPE over such a q,
    [2, 32, 2048, 96] in bf16 on an H100: 17.2 µs read so into a contiguous result, against 18.1 in
    8 x 128 tiles of single rows (a quarter of their lanes idle) and 17.8-18.4 for torch.compile
    (mode "default"), which walks the same memory the same way."""
    return _folded_dim(tuple(sizes), tuple(t.stride() for t in leads)) if leads else -1


@functools.lru_cache(maxsize=1024)  # a function of its arguments; called every launch
def _folded_dim(sizes, strides):
    if len(sizes) < 2:
        return -1
    width = sizes[-1]
    for j in range(len(sizes) - 2, -1, -1):
        if sizes[j] > 1 and all(s[-1] == 1 and s[j] == width for s in strides):
            return j
    return -1


def _outer_steps(pitches, sizes, fold):
    """Each row dim's step in the wide kernel's count of the positions of the row dims other than
    `fold`, in the order the row numbering `pitches` gives them, so that its programs write the
    outputs front to back."""
    return _steps_without(tuple(pitches), tuple(sizes), fold)


@functools.lru_cache(maxsize=1024)  # a function of its arguments; called every launch
def _steps_without(pitches, sizes, fold):
    steps, step = list(pitches), 1
    for i in sorted((i for i in range(len(sizes) - 1) if i != fold), key=lambda i: pitches[i]):
        steps[i] = step
        step *= sizes[i]
    return tuple(steps)


@functools.lru_cache(maxsize=256)  # a function of its arguments; called every launch
def _wide_tile(rows, cols, itemsize):
    """(BLOCK_R, BLOCK_C, num_warps) for the wide kernel: 1024 elements (16 bytes a thread in bf16)
    with 4 warps, up to 1024 columns a row.  A hand-written kernel of the same walk over Phi-3's RoPE
    above (`benchmarks/rope_layouts.py`): 16.7-16.9 µs in 1 x 1024 tiles, 17.0-17.2 in 2 x 512,
    18.7-18.8 in 4 x 512."""
    block_c = min(_next_pow2(cols), 1024)
    return max(1, min(_next_pow2(rows), 1024 // block_c)), block_c, 4


def _innermost_row_dim(leads, sizes):
    """The leading dim along which the full-size inputs `leads`, sharing one dense layout, are
    contiguous (the channels of a channels-last tensor seen as NCHW), or None."""
    if not sizes or sizes[-1] == 1:
        return None
    order = _shared_dense_order(leads, sizes)
    if order is None or order[0] == len(sizes) - 1:
        return None  # the last dim innermost (the plain tile kernel's case), or gaps between the rows
    return order[0]


@functools.lru_cache(maxsize=256)  # a function of its arguments; called every launch
def _across_tile(rows, cols, itemsize):
    """(BLOCK_R, BLOCK_C, num_warps) for the across kernel's tiles, read down their rows and written
    along their columns: 64 columns and 8 KB of the widest tensor, so that both ways move 128
    bytes of memory at a time."""
    block_c = min(_next_pow2(cols), 64)
    block_r = max(1, min(_next_pow2(rows), 8192 // itemsize // block_c))
    return block_r, block_c, 4


def _down_rows(layouts, sizes, row_dims):
    """Whether a row kernel reads one of `layouts` (each a tensor and the domain dim each of its
    dims runs along) with its stride-1 dim along the last row dim, such as a LayerNorm over the
    channels of an NCHW tensor seen as NHWC: walking the rows' columns would read it one element
    a row, so the across row kernel runs blocks of that dim down its tiles' rows instead."""
    last = row_dims - 1
    return sizes[last] > 1 and any(
        _stride_one_dim(t, dims) == last and _bytes(t) >= _ACROSS_MIN_BYTES for t, dims in layouts
    )


def _bytes(t):
    return t.numel() * t.element_size()


def _stride_one_dim(t, dims):
    """The domain dim along which `t` (its dims running along the domain's `dims`) is contiguous, or None."""
    inner = [dims[j] for j, (m, s) in enumerate(zip(t.shape, t.stride())) if s == 1 and m > 1]
    return inner[0] if inner else None


@functools.lru_cache(maxsize=256)  # a function of its arguments; called every launch
def _across_rows_tile(rows, block_c, itemsize):
    """(BLOCK_R, num_warps) for the across row kernel's tiles of whole rows `block_c` wide: 4096
    elements, rows down the dim their input runs along, 16 elements a thread; None when fewer than
    4 rows fit, too few to read that input in runs.  ConvNeXt's stem LayerNorm over the 96 channels
    of an NCHW [32, 96, 56, 56] bf16 tensor, on an H100: 21.0 µs with 32 x 128 tiles and 8 warps,
    25.0 with 64 x 128 and 16, 42.3 with 32 x 128 and 4."""
    block_r = min(_next_pow2(rows), max(1, 4096 // block_c))
    if block_r < 4:
        return None
    return block_r, max(2, min(16, block_r * block_c // 512))


@functools.lru_cache(maxsize=256)  # a function of its arguments and the device; called every launch
def _across_loop_tile(rows, fast, cols, itemsize):
    """(BLOCK_R, BLOCK_C, num_warps) for the across row kernel walking blocks of `fast` rows (the
    last row dim's, of `rows` in all) in column blocks: 64 columns, and 128 bytes of the widest
    tensor down the tile, so that an input laid out along the rows and one laid out along the
    columns are both read 128 bytes at a time; fewer rows (down to 16) while the programs would
    leave multiprocessors idle, and 4 warps to a tile of up to 2048 elements (16 a thread), 8 past
    it.  (Not yet timed on a GPU: a GroupNorm backward's sums over [32, 256, 64, 64] bf16, a
    channels-last gradient, which the whole-row kernel took 262-488 µs over on an H100.)"""
    block_c = min(_next_pow2(cols), 64)
    block_r = max(1, min(_next_pow2(fast), 128 // itemsize))
    while block_r > 16 and (rows // max(1, fast)) * ((fast + block_r - 1) // block_r) < _sm_count():
        block_r //= 2
    return block_r, block_c, 4 if block_r * block_c <= 2048 else 8


def _needs_int64(*tensors):
    """Whether an element offset into any of `tensors` can reach 2**31, where 32-bit index
    arithmetic would wrap: a large tensor, or a small view with large strides (`big[:, :8]`)."""
    for t in tensors:
        if t.numel() >= 2**31:
            return True
        if not t.is_contiguous() and sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()) if n > 1) >= 2**31:
            return True
    return False


def _strides(t):
    """`t`'s strides, 0 along its dims of size 1 (which a kernel steps along only as a broadcast)."""
    return _broadcast_strides(t.shape, t.stride())


@functools.lru_cache(maxsize=1024)  # a function of its arguments; called for each input on every launch
def _broadcast_strides(shape, strides):
    return tuple([0 if n == 1 else s for n, s in zip(shape, strides)])


def _row_major(sizes):
    """Pitches of the leading dims of `sizes` in a row-major walk."""
    pitches, step = [], 1
    for i in range(len(sizes) - 2, -1, -1):
        pitches.append(step)
        step *= sizes[i]
    return pitches[::-1]


def _total_tile(rows, block_r, warps, full_inputs):
    """(BLOCK_R, num_warps, programs) for a row kernel that also sums columns over the rows: its
    programs each walk blocks of rows and leave one float32 row of partial sums.  With three or
    more full-size inputs a row: four times the rows a tile and the warps to match (at most 16), so
    that fewer programs keep as many rows in flight and leave fewer rows of partial sums.  16 warps
    of programs a multiprocessor.  Swept on an H200 (`benchmarks/norm_tiles.py`, 40 tiles, bf16
    training steps at 8192 x 4096): LayerNorm of a residual sum 156.8 µs with 4 rows, 16 warps and
    one program a multiprocessor (167.0 with two; fastest 155.5), residual + RMSNorm 151.7 (157.7
    with two; the fastest), RMSNorm (two inputs: one row, 4 warps) 107.4 with four (108.0 with
    eight; fastest 102.8)."""
    grow = 1
    while full_inputs >= 3 and grow < 4 and warps * grow * 2 <= 16 and block_r * grow * 2 <= rows:
        grow *= 2
    block_r, warps = block_r * grow, warps * grow
    return block_r, warps, min((rows + block_r - 1) // block_r, max(1, 16 // warps) * _sm_count())


@functools.lru_cache(maxsize=256)  # a function of its arguments and the device; called every launch
def _row_tile(rows, cols, itemsize, rows_only=False, gathers=False, totals=False, windows=False):
    """(BLOCK_R, BLOCK_C, num_warps, whole_row) for a row kernel, from the row length and the
    widest element: tiles of at least 1024 elements, 32 bytes a thread as in the elementwise
    tiles, or 64 in tiles past 2 KB of elements narrower than 4 bytes.  Measured at DRAM size
    on an H200: 4096-wide bf16 softmax rows ran 154.6 µs with 8 warps and 148.9 with 4, while
    768-wide bf16 LayerNorm rows ran best with 2 warps (one: 43.9 µs, two: 38.4-41.5) and fp32
    softmax rows 2% slower with half the warps.
    Rows too wide for registers loop over 4096-column blocks, one row a program, with 8 warps, or
    4 where every output is one value a row (`rows_only`: a loss, one pass over the row).  Swept on
    an H200 at 8192 bf16 rows (`benchmarks/loop_tiles.py`), against 16 warps: a mean cross-entropy
    over 128256 columns 604.4 µs with 4 (645.0 with 8, 843.9 with 16), a LayerNorm over 16384
    159.1 with 8 (160.6), a float32 softmax over 32768 345.9 with 8 (355.5).
    Rows that start with a lookup (`gathers`: an embedding's row read at a token id loaded first) run
    one warp to a row of up to 1024 columns, so that many programs wait on memory at once: BERT's
    embeddings + LayerNorm, [16384, 768] bf16, 14.3 µs so and 19.7 with two warps.
    Rows of at most 512 columns run one warp to up to 8 rows of 2048 elements, as torch.compile's
    autotuned persistent reductions do, unless the kernel also sums columns over the rows (`totals`,
    whose programs walk many row blocks).  ConvNeXt's LayerNorms over channels-last bf16 on an H100:
    96 channels of [32, 56, 56] 13.8 µs with 8 rows and one warp, against 23.5 with 8 rows and two
    (two and four warps ran 23-42 µs at every height tried; eight, 12.5-15.0); 192 of [32, 28, 28]
    6.4 against 9.0; 384 of [32, 14, 14] 4.8 against 5.1.
    A pooling's rows are its windows (`windows`: 4 columns for 2 x 2, 9 for 3 x 3), each a few
    elements: 2048 elements a tile with 4 warps, so that a warp reads the windows of a run of output
    positions, whole input rows of memory (not yet measured on a GPU: `benchmarks/axis_reductions.py`)."""
    width = _next_pow2(cols)
    if windows and width <= 64:
        block_r = max(1, min(_next_pow2(rows), 2048 // width))
        while block_r > 1 and (rows + block_r - 1) // block_r < 2 * _sm_count():
            block_r //= 2
        return block_r, width, 4 if block_r * width >= 512 else 1, True
    if width <= 512 and not totals:
        block_r = max(1, min(_next_pow2(rows), 2048 // width, 8))
        while block_r > 1 and (rows + block_r - 1) // block_r < 2 * _sm_count():
            block_r //= 2
        return block_r, width, 1, True
    if width <= MAX_BLOCK_ROW:
        block_r = max(1, min(_next_pow2(rows), 1024 // width))
        while block_r > 1 and (rows + block_r - 1) // block_r < 2 * _sm_count():
            block_r //= 2  # narrow rows: fewer a program, so every multiprocessor gets work
        if gathers and width <= 1024:
            return block_r, width, 1, True
        tile = block_r * width * itemsize
        per_thread = 64 if itemsize < 4 and tile > 2048 else 32
        return block_r, width, max(1, min(16, tile // (32 * per_thread))), True
    return 1, LOOP_BLOCK, 4 if rows_only else 8, False
