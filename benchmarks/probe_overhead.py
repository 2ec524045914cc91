"""`fuselens probe`'s overhead on a forward: the GPT example's forward time and peak memory plain, and
with every GEMM call sketched (one call in 1, and in 8), on the CPU and on CUDA where there is one.

    python benchmarks/probe_overhead.py [--batches 4] [--layers 12] [--tokens 1,256] [--out DIR]

Each configuration runs in a process of its own (its peak memory is its own): the peak is the CUDA
allocator's where it runs on CUDA, the process's resident set on a CPU.  The batches are made before
the clock starts, the same for every configuration.  The first forward is given apart: a probed one folds every weight
and finds its effective rank there, once; the later forwards are the steady cost of the sketches; the
sites' summary at the end (opportunities) is timed on its own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
MODES = {"plain": 0, "probe every call": 1, "probe 1 in 8": 8}


def one(mode: str, device: str, batches: int, layers: int, tokens: list[int]) -> dict:
    import importlib.util

    import torch

    from fuselens.analysis.capture import UserCode
    from fuselens.analysis.probe.opportunities import site_summary
    from fuselens.analysis.probe.recorder import ProbeMode

    spec = importlib.util.spec_from_file_location("gpt_example", os.path.join(ROOT, "examples", "gpt.py"))
    assert spec is not None and spec.loader is not None
    gpt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpt)
    torch.manual_seed(0)
    model = gpt.GPT(n_layers=layers).eval().to(device)
    generator = torch.Generator().manual_seed(0)
    made = [(torch.randint(0, 50304, tokens, generator=generator).to(device),) for _ in range(batches + 1)]
    with torch.no_grad():
        model(*made[0])  # warm-up: allocator, kernels
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    every = MODES[mode]
    probing = ProbeMode(UserCode(roots=(os.path.join(ROOT, "examples"),)), every) if every else None
    forwards = []
    with torch.no_grad():
        for batch in made[1:]:
            start = time.perf_counter()
            with probing if probing is not None else contextlib.nullcontext():
                model(*batch)
            if probing is not None:
                probing.end_batch()
            if device == "cuda":
                torch.cuda.synchronize()
            forwards.append(time.perf_counter() - start)
    start = time.perf_counter()
    sites = [site_summary(s, batches) for s in probing.sites.values()] if probing is not None else []
    summary = time.perf_counter() - start
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "mode": mode,
        "device": device,
        "first_ms": 1e3 * forwards[0],  # a probed one folds each weight and finds its rank here
        "later_ms": 1e3 * sum(forwards[1:]) / max(len(forwards) - 1, 1),
        "summary_ms": 1e3 * summary,
        "peak_bytes": peak,
        "sites": len(sites),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--tokens", default="1,256", help="batch,sequence of each forward's token ids")
    parser.add_argument("--out", help="write probe_overhead.json and .md here")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    tokens = [int(n) for n in args.tokens.split(",")]
    if args.one:
        print(json.dumps(one(args.one, args.device, args.batches, args.layers, tokens)))
        return 0
    import torch

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    for device in devices:
        for mode in MODES:
            command = [sys.executable, __file__, "--one", mode, "--device", device, "--batches", str(args.batches),
                       "--layers", str(args.layers), "--tokens", args.tokens]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    table = _table(rows, args)
    print(table)
    if args.out:
        from written import write_results

        measured = {"rows": rows, "torch": torch.__version__, "tokens": tokens, "layers": args.layers}
        write_results(args.out, "probe_overhead", measured, table)
    return 0


def _table(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"GPT example, {args.layers} layers, token ids {args.tokens}, {args.batches} batches",
        "",
        "| device | mode | first forward ms | later forwards ms | × plain (later) | summary ms | peak memory (MiB) | sites |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        plain = next(r for r in rows if r["device"] == row["device"] and r["mode"] == "plain")
        lines.append(
            f"| {row['device']} | {row['mode']} | {row['first_ms']:.1f} | {row['later_ms']:.1f} | "
            f"{row['later_ms'] / plain['later_ms']:.2f} | {row['summary_ms']:.1f} | {row['peak_bytes'] / 2**20:.0f} | "
            f"{row['sites']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
