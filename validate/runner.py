"""Validation: run every generated kernel of a report on real values and compare with eager.

The pipeline (`pipeline/validate.py`) analyzes the file; this layer takes the report, the
classes it analyzed and the configuration each was built with, and:

1. writes and imports the report's kernel module;
2. picks smaller shapes that keep the same clusters (`shapes.py`);
3. builds the model with real, seeded weights and traces it on random inputs, keeping
   every value: the tensors flowing into and out of each cluster are the test data;
4. calls each cluster's kernel on its recorded inputs and compares with its recorded
   outputs (`numerics.py`), for every instance of a repeated cluster;
5. applies every exact cluster to a copy of the file and checks the patched model's
   outputs against the original model's.

Kernels run in the Triton interpreter on CPU (`interpret=True`) or on CUDA.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import tempfile
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

import torch

from fuselens.analysis import capture, loader, weights
from fuselens.analysis.detect import Group, detect
from fuselens.analysis.graph import Graph
from fuselens.analysis.instances import groups_of
from fuselens.codegen import edits as edits_mod
from fuselens.codegen.module import module_for_report
from fuselens.codegen.plan import KernelPlan, check, plan_cluster, returned_outputs
from fuselens.contracts.config import InputSpec
from fuselens.contracts.dynamic import describe_binding
from fuselens.contracts.options import Progress, ValidateOptions
from fuselens.contracts.report import Cluster, Kernel, Model, Report
from fuselens.contracts.validation import NO_CUDA, ClusterCheck, ModelCheck, ModelValidation, Timing, ValidationReport

from .bindings import specs_at, validation_bindings
from .gemms import compare_paths
from .gradients import check_gradients, time_training
from .interpreter import imported_problem, interpreting, loop_problem
from .numerics import compare, narrowest
from .replay import cluster_function
from .shapes import scaled_specs, traced_signatures
from .whole import check_patched_model, other_sizes


@dataclass
class Subject:
    """One analyzed model to validate: where it comes from and the configuration the analysis built it with."""

    source: loader.ModelSource
    init: dict[str, Any] = field(default_factory=dict)
    param_dtype: str | None = None

    def meta(self, user_code: capture.UserCode) -> torch.nn.Module:
        return loader.build_source(self.source, self.init, user_code, self.param_dtype).model

    def real(self, seed: int, user_code: capture.UserCode) -> torch.nn.Module:
        """The model with real weights: a class built on the CPU with its own initialisation; a model object
        bound at module level given its own small tensors and seeded random weights."""
        if self.source.instance is None:
            return loader.build_real(self.source.cls, self.init, seed, self.param_dtype)
        return loader.build_source(self.source, self.init, user_code, self.param_dtype).real(seed)

    def patched(self, module: ModuleType, seed: int, user_code: capture.UserCode) -> torch.nn.Module:
        """The same model from the patched copy of the file (weights are loaded from the original after)."""
        name = self.source.name
        if self.source.instance is None:
            return loader.build_real(loader.model_classes(module)[name], self.init, seed, self.param_dtype)
        obj = getattr(module, name)
        source = loader.ModelSource(name, self.source.line, "", type(obj), True, obj, weights.to_meta(obj))
        return loader.build_source(source, self.init, user_code, self.param_dtype).real(seed)


def kernel_environment(options: ValidateOptions) -> contextlib.AbstractContextManager[None]:
    """Where a validation runs, from its `start` (before the model's file can import Triton) to its end:
    in the Triton interpreter when asked for or where no CUDA device is."""
    return interpreting(options.interpret or not torch.cuda.is_available())


def start(path: str, options: ValidateOptions) -> ValidationReport:
    """The validation report for `path`, with a problem already in it when kernels cannot run here.
    Called inside `kernel_environment(options)`."""
    cuda = torch.cuda.is_available()
    mode = "interpret" if options.interpret or not cuda else "cuda"
    report = ValidationReport(os.path.abspath(path), mode, torch.cuda.get_device_name() if mode == "cuda" else "cpu")
    report.versions = {"torch": torch.__version__}
    try:
        import triton

        report.versions["triton"] = triton.__version__
    except ImportError:
        report.problems.append(
            "triton is not installed: `pip install triton` (on CPU, `pip install triton==3.8.0 numpy`)"
        )
        return report
    if mode == "interpret" and (problem := imported_problem() or loop_problem()) is not None:
        report.problems.append(problem)
        return report
    if not cuda and not options.interpret:
        report.problems.append(
            f"{NO_CUDA}: run with --interpret to check numerics in the Triton "
            "interpreter on CPU, or use a remote runner with a GPU"
        )
    return report


def validate_report(
    result: ValidationReport,
    analysis: Report,
    text: str,
    subjects: dict[str, Subject],
    user_code: capture.UserCode,
    options: ValidateOptions,
    progress: Progress,
) -> ValidationReport:
    """Check the kernels of `analysis` (the report of `text`) model by model, into `result`."""
    if analysis.problems:
        result.problems += [f"{p.file}:{p.line}: {p.message}" for p in analysis.problems]
        return result
    device = "cuda" if result.mode == "cuda" else "cpu"
    with tempfile.TemporaryDirectory(prefix="fuselens-validate-") as tmp:
        module_path = os.path.join(tmp, os.path.basename(edits_mod.kernel_module_path(analysis.file)))
        kernels = load_kernel_module(analysis, module_path)
        models = [
            m
            for m in analysis.models
            if m.status == "analyzed" and (m.clusters or _rewrites(m, None)) and m.name in subjects
        ]
        for index, model in enumerate(models):
            progress(f"validating {model.name}", index / len(models))
            run = _ModelRun(analysis, text, model, subjects[model.name], user_code, kernels, options, device, tmp)
            result.models += _validate_at_each_binding(run, _model_part(progress, index, len(models)))
    progress("done", 1.0)
    return result


def _model_part(progress: Progress, index: int, models: int) -> Progress:
    """`progress` for the `index`th of `models` models: its fraction of the model, as one of the job."""

    def report(message: str, fraction: float | None = None) -> None:
        progress(message, None if fraction is None else (index + fraction) / models)

    return report


@dataclass
class _ModelRun:
    """What validating one model needs."""

    analysis: Report
    text: str  # the source the report was computed from
    model: Model
    subject: Subject
    user_code: capture.UserCode
    kernels: Any  # the imported kernel module
    options: ValidateOptions
    device: str
    tmp: str


def load_kernel_module(report: Report, module_path: str):
    """Write the kernel module for `report` to `module_path` and import it, as a module of its own."""
    with open(module_path, "w", encoding="utf-8") as fh:
        fh.write(module_for_report(report))
    name = f"fuselens_kernels_{abs(hash(module_path))}"
    spec = importlib.util.spec_from_file_location(name, module_path)
    if spec is None or spec.loader is None:  # only for a path without a source suffix; ours ends in .py
        raise ImportError(f"{module_path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _validate_at_each_binding(run: _ModelRun, progress: Progress) -> list[ModelValidation]:
    """The model's validation; for a model with declared dynamic sizes (and no shapes asked for), one at
    each of its bindings (`bindings.validation_bindings`): the kernels were made at one size and must
    compute what the lines do at every size of the range."""
    dynamic = run.model.dynamic
    if dynamic is None or run.options.shapes:
        return [_validate_model(run, progress)]
    specs = [InputSpec(list(i.shape or []), i.dtype, high=i.high) for i in run.model.inputs]
    points = validation_bindings(dynamic)
    out = []
    for k, binding in enumerate(points):
        progress(f"{run.model.name} at {describe_binding(binding)}", k / len(points))
        shapes = specs_at(specs, input_names(run.model), dynamic, binding)
        at = replace(run, options=replace(run.options, shapes=shapes))
        validation = _validate_model(at, _model_part(progress, k, len(points)))
        validation.binding = binding
        out.append(validation)
    return out


def _validate_model(run: _ModelRun, progress: Progress) -> ModelValidation:
    model, options = run.model, run.options
    shapes = _shapes(run)
    result = ModelValidation(model.name, [s.shape for s in shapes], [s.dtype for s in shapes])
    real = run.subject.real(options.seed, run.user_code).to(run.device)
    inputs = loader.random_inputs(shapes, run.device, options.seed)
    names = input_names(model)
    # Only clusters with a generated kernel can be checked: each is kept with it.
    chosen = [
        (c, c.kernel)
        for c in model.clusters
        if c.kernel is not None and (not options.clusters or c.id in options.clusters)
    ]
    instances = traced_instances(model, real, inputs, names, run.user_code)
    timing = options.benchmark and run.device == "cuda"
    peak = None
    if timing:
        from .gpu import copy_bandwidth_gbps

        peak = copy_bandwidth_gbps(options.peak_gbps)
    for done, (cluster, kernel) in enumerate(chosen):
        # The whole-model check after the clusters counts as one more step.
        progress(f"{model.name}: {cluster.id} ({cluster.op_chain})", done / (len(chosen) + 1))
        found = instances.get(cluster.id, [])
        check_ = _check_cluster(cluster, kernel, found, run.kernels, run.device)
        if check_.status == "verified":
            check_.backward = check_gradients(cluster, kernel, found, run.kernels, options.seed)
        if timing and check_.status == "verified" and peak is not None:
            progress(f"{model.name}: timing {cluster.id}", None)
            check_.timing = _time_cluster(kernel, found[0], run.kernels, peak, run.options.other_compile_modes)
            _compare_gemm_paths(check_, kernel, found[0], run.kernels)
            if check_.backward is not None and check_.backward.status == "verified":
                progress(f"{model.name}: timing {cluster.id}'s training step", None)
                check_.backward.timing = time_training(kernel, found[0], run.kernels, options.seed)
        result.clusters.append(check_)
    applied = [
        c.id for c, _ in chosen if (c.mapping == "exact" and c.edit is not None and not c.branch) or c.patch is not None
    ]
    applied += _rewrites(model, options.clusters)
    precision = narrowest(
        [getattr(torch, op.dtype) for c in model.clusters for op in c.ops if op.dtype] + [i.dtype for i in inputs]
    )
    progress(f"{model.name}: the whole model", len(chosen) / (len(chosen) + 1))
    result.model = _check_model(run, applied, inputs, precision)
    if timing:
        _time_model(result, real, inputs)
    return result


def _rewrites(model: Model, ids: list[str] | None) -> list[str]:
    """The ids of the model's source rewrites among `ids` (all of them when None): the whole-model check
    applies them with the clusters, as `fuselens apply` does."""
    return [p.rewrite.id for p in model.patterns if p.rewrite is not None and (not ids or p.rewrite.id in ids)]


def input_names(model: Model) -> list[str]:
    return [i.name or f"input{k}" for k, i in enumerate(model.inputs)]


def _shapes(run: _ModelRun) -> list[InputSpec]:
    """The shapes to validate at: the user's, or (in the interpreter) smaller ones with the same clusters."""
    specs = [InputSpec(list(i.shape or []), i.dtype, high=i.high) for i in run.model.inputs]
    if run.options.shapes:
        return run.options.shapes
    if run.device != "cpu":
        return specs
    signatures = traced_signatures(run.subject.meta(run.user_code), input_names(run.model), run.user_code)
    return scaled_specs(specs, signatures)


def _time_cluster(kernel: Kernel, instance, kernels, peak: float, other_modes: list[str]) -> Timing:
    from fuselens.analysis.cost import cluster_bytes

    from .gpu import time_implementations

    graph, plan, values = instance
    args = [values[s.node] for s in plan.inputs]
    _, fused_bytes = cluster_bytes(
        graph, plan.compute, [s.node for s in plan.inputs], [o.node for o in returned_outputs(plan)]
    )
    figures = time_implementations(
        cluster_function(graph, plan, values), getattr(kernels, kernel.name), args, fused_bytes, peak, other_modes
    )
    return Timing(**figures)


def _compare_gemm_paths(check_: ClusterCheck, kernel: Kernel, instance, kernels) -> None:
    """For a cluster that starts with a GEMM: its fused kernel against the library's path, and which one
    the kernel module keeps at the shape, in its timing and its message."""
    _, plan, values = instance
    if plan.gemm is None or check_.timing is None:
        return
    line = compare_paths(check_.timing, kernels, kernel.name, plan, [values[s.node] for s in plan.inputs])
    check_.message = f"{check_.message}; {line}" if check_.message else line


def _time_model(result: ModelValidation, model, inputs) -> None:
    """Whole-forward time, and the speedup if every cluster instance ran at its fused time."""
    from .gpu import time_each_us

    if result.model is None:
        result.model = ModelCheck("skipped")
    if result.model.eager_us is None:
        with torch.no_grad():
            result.model.eager_us = round(time_each_us({"eager": lambda: model(*inputs)})["eager"], 2)
    total = result.model.eager_us
    saved = sum(_saved_us(c) for c in result.clusters)
    if 0 < saved < total:
        result.model.amdahl_speedup = round(total / (total - saved), 3)


def _saved_us(check: ClusterCheck) -> float:
    """What fusing saves over all of a cluster's instances; nothing for a cluster not timed."""
    t = check.timing
    if t is None or t.eager_us is None or t.fused_us is None:
        return 0.0
    return (t.eager_us - t.fused_us) * check.instances


Instance = tuple[Graph, KernelPlan, dict[int, torch.Tensor]]  # a cluster's plan in a real trace, and its values


def traced_instances(
    report: Model, model: torch.nn.Module, inputs: list[torch.Tensor], names: list[str], user_code: capture.UserCode
) -> dict[str, list[Instance]]:
    """Cluster id -> the plan and recorded values of each of its instances.  Each instance is found at its
    own place among the clusters of a real trace that takes the analysis's decisions at data-dependent
    branches: same-looking clusters elsewhere in the model (the same lines, other inputs) never lend it
    their values."""
    traces: dict[int, tuple[Graph, list[Group], dict]] = {}
    found: dict[str, list[Instance]] = {}
    for cluster in report.clusters:
        if cluster.path not in traces:
            decisions = report.paths[cluster.path] if cluster.path < len(report.paths) else []
            traces[cluster.path] = _detected(model, inputs, names, user_code, decisions)
        graph, groups, values = traces[cluster.path]
        found[cluster.id] = [(graph, plan_cluster(graph, g.members), values) for g in groups_of(cluster, graph, groups)]
    return found


def _detected(
    model: torch.nn.Module,
    inputs: list[torch.Tensor],
    names: list[str],
    user_code: capture.UserCode,
    decisions: list[bool],
) -> tuple[Graph, list[Group], dict]:
    """The groups detection finds in a real trace, in its order, with the trace's values."""
    try:
        traced = capture.trace(model, inputs, names, user_code, decisions=decisions, real=True)
    except capture.CaptureError:
        return Graph(), [], {}
    return traced.graph, detect(traced.graph, check).clusters, traced.values or {}


def _check_cluster(cluster: Cluster, kernel: Kernel, plans: list, kernels, device: str) -> ClusterCheck:
    check_ = ClusterCheck(
        cluster.id,
        kernel.name,
        "not-reached",
        cluster.op_chain,
        cluster.regime,
        cluster.bytes_unfused,
        cluster.bytes_fused,
    )
    if not plans:
        check_.message = "not reached at the validation shapes with these inputs" + (
            f" ({cluster.branch})" if cluster.branch else ""
        )
        return check_
    fn = getattr(kernels, kernel.name)
    precision = narrowest(
        [getattr(torch, op.dtype) for op in cluster.ops if op.dtype] + [getattr(torch, i.dtype) for i in cluster.inputs]
    )
    worst = None
    for _, plan, values in plans:
        args = [values[s.node] for s in plan.inputs]
        expected = [values[o.node] for o in returned_outputs(plan)]
        check_.shapes = [list(a.shape) for a in args]
        try:
            got = fn(*args)
        except Exception as exc:  # a failing kernel is a finding, not a crash
            check_.status = "error"
            check_.message = _kernel_error(exc)
            return check_
        got = list(got) if isinstance(got, (tuple, list)) else [got]
        if len(got) != len(expected):
            check_.status = "error"
            check_.message = f"the kernel returned {len(got)} output(s) where the cluster has {len(expected)}"
            return check_
        for actual, want in zip(got, expected, strict=True):
            cmp = compare(actual, want, precision)
            check_.tolerance_ratio = max(check_.tolerance_ratio or 0.0, cmp.tolerance_ratio)
            if worst is None or (worst.ok and (not cmp.ok or cmp.max_abs > worst.max_abs)):
                worst = cmp
        check_.instances += 1
    if worst is None:  # a cluster without outputs: nothing was compared
        check_.status = "error"
        check_.message = "the cluster has no outputs to compare"
        return check_
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


def _check_model(
    run: _ModelRun, applied: list[str], inputs: list[torch.Tensor], precision: torch.dtype | None
) -> ModelCheck:
    """Apply every cluster that applies (edits and library patches) to a copy of the file; its model must
    compute what the original does (`whole.check_patched_model`)."""
    if not applied:
        return ModelCheck("skipped", message="no cluster applies, so nothing can be patched in")
    seed = run.options.seed

    def build(module: ModuleType | None) -> torch.nn.Module:
        if module is None:
            return run.subject.real(seed, run.user_code)
        return run.subject.patched(module, seed, run.user_code)

    others = loader.random_inputs(other_sizes(_shapes(run)), run.device, seed + 1)
    timing = run.options.benchmark and run.device == "cuda"
    return check_patched_model(
        run.analysis,
        run.text,
        applied,
        build,
        [inputs, others],
        precision,
        run.device,
        run.tmp,
        (lambda original, fused, check_: _time_patched(original, fused, check_, inputs)) if timing else None,
    )


def _time_patched(
    original: torch.nn.Module, fused: torch.nn.Module, check_: ModelCheck, inputs: list[torch.Tensor]
) -> None:
    if check_.status != "matches":
        return
    from .gpu import time_each_us

    original.eval(), fused.eval()
    with torch.no_grad():
        times = time_each_us({"eager": lambda: original(*inputs), "patched": lambda: fused(*inputs)})
    check_.eager_us, check_.patched_us = round(times["eager"], 2), round(times["patched"], 2)
    check_.speedup = round(check_.eager_us / check_.patched_us, 3)
