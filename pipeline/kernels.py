"""The codegen step of the analysis: number the file's clusters, emit each kernel, attach edits.

Cluster ids (`c0`, `c1`, ...) and kernel names (`cluster0`, ...) are numbered across the
file's models in report order, skipping names the file already imports from its kernel
module (those keep their kernels).  Exact clusters get the call-site edit `fuselens apply`
and the quick fix make.
"""

from __future__ import annotations

import ast
import os

from fuselens.analysis import sourcemap
from fuselens.codegen import edits as edits_mod
from fuselens.codegen.emit import emit
from fuselens.codegen.reference import NoReference, reference_text
from fuselens.contracts import report as R

from .findings import Found


def generate_kernels(
    report: R.Report, found: list[list[Found]], source: sourcemap.SourceIndex, out_dir: str | None
) -> None:
    """Number the clusters of the file, emit each kernel, and attach exact call-site edits."""
    module_path = edits_mod.kernel_module_path(report.file, out_dir)
    taken = _kernel_names_in_use(source.text, module_path)
    n = 0
    for model, model_found in zip(report.models, found, strict=True):
        if model.status != "analyzed":
            continue
        model.kernel_module = os.path.basename(module_path)
        for cluster, instance in zip(model.clusters, model_found, strict=True):
            while f"cluster{n}" in taken:  # names the file already calls keep their kernels
                n += 1
            cluster.id = f"c{n}"
            name = f"cluster{n}"
            n += 1
            params = _launcher_params(cluster)
            try:
                reference = reference_text(instance.graph, instance.plan, name, params, cluster.op_chain)
            except NoReference as exc:
                reference, no_reference = _refusing_reference(name, params, str(exc)), str(exc)
            else:
                no_reference = ""
            try:
                emitted = emit(
                    instance.plan,
                    name,
                    params,
                    [o.name or f"out{k}" for k, o in enumerate(cluster.outputs)],
                    _doc(cluster, source),
                    _comments(instance, source, params),
                    reference,
                )
            except Exception as exc:  # codegen must never lose the analysis
                cluster.lowering = f"code generation failed: {type(exc).__name__}: {exc}"
                cluster.apply_detail = cluster.lowering
                continue
            text = emitted.kernels + "\n\n\n" + emitted.launcher
            cluster.kernel = R.Kernel(name, module_path, text, emitted.strategy)
            _attach_edit(report, cluster, instance, name, module_path, no_reference)
        for pattern in model.patterns:  # indexes into model.clusters become cluster ids
            pattern.clusters = [model.clusters[int(i)].id for i in pattern.clusters]


def _refusing_reference(name: str, params: list[str], why: str) -> str:
    """A reference for a cluster whose ops cannot be written as torch code: it says so when called."""
    message = f"{name} has no reference code ({why}): the kernel runs only on CUDA tensors"
    return "\n".join([f"def _{name}_reference({', '.join(params)}):", f"    raise NotImplementedError({message!r})"])


def _attach_edit(
    report: R.Report, cluster: R.Cluster, instance: Found, name: str, module_path: str, no_reference: str
) -> None:
    """The call-site edit of a cluster that can be applied, and how (or why not) it applies."""
    args = [i.name for i in cluster.inputs if i.name]
    if no_reference:
        cluster.apply_detail = f"the kernel could not fall back to torch code where it cannot run: {no_reference}"
    elif cluster.branch:
        cluster.apply_detail = f"it is {cluster.branch}, which the example inputs do not take"
    elif cluster.mapping != "exact" or len(args) != len(cluster.inputs):
        cluster.apply_detail = cluster.mapping_detail
    else:
        call = sourcemap.replacement(instance.mapping, name, args)
        import_line = edits_mod.import_statement(report.file, module_path, [name])
        cluster.edit = R.Edit(cluster.lines[0], cluster.lines[1], call + "\n", import_line, call.strip())
        cluster.applies = "edit"
        cluster.apply_detail = f"lines {cluster.lines[0]}–{cluster.lines[1]} become `{call.strip()}`"


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
    return (
        f"Fused {cluster.op_chain} from {where}{fn}.\n\n"
        f"Inputs at analysis time: {ins}.\nReturns {outs}.\n"
        "Sizes and strides are read at call time; any shape works."
    )


def _comments(found: Found, source: sourcemap.SourceIndex, params: list[str]) -> dict[str, str]:
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
            if code and " (" not in op and os.path.abspath(found.graph[found.plan.compute[0]].file) == source.path:
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
