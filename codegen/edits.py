"""Call-site edits: the text changes that put generated kernels into the user's file.

Everything here is a pure function of the source text and the report, so the language
server (quick fixes) and `fuselens apply` produce identical edits.  Only clusters whose
mapping is `exact` carry an edit; nothing else is ever touched.  A cluster in a library's code
changes one thing in the file: the kernel module's `install()` is imported and called, once.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field

from fuselens.contracts.report import Cluster, Report

from . import rewrites as rewrites_mod
from .line_edits import LineEdit, after_imports_in, apply_line_edits

INSTALL = "install"  # the kernel module's function that puts its library patches in place
_INSTALL_CALL = f"{INSTALL}()  # fused kernels inside the library's code (the kernel module's uninstall() undoes it)\n"


def kernel_module_path(model_file: str, out_dir: str | None = None) -> str:
    """`<model>_kernels.py` beside the model (or in `out_dir`), named so that it can be imported
    (`qwen2-moe.py` gets `qwen2_moe_kernels.py`)."""
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(model_file))[0])
    stem = f"_{stem}" if stem[:1].isdigit() else stem
    directory = out_dir or os.path.dirname(os.path.abspath(model_file))
    return os.path.join(directory, f"{stem}_kernels.py")


def import_statement(model_file: str, module_path: str, names: list[str]) -> str:
    """The import of `names` from the kernel module, as `fuselens apply` writes it.

    Beside the model, it is tried relative first, then absolute: the same lines work when the
    model runs as a script (its folder is on sys.path) and when it is imported as part of a package
    from its parent folder (a folder without `__init__.py` included).  Elsewhere (`--out-dir`), the
    module is imported by name."""
    module = _module_name(module_path)
    listed = ", ".join(sorted(names, key=natural_order))
    if os.path.dirname(os.path.abspath(module_path)) != os.path.dirname(os.path.abspath(model_file)):
        return f"from {module} import {listed}"
    return (
        f"try:  # the fused kernels beside this file, imported as a package's module or by a script\n"
        f"    from .{module} import {listed}\n"
        f"except ImportError:\n"
        f"    from {module} import {listed}"
    )


def _module_name(module_path: str) -> str:
    return os.path.splitext(os.path.basename(module_path))[0]


def import_edit(source: str, model_file: str, module_path: str, wanted: list[str]) -> LineEdit:
    """Add `wanted` to the file's import of the kernel module: merged with the names an existing
    import brings (replacing it, in whichever form it was written), else a new import after the others.
    When `install` is wanted and the file does not call it yet, the call follows the import."""
    module = _module_name(module_path)
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = None
    call = _INSTALL_CALL if INSTALL in wanted and not (tree and _calls_install(tree)) else ""
    for node in tree.body if tree is not None else []:
        have = _imported_from(node, module)
        if have is not None:
            names = sorted(set(have) | set(wanted), key=natural_order)
            end = node.end_lineno or node.lineno
            return LineEdit(node.lineno, end, import_statement(model_file, module_path, names) + "\n" + call)
    at = after_imports_in(tree) if tree is not None else 1
    return LineEdit(at, at - 1, import_statement(model_file, module_path, wanted) + "\n" + call)


def _calls_install(tree: ast.Module) -> bool:
    """Whether the module's top level calls `install()` already."""
    return any(_is_install_call(node) for node in tree.body)


def _imported_from(node: ast.stmt, module: str) -> list[str] | None:
    """The names a top-level statement imports from `module`: `from [.]module import ...`, or the
    try/except form `import_statement` writes; None for any other statement."""
    if isinstance(node, ast.ImportFrom) and (node.module or "") == module and node.level <= 1:
        return [a.name for a in node.names]
    if isinstance(node, ast.Try) and len(node.body) == 1 and len(node.handlers) == 1:
        first, fallback = node.body[0], node.handlers[0].body
        if len(fallback) == 1 and _imported_from(first, module) is not None:
            second = _imported_from(fallback[0], module)
            if second is not None:
                return [a.name for a in first.names] if isinstance(first, ast.ImportFrom) else second
    return None


def natural_order(name: str):
    """Sort key that puts cluster2 before cluster10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def cluster_edits(source: str, report: Report, cluster_ids: list[str] | None = None) -> list[LineEdit]:
    """Edits for the clusters `cluster_ids` that apply (all of them when None), import included: the
    call-site edits of exact clusters, and the `install()` of library patches."""
    chosen: list[Cluster] = []
    for _, cluster in report.clusters():
        appliable = (cluster.edit is not None and cluster.mapping == "exact") or cluster.patch is not None
        if appliable and cluster.kernel and (cluster_ids is None or cluster.id in cluster_ids):
            chosen.append(cluster)
    if not chosen:
        return []
    # An edit that includes another chosen cluster's (their code shares lines) writes both calls; kernels
    # made for the same lines share one edit, which asks each in turn.
    nested = {
        i for c in chosen if c.edit is not None for i in c.edit.includes if _edit_of(by_id(report, i)) != _edit_of(c)
    }
    by_id_map = {c.id: c for _, c in report.clusters()}
    edits = list(
        dict.fromkeys(
            LineEdit(c.edit.start_line, c.edit.end_line, c.edit.text) for c in chosen if c.edit and c.id not in nested
        )
    )
    names = [c.kernel.name for c in chosen if c.kernel and c.edit is not None]
    names += [
        k.name for c in chosen if c.edit for i in c.edit.includes if (k := by_id_map[i].kernel) and k.name not in names
    ]
    if any(c.patch is not None for c in chosen):
        names.append(INSTALL)
    module_path = next(c.kernel.path for c in chosen if c.kernel)
    edits.append(import_edit(source, report.file, module_path, names))
    return edits


def fix_edits(source: str, report: Report, ids: list[str] | None = None) -> list[LineEdit]:
    """The edits that apply the clusters and rewrites `ids` (all of them when None) to `source`: the
    clusters' edits but for those a chosen rewrite replaces (their ops are the rewrite's, or their lines
    are), then the rewrites' (`rewrites.rewrite_edits`; `rewrites.Stale` when a rewrite's lines are no
    longer as it was made from them)."""
    rewrites = rewrites_mod.chosen_rewrites(report, ids)
    replaced = rewrites_mod.replaced_clusters(report, rewrites)
    clusters = [c.id for _, c in report.clusters() if (ids is None or c.id in ids) and c.id not in replaced]
    edits = cluster_edits(source, report, clusters) if clusters else []
    return edits + rewrites_mod.rewrite_edits(source, rewrites)


def by_id(report: Report, cluster_id: str) -> Cluster | None:
    return next((c for _, c in report.clusters() if c.id == cluster_id), None)


def _edit_of(cluster: Cluster | None) -> tuple[int, int, str] | None:
    edit = cluster.edit if cluster is not None else None
    return (edit.start_line, edit.end_line, edit.text) if edit is not None else None


@dataclass
class Restore:
    """How to put back the code of applied clusters and rewrites: the edits, the kernels (and rewrite
    records) they restore, and why the others cannot be (the user changed the call since)."""

    edits: list[LineEdit]
    restored: list[str]
    refused: list[str]
    labels: dict[str, str] = field(default_factory=dict)  # a restored rewrite record's name -> what it rewrote


_REPLACED_RE = re.compile(r"_(\w+)_replaced")


def kept_originals(module_text: str) -> dict[str, tuple[str, str]]:
    """kernel name -> (the lines `apply` wrote, the lines they replaced), as the kernel module keeps
    them (`_cluster0_replaced = ("...", "...")`); read from its syntax tree, never run."""
    kept = {}
    for match, value in rewrites_mod.named_assignments(module_text, _REPLACED_RE):
        if isinstance(value, ast.Tuple) and len(value.elts) == 2:
            texts = [e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len(texts) == 2:
                kept[match.group(1)] = (texts[0], texts[1])
    return kept


def restore_edits(
    source: str, model_file: str, module_path: str, module_text: str, names: list[str] | None = None
) -> Restore:
    """Edits that put back the original lines of the kernels `names` the file calls and of the rewrites
    `names` (their records' names) it holds (all of them, and the library patches' `install()`, when
    None), and drop them from the kernel module's import (and the imports only the rewrites used)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return Restore([], [], ["the file does not parse: fix it first"])
    if source and not source.endswith("\n"):
        source += "\n"  # its last line found as apply wrote it, ended (`apply_line_edits` ends it so)
    module = _module_name(module_path)
    imported = next((have for n in tree.body if (have := _imported_from(n, module)) is not None), [])
    kept = kept_originals(module_text)
    records = rewrites_mod.kept_rewrites(module_text)
    wanted = [n for n in imported if n in kept] if names is None else [n for n in names if n not in records]
    lines = source.splitlines(keepends=True)
    result = Restore([], [], [])
    pending = list(wanted)
    while pending:
        name = pending.pop(0)
        if name in result.restored:
            continue  # restored with lines another kernel's call shares
        if name not in kept or name not in imported:
            result.refused.append(f"{name}: the file does not call it from {module}")
            continue
        # Its own lines, or those of a kernel whose edit carried its call (their code shares lines).
        carriers = [name] + [k for k in kept if k != name and re.search(rf"\b{name}\(", kept[k][0])]
        found = [(k, at) for k in carriers if (at := _only_place(lines, kept[k][0].splitlines(keepends=True)))]
        if not found:
            call = kept[name][0]
            result.refused.append(f"{name}: its call is no longer as apply wrote it (`{call.strip()}`)")
            continue
        carrier, at = found[0]
        call, original = kept[carrier]
        lines[at - 1 : at - 1 + len(call.splitlines())] = original.splitlines(keepends=True)
        # The kernels the written lines call and the lines they replace do not (an earlier fix's call, which
        # those lines carried, stays: its own lines are then back in view, and restored next).
        calls = [k for k in imported if re.search(rf"\b{k}\(", call) and not re.search(rf"\b{k}\(", original)]
        result.restored += [k for k in calls if k not in result.restored]
        if name not in result.restored:
            pending.insert(0, name)
    gone = set(result.restored)
    if names is None and INSTALL in imported:
        gone.add(INSTALL)
        result.restored.append(INSTALL)
    restored = _without_imports("".join(lines), model_file, module_path, module, gone)
    asked = None if names is None else [n for n in names if n in records]
    if asked is None or asked:
        rewritten = rewrites_mod.restore_rewrites(restored, records, asked)
        restored = rewritten.text
        result.restored += rewritten.restored
        result.refused += rewritten.refused
        result.labels.update(rewritten.labels)
    result.edits = _changed_lines(source, restored)
    return result


def _without_imports(text: str, model_file: str, module_path: str, module: str, gone: set[str]) -> str:
    """`text` without the names `gone` in its import of the kernel module (nor `install()`'s call)."""
    if not gone:
        return text
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    edits = []
    if INSTALL in gone:
        edits += [LineEdit(n.lineno, n.end_lineno or n.lineno, "") for n in tree.body if _is_install_call(n)]
    statement, imported = next(
        ((n, have) for n in tree.body if (have := _imported_from(n, module)) is not None), (None, [])
    )
    if statement is not None:
        left = [n for n in imported if n not in gone]
        kept = import_statement(model_file, module_path, left) + "\n" if left else ""
        edits.append(LineEdit(statement.lineno, statement.end_lineno or statement.lineno, kept))
    return apply_line_edits("".join(lines), edits)


def _changed_lines(before: str, after: str) -> list[LineEdit]:
    """One edit that turns `before` into `after`: the lines between what they share at both ends."""
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    if old and not old[-1].endswith("\n"):
        old[-1] += "\n"
    if old == new:
        return []
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    return [LineEdit(head + 1, len(old) - tail, "".join(new[head : len(new) - tail]))]


def _only_place(lines: list[str], block: list[str]) -> int | None:
    """The 1-based line where `block` starts in `lines`, when it occurs exactly once."""
    places = [i + 1 for i in range(len(lines) - len(block) + 1) if lines[i : i + len(block)] == block]
    return places[0] if len(places) == 1 and block else None


def _is_install_call(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == INSTALL
    )
