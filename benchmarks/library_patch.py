"""A library model, patched by `fuselens apply`, against eager and torch.compile on one GPU.

    python benchmarks/library_patch.py --model qwen3 [--layers 2] [--seq 2048] [--out DIR]
    python benchmarks/library_patch.py --model unet-block [--batch 8] [--size 64] [--out DIR]
    python benchmarks/library_patch.py --model llama

Each model is written as a user's file (bf16 weights; inputs in `pyproject.toml`), nothing downloaded:

- `llama`: transformers `LlamaModel`, hidden 4096, intermediate 11008, 32 heads, no KV cache;
- `qwen3`: transformers `Qwen3Model` at Qwen3-8B's widths (hidden 4096, intermediate 12288, 32 heads,
  8 kv heads, head 128), whose RMSNorm runs on the hidden states (rank 3) and on each head of q and k
  (rank 4): one library function, kernels of two ranks;
- `unet-block`: diffusers `DownBlock2D` at Stable Diffusion's first level (320 channels, time embedding
  1280, two `ResnetBlock2D`s, no downsampling), on 64×64 latents.

The script runs `fuselens apply` on it (the kernels go into the library's own functions through the
patch `install()` puts in place), then on one CUDA device and in one process:

- whole-model time, CUDA-graph replay (the replays sampled in turn) and host-inclusive launch:
  eager; torch.compile (mode "default"); torch.compile (mode "max-autotune-no-cudagraphs"); the
  patched model; the patched model under torch.compile (default, compiled after `install()`);
- how many kernel launches the patched forward made, kernel by kernel (each `fits` that said no runs
  the library's lines instead: a kernel that never ran is listed);
- the patched model's numerics: its largest difference from eager bf16, and both against the same
  model in fp32;
- each cluster's kernel against eager and torch.compile of the same ops (`fuselens validate
  --benchmark` machinery: CUDA-graph median, % of the measured copy bandwidth).

Prints a markdown table and writes results.json and results.md to --out.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import sys
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from provenance import line as provenance_line
from provenance import provenance


@dataclass(frozen=True)
class Subject:
    """A model as a user's file writes it, and how the benchmark calls it."""

    name: str  # the user's file, without .py
    title: str  # the table's heading
    source: str  # the user's file, formatted with the arguments
    pyproject: str
    library: str  # the package the patch goes into

    def write(self, folder: str, **sizes: int) -> str:
        path = os.path.join(folder, f"{self.name}.py")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(textwrap.dedent(self.source.format(**sizes)).lstrip())
        with open(os.path.join(folder, "pyproject.toml"), "w", encoding="utf-8") as fh:
            fh.write(textwrap.dedent(self.pyproject.format(**sizes)).lstrip())
        return path


_DECODER_INPUTS = """
[tool.fuselens.models.model]
inputs = [{{ shape = [1, {seq}], dtype = "int64", high = 32000 }}]
param_dtype = "bfloat16"
"""

SUBJECTS = {
    "llama": Subject(
        "llama_stack",
        "LlamaModel, {layers} layers, hidden 4096, sequence {seq}, bf16",
        """
        from transformers import LlamaConfig, LlamaModel

        config = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers={layers},
                             num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                             max_position_embeddings=4096, use_cache=False)
        model = LlamaModel(config)
        """,
        _DECODER_INPUTS,
        "transformers",
    ),
    "qwen3": Subject(
        "qwen3_stack",
        "Qwen3Model, {layers} layers, hidden 4096, 32 heads (8 kv) of 128, sequence {seq}, bf16",
        """
        from transformers import Qwen3Config, Qwen3Model

        config = Qwen3Config(hidden_size=4096, intermediate_size=12288, num_hidden_layers={layers},
                             num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=32000,
                             max_position_embeddings=4096, use_cache=False)
        model = Qwen3Model(config)
        """,
        _DECODER_INPUTS,
        "transformers",
    ),
    "unet-block": Subject(
        "unet_block",
        "diffusers DownBlock2D, 320 channels, 2 ResnetBlock2D, batch {batch}, {size}×{size}, bf16",
        """
        from diffusers.models.unets.unet_2d_blocks import DownBlock2D

        model = DownBlock2D(in_channels=320, out_channels=320, temb_channels=1280, num_layers=2,
                            resnet_groups=32, add_downsample=False)
        """,
        """
        [tool.fuselens.models.model]
        inputs = [[{batch}, 320, {size}, {size}], [{batch}, 1280]]
        dtype = "bfloat16"
        param_dtype = "bfloat16"
        """,
        "diffusers",
    ),
}


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


def _inputs(name: str, args):
    import torch

    if name == "unet-block":
        x = torch.randn(args.batch, 320, args.size, args.size, device="cuda", dtype=torch.bfloat16)
        temb = torch.randn(args.batch, 1280, device="cuda", dtype=torch.bfloat16)

        # The inputs follow the model's dtype, so that the float32 reference runs in float32 throughout.
        def run(m):
            dtype = next(m.parameters()).dtype
            return m(x.to(dtype), temb.to(dtype))[0]

        return run
    ids = torch.randint(0, 32000, (1, args.seq), device="cuda")
    return lambda m: m(input_ids=ids).last_hidden_state


def _watched(kernels) -> tuple[dict[str, int], Callable[[], None]]:
    """Launches of each kernel of the loaded module, counted as its public function runs it, and
    the function that stops counting (a counter torch.compile traced would guard on its value)."""
    launches: dict[str, int] = {}
    originals = {}
    for name in [n for n, f in vars(kernels).items() if callable(getattr(f, "fits", None))]:
        call = originals[name] = getattr(kernels, f"_{name}_call")

        def counted(*args, _call=call, _name=name):
            launches[_name] = launches.get(_name, 0) + 1
            return _call(*args)

        setattr(kernels, f"_{name}_call", counted)

    def stop() -> None:
        for name, call in originals.items():
            setattr(kernels, f"_{name}_call", call)

    return launches, stop


def whole_model(subject: Subject, folder: str, args) -> dict:
    import torch

    from fuselens.validate.gpu import graph_replay, medians_in_turn, time_launches_us

    sys.path.insert(0, folder)
    user = importlib.import_module(subject.name)  # its first lines install the patch
    kernels = importlib.import_module(f"{subject.name}_kernels")
    patched = kernels.install()
    kernels.uninstall()
    model = user.model.to("cuda", torch.bfloat16).eval()
    forward = _inputs(args.model, args)
    run = functools.partial(functools.partial, forward)

    with torch.no_grad():
        # The library's own code first: eager and both torch.compile modes, captured into CUDA graphs.
        want = forward(model)
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
        counts, stop_counting = _watched(kernels)
        got = forward(model)
        ran = dict(counts)
        stop_counting()
        fused = {"patched": run(model), "patched_compiled": run(torch.compile(model))}
        graphs.update({name: graph_replay(fn) for name, fn in fused.items()})
        launches.update(time_launches_us(fused))
        kernels.uninstall()
        times = medians_in_turn(graphs, 15)  # the replays, sampled in turn
        reference = forward(model.float()).float()
    return {
        "patched_functions": patched,
        "kernel_launches": ran,
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
    best = min(g["compile_default"], g["compile_max_autotune_no_cudagraphs"])
    lines = [
        f"Device: {results['device']}; torch {results['torch']}, triton {results['triton']}, "
        f"{results['library']} {results['library_version']}",
        f"Measured with: {provenance_line(results['provenance'])}",
        "",
        f"{results['title']}; applied {', '.join(results['apply']['applied'])}; patched: "
        f"{', '.join(m['patched_functions'])}",
        "",
        "| forward | CUDA graph µs | vs eager | vs compile default | vs better compile mode | launch µs |",
        "|---|---|---|---|---|---|",
    ]
    for name, us in g.items():
        lines.append(
            f"| {name} | {us:.1f} | {g['eager'] / us:.3f}× | {g['compile_default'] / us:.3f}× | {best / us:.3f}× "
            f"| {launch[name]:.1f} |"
        )
    ran = ", ".join(f"{k} ×{n}" for k, n in sorted(m["kernel_launches"].items())) or "none"
    lines += [
        "",
        f"Kernel launches in one patched forward: {ran}",
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
    parser.add_argument("--model", choices=sorted(SUBJECTS), default="llama")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--no-clusters", action="store_true", help="skip timing each cluster's kernel (faster)")
    args = parser.parse_args()
    import torch
    import triton

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    subject = SUBJECTS[args.model]
    library = importlib.import_module(subject.library)
    sizes = {"layers": args.layers, "seq": args.seq, "batch": args.batch, "size": args.size}
    folder = tempfile.mkdtemp(prefix=f"fuselens-{subject.name}-")
    path = subject.write(folder, **sizes)
    results = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "library": subject.library,
        "library_version": library.__version__,
        "provenance": provenance(),
        "title": subject.title.format(**sizes),
        # The clusters are timed before the file is changed: once it installs the patch, an analysis of
        # it sees the kernels, not the library's ops.
        "clusters": [] if args.no_clusters else cluster_timings(path),
        "apply": apply(path),
    }
    results["model"] = whole_model(subject, folder, args)
    text = markdown(results)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    stem = args.model.replace("-", "_")
    with open(os.path.join(args.out, f"{stem}.json"), "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1)
    with open(os.path.join(args.out, f"{stem}.md"), "w", encoding="utf-8") as fh:
        fh.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
