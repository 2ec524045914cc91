"""How long the torch.compile comparison takes, and what it says, per example.

    python benchmarks/inductor.py            # every example
    python benchmarks/inductor.py --one gpt.py   # (used internally: one example, one process)

For each example: the first comparison in a fresh process (cold: Inductor's imports and
compile caches empty), a second one in the same process (warm), and the agreement table.
The language server also caches a comparison by file content, settings and torch version,
so an unchanged file costs nothing the second time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = ["example_net.py", "llama_block.py", "conv_block.py", "branchy.py", "gpt.py"]
# Small inputs: Inductor compiles the same kernels whatever the size; real tensors are made for the run.
SETTINGS = {
    "example_net.py": {"ExampleNet": {"inputs": [[64, 1024]]}},
    "llama_block.py": {"LlamaBlock": {"inputs": [[1, 64, 1024]], "dtype": "bfloat16", "param_dtype": "bfloat16"}},
    "conv_block.py": {"ResBlock": {"inputs": [[2, 128, 16, 16], [2, 512]]}},
    "branchy.py": {"GatedNet": {"inputs": [[64, 1024]]}},
    "gpt.py": {"GPT": {"inputs": [{"shape": [1, 64], "dtype": "int64"}], "init": {"n_layers": 12}}},
}


def one(name: str) -> dict:
    from fuselens.pipeline.analyze import AnalyzeOptions, analyze_file
    from fuselens.pipeline.compare import compare_report

    path = os.path.join(ROOT, "examples", name)
    options = AnalyzeOptions(models=SETTINGS[name])
    times = []
    for _ in range(2):
        report = analyze_file(path, options)
        start = time.perf_counter()
        compare_report(report, options)
        times.append(time.perf_counter() - start)
    rows = []
    for model in report.models:
        if model.inductor is None:
            continue
        for c in model.inductor.clusters:
            ours = next(x for x in model.clusters if x.id == c.cluster)
            rows.append([model.name, c.cluster, ours.op_chain, c.status, c.summary])
        for u in model.inductor.unmatched:
            rows.append([model.name, "—", "", "inductor-only", u.summary])
    return {"cold_s": round(times[0], 2), "warm_s": round(times[1], 2), "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return 0
    for name in EXAMPLES:
        done = subprocess.run(
            [sys.executable, __file__, "--one", name],
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        if done.returncode != 0:
            print(f"{name}: failed\n{done.stderr[-2000:]}")
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"\n{name}: cold {result['cold_s']} s, warm {result['warm_s']} s")
        for _model, cluster, ops, status, summary in result["rows"]:
            print(f"  {cluster:4} {status:16} {ops[:40]:40} {summary[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
