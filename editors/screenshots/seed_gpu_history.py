"""Write one case of the held-out GPU suite as a model file, and its measured run into that file's
validation history, as the server keeps it.

    python editors/screenshots/seed_gpu_history.py FOLDER CASE RESULTS_JSON   # prints the file's path

This machine has no GPU, so the results view's picture after a GPU validation shows a real one
measured elsewhere: `benchmarks/held_out.py` validates each case with `fuselens validate`
machinery on the GPU and keeps every cluster's check in its results.json
(`benchmarks/results/held_out_h200.json`).  The rows of CASE become that case's validation report
again, recorded through the server's own history code, so that opening the case's file and
asking for its results shows that run.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from dataclasses import fields

from fuselens.contracts.validation import ClusterCheck, ModelValidation, Timing, ValidationReport
from fuselens.server import history

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
from held_out import CASES  # (the suite's cases: their sources and inputs)

TIMING_FIELDS = {f.name for f in fields(Timing)}
CHECK_FIELDS = {"ops", "status", "regime", "bytes_fused", "instances", "max_abs", "message"}


def report_of(case: str, results: dict, model_file: str) -> ValidationReport:
    """The validation report of `case` in a held-out results.json."""
    rows = [r for r in results["rows"] if r.get("case") == case and "cluster" in r]
    if not rows:
        raise SystemExit(f"{case}: no clusters in these results")
    checks = [
        ClusterCheck(
            id=r["cluster"],
            kernel=f"cluster{r['cluster'].removeprefix('c')}",
            **{k: r[k] for k in CHECK_FIELDS if k in r},
            timing=Timing(**{k: r[k] for k in TIMING_FIELDS if k in r}),
        )
        for r in rows
    ]
    measured = results.get("provenance") or {}
    versions = {k: measured[k] for k in ("torch", "triton") if measured.get(k)}
    shapes = [list(shape) for shape, _, _ in CASES[case].inputs]
    model = ModelValidation("model", shapes, [dtype for _, dtype, _ in CASES[case].inputs], checks)
    return ValidationReport(model_file, "cuda", results["device"], [model], versions=versions)


def model_file(folder: str, case: str) -> str:
    """The case's source in `folder`, its inputs in the `# fuselens:` comment a user would write."""
    (shape, dtype, _high), *more = CASES[case].inputs  # (their range matters to the run measured, not here)
    if more:
        raise SystemExit(f"{case} takes several inputs; pick a case with one")
    comment = f"  # fuselens: input=({', '.join(map(str, shape))}) {dtype}"
    lines = textwrap.dedent(CASES[case].source).lstrip("\n").splitlines()
    lines = [line + comment if line.startswith("model = ") else line for line in lines]
    path = os.path.join(folder, f"{case.replace('-', '_')}.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def main() -> int:
    folder, case, results_path = sys.argv[1:4]
    with open(results_path, encoding="utf-8") as fh:
        results = json.load(fh)
    path = model_file(folder, case)
    report = report_of(case, results, path)
    history.record(path, report, lambda line: print(line, file=sys.stderr))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
