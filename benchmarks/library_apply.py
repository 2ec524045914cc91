"""Do the library models' clusters apply, and do the patched models compute what the library does?

    python benchmarks/library_apply.py [--only llama --only unet2d] [--json OUT]

For every model of the corpus (`tests/library_corpus.py`: transformers and diffusers models at tiny
random-init configurations, written as a user writes them), in a fresh child process with the Triton
interpreter on (`TRITON_INTERPRET=1`, so the kernels run on the CPU):

1. the user's file is analyzed: its clusters, how many apply (`applies`: a library patch or an edit),
   and for the others why not (`apply_detail`);
2. `fuselens apply` (`pipeline/apply.py` `apply_file`) writes the kernel module and edits the file in a
   temporary folder; the file is imported as a script imports it, which runs the kernel module's
   `install()`;
3. each kernel of the kernel module is wrapped with a counter before anything runs, so the table says
   how many kernel launches ran, and how many calls of a cluster's function ran no kernel (it ran its
   torch code instead: a dtype, a device or a gradient the kernel was not made for);
4. the model (the one object, its weights as the file made them) runs with the patches installed and
   then with them uninstalled (the library's own code), on the same inputs: in eval mode; in training
   mode, dropout probabilities 0, its outputs and its parameters' gradients (of a seeded random
   projection of the outputs); and in eval mode at another batch and sequence length;
5. `fuselens restore --yes` puts the file back, which must then be byte for byte what the user wrote.

A markdown table is printed, one row per model, and the reasons the clusters that do not apply give,
grouped with their counts.  A model that fails at any step says so in its row; the others go on.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from library_corpus import ALL_CASES, Case  # noqa: E402  (the tests' corpus, from their folder)

TOLERANCE = 1e-4  # fp32 on both sides: the kernels' order of summation against torch's
CHILD_SECONDS = 600


# ---- the child: one model --------------------------------------------------------------------------


def child(case_id: str, folder: str) -> dict[str, Any]:
    """Analyze, apply, check and restore one case; a dict of what was found (`error`: where it stopped)."""
    import torch

    torch.set_num_threads(1)
    case = next(c for c in ALL_CASES if c.id == case_id)
    out: dict[str, Any] = {"id": case.id}
    try:
        _run(case, folder, out)
    except Exception as exc:  # the row says where and why; the benchmark goes on with the next model
        out["error"] = f"{out.get('step', '?')}: {type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()[-3000:]
    return out


def _run(case: Case, folder: str, out: dict[str, Any]) -> None:
    import torch

    from fuselens.contracts.options import AnalyzeOptions
    from fuselens.pipeline.analyze import analyze_file
    from fuselens.pipeline.apply import apply_file

    out["step"] = "analyze"
    path = case.write(folder)
    with open(path, "rb") as fh:
        written = fh.read()
    start = time.perf_counter()
    report = analyze_file(path)
    out["analysis_s"] = time.perf_counter() - start
    if report.problems:
        raise RuntimeError("; ".join(p.message for p in report.problems))
    (model_report,) = [m for m in report.models if m.status == "analyzed"]
    clusters = model_report.clusters
    out["clusters"] = len(clusters)
    out["applies"] = dict(collections.Counter(c.applies for c in clusters))
    out["not_applied"] = [c.apply_detail for c in clusters if c.applies == "no"]
    out["inputs"] = [(list(i.shape), i.dtype) for i in model_report.inputs]

    out["step"] = "apply"
    result = apply_file(path, AnalyzeOptions(), None, lambda r: True)
    if result.refused:
        raise RuntimeError(f"apply refused: {result.refused}")
    out["applied"] = len(result.applied)

    out["step"] = "import the applied file"
    torch.manual_seed(0)  # the weights the file's model is built with: the same in every run
    user, kernels = _import(path)
    counter = _LaunchCounter(kernels) if kernels is not None else None
    model = _model(user, case)

    try:
        _check(model, model_report, kernels, counter, out)
    except Exception as exc:  # said in the row; the file is still restored
        out["error"] = f"run: {type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()[-3000:]

    out["step"] = "restore"
    done = subprocess.run(
        [sys.executable, "-m", "fuselens.cli.main", "restore", "--yes", path],
        capture_output=True,
        text=True,
        cwd=folder,
        check=False,
    )
    with open(path, "rb") as fh:
        out["restored"] = fh.read() == written
    if done.returncode != 0:
        out["restore_error"] = (done.stdout + done.stderr)[-500:]
    out.pop("step")


def _check(model, model_report, kernels, counter: _LaunchCounter | None, out: dict[str, Any]) -> None:
    """The model with the patches installed against the library's own code, on the same weights (and
    buffers: training mode moves a batch norm's running statistics) and inputs."""
    import copy

    import torch

    inputs = _inputs(model_report.inputs, torch.Generator().manual_seed(0))
    other = _inputs(_other_shape(model_report.inputs), torch.Generator().manual_seed(1))
    out["other_inputs"] = [list(t.shape) for t in other]
    state = copy.deepcopy(model.state_dict())
    patched = _runs(model, inputs, other)
    if counter is not None:
        out["launches"] = counter.launches
        out["backward_launches"] = counter.backward_launches
        out["calls"] = counter.calls
        out["calls_without_kernel"] = counter.without_kernel
    if kernels is not None:
        kernels.uninstall()
    model.load_state_dict(state)
    original = _runs(model, inputs, other)
    out["eval"] = _compare(patched["eval"], original["eval"])
    out["train"] = _compare(patched["train"], original["train"])
    if not out["train"]["same"] and out["train"]["max_diff"] is not None:
        exact = _exact_training(model, state, inputs, other)
        if exact is not None:
            out["train"] = _compare(patched["train"], original["train"], exact)
    out["other"] = _compare(patched["other"], original["other"])


def _exact_training(model, state, inputs: list, other: list) -> list | None:
    """The library's training step in float64 (None where the model has no float64 kernels): a
    gradient the kernels sum in another order is judged by its accuracy against it, as `fuselens
    validate` judges it."""
    import copy

    wide = copy.deepcopy(model)
    wide.load_state_dict(state)
    wide.double()
    try:
        return _runs(wide, *([t.double() if t.is_floating_point() else t for t in ts] for ts in (inputs, other)))[
            "train"
        ]
    except (RuntimeError, TypeError, ValueError):
        return None


def _import(path: str):
    """The user's file imported as `python file.py` would run it (its folder first on sys.path), and
    the kernel module it imported (None when apply wrote none)."""
    from fuselens.codegen.edits import kernel_module_path

    folder = os.path.dirname(path)
    sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location("user_model", path)
    assert spec is not None and spec.loader is not None
    user = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(user)
    name = os.path.splitext(os.path.basename(kernel_module_path(path)))[0]
    return user, sys.modules.get(name)


def _model(user, case: Case):
    obj = getattr(user, "Seq2Seq" if "class Seq2Seq" in case.source else "model")
    model = obj() if isinstance(obj, type) else obj
    _no_dropout(model)
    return model.eval()


def _no_dropout(model) -> None:
    """Every dropout probability 0: a module's (`nn.Dropout.p`) and a number a module keeps for
    `F.dropout` (`self.attention_dropout`), so that training mode is deterministic."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "drop" in name.lower() and isinstance(value, float):
                setattr(module, name, 0.0)
    config = getattr(model, "config", None)
    for name in dir(config) if config is not None else ():
        if "dropout" in name and isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)


def _inputs(specs, generator) -> list:
    """Seeded inputs of the analyzed shapes: ids in [0, 8) (any vocabulary, timestep or class label
    takes them), masks all true, floats from N(0, 1)."""
    import torch

    tensors = []
    for spec in specs:
        shape = tuple(spec.shape)
        if spec.dtype == "bool":
            tensors.append(torch.ones(shape, dtype=torch.bool))
        elif spec.dtype.startswith("int"):
            tensors.append(torch.randint(0, 8, shape, generator=generator, dtype=getattr(torch, spec.dtype)))
        else:
            tensors.append(torch.randn(shape, generator=generator, dtype=getattr(torch, spec.dtype)))
    return tensors


def _other_shape(specs) -> list:
    """The inputs at another batch (one more) and, for token ids and their masks, a shorter sequence."""
    from dataclasses import replace

    others = []
    for spec in specs:
        shape = list(spec.shape)
        if shape:
            shape[0] += 1
        if len(shape) == 2 and (spec.dtype.startswith("int") or spec.dtype == "bool") and shape[1] >= 8:
            shape[1] = shape[1] * 3 // 4
        others.append(replace(spec, shape=shape))
    return others


def _runs(model, inputs: list, other: list) -> dict[str, list]:
    """The model's floating outputs in eval mode, its outputs and parameter gradients in training mode,
    and its eval outputs at the other shape."""
    import torch

    from fuselens.validate.whole import same_draws

    with torch.no_grad():
        evaluated = _outputs(model(*inputs))
        at_other = _outputs(model(*other))
    model.train()
    model.zero_grad(set_to_none=True)
    with same_draws():  # what a model draws in training mode (Wav2Vec2's time masks) is drawn alike both times
        outputs = _outputs(model(*inputs))
    generator = torch.Generator().manual_seed(2)
    loss = sum((o * torch.randn(o.shape, generator=generator)).sum() for o in outputs)
    loss.backward()
    grads = [(name, p.grad.detach().clone() if p.grad is not None else None) for name, p in model.named_parameters()]
    model.zero_grad(set_to_none=True)
    model.eval()
    return {"eval": evaluated, "train": [o.detach() for o in outputs] + grads, "other": at_other}


def _outputs(value) -> list:
    import torch

    if hasattr(value, "to_tuple"):
        value = value.to_tuple()
    leaves = torch.utils._pytree.tree_leaves(value)
    return [t.float() for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _compare(patched: list, original: list, exact: list | None = None) -> dict[str, Any]:
    """Whether the patched model's values are the library's: every tensor within the tolerance; a
    gradient within its sums' rounding, or (given the step in float64, `exact`) as accurate as the
    library's."""
    import torch

    from fuselens.validate.numerics import as_accurate_as_eager, sums_close

    if len(patched) != len(original) or not original:
        return {"same": False, "max_diff": None, "why": f"{len(patched)} values against {len(original)}"}
    worst, same, relative = 0.0, True, 0.0
    for k, (a, b) in enumerate(zip(patched, original, strict=True)):
        summed = isinstance(a, tuple)
        truth = exact[k] if exact is not None else None
        if summed:  # a parameter's gradient: (its name, the gradient or None)
            (name, a), (_, b) = a, b
            truth = truth[1] if truth is not None else None
            if (a is None) != (b is None):
                return {
                    "same": False,
                    "max_diff": None,
                    "why": f"{name} {'gets no' if a is None else 'gets a'} gradient",
                }
            if a is None:
                continue
        if a.shape != b.shape:
            return {"same": False, "max_diff": None, "why": f"shape {tuple(a.shape)} against {tuple(b.shape)}"}
        if a.numel():
            worst = max(worst, float((a - b).abs().max()))
        close = bool(torch.allclose(a, b, atol=TOLERANCE, rtol=TOLERANCE, equal_nan=True))
        if summed and not close:
            # A gradient sums over the batch and the positions, whose order differs between a kernel
            # and torch: judged by its difference against its own size, as `fuselens validate` does.
            sums = sums_close(a, b)
            relative, close = max(relative, sums.relative), sums.ok
            if not close and truth is not None:
                close = as_accurate_as_eager(a, b, truth).ok
        same = same and close
    return {"same": same, "max_diff": worst} | ({"gradient_relative_diff": relative} if relative else {})


class _LaunchCounter:
    """Counts what the kernel module runs: each launch of a Triton kernel (the launchers look their
    kernels up in the module's namespace at every launch), and each time the patched code asked a
    kernel whether it fits a call (`clusterN.fits`), with the times it did not (the library's lines
    ran instead: a dtype, a device, a rank, a module or a mode the kernel was not made for)."""

    _KERNEL = re.compile(r"^_cluster\d+\w*_kernel\w*$")
    _PUBLIC = re.compile(r"^cluster\d+$")

    def __init__(self, module) -> None:
        self.launches = 0
        self.backward_launches = 0
        self.calls = 0
        self.without_kernel = 0
        for name, value in list(vars(module).items()):
            if self._KERNEL.match(name) and hasattr(value, "__getitem__"):
                setattr(module, name, _CountedKernel(value, self, "_backward" in name))
            elif self._PUBLIC.match(name) and callable(getattr(value, "fits", None)):
                value.fits = self._counted_fits(value.fits)

    def _counted_fits(self, fits):
        def asked(*args, **kwargs):
            self.calls += 1
            answer = fits(*args, **kwargs)
            if not answer:
                self.without_kernel += 1
            return answer

        return asked


class _CountedKernel:
    def __init__(self, kernel, counter: _LaunchCounter, backward: bool) -> None:
        self._kernel, self._counter, self._backward = kernel, counter, backward

    def __getitem__(self, grid):
        launch = self._kernel[grid]

        def run(*args, **kwargs):
            if self._backward:
                self._counter.backward_launches += 1
            else:
                self._counter.launches += 1
            return launch(*args, **kwargs)

        return run

    def __getattr__(self, name):
        return getattr(self._kernel, name)


# ---- the parent: every model, and the table --------------------------------------------------------


def measure(case: Case, folder: str) -> dict[str, Any]:
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "PYTHONWARNINGS": "ignore",
    }
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child", case.id, os.path.join(folder, case.id)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=CHILD_SECONDS,
        )
    except subprocess.TimeoutExpired:
        return {"id": case.id, "error": f"the child ran past {CHILD_SECONDS} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"id": case.id, "error": f"the child exited {done.returncode}: {done.stderr.strip()[-600:]}"}
    result = json.loads(lines[-1])
    result["seconds"] = time.perf_counter() - start
    return result


HEADER = [
    "model",
    "clusters",
    "applicable",
    "eval = original",
    "train = original",
    "other shape = original",
    "kernel launches (fwd + bwd)",
    "asked, not fitting",
    "restore byte-identical",
]


def _equal_cell(result: dict[str, Any], key: str) -> str:
    check = result.get(key)
    if check is None:
        return "—"
    diff = "n/a" if check["max_diff"] is None else f"{check['max_diff']:.1e}"
    return f"{'yes' if check['same'] else '**no**'} ({check.get('why') or diff})"


def row(case: Case, result: dict[str, Any]) -> list[str]:
    clusters = result.get("clusters")
    applies = result.get("applies", {})
    applicable = applies.get("patch", 0) + applies.get("edit", 0)
    cells = [
        case.architecture,
        "—" if clusters is None else str(clusters),
        "—" if not clusters else f"{applicable} ({100 * applicable / clusters:.0f}%)",
        _equal_cell(result, "eval"),
        _equal_cell(result, "train"),
        _equal_cell(result, "other"),
        f"{result['launches']} + {result['backward_launches']}" if "launches" in result else "—",
        f"{result['calls_without_kernel']} of {result['calls']}" if "calls" in result else "—",
        "—" if "restored" not in result else ("yes" if result["restored"] else "**no**"),
    ]
    if result.get("error"):
        cells[0] += f" (failed: {_one_line(result['error'])})"
    return cells


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _reason(detail: str) -> str:
    """An `apply_detail` sentence with what names one place taken out (files, lines, names, numbers), so
    that the same reason in other places and models counts as one."""
    text = re.sub(r"^its code is in \S+ \([^)]*\), not in this file(; )?", "", detail)
    text = re.sub(r"`[^`]*`", "`…`", text)
    text = re.sub(r"\b[\w./-]+\.py\b", "FILE", text)
    text = re.sub(r"\bline \d+\b", "line N", text)
    text = re.sub(r"\blines \d+–\d+\b", "lines N–M", text)
    text = re.sub(r"\b\d+\b", "N", text)
    return text or "its code is in a library file, not in this file (no other reason given)"


def reasons(results: list[dict[str, Any]]) -> list[tuple[str, int]]:
    counts = collections.Counter(_reason(d) for r in results for d in r.get("not_applied", []))
    return counts.most_common()


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def versions() -> str:
    import importlib.metadata as metadata

    found = []
    for name in ("torch", "triton", "transformers", "diffusers"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} not installed")
    return ", ".join(found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=2, metavar=("CASE", "FOLDER"), help=argparse.SUPPRESS)
    parser.add_argument("--only", action="append", help="case ids to run (default: all)")
    parser.add_argument("--json", metavar="OUT", help="also write every model's results as JSON")
    parser.add_argument(
        "--merge", metavar="JSON", help="an earlier run's --json: the models --only leaves out are its (one table)"
    )
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    cases = [c for c in ALL_CASES if not args.only or c.id in args.only]
    earlier: dict[str, dict[str, Any]] = {}
    if args.merge:
        with open(args.merge, encoding="utf-8") as fh:
            earlier = {r["id"]: r for r in json.load(fh)["models"]}
        cases = [c for c in ALL_CASES if c.id in earlier or c in cases]
    results = []
    with tempfile.TemporaryDirectory(prefix="fuselens-apply-") as tmp:
        for case in cases:
            if case.id in earlier and not (args.only and case.id in args.only):
                results.append(earlier[case.id])
                continue
            print(f"… {case.id}", file=sys.stderr, flush=True)
            result = measure(case, tmp)
            if result.get("error"):
                print(f"  {case.id}: {result['error']}", file=sys.stderr, flush=True)
            results.append(result)
            shutil.rmtree(os.path.join(tmp, case.id), ignore_errors=True)
    print(f"Python {platform.python_version()}, {versions()}; ran on {machine()}; kernels in the Triton interpreter\n")
    print("| " + " | ".join(HEADER) + " |")
    print("|---|" + "---:|" * (len(HEADER) - 1))
    for case, result in zip(cases, results, strict=True):
        print("| " + " | ".join(row(case, result)) + " |")
    total = sum(r.get("clusters", 0) for r in results)
    applicable = sum(r.get("applies", {}).get("patch", 0) + r.get("applies", {}).get("edit", 0) for r in results)
    share = f"{100 * applicable / total:.0f}%" if total else "n/a"
    right = sum(all(r.get(k, {}).get("same") for k in ("eval", "train", "other")) for r in results)
    restored = sum(bool(r.get("restored")) for r in results)
    print(
        f"\n{applicable} of {total} clusters applicable ({share}) over {len(results)} models; patched == original "
        f"in eval, training and at the other shape: {right} of {len(results)}; restore byte-identical: "
        f"{restored} of {len(results)}; failed: {sum(bool(r.get('error')) for r in results)}"
    )
    print("\nWhy the other clusters do not apply (`apply_detail`, places taken out), with how many:\n")
    print("| reason | clusters |\n|---|---:|")
    for reason, count in reasons(results):
        print(f"| {_one_line(reason, 400)} | {count} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"versions": versions(), "machine": machine(), "models": results}, fh, indent=1)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
