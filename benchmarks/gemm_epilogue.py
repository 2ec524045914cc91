"""GEMM + epilogue clusters at LLM sizes: the fused GEMM against the library's GEMM with our
elementwise kernel after it, eager, and torch.compile, on one CUDA device, in one process.

    python benchmarks/gemm_epilogue.py [--tokens 16384 --tokens 2048] [--out DIR]
    python benchmarks/gemm_epilogue.py --cpu-check      # no GPU: the same steps, small, in the interpreter

For each model of examples/gemm_epilogues.py (a bias + GELU MLP, a transposed-weight projection
scaled, biased and clamped, a layer-scaled residual projection), at each token count, in bf16: the
file is analyzed at that size, its kernel module generated and imported, the model traced on real
random inputs, and each GEMM cluster's recorded inputs fed to

- eager (the cluster's own calls replayed), torch.compile "default" and "max-autotune-no-cudagraphs"
  (static shapes, compiled before timing);
- the library's GEMM then our elementwise kernel (`_cN_library`), the fused kernel alone
  (`_cN_fused`, its tile tuned for the shape), cuBLASLt's GEMM with its own epilogue where the module
  offers it (`_cN_cublaslt`);
- the public function `cN`, which runs whichever of those it timed fastest the first time it saw the
  shape: what the fusion offers.

All are timed by CUDA-graph replay, sampled in turn (`validate/gpu.py`).  The table gives each, and
the offered path against the better of the two compile modes; `target` says whether the offered path
reaches 1.05x of it where the fused kernel is offered, and `never slower` whether the public function
offers the fused kernel only where it beat the library's path.  Every output is compared with eager
first.  results.json and results.md go to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "gemm_epilogues.py")

# model -> (constructor kwargs at LLM sizes, the feature size of each input after the tokens)
MODELS: dict[str, tuple[dict[str, int], list[int]]] = {
    "GeluMLP": ({"dim": 4096, "hidden": 11008}, [4096]),
    "ClampedLogits": ({"dim": 4096, "vocab": 16384}, [4096]),
    "LayerScaleResidual": ({"dim": 4096, "hidden": 11008}, [4096, 11008]),
}
# The same, small and of sizes no tile divides, for the check on a CPU in the Triton interpreter.
CPU_MODELS: dict[str, tuple[dict[str, int], list[int]]] = {
    "GeluMLP": ({"dim": 37, "hidden": 53}, [37]),
    "ClampedLogits": ({"dim": 37, "vocab": 29}, [37]),
    "LayerScaleResidual": ({"dim": 37, "hidden": 53}, [37, 53]),
}
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
TARGET = 1.05  # the offered path against the better compile mode, where the fused kernel is offered


def settings(models: dict[str, tuple[dict[str, int], list[int]]], tokens: int, dtype: str) -> dict[str, dict]:
    """Each model's analysis settings: its inputs as (batch, sequence, features), `tokens` in all."""
    batch, sequence = (tokens // 4096, 4096) if tokens >= 4096 and tokens % 4096 == 0 else (1, tokens)
    return {
        name: {
            "inputs": [{"shape": [batch, sequence, f], "dtype": dtype} for f in features],
            "init": init,
            "param_dtype": dtype,
        }
        for name, (init, features) in models.items()
    }


def measure(tokens: int, dtype: str, cpu: bool, seed: int = 0) -> list[dict[str, Any]]:
    """One row per GEMM cluster of the example at `tokens` tokens: its outputs checked against eager,
    then (on CUDA) every way of running it timed."""
    from fuselens.analysis import loader
    from fuselens.contracts.config import model_settings
    from fuselens.contracts.options import AnalyzeOptions
    from fuselens.pipeline.analyze import analyze
    from fuselens.validate import runner

    models = CPU_MODELS if cpu else MODELS
    config = settings(models, tokens, dtype)
    options = AnalyzeOptions(models={n: model_settings(c, "the benchmark") for n, c in config.items()})
    analyzed = analyze(EXAMPLE, options)
    device = "cpu" if cpu else "cuda"
    rows = []
    with tempfile.TemporaryDirectory(prefix="fuselens-gemm-bench-") as tmp:
        kernels = runner.load_kernel_module(analyzed.report, os.path.join(tmp, "gemm_epilogues_kernels.py"))
        for model in analyzed.report.models:
            if model.name not in models or model.status != "analyzed":
                continue
            subject = runner.Subject(analyzed.sources[model.name], analyzed.configs[model.name].init, dtype)
            real = subject.real(seed, analyzed.user_code).to(device)
            specs = analyzed.configs[model.name].inputs
            inputs = loader.random_inputs(specs, device, seed)
            names = runner.input_names(model)
            instances = runner.traced_instances(model, real, inputs, names, analyzed.user_code)
            for cluster in model.clusters:
                found = instances.get(cluster.id)
                if cluster.kind != "gemm-epilogue" or not found or cluster.kernel is None:
                    continue
                row = {"tokens": tokens, "dtype": dtype, "model": model.name, "cluster": cluster.id}
                row |= {"ops": cluster.op_chain, "shapes": [i.shape for i in cluster.inputs]}
                row |= {"bytes_unfused": cluster.bytes_unfused, "bytes_fused": cluster.bytes_fused}
                row |= run_cluster(kernels, cluster.kernel.name, found[0], cpu)
                rows.append(row)
                print(f"{model.name} {cluster.id} ({cluster.op_chain}) at {tokens} tokens: {_summary(row)}", flush=True)
            del real, inputs, instances
            if not cpu:
                import torch

                torch.cuda.empty_cache()
    return rows


def run_cluster(kernels: Any, name: str, instance: Any, cpu: bool) -> dict[str, Any]:
    """The cluster's ways of running, each checked against eager; on CUDA, each timed."""
    import torch

    from fuselens.analysis.graph import plain
    from fuselens.validate.numerics import compare
    from fuselens.validate.replay import cluster_function

    graph, plan, values = instance
    args = [values[s.node] for s in plan.inputs]
    numbers = [plain(s.value) for s in plan.scalars]
    runtime = [plain(s.value) for s in plan.scalars if s.runtime]
    eager = cluster_function(graph, plan, values)
    calls = {
        "library": lambda: getattr(kernels, f"_{name}_library")(*args, *numbers),
        "fused": lambda: getattr(kernels, f"_{name}_fused")(*args, *runtime),
        "offered": lambda: getattr(kernels, name)(*args),
    }
    if hasattr(kernels, f"_{name}_cublaslt"):
        calls["cublaslt"] = lambda: getattr(kernels, f"_{name}_cublaslt")(*args)
    row: dict[str, Any] = {}
    with torch.no_grad():
        want = eager(*args)
        precision = want.dtype if isinstance(want, torch.Tensor) else want[0].dtype
        for way, call in calls.items():
            got = call()
            cmp = compare(got if isinstance(got, torch.Tensor) else got[0], want, precision)
            row[f"{way}_ok"] = cmp.ok
            row[f"{way}_max_abs"] = cmp.max_abs
        row["offered_path"] = offered_path(kernels, name, plan, args)
        if cpu:
            return row
        row |= time_ways(eager, calls, args)
    return row | verdict(row)


def offered_path(kernels: Any, name: str, plan: Any, args: list) -> str:
    """What the public function runs at this shape (its choice, kept after its first call)."""
    from fuselens.codegen.gemm_launcher import gemm_form_name

    gemm = plan.gemm
    a, b = (args[k] for k in gemm.operands[:2])
    key = ("path", *kernels._gemm_key(name, gemm_form_name(gemm), a, b))
    chosen = kernels._GEMM_CHOSEN.get(repr(key))
    return chosen or ("fused" if os.environ.get("TRITON_INTERPRET") == "1" else "library")


def time_ways(eager: Any, calls: dict[str, Any], args: list) -> dict[str, float]:
    """Median µs of every way, torch.compile's modes compiled first, by CUDA-graph replay in turn."""
    from fuselens.validate.gpu import compiled, time_graphs_us

    timed = {"eager": lambda: eager(*args)}
    modes = {mode: compiled(eager, mode) for mode in COMPILE_MODES}  # each resets dynamo: all made first
    for mode, fn in modes.items():
        fn(*args)  # compiled (and autotuned) outside the timed region
        timed[f"compile {mode}"] = lambda fn=fn: fn(*args)
    timed |= calls
    return {f"{way}_us": round(us, 2) for way, us in time_graphs_us(timed, repeats=9).items()}


def verdict(row: dict[str, Any]) -> dict[str, Any]:
    """The ratios the table prints, and whether the offered path meets the targets."""
    best_compile = min(row[f"compile {m}_us"] for m in COMPILE_MODES)
    offered = row["offered_us"]
    out: dict[str, Any] = {
        "best_compile_us": best_compile,
        "offered_vs_best_compile": round(best_compile / offered, 3),
        "fused_vs_library": round(row["library_us"] / row["fused_us"], 3),
        "fused_vs_best_compile": round(best_compile / row["fused_us"], 3),
    }
    fused_offered = row["offered_path"] == "fused"
    out["target_met"] = out["offered_vs_best_compile"] >= TARGET if fused_offered else None
    out["never_slower"] = not fused_offered or row["fused_us"] < row["library_us"]
    return out


def markdown(rows: list[dict[str, Any]], device: str, versions: dict[str, str]) -> str:
    ways = ["eager", *(f"compile {m}" for m in COMPILE_MODES), "library", "fused", "cublaslt", "offered"]
    head = (
        "| model | tokens | ops | "
        + " | ".join(f"{w} µs" for w in ways)
        + " | offers | offered vs better compile | fused vs library | target 1.05× | never slower |"
    )
    lines = [f"Device: {device}; " + ", ".join(f"{k} {v}" for k, v in versions.items()), "", head]
    lines.append("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        cells = [_f(r.get(f"{w}_us")) for w in ways]
        lines.append(
            f"| {r['model']} | {r['tokens']} | {r['ops']} | "
            + " | ".join(cells)
            + f" | {r['offered_path']} | {_f(r.get('offered_vs_best_compile'), 2, '×')} | "
            f"{_f(r.get('fused_vs_library'), 2, '×')} | {_yes(r.get('target_met'))} | {_yes(r.get('never_slower'))} |"
        )
    wrong = [r for r in rows if not all(r.get(f"{w}_ok", True) for w in ("library", "fused", "cublaslt", "offered"))]
    lines += [f"\n- {r['model']} at {r['tokens']} tokens: an output differs from eager: {r}" for r in wrong]
    return "\n".join(lines) + "\n"


def _summary(row: dict[str, Any]) -> str:
    checked = ", ".join(f"{w} {'ok' if row[f'{w}_ok'] else 'DIFFERS'}" for w in ("library", "fused", "offered"))
    if "offered_us" not in row:
        return f"{checked}; offers {row['offered_path']}"
    return (
        f"{checked}; offers {row['offered_path']} at {row['offered_us']:.1f} µs, "
        f"{row['offered_vs_best_compile']:.3f}× the better torch.compile ({row['best_compile_us']:.1f} µs); "
        f"fused {row['fused_us']:.1f} µs, library {row['library_us']:.1f} µs"
    )


def _f(value, digits: int = 1, suffix: str = "") -> str:
    return "—" if value is None else f"{value:.{digits}f}{suffix}"


def _yes(value) -> str:
    return "—" if value is None else ("yes" if value else "NO")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, action="append", help="tokens a batch holds (default: 16384, 2048)")
    parser.add_argument(
        "--cpu-check", action="store_true", help="small sizes, numerics only, in the Triton interpreter"
    )
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    if args.cpu_check:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    import torch

    cpu = args.cpu_check
    if not cpu and not torch.cuda.is_available():
        print("no CUDA device: the benchmark needs one (--cpu-check runs its steps small, in the interpreter)")
        return 1
    import triton

    versions = {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0]}
    device = "cpu (Triton interpreter)" if cpu else torch.cuda.get_device_name()
    print(f"{device}; {versions}", flush=True)
    tokens = [14] if cpu else args.tokens or [16384, 2048]
    rows = []
    begun = time.perf_counter()
    for count in tokens:
        rows += measure(count, "bfloat16", cpu)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as fh:
        json.dump({"device": device, "versions": versions, "rows": rows}, fh, indent=1, default=str)
    table = markdown(rows, device, versions)
    with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as fh:
        fh.write(table)
    print(table)
    print(f"{len(rows)} clusters in {time.perf_counter() - begun:.0f} s", flush=True)
    numerics = all(r[f"{w}_ok"] for r in rows for w in ("library", "fused", "offered"))
    fair = all(r.get("never_slower", True) for r in rows)
    return 0 if rows and numerics and fair else 1


if __name__ == "__main__":
    sys.exit(main())
