"""A norm backward's tiles, swept: rows a tile, warps and programs, against torch.compile.

    python benchmarks/norm_tiles.py [--tokens 8192] [--cases NAME ...] [--code DIR]

The backward of a norm sums its weight's (and bias's) gradient over the rows inside the kernel: each
program walks blocks of rows and leaves one float32 row of partial sums, which torch then sums.  How
many rows a tile, how many warps and how many programs decide how many rows are in flight, how many
registers a thread holds (past 255 they spill) and how many partial rows torch sums afterwards.

The norm cases of `benchmarks/training.py` (hidden 4096, bf16) are applied once; then one training
step (forward and `autograd.grad`) is timed by CUDA-graph replay, the replays sampled in turn, with
every tile of `TILES` forced on the backward kernel, with the tile the kernel module chooses, and
with torch.compile (mode "max-autotune-no-cudagraphs") of the model as written.  The forward is the
same in every applied row, so their differences are the backward's.  Needs CUDA.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

NORMS = ["RMSNorm", "LayerNorm + residual", "residual + RMSNorm"]
# (rows a tile, warps, programs a multiprocessor): up to 64 elements of a 4096-wide row a thread,
# at most 64 warps a multiprocessor.
TILES = [
    (r, w, p)
    for r in (1, 2, 4, 8)
    for w in (4, 8, 16, 32)
    for p in (1, 2, 4, 8)
    if 4 <= r * 4096 // (32 * w) <= 64 and w * p <= 64
]


def sweep(name: str, tokens: int, code_dir: str | None = None) -> None:
    import torch
    from training import CASES, applied_models, case_input, step

    from fuselens.validate.gpu import graph_replay, medians_in_turn

    original, applied, _ = applied_models(CASES[name][0], f"tiles_{NORMS.index(name)}", CASES[name][1](tokens))
    torch.manual_seed(0)
    a = original().cuda().to(torch.bfloat16)
    b = applied().cuda().to(torch.bfloat16)
    b.load_state_dict(a.state_dict())
    inputs = [case_input(shape, kind) for shape, kind in CASES[name][1](tokens)]
    with torch.no_grad():
        outs = a(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    upstream = [torch.randn_like(o) for o in outs]
    module = b.forward.__globals__["cluster0"].__globals__  # the kernel module the applied file imports
    chosen = module["_total_tile"]
    sms = module["_sm_count"]()
    fn = functools.partial(step, b, inputs, upstream)
    graphs = {}
    for r, w, p in TILES:
        module["_total_tile"] = lambda rows, *_, r=r, w=w, p=p: (r, w, min((rows + r - 1) // r, p * sms))
        graphs[f"{r} rows x {w} warps, {p} a multiprocessor"] = graph_replay(fn)
    module["_total_tile"] = chosen
    graphs["chosen"] = graph_replay(fn)
    compiled = torch.compile(a, mode="max-autotune-no-cudagraphs", dynamic=False)
    graphs['torch.compile "max-autotune-no-cudagraphs"'] = graph_replay(
        functools.partial(step, compiled, inputs, upstream)
    )
    times = medians_in_turn(graphs, 10)
    if code_dir:  # what torch.compile generated for the step, to read beside the kernel module
        from torch._inductor.utils import run_and_get_code

        torch._dynamo.reset()
        again = torch.compile(a, mode="max-autotune-no-cudagraphs", dynamic=False)
        _, code = run_and_get_code(functools.partial(step, again, inputs, upstream))
        with open(os.path.join(code_dir, f"inductor_{NORMS.index(name)}.py"), "w", encoding="utf-8") as fh:
            fh.write("\n\n# ----\n\n".join(code))
        shutil.copy(module["__file__"], os.path.join(code_dir, f"fuselens_{NORMS.index(name)}.py"))
    print(f"{name}, {tokens} x 4096 bf16, one step:")
    for key, us in sorted(times.items(), key=lambda kv: kv[1]):
        print(f"  {key:>44}: {us:8.1f} µs")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--cases", nargs="*", choices=NORMS, default=NORMS)
    parser.add_argument(
        "--code", metavar="DIR", help="also write torch.compile's and fuselens's kernels for each case here"
    )
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    for name in args.cases:
        sweep(name, args.tokens, args.code)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
