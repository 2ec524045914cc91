"""Analyze one Python file: one `Report` out, with what produced it for the steps after.

This is the engine both the CLI (in-process) and the language server (in a worker
subprocess) run:

    source -> discover classes -> import module -> configuration -> build on meta
           -> capture (one trace per branch path) -> detect -> cost -> patterns
           -> source map (`findings.py`) -> codegen (`kernels.py`) -> Report

With `code=False` (the editor's analysis on a save) the report's kernels keep no source and its
clusters no backward: everything else is as with them (`kernels.py`).

Every failure in user code becomes a `Problem` at the user's line; one model failing
never hides the others.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from fuselens.analysis import attention, capture, cost, discover, loader, packages, sourcemap
from fuselens.analysis.config import ModelClass, resolve_model
from fuselens.analysis.ops import OpClass
from fuselens.analysis.symbolic import SymbolicShapes
from fuselens.codegen.source_file import SourceError, read_source
from fuselens.contracts import report as R
from fuselens.contracts.config import ConfigError, InputSpec, ModelConfig, find_pyproject, read_tool_table
from fuselens.contracts.options import AnalyzeOptions
from fuselens.contracts.version import TOOL_VERSION

from . import dynamic
from .findings import Found, findings
from .kernels import generate_kernels


@dataclass
class AnalyzedFile:
    """A file's report, and what the steps after the analysis (validate, compare) build on."""

    report: R.Report
    text: str
    module: ModuleType | None = None
    sources: dict[str, loader.ModelSource] = field(default_factory=dict)  # the analyzed models, by name
    configs: dict[str, ModelConfig] = field(default_factory=dict)  # each analyzed class's configuration
    user_code: capture.UserCode = field(default_factory=capture.UserCode)


def analyze_file(path: str, options: AnalyzeOptions | None = None, code: bool = True) -> R.Report:
    return analyze(path, options, code).report


def analyze(path: str, options: AnalyzeOptions | None = None, code: bool = True) -> AnalyzedFile:
    """The file's report; `code`: with each kernel's source and each cluster's backward."""
    return _analyze(os.path.abspath(path), options or AnalyzeOptions(), code)


def _analyze(path: str, options: AnalyzeOptions, code: bool) -> AnalyzedFile:
    text = options.source_text
    unreadable = None
    if text is None:
        try:  # as Python reads it: by its byte-order mark or coding cookie, any line ending
            text = read_source(path).text
        except SourceError as exc:
            text, unreadable = "", R.Problem("syntax", str(exc), path, 1)
        except OSError as exc:
            text, unreadable = "", R.Problem("import", f"cannot read {path}: {exc.strerror or exc}", path, 1)
    profile = cost.device_profile(options.device, options.peak_gbps)
    report = R.Report(
        file=path,
        source_sha256=hashlib.sha256(text.encode()).hexdigest(),
        device=R.DeviceInfo(profile.name, profile.peak_gbps, profile.l2_bytes, profile.launch_us),
        torch_version=torch.__version__,
        tool_version=TOOL_VERSION,
    )
    analyzed = AnalyzedFile(report, text, user_code=capture.UserCode(home=path))
    if unreadable is not None:
        report.problems.append(unreadable)
        return analyzed
    try:
        source = sourcemap.SourceIndex(path, text)
    except SyntaxError as exc:
        report.problems.append(R.Problem("syntax", f"SyntaxError: {exc.msg}", path, exc.lineno, exc.offset))
        return analyzed
    candidates = discover.find_candidates(text)
    if not candidates.worth_importing():
        _no_such_model(report, options, [])
        return analyzed
    try:
        analyzed.module = loader.import_file(path, analyzed.user_code, text)
    except loader.LoadError as exc:
        report.problems.append(load_problem(exc, path))
        return analyzed
    tool = _tool_table(report, path)
    models = loader.find_models(analyzed.module, candidates, _configured(options, tool[0]), analyzed.user_code)
    if _no_such_model(report, options, models):
        return analyzed
    file = _FileContext(path, options, profile, source, analyzed, tool)
    found: list[list[Found]] = []
    for source_model in models:
        if options.model_class and source_model.name != options.model_class:
            continue
        model, model_found = _analyze_model(source_model, file)
        report.models.append(model)
        found.append(model_found)
    _note_parents(report, candidates.classes)
    generate_kernels(report, found, source, options.out_dir, code, options.training)
    dynamic.name_clusters(report)
    report.libraries = packages.libraries(_files_named(report), path)
    return analyzed


def _files_named(report: R.Report) -> Iterator[str]:
    """Every file a cluster, rejection, pattern or graph break of the report is in."""
    for model in report.models:
        for cluster in model.clusters:
            yield cluster.file
            yield from (op.file for op in cluster.ops)
        yield from (r.file for r in model.rejections)
        yield from (p.file for p in model.patterns)
        yield from (b.file for b in model.graph_breaks)


def _no_such_model(report: R.Report, options: AnalyzeOptions, models: list[loader.ModelSource]) -> bool:
    """`--model-class` names no model of the file: a problem that says which models there are."""
    if not options.model_class or options.model_class in {m.name for m in models}:
        return False
    names = ", ".join(m.name for m in models) or "none"
    message = f"no model {options.model_class!r} in this file (found: {names})"
    report.problems.append(R.Problem("inputs", message, report.file, 1))
    return True


def _configured(options: AnalyzeOptions, tool_table: dict[str, Any]) -> Callable[[str], bool]:
    """Whether settings name a model: an imported class counts as a model of the file only then."""
    table = tool_table.get("models")
    project = set(table) if isinstance(table, dict) else set()
    return lambda name: name == options.model_class or name in options.models or name in project


def _tool_table(report: R.Report, path: str) -> tuple[dict[str, Any], str | None]:
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
    tool: tuple[dict[str, Any], str | None]  # ([tool.fuselens], the pyproject.toml it came from)


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


def configure(source: loader.ModelSource, file: _FileContext) -> ModelConfig:
    """The model's configuration from every source; `example_inputs()` runs only if it is needed."""
    model = ModelClass(source.name, source.line, source.header, source.outermost, source.aliases)
    analyzed = file.analyzed

    def example_inputs() -> tuple[list[InputSpec], str] | None:
        assert analyzed.module is not None  # a model of it is being configured
        tensors, where = loader.user_example_inputs(analyzed.module, source.cls, model.outermost, analyzed.user_code)
        return (loader.specs_of(tensors), where) if tensors is not None else None

    table, pyproject = file.tool
    return resolve_model(model, file.options, table, pyproject, example_inputs)


def _analyze_model(source: loader.ModelSource, file: _FileContext) -> tuple[R.Model, list[Found]]:
    model = R.Model(name=source.name, file=file.path, line=source.line, status="analyzed")
    started = time.perf_counter()
    try:
        config = configure(source, file)
    except ConfigError as exc:
        return _failed(model, R.Problem("inputs", str(exc), file.path, source.line)), []
    except loader.LoadError as exc:
        return _failed(model, load_problem(exc, file.path)), []
    if config.inputs is None:
        model.status = "skipped"
        message = f"{source.name}: no example inputs, so no shapes: costs are unknown"
        hint = loader.hint_for_inputs(source.name, source.instance is not None)
        model.problem = R.Problem("inputs", message, file.path, source.line, None, hint)
        return model, []
    try:
        # Building on meta runs Python init kernels that would import torch._dynamo (over a second)
        # for nothing; the user's module was imported without the stand-in, exactly as Python would.
        with capture.without_dynamo_import():
            paths, traced = _trace_paths(model, source, config, file, started)
    except loader.LoadError as exc:
        return _failed(model, load_problem(exc, file.path)), []
    except capture.CaptureError as exc:
        return _failed(model, _bound_problem(source, config, file) or _trace_problem(exc, config, file.path)), []
    sizes = _follow_sizes(model, config, paths[0][0], traced, file) if config.dims else None
    refused = dynamic.refusal(sizes, config, file.path) if sizes is not None else None
    if refused is not None:
        return _failed(model, refused), []
    file.analyzed.sources[source.name] = source
    file.analyzed.configs[source.name] = config
    started = time.perf_counter()
    found = findings(model, paths, file.source, file.profile)
    model.timings_ms["analyze"] = _ms(started)
    if config.dims and traced is not None:
        started = time.perf_counter()
        names = [i.name or f"input{k}" for k, i in enumerate(model.inputs)]
        again = dynamic.reanalysis(
            traced, config, names, file.analyzed.user_code, file.source, file.profile, file.options.branch_paths
        )
        model.dynamic = dynamic.dynamic_section(model, found, sizes, config, file.profile, again)
        model.timings_ms["dynamic"] = _ms(started)
    elif config.dims:
        model.dynamic = dynamic.unanswered(model, config, sizes)
    main = paths[0][0].graph
    model.graph_breaks = _folded(main.breaks)
    model.paths = [list(trace.branches) for trace, _ in paths]
    model.ops_total = sum(1 for n in main if n.cls is not OpClass.SOURCE and n.op != "output")
    model.totals.bytes_total = cost.model_bytes(main)
    return model, found


def _follow_sizes(
    model: R.Model, config: ModelConfig, main: capture.Trace, traced: torch.nn.Module | None, file: _FileContext
) -> SymbolicShapes:
    """The declared sizes followed as symbols through the main trace (`dynamic.py`)."""
    if traced is None:
        return SymbolicShapes(None, error="the model was traced on real values past a data-dependent op")
    started = time.perf_counter()
    shapes = dynamic.follow_sizes(traced, config, main, file.analyzed.user_code)
    model.timings_ms["symbolic"] = _ms(started)
    return shapes


def _bound_problem(source: loader.ModelSource, config: ModelConfig, file: _FileContext) -> R.Problem | None:
    """For a model with declared sizes whose trace failed: the bound on a size its analysis binding went
    past (a cache of 2048 rows sliced at 4096), as the refusal of the declared range; None otherwise."""
    if not config.dims:
        return None
    user_code = file.analyzed.user_code
    try:
        with capture.without_dynamo_import():
            built = loader.build_source(source, config.init, user_code, config.param_dtype, values=False)
    except loader.LoadError:
        return None
    return dynamic.refusal_of_failed_binding(built.model, config, user_code, file.path)


def _folded(breaks: list[R.GraphBreak]) -> list[R.GraphBreak]:
    """One break per place and reason, counted: a loop over experts breaks at the same line each time."""
    folded: dict[tuple[str, int, str], R.GraphBreak] = {}
    for brk in breaks:
        key = (brk.file, brk.line, brk.reason)
        if key in folded:
            folded[key].multiplicity += 1
        else:
            folded[key] = dataclasses.replace(brk)
    return list(folded.values())


def _failed(model: R.Model, problem: R.Problem) -> R.Model:
    model.status = "error"
    model.problem = problem
    return model


def _trace_paths(
    model: R.Model, source: loader.ModelSource, config: ModelConfig, file: _FileContext, started: float
) -> tuple[list[tuple[capture.Trace, str]], torch.nn.Module | None]:
    """Build the model and trace it: the main path, then each data-dependent branch the other way; and
    the model as traced on meta tensors (None: it was traced on real values)."""
    user_code = file.analyzed.user_code
    # Built without values (a trace needs none): `_real_run` has them made where it needs them.
    built = loader.build_source(source, config.init, user_code, config.param_dtype, values=False)
    if file.options.train:
        built.model.train()
        model.training = True
    if config.param_dtype:
        model.param_dtype = config.param_dtype
    if built.note:
        model.notes.append(built.note)
    _settle_dtypes(model, config, built.model)
    model.timings_ms["build"] = _ms(started)
    started = time.perf_counter()
    tensors = loader.meta_inputs(config.inputs or [])
    names = loader.forward_input_names(built.model, len(tensors))
    for tensor_info, name in zip(model.inputs, names, strict=True):
        tensor_info.name = name
    main = capture.trace(built.model, tensors, names, user_code)
    traced_model, real = built.model, False
    if main.stopped is not None:
        run = _real_run(model, built, config, main.stopped)
        if run is not None:
            (traced_model, tensors), real = run, True
            main = capture.trace(traced_model, tensors, names, user_code, real=True, keep_values=False)
    paths = [(main, "")]
    for i in range(min(len(main.branches), file.options.branch_paths)):
        decisions = [*main.branches[:i], not main.branches[i]]
        try:
            alt = capture.trace(traced_model, tensors, names, user_code, decisions, real=real, keep_values=False)
        except capture.CaptureError:
            continue
        brk = main.branch_breaks[i]
        paths.append((alt, f"on the path where the condition on line {brk.line} is {decisions[-1]}"))
    masks = _Masks(built)  # (a causal mask buffer: what it holds)
    for trace, _ in paths:
        trace.graph.triangles = masks
    model.timings_ms["trace"] = _ms(started)
    return paths, None if real else traced_model


class _Masks(Mapping[str, str]):
    """The model's buffers that hold a causal mask (`Graph.triangles`), worked out the first time the
    attention pattern asks about one: the small ones from their values, which a model built for its
    trace alone does not have (`Built.real_values` builds it again for them), and most models have no
    buffer for the pattern to ask about."""

    def __init__(self, built: loader.Built):
        self._built = built
        self._masks: dict[str, str] | None = None

    def _all(self) -> dict[str, str]:
        if self._masks is None:
            try:
                values = self._built.real_values()
            except loader.LoadError:  # (a constructor that cannot run twice: the masks its ones show)
                values = {}
            self._masks = {**self._built.triangles, **attention.triangles(values)}
        return self._masks

    def __getitem__(self, name: str) -> str:
        known = self._built.triangles.get(name)  # (a large one, kept by what made it: no values needed)
        return known if known is not None else self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


REAL_RUN_BYTES = 2 << 30  # the most a model's tensors may take to be run on real values past a break


def _real_run(
    model: R.Model, built: loader.Built, config: ModelConfig, stopped: R.GraphBreak
) -> tuple[torch.nn.Module, list[torch.Tensor]] | None:
    """The model on real values (seeded random weights, its own buffers) and random inputs, to trace
    past a data-dependent op as torch.compile runs past a graph break; None, with the reason in the
    report, when that would take too much memory here."""
    size = sum(t.numel() * t.element_size() for t in [*built.model.parameters(), *built.model.buffers()])
    where = f"{os.path.basename(stopped.file)}:{stopped.line}"
    if size > REAL_RUN_BYTES:
        model.partial = (
            f"the trace stops at {where}: {stopped.reason}; going past it needs the model on real values, "
            f"{size / 2**30:.1f} GB, more than the {REAL_RUN_BYTES / 2**30:.0f} GB allowed here"
        )
        return None
    model.notes.append(
        f"traced past the data-dependent op at {where} with the values of a run on random weights: "
        "sizes after it (tokens per expert, say) are that run's"
    )
    return built.real(seed=0), loader.random_inputs(config.inputs or [], "cpu", 0)


def _settle_dtypes(model: R.Model, config: ModelConfig, built: torch.nn.Module) -> None:
    """Inputs given as shapes only: token ids (int64) for a model that starts by looking them up, where
    they are shaped like ids ((batch, sequence) at most), float32 for any other; the report's inputs
    are what the model is traced with."""
    inputs = config.inputs or []
    ids = [not s.dtype_given and len(s.shape) <= 2 for s in inputs]
    if loader.takes_token_ids(built) and any(ids):
        config.inputs = inputs = [
            InputSpec(list(s.shape), "int64", symbols=s.symbols) if i else s for s, i in zip(inputs, ids, strict=True)
        ]
        model.notes.append("no dtype was given for the inputs: int64 token ids, as the model looks them up first")
    model.inputs = [R.TensorInfo(s.shape, s.dtype, high=s.high) for s in inputs]
    model.inputs_source = config.inputs_source


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
