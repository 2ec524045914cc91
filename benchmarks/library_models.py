"""How do library models analyze?  The transformers corpus of the tests, and a Llama-7B-shaped model.

    python benchmarks/library_models.py

Each model of `tests/library_corpus.py` (the corpus `tests/test_library_models.py` checks, tiny random-init
configurations written as a user writes them), and a Llama-7B-shaped configuration (analysis only), is
analyzed in a fresh child process that has imported fuselens and transformers and warmed up as the
language server's worker does (`worker.jobs.warm_up`).  A markdown table is printed, one row per model:

- ops traced, clusters, their instances (a folded cluster counts once per layer), patterns;
- bytes avoidable: saved by fusing every instance of every cluster, on the report's device profile;
- applicable: clusters the report says can be applied (its per-cluster `applies`: a library patch, or an
  edit of the user's file);
- analysis: wall time of `analyze_file` on the model's file (importing it, which builds the model on
  meta, included): the first time in the process, which imports transformers' modeling code for the
  model (`transformers.models.llama.modeling_llama`, say), and again, with that code imported;
- peak RSS: the child's high-water mark (`getrusage(RUSAGE_SELF).ru_maxrss`), and how much of it the
  analysis added over the imports and warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from library_corpus import CORPUS, LLAMA_7B, Case  # noqa: E402  (the tests' corpus, from their folder)

CASES: list[Case] = [*CORPUS, LLAMA_7B]


def child(case_id: str, folder: str) -> None:
    """Analyze one case in this process and print one JSON line: the report, the time, the peak RSS."""
    import torch
    import transformers  # noqa: F401  (what every model file imports: counted with the imports, not the analysis)

    torch.set_num_threads(1)
    from fuselens.pipeline.analyze import analyze_file
    from fuselens.worker.jobs import warm_up

    warm_up()
    case = next(c for c in CASES if c.id == case_id)
    path = case.write(folder)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seconds = []
    for _ in range(2):  # the first imports transformers' modeling code for the model; the second has it
        start = time.perf_counter()
        report = analyze_file(path)
        seconds.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"report": report.to_dict(), "seconds": seconds, "peak_kb": peak, "before_kb": before}))


def measure(case: Case, folder: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", case.id, os.path.join(folder, case.id)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{case.id}: the child exited {done.returncode}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def row(case: Case, result: dict) -> list[str]:
    """The table's cells for one case."""
    from fuselens.contracts.units import bytes_label

    report = result["report"]
    models = [m for m in report["models"] if m["status"] == "analyzed"]
    if report["problems"] or len(models) != 1:
        problem = report["problems"] or [m.get("problem") for m in report["models"]]
        return [case.architecture, case.config, f"not analyzed: {problem}"] + [""] * (len(HEADER) - 3)
    model = models[0]
    clusters = model["clusters"]
    patched = sum(c["applies"] == "patch" for c in clusters)
    edited = sum(c["applies"] == "edit" for c in clusters)
    kinds = sorted({p["name"] for p in model["patterns"]})
    cells = [
        case.architecture,
        case.config,
        str(model["ops_total"]),
        str(len(clusters)),
        str(sum(c["multiplicity"] for c in clusters)),
        f"{len(model['patterns'])} ({', '.join(kinds)})" if kinds else "0",
        bytes_label(model["totals"]["bytes_avoidable"]),
        f"{patched + edited} of {len(clusters)}" + (f" ({edited} by edit)" if edited else ""),
        f"{result['seconds'][0]:.2f} s",
        f"{result['seconds'][1]:.2f} s",
        f"{result['peak_kb'] / 1024:.0f} MB",
        f"+{(result['peak_kb'] - result['before_kb']) / 1024:.0f} MB",
    ]
    return cells


HEADER = [
    "model",
    "config",
    "ops",
    "clusters",
    "instances",
    "patterns",
    "bytes avoidable",
    "applicable",
    "analysis, first",
    "again",
    "peak RSS",
    "analysis adds",
]


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), cpu)
    except OSError:
        pass
    memory = ""
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            kb = int(fh.readline().split()[1])
            memory = f", {kb / 2**20:.0f} GB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return f"{cpu}, {os.cpu_count()} cores{memory}, {platform.system()} {platform.release()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=2, metavar=("CASE", "FOLDER"), help=argparse.SUPPRESS)
    parser.add_argument("--only", action="append", help="case ids to run (default: all)")
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    import torch
    import transformers

    from fuselens.contracts.version import TOOL_VERSION

    cases = [c for c in CASES if not args.only or c.id in args.only]
    rows, devices = [], set()
    with tempfile.TemporaryDirectory(prefix="fuselens-library-") as tmp:
        for case in cases:
            print(f"… {case.id}", file=sys.stderr, flush=True)
            result = measure(case, tmp)
            rows.append(row(case, result))
            devices.add((result["report"].get("device") or {}).get("name", "?"))
    print(
        f"fuselens {TOOL_VERSION}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"Python {platform.python_version()}; ran on {machine()}; "
        f"bytes for the device profile {', '.join(sorted(devices))}\n"
    )
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(HEADER))) + "|")
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    print("\napplicable: clusters the report says apply (`applies`): as a library patch, or by an edit of the file.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
