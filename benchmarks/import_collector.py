"""What Python's garbage collector costs the imports before a file's first analysis: each import timed in
fresh interpreters, with the collector on (Python's default) and off (as the worker host imports,
`worker/collector.py`), alternated.

    python benchmarks/import_collector.py [--runs 5] [--library "from transformers import LlamaConfig, LlamaForCausalLM"]

Prints, for `import torch`, the library's import after it, and the language server's own imports
(`fuselens.server.app`), the min / median / max over the runs of each, and the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PROBE = """
import gc, json, time
if {off}:
    gc.disable()
t0 = time.perf_counter()
{first}
t1 = time.perf_counter()
{then}
t2 = time.perf_counter()
print(json.dumps([(t1 - t0) * 1000, (t2 - t1) * 1000]))
"""


def timed(first: str, then: str, off: bool) -> list[float]:
    """Milliseconds of `first`, then of `then`, in a fresh interpreter with the collector on or off."""
    code = PROBE.format(off=off, first=first, then=then or "pass")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> str:
    return f"{min(values):.0f} / {statistics.median(values):.0f} / {max(values):.0f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--library", default="from transformers import LlamaConfig, LlamaForCausalLM")
    args = parser.parse_args()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores) at the start")
    cases = [
        ("import torch, then the library", "import torch", args.library),
        ("the server", "import fuselens.server.app", ""),
    ]
    for title, first, then in cases:
        results: dict[bool, list[list[float]]] = {False: [], True: []}
        for _ in range(args.runs):
            for off in (False, True):  # alternated: a change in the machine's load falls on both
                results[off].append(timed(first, then, off))
        print(title)
        for off in (False, True):
            label = "collector off" if off else "collector on "
            line = f"  {label}: {first}: {spread([r[0] for r in results[off]])}"
            if then:
                line += f"; {then}: {spread([r[1] for r in results[off]])}"
            print(line)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
