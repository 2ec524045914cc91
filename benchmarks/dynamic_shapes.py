"""A model with a dynamic size, applied once, against eager and torch.compile at each size of its corpus.

    python benchmarks/dynamic_shapes.py [--only llama|vision] [--dtype bfloat16] [--profile] [--out DIR]
    python benchmarks/dynamic_shapes.py --tiny [--compile]     # a CPU smoke run, kernels interpreted

Each case is an example with one size declared dynamic: a Llama-style block over `seq` (hidden 4096,
corpus 1, 128, 2048, 8192) and a diffusion ResBlock over its resolution `res`.  The example is copied
to a temporary folder and applied once (`fuselens apply`, every cluster that applies, analyzed at
the corpus's middle); then at each point of the corpus, in one process with the same weights:

- eager;
- `torch.compile(dynamic=False)`: a compile per new shape, whose count is reported;
- `torch.compile` with the declared dims marked dynamic (`torch._dynamo.maybe_mark_dynamic` on the
  inputs' dims that are the size), compiling once for the range (and again where it specializes:
  a size of 1);
- the applied model, whose first call at each point must compile nothing in dynamo (its recompiles,
  counted, are zero: it runs as Python); the Triton specializations its kernels compiled at the point
  are reported beside (a kernel is specialized
  on its sizes' divisibility by 16 and on its tile, chosen per call from the sizes).

Times are CUDA-graph replays sampled in turn (`fuselens.validate.gpu`); on a CPU (`--tiny`), the
median of plain calls.  Each row has the applied model's ratio against the better compile variant
at that point and its largest difference from eager.  Writes dynamic_shapes.json and
dynamic_shapes.md to --out, with the provenance header.  With `--profile`, at every point where the
applied model is slower than the better compile variant, the kernels one call of each launches, with
their device time, go to dynamic_shapes_profile.txt.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from kernel_table import top_kernels  # noqa: E402
from model_files import load_model_file  # noqa: E402
from provenance import line as provenance_line  # noqa: E402
from provenance import provenance  # noqa: E402

EXAMPLES = os.path.join(ROOT, "examples")
VARIANTS = ("eager", "compile_static", "compile_dynamic", "applied")


@dataclass
class Case:
    """One example with one size declared dynamic."""

    example: str
    cls: str
    size: str  # the declared size's name
    inputs: list[list]  # shapes, the size named where it appears
    init: dict
    corpus: list[int]


CASES = {
    "llama": Case(
        "llama_block.py",
        "LlamaBlock",
        "seq",
        [[1, "seq", 4096]],
        {"dim": 4096, "n_heads": 32, "hidden": 11008, "max_len": 8192},
        [1, 128, 2048, 8192],
    ),
    "vision": Case(
        "conv_block.py", "ResBlock", "res", [[8, 256, "res", "res"], [8, 512]], {"channels": 256}, [16, 32, 64, 128]
    ),
}
TINY = {
    "llama": Case(
        "llama_block.py",
        "LlamaBlock",
        "seq",
        [[2, "seq", 64]],
        {"dim": 64, "n_heads": 2, "hidden": 128, "max_len": 64},
        [1, 7, 16, 33],
    ),
    "vision": Case("conv_block.py", "ResBlock", "res", [[2, 32, "res", "res"], [2, 512]], {"channels": 32}, [4, 7, 16]),
}


def shapes_at(case: Case, value: int) -> list[list[int]]:
    return [[value if d == case.size else d for d in shape] for shape in case.inputs]


def dynamic_dims(case: Case) -> list[list[int]]:
    """For each input, the dims that are the declared size."""
    return [[j for j, d in enumerate(shape) if d == case.size] for shape in case.inputs]


def apply_case(case: Case, dtype: str, folder: str):
    """The example applied in `folder` with its size declared dynamic: (what apply did, the applied class)."""
    from fuselens.contracts.config import model_settings
    from fuselens.contracts.options import AnalyzeOptions
    from fuselens.pipeline.apply import apply_file

    path = os.path.join(folder, case.example)
    shutil.copy(os.path.join(EXAMPLES, case.example), path)
    config = {
        "inputs": [{"shape": s, "dtype": dtype} for s in case.inputs],
        "dims": {case.size: {"min": min(case.corpus), "max": max(case.corpus), "corpus": case.corpus}},
        "init": case.init,
        "param_dtype": dtype,
    }
    options = AnalyzeOptions(models={case.cls: model_settings(config, "the benchmark")})
    result = apply_file(path, options, None, lambda _: True)
    return result, getattr(load_model_file(path, f"applied_{case.cls}"), case.cls)


def counting_backend(counts: collections.Counter, key: str):
    """Inductor, counting the graphs it is asked to compile under `key`."""
    from torch._inductor.compile_fx import compile_fx

    def backend(gm, example_inputs):
        counts[key] += 1
        return compile_fx(gm, example_inputs)

    return backend


def dynamo_graphs() -> int:
    """Graphs dynamo has compiled in this process so far."""
    import torch._dynamo.utils

    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def triton_specializations() -> int | None:
    """Kernels Triton has compiled so far for every generated kernel module loaded; None in the interpreter."""
    from triton.runtime.jit import JITFunction

    total = 0
    for name, module in list(sys.modules.items()):
        if not name.endswith("_kernels"):
            continue
        for value in vars(module).values():
            if isinstance(value, JITFunction):
                total += sum(len(caches[0]) for caches in value.device_caches.values())
    return total if total or _compiled_kernels() else None


def _compiled_kernels() -> bool:
    return os.environ.get("TRITON_INTERPRET") != "1"


def cpu_median_us(fn, repeats: int = 5) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def time_variants(fns: dict, cuda: bool) -> dict[str, float]:
    if cuda:
        from fuselens.validate.gpu import graph_replay, medians_in_turn

        return medians_in_turn({name: graph_replay(fn) for name, fn in fns.items()}, 15)
    return {name: cpu_median_us(fn) for name, fn in fns.items()}


def run_case(name: str, case: Case, dtype: str, compiled: bool, cuda: bool, profile=None) -> dict:
    """Every variant timed at every point of the corpus; `profile(title, text)` takes the kernel tables
    of the points where the applied model loses to the better compile variant."""
    import torch

    device = "cuda" if cuda else "cpu"
    torch_dtype = getattr(torch, dtype)
    folder = tempfile.mkdtemp(prefix="fuselens-dynamic-")
    result, applied_cls = apply_case(case, dtype, folder)
    original_cls = getattr(load_model_file(os.path.join(EXAMPLES, case.example), f"original_{case.cls}"), case.cls)
    torch.manual_seed(0)
    eager = original_cls(**case.init).to(device, torch_dtype).eval()
    applied = applied_cls(**case.init).to(device, torch_dtype).eval()
    applied.load_state_dict(eager.state_dict())
    compiles: collections.Counter = collections.Counter()
    torch._dynamo.reset()
    models = {"eager": eager, "applied": applied}
    if compiled:
        models["compile_static"] = torch.compile(
            eager, backend=counting_backend(compiles, "compile_static"), dynamic=False
        )
        models["compile_dynamic"] = torch.compile(eager, backend=counting_backend(compiles, "compile_dynamic"))
    row = {"case": name, "example": case.example, "size": case.size, "dtype": dtype, "applied": result.applied}
    row["skipped"] = result.skipped
    row["points"] = []
    for value in case.corpus:
        print(f"… {name} at {case.size} = {value}", file=sys.stderr, flush=True)
        torch.manual_seed(1)
        inputs = [torch.randn(*s, device=device, dtype=torch_dtype) for s in shapes_at(case, value)]
        marked = [x.clone() for x in inputs]
        for x, dims in zip(marked, dynamic_dims(case), strict=True):
            for d in dims:
                torch._dynamo.maybe_mark_dynamic(x, d)
        before = dict(compiles)
        specialized = triton_specializations()
        with torch.no_grad():
            fns = {"eager": functools.partial(eager, *inputs), "applied": functools.partial(applied, *inputs)}
            if compiled:
                fns["compile_static"] = functools.partial(models["compile_static"], *inputs)
                fns["compile_dynamic"] = functools.partial(models["compile_dynamic"], *marked)
            graphs = dynamo_graphs()
            want, got = eager(*inputs), applied(*inputs)
            recompiles = dynamo_graphs() - graphs  # the applied model's first call at this size
            times = time_variants(fns, cuda)
            compiled_here = [k for k in ("compile_static", "compile_dynamic") if k in times]
            best_compile = min(compiled_here, key=times.__getitem__, default=None)
            if profile is not None and cuda and best_compile and times[best_compile] < times["applied"]:
                for variant in ("applied", best_compile):
                    profile(f"{name} at {case.size} = {value}, {variant}", top_kernels(fns[variant], rows=40))
        after = triton_specializations()
        point = {
            case.size: value,
            "shapes": shapes_at(case, value),
            "us": times,
            "compiles": {k: compiles[k] - before.get(k, 0) for k in ("compile_static", "compile_dynamic")},
            "applied_recompiles": recompiles,
            "triton_specializations": None if after is None or specialized is None else after - specialized,
            "max_abs": (got.float() - want.float()).abs().max().item(),
        }
        point["applied_vs_best_compile"] = None if best_compile is None else times[best_compile] / times["applied"]
        point["applied_vs_eager"] = times["eager"] / times["applied"]
        row["points"].append(point)
    row["compiles_total"] = dict(compiles)
    torch._dynamo.reset()
    return row


def _append_profile(path: str, title: str, table: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(f"--- {title}\n{table}\n")


def _f(value, digits: int = 1, suffix: str = "") -> str:
    return "—" if value is None else f"{value:.{digits}f}{suffix}"


def markdown(rows: list[dict], device: str, versions: str) -> str:
    lines = [
        f"Device: {device}; {versions}",
        "",
        "| case | size | "
        + " | ".join(f"{v} µs" for v in VARIANTS)
        + " | static compiles | dynamic compiles | applied recompiles | triton specializations "
        "| applied vs eager | applied vs best compile | max abs diff |",
        "|" + "---|" * (len(VARIANTS) + 9),
    ]
    for r in rows:
        for p in r["points"]:
            us = p["us"]
            lines.append(
                f"| {r['case']} | {r['size']} = {p[r['size']]} | "
                + " | ".join(_f(us.get(v)) for v in VARIANTS)
                + f" | {p['compiles']['compile_static']} | {p['compiles']['compile_dynamic']} | "
                f"{p['applied_recompiles']} | {_f(p['triton_specializations'], 0)} | "
                f"{_f(p['applied_vs_eager'], 3, '×')} | {_f(p['applied_vs_best_compile'], 3, '×')} | "
                f"{p['max_abs']:.3g} |"
            )
    for r in rows:
        lines.append(
            f"\n{r['case']}: applied {', '.join(r['applied']) or 'nothing'}; compiles over the corpus: "
            + ", ".join(f"{k} {v}" for k, v in sorted(r["compiles_total"].items()))
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=sorted(CASES), help="case(s) to run (default: all)")
    parser.add_argument(
        "--dtype", default=None, choices=["float32", "bfloat16"], help="default bfloat16 (--tiny: float32)"
    )
    parser.add_argument("--tiny", action="store_true", help="small sizes; runs on a CPU with kernels interpreted")
    parser.add_argument("--compile", action="store_true", help="with --tiny: time the torch.compile variants too")
    parser.add_argument("--profile", action="store_true", help="kernel tables where the applied model loses to compile")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        raise SystemExit("needs a CUDA device (or --tiny for a CPU smoke run)")
    if not cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module imports Triton
        torch.set_num_threads(1)  # a smoke run's times on a shared CPU: one thread waits on no other
    cases = TINY if args.tiny else CASES
    dtype = args.dtype or ("float32" if args.tiny else "bfloat16")
    compiled = cuda or args.compile
    measured_with = provenance()
    device = torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)"
    versions = provenance_line(measured_with)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    profile = functools.partial(_append_profile, os.path.join(args.out, "dynamic_shapes_profile.txt"))
    for name in args.only or list(cases):
        rows.append(run_case(name, cases[name], dtype, compiled, cuda, profile if args.profile else None))
        text = markdown(rows, device, versions)  # written after each case: a long run keeps what it measured
        with open(os.path.join(args.out, "dynamic_shapes.json"), "w", encoding="utf-8") as fh:
            json.dump({"device": device, "provenance": measured_with, "rows": rows}, fh, indent=1)
        with open(os.path.join(args.out, "dynamic_shapes.md"), "w", encoding="utf-8") as fh:
            fh.write(text)
    print(markdown(rows, device, versions))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
