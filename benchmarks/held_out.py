"""The held-out GPU suite: transformers models the kernels were never tuned on, at sizes that stream from DRAM.

    python benchmarks/held_out.py [--only llama ...] [--out DIR]

`benchmarks/gpu.py` times the shipped examples, the suite the kernel heuristics were tuned against.
This one times what a user imports: each case is a model file written as a user writes it (a
transformers configuration at a realistic width, a few layers, random init; nothing downloaded),
analyzed and validated by `fuselens validate` machinery in bf16 in a process of its own.  Each cluster
is checked against eager, then timed by CUDA-graph replay against eager and torch.compile in two modes,
"default" and "max-autotune-no-cudagraphs" (static shapes, a fresh compile per cluster), sampled in
turn.  "vs better compile" divides the faster of the two modes by the fused kernel's time.  Writes
results.json and results.md to --out; docs/benchmarks.md holds the latest table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from gpu import cluster_row, run_child  # noqa: E402  (beside this script: the tuning suite's)
from provenance import line as provenance_line  # noqa: E402
from provenance import provenance  # noqa: E402

OTHER_MODE = "max-autotune-no-cudagraphs"


@dataclass(frozen=True)
class HeldOut:
    architecture: str
    config: str  # the configuration, in words, for the table
    source: str  # the user's file: a module-level `model`
    # (shape, dtype, high) of each input; an integer input's values are drawn from [0, high), token
    # ids over the whole vocabulary as in a real batch (None: floats, masks).
    inputs: tuple[tuple[tuple[int, ...], str, int | None], ...]


_DECODER_INPUT = (((4, 2048), "int64", 32000),)

CASES: dict[str, HeldOut] = {
    "llama": HeldOut(
        "Llama",
        "hidden 2048, intermediate 5632, 2 layers, 16 heads (4 kv); input (4, 2048)",
        """
        from transformers import LlamaConfig, LlamaModel

        config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=2, num_attention_heads=16,
                             num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096)
        model = LlamaModel(config)
        """,
        _DECODER_INPUT,
    ),
    "qwen2": HeldOut(
        "Qwen2",
        "hidden 1536, intermediate 8960, 2 layers, 12 heads (2 kv), q/k/v bias; input (4, 2048)",
        """
        from transformers import Qwen2Config, Qwen2Model

        config = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=2, num_attention_heads=12,
                             num_key_value_heads=2, vocab_size=32000, max_position_embeddings=4096)
        model = Qwen2Model(config)
        """,
        _DECODER_INPUT,
    ),
    "gemma": HeldOut(
        "Gemma",
        "hidden 2048, intermediate 16384, 2 layers, 8 heads (1 kv), head 256, GeGLU; input (2, 2048)",
        """
        from transformers import GemmaConfig, GemmaModel

        config = GemmaConfig(hidden_size=2048, intermediate_size=16384, num_hidden_layers=2, num_attention_heads=8,
                             num_key_value_heads=1, head_dim=256, vocab_size=32000, max_position_embeddings=4096)
        model = GemmaModel(config)
        """,
        (((2, 2048), "int64", 32000),),
    ),
    "phi3": HeldOut(
        "Phi-3",
        "hidden 3072, intermediate 8192, 2 layers, 32 heads, fused qkv and gate/up; input (2, 2048)",
        """
        from transformers import Phi3Config, Phi3Model

        config = Phi3Config(hidden_size=3072, intermediate_size=8192, num_hidden_layers=2, num_attention_heads=32,
                            num_key_value_heads=32, vocab_size=32064, max_position_embeddings=4096,
                            pad_token_id=0)
        model = Phi3Model(config)
        """,
        (((2, 2048), "int64", 32064),),
    ),
    "bert": HeldOut(
        "BERT",
        "BERT-base: hidden 768, intermediate 3072, 2 layers, 12 heads; ids (32, 512) + attention mask",
        """
        from transformers import BertConfig, BertModel

        config = BertConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=2, num_attention_heads=12)
        model = BertModel(config)
        """,
        (((32, 512), "int64", 30522), ((32, 512), "bool", None)),
    ),
    "vit": HeldOut(
        "ViT",
        "ViT-B/16: image 224, hidden 768, intermediate 3072, 2 layers, 12 heads; input (64, 3, 224, 224)",
        """
        from transformers import ViTConfig, ViTModel

        config = ViTConfig(image_size=224, patch_size=16, hidden_size=768, intermediate_size=3072,
                           num_hidden_layers=2, num_attention_heads=12)
        model = ViTModel(config)
        """,
        (((64, 3, 224, 224), "bfloat16", None),),
    ),
    "convnext": HeldOut(
        "ConvNeXt",
        "ConvNeXt-T widths [96, 192, 384, 768], one block a stage; input (32, 3, 224, 224)",
        """
        from transformers import ConvNextConfig, ConvNextModel

        config = ConvNextConfig(hidden_sizes=[96, 192, 384, 768], depths=[1, 1, 1, 1])
        model = ConvNextModel(config)
        """,
        (((32, 3, 224, 224), "bfloat16", None),),
    ),
    "whisper-encoder": HeldOut(
        "Whisper encoder",
        "Whisper-small widths: d_model 768, ffn 3072, 2 layers, 12 heads, 80 mel bins; input (8, 80, 3000)",
        """
        from transformers import WhisperConfig, WhisperModel

        config = WhisperConfig(d_model=768, encoder_layers=2, encoder_attention_heads=12, encoder_ffn_dim=3072,
                               decoder_layers=1, decoder_attention_heads=12, decoder_ffn_dim=3072, num_mel_bins=80,
                               max_source_positions=1500)
        model = WhisperModel(config).get_encoder()
        """,
        (((8, 80, 3000), "bfloat16", None),),
    ),
}


def settings_of(case: HeldOut) -> dict:
    """The case's model settings, as a pyproject table would give them."""
    inputs = [{"shape": list(s), "dtype": d} | ({"high": high} if high else {}) for s, d, high in case.inputs]
    return {"inputs": inputs, "param_dtype": "bfloat16"}


def case_file(case_id: str) -> str:
    """The case's model file, written as a user's, in a folder of its own."""
    folder = tempfile.mkdtemp(prefix="fuselens-held-out-")
    path = os.path.join(folder, f"{case_id.replace('-', '_')}.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(textwrap.dedent(CASES[case_id].source).lstrip("\n"))
    return path


def run_case(case_id: str, peak_gbps: float | None) -> list[dict]:
    from fuselens.contracts.config import model_settings
    from fuselens.contracts.options import AnalyzeOptions, ValidateOptions
    from fuselens.pipeline.validate import validate_file

    path, config = case_file(case_id), settings_of(CASES[case_id])
    report = validate_file(
        path,
        AnalyzeOptions(models={"model": model_settings(config, "the benchmark")}),
        ValidateOptions(benchmark=True, peak_gbps=peak_gbps, other_compile_modes=[OTHER_MODE]),
    )
    rows: list[dict] = [{"case": case_id, "error": problem} for problem in report.problems]
    for model in report.models:
        rows += [{"case": case_id} | cluster_row(c) for c in model.clusters]
    return rows


def _f(value, digits=1, suffix=""):
    return "—" if value is None else f"{value:.{digits}f}{suffix}"


def better_compile_us(row: dict) -> float | None:
    """The faster torch.compile mode's time for a row, or None when it was not timed."""
    times = [t for t in (row.get("compiled_us"), (row.get("compiled_modes_us") or {}).get(OTHER_MODE)) if t]
    return min(times) if times else None


def markdown(rows: list[dict], device: str, measured_with: str) -> str:
    head = (
        "| model | cluster | ops | regime | instances | fused bytes | eager µs | torch.compile (default) µs "
        f"| torch.compile ({OTHER_MODE}) µs | fused µs | GB/s | % peak | vs eager | vs better compile |"
    )
    lines = [f"Device: {device}; {measured_with}", "", head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if "error" in r:
            continue
        mb = f"{r['bytes_fused'] / 2**20:.1f} MB" if r.get("bytes_fused") else "—"
        best = better_compile_us(r)
        vs_best = best / r["fused_us"] if best and r.get("fused_us") else None
        lines.append(
            f"| {CASES[r['case']].architecture} | {r['cluster']} | {r['ops']} | {r.get('regime') or '—'} | "
            f"{r.get('instances', '—')} | {mb} | {_f(r.get('eager_us'))} | {_f(r.get('compiled_us'))} | "
            f"{_f((r.get('compiled_modes_us') or {}).get(OTHER_MODE))} | {_f(r.get('fused_us'))} | "
            f"{_f(r.get('achieved_gbps'), 0)} | {_f(r.get('pct_of_peak'), 0, '%')} | "
            f"{_f(r.get('speedup_vs_eager'), 2, '×')} | {_f(vs_best, 2, '×')} |"
        )
    for r in rows:
        if "error" in r or r.get("status") not in ("verified", None):
            lines.append(
                f"\n- {r['case']} {r.get('cluster', '')}: {r.get('error') or r.get('status')} {r.get('message', '')}"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=list(CASES), help="case(s) to run (default: all)")
    parser.add_argument("--peak-gbps", type=float)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--budget-s", type=float, default=0, help="start no case after this many seconds")
    args = parser.parse_args()
    cases = args.only or list(CASES)
    if len(cases) > 1:
        return _each_in_its_own_process(args, cases)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: the GPU benchmark needs one (see `fuselens validate --interpret` for CPU checks)")
        return 1
    started = time.perf_counter()
    try:
        rows = run_case(cases[0], args.peak_gbps)
    except Exception as exc:  # a case that fails is a row of the table, not a lost run
        rows = [{"case": cases[0], "error": f"{type(exc).__name__}: {exc}"}]
    print(f"{cases[0]}: {len(rows)} rows in {time.perf_counter() - started:.0f} s", flush=True)
    _write(args.out, {"device": torch.cuda.get_device_name(), "provenance": provenance(), "rows": rows})
    return 0


def _write(out: str, results: dict) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1, default=str)
    measured = results.get("provenance")  # none when no case ran (no CUDA device, every child failed)
    table = markdown(results["rows"], results.get("device", "?"), provenance_line(measured) if measured else "")
    with open(os.path.join(out, "results.md"), "w", encoding="utf-8") as fh:
        fh.write(table)
    print(table, flush=True)


def _each_in_its_own_process(args, cases: list[str]) -> int:
    """One child process per case, each starting with an empty GPU and its own compile caches."""
    begun = time.perf_counter()
    merged: dict = {"rows": []}
    for case_id in cases:
        if args.budget_s and time.perf_counter() - begun > args.budget_s:
            print(f"time budget spent: skipping {case_id}", flush=True)
            continue
        command = [sys.executable, os.path.abspath(__file__), "--only", case_id]
        if args.peak_gbps:
            command.append(f"--peak-gbps={args.peak_gbps}")
        code, part = run_child(command)
        if part is None:
            part = {"rows": [{"case": case_id, "error": f"the benchmark process exited with {code}"}]}
        merged.update({k: v for k, v in part.items() if k != "rows"})
        merged["rows"] += part["rows"]
        _write(args.out, merged)  # after every case: a cut run keeps what it measured
    return 0


if __name__ == "__main__":
    sys.exit(main())
