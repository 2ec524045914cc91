"""Line edits: whole lines of a source text replaced, or lines inserted, as every fix writes them."""

from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass(frozen=True)
class LineEdit:
    """Replace lines `start..end` (1-based, inclusive) with `text`; `end == start - 1` inserts."""

    start: int
    end: int
    text: str  # whole lines, each ending in a newline


def apply_line_edits(source: str, edits: list[LineEdit]) -> str:
    lines = source.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    for edit in sorted(edits, key=lambda e: (e.start, e.end), reverse=True):
        lines[edit.start - 1 : edit.end] = [edit.text] if edit.text else []
    return "".join(lines)


def after_imports_in(tree: ast.Module) -> int:
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


def after_imports(source: str) -> int:
    """The line after the last import at the top of `source` (1 when it does not parse)."""
    try:
        return after_imports_in(ast.parse(source))
    except SyntaxError:
        return 1
