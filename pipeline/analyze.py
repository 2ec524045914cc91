"""Analyze one Python file: one `Report` out, with what produced it for the steps after.

This is the engine both the CLI (in-process) and the language server (in a worker
subprocess) run:

    source -> discover classes -> import module -> configuration -> build on meta
           -> capture (one trace per branch path) -> detect -> cost -> patterns
           -> source map (`findings.py`) -> codegen (`kernels.py`) -> Report

Every failure in user code becomes a `Problem` at the user's line; one model failing
never hides the others.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from types import ModuleType

import torch

from fuselens.analysis import capture, cost, discover, loader, sourcemap
from fuselens.analysis.config import ModelClass, resolve_model
from fuselens.analysis.ops import OpClass
from fuselens.contracts import report as R
from fuselens.contracts.config import ConfigError, InputSpec, ModelConfig, find_pyproject, read_tool_table
from fuselens.contracts.options import AnalyzeOptions
from fuselens.contracts.version import TOOL_VERSION

from .findings import Found, findings
from .kernels import generate_kernels


@dataclass
class AnalyzedFile:
    """A file's report, and what the steps after the analysis (validate, compare) build on."""

    report: R.Report
    text: str
    module: ModuleType | None = None
    classes: dict[str, type] = field(default_factory=dict)  # the analyzed classes, by name
    configs: dict[str, ModelConfig] = field(default_factory=dict)  # each analyzed class's configuration
    user_code: capture.UserCode = field(default_factory=capture.UserCode)


def analyze_file(path: str, options: AnalyzeOptions | None = None) -> R.Report:
    return analyze(path, options).report


def analyze(path: str, options: AnalyzeOptions | None = None) -> AnalyzedFile:
    return _analyze(os.path.abspath(path), options or AnalyzeOptions())


def _analyze(path: str, options: AnalyzeOptions) -> AnalyzedFile:
    text = options.source_text
    if text is None:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    profile = cost.device_profile(options.device, options.peak_gbps)
    report = R.Report(
        file=path,
        source_sha256=hashlib.sha256(text.encode()).hexdigest(),
        device=R.DeviceInfo(profile.name, profile.peak_gbps, profile.l2_bytes, profile.launch_us),
        torch_version=torch.__version__,
        tool_version=TOOL_VERSION,
    )
    analyzed = AnalyzedFile(report, text)
    try:
        source = sourcemap.SourceIndex(path, text)
    except SyntaxError as exc:
        report.problems.append(R.Problem("syntax", f"SyntaxError: {exc.msg}", path, exc.lineno, exc.offset))
        return analyzed
    classes = discover.find_classes(text)
    if options.model_class and options.model_class not in {c.name for c in classes}:
        names = ", ".join(c.name for c in classes) or "none"
        report.problems.append(
            R.Problem("inputs", f"no nn.Module class {options.model_class!r} in this file (found: {names})", path, 1)
        )
        return analyzed
    if not classes:
        return analyzed
    try:
        analyzed.module = loader.import_file(path, analyzed.user_code, text)
    except loader.LoadError as exc:
        report.problems.append(load_problem(exc, path))
        return analyzed
    file = _FileContext(
        path,
        options,
        profile,
        source,
        analyzed,
        _tool_table(report, path),
        {c.name for c in discover.top_level(classes)},
    )
    available = loader.model_classes(analyzed.module)
    found: list[list[Found]] = []
    for info in classes:
        if info.name not in available or (options.model_class and info.name != options.model_class):
            continue
        model, model_found = _analyze_model(info, available[info.name], file)
        report.models.append(model)
        found.append(model_found)
    _note_parents(report, classes)
    generate_kernels(report, found, source, options.out_dir)
    return analyzed


def _tool_table(report: R.Report, path: str) -> tuple[dict, str | None]:
    """`[tool.fuselens]` of the nearest pyproject.toml, and its path; a broken one is a problem."""
    pyproject = find_pyproject(path)
    try:
        return read_tool_table(pyproject), pyproject
    except ConfigError as exc:
        report.problems.append(R.Problem("inputs", str(exc), path, 1))
        return {}, pyproject


@dataclass
class _FileContext:
    """What every model of one file is analyzed with."""

    path: str
    options: AnalyzeOptions
    profile: cost.DeviceProfile
    source: sourcemap.SourceIndex
    analyzed: AnalyzedFile
    tool: tuple[dict, str | None]  # ([tool.fuselens], the pyproject.toml it came from)
    outermost: set[str]  # classes no other class of the file uses


def _note_parents(report: R.Report, classes: list[discover.ClassInfo]) -> None:
    """A class skipped for want of inputs is still analyzed inside the models that use it: say so."""
    analyzed = [m.name for m in report.models if m.status == "analyzed"]
    for model in report.models:
        if model.status == "skipped" and analyzed:
            parents = [n for n in analyzed if model.name in _used_by(classes, n)]
            if parents:
                model.notes.append(f"its code is analyzed inside {', '.join(parents)}")


def _used_by(classes: list[discover.ClassInfo], name: str, seen: frozenset[str] = frozenset()) -> set[str]:
    by_name = {c.name: c for c in classes}
    info = by_name.get(name)
    if info is None or name in seen:
        return set()
    direct = (info.references & set(by_name)) - {name}
    out = set(direct)
    for d in direct:
        out |= _used_by(classes, d, seen | {name})
    return out


def problem_at(kind: str, message: str, frame, path: str, hint: str = "") -> R.Problem:
    """A problem at the user's frame, or at the top of the file without one."""
    if frame is not None:
        return R.Problem(kind, message, frame.file, frame.line, None, hint)
    return R.Problem(kind, message, path, 1, None, hint)


def load_problem(exc: loader.LoadError, path: str) -> R.Problem:
    """A failure to import or build; running out of memory there reads as it does in a trace."""
    if exc.__cause__ is not None and capture.out_of_memory(exc.__cause__):
        return problem_at("memory", capture.describe_failure(exc.__cause__), exc.frame, path)
    return problem_at(exc.kind, str(exc), exc.frame, path, exc.hint)


# ---- one model -----------------------------------------------------------------------------


def configure(info: discover.ClassInfo, cls: type, file: _FileContext) -> ModelConfig:
    """The model's configuration from every source; `example_inputs()` runs only if it is needed."""
    model = ModelClass(info.name, info.line, info.comment, info.name in file.outermost)
    analyzed = file.analyzed

    def example_inputs() -> tuple[list[InputSpec], str] | None:
        assert analyzed.module is not None  # a class of it is being configured
        tensors, where = loader.user_example_inputs(analyzed.module, cls, model.outermost, analyzed.user_code)
        return (loader.specs_of(tensors), where) if tensors is not None else None

    table, pyproject = file.tool
    return resolve_model(model, file.options, table, pyproject, example_inputs)


def _analyze_model(info: discover.ClassInfo, cls: type, file: _FileContext) -> tuple[R.Model, list[Found]]:
    model = R.Model(name=info.name, file=file.path, line=info.line, status="analyzed")
    started = time.perf_counter()
    try:
        config = configure(info, cls, file)
    except ConfigError as exc:
        return _failed(model, R.Problem("inputs", str(exc), file.path, info.line)), []
    except loader.LoadError as exc:
        return _failed(model, load_problem(exc, file.path)), []
    if config.inputs is None:
        model.status = "skipped"
        model.problem = R.Problem(
            "inputs",
            f"{info.name}: no example inputs, so no shapes: costs are unknown",
            file.path,
            info.line,
            None,
            loader.hint_for_inputs(info.name),
        )
        return model, []
    model.inputs = [R.TensorInfo(s.shape, s.dtype) for s in config.inputs]
    model.inputs_source = config.inputs_source
    try:
        # Building on meta runs Python init kernels that would import torch._dynamo (over a second)
        # for nothing; the user's module was imported without the stand-in, exactly as Python would.
        with capture.without_dynamo_import():
            paths = _trace_paths(model, cls, config, file, started)
    except loader.LoadError as exc:
        return _failed(model, load_problem(exc, file.path)), []
    except capture.CaptureError as exc:
        return _failed(model, _trace_problem(exc, config, file.path)), []
    file.analyzed.classes[info.name] = cls
    file.analyzed.configs[info.name] = config
    started = time.perf_counter()
    found = findings(model, paths, file.source, file.profile)
    main = paths[0][0].graph
    model.graph_breaks = list(main.breaks)
    model.ops_total = sum(1 for n in main if n.cls is not OpClass.SOURCE and n.op != "output")
    model.totals.bytes_total = cost.model_bytes(main)
    model.timings_ms["analyze"] = _ms(started)
    return model, found


def _failed(model: R.Model, problem: R.Problem) -> R.Model:
    model.status = "error"
    model.problem = problem
    return model


def _trace_paths(
    model: R.Model, cls: type, config: ModelConfig, file: _FileContext, started: float
) -> list[tuple[capture.Trace, str]]:
    """Build the model and trace it: the main path, then each data-dependent branch the other way."""
    user_code = file.analyzed.user_code
    built = build_model(cls, config, user_code, loader.hint_for_init(model.name))
    if config.param_dtype:
        model.param_dtype = config.param_dtype
    if built.note:
        model.notes.append(built.note)
    model.timings_ms["build"] = _ms(started)
    started = time.perf_counter()
    tensors = loader.meta_inputs(config.inputs or [])
    names = loader.forward_input_names(built.model, len(tensors))
    for tensor_info, name in zip(model.inputs, names, strict=True):
        tensor_info.name = name
    main = capture.trace(built.model, tensors, names, user_code)
    paths = [(main, "")]
    for i in range(min(len(main.branches), file.options.branch_paths)):
        decisions = [*main.branches[:i], not main.branches[i]]
        try:
            alt = capture.trace(built.model, tensors, names, user_code, decisions)
        except capture.CaptureError:
            continue
        brk = main.graph.breaks[i]
        paths.append((alt, f"on the path where the condition on line {brk.line} is {decisions[-1]}"))
    model.timings_ms["trace"] = _ms(started)
    return paths


def build_model(cls: type, config: ModelConfig, user_code: capture.UserCode, init_hint: str = "") -> loader.Built:
    """`cls(**init)` on the meta device, with its weights cast to the configured dtype."""
    return loader.build(cls, config.init, user_code, init_hint, config.param_dtype)


def _trace_problem(exc: capture.CaptureError, config: ModelConfig, path: str) -> R.Problem:
    inputs = config.inputs or []
    shapes = ", ".join(s.describe() for s in inputs)
    message = str(exc) if exc.kind == "memory" else f"forward() failed: {exc}"
    hint = f"traced with example inputs {shapes} from {config.inputs_source}"
    if capture.wants_integer_inputs(exc) and any(not s.dtype.startswith(("int", "uint")) for s in inputs):
        hint += (
            "; the model looks up token ids, so give it integer inputs: `--dtype int64`, "
            '`dtype = "int64"` in pyproject.toml, or `input=(2, 64) int64` in the comment'
        )
    return problem_at(exc.kind, message, exc.frame, path, hint)


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 2)
