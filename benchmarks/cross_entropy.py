"""A language model's loss, as people write it, after `fuselens apply`: time and peak memory.

    python benchmarks/cross_entropy.py [--tokens 8192 32768] [--vocab 32000 128256 256000] [--out DIR]

The loss `-F.log_softmax(logits.float(), -1).gather(-1, target[..., None])` (per token) is written
to a model file, analyzed and applied once at a small shape (the kernel reads every size at call
time), then, at each (tokens, vocabulary) in bf16 on one CUDA device, timed in one process by
CUDA-graph replay, the replays sampled in turn:

- eager, the model as written;
- eager `F.cross_entropy(logits.float(), target, reduction="none")`, torch's own loss;
- torch.compile of the model, mode "default", and mode "max-autotune-no-cudagraphs";
- the applied model (its fused kernel).

Peak memory is what one call allocates beyond its inputs (`torch.cuda.max_memory_allocated`).
The kernels were not tuned on this suite.  Writes cross_entropy.json and cross_entropy.md to --out.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from provenance import line as provenance_line  # noqa: E402
from provenance import provenance  # noqa: E402

MODEL = textwrap.dedent(
    """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class TokenLoss(nn.Module):
        def forward(self, logits, target):
            return -F.log_softmax(logits.float(), dim=-1).gather(-1, target[..., None])

        @classmethod
        def example_inputs(cls):
            return torch.randn(64, 1000, dtype=torch.bfloat16), torch.randint(0, 1000, (64,))
    """
)
IMPLEMENTATIONS = ["eager", "eager_cross_entropy", "compile_default", "compile_max_autotune_no_cudagraphs", "applied"]


def _load(path: str, name: str):
    sys.path.insert(0, os.path.dirname(path))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    return module


def applied_models():
    """(the model as written, the model after `fuselens apply` of every cluster), and what applied."""
    from fuselens.contracts.options import AnalyzeOptions
    from fuselens.pipeline.apply import apply_file

    folder = tempfile.mkdtemp(prefix="fuselens-loss-")
    path = os.path.join(folder, "token_loss.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(MODEL)
    original = _load(path, "original_token_loss").TokenLoss
    result = apply_file(path, AnalyzeOptions(), None, lambda _: True)
    if not result.applied:
        raise SystemExit(f"nothing applied: {result.skipped}")
    return original, _load(path, "applied_token_loss").TokenLoss, result.applied


def peak_bytes(fn) -> int:
    """What one call of `fn` allocates at its peak, beyond what was allocated before it."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak


def run_size(original, applied, tokens: int, vocab: int) -> dict:
    import torch
    import torch.nn.functional as F

    from fuselens.validate.gpu import graph_replay, medians_in_turn

    torch.manual_seed(0)
    logits = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16) * 4
    target = torch.randint(0, vocab, (tokens,), device="cuda")
    a, b = original().cuda(), applied().cuda()
    with torch.no_grad():
        models = {
            "eager": a,
            "eager_cross_entropy": lambda x, t: F.cross_entropy(x.float(), t, reduction="none"),
            "compile_default": torch.compile(a, dynamic=False),
            "compile_max_autotune_no_cudagraphs": torch.compile(a, mode="max-autotune-no-cudagraphs", dynamic=False),
            "applied": b,
        }
        fns = {name: functools.partial(m, logits, target) for name, m in models.items()}
        want = fns["eager"]().squeeze(-1)
        diffs = {name: (fn().reshape(-1) - want).abs().max().item() for name, fn in fns.items()}
        del want
        peaks = {name: peak_bytes(fn) for name, fn in fns.items()}
        graphs = {}
        for name, fn in fns.items():  # a graph keeps its intermediates: the largest sizes fit only some
            try:
                graphs[name] = graph_replay(fn)
            except torch.OutOfMemoryError:
                print(f"  {name}: out of memory beside the other graphs; not timed", file=sys.stderr)
        times = medians_in_turn(graphs, 15)
    logits_bytes = logits.numel() * logits.element_size()
    return {
        "tokens": tokens,
        "vocab": vocab,
        "graph_us": times,
        "peak_bytes": peaks,
        "max_abs": diffs,
        "logits_bytes": logits_bytes,
        "applied_gbps": round(logits_bytes / (times["applied"] * 1e-6) / 1e9, 1),
    }


def markdown(rows: list[dict], device: str, versions: str) -> str:
    lines = [
        f"Device: {device}; {versions}",
        "",
        "| tokens | vocab | " + " | ".join(f"{n} µs" for n in IMPLEMENTATIONS) + " | applied vs eager | "
        "applied vs better compile | applied GB/s | peak MiB (eager / cross_entropy / compile / applied) | "
        "applied max abs diff |",
        "|" + "---|" * (len(IMPLEMENTATIONS) + 7),
    ]
    for r in rows:
        p = r["peak_bytes"]
        g = {n: r["graph_us"].get(n, float("nan")) for n in IMPLEMENTATIONS}  # nan: out of memory
        better = min(g["compile_default"], g["compile_max_autotune_no_cudagraphs"])
        mib = " / ".join(f"{p[n] / 2**20:.0f}" for n in ("eager", "eager_cross_entropy", "compile_default", "applied"))
        lines.append(
            f"| {r['tokens']} | {r['vocab']} | " + " | ".join(f"{g[n]:.1f}" for n in IMPLEMENTATIONS) + " | "
            f"{g['eager'] / g['applied']:.2f}× | {better / g['applied']:.2f}× | {r['applied_gbps']:.0f} | {mib} | "
            f"{r['max_abs']['applied']:.2g} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 128256, 256000])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    original, applied, which = applied_models()
    measured_with = provenance()
    device, versions = torch.cuda.get_device_name(), provenance_line(measured_with)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for vocab in args.vocab:
        for tokens in args.tokens:
            print(f"… {tokens} tokens, vocabulary {vocab}", file=sys.stderr, flush=True)
            rows.append(run_size(original, applied, tokens, vocab))
            torch._dynamo.reset()
            torch.cuda.empty_cache()
            text = markdown(rows, device, versions)  # after each size: a long run keeps what it measured
            with open(os.path.join(args.out, "cross_entropy.json"), "w", encoding="utf-8") as fh:
                json.dump({"device": device, "provenance": measured_with, "applied": which, "rows": rows}, fh, indent=1)
            with open(os.path.join(args.out, "cross_entropy.md"), "w", encoding="utf-8") as fh:
                fh.write(text)
    print(markdown(rows, device, versions))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
