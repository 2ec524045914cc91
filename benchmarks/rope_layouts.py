"""A RoPE cluster's kernel against hand-written kernels that walk q's memory other ways, and torch.compile.

    python benchmarks/rope_layouts.py [--case phi3:c4]

Phi-3's q is a slice of a fused qkv projection viewed as heads, [batch, heads, seq, 96] with the
heads 96 elements apart inside 9216-wide rows.  The generated tile kernel numbers its 96-wide rows
(batch, heads, seq) in memory order, in 128-wide tiles.  torch.compile's kernel (mode "default",
read from its output code) walks the same memory as (batch * seq) rows of heads * 96 contiguous
elements, with every size a constant.  The hand-written kernels here try those walks with the sizes
read at call time:

- "flat": one offset a lane over the result's [batch, heads, seq, 96] order, heads and sequence
  divided out of it;
- "merged": tiles over (batch * seq) rows of heads * 96 columns, the head's position a column
  modulo its constant width, writing the result in q's order (bshd) or contiguous (bhsd, as eager's
  `cat` of the partial rotary gives it).

Each is checked against the cluster's ops first, then timed by CUDA-graph replay with the
generated kernel and torch.compile's two modes, the replays sampled in turn.  Needs CUDA.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton
import triton.language as tl
from pointwise_tiles import compiled_replays, on_cuda, print_times, traced_cluster


@triton.jit
def rope_flat(q, cos, sin, out, S, H, q_sb, q_sh, q_ss, N, D: tl.constexpr, BLOCK: tl.constexpr):
    x = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = x < N
    d = x % D
    r = x // D
    s = r % S
    base = (r // (S * H)) * q_sb + ((r // S) % H) * q_sh + s * q_ss
    HALF: tl.constexpr = D // 2
    v = tl.load(q + base + d, mask=m, other=0).to(tl.float32)
    lo = tl.load(q + base + d + HALF, mask=m & (d < HALF), other=0).to(tl.float32)
    hi = tl.load(q + base + d - HALF, mask=m & (d >= HALF), other=0).to(tl.float32)
    c = tl.load(cos + s * D + d, mask=m, other=0, eviction_policy="evict_last").to(tl.float32)
    sn = tl.load(sin + s * D + d, mask=m, other=0, eviction_policy="evict_last").to(tl.float32)
    rotated = tl.where(d < HALF, -lo, hi)
    tl.store(out + x, (v * c + rotated * sn).to(out.dtype.element_ty), mask=m)


@triton.jit
def rope_merged(
    q, cos, sin, out, S, ROWS, HD, q_sb, q_ss, o_sb, o_ss, o_sh,
    D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, OUT_CONTIG: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    m = (rows < ROWS) & (cols < HD)
    b = rows // S
    s = rows - b * S
    d = cols % D
    HALF: tl.constexpr = D // 2
    base = b * q_sb + s * q_ss
    v = tl.load(q + base + cols, mask=m, other=0).to(tl.float32)
    lo = tl.load(q + base + cols + HALF, mask=m & (d < HALF), other=0).to(tl.float32)
    hi = tl.load(q + base + cols - HALF, mask=m & (d >= HALF), other=0).to(tl.float32)
    c = tl.load(cos + s * D + d, mask=m, other=0, eviction_policy="evict_last").to(tl.float32)
    sn = tl.load(sin + s * D + d, mask=m, other=0, eviction_policy="evict_last").to(tl.float32)
    y = (v * c + tl.where(d < HALF, -lo, hi) * sn).to(out.dtype.element_ty)
    if OUT_CONTIG:
        tl.store(out + b * o_sb + (cols // D) * o_sh + s * D + d, y, mask=m)
    else:
        tl.store(out + b * o_sb + s * o_ss + cols, y, mask=m)


def variants(q, cos, sin) -> dict[str, functools.partial]:
    """Each hand-written kernel's launch, by name, over q [batch, heads, seq, D] whose heads lie D
    apart and tables [seq, D]."""
    import torch

    b, h, s, d = q.shape
    contiguous = torch.empty((b, h, s, d), device=q.device, dtype=q.dtype)
    q_order = torch.empty((b, s, h, d), device=q.device, dtype=q.dtype).transpose(1, 2)
    n = q.numel()

    def flat(block, warps):
        grid = ((n + block - 1) // block,)
        rope_flat[grid](
            q, cos, sin, contiguous, s, h, q.stride(0), q.stride(1), q.stride(2), n, D=d, BLOCK=block, num_warps=warps
        )
        return contiguous

    def merged(block_r, block_c, warps, out_contig):
        out = contiguous if out_contig else q_order
        grid = ((b * s + block_r - 1) // block_r, (h * d + block_c - 1) // block_c)
        rope_merged[grid](
            q, cos, sin, out, s, b * s, h * d, q.stride(0), q.stride(2), out.stride(0), out.stride(2), out.stride(1),
            D=d, BLOCK_R=block_r, BLOCK_C=block_c, OUT_CONTIG=out_contig, num_warps=warps,
        )  # fmt: skip
        return out

    found = {f"flat {block}/{warps}": functools.partial(flat, block, warps) for block, warps in ((1024, 4), (2048, 4))}
    for block_r, block_c, warps in ((1, 1024, 4), (2, 1024, 4), (2, 512, 4), (4, 512, 4)):
        for out_contig in (False, True):
            name = f"merged {block_r}x{block_c}/{warps} out {'bhsd' if out_contig else 'bshd'}"
            found[name] = functools.partial(merged, block_r, block_c, warps, out_contig)
    return found


def compare(case: str, cluster_id: str, peak: float) -> None:
    import torch

    from fuselens.validate.gpu import graph_replay, medians_in_turn

    traced = traced_cluster(case, cluster_id)
    q, cos, sin = traced.args
    if q.dim() != 4 or q.stride(-1) != 1 or q.stride(1) != q.shape[-1]:
        raise SystemExit(f"{case}:{cluster_id} is no RoPE over heads that lie a head's width apart")
    seq, width = q.shape[2], q.shape[3]
    tables = [t.reshape(seq, width).contiguous() for t in (cos, sin)]
    with torch.no_grad():
        want = traced.eager(*traced.args)
        want = want[0] if isinstance(want, tuple | list) else want
        replays = compiled_replays(traced.eager, traced.args)
        replays["generated"] = graph_replay(functools.partial(traced.fused, *traced.args))
        for name, launch in variants(q, *tables).items():
            torch.testing.assert_close(launch().float(), want.float(), atol=0.05, rtol=0.02)
            replays[name] = graph_replay(launch)
        times = medians_in_turn(replays, 15)
    title = f"{case} {cluster_id} ({traced.cluster.op_chain}), q {list(q.shape)} strides {list(q.stride())}"
    print_times(f"{title}; {traced.moved / 2**20:.1f} MB moved", times, traced.moved, peak)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", help="model:cluster (default: phi3:c4)")
    return on_cuda(parser.parse_args().case or ["phi3:c4"], compare)


if __name__ == "__main__":
    raise SystemExit(main())
