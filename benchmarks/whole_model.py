"""Whole models after `fuselens apply`, against eager and torch.compile, on one CUDA device.

    python benchmarks/whole_model.py [--only llama_block.py ...] [--dtype bfloat16] [--train] [--profile] [--out DIR]

Each example of `benchmarks/gpu.py`'s suite, at its DRAM-size shapes, is copied to a temporary
folder and applied (every cluster that applies), then the original and the applied model (the same
weights) are timed in one process, CUDA-graph replay (no launch gaps), the replays sampled in
turn: eager; torch.compile, mode "default"; torch.compile, mode "max-autotune-no-cudagraphs"; the
applied model; the applied model under torch.compile (default).  The applied model's largest
difference from eager is printed too.  With `--train` each is timed for one training step instead: the
model in training mode, its forward and `torch.autograd.grad` of its output (a fixed random upstream
gradient) with respect to its parameters and floating-point inputs, with the peak memory one step
allocates beyond its inputs.  `--profile` prints, for eager and the applied model, the CUDA kernels of
one step that took the most time.  Writes whole_model.json and whole_model.md to --out.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from gpu import EXAMPLES, SUITE  # noqa: E402  (the GPU suite's examples and sizes)
from kernel_table import top_kernels  # noqa: E402
from model_files import load_model_file  # noqa: E402
from provenance import line as provenance_line  # noqa: E402
from provenance import provenance  # noqa: E402


def run_example(example: str, dtype: str, train: bool = False, profile: bool = False) -> dict:
    import torch

    from fuselens.contracts.config import model_settings
    from fuselens.contracts.options import AnalyzeOptions
    from fuselens.pipeline.apply import apply_file
    from fuselens.validate.gpu import graph_replay, medians_in_turn

    cls, sizes = SUITE[example]
    shapes, init = sizes["dram"]
    ints = example == "gpt.py"
    inputs_config = [{"shape": s, "dtype": "int64" if ints else dtype} for s in shapes]
    config = {"inputs": inputs_config, "init": init, "param_dtype": dtype}
    folder = tempfile.mkdtemp(prefix="fuselens-whole-")
    path = os.path.join(folder, example)
    shutil.copy(os.path.join(EXAMPLES, example), path)
    result = apply_file(
        path, AnalyzeOptions(models={cls: model_settings(config, "the benchmark")}), None, lambda _: True
    )
    original = getattr(load_model_file(os.path.join(EXAMPLES, example), f"original_{cls}"), cls)
    applied = getattr(load_model_file(path, f"applied_{cls}"), cls)
    torch_dtype = getattr(torch, dtype)
    torch.manual_seed(0)
    a = original(**init).to("cuda", torch_dtype).train(train)
    b = applied(**init).to("cuda", torch_dtype).train(train)
    b.load_state_dict(a.state_dict())
    inputs = [
        torch.randint(0, 50000, tuple(s), device="cuda") if ints else torch.randn(*s, device="cuda", dtype=torch_dtype)
        for s in shapes
    ]
    models = {
        "eager": a,
        "compile_default": torch.compile(a),
        "compile_max_autotune_no_cudagraphs": torch.compile(a, mode="max-autotune-no-cudagraphs"),
        "applied": b,
        "applied_compiled": torch.compile(b),
    }
    row = {
        "example": example,
        "dtype": dtype,
        "shapes": shapes,
        "mode": "training step" if train else "inference",
        "applied": result.applied,
        "skipped": result.skipped,
    }
    if train:
        fns = {name: training_step(m, inputs) for name, m in models.items()}
        row["peak_mb"] = {name: peak_memory_mb(fn) for name, fn in fns.items()}
        if profile:
            for name in ("eager", "applied"):
                print(f"--- {example}, {name}, one training step", flush=True)
                print(top_kernels(fns[name]), flush=True)
        graphs = {name: graph_replay(fn) for name, fn in fns.items()}
        row["graph_us"] = medians_in_turn(graphs, 15)
        torch.manual_seed(1)
        want = a(*inputs)
        torch.manual_seed(1)
        got = b(*inputs)
    else:
        with torch.no_grad():
            fns = {name: functools.partial(m, *inputs) for name, m in models.items()}
            if profile:
                for name in ("eager", "applied"):
                    print(f"--- {example}, {name}, one forward", flush=True)
                    print(top_kernels(fns[name]), flush=True)
            want, got = a(*inputs), b(*inputs)
            graphs = {name: graph_replay(fn) for name, fn in fns.items()}
            row["graph_us"] = medians_in_turn(graphs, 15)
    row["max_abs"] = (got.float() - want.float()).abs().max().item()
    row["output_max_abs"] = want.float().abs().max().item()
    return row


def training_step(model, inputs: list):
    """One step: the forward, then the gradients of its output (a fixed upstream gradient) with respect
    to the parameters and the floating-point inputs, as an optimizer step would need them."""
    import torch

    leaves = [x.detach().requires_grad_() if x.is_floating_point() else x for x in inputs]
    wrt = [p for p in model.parameters() if p.requires_grad] + [x for x in leaves if x.requires_grad]
    upstream = None

    def step():
        nonlocal upstream
        out = model(*leaves)
        if upstream is None:
            upstream = torch.randn_like(out)
        return torch.autograd.grad(out, wrt, upstream)

    return step


def peak_memory_mb(fn) -> float:
    """What one call allocates at its peak beyond what was allocated before it."""
    import torch

    fn()  # compiled models compile here, outside the measurement
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def markdown(rows: list[dict], device: str, versions: str) -> str:
    names = ["eager", "compile_default", "compile_max_autotune_no_cudagraphs", "applied", "applied_compiled"]
    lines = [
        f"Device: {device}; {versions}",
        "",
        "| example | mode | dtype | applied | " + " | ".join(f"{n} µs" for n in names) + " | applied vs eager | "
        "applied vs compile default | max abs diff |",
        "|" + "---|" * (len(names) + 7),
    ]
    for r in rows:
        g = r["graph_us"]
        lines.append(
            f"| {r['example'].removesuffix('.py')} | {r.get('mode', 'inference')} | {r['dtype']} | {len(r['applied'])} of "
            f"{len(r['applied']) + len(r['skipped'])} | " + " | ".join(f"{g[n]:.1f}" for n in names) + " | "
            f"{g['eager'] / g['applied']:.3f}× | {g['compile_default'] / g['applied']:.3f}× | "
            f"{r['max_abs']:.3g} (of {r['output_max_abs']:.3g}) |"
        )
    peaks = [r for r in rows if "peak_mb" in r]
    if peaks:
        lines += ["", "Peak memory of one step beyond its inputs, MB:", ""]
        lines += ["| example | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
        for r in peaks:
            lines.append(
                f"| {r['example'].removesuffix('.py')} | " + " | ".join(f"{r['peak_mb'][n]:.0f}" for n in names) + " |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", help="example file(s) to run (default: all)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--train", action="store_true", help="time a training step instead of a forward")
    parser.add_argument("--profile", action="store_true", help="print each model's slowest kernels")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    rows = []
    measured_with = provenance()
    device, versions = torch.cuda.get_device_name(), provenance_line(measured_with)
    os.makedirs(args.out, exist_ok=True)
    # The branchy model reads a value (`if h.mean() > 0:`): no CUDA graph can capture it.
    for example in args.only or [e for e in SUITE if e != "branchy.py"]:
        print(f"… {example}", file=sys.stderr, flush=True)
        rows.append(run_example(example, args.dtype, args.train, args.profile))
        torch._dynamo.reset()
        text = markdown(rows, device, versions)  # written after each example: a long suite keeps what it measured
        with open(os.path.join(args.out, "whole_model.json"), "w", encoding="utf-8") as fh:
            json.dump({"device": device, "provenance": measured_with, "rows": rows}, fh, indent=1)
        with open(os.path.join(args.out, "whole_model.md"), "w", encoding="utf-8") as fh:
            fh.write(text)
    print(markdown(rows, device, versions))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
