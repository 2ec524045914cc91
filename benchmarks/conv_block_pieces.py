"""Where the applied conv block's time goes: each convolution in each layout, with and without its
bias, and each of the block's kernels on channels-first and channels-last inputs, timed one by one.

    python benchmarks/conv_block_pieces.py            # every piece
    python benchmarks/conv_block_pieces.py --sweep    # the split group kernels' tile and warps

The conv block (`examples/conv_block.py`) is applied at its DRAM-size shapes (bf16, [32, 256, 64, 64]),
then every piece is captured in a CUDA graph and the replays are sampled in turn.  Needs CUDA.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu import EXAMPLES, SUITE  # the GPU suite's examples and sizes
from model_files import load_model_file


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("conv_block_pieces.py times kernels on a GPU: no CUDA device here")
        return 1
    from fuselens.contracts.config import model_settings
    from fuselens.contracts.options import AnalyzeOptions
    from fuselens.pipeline.apply import apply_file
    from fuselens.validate.gpu import graph_replay, medians_in_turn

    cls, sizes = SUITE["conv_block.py"]
    (x_shape, t_shape), init = sizes["dram"]
    folder = tempfile.mkdtemp(prefix="fuselens-conv-")
    path = os.path.join(folder, "conv_block.py")
    shutil.copy(os.path.join(EXAMPLES, "conv_block.py"), path)
    inputs = [{"shape": x_shape, "dtype": "bfloat16"}, {"shape": t_shape, "dtype": "bfloat16"}]
    settings = model_settings({"inputs": inputs, "init": init, "param_dtype": "bfloat16"}, "the benchmark")
    apply_file(path, AnalyzeOptions(models={cls: settings}), None, lambda _: True)
    kernels = load_model_file(os.path.join(folder, "conv_block_kernels.py"), "conv_block_kernels")
    block = getattr(load_model_file(path, "applied_conv_block"), cls)(**init).to("cuda", torch.bfloat16).eval()

    def cuda(shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

    x, t, e = cuda(x_shape), cuda(t_shape), cuda([x_shape[0], x_shape[1], 1, 1])
    x_last = x.contiguous(memory_format=torch.channels_last)
    conv, norm = block.conv1, block.norm1
    w, b, gw, gb = conv.weight, conv.bias, norm.weight, norm.bias
    conv2d = torch.nn.functional.conv2d
    pieces = {
        "3x3 convolution, channels-first, with its bias": lambda: conv2d(x, w, b, padding=1),
        "3x3 convolution, channels-first, without it": lambda: conv2d(x, w, None, padding=1),
        "3x3 convolution, channels-last, with its bias": lambda: conv2d(x_last, w, b, padding=1),
        "3x3 convolution, channels-last, without it": lambda: conv2d(x_last, w, None, padding=1),
        "GroupNorm + SiLU, eager": lambda: torch.nn.functional.silu(torch.nn.functional.group_norm(x, 32, gw, gb)),
        "cluster0 (GroupNorm + SiLU), channels-first": lambda: kernels.cluster0(x, gw, gb, 1e-5, 32),
        "cluster0, channels-last": lambda: kernels.cluster0(x_last, gw, gb, 1e-5, 32),
        "cluster1 (bias + add + GroupNorm + SiLU), channels-first": lambda: kernels.cluster1(x, b, e, gw, gb, 1e-5, 32),
        "cluster1, channels-last": lambda: kernels.cluster1(x_last, b, e, gw, gb, 1e-5, 32),
        "cluster2 (bias + residual), channels-first": lambda: kernels.cluster2(x, x, b),
        "cluster2, its convolution's result channels-last": lambda: kernels.cluster2(x, x_last, b),
        "channels-first to channels-last copy": lambda: x.contiguous(memory_format=torch.channels_last),
        "the applied block": lambda: block(x, t),
    }
    print(f"Device: {torch.cuda.get_device_name()}; torch {torch.__version__}; bf16 {x_shape}")
    if "--sweep" in sys.argv:
        return _sweep(kernels, pieces)
    with torch.no_grad():
        times = medians_in_turn({name: graph_replay(fn) for name, fn in pieces.items()}, 15)
    for name, us in times.items():
        print(f"{name:60s} {us:8.1f} µs")
    return 0


def _sweep(kernels, pieces) -> int:
    """Time the group-norm clusters under each split tile and warp count.  The launchers read the
    kernel module's `_SPLIT_TILE` and `_SPLIT_WARPS_*` when called, so each graph captures its own."""
    import torch

    from fuselens.validate.gpu import graph_replay, medians_in_turn

    names = [n for n in pieces if n.startswith("cluster0") or n.startswith("cluster1")]
    configs = [(tile, warps) for tile in (2048, 4096, 8192, 16384, 32768) for warps in (2, 4, 8, 16)]
    graphs = {}
    with torch.no_grad():
        for tile, warps in configs:
            kernels._SPLIT_TILE, kernels._SPLIT_WARPS_LAST, kernels._SPLIT_WARPS_FIRST = tile, warps, warps
            for name in names:
                graphs[_config_key(tile, warps, name)] = graph_replay(pieces[name])
        times = medians_in_turn(graphs, 15)
    print(f"{'tile':>6s} {'warps':>5s} " + " ".join(f"{n[:22]:>22s}" for n in names))
    for tile, warps in configs:
        row = " ".join(f"{times[_config_key(tile, warps, n)]:22.1f}" for n in names)
        print(f"{tile:6d} {warps:5d} {row}")
    return 0


def _config_key(tile: int, warps: int, name: str) -> str:
    return f"{tile} elements, {warps} warps: {name}"


if __name__ == "__main__":
    sys.exit(main())
