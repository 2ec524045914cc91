"""`fuselens profile` on a GPU: where the forward's time goes, and how the ranking by measured time
compares with the ranking by bytes saved.

    python benchmarks/line_profile.py [--only llama-block] [--out DIR]

Cases: the Llama block example at its DRAM size, and a transformers Llama written as a user writes it
(the held-out suite's), both in bf16.  For the Llama block, the file is also profiled after
`fuselens apply` of every cluster, and each cluster's predicted fused time is set beside the time its
kernel took.  Writes profile.json and profile.md to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from held_out import CASES as HELD_OUT  # noqa: E402
from held_out import settings_of as held_out_settings  # noqa: E402
from provenance import line as provenance_line  # noqa: E402
from provenance import provenance  # noqa: E402
from written import write_results  # noqa: E402

EXAMPLES = os.path.join(ROOT, "examples")


def _llama_block(folder: str) -> tuple[str, dict]:
    path = os.path.join(folder, "llama_block.py")
    shutil.copy(os.path.join(EXAMPLES, "llama_block.py"), path)
    shutil.copy(os.path.join(EXAMPLES, "pyproject.toml"), os.path.join(folder, "pyproject.toml"))
    return path, {}


def _transformers_llama(folder: str) -> tuple[str, dict]:
    from fuselens.contracts.config import model_settings

    case = HELD_OUT["llama"]
    path = os.path.join(folder, "llama.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(textwrap.dedent(case.source).lstrip("\n"))
    config = held_out_settings(case)
    return path, {"model": model_settings(config, "the benchmark")}


CASES = {"llama-block": _llama_block, "transformers-llama": _transformers_llama}


def run_case(name: str, iterations: int, warmup: int) -> dict:
    from fuselens.contracts.options import AnalyzeOptions, ProfileOptions
    from fuselens.contracts.plain import to_plain
    from fuselens.pipeline.apply import apply_file
    from fuselens.pipeline.profile import profile_file

    folder = tempfile.mkdtemp(prefix="fuselens-profile-")
    path, models = CASES[name](folder)
    options = ProfileOptions(iterations=iterations, warmup=warmup, device="cuda")
    report = profile_file(path, AnalyzeOptions(models=models), options)
    result = {"case": name, "report": report.to_dict()}
    if name == "llama-block":
        apply_file(path, AnalyzeOptions(models=models), None, lambda _: True)
        # The applied file, profiled beside the code before apply: each kernel against its prediction.
        patched = profile_file(path, AnalyzeOptions(models=models), options)
        result["patched"] = to_plain(patched.profile)
        training = dataclasses.replace(options, train=True)
        trained = profile_file(path, AnalyzeOptions(models=models, train=True), training)
        result["patched_training"] = to_plain(trained.profile)
    return result


def _ms(us: float | None) -> str:
    return "—" if us is None else f"{us / 1000:.3f}"


def markdown(results: list[dict], measured_with: str) -> str:
    out = [f"Measured with {measured_with}.", ""]
    for result in results:
        profile = result["report"]["profile"]
        problems = [p["message"] for p in result["report"]["problems"]]
        problems += [f"{m['name']}: {m['status']}" for m in result["report"]["models"] if m["status"] == "error"]
        if problems:
            out += [f"### {result['case']}", "", *problems, ""]
        for model in profile["models"]:
            out += _model_section(result["case"], profile, model, result["report"])
            if "patched" in result:
                out += _patched_section(result["patched"]["models"][0])
            if "patched_training" in result:
                out += _patched_section(result["patched_training"]["models"][0], "training step")
    return "\n".join(out) + "\n"


def _model_section(case: str, profile: dict, model: dict, report: dict) -> list[str]:
    if model["problem"]:
        return [f"### {case}", "", model["problem"], ""]
    share = model["attributed_us"] / model["forward_us"] if model["forward_us"] else 0
    out = [
        f"### {case} ({model['name']}), {profile['device']}",
        "",
        f"GPU kernel time {_ms(model['forward_us'])} ms per forward (wall, timed alone: {_ms(model['wall_us'])} ms); "
        f"{share:.1%} attributed to the model's code.",
        "",
        "| line | ms | % | calls | ops | clusters |",
        "|---|---|---|---|---|---|",
    ]
    for line in model["lines"][:10]:
        where = f"{os.path.basename(line['file'])}:{line['line']}"
        out.append(
            f"| {where} | {_ms(line['us'])} | {line['share']:.1%} | {line['calls']} | {', '.join(line['ops'][:3])} | "
            f"{', '.join(line['clusters'])} |"
        )
    out += [
        "",
        "| cluster | ms | % | rank by time | rank by bytes saved | forward if fused |",
        "|---|---|---|---|---|---|",
    ]
    for c in model["clusters"]:
        out.append(
            f"| {c['id']} | {_ms(c['us'])} | {c['share']:.1%} | {c['rank_by_time']} | {c['rank_by_bytes']} | "
            f"{c['amdahl_speedup']:.3f}× |"
        )
    opaque = " · ".join(f"{o['kind']} {_ms(o['us'])} ms ({o['share']:.1%})" for o in model["opaque"])
    return [*out, "", f"Outside clusters: {opaque}.", ""]


def _patched_section(patched: dict, step: str = "forward") -> list[str]:
    """Each applied kernel: its cluster's time before apply (measured in the same run), the cost
    model's prediction, and what the kernel measures; the model's error by cluster kind."""
    out = [
        f"After `fuselens apply`, per {step}: {_ms(patched['forward_us'])} ms of kernel time; before apply, in "
        f"the same run: {_ms(patched['before_us'])} ms.",
        "",
        "| kernel | cluster | kind | before ms | predicted fused ms | measured ms | predicted / measured − 1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for a in patched["applied"]:
        out.append(
            f"| {a['kernel']} | {a['cluster']} | {a['kind']} | {_ms(a['unfused_us'])} | {_ms(a['predicted_fused_us'])} | "
            f"{_ms(a['measured_us'])}{' (reference)' if a['reference'] else ''} | {a['error']:+.0%} |"
        )
    errors = ", ".join(f"{kind} {error:+.0%}" for kind, error in patched["cost_model_error"].items())
    return [*out, "", f"The cost model's mean error by kind: {errors or '—'}.", ""]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=list(CASES))
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("benchmarks/line_profile.py measures GPU kernel time: it needs a CUDA device", file=sys.stderr)
        return 2
    info = provenance()
    results = []
    for name in args.only or list(CASES):
        results.append(run_case(name, args.iterations, args.warmup))
        table = markdown(results, provenance_line(info))
        write_results(args.out, "profile", {"provenance": info, "results": results}, table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
