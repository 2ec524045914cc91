"""Blocks with hand-written attention, with every fix applied (the clusters and the attention's rewrite to
`F.scaled_dot_product_attention`), against eager and torch.compile, in inference and one training step.

    python benchmarks/attention.py                               # on the CUDA device, bf16
    python benchmarks/attention.py --only llama --dtype bfloat16 --out results/
    python benchmarks/attention.py --only llama --profile       # and the kernels of one training step
    python benchmarks/attention.py --device cpu --tiny           # a smoke run of every step on a CPU

The Llama-style block (`examples/llama_block.py` at dim 4096, 32 heads, 4×2048 tokens) and nanoGPT's
block (`examples/nanogpt_attention.py`, GPT-2 small: 768 wide, 12 heads, 12×1024 tokens; its dropouts at
`--dropout`, 0 by default as nanoGPT pretrains) are copied to a temporary folder and applied there as
`fuselens apply` applies them (no validation: `fuselens validate` checks the kernels).  In one process,
the original and the applied model (the same weights) run

- inference: the forward under `torch.no_grad()`;
- a training step: the forward, then the backward of the mean of the output's squares;

as eager, torch.compile mode "default", torch.compile mode "max-autotune-no-cudagraphs", and the applied
model, each replayed as a CUDA graph (the replays sampled in turn; host-inclusive timing for all of a
row where one of them cannot be captured), with the peak memory one call allocates above what the model
and its inputs hold.  It prints each time, the ratios against the applied model and the applied model's
largest difference from eager, and writes attention.json to --out.

On a CPU (`--device cpu`) nothing is a CUDA graph: each call is timed back to back, the applied model's
clusters run their lines (their kernels run on CUDA, or in the Triton interpreter where TRITON_INTERPRET=1
is set), and torch.compile runs only with `--cpu-compile` (Inductor's C++ build takes minutes there).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from kernel_table import top_kernels  # noqa: E402
from model_files import load_model_file  # noqa: E402
from provenance import line as provenance_line  # noqa: E402
from provenance import provenance  # noqa: E402

EXAMPLES = os.path.join(ROOT, "examples")
VARIANTS = ["eager", "compile_default", "compile_max_autotune_no_cudagraphs", "applied"]


@dataclass
class Block:
    """A block to measure: its example, class, constructor, the inputs it is analyzed and run at."""

    key: str
    example: str
    cls: str
    init: dict[str, Any]  # the constructor's arguments (analysis and run)
    shapes: list[list[int]]
    built: Callable[[Any, dict[str, Any]], Any] | None = None  # (module, init) -> model, where `init` is not enough
    # The inputs it is analyzed at, where its constructor's defaults are not those of the run (nanoGPT's
    # block takes a config object: it is analyzed with the default one).
    analyzed: list[list[int]] = field(default_factory=list)


def blocks(tiny: bool, dropout: float) -> list[Block]:
    llama = {"dim": 4096, "n_heads": 32, "hidden": 11008, "max_len": 4096}
    llama_shape = [[4, 2048, 4096]]
    gpt = {"block_size": 1024, "n_embd": 768, "n_head": 12}
    gpt_shape = [[12, 1024, 768]]
    if tiny:
        llama, llama_shape = {"dim": 128, "n_heads": 4, "hidden": 256, "max_len": 64}, [[2, 48, 128]]
        gpt, gpt_shape = {"block_size": 64, "n_embd": 64, "n_head": 4}, [[2, 48, 64]]

    def nanogpt(module, _init):
        return module.Block(module.GPTConfig(**gpt, dropout=dropout))

    return [
        Block("llama", "llama_block.py", "LlamaBlock", llama, llama_shape),
        # Analyzed with its default configuration (the class takes a config object): the rewrite reads
        # its sizes from the code, so it holds at any configuration.
        Block("nanogpt", "nanogpt_attention.py", "Block", {}, gpt_shape, nanogpt, [[*gpt_shape[0][:2], 768]]),
    ]


def applied_copy(block: Block, dtype: str) -> tuple[str, list[str], list[str]]:
    """The example applied (every cluster and rewrite) in a folder of its own: its path, what was applied
    and what was skipped."""
    from fuselens.contracts.config import model_settings
    from fuselens.contracts.options import AnalyzeOptions
    from fuselens.pipeline.apply import apply_file

    folder = tempfile.mkdtemp(prefix="fuselens-attention-")
    path = os.path.join(folder, block.example)
    shutil.copy(os.path.join(EXAMPLES, block.example), path)
    shapes = block.analyzed or block.shapes
    config = {"inputs": [{"shape": s, "dtype": dtype} for s in shapes], "param_dtype": dtype}
    if block.init:
        config["init"] = block.init
    options = AnalyzeOptions(models={block.cls: model_settings(config, "the benchmark")})
    result = apply_file(path, options, None, lambda _: True)
    if result.refused:
        raise SystemExit(f"{block.example}: apply refused: {result.refused}")
    if not any(i.startswith("r") for i in result.applied):
        raise SystemExit(f"{block.example}: the attention was not rewritten: {result.skipped}")
    return path, result.applied, result.skipped


def models(block: Block, path: str, device: str, dtype: str):
    import torch

    original = load_model_file(os.path.join(EXAMPLES, block.example), f"original_{block.key}")
    applied = load_model_file(path, f"applied_{block.key}")
    torch.manual_seed(0)

    def build(module):
        model = block.built(module, block.init) if block.built else getattr(module, block.cls)(**block.init)
        return model.to(device, getattr(torch, dtype))

    a, b = build(original), build(applied)
    b.load_state_dict(a.state_dict())
    return a, b


def timed(calls: dict[str, Callable[[], Any]], device: str, repeats: int) -> tuple[dict[str, float], str]:
    """Median µs per call: CUDA-graph replays on CUDA (host-inclusive for every call where one cannot be
    captured), calls back to back on a CPU."""
    if device == "cuda":
        from fuselens.validate.gpu import graph_replay, medians_in_turn, time_launches_us

        try:
            return medians_in_turn({name: graph_replay(call) for name, call in calls.items()}, repeats), "graph"
        except RuntimeError as exc:
            print(f"  (no CUDA graph: {exc}; timing launches)", file=sys.stderr)
            import torch

            torch.cuda.synchronize()
            return time_launches_us(calls, repeats), "launches"
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call()
    for _ in range(repeats):
        for name, call in calls.items():
            started = time.perf_counter()
            call()
            samples[name].append((time.perf_counter() - started) * 1e6)
    return {name: statistics.median(times) for name, times in samples.items()}, "cpu"


def peak_bytes(call: Callable[[], Any], device: str) -> int | None:
    """What one call allocates at its peak, above what is allocated before it (CUDA only)."""
    if device != "cuda":
        return None
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    call()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def measure(block: Block, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    device, dtype = args.device, args.dtype
    path, applied, skipped = applied_copy(block, dtype)
    original, rewritten = models(block, path, device, dtype)
    torch.manual_seed(1)
    inputs = [torch.randn(*s, device=device, dtype=getattr(torch, dtype)) for s in block.shapes]
    compile_now = device == "cuda" or args.cpu_compile
    variants: dict[str, Any] = {"eager": original, "applied": rewritten}
    if compile_now:
        variants["compile_default"] = torch.compile(original)
        variants["compile_max_autotune_no_cudagraphs"] = torch.compile(original, mode="max-autotune-no-cudagraphs")
    variants = {name: variants[name] for name in VARIANTS if name in variants}
    row: dict[str, Any] = {"block": block.key, "example": block.example, "shapes": block.shapes, "dtype": dtype}
    row["applied"], row["skipped"] = applied, skipped

    original.eval(), rewritten.eval()
    with torch.no_grad():
        want, got = original(*inputs), rewritten(*inputs)
        row["max_abs"] = (got.float() - want.float()).abs().max().item()
        row["output_max_abs"] = want.float().abs().max().item()
        calls = {name: (lambda m=m: m(*inputs)) for name, m in variants.items()}
        for call in calls.values():
            call()  # compiled outside the timed region
        row["inference_us"], row["inference_timing"] = timed(calls, device, args.repeats)
        row["inference_peak_bytes"] = {name: peak_bytes(call, device) for name, call in calls.items()}

    original.train(), rewritten.train()
    parameters = {name: list(m.parameters()) for name, m in (("original", original), ("applied", rewritten))}

    def step(model) -> Callable[[], Any]:
        def run() -> None:
            out = model(*inputs)
            out.float().square().mean().backward()

        return run

    steps = {name: step(m) for name, m in variants.items()}
    for call in steps.values():
        call()  # compiled (the backward too) outside the timed region
    row["training_us"], row["training_timing"] = timed(steps, device, args.repeats)
    if args.profile and device == "cuda":
        for name in ("applied", "compile_max_autotune_no_cudagraphs", "compile_default"):
            if name in steps:
                print(f"--- {block.key}, {name}, one training step\n{top_kernels(steps[name], rows=40)}", flush=True)
    row["training_peak_bytes"] = {name: peak_bytes(call, device) for name, call in steps.items()}
    del parameters
    return row


def table(rows: list[dict[str, Any]], device: str, versions: str) -> str:
    names = [n for n in VARIANTS if any(n in r["inference_us"] for r in rows)]
    lines = [f"Device: {device}; {versions}", ""]
    for phase in ("inference", "training"):
        lines += [
            f"{phase} ({'forward' if phase == 'inference' else 'forward + backward'}), µs per call "
            f"(peak MB above the model and its inputs):",
            "| block | " + " | ".join(names) + " | eager / applied | compile default / applied | "
            "max-autotune / applied |",
            "|" + "---|" * (len(names) + 4),
        ]
        for r in rows:
            us, peak = r[f"{phase}_us"], r[f"{phase}_peak_bytes"]
            cells = [
                f"{us[n]:.1f}" + (f" ({peak[n] / 2**20:.0f} MB)" if peak.get(n) is not None else "") for n in names
            ]
            ratios = [
                f"{us[n] / us['applied']:.2f}×" if n in us else "—"
                for n in ("eager", "compile_default", "compile_max_autotune_no_cudagraphs")
            ]
            lines.append(f"| {r['block']} {r['dtype']} {r['shapes']} | " + " | ".join(cells + ratios) + " |")
        lines.append("")
    for r in rows:
        lines.append(
            f"{r['block']}: applied {', '.join(r['applied'])}; the applied model's largest difference from eager "
            f"{r['max_abs']:.3g} (its output up to {r['output_max_abs']:.3g})"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=["llama", "nanogpt"], help="blocks to run (default: both)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--tiny", action="store_true", help="small sizes: a smoke run of every step")
    parser.add_argument("--dropout", type=float, default=0.0, help="nanoGPT's dropouts (default 0, as it pretrains)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--cpu-compile", action="store_true", help="on a CPU, torch.compile too")
    parser.add_argument("--profile", action="store_true", help="print the kernels of one training step of each")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: pass --device cpu --tiny for a smoke run")
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    measured_with = provenance()
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    rows = []
    os.makedirs(args.out, exist_ok=True)
    for block in blocks(args.tiny, args.dropout):
        if args.only and block.key not in args.only:
            continue
        print(f"… {block.key} ({block.example})", file=sys.stderr, flush=True)
        rows.append(measure(block, args))
        torch._dynamo.reset()
        if args.device == "cuda":
            torch.cuda.empty_cache()
        with open(os.path.join(args.out, "attention.json"), "w", encoding="utf-8") as fh:
            json.dump({"device": device, "provenance": measured_with, "rows": rows}, fh, indent=1)
    print(table(rows, device, provenance_line(measured_with)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
