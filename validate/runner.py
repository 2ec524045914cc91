"""Validation: run every generated kernel on real values and compare with eager.

1. Analyse the file (kernels are generated for the example shapes).
2. Pick smaller shapes that keep the same clusters (`shapes.py`).
3. Build the model with real, seeded weights and trace it on random inputs, keeping
   every value: the tensors flowing into and out of each cluster are the test data.
4. Call each cluster's kernel on its recorded inputs and compare with its recorded
   outputs (`numerics.py`), for every instance of a repeated cluster.
5. Apply every exact cluster to a copy of the file and check the patched model's
   outputs against the original model's.

Kernels run in the Triton interpreter on CPU (`interpret=True`) or on CUDA.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

import torch

from fuselens.analysis import capture, loader
from fuselens.analysis.detect import detect
from fuselens.analysis.inputs import InputSpec
from fuselens.analysis.report import Cluster, Model, Report
from fuselens.codegen import edits as edits_mod
from fuselens.codegen.plan import check, plan_cluster
from fuselens.codegen.module import module_for_report
from fuselens.worker.analyze import AnalyzeOptions, analyze_file

from .numerics import TF32, compare, narrowest
from .replay import cluster_function
from .results import ClusterCheck, ModelCheck, ModelValidation, Timing, ValidationReport
from .shapes import scaled_specs

Progress = Callable[[str, float | None], None]  # (message, fraction done or None)


@dataclass
class ValidateOptions:
    interpret: bool = False
    clusters: list[str] | None = None  # cluster ids; None: all
    benchmark: bool = True  # time kernels (CUDA only)
    seed: int = 0
    shapes: list[InputSpec] | None = None  # validate at these instead of choosing
    peak_gbps: float | None = None  # bandwidth ceiling for "% of peak" (default: measured copy)


def validate_file(path: str, analyze: AnalyzeOptions, options: ValidateOptions,
                  progress: Progress | None = None) -> ValidationReport:
    progress = progress or (lambda message, fraction=None: None)
    cuda = torch.cuda.is_available()
    mode = "interpret" if options.interpret or not cuda else "cuda"
    device = "cuda" if mode == "cuda" else "cpu"
    report = ValidationReport(os.path.abspath(path), mode, torch.cuda.get_device_name() if mode == "cuda" else "cpu")
    report.versions = {"torch": torch.__version__}
    if mode == "interpret":
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton

        report.versions["triton"] = triton.__version__
    except ImportError:
        report.problems.append("triton is not installed: `pip install triton` (on CPU, `pip install triton==3.8.0 numpy`)")
        return report
    if not cuda and not options.interpret:
        report.problems.append("no CUDA device here: run with --interpret to check numerics in the Triton "
                               "interpreter on CPU, or use a remote runner with a GPU")
        return report
    progress("analysing", 0.0)
    analysis = analyze_file(path, analyze)
    if analysis.problems:
        report.problems += [f"{p.file}:{p.line}: {p.message}" for p in analysis.problems]
        return report
    with tempfile.TemporaryDirectory(prefix="fuselens-validate-") as tmp:
        kernels = load_kernel_module(analysis, os.path.join(tmp, os.path.basename(edits_mod.kernel_module_path(path))))
        models = [m for m in analysis.models if m.status == "analysed" and m.clusters]
        for index, model in enumerate(models):
            progress(f"validating {model.name}", index / max(len(models), 1))
            report.models.append(_validate_model(path, analysis, model, kernels, analyze, options, device, tmp, progress))
    progress("done", 1.0)
    return report


def load_kernel_module(report: Report, module_path: str):
    """Write the kernel module for `report` to `module_path` and import it, as a module of its own."""
    with open(module_path, "w", encoding="utf-8") as fh:
        fh.write(module_for_report(report))
    name = f"fuselens_kernels_{abs(hash(module_path))}"
    spec = importlib.util.spec_from_file_location(name, module_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _signature_of_plan(graph, plan) -> tuple:
    return tuple((graph[i].op, os.path.abspath(graph[i].source.file) if graph[i].source else "", graph[i].line)
                 for i in plan.compute)


def _signature_of_cluster(cluster: Cluster) -> tuple:
    return tuple((op.target, os.path.abspath(op.file) if op.file else "", op.line) for op in cluster.ops)


def _model_class(path: str, name: str, user_code):
    module = loader.import_file(path, user_code)
    return module, loader.model_classes(module)[name]


def _validate_model(path, analysis: Report, model: Model, kernels, analyze: AnalyzeOptions,
                    options: ValidateOptions, device: str, tmp: str, progress: Progress) -> ModelValidation:
    user_code = capture.UserCode()
    _, cls = _model_class(path, model.name, user_code)
    specs = [InputSpec(list(i.shape), i.dtype) for i in model.inputs]
    init = _init_of(analysis, model, analyze)
    meta_model = loader.build(cls, init, user_code, "").model
    param_dtype = getattr(torch, model.param_dtype) if model.param_dtype else None
    if param_dtype is not None:
        meta_model = meta_model.to(param_dtype)
    names = [i.name or f"input{k}" for k, i in enumerate(model.inputs)]

    def signatures(trial: list[InputSpec]):
        try:
            t = capture.trace(meta_model, loader.meta_inputs(trial), names, user_code)
        except capture.CaptureError:
            return None
        det = detect(t.graph, check)
        plans = [plan_cluster(t.graph, c.members) for c in det.clusters]
        return ({_signature_of_plan(t.graph, p) for p in plans},
                max((_numel(p.domain) for p in plans), default=0))

    if options.shapes:
        shapes = options.shapes
    elif device == "cpu":
        shapes = scaled_specs(specs, signatures)
    else:
        shapes = specs
    result = ModelValidation(model.name, [s.shape for s in shapes], [s.dtype for s in shapes])
    torch.manual_seed(options.seed)
    real = loader.build_real(cls, init, options.seed)
    if param_dtype is not None:
        real = real.to(param_dtype)
    real = real.to(device)
    inputs = _random_inputs(shapes, device, options.seed)
    chosen = [c for c in model.clusters if c.kernel and (not options.clusters or c.id in options.clusters)]
    instances = _instances(real, inputs, names, user_code, need={_signature_of_cluster(c) for c in chosen})
    timing = options.benchmark and device == "cuda"
    peak = None
    if timing:
        from .gpu import copy_bandwidth_gbps

        peak = copy_bandwidth_gbps(options.peak_gbps)
    for cluster in chosen:
        progress(f"{model.name}: {cluster.id} ({cluster.op_chain})", None)
        found = instances.get(_signature_of_cluster(cluster), [])
        check_ = _check_cluster(cluster, found, kernels, device)
        if timing and check_.status == "verified":
            progress(f"{model.name}: timing {cluster.id}", None)
            check_.timing = _time_cluster(cluster, found[0], kernels, peak)
        result.clusters.append(check_)
    exact = [c.id for c in chosen if c.mapping == "exact" and c.edit is not None and not c.branch]
    precision = narrowest([getattr(torch, op.dtype) for c in model.clusters for op in c.ops if op.dtype]
                          + [i.dtype for i in inputs])
    result.model = _check_model(path, analysis, model, exact, init, param_dtype, inputs, device, tmp, options,
                                precision)
    if timing:
        _time_model(result, real, inputs)
    return result


def _time_cluster(cluster: Cluster, instance, kernels, peak: float) -> Timing:
    from fuselens.analysis.cost import cluster_bytes

    from .gpu import time_implementations

    graph, plan, values = instance
    args = [values[s.node] for s in plan.inputs]
    _, fused_bytes = cluster_bytes(graph, plan.compute, [s.node for s in plan.inputs], [o.node for o in plan.outputs])
    figures = time_implementations(cluster_function(graph, plan, values), getattr(kernels, cluster.kernel.name), args,
                                   fused_bytes, peak)
    return Timing(**figures)


def _time_model(result: ModelValidation, model, inputs) -> None:
    """Whole-forward time, and the speedup if every cluster instance ran at its fused time."""
    from .gpu import time_each_us

    if result.model is None:
        result.model = ModelCheck("skipped")
    if result.model.eager_us is None:
        with torch.no_grad():
            result.model.eager_us = round(time_each_us({"eager": lambda: model(*inputs)})["eager"], 2)
    total = result.model.eager_us
    saved = sum((c.timing.eager_us - c.timing.fused_us) * c.instances for c in result.clusters if c.timing)
    if 0 < saved < total:
        result.model.amdahl_speedup = round(total / (total - saved), 3)


def _instances(model, inputs, names, user_code, need: set) -> dict[tuple, list]:
    """Cluster signature -> [(plan, recorded values)] from real traces.  Each data-dependent
    branch is also followed the other way, so clusters on either side get real data."""
    traced = capture.trace(model, inputs, names, user_code, real=True)
    found = _collect(traced)
    for i in range(len(traced.branches)):
        if need <= set(found):
            break
        flipped = traced.branches[:i] + [not traced.branches[i]]
        try:
            other = capture.trace(model, inputs, names, user_code, decisions=flipped, real=True)
        except capture.CaptureError:
            continue
        for signature, items in _collect(other).items():
            found.setdefault(signature, items)
    return found


def _collect(traced) -> dict[tuple, list]:
    found: dict[tuple, list] = {}
    for group in detect(traced.graph, check).clusters:
        plan = plan_cluster(traced.graph, group.members)
        found.setdefault(_signature_of_plan(traced.graph, plan), []).append((traced.graph, plan, traced.values))
    return found


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _init_of(analysis: Report, model: Model, analyze: AnalyzeOptions) -> dict:
    from fuselens.analysis import discover, inputs as inputs_mod

    with open(analysis.file, encoding="utf-8") as fh:
        text = fh.read()
    info = next(c for c in discover.find_classes(text) if c.name == model.name)
    config = inputs_mod.from_comment(info.comment, "comment")
    table = inputs_mod.read_tool_table(inputs_mod.find_pyproject(analysis.file))
    project = inputs_mod.from_pyproject(table, model.name, "pyproject.toml")
    init = dict(config.init)
    init.update(project.init)
    init.update(analyze.models.get(model.name, {}).get("init", {}))
    return init


def _random_inputs(specs: list[InputSpec], device: str, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for spec in specs:
        dtype = getattr(torch, spec.dtype)
        if dtype.is_floating_point:
            t = torch.randn(spec.shape, generator=gen).to(dtype)
        elif dtype == torch.bool:
            t = torch.randint(0, 2, spec.shape, generator=gen).bool()
        else:  # token ids and other integer inputs: small values any vocabulary accepts
            t = torch.randint(0, 16, spec.shape, generator=gen).to(dtype)
        out.append(t.to(device))
    return out


def _check_cluster(cluster: Cluster, plans: list, kernels, device: str) -> ClusterCheck:
    check_ = ClusterCheck(cluster.id, cluster.kernel.name, "not-reached", cluster.op_chain, cluster.regime,
                          cluster.bytes_unfused, cluster.bytes_fused)
    if not plans:
        check_.message = ("not reached at the validation shapes with these inputs"
                          + (f" ({cluster.branch})" if cluster.branch else ""))
        return check_
    fn = getattr(kernels, cluster.kernel.name)
    precision = narrowest([getattr(torch, op.dtype) for op in cluster.ops if op.dtype]
                          + [getattr(torch, i.dtype) for i in cluster.inputs])
    worst = None
    for _, plan, values in plans:
        args = [values[s.node] for s in plan.inputs]
        expected = [values[o.node] for o in plan.outputs]
        check_.shapes = [list(a.shape) for a in args]
        try:
            got = fn(*args)
        except Exception as exc:  # a failing kernel is a finding, not a crash
            check_.status = "error"
            check_.message = _kernel_error(exc)
            return check_
        got = list(got) if isinstance(got, (tuple, list)) else [got]
        for actual, want in zip(got, expected):
            cmp = compare(actual, want, precision)
            if worst is None or (worst.ok and (not cmp.ok or cmp.max_abs > worst.max_abs)):
                worst = cmp
        check_.instances += 1
    check_.max_abs, check_.max_rel = worst.max_abs, worst.max_rel
    check_.atol, check_.rtol = worst.atol, worst.rtol
    check_.status = "verified" if worst.ok else "mismatch"
    check_.message = worst.message
    return check_


def _kernel_error(exc: Exception) -> str:
    """One readable message; for a Triton compile error, the generated line it points at."""
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    if "CompilationError" in type(exc).__name__ and len(lines) > 1:
        pointed = next((i for i, line in enumerate(lines) if line.strip().startswith("^")), None)
        code = lines[pointed - 1].strip() if pointed else lines[1].strip()
        reason = lines[-1].strip()
        return f"the generated kernel does not compile: {reason} at `{code}` ({lines[0].strip()})"
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _check_model(path, analysis: Report, model: Model, exact: list[str], init, param_dtype, inputs, device, tmp,
                 options: ValidateOptions, precision) -> ModelCheck:
    if not exact:
        return ModelCheck("skipped", message="no cluster maps exactly, so nothing can be patched in")
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    patched = edits_mod.apply_line_edits(source, edits_mod.cluster_edits(source, analysis, exact))
    patched_path = os.path.join(tmp, os.path.basename(path))
    with open(patched_path, "w", encoding="utf-8") as fh:
        fh.write(patched)
    user_code = capture.UserCode()
    kernel_module = os.path.splitext(os.path.basename(edits_mod.kernel_module_path(path)))[0]
    sys.modules.pop(kernel_module, None)  # the patched file must import the module just generated
    try:
        original_module = loader.import_file(path, user_code)
        patched_module = loader.import_file(patched_path, user_code)
    except loader.LoadError as exc:
        return ModelCheck("error", exact, message=f"the patched file does not import: {exc}")
    finally:
        if tmp in sys.path:
            sys.path.remove(tmp)
    original = loader.build_real(loader.model_classes(original_module)[model.name], init, options.seed)
    fused = loader.build_real(loader.model_classes(patched_module)[model.name], init, options.seed)
    fused.load_state_dict(original.state_dict())
    if param_dtype is not None:
        original, fused = original.to(param_dtype), fused.to(param_dtype)
    original, fused = original.to(device), fused.to(device)
    with torch.no_grad():
        want = original(*inputs)
        try:
            got = fused(*inputs)
        except Exception as exc:
            return ModelCheck("error", exact, message=f"the patched model failed: {type(exc).__name__}: {exc}")
    worst = None
    tf32 = device == "cuda" and (torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32)
    for a, e in zip(capture.tensors_in(got), capture.tensors_in(want)):
        cmp = compare(a, e, precision, TF32 if tf32 else None)
        if worst is None or (worst.ok and (not cmp.ok or cmp.max_abs > worst.max_abs)):
            worst = cmp
    if worst is None:
        return ModelCheck("skipped", exact, message="the model returns no tensors")
    check_ = ModelCheck("matches" if worst.ok else "mismatch", exact, worst.max_abs, worst.max_rel, worst.message)
    if options.benchmark and device == "cuda" and worst.ok:
        from .gpu import time_each_us

        with torch.no_grad():
            times = time_each_us({"eager": lambda: original(*inputs), "patched": lambda: fused(*inputs)})
        check_.eager_us, check_.patched_us = round(times["eager"], 2), round(times["patched"], 2)
        check_.speedup = round(check_.eager_us / check_.patched_us, 3)
    return check_
