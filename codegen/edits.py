"""Call-site edits: the text changes that put generated kernels into the user's file.

Everything here is a pure function of the source text and the report, so the language
server (quick fixes) and `fuselens apply` produce identical edits.  Only clusters whose
mapping is `exact` carry an edit; nothing else is ever touched.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass

from fuselens.contracts.report import Cluster, Edit, Report


@dataclass(frozen=True)
class LineEdit:
    """Replace lines `start..end` (1-based, inclusive) with `text`; `end == start - 1` inserts."""

    start: int
    end: int
    text: str  # whole lines, each ending in a newline


def kernel_module_path(model_file: str, out_dir: str | None = None) -> str:
    stem = os.path.splitext(os.path.basename(model_file))[0]
    directory = out_dir or os.path.dirname(os.path.abspath(model_file))
    return os.path.join(directory, f"{stem}_kernels.py")


def import_statement(model_file: str, module_path: str, names: list[str]) -> str:
    """`from example_net_kernels import cluster0` (relative inside a package)."""
    module = os.path.splitext(os.path.basename(module_path))[0]
    same_dir = os.path.dirname(os.path.abspath(module_path)) == os.path.dirname(os.path.abspath(model_file))
    in_package = os.path.exists(os.path.join(os.path.dirname(os.path.abspath(model_file)), "__init__.py"))
    prefix = "." if same_dir and in_package else ""
    return f"from {prefix}{module} import {', '.join(names)}"


_IMPORT_RE = re.compile(r"^from\s+(\.?[\w.]+)\s+import\s+(.+)$")


def import_edit(source: str, statement: str) -> LineEdit:
    """Add `statement`'s names: merged into an existing import of the module, else a new line."""
    match = _IMPORT_RE.match(statement)
    assert match, statement
    module, wanted = match.group(1), [n.strip() for n in match.group(2).split(",")]
    lines = source.splitlines(keepends=True)
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = None
    if tree is not None:
        for node in tree.body:
            if (
                isinstance(node, ast.ImportFrom)
                and ("." * node.level + (node.module or "")) == module
                and node.lineno == node.end_lineno
            ):
                have = [a.name for a in node.names]
                missing = [n for n in wanted if n not in have]
                if not missing:
                    return LineEdit(node.lineno, node.lineno, lines[node.lineno - 1])
                merged = f"from {module} import {', '.join(sorted(set(have + missing), key=natural_order))}\n"
                return LineEdit(node.lineno, node.lineno, merged)
    at = _after_imports(tree) if tree is not None else 1
    return LineEdit(at, at - 1, statement + "\n")


def natural_order(name: str):
    """Sort key that puts cluster2 before cluster10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _after_imports(tree: ast.Module) -> int:
    """The line after the last import at the top of the module (after the docstring)."""
    last = 0
    for i, node in enumerate(tree.body):
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (
            i == 0
            and isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            last = node.end_lineno or node.lineno
        elif isinstance(node, ast.If) and last:  # `if TYPE_CHECKING:` and the like end the header
            break
        else:
            break
    return last + 1


def cluster_edits(source: str, report: Report, cluster_ids: list[str] | None = None) -> list[LineEdit]:
    """Edits for the exact clusters `cluster_ids` (all exact ones when None), import included."""
    chosen: list[tuple[Cluster, Edit]] = []  # each with its edit, known here to be there
    for _, cluster in report.clusters():
        if cluster.edit is None or cluster.mapping != "exact":
            continue
        if cluster_ids is None or cluster.id in cluster_ids:
            chosen.append((cluster, cluster.edit))
    if not chosen:
        return []
    edits = [LineEdit(e.start_line, e.end_line, e.text) for _, e in chosen]
    names = [c.kernel.name for c, _ in chosen if c.kernel]
    module = chosen[0][1].import_line.split(" import ")[0] + " import " + ", ".join(names)
    edits.append(import_edit(source, module))
    return edits


def apply_line_edits(source: str, edits: list[LineEdit]) -> str:
    lines = source.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    for edit in sorted(edits, key=lambda e: (e.start, e.end), reverse=True):
        lines[edit.start - 1 : edit.end] = [edit.text] if edit.text else []
    return "".join(lines)
