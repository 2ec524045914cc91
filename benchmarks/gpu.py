"""The GPU benchmark suite: every cluster of every example, at three sizes, in fp32 and bf16.

    python benchmarks/gpu.py [--only example_net.py ...] [--dtype float32 ...] [--out DIR]

For each example, three input sizes chosen to land its clusters in each regime
(launch-bound, L2-resident, DRAM-bound on an H200), each validated and timed by
`fuselens validate` machinery: numerics against eager, then CUDA-graph GPU time of eager,
torch.compile (static shapes, a fresh compile per shape) and the generated kernel, plus
host-inclusive launch times.  Each example runs in a process of its own.  Writes
results.json and results.md (a markdown table) to --out; docs/benchmarks.md holds the
latest table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from provenance import line as provenance_line  # noqa: E402  (beside this script)
from provenance import provenance  # noqa: E402

EXAMPLES = os.path.join(ROOT, "examples")

# example -> (class, {size label: (input shapes, constructor kwargs)})
SUITE = {
    "example_net.py": (
        "ExampleNet",
        {
            "launch": ([[256, 1024]], {}),
            "l2": ([[4096, 1024]], {}),
            "dram": ([[65536, 4096]], {"width": 4096, "hidden": 4096}),
        },
    ),
    "branchy.py": (
        "GatedNet",
        {
            "launch": ([[256, 1024]], {}),
            "l2": ([[4096, 1024]], {}),
            "dram": ([[65536, 4096]], {"width": 4096}),
        },
    ),
    "llama_block.py": (
        "LlamaBlock",
        {
            "launch": ([[1, 64, 1024]], {}),
            "l2": ([[2, 512, 1024]], {}),
            "dram": ([[4, 2048, 4096]], {"dim": 4096, "n_heads": 32, "hidden": 11008, "max_len": 2048}),
        },
    ),
    "conv_block.py": (
        "ResBlock",
        {
            "launch": ([[1, 128, 16, 16], [1, 512]], {}),
            "l2": ([[8, 128, 32, 32], [8, 512]], {}),
            "dram": ([[32, 256, 64, 64], [32, 512]], {"channels": 256}),
        },
    ),
    "gpt.py": (
        "GPT",
        {
            "launch": ([[1, 64]], {"n_layers": 2, "vocab": 50304}),
            "l2": ([[4, 256]], {"n_layers": 2, "vocab": 50304}),
            "dram": ([[16, 2048]], {"n_layers": 2, "max_len": 2048, "vocab": 50304}),
        },
    ),
}


def suite_case(example: str, size: str, dtype: str) -> tuple[str, list, dict]:
    """(the model class, its input specs, its analysis settings) for `example` at `size` in `dtype`."""
    from fuselens.contracts.config import InputSpec

    cls, sizes = SUITE[example]
    shapes, init = sizes[size]
    int_inputs = example == "gpt.py"
    in_dtype = "int64" if int_inputs else dtype
    # Token ids span the vocabulary, as a real batch's do: ids from a few rows would read the table from L2.
    high = init.get("vocab") if int_inputs else None
    specs = [InputSpec(list(s), in_dtype, high=high) for s in shapes]
    inputs = [{"shape": s.shape, "dtype": s.dtype} | ({"high": high} if high else {}) for s in specs]
    return cls, specs, {"inputs": inputs, "init": init, "param_dtype": dtype}


def run_case(
    example: str, size: str, dtype: str, peak_gbps: float | None, other_modes: list[str] | None = None
) -> list[dict]:
    from fuselens.contracts.config import model_settings
    from fuselens.contracts.options import AnalyzeOptions, ValidateOptions
    from fuselens.pipeline.validate import validate_file

    cls, specs, config = suite_case(example, size, dtype)
    report = validate_file(
        os.path.join(EXAMPLES, example),
        AnalyzeOptions(models={cls: model_settings(config, "the benchmark")}),
        ValidateOptions(shapes=specs, benchmark=True, peak_gbps=peak_gbps, other_compile_modes=other_modes or []),
    )
    rows = []
    for problem in report.problems:
        rows.append({"example": example, "size": size, "dtype": dtype, "error": problem})
    for model in report.models:
        for c in model.clusters:
            where = {"example": example, "model": model.name, "size": size, "dtype": dtype, "shapes": model.inputs}
            rows.append(where | cluster_row(c))
        if model.model:
            rows.append(
                {
                    "example": example,
                    "model": model.name,
                    "size": size,
                    "dtype": dtype,
                    "cluster": "model",
                    "status": model.model.status,
                    "eager_us": model.model.eager_us,
                    "patched_us": model.model.patched_us,
                    "speedup": model.model.speedup,
                    "amdahl_speedup": model.model.amdahl_speedup,
                    "applied": model.model.applied,
                }
            )
    return rows


def cluster_row(c) -> dict:
    """A validated cluster (`contracts.validation.ClusterCheck`) as a row of results.json."""
    row = {
        "cluster": c.id,
        "ops": c.ops,
        "status": c.status,
        "regime": c.regime,
        "max_abs": c.max_abs,
        "bytes_unfused": c.bytes_unfused,
        "bytes_fused": c.bytes_fused,
        "instances": c.instances,
        "message": c.message,
    }
    if c.timing:
        row.update(vars(c.timing))
        if c.bytes_unfused and c.bytes_fused:
            row["predicted_ratio"] = round(c.bytes_unfused / c.bytes_fused, 3)
    return row


def _f(value, digits=1, suffix=""):
    return "—" if value is None else f"{value:.{digits}f}{suffix}"


def other_modes_of(rows: list[dict]) -> list[str]:
    """The torch.compile modes other than "default" that the rows were timed against."""
    return sorted({m for r in rows for m in r.get("compiled_modes_us") or {}})


def markdown(rows: list[dict], device: str, versions: dict, measured_with: str = "") -> str:
    modes = other_modes_of(rows)
    head = (
        "| example | size | dtype | cluster | ops | regime | fused bytes | eager µs | torch.compile (default) µs "
        + "".join(f"| torch.compile ({m}) µs " for m in modes)
        + "| fused µs | GB/s | % peak | vs eager | vs torch.compile (default) "
        + ("| vs better compile " if modes else "")
        + "| predicted | launch µs fused / compile / eager |"
    )
    lines = [
        f"Device: {device}; " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        *([f"Measured with: {measured_with}"] if measured_with else []),
        "",
        head,
        "|" + "---|" * (head.count("|") - 1),
    ]
    for r in rows:
        if r.get("cluster") == "model" or "error" in r:
            continue
        mb = f"{r['bytes_fused'] / 2**20:.1f} MB" if r.get("bytes_fused") else "—"
        others = r.get("compiled_modes_us") or {}
        best = min([t for t in [r.get("compiled_us"), *others.values()] if t], default=None)
        lines.append(
            f"| {r['example'].removesuffix('.py')} | {r['size']} | {r['dtype']} | {r['cluster']} | {r['ops']} | "
            f"{r.get('regime') or '—'} | {mb} | {_f(r.get('eager_us'))} | {_f(r.get('compiled_us'))} | "
            + "".join(f"{_f(others.get(m))} | " for m in modes)
            + f"{_f(r.get('fused_us'))} | {_f(r.get('achieved_gbps'), 0)} | {_f(r.get('pct_of_peak'), 0, '%')} | "
            f"{_f(r.get('speedup_vs_eager'), 2, '×')} | {_f(r.get('speedup_vs_compiled'), 2, '×')} | "
            + (f"{_f(best / r['fused_us'] if best and r.get('fused_us') else None, 2, '×')} | " if modes else "")
            + f"{_f(r.get('predicted_ratio'), 2, '×')} | {_f(r.get('fused_launch_us'))} / "
            f"{_f(r.get('compiled_launch_us'))} / {_f(r.get('eager_launch_us'))} |"
        )
    models = [r for r in rows if r.get("cluster") == "model"]
    if models:
        lines += [
            "",
            "| example | size | dtype | forward µs (eager) | patched µs | measured | if all clusters fused |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in models:
            lines.append(
                f"| {r['example'].removesuffix('.py')} | {r['size']} | {r['dtype']} | {_f(r.get('eager_us'))} | "
                f"{_f(r.get('patched_us'))} | {_f(r.get('speedup'), 2, '×')} | "
                f"{_f(r.get('amdahl_speedup'), 2, '×')} |"
            )
    errors = [r for r in rows if "error" in r or r.get("status") not in (None, "verified", "matches", "skipped")]
    for r in errors:
        lines.append(
            f"\n- {r['example']} {r['size']} {r['dtype']} {r.get('cluster', '')}: "
            f"{r.get('error') or r.get('status')} {r.get('message', '')}"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", help="example file(s) to run (default: all)")
    parser.add_argument("--size", action="append", choices=["launch", "l2", "dram"])
    parser.add_argument("--dtype", action="append", choices=["float32", "bfloat16"])
    parser.add_argument("--peak-gbps", type=float)
    parser.add_argument(
        "--also-compile-mode",
        action="append",
        default=[],
        metavar="MODE",
        help='time torch.compile in MODE too (such as "max-autotune-no-cudagraphs"), beside mode "default"',
    )
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--budget-s", type=float, default=0, help="stop starting new cases after this many seconds")
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="RESULTS_JSON",
        help="write one table from the results.json of earlier runs (a suite split across "
        "machines or time limits); needs no GPU",
    )
    args = parser.parse_args()
    if args.merge:
        return _merge(args.merge, args.out)
    examples = args.only or list(SUITE)
    if len(examples) > 1:
        return _each_in_its_own_process(args, examples)
    begun = time.perf_counter()
    import torch
    import triton

    if not torch.cuda.is_available():
        print("no CUDA device: the GPU benchmark needs one (see `fuselens validate --interpret` for CPU checks)")
        return 1
    from fuselens.validate.gpu import copy_bandwidth_gbps

    versions = {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0]}
    measured_with = provenance()
    device = torch.cuda.get_device_name()
    peak = copy_bandwidth_gbps(args.peak_gbps)
    print(f"{device}: copy bandwidth {peak:.0f} GB/s; {versions}", flush=True)
    rows: list[dict] = []
    os.makedirs(args.out, exist_ok=True)
    for example in examples:
        for size in args.size or ["launch", "l2", "dram"]:
            for dtype in args.dtype or ["float32", "bfloat16"]:
                if args.budget_s and time.perf_counter() - begun > args.budget_s:
                    print(f"time budget spent: skipping {example} {size} {dtype}", flush=True)
                    continue
                started = time.perf_counter()
                try:
                    got = run_case(example, size, dtype, args.peak_gbps, args.also_compile_mode)
                except Exception as exc:  # one failing case must not lose the others
                    got = [{"example": example, "size": size, "dtype": dtype, "error": f"{type(exc).__name__}: {exc}"}]
                rows += got
                print(f"{example} {size} {dtype}: {len(got)} rows in {time.perf_counter() - started:.0f} s", flush=True)
                torch.cuda.empty_cache()
                with open(os.path.join(args.out, "results.json"), "w") as fh:  # after every case: a cut run keeps it
                    json.dump(
                        {
                            "device": device,
                            "copy_gbps": peak,
                            "versions": versions,
                            "provenance": measured_with,
                            "rows": rows,
                        },
                        fh,
                        indent=1,
                        default=str,
                    )
    _write_table(args.out, rows, device, versions, provenance_line(measured_with))
    return 0


def _write_table(out: str, rows: list[dict], device: str, versions: dict, measured_with: str = "") -> None:
    table = markdown(rows, device, versions, measured_with)
    with open(os.path.join(out, "results.md"), "w") as fh:
        fh.write(table)
    print(table)


def _merge(paths: list[str], out: str) -> int:
    merged: dict = {"rows": []}
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            part = json.load(fh)
        if (
            merged.get("device", part["device"]) != part["device"]
            or merged.get("versions", part["versions"]) != part["versions"]
        ):
            print(
                f"{path} was measured on {part['device']} with {part['versions']}, not on "
                f"{merged['device']} with {merged['versions']}: one table needs one device and one toolchain"
            )
            return 1
        merged.update({k: v for k, v in part.items() if k != "rows"})
        merged["rows"] += part["rows"]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as fh:
        json.dump(merged, fh, indent=1, default=str)
    _write_table(out, merged["rows"], merged["device"], merged["versions"])
    return 0


def run_child(command: list[str]) -> tuple[int, dict | None]:
    """Run a benchmark `command` writing into a fresh folder: its exit code, and the results.json it
    wrote (None when it wrote none)."""
    with tempfile.TemporaryDirectory(prefix="fuselens-bench-") as out:
        code = subprocess.call([*command, "--out", out])
        try:
            with open(os.path.join(out, "results.json"), encoding="utf-8") as fh:
                return code, json.load(fh)
        except (OSError, ValueError):
            return code, None


def _each_in_its_own_process(args, examples: list[str]) -> int:
    """One child process per example, so each starts with an empty GPU: hundreds of CUDA-graph
    captures of GB-sized tensors fragment the caching allocator until a later example no longer
    fits, even with every tensor freed."""
    begun = time.perf_counter()
    merged: dict = {"rows": []}
    for example in examples:
        command = [sys.executable, os.path.abspath(__file__), "--only", example]
        command += [f"--size={v}" for v in args.size or []] + [f"--dtype={v}" for v in args.dtype or []]
        if args.peak_gbps:
            command.append(f"--peak-gbps={args.peak_gbps}")
        command += [f"--also-compile-mode={m}" for m in args.also_compile_mode]
        if args.budget_s:
            left = args.budget_s - (time.perf_counter() - begun)
            if left <= 0:
                print(f"time budget spent: skipping {example}", flush=True)
                continue
            command.append(f"--budget-s={left}")
        code, part = run_child(command)
        if part is None:
            error = f"the benchmark process exited with {code} before writing results"
            part = {"rows": [{"example": example, "size": "", "dtype": "", "error": error}]}
        merged.update({k: v for k, v in part.items() if k != "rows"})
        merged["rows"] += part["rows"]
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as fh:
            json.dump(merged, fh, indent=1, default=str)
    _write_table(args.out, merged["rows"], merged.get("device", "?"), merged.get("versions", {}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
