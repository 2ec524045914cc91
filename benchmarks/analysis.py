"""How fast is analysis, and how does it grow with depth?

    python benchmarks/analysis.py [--repeat 5]

Prints, per shipped example:
- warm: capture + analysis + codegen of the file in a process that has already run one
  analysis (what the language server's warm worker pays per save, minus the fork);
- cold CLI: wall time of `fuselens analyze FILE` in a fresh process (import torch included);
- peak RSS of that CLI process;
and the same figures for the GPT example at 12, 24 and 48 layers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


# Runs the CLI in a child of a fresh interpreter, so RUSAGE_CHILDREN holds that one run only.
_MEASURE = (
    "import resource, subprocess, sys, time\n"
    "t = time.perf_counter()\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, done.returncode)\n"
)


def cold_cli(path: str, args: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS MB) of one `fuselens analyze` run in a fresh process."""
    command = [sys.executable, "-m", "fuselens.cli.main", "analyze", path, *args]
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, *command],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=True,
    ).stdout.split()
    seconds, rss_kb, code = float(out[0]), int(out[1]), int(out[2])
    if code != 0:
        raise RuntimeError(f"fuselens analyze {path} exited {code}")
    return seconds, rss_kb / 1024


def gpt_with_layers(layers: int, folder: str) -> str:
    with open(os.path.join(EXAMPLES, "gpt.py"), encoding="utf-8") as fh:
        text = fh.read()
    text = text.replace("n_layers: int = 12", f"n_layers: int = {layers}")
    path = os.path.join(folder, f"gpt_{layers}.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from fuselens.pipeline.analyze import AnalyzeOptions, analyze_file
    from fuselens.worker.jobs import warm_up

    warm_up()
    cases = [
        (name, os.path.join(EXAMPLES, name), [])
        for name in ("example_net.py", "gpt.py", "llama_block.py", "conv_block.py", "branchy.py")
    ]
    cases[0] = ("example_net.py", cases[0][1], ["--input-shape", "16384,1024"])
    with tempfile.TemporaryDirectory() as tmp:
        cases += [(f"gpt.py, {n} layers", gpt_with_layers(n, tmp), []) for n in (12, 24, 48)]
        print(
            f"{'example':24} {'ops':>5} {'clusters':>8} {'warm p50':>9} {'warm min':>9} {'cold CLI':>9} {'peak RSS':>9}"
        )
        for label, path, cli_args in cases:
            shapes = cli_args[1:2] if cli_args else None
            timings, report = [], None
            for _ in range(args.repeat):
                start = time.perf_counter()
                report = analyze_file(path, AnalyzeOptions(input_shapes=shapes))
                timings.append(time.perf_counter() - start)
            models = [m for m in report.models if m.status == "analyzed"]
            ops = sum(m.ops_total for m in models)
            clusters = sum(len(m.clusters) for m in models)
            seconds, rss = cold_cli(path, cli_args)
            print(
                f"{label:24} {ops:5d} {clusters:8d} {statistics.median(timings) * 1000:7.0f}ms "
                f"{min(timings) * 1000:7.0f}ms {seconds:8.2f}s {rss:7.0f}MB"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
