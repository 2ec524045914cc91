"""A language model's loss, as people write it, after `fuselens apply`: time and peak memory.

    python benchmarks/cross_entropy.py [--tokens 8192 32768] [--vocab 32000 128256 256000] [--out DIR]

Each loss (`MODELS`: per token, `-F.log_softmax(logits.float(), -1).gather(-1, target[..., None])`;
and `F.cross_entropy(logits.float(), target, ignore_index=-100)`, a mean) is written to a model
file, analyzed and applied once at a small shape (the kernel reads every size at call time), then,
at each (tokens, vocabulary) in bf16 on one CUDA device, timed in one process by CUDA-graph replay,
the replays sampled in turn:

- eager, the model as written;
- torch.compile of the model, mode "default", and mode "max-autotune-no-cudagraphs";
- the applied model (its fused kernel).

Peak memory is what one call allocates beyond its inputs (`torch.cuda.max_memory_allocated`).
The kernels were not tuned on this suite.  Writes cross_entropy.json and cross_entropy.md to --out.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from model_files import load_model_file  # noqa: E402
from provenance import line as provenance_line  # noqa: E402
from provenance import provenance  # noqa: E402
from written import write_results  # noqa: E402

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
# Two ways people write a language model's loss: per token, spelled out, and torch's own, as a mean
# over the tokens whose label is not -100 (a tenth of them here).
MODELS = {
    "per-token log-softmax pick": textwrap.dedent(
        """
        class Loss(nn.Module):
            def forward(self, logits, target):
                return -F.log_softmax(logits.float(), dim=-1).gather(-1, target[..., None])

            @classmethod
            def example_inputs(cls):
                return torch.randn(64, 1000, dtype=torch.bfloat16), torch.randint(0, 1000, (64,))
        """
    ),
    "F.cross_entropy, mean, ignore_index": textwrap.dedent(
        """
        class Loss(nn.Module):
            def forward(self, logits, target):
                return F.cross_entropy(logits.float(), target, ignore_index=-100)

            @classmethod
            def example_inputs(cls):
                return torch.randn(64, 1000, dtype=torch.bfloat16), torch.randint(0, 1000, (64,))
        """
    ),
}
IMPLEMENTATIONS = ["eager", "compile_default", "compile_max_autotune_no_cudagraphs", "applied"]


def applied_models(source: str, name: str):
    """(the model as written, the model after `fuselens apply` of every cluster), and what applied."""
    from fuselens.contracts.options import AnalyzeOptions
    from fuselens.pipeline.apply import apply_file

    folder = tempfile.mkdtemp(prefix="fuselens-loss-")
    path = os.path.join(folder, f"{name}.py")  # (its kernel module, `{name}_kernels`, is imported by name)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(HEADER + source.lstrip())
    original = load_model_file(path, f"original_{name}").Loss
    result = apply_file(path, AnalyzeOptions(), None, lambda _: True)
    if not result.applied:
        raise SystemExit(f"nothing applied: {result.skipped}")
    return original, load_model_file(path, f"applied_{name}").Loss, result.applied


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


def run_size(original, applied, tokens: int, vocab: int, ignores: bool) -> dict:
    import torch

    from fuselens.validate.gpu import graph_replay, medians_in_turn

    torch.manual_seed(0)
    logits = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16) * 4
    target = torch.randint(0, vocab, (tokens,), device="cuda")
    target[torch.rand(tokens, device="cuda") < 0.1] = -100  # (the per-token pick never sees these)
    target = target if ignores else target.clamp(min=0)
    a, b = original().cuda(), applied().cuda()
    with torch.no_grad():
        models = {
            "eager": a,
            "compile_default": torch.compile(a, dynamic=False),
            "compile_max_autotune_no_cudagraphs": torch.compile(a, mode="max-autotune-no-cudagraphs", dynamic=False),
            "applied": b,
        }
        fns = {name: functools.partial(m, logits, target) for name, m in models.items()}
        want = fns["eager"]().reshape(-1)
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
        "| loss | tokens | vocab | " + " | ".join(f"{n} µs" for n in IMPLEMENTATIONS) + " | applied vs eager | "
        "applied vs better compile | applied GB/s | peak MiB (eager / compile default / applied) | "
        "applied max abs diff |",
        "|" + "---|" * (len(IMPLEMENTATIONS) + 8),
    ]
    for r in rows:
        p = r["peak_bytes"]
        g = {n: r["graph_us"].get(n, float("nan")) for n in IMPLEMENTATIONS}  # nan: out of memory
        better = min(g["compile_default"], g["compile_max_autotune_no_cudagraphs"])
        mib = " / ".join(f"{p[n] / 2**20:.0f}" for n in ("eager", "compile_default", "applied"))
        lines.append(
            f"| {r['loss']} | {r['tokens']} | {r['vocab']} | "
            + " | ".join(f"{g[n]:.1f}" for n in IMPLEMENTATIONS)
            + f" | {g['eager'] / g['applied']:.2f}× | {better / g['applied']:.2f}× | {r['applied_gbps']:.0f} | "
            f"{mib} | {r['max_abs']['applied']:.2g} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 128256, 256000])
    parser.add_argument("--loss", choices=list(MODELS), action="append", help="default: both")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    measured_with = provenance()
    device, versions = torch.cuda.get_device_name(), provenance_line(measured_with)
    os.makedirs(args.out, exist_ok=True)
    rows, applied_clusters = [], {}
    for loss in args.loss or list(MODELS):
        name = f"loss_{list(MODELS).index(loss)}"
        original, applied, applied_clusters[loss] = applied_models(MODELS[loss], name)
        for vocab in args.vocab:
            for tokens in args.tokens:
                print(f"… {loss}: {tokens} tokens, vocabulary {vocab}", file=sys.stderr, flush=True)
                row = run_size(original, applied, tokens, vocab, ignores="ignore_index" in loss)
                rows.append({"loss": loss, **row})
                torch._dynamo.reset()
                torch.cuda.empty_cache()
                text = markdown(rows, device, versions)  # after each size: a long run keeps what it measured
                measured = {"device": device, "provenance": measured_with, "applied": applied_clusters, "rows": rows}
                write_results(args.out, "cross_entropy", measured, text)
    print(markdown(rows, device, versions))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
