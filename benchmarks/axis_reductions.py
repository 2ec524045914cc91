"""Reductions over a dim that is not the last, norms by channel, pooling windows, argmax and views
between ops, after `fuselens apply`: time against eager and torch.compile at DRAM size.

    python benchmarks/axis_reductions.py [--case softmax-over-channels ...] [--dtype bfloat16 float32] [--out DIR]

Each case (`CASES`) is a model file as a user writes it: a softmax over NCHW's channels, a CBAM-style
mean over them, a sum down the rows, an instance norm, a batch norm with the batch's statistics, a
squeeze-excitation, max and average pools (a ResNet stem's eval batch norm, ReLU and 3 x 3 max pool
among them), a global average pool, an argmax, a view between two ops.  For each dtype it is written
with small example inputs, analyzed and applied (its kernels read every size at call time, or, for a
view, hold the sizes it regroups to the model's), then timed at the case's DRAM size on one CUDA
device by CUDA-graph replay, the replays sampled in turn:

- eager, the model as written;
- torch.compile of the model, mode "default", and mode "max-autotune-no-cudagraphs" (static shapes);
- the applied model (its fused kernels).

"applied GB/s" is the model's inputs read and outputs written once, over the applied time.  Without a
CUDA device the script says so and times nothing.  Writes axis_reductions.json and axis_reductions.md
to --out.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import textwrap
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from model_files import load_model_file  # noqa: E402
from provenance import line as provenance_line  # noqa: E402
from provenance import provenance  # noqa: E402
from written import write_results  # noqa: E402

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
IMPLEMENTATIONS = ["eager", "compile_default", "compile_max_autotune_no_cudagraphs", "applied"]


@dataclass(frozen=True)
class Case:
    what: str  # the cluster kind, in words, for the table
    source: str  # a `Model` whose `example_inputs` are small, in DTYPE
    shapes: tuple[tuple[int, ...], ...]  # the inputs at DRAM size


def _model(forward: str, init: str = "", example: str = "torch.randn(2, 8, 6, 10, dtype=DTYPE)") -> str:
    """A model file's class: `init` (constructor lines), `forward` (its body, over `x`)."""
    constructor = (
        f"    def __init__(self):\n        super().__init__()\n{textwrap.indent(init, ' ' * 8)}\n" if init else ""
    )
    return (
        "class Model(nn.Module):\n"
        + constructor
        + f"    def forward(self, x):\n{textwrap.indent(forward, ' ' * 8)}\n\n"
        + f"    @classmethod\n    def example_inputs(cls):\n        return ({example},)\n"
    )


_IMAGE = ((32, 64, 128, 128),)  # 33.5 M elements: 67 MB in bf16, 134 MB in fp32
_CHANNELS_64 = "torch.randn(2, 64, 6, 10, dtype=DTYPE)"  # the small example of a model with 64 channels
CASES: dict[str, Case] = {
    "softmax-over-channels": Case(
        "softmax over NCHW channels (dim 1)", _model("return torch.softmax(x * 0.5, dim=1)"), _IMAGE
    ),
    "log-softmax-over-classes": Case(
        "log-softmax over 21 classes of a segmentation map",
        _model("return F.log_softmax(x + 1, dim=1)", example="torch.randn(2, 21, 6, 10, dtype=DTYPE)"),
        ((16, 21, 256, 256),),
    ),
    "mean-over-channels": Case(
        "mean over channels, keepdim, then a gate (CBAM)",
        _model("return x * torch.sigmoid(x.mean(1, keepdim=True))"),
        _IMAGE,
    ),
    "sum-down-the-rows": Case(
        "sum over dim 0 of [N, D]",
        _model("return torch.exp(x).sum(0) * 2", example="torch.randn(40, 24, dtype=DTYPE)"),
        ((65536, 1024),),
    ),
    "instance-norm": Case(
        "InstanceNorm2d (affine) + ReLU",
        _model("return F.relu(self.norm(x))", "self.norm = nn.InstanceNorm2d(64, affine=True)", _CHANNELS_64),
        _IMAGE,
    ),
    "batch-statistics": Case(
        "BatchNorm2d with the batch's statistics + ReLU",
        _model(
            "return F.relu(self.norm(x))", "self.norm = nn.BatchNorm2d(64, track_running_stats=False)", _CHANNELS_64
        ),
        _IMAGE,
    ),
    "squeeze-excitation": Case(
        "spatial mean, keepdim, then a gate (squeeze-excitation)",
        _model("return x * torch.sigmoid(F.relu(x).mean((2, 3), keepdim=True))"),
        ((32, 256, 64, 64),),
    ),
    "max-pool": Case("ReLU + max_pool2d(2)", _model("return F.max_pool2d(F.relu(x), 2)"), _IMAGE),
    "resnet-stem-pool": Case(
        "eval BatchNorm2d + ReLU + MaxPool2d(3, 2, 1)",
        _model(
            "return self.pool(F.relu(self.bn(x)))",
            "self.bn = nn.BatchNorm2d(64)\nself.pool = nn.MaxPool2d(3, 2, 1)",
            _CHANNELS_64,
        ),
        ((32, 64, 112, 112),),
    ),
    "avg-pool": Case("avg_pool2d(2) between two ops", _model("return F.avg_pool2d(x * 2, 2) + 1"), _IMAGE),
    "global-average-pool": Case(
        "SiLU + adaptive_avg_pool2d(1)", _model("return F.adaptive_avg_pool2d(F.silu(x), 1)"), ((32, 256, 64, 64),)
    ),
    "argmax": Case(
        "argmax of scaled rows",
        _model("return torch.argmax(x * 2, dim=-1)", example="torch.randn(6, 40, dtype=DTYPE)"),
        ((16384, 4096),),
    ),
    "view-between-ops": Case(
        "a view between two ops",
        _model("return torch.relu((x * 2).view(x.shape[0], 16, 256)) + 1", example="torch.randn(6, 4096, dtype=DTYPE)"),
        ((16384, 4096),),
    ),
}


def applied_models(case: Case, name: str, dtype: str):
    """(the model as written, the model after `fuselens apply` of every cluster, what applied)."""
    from fuselens.contracts.options import AnalyzeOptions
    from fuselens.pipeline.apply import apply_file

    folder = tempfile.mkdtemp(prefix="fuselens-axis-")
    path = os.path.join(folder, f"{name}.py")  # (its kernel module, `{name}_kernels`, is imported by name)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(HEADER + case.source.replace("DTYPE", f"torch.{dtype}"))
    original = load_model_file(path, f"original_{name}").Model
    result = apply_file(path, AnalyzeOptions(), None, lambda _: True)
    if not result.applied:
        raise SystemExit(f"{name}: nothing applied: {result.skipped}")
    return original, load_model_file(path, f"applied_{name}").Model, result.applied


def run_case(original, applied, case: Case, dtype: str) -> dict:
    import torch

    from fuselens.validate.gpu import graph_replay, medians_in_turn

    torch.manual_seed(0)
    kind = getattr(torch, dtype)
    inputs = [torch.randn(shape, device="cuda", dtype=kind) for shape in case.shapes]
    a = original().cuda().to(kind).eval()
    b = applied().cuda().to(kind).eval()
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        models = {
            "eager": a,
            "compile_default": torch.compile(a, dynamic=False),
            "compile_max_autotune_no_cudagraphs": torch.compile(a, mode="max-autotune-no-cudagraphs", dynamic=False),
            "applied": b,
        }
        fns = {name: functools.partial(m, *inputs) for name, m in models.items()}
        want = fns["eager"]()
        diffs = {name: (fn().double() - want.double()).abs().max().item() for name, fn in fns.items()}
        moved = sum(t.numel() * t.element_size() for t in [*inputs, want])
        del want
        graphs = {name: graph_replay(fn) for name, fn in fns.items()}
        times = medians_in_turn(graphs, 15)
    return {
        "shapes": [list(s) for s in case.shapes],
        "graph_us": times,
        "max_abs": diffs,
        "moved_bytes": moved,
        "applied_gbps": round(moved / (times["applied"] * 1e-6) / 1e9, 1),
    }


def markdown(rows: list[dict], device: str, versions: str) -> str:
    lines = [
        f"Device: {device}; {versions}",
        "",
        "| case | dtype | shape | " + " | ".join(f"{n} µs" for n in IMPLEMENTATIONS) + " | applied vs eager | "
        "applied vs better compile | applied GB/s | applied max abs diff |",
        "|" + "---|" * (len(IMPLEMENTATIONS) + 7),
    ]
    for r in rows:
        g = r["graph_us"]
        better = min(g["compile_default"], g["compile_max_autotune_no_cudagraphs"])
        shape = " ".join("x".join(map(str, s)) for s in r["shapes"])
        lines.append(
            f"| {r['case']} | {r['dtype']} | {shape} | "
            + " | ".join(f"{g[n]:.1f}" for n in IMPLEMENTATIONS)
            + f" | {g['eager'] / g['applied']:.2f}× | {better / g['applied']:.2f}× | {r['applied_gbps']:.0f} | "
            f"{r['max_abs']['applied']:.2g} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=list(CASES), action="append", help="default: every case")
    parser.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("axis_reductions: no CUDA device here, nothing timed (run it on a GPU)", file=sys.stderr)
        return 0
    measured_with = provenance()
    device, versions = torch.cuda.get_device_name(), provenance_line(measured_with)
    os.makedirs(args.out, exist_ok=True)
    rows, applied_clusters = [], {}
    for key in args.case or list(CASES):
        case = CASES[key]
        for dtype in args.dtype:
            name = f"axis_{key.replace('-', '_')}_{dtype}"
            print(f"… {key} in {dtype}", file=sys.stderr, flush=True)
            original, applied, applied_clusters[name] = applied_models(case, name, dtype)
            rows.append({"case": case.what, "dtype": dtype, **run_case(original, applied, case, dtype)})
            torch._dynamo.reset()
            torch.cuda.empty_cache()
            text = markdown(rows, device, versions)  # after each case: a cut run keeps what it measured
            measured = {"device": device, "provenance": measured_with, "applied": applied_clusters, "rows": rows}
            write_results(args.out, "axis_reductions", measured, text)
    print(markdown(rows, device, versions))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
