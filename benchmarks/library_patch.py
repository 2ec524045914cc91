"""A transformers Llama decoder stack, patched by `fuselens apply`, against eager and torch.compile.

    python benchmarks/library_patch.py [--layers 2] [--seq 2048] [--out DIR]

A user's file builds `LlamaModel` (hidden 4096, intermediate 11008, 32 heads, bf16 weights, no KV
cache) at module level with its inputs in `pyproject.toml`, as a user writes it.  The script runs
`fuselens apply` on it (the kernels go into transformers' own functions through the library patch
that `install()` puts in place), then on one CUDA device and in one process:

- whole-model time, CUDA-graph replay (no launch gaps, the replays sampled in turn) and
  host-inclusive launch: eager; torch.compile (mode "default"); torch.compile (mode
  "max-autotune-no-cudagraphs"); the patched model; the patched model under torch.compile (default,
  compiled after `install()`);
- the patched model's numerics: its largest difference from eager bf16, and both against the same
  model in fp32;
- each cluster's kernel against eager and torch.compile of the same ops (`fuselens validate
  --benchmark` machinery: CUDA-graph median, % of the measured copy bandwidth).

Prints a markdown table and writes results.json and results.md to --out.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from provenance import line as provenance_line
from provenance import provenance

MODEL = """
from transformers import LlamaConfig, LlamaModel

config = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers={layers}, num_attention_heads=32,
                     num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, use_cache=False)
model = LlamaModel(config)
"""

PYPROJECT = """
[tool.fuselens.models.model]
inputs = [{{ shape = [1, {seq}], dtype = "int64" }}]
param_dtype = "bfloat16"
"""


def write_user_file(folder: str, layers: int, seq: int) -> str:
    path = os.path.join(folder, "llama_stack.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(textwrap.dedent(MODEL.format(layers=layers)).lstrip())
    with open(os.path.join(folder, "pyproject.toml"), "w", encoding="utf-8") as fh:
        fh.write(textwrap.dedent(PYPROJECT.format(seq=seq)).lstrip())
    return path


def apply(path: str) -> dict:
    from fuselens.contracts.options import AnalyzeOptions
    from fuselens.pipeline.apply import apply_file

    result = apply_file(path, AnalyzeOptions(), None, lambda _: True)
    if result.refused:
        raise SystemExit(f"apply refused: {result.refused}")
    return {"applied": result.applied, "skipped": result.skipped}


def cluster_timings(path: str) -> list[dict]:
    from fuselens.contracts.options import AnalyzeOptions, ValidateOptions
    from fuselens.pipeline.validate import validate_file

    result = validate_file(path, AnalyzeOptions(), ValidateOptions(benchmark=True))
    rows = []
    for model in result.models:
        for c in model.clusters:
            row = {"cluster": c.id, "ops": c.ops, "status": c.status, "instances": c.instances, "max_abs": c.max_abs}
            if c.timing:
                row.update(vars(c.timing))
            rows.append(row)
    return rows


def whole_model(folder: str, seq: int) -> dict:
    import torch

    from fuselens.validate.gpu import graph_replay, medians_in_turn, time_launches_us

    sys.path.insert(0, folder)
    user = importlib.import_module("llama_stack")  # its first lines install the patch
    kernels = importlib.import_module("llama_stack_kernels")
    patched = kernels.install()
    kernels.uninstall()
    model = user.model.to("cuda", torch.bfloat16).eval()
    ids = torch.randint(0, 32000, (1, seq), device="cuda")

    def run(m):
        return lambda: m(input_ids=ids).last_hidden_state

    with torch.no_grad():
        # The library's own code first: eager and both torch.compile modes, captured into CUDA graphs.
        want = run(model)()
        plain = {
            "eager": run(model),
            "compile_default": run(torch.compile(model)),
            "compile_max_autotune_no_cudagraphs": run(torch.compile(model, mode="max-autotune-no-cudagraphs")),
        }
        graphs = {name: graph_replay(fn) for name, fn in plain.items()}
        launches = time_launches_us(plain)
        # Then the patched code.  torch.compile's caches are dropped first: a graph compiled from the
        # library's code must not stand in for the patched one.
        torch._dynamo.reset()
        kernels.install()
        got = run(model)()
        fused = {"patched": run(model), "patched_compiled": run(torch.compile(model))}
        graphs.update({name: graph_replay(fn) for name, fn in fused.items()})
        launches.update(time_launches_us(fused))
        kernels.uninstall()
        times = medians_in_turn(graphs, 15)  # the replays, sampled in turn
        reference = run(model.float())().float()
    return {
        "patched_functions": patched,
        "graph_us": times,
        "launch_us": launches,
        "patched_vs_eager_max_abs": (got.float() - want.float()).abs().max().item(),
        "eager_vs_fp32_max_abs": (want.float() - reference).abs().max().item(),
        "patched_vs_fp32_max_abs": (got.float() - reference).abs().max().item(),
        "output_max_abs": reference.abs().max().item(),
    }


def markdown(results: dict) -> str:
    m = results["model"]
    g, launch = m["graph_us"], m["launch_us"]
    lines = [
        f"Device: {results['device']}; torch {results['torch']}, triton {results['triton']}, "
        f"transformers {results['transformers']}",
        f"Measured with: {provenance_line(results['provenance'])}",
        "",
        f"LlamaModel, {results['layers']} layers, hidden 4096, sequence {results['seq']}, bf16; "
        f"applied {', '.join(results['apply']['applied'])}; patched: {', '.join(m['patched_functions'])}",
        "",
        "| forward | CUDA graph µs | vs eager | vs compile default | launch µs |",
        "|---|---|---|---|---|",
    ]
    for name, us in g.items():
        lines.append(
            f"| {name} | {us:.1f} | {g['eager'] / us:.3f}× | {g['compile_default'] / us:.3f}× | {launch[name]:.1f} |"
        )
    lines += [
        "",
        f"Numerics (max |difference|, output max {m['output_max_abs']:.3g}): patched vs eager bf16 "
        f"{m['patched_vs_eager_max_abs']:.3g}; eager bf16 vs fp32 {m['eager_vs_fp32_max_abs']:.3g}; "
        f"patched bf16 vs fp32 {m['patched_vs_fp32_max_abs']:.3g}",
        "",
        "| cluster | ops | status | × | eager µs | compile µs | fused µs | vs eager | vs compile | % of copy bandwidth |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in results["clusters"]:

        def f(key, digits=1, c=c):
            value = c.get(key)
            return "—" if value is None else f"{value:.{digits}f}"

        lines.append(
            f"| {c['cluster']} | {c['ops']} | {c['status']} | {c['instances']} | {f('eager_us')} | "
            f"{f('compiled_us')} | {f('fused_us')} | {f('speedup_vs_eager', 2)}× | {f('speedup_vs_compiled', 2)}× | "
            f"{f('pct_of_peak', 0)}% |"
        )
    skipped = results["apply"]["skipped"]
    if skipped:
        lines += ["", "Not applied:", *[f"- {s}" for s in skipped]]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    import torch
    import transformers
    import triton

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    folder = tempfile.mkdtemp(prefix="fuselens-llama-")
    path = write_user_file(folder, args.layers, args.seq)
    results = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "transformers": transformers.__version__,
        "provenance": provenance(),
        "layers": args.layers,
        "seq": args.seq,
        # The clusters are timed before the file is changed: once it installs the patch, an analysis of
        # it sees the kernels, not the library's ops.
        "clusters": cluster_timings(path),
        "apply": apply(path),
    }
    results["model"] = whole_model(folder, args.seq)
    text = markdown(results)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1)
    with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as fh:
        fh.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
