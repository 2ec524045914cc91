"""The analyze job: one Python file in, one `Report` out.

This is the engine both the CLI (in-process) and the language server (in a worker
subprocess) run.  It wires the layers together:

    source -> discover classes -> import module -> example inputs -> build on meta
           -> capture (one trace per branch path) -> detect -> cost -> patterns
           -> source map -> codegen (kernel text + call-site edit) -> Report

Every failure in user code becomes a `Problem` at the user's line; one model failing
never hides the others.
"""

from __future__ import annotations

import ast
import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from fuselens.analysis import capture, cost, discover, inputs as inputs_mod, loader
from fuselens.analysis import patterns as patterns_mod
from fuselens.analysis import report as R
from fuselens.analysis import sourcemap
from fuselens.analysis.detect import Detection, detect, describe
from fuselens.analysis.graph import Graph, Node
from fuselens.analysis.ops import OpClass
from fuselens.analysis.repeats import group_repeats
from fuselens.codegen import edits as edits_mod
from fuselens.codegen.emit import emit
from fuselens.codegen.plan import KernelPlan, check, plan_cluster

TOOL_VERSION = "0.1.0"
MAX_BRANCH_PATHS = 4


@dataclass
class AnalyzeOptions:
    model_class: str | None = None
    input_shapes: list[str] | None = None  # CLI --input-shape values
    dtypes: list[str] | None = None  # CLI --dtype values
    param_dtype: str | None = None
    device: str | None = None
    peak_gbps: float | None = None
    out_dir: str | None = None  # where the kernel module goes (default: beside the file)
    source_text: str | None = None  # analyse this text as the file's content (an editor buffer)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)  # per-class settings from the editor
    branch_paths: int = MAX_BRANCH_PATHS


@dataclass
class _Found:
    """One cluster instance, before repeats are merged."""

    graph: Graph
    plan: KernelPlan
    mapping: sourcemap.Mapping
    unfused: int
    fused: int
    path_note: str
    splits: list


def analyze_file(path: str, options: AnalyzeOptions | None = None) -> R.Report:
    # Building models on meta runs Python init kernels that would import torch._dynamo.
    with capture.without_dynamo_import():
        return _analyze_file(path, options or AnalyzeOptions())


def _analyze_file(path: str, options: AnalyzeOptions) -> R.Report:
    path = os.path.abspath(path)
    text = options.source_text
    if text is None:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    profile = cost.device_profile(options.device, options.peak_gbps)
    report = R.Report(
        file=path, source_sha256=hashlib.sha256(text.encode()).hexdigest(),
        device=R.DeviceInfo(profile.name, profile.peak_gbps, profile.l2_bytes, profile.launch_us),
        torch_version=torch.__version__, tool_version=TOOL_VERSION,
    )
    try:
        source = sourcemap.SourceIndex(path, text)
    except SyntaxError as exc:
        report.problems.append(R.Problem("syntax", f"SyntaxError: {exc.msg}", path, exc.lineno, exc.offset))
        return report
    classes = discover.find_classes(text)
    if options.model_class and options.model_class not in {c.name for c in classes}:
        names = ", ".join(c.name for c in classes) or "none"
        report.problems.append(R.Problem("inputs", f"no nn.Module class {options.model_class!r} in this file "
                                                   f"(found: {names})", path, 1))
        return report
    if not classes:
        return report
    user_code = capture.UserCode()
    try:
        module = loader.import_file(path, user_code, text)
    except loader.LoadError as exc:
        report.problems.append(_load_problem(exc, path))
        return report
    try:
        table = inputs_mod.read_tool_table(inputs_mod.find_pyproject(path))
    except inputs_mod.InputSpecError as exc:
        report.problems.append(R.Problem("inputs", str(exc), path, 1))
        table = {}
    available = loader.model_classes(module)
    top = {c.name for c in discover.top_level(classes)}
    chosen = [c for c in classes if c.name in available and (not options.model_class or c.name == options.model_class)]
    analysed_names: list[str] = []
    found: list[list[_Found]] = []
    for info in chosen:
        model, model_found = _analyse_class(info, available[info.name], module, table, top, options, source,
                                            profile, user_code, path)
        report.models.append(model)
        found.append(model_found)
        if model.status == "analysed":
            analysed_names.append(model.name)
    for model in report.models:
        if model.status == "skipped" and analysed_names:
            parents = [n for n in analysed_names if model.name in _used_by(classes, n)]
            if parents:
                model.notes.append(f"its code is analysed inside {', '.join(parents)}")
    _generate(report, found, source, options)
    return report


def _used_by(classes: list[discover.ClassInfo], name: str, seen: frozenset = frozenset()) -> set[str]:
    by_name = {c.name: c for c in classes}
    info = by_name.get(name)
    if info is None or name in seen:
        return set()
    direct = (info.references & set(by_name)) - {name}
    out = set(direct)
    for d in direct:
        out |= _used_by(classes, d, seen | {name})
    return out


def _problem(kind: str, message: str, frame, path: str, hint: str = "") -> R.Problem:
    if frame is not None:
        return R.Problem(kind, message, frame.file, frame.line, None, hint)
    return R.Problem(kind, message, path, 1, None, hint)


def _load_problem(exc: loader.LoadError, path: str) -> R.Problem:
    """A failure to import or build; running out of memory there reads as it does in a trace."""
    if exc.__cause__ is not None and capture.out_of_memory(exc.__cause__):
        return _problem("memory", capture.describe_failure(exc.__cause__), exc.frame, path)
    return _problem(exc.kind, str(exc), exc.frame, path, exc.hint)


# ---- one model -----------------------------------------------------------------------------


def _config(info, cls, module, table, top, options, path, user_code) -> inputs_mod.ModelConfig:
    where_comment = f"the inline comment on line {info.line}"
    config = inputs_mod.from_comment(info.comment, where_comment)
    pyproject = inputs_mod.find_pyproject(path)
    from_project = inputs_mod.from_pyproject(table, info.name, pyproject or "pyproject.toml")
    editor = options.models.get(info.name, {})
    if from_project.init:
        config.init, config.init_source = from_project.init, from_project.init_source
    if editor.get("init"):
        config.init, config.init_source = dict(editor["init"]), "editor settings"
    if config.inputs is None:
        tensors, source = loader.user_example_inputs(module, cls, info.name in top, user_code)
        if tensors is not None:
            config.inputs, config.inputs_source = loader.specs_of(tensors), source
    if from_project.inputs is not None:
        config.inputs, config.inputs_source = from_project.inputs, from_project.inputs_source
    if editor.get("inputs"):
        config.inputs = inputs_mod._pyproject_inputs(editor["inputs"], editor.get("dtype", "float32"), "editor settings")
        config.inputs_source = "editor settings"
    cli = inputs_mod.from_cli(options.input_shapes, options.dtypes)
    if cli is not None and (options.model_class == info.name or (not options.model_class and info.name in top)):
        config.inputs, config.inputs_source = cli, "--input-shape"
    param_dtype = options.param_dtype or editor.get("param_dtype")
    entry = table.get("models", {}).get(info.name, {}) if isinstance(table.get("models"), dict) else {}
    if param_dtype is None and isinstance(entry, dict):
        param_dtype = entry.get("param_dtype")
    config.param_dtype = inputs_mod.canonical_dtype(param_dtype, "param_dtype") if param_dtype else None
    return config


def _analyse_class(info, cls, module, table, top, options, source, profile, user_code, path):
    model = R.Model(name=info.name, file=path, line=info.line, status="analysed")
    timings = model.timings_ms
    t = time.perf_counter()
    try:
        config = _config(info, cls, module, table, top, options, path, user_code)
    except inputs_mod.InputSpecError as exc:
        model.status = "error"
        model.problem = R.Problem("inputs", str(exc), path, info.line)
        return model, []
    except loader.LoadError as exc:
        model.status = "error"
        model.problem = _load_problem(exc, path)
        return model, []
    if config.inputs is None:
        model.status = "skipped"
        model.problem = R.Problem("inputs", f"{info.name}: no example inputs, so no shapes: costs are unknown",
                                  path, info.line, None, loader.hint_for_inputs(info.name))
        return model, []
    model.inputs = [R.TensorInfo(s.shape, s.dtype) for s in config.inputs]
    model.inputs_source = config.inputs_source
    try:
        built = loader.build(cls, config.init, user_code, loader.hint_for_init(info.name))
        if config.param_dtype:
            built.model.to(getattr(torch, config.param_dtype))
            model.param_dtype = config.param_dtype
        if built.note:
            model.notes.append(built.note)
        timings["build"] = _ms(t)
        t = time.perf_counter()
        tensors = loader.meta_inputs(config.inputs)
        names = loader.forward_input_names(built.model, len(tensors))
        for info_in, name in zip(model.inputs, names):
            info_in.name = name
        main = capture.trace(built.model, tensors, names, user_code)
        paths = [(main, "")]
        for i in range(min(len(main.branches), options.branch_paths)):
            decisions = main.branches[:i] + [not main.branches[i]]
            try:
                alt = capture.trace(built.model, tensors, names, user_code, decisions)
            except capture.CaptureError:
                continue
            brk = main.graph.breaks[i]
            paths.append((alt, f"on the path where the condition on line {brk.line} is {decisions[-1]}"))
        timings["trace"] = _ms(t)
    except loader.LoadError as exc:
        model.status = "error"
        model.problem = _load_problem(exc, path)
        return model, []
    except capture.CaptureError as exc:
        model.status = "error"
        shapes = ", ".join(s.describe() for s in config.inputs)
        message = str(exc) if exc.kind == "memory" else f"forward() failed: {exc}"
        model.problem = _problem(exc.kind, message, exc.frame, path,
                                 f"traced with example inputs {shapes} from {config.inputs_source}")
        return model, []
    t = time.perf_counter()
    found = _findings(model, paths, source, profile)
    model.graph_breaks = list(main.graph.breaks)
    model.ops_total = sum(1 for n in main.graph if n.cls is not OpClass.SOURCE and n.op != "output")
    model.totals.bytes_total = cost.model_bytes(main.graph)
    timings["analyse"] = _ms(t)
    return model, found


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 2)


def _op_ref(node: Node) -> R.OpRef:
    src = node.source
    meta = node.meta
    return R.OpRef(node.op, src.file if src else "", src.line if src else 0,
                   list(meta.shape) if meta else None, meta.dtype if meta else None,
                   node.owner or node.module, node.call)


def _findings(model: R.Model, paths, source, profile) -> list[_Found]:
    """Fill the model's clusters, rejections and patterns; return the cluster instances behind them."""
    found: list[_Found] = []
    rejected: list[tuple[Graph, Any, str]] = []
    matches: list[tuple[Graph, patterns_mod.Match, str]] = []
    seen_signatures: set = set()
    for index, (trace, note) in enumerate(paths):
        graph = trace.graph
        detection: Detection = detect(graph, check)
        path_found = []
        for group in detection.clusters:
            plan = plan_cluster(graph, group.members)
            inputs = [s.node for s in plan.inputs]
            outputs = [o.node for o in plan.outputs]
            unfused, fused = cost.cluster_bytes(graph, plan.compute, inputs, outputs)
            mapping = sourcemap.map_cluster(graph, plan.compute, set(group.members), inputs, outputs, source)
            path_found.append(_Found(graph, plan, mapping, unfused, fused, note, group.splits))
        path_rejected = [(graph, r, note) for r in detection.rejected]
        path_matches = [(graph, m, note) for m in patterns_mod.find_patterns(graph)]
        if index == 0:
            found += path_found
            rejected += path_rejected
            matches += path_matches
            seen_signatures = {_signature(f) for f in found}
            continue
        # Other branch paths add only what the main path did not already show.
        found += [f for f in path_found if _signature(f) not in seen_signatures]
        seen_signatures |= {_signature(f) for f in found}
    groups = group_repeats(found, _signature)
    model.clusters = [_cluster(group, profile) for group in groups]
    model.rejections = [_rejection(group) for group in group_repeats(rejected, _rejection_signature)]
    pattern_groups = group_repeats(matches, _pattern_signature)
    model.patterns = [_pattern(group) for group in pattern_groups]
    # Which clusters each pattern overlaps, by op identity within the same trace.
    for pattern, group in zip(model.patterns, pattern_groups):
        graph, match, _ = group[0]
        pattern.clusters = [str(i) for i, f in enumerate(found_first(groups))
                            if f.graph is graph and set(f.plan.compute) & set(match.nodes)]
    model.totals.clusters = len(model.clusters)
    saved = [c.bytes_saved * c.multiplicity for c in model.clusters if c.bytes_saved is not None and not c.branch]
    model.totals.bytes_avoidable = sum(saved)
    return [group[0] for group in groups]


def found_first(groups: list[list[_Found]]) -> list[_Found]:
    return [g[0] for g in groups]


def _signature(f: _Found):
    g = f.graph
    ops = tuple((g[i].op, g[i].source.file if g[i].source else "", g[i].line) for i in f.plan.compute)
    ins = tuple((s.shape, s.dtype) for s in f.plan.inputs)
    outs = tuple((o.shape, o.dtype) for o in f.plan.outputs)
    return ops, ins, outs


def _cluster(group: list[_Found], profile: cost.DeviceProfile) -> R.Cluster:
    first = group[0]
    g, plan, mapping = first.graph, first.plan, first.mapping
    ops = [_op_ref(g[i]) for i in plan.compute]
    names_in = mapping.input_names or [None] * len(plan.inputs)
    inputs = [R.TensorInfo(list(s.shape), s.dtype, names_in[k] if k < len(names_in) else None)
              for k, s in enumerate(plan.inputs)]
    for k, info in enumerate(inputs):
        if info.name is None:
            node = g[plan.inputs[k].node]
            info.name = _param_expr(node)
    names_out = mapping.output_names or [None] * len(plan.outputs)
    outputs = [R.TensorInfo(list(o.shape), o.dtype, names_out[k] if k < len(names_out) else None)
               for k, o in enumerate(plan.outputs)]
    lines = list(mapping.lines) if mapping.lines != (0, 0) else [min(op.line for op in ops), max(op.line for op in ops)]
    boundaries = []
    for split in first.splits:
        node = g[split.node]
        boundaries.append(R.Boundary(_op_ref(node), split.reason, split.detail))
    cluster = R.Cluster(
        id="", kind=plan.kind, ops=ops, inputs=inputs, outputs=outputs, file=mapping.file or (ops[0].file if ops else ""),
        lines=lines, function=mapping.function, mapping=mapping.quality, mapping_detail=mapping.detail,
        bytes_unfused=first.unfused, bytes_fused=first.fused,
        regime=cost.regime(g, plan.compute, first.fused, profile),
        multiplicity=len(group), instances=[f.graph[f.plan.compute[0]].owner for f in group],
        boundaries=boundaries, branch=first.path_note,
        total_bytes_unfused=first.unfused * len(group), total_bytes_fused=first.fused * len(group),
    )
    return cluster


def _param_expr(node: Node) -> str | None:
    if node.op in ("param", "buffer") and node.name:
        return node.name
    if node.op == "input":
        return node.name
    return None


def _rejection_signature(item):
    graph, r, _ = item
    node = graph[r.node]
    return node.op, node.source.file if node.source else "", node.line, r.reason


def _rejection(group) -> R.Rejection:
    graph, r, _ = group[0]
    node = graph[r.node]
    ref = _op_ref(node)
    return R.Rejection([ref], r.reason, r.detail, ref.file, [ref.line, ref.line], multiplicity=len(group))


def _pattern_signature(item):
    graph, m, _ = item
    return m.name, tuple((graph[i].op, graph[i].line) for i in m.nodes)


def _pattern(group) -> R.Pattern:
    graph, m, _ = group[0]
    ops = [_op_ref(graph[i]) for i in m.nodes]
    place = sourcemap.common_place(graph, m.nodes)
    lines = list(place.lines) if place else [0, 0]
    return R.Pattern(m.name, ops, place.file if place else (ops[0].file if ops else ""), lines,
                     R.PatternEstimate(m.bytes_before, m.bytes_after, m.speedup), dict(m.dims),
                     multiplicity=len(group), summary=m.summary)


# ---- codegen -------------------------------------------------------------------------------


def _generate(report: R.Report, found: list[list[_Found]], source: sourcemap.SourceIndex,
              options: AnalyzeOptions) -> None:
    """Number the clusters of the file, emit each kernel, and attach exact call-site edits."""
    module_path = edits_mod.kernel_module_path(report.file, options.out_dir)
    taken = _kernel_names_in_use(source.text, module_path)
    n = 0
    for model, model_found in zip(report.models, found):
        if model.status != "analysed":
            continue
        model.kernel_module = os.path.basename(module_path)
        for cluster, instance in zip(model.clusters, model_found):
            while f"cluster{n}" in taken:  # names the file already calls keep their kernels
                n += 1
            cluster.id = f"c{n}"
            name = f"cluster{n}"
            n += 1
            params = _launcher_params(cluster)
            try:
                emitted = emit(instance.plan, name, params, [o.name or f"out{k}" for k, o in enumerate(cluster.outputs)],
                               _doc(cluster, source), _comments(instance, source, params))
            except Exception as exc:  # codegen must never lose the analysis
                cluster.lowering = f"code generation failed: {type(exc).__name__}: {exc}"
                continue
            text = emitted.kernels + "\n\n\n" + emitted.launcher
            cluster.kernel = R.Kernel(name, module_path, text, emitted.strategy)
            if cluster.mapping == "exact" and not cluster.branch:
                args = [i.name for i in cluster.inputs]
                call = sourcemap.replacement(instance.mapping, name, args)
                cluster.edit = R.Edit(cluster.lines[0], cluster.lines[1], call + "\n",
                                      edits_mod.import_statement(report.file, module_path, [name]), call.strip())
        for pattern in model.patterns:  # indexes into model.clusters become cluster ids
            pattern.clusters = [model.clusters[int(i)].id for i in pattern.clusters]


def _launcher_params(cluster: R.Cluster) -> list[str]:
    params: list[str] = []
    for k, info in enumerate(cluster.inputs):
        base = (info.name or f"in{k}").split(".")[-1]
        base = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in base) or f"in{k}"
        if base[0].isdigit() or base in params or base in ("self", "torch", "triton", "tl"):
            base = f"{base}_{k}"
        params.append(base)
    return params


def _doc(cluster: R.Cluster, source: sourcemap.SourceIndex) -> str:
    where = f"{os.path.basename(cluster.file)} lines {cluster.lines[0]}–{cluster.lines[1]}"
    fn = f" ({cluster.function})" if cluster.function else ""
    ins = ", ".join(f"{i.name or 'in'} {i.shape} {i.dtype}" for i in cluster.inputs)
    outs = ", ".join(f"{o.shape} {o.dtype}" for o in cluster.outputs)
    return (f"Fused {cluster.op_chain} from {where}{fn}.\n\n"
            f"Inputs at analysis time: {ins}.\nReturns {outs}.\n"
            "Sizes and strides are read at call time; any shape works.")


def _comments(found: _Found, source: sourcemap.SourceIndex, params: list[str]) -> dict[str, str]:
    comments = {}
    for stmt in found.plan.stmts:
        if stmt.load_input is not None:
            comments[stmt.name] = params[stmt.load_input]
            continue
        text = stmt.comment
        if text.startswith("line ") and ": " in text:
            head, op = text.split(": ", 1)
            line = int(head.split()[1])
            code = source.line_text(line).strip()
            if code and " (" not in op and os.path.abspath(found.graph[found.plan.compute[0]].source.file) == source.path:
                comments[stmt.name] = f"{head}: {code}"
    return comments


def _kernel_names_in_use(source_text: str, module_path: str) -> set[str]:
    """clusterN names the file already imports from its kernel module: they keep their kernels."""
    module = os.path.splitext(os.path.basename(module_path))[0]
    names: set[str] = set()
    try:
        tree = ast.parse(source_text)
    except SyntaxError:
        tree = None
    for node in ast.walk(tree) if tree else []:
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == module:
            names |= {a.name for a in node.names}
    return names
