"""The codegen step of the analysis: number the file's clusters, emit each kernel, attach edits.

Cluster ids (`c0`, `c1`, ...) and kernel names (`cluster0`, ...) are numbered across the
file's models in report order, skipping names the file already imports from its kernel
module (those keep their kernels).  Exact clusters get the call-site edit `fuselens apply`
and the quick fix make.  Patterns' source rewrites are numbered after them (`r0`, ...), each with the
clusters it replaces.

The kernels' code, and each cluster's backward (its gradients captured and planned as one more
kernel: most of the step's time), are for what reads them: `apply`, validation, the quick fix and
the kernel views.  The editor's analysis goes without them (`code=False`): every kernel is still
emitted, to know that its cluster lowers, but keeps no source, and a `GenerateJob` makes them when
something asks (`worker/protocol.py`).
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field

from fuselens.analysis import sourcemap
from fuselens.analysis.guarded import Alternative, Guarded, carried_ahead, dispatched, guarded, unbiased_calls
from fuselens.analysis.library import NotPatchable, called_code, library_function
from fuselens.analysis.packages import Package, model_library, not_a_package
from fuselens.analysis.parsed import parse
from fuselens.analysis.regions import NoRegion, Region
from fuselens.codegen import edits as edits_mod
from fuselens.codegen.admission import fits_text
from fuselens.codegen.emit import emit
from fuselens.codegen.files import MAX_KERNEL_MODULE_BYTES
from fuselens.codegen.gemm_launcher import gemm_kernels, gemm_launcher_text
from fuselens.codegen.gemm_plan import library_activation
from fuselens.codegen.patches import kernel_alias, patched_kernels
from fuselens.codegen.plan import ScalarSlot
from fuselens.codegen.reference import NoReference, member_call, reference_text
from fuselens.contracts import report as R
from fuselens.contracts.reading import read_text
from fuselens.contracts.training import MeasuredTraining, slower_in_training

from .backward import Backward, NoBackwardKernel, backward_for, saved_by_autograd
from .findings import Found


def generate_kernels(
    report: R.Report,
    found: list[list[Found]],
    source: sourcemap.SourceIndex,
    out_dir: str | None,
    code: bool = True,
    training: Sequence[MeasuredTraining] = (),
) -> None:
    """Number the clusters of the file, emit each kernel, and attach exact call-site edits.  Without
    `code` (the editor's analysis) each kernel is emitted only to know that its cluster lowers, and
    keeps no source; its backward is not worked out (`R.Kernel.source`).  A cluster whose kernels'
    training step a validation measured slower than torch.compile's (`training`) gets no backward:
    it trains through its original code."""
    module_path = edits_mod.kernel_module_path(report.file, out_dir)
    taken = _kernel_names_in_use(source.text, module_path)
    placed: list[_Placed] = []
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
            numbers = _number_params(instance.plan.scalars, params)
            cluster.numbers = _numbers(instance, numbers)
            slower = slower_in_training(training, model.name, cluster.id, cluster.op_chain)
            kernel = _kernel(cluster, instance, name, params, numbers, module_path, source, code, slower)
            if kernel is None:
                continue
            cluster.kernel = kernel
            place = _place(cluster, instance, name, module_path, report.file)
            if place is not None:
                placed.append(place)
        for pattern in model.patterns:  # indexes into model.clusters become cluster ids
            pattern.clusters = [model.clusters[int(i)].id for i in pattern.clusters]
    carried = _write_edits(report, placed, module_path, source)
    _nest_shared_lines(report, module_path, carried)
    _number_rewrites(report)
    _import_kernel_functions(report, module_path)


def _import_kernel_functions(report: R.Report, module_path: str) -> None:
    """A rewrite that calls the kernel module's functions (the fused linear cross-entropy) imports them
    from the module, as the clusters' calls are imported."""
    for _, _, rewrite in report.rewrites():
        if rewrite.kernel_functions:
            rewrite.imports.append(edits_mod.import_statement(report.file, module_path, rewrite.kernel_functions))


def _number_rewrites(report: R.Report) -> None:
    """Give each pattern's rewrite its id (`r0`, ...) and the clusters it replaces: those whose ops are the
    pattern's, or whose edit changes its lines."""
    n = 0
    for model in report.models:
        _withdraw_rewrites_of_shared_lines(model)
        for pattern in model.patterns:
            rewrite = pattern.rewrite
            if rewrite is None:
                continue
            rewrite.id = f"r{n}"
            n += 1
            rewrite.replaces = [
                c.id
                for c in model.clusters
                if c.id in pattern.clusters
                or (
                    c.edit is not None
                    and c.edit.start_line <= rewrite.end_line
                    and c.edit.end_line >= rewrite.start_line
                )
            ]


def _withdraw_rewrites_of_shared_lines(model: R.Model) -> None:
    """Rewrites of the same lines that differ (the lines compute one thing in one call and another in
    the next) are both withdrawn, saying why: neither text stands for both.  The same rewrite found
    twice is kept once."""
    rewritten = [p for p in model.patterns if p.rewrite is not None]
    conflicting: set[int] = set()
    for i, pattern in enumerate(rewritten):
        for other in rewritten[i + 1 :]:
            mine, theirs = pattern.rewrite, other.rewrite
            if mine is None or theirs is None:
                continue
            if not (mine.start_line <= theirs.end_line and mine.end_line >= theirs.start_line):
                continue
            if (mine.start_line, mine.end_line, mine.text) == (theirs.start_line, theirs.end_line, theirs.text):
                other.rewrite = None
            else:
                conflicting |= {id(pattern), id(other)}
    for pattern in rewritten:
        if id(pattern) in conflicting and pattern.rewrite is not None:
            span = f"lines {pattern.rewrite.start_line}–{pattern.rewrite.end_line}"
            pattern.rewrite = None
            pattern.refusal = "modified"
            pattern.refusal_detail = (
                f"{span} compute this {pattern.name} in one call and another in the next (another mask, "
                "another scale): one rewrite cannot stand for both"
            )


def _kernel(
    cluster: R.Cluster,
    instance: Found,
    name: str,
    params: list[str],
    numbers: list[str],
    module_path: str,
    source: sourcemap.SourceIndex,
    code: bool,
    slower: str = "",
) -> R.Kernel | None:
    """The cluster's kernel: its source (the kernels, the launcher, the backward and `fits`) with `code`,
    else its name and strategy alone; None, with why on the cluster, when code generation fails.
    `slower`: why it trains through its original code (its kernels measured slower in training), so
    that it gets no backward."""
    if instance.plan.gemm is not None:
        return _gemm_kernel(cluster, instance, name, params, numbers, module_path, source, code, slower)
    try:
        reference = reference_text(instance.graph, instance.plan, name, params, cluster.op_chain, numbers)
    except NoReference as exc:
        reference, no_reference = _refusing_reference(name, params + numbers, str(exc)), str(exc)
    else:
        no_reference = ""
    trained = None
    if code and no_reference:
        cluster.backward_detail = f"its ops are not torch code it can train through: {no_reference}"
    elif code and slower:
        cluster.backward_detail = slower
    elif code:
        trained = _backward(cluster, instance, name, params, numbers, reference)
    try:
        emitted = emit(
            instance.plan,
            name,
            params,
            [o.name or f"out{k}" for k, o in enumerate(cluster.outputs)],
            _doc(cluster, source),
            _comments(instance, source, params),
            reference,
            numbers,
            trained.trains if trained else None,
        )
    except Exception as exc:  # codegen must never lose the analysis
        cluster.lowering = f"code generation failed: {type(exc).__name__}: {exc}"
        cluster.apply_detail = cluster.lowering
        return None
    if not code:
        return R.Kernel(name, module_path, "", emitted.strategy)
    region = instance.mapping.region
    checks = region.checks if region is not None else []
    text = emitted.kernels + "\n\n\n" + emitted.launcher
    if trained:
        text += "\n\n\n" + trained.text
    elif slower:  # what the user's validation found, where the kernel module is read
        said = f"Training: {name} {slower}; a call that wants gradients runs the lines it replaced."
        text += "\n\n\n" + "\n".join(f"# {line}" for line in textwrap.wrap(said, 98))
    sized = bool(trained and trained.sized)
    trains = trained.trains if trained else None
    made = region.made if region is not None else []
    text += "\n\n\n" + fits_text(instance.plan, name, params, numbers, trains, checks, sized, made)
    return R.Kernel(name, module_path, text, emitted.strategy)


def _gemm_kernel(
    cluster: R.Cluster,
    instance: Found,
    name: str,
    params: list[str],
    numbers: list[str],
    module_path: str,
    source: sourcemap.SourceIndex,
    code: bool,
    slower: str = "",
) -> R.Kernel | None:
    """A cluster that starts with a GEMM: its epilogue's own kernel (`<name>_epilogue`, with its backward,
    as any elementwise cluster's), the fused kernel, the library's path and the public function that
    picks between them (`codegen/gemm_launcher.py`), and `fits`.  `slower`: why it trains through its
    original code (`_kernel`): then its epilogue gets no backward, and a call that wants gradients runs
    the lines it replaced."""
    graph, plan = instance.graph, instance.plan
    gemm = plan.gemm
    assert gemm is not None
    epilogue = dataclasses.replace(instance, plan=gemm.epilogue)
    result = _result_param(graph[gemm.form.node].op, params + numbers)
    own = [result if j is None else params[j] for j in gemm.taken]
    chain = " → ".join(graph[c].op for c in gemm.epilogue.compute)
    comments = _comments(epilogue, source, own)
    outputs = [o.name or f"out{k}" for k, o in enumerate(cluster.outputs)]
    try:
        reference = reference_text(graph, plan, name, params, cluster.op_chain, numbers)
        own_reference = reference_text(graph, gemm.epilogue, f"{name}_epilogue", own, chain, numbers)
        call = member_call(graph, plan, gemm.form.node, params)
    except NoReference as exc:  # the library's path is the GEMM's call: without it there is no cluster
        cluster.lowering = cluster.apply_detail = f"code generation failed: {exc}"
        return None
    trained = None
    if code and slower:
        cluster.backward_detail = slower
    elif code:
        trained = _backward(cluster, epilogue, f"{name}_epilogue", own, numbers, own_reference)
        cluster.backward_detail = _gemm_training(cluster.backward_detail, trained is not None, params)
    try:
        emitted = emit(
            gemm.epilogue,
            f"{name}_epilogue",
            own,
            outputs,
            f"The ops after {name}'s GEMM, on its result {result}: what runs after the library's GEMM.",
            comments,
            own_reference,
            numbers,
            trained.trains if trained else None,
        )
        kernels, launch = gemm_kernels(plan, name, params, comments)
        library = f"{result} = {call}\nreturn {name}_epilogue({', '.join(own + numbers)})"
        activation = library_activation(graph, plan)
        launcher = gemm_launcher_text(
            plan, name, params, numbers, _doc(cluster, source), launch, reference, library, activation, not slower
        )
    except Exception as exc:  # codegen must never lose the analysis
        cluster.lowering = f"code generation failed: {type(exc).__name__}: {exc}"
        cluster.apply_detail = cluster.lowering
        return None
    strategy = f"gemm{'/cublaslt' if activation else ''} + {emitted.strategy}"
    if not code:
        return R.Kernel(name, module_path, "", strategy)
    region = instance.mapping.region
    parts = [emitted.kernels, kernels, emitted.launcher, *([trained.text] if trained else []), launcher]
    if slower:  # what the user's validation found, where the kernel module is read
        said = f"Training: {name} {slower}; a call that wants gradients runs the lines it replaced."
        parts.append("\n".join(f"# {line}" for line in textwrap.wrap(said, 98)))
    checks = region.checks if region is not None else []
    made = region.made if region is not None else []
    trains = [] if slower else list(range(len(plan.inputs)))  # torch's GEMM and the epilogue's kernels
    parts.append(fits_text(plan, name, params, numbers, trains, checks, False, made))
    return R.Kernel(name, module_path, "\n\n\n".join(parts), strategy)


def _result_param(op: str, taken: list[str]) -> str:
    """The epilogue's name for the GEMM's result: the op's, unless an input of the cluster has it."""
    name = op
    while name in taken:
        name += "_"
    return name


def _gemm_training(detail: str, kernel: bool, params: list[str]) -> str:
    """What a GEMM cluster trains through: torch's GEMM and its gradients, with the epilogue's backward
    kernel (`detail`: the epilogue inputs it takes gradients of), or, without one, the epilogue's
    reference (`detail`: why)."""
    if kernel:
        return (
            f"gradients of {', '.join(params)}: torch's GEMM gradients after the epilogue's backward kernel ({detail})"
        )
    return f"{detail}; the cluster trains through torch's GEMM and the epilogue's reference"


def _nest_shared_lines(report: R.Report, module_path: str, carried: dict[str, tuple[str, str]]) -> None:
    """Edits of two clusters that change the same line: the later carries the earlier's where it can, and
    applies it with its own; any other overlap leaves the later one unapplied, with why.  It can where
    its text has the expression the earlier's call stands in place of (`h = self.conv1(F.silu(self.norm1(x)))`,
    whose convolution's bias add joined the next cluster), or where all it runs ahead on that line is a
    convolution without its bias (`carried`: cluster id -> (the convolution module, its text without
    that statement)), which the earlier's text then runs so in each of its branches.  The same holds for
    the patches of one library function."""
    edited = [(c, c.edit) for _, c in report.clusters() if c.edit is not None and c.applies == "edit"]
    _nest_overlapping(edited, report.file, module_path, carried)
    by_function: dict[str, list[tuple[R.Cluster, R.Edit]]] = {}
    for _, c in report.clusters():
        if c.patch is not None:
            f = c.patch.function
            by_function.setdefault(f"{f.module}.{f.qualname}", []).append((c, c.patch.edit))
    for patched in by_function.values():
        _nest_overlapping(patched, "", "", carried)


def _nest_overlapping(
    edited: list[tuple[R.Cluster, R.Edit]], file: str, module_path: str, carried: dict[str, tuple[str, str]]
) -> None:
    """`_nest_shared_lines` over one file's edits, or one library function's patches (`file` "")."""
    dropped: set[str] = set()
    for k, (later, outer) in enumerate(edited):
        for earlier, inner in edited[:k]:
            if earlier.id in dropped or later.id in dropped or not _overlap(inner, outer):
                continue
            if later.id in inner.includes or earlier.id in outer.includes:
                continue  # kernels made for the same lines: one edit asks each
            if _carries(outer, inner):
                _nest(later, outer, earlier, inner, file, module_path)
            elif later.id in carried and outer.start_line == inner.end_line and inner.start_line < outer.start_line:
                _carry_statement(later, outer, earlier, inner, carried[later.id], file, module_path)
            else:
                _drop(later, f"its code shares line {later.lines[0]} with {earlier.id}'s")
                dropped.add(later.id)
                break


def _drop(cluster: R.Cluster, why: str) -> None:
    cluster.edit = None
    cluster.patch = None
    cluster.applies = "no"
    cluster.apply_detail = why


def _overlap(a: R.Edit, b: R.Edit) -> bool:
    return not (a.end_line < b.start_line or b.end_line < a.start_line)


def _carries(outer: R.Edit, inner: R.Edit) -> bool:
    """`outer` starts on the line where `inner`'s call stands in place of an expression that
    `outer`'s text has once."""
    if not inner.replaces or outer.start_line != inner.end_line or outer.text.count(inner.replaces) != 1:
        return False
    last_written = (inner.text.splitlines(keepends=True) or [""])[-1]
    last_read = (inner.original.splitlines(keepends=True) or [""])[-1]
    return last_read.count(inner.replaces) == 1 and last_written == last_read.replace(inner.replaces, inner.expression)


def _nest(later: R.Cluster, outer: R.Edit, earlier: R.Cluster, inner: R.Edit, file: str, module_path: str) -> None:
    """`later`'s edit rewritten to carry `earlier`'s: from `earlier`'s first line, its call in place."""
    keep = "".join(inner.text.splitlines(keepends=True)[:-1])
    before = "".join(inner.original.splitlines(keepends=True)[:-1])
    outer.text = keep + outer.text.replace(inner.replaces, inner.expression)
    outer.original = before + outer.original
    outer.start_line = inner.start_line
    outer.call = outer.call.replace(inner.replaces, inner.expression)
    if outer.expression:
        outer.expression = outer.expression.replace(inner.replaces, inner.expression)
    _joined(later, outer, earlier, inner, file, module_path)


def _carry_statement(
    later: R.Cluster,
    outer: R.Edit,
    earlier: R.Cluster,
    inner: R.Edit,
    carry: tuple[str, str],
    file: str,
    module_path: str,
) -> None:
    """`later`'s edit rewritten to start with `earlier`'s, whose last line is the convolution `later`
    runs ahead without its bias: that call is made so in each of `earlier`'s branches."""
    conv, rest = carry
    outer.text = unbiased_calls(inner.text, conv) + rest
    outer.original = inner.original + "".join(outer.original.splitlines(keepends=True)[1:])
    outer.start_line = inner.start_line
    _joined(later, outer, earlier, inner, file, module_path)


def _joined(later: R.Cluster, outer: R.Edit, earlier: R.Cluster, inner: R.Edit, file: str, module_path: str) -> None:
    """What an edit that carries another's says and imports."""
    assert later.kernel and earlier.kernel
    outer.includes += [i for i in [earlier.id, *inner.includes] if i not in outer.includes]
    if file:
        names = [later.kernel.name, *_names_in(outer.import_line, module_path), earlier.kernel.name]
        names += _names_in(inner.import_line, module_path)
        outer.import_line = edits_mod.import_statement(file, module_path, list(dict.fromkeys(names)))
    lines = f"lines {outer.start_line}–{outer.end_line} become"
    later.apply_detail = f"{lines} `{outer.call}` (with {', '.join(outer.includes)}, whose code shares them)"


def _names_in(import_line: str, module_path: str) -> list[str]:
    module = os.path.splitext(os.path.basename(module_path))[0]
    found = [n for n in ast.walk(ast.parse(import_line)) if isinstance(n, ast.ImportFrom)]
    return [a.name for n in found[:1] if (n.module or "").split(".")[-1] == module for a in n.names]


def _backward(
    cluster: R.Cluster, instance: Found, name: str, params: list[str], numbers: list[str], reference: str
) -> Backward | None:
    """The cluster's backward kernel, recorded on the cluster: its strategy, the inputs it takes
    gradients of, its traffic and what the forward keeps for it against eager autograd; or why its
    gradients are not one kernel."""
    try:
        trained = backward_for(instance.graph, instance.plan, name, params, numbers)
    except NoBackwardKernel as exc:
        cluster.backward_detail = str(exc)
        return None
    except Exception as exc:  # the forward kernel must never be lost to its backward
        cluster.backward_detail = f"backward code generation failed: {type(exc).__name__}: {exc}"
        return None
    cluster.backward = trained.strategy
    cluster.backward_detail = "gradients of " + ", ".join(params[k] for k in trained.grads_of)
    if trained.strategy == R.PASS_THROUGH_BACKWARD:
        cluster.backward_detail += ", the outputs' own gradients passed on (nothing to compute)"
    elif trained.strategy == R.TORCH_BACKWARD:
        cluster.backward_detail += ", added into the table at the looked-up ids by torch, as eager autograd does"
    cluster.backward_bytes_unfused, cluster.backward_bytes_fused = trained.bytes_unfused, trained.bytes_fused
    cluster.saved_bytes_fused = trained.saved_fused
    cluster.saved_bytes_eager = saved_by_autograd(reference, name, instance.plan, trained.trains, trained.held)
    return trained


def _refusing_reference(name: str, params: list[str], why: str) -> str:
    """A reference for a cluster whose ops cannot be written as torch code: it says so when called."""
    message = f"{name} has no reference code ({why}): the kernel runs only on CUDA tensors"
    return "\n".join([f"def _{name}_reference({', '.join(params)}):", f"    raise NotImplementedError({message!r})"])


@dataclass
class _Placed:
    """A cluster whose kernel can stand in for code: where that code is and how the code reaches the kernel."""

    cluster: R.Cluster
    region: Region
    call: str  # `cluster0` in the user's file, `_fuselens_<module>.cluster0` in a library patch
    lines: list[str]  # the lines of the region's file
    function: R.LibraryFunction | None = None  # the library function a patch replaces
    # The functions below it whose code the kernel computes: the patch is made for their code too.
    calls: list[R.CalledCode] = field(default_factory=list)
    library: Package | None = None  # the installed package whose code the patch replaces


def _place(cluster: R.Cluster, instance: Found, name: str, module_path: str, file: str) -> _Placed | None:
    """Where the cluster's kernel can stand in for code: the analyzed file (an edit), a library's
    function (a patch), or nowhere (the cluster says why)."""
    region = instance.mapping.region
    if region is None or not all(i.name for i in cluster.inputs):
        cluster.apply_detail = cluster.mapping_detail
        return None
    if cluster.mapping == "exact":
        return _Placed(cluster, region, name, [])  # the analyzed file's lines
    library = model_library(region.file, file)
    if library is None:  # another of the user's files, or code no module was imported from
        cluster.apply_detail = f"{cluster.mapping_detail}; {not_a_package(region.file, file)}"
        return None
    index = sourcemap.source_of(region.file)
    # A function made inside another (a mask's closure) is reached through that one: its patch is the
    # enclosing function's, whose code makes the closure anew at each call.
    patched = cluster.function.split(".<locals>.")[0] if "<lambda>" not in cluster.function else cluster.function
    node = index.function_at(region.first, patched) if index is not None else None
    if index is None or node is None:
        cluster.apply_detail = f"{cluster.mapping_detail}; its source could not be read"
        return None
    try:
        function = library_function(region.file, patched, node, index.lines)
        calls = called_code(instance.graph, instance.plan.compute, region.file, cluster.function)
    except NotPatchable as exc:
        cluster.apply_detail = f"{cluster.mapping_detail}; no patch can replace it: {exc}"
        return None
    return _Placed(cluster, region, f"{kernel_alias(module_path)}.{name}", index.lines, function, calls, library)


def _write_edits(
    report: R.Report, placed: list[_Placed], module_path: str, source: sourcemap.SourceIndex
) -> dict[str, tuple[str, str]]:
    """The rewritten lines of each placed cluster: one text for the clusters whose kernels stand in for
    the same lines (another rank, another shape), which asks each in turn and runs the lines where none
    fits (`analysis.guarded`).  Returns, for the clusters whose first line is only a convolution they
    run ahead without its bias, what another edit ending on that line needs to carry them."""
    carried: dict[str, tuple[str, str]] = {}
    groups: dict[tuple[str, int, int], list[_Placed]] = {}
    for p in placed:
        groups.setdefault((os.path.abspath(p.region.file), p.region.first, p.region.last), []).append(p)
    for group in groups.values():
        kinds: dict[tuple[str, ...], list[_Placed]] = {}  # the kernels whose rewrites of the lines are one
        for p in group:
            kinds.setdefault((*p.region.arguments, "|", *p.region.conditions), []).append(p)
        subgroups = _merge_skipped_calls(list(kinds.values()))
        lines = source.lines if group[0].function is None else group[0].lines
        written: list[Guarded] = []
        for same in subgroups:
            alternatives = [Alternative(p.call, bool(p.region.checks)) for p in same]
            try:
                written.append(guarded(same[0].region, alternatives, lines))
            except NoRegion as exc:
                for p in same:
                    p.cluster.apply_detail = f"{p.cluster.mapping_detail}; {exc}" if p.function else str(exc)
                written.append(Guarded(""))
        usable = [(same, text) for same, text in zip(subgroups, written, strict=True) if text.text]
        if not usable:
            continue
        if len(usable) > 1:
            # Kernels that each need the lines rewritten otherwise: each rewrite where its `if`s hold
            # (those asked on a test first); where that cannot tell them apart, the first rewrite only.
            usable.sort(key=lambda u: not (u[0][0].region.conditions and u[0][0].region.conditions_first))
            try:
                both = dispatched([same[0].region for same, _ in usable], [text for _, text in usable], lines)
                usable = [([p for same, _ in usable for p in same], both)]
            except NoRegion:
                _refuse_other_rewrites(usable)
                usable = usable[:1]
        same, text = usable[0]
        first = same[0]
        conv = carried_ahead(first.region, first.region.first) if len(kinds) == 1 else None
        rest = ""
        if conv:
            alternatives = [Alternative(p.call, bool(p.region.checks)) for p in same]
            rest = guarded(first.region, alternatives, lines, carried=first.region.first).text
        for p in same:
            others = [q.cluster.id for q in same if q is not p]
            if p.function is None:
                _attach_source_edit(report, p, text, others, module_path, source)
            else:
                _attach_library_patch(p, text, others)
            if conv:
                carried[p.cluster.id] = (conv, rest)
    return carried


def _merge_skipped_calls(subgroups: list[list[_Placed]]) -> list[list[_Placed]]:
    """Kernels for the same code whose calls differ only where one passes a module's call
    (`self.drop_path(x)`) and another its argument alone (`x`, where that module is an `nn.Identity` the
    kernel's `fits` checks for): one rewrite passes the call to both, which gives the `nn.Identity`'s
    kernel what it was made for."""
    merged: list[list[_Placed]] = []
    for same in subgroups:
        into = next((m for m in merged if _passes_calls_of(m[0].region, same[0].region)), None)
        if into is not None:
            into.extend(same)
            continue
        wider = next((m for m in merged if _passes_calls_of(same[0].region, m[0].region)), None)
        if wider is not None:
            merged[merged.index(wider)] = [*same, *wider]
            continue
        merged.append(list(same))
    return merged


def _passes_calls_of(calls: Region, bare: Region) -> bool:
    """Whether `calls` and `bare` rewrite the same code under the same tests, `calls` passing a module's
    call of each argument where `bare` passes the argument (and the same argument elsewhere), and
    `bare`'s kernel checks the modules it left out."""
    if not calls.same_code(bare) or calls.conditions != bare.conditions or calls.ahead != bare.ahead:
        return False
    if len(calls.arguments) != len(bare.arguments) or calls.arguments == bare.arguments or not bare.checks:
        return False
    return all(
        a == b or (a.startswith("self.") and a.endswith(f"({b})") and a[: -len(b) - 2].replace(".", "").isidentifier())
        for a, b in zip(calls.arguments, bare.arguments, strict=True)
    )


def _refuse_other_rewrites(usable: list[tuple[list[_Placed], Guarded]]) -> None:
    """The kernels left out where one rewrite of the lines is all the code can take, with why."""
    first = usable[0][0][0]
    lo, hi = first.region.first, first.region.last
    where = f"line {lo} also holds" if lo == hi else f"lines {lo}–{hi} also hold"
    for same, _ in usable[1:]:
        for p in same:
            if p.region.same_code(first.region):
                p.cluster.apply_detail = (
                    f"its code is {first.cluster.id}'s, called with other arguments, and no test of an `if` "
                    "tells their calls apart: one rewrite cannot ask both kernels"
                )
            else:
                p.cluster.apply_detail = (
                    f"{where} {first.cluster.id}, whose kernel the rewrite there asks: one rewrite asks one kernel"
                )


def _attach_source_edit(
    report: R.Report,
    placed: _Placed,
    written: Guarded,
    others: list[str],
    module_path: str,
    source: sourcemap.SourceIndex,
) -> None:
    cluster, region, name = placed.cluster, placed.region, placed.call
    original = "".join(line + "\n" for line in source.lines[region.first - 1 : region.last])
    names = [name, *(f"cluster{i[1:]}" for i in others)]
    cluster.edit = R.Edit(
        region.first,
        region.last,
        written.text,
        edits_mod.import_statement(report.file, module_path, names),
        region.statement(name),
        original,
        written.replaced,
        written.expression,
        list(others),
    )
    cluster.applies = "edit"
    cluster.apply_detail = (
        f"{_span(region)} `{region.statement(name)}` where the kernel fits, else the lines as written"
    )


def _attach_library_patch(placed: _Placed, written: Guarded, others: list[str]) -> None:
    """The library's lines rewritten to call the kernel through the kernel module, which the patch
    puts in the library module's namespace under `kernel_alias`, made for the code of the library's
    function and of the functions it calls whose ops the kernel computes."""
    cluster, region, call = placed.cluster, placed.region, placed.call
    assert placed.function is not None
    edit = R.Edit(region.first, region.last, written.text, "", region.statement(call), includes=list(others))
    cluster.patch = R.LibraryPatch(placed.function, edit, list(placed.calls))
    cluster.applies = "patch"
    name = call.rsplit(".", 1)[-1]
    cluster.apply_detail = (
        f"{placed.library.shown(region.file) if placed.library else region.file} {_span(region)} "
        f"`{region.statement(name)}` where the kernel fits, in a patch of {placed.function.qualname} that "
        "`install()` puts in place"
    )


def _span(region: Region) -> str:
    if region.first == region.last:
        return f"line {region.first} becomes"
    return f"lines {region.first}–{region.last} become"


def _launcher_params(cluster: R.Cluster) -> list[str]:
    params: list[str] = []
    gemm = cluster.kind == "gemm-epilogue"
    taken = {"self", "torch", "triton", "tl"} | (_GEMM_LOCALS if gemm else set())
    for k, info in enumerate(cluster.inputs):
        base = _identifier(info.name) or f"in{k}"
        numbered = gemm and re.fullmatch(r"(out|st)\d+", base) is not None  # the launcher's outputs and strides
        if base[0].isdigit() or base in params or base in taken or numbered:
            base = f"{base}_{k}"
        params.append(base)
    return params


# The names a GEMM cluster's launcher and public function give their own values (`codegen/gemm_launcher.py`).
_GEMM_LOCALS = {
    "a", "b", "batch", "M", "N", "K", "sa", "sb", "so", "shape", "groups", "index_64", "precision", "run",
    "tile", "grid", "paths", "tensors", "block_m", "block_n", "block_k", "group_m", "warps", "stages", "rows",
}  # fmt: skip


def _number_params(slots: list[ScalarSlot], taken: list[str]) -> list[str]:
    """A parameter name for each number of the model's state the kernel takes: `eps` for `self.eps`,
    `value<k>` for an expression (`math.sqrt(self.head_dim)`)."""
    names: list[str] = []
    for k, slot in enumerate(slots):
        base = _identifier(slot.text) if _is_reference(slot.text) else ""
        base = base or f"value{k}"
        if base in taken or base in names or base in ("self", "torch", "triton", "tl"):
            base = f"{base}_{k}"
        names.append(base)
    return names


def _is_reference(text: str) -> bool:
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return False
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _numbers(instance: Found, names: list[str]) -> list[R.Number]:
    region = instance.mapping.region
    passed = region.arguments[len(instance.plan.inputs) :] if region is not None else []
    return [
        R.Number(
            name,
            float(slot.value),
            "float" if isinstance(slot.value, float) else "int",
            slot.text,
            passed[k] if k < len(passed) else None,
            slot.runtime,
        )
        for k, (name, slot) in enumerate(zip(names, instance.plan.scalars, strict=True))
    ]


def _identifier(text: str | None) -> str:
    """A parameter name for an argument's source text: `x` for `x`, `weight` for `self.norm.weight`,
    `matmul` for `torch.matmul(q, k)`, `e` for `e[:, :, None]`."""
    try:
        node: ast.AST = ast.parse(text or "", mode="eval").body
    except SyntaxError:
        return ""
    while True:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            return node.attr
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return ""


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
    """clusterN names the file already imports from its kernel module, and those the module's library
    patches call: they keep their kernels."""
    module = os.path.splitext(os.path.basename(module_path))[0]
    names: set[str] = set()
    try:
        tree = parse(source_text)
    except SyntaxError:
        tree = None
    for node in ast.walk(tree) if tree else []:
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == module:
            names |= {a.name for a in node.names}
    try:  # (a FIFO or a file of gigabytes there is no module of ours: not read, never waited on)
        module_text = read_text(module_path, MAX_KERNEL_MODULE_BYTES, errors="replace")
    except OSError:
        return names
    for kernels in patched_kernels(module_text).values():
        names |= set(kernels)
    return names
