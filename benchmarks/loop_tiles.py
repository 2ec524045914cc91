"""The looped row kernel's column block and warps, swept over rows too wide to hold in registers.

    python benchmarks/loop_tiles.py [--tokens 8192]

Three models whose rows the row kernel loops over, as people write them: a language model's mean
loss over a 128256-word vocabulary (`F.cross_entropy(logits.float(), target)`), a LayerNorm over
16384 features and a float32 softmax over 32768 columns, each in bf16 at `--tokens` rows.  Each is
applied once; then its kernel is timed with every column block and warp count (one row a program)
and with the tiles the kernel module chooses, by CUDA-graph replay, the replays sampled in turn.
Prints µs and GB/s of the bytes the kernel reads and writes.  Needs CUDA.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from model_files import load_model_file

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
# name -> (source, its inputs at `tokens` rows: (shape, dtype, kind), bytes moved a row)
MODELS = {
    "cross-entropy over 128256": (
        """
        class Model(nn.Module):
            def forward(self, logits, target):
                return F.cross_entropy(logits.float(), target)
        """,
        lambda t: [((t, 128256), "bfloat16"), ((t,), "int64")],
        2 * 128256,
    ),
    "LayerNorm over 16384": (
        """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(16384)

            def forward(self, x):
                return self.norm(x * 2.0)
        """,
        lambda t: [((t, 16384), "bfloat16")],
        2 * 2 * 16384,
    ),
    "softmax over 32768": (
        """
        class Model(nn.Module):
            def forward(self, x):
                return F.softmax(x.float() * 0.5, dim=-1).type_as(x)
        """,
        lambda t: [((t, 32768), "bfloat16")],
        2 * 2 * 32768,
    ),
}
TILES = [(c, w) for c in (2048, 4096, 8192, 16384) for w in (2, 4, 8, 16) if c // (32 * w) >= 4]


def applied_model(name: str, source: str, inputs):
    """The model after `fuselens apply`, with the original's parameters, in bf16 on the GPU."""
    from fuselens.contracts.options import AnalyzeOptions
    from fuselens.pipeline.apply import apply_file

    folder = tempfile.mkdtemp(prefix="fuselens-tiles-")
    path = os.path.join(folder, f"{name}.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(HEADER + textwrap.dedent(source).lstrip())
    shapes = [",".join(map(str, shape)) for shape, _ in inputs]
    options = AnalyzeOptions(input_shapes=shapes, dtypes=[d for _, d in inputs], param_dtype="bfloat16")
    result = apply_file(path, options, None, lambda _: True)
    if not result.applied:
        raise SystemExit(f"{name}: nothing applied: {result.skipped}")
    return load_model_file(path, f"applied_{name}").Model


def sweep(label: str, model, inputs, row_bytes: int) -> None:
    import torch

    from fuselens.validate.gpu import graph_replay, medians_in_turn

    module = model.forward.__globals__["cluster0"].__globals__  # the kernel module the applied file imports
    chosen = module["_row_tile"]
    rows = inputs[0].shape[0]
    cols = inputs[0].shape[-1]
    call = functools.partial(model, *inputs)
    graphs = {}
    with torch.no_grad():
        for block_c, warps in TILES:
            module["_row_tile"] = lambda r, c, itemsize, b=block_c, w=warps: (1, b, w, False)
            graphs[f"{block_c} x {warps} warps"] = graph_replay(call)
        module["_row_tile"] = chosen
        picked = chosen(rows, cols, 4)
        graphs[f"chosen ({picked[1]} x {picked[2]} warps)"] = graph_replay(call)
        times = medians_in_turn(graphs, 10)
    print(f"{label}, {rows} rows:")
    for key, us in sorted(times.items(), key=lambda kv: kv[1]):
        print(f"  {key:>28}: {us:8.1f} µs  {rows * row_bytes / (us * 1e-6) / 1e9:6.0f} GB/s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    for index, (label, (source, shapes, row_bytes)) in enumerate(MODELS.items()):
        specs = shapes(args.tokens)
        model = applied_model(f"tiles_{index}", source, specs)().cuda().to(torch.bfloat16)
        classes = specs[0][0][-1]  # the targets (of the loss) index the first input's columns
        inputs = [
            torch.randn(s, device="cuda", dtype=torch.bfloat16) * 4
            if d == "bfloat16"
            else torch.randint(0, classes, s, device="cuda")
            for s, d in specs
        ]
        sweep(label, model, inputs, row_bytes)
        del model, inputs
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
