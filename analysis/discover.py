"""Find the model classes a file defines, from its syntax alone (nothing is imported).

The server uses this to place code lenses before any analysis has run, and the worker
uses it to pick which classes to analyze and to read inline `# fuselens:` comments.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field


@dataclass
class ClassInfo:
    name: str
    line: int  # 1-based line of `class ...`
    end_line: int
    bases: list[str]
    comment: str  # the text of the class line (for an inline `# fuselens:` comment)
    forward_line: int | None = None
    references: set[str] = field(default_factory=set)  # names used in its body
    has_example_inputs: bool = False


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_base_name(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    return ""


def find_classes(source: str) -> list[ClassInfo]:
    """Top-level classes that look like nn.Modules (directly or via another class here)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    classes: dict[str, ClassInfo] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        info = ClassInfo(
            name=node.name,
            line=node.lineno,
            end_line=node.end_lineno or node.lineno,
            bases=[_base_name(b) for b in node.bases],
            comment=_class_line(lines, node),
        )
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "forward":
                info.forward_line = item.lineno
            if isinstance(item, ast.FunctionDef) and item.name == "example_inputs":
                info.has_example_inputs = True
        info.references = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        classes[node.name] = info

    def is_module(info: ClassInfo, seen: frozenset[str] = frozenset()) -> bool:
        for base in info.bases:
            if base.split(".")[-1] == "Module":
                return True
            parent = classes.get(base)
            if parent and parent.name not in seen and is_module(parent, seen | {info.name}):
                return True
        return False

    return [c for c in classes.values() if is_module(c)]


def _class_line(lines: list[str], node: ast.ClassDef) -> str:
    # The header can span lines (`class A(\n  nn.Module):  # fuselens: ...`); take them all.
    end = node.body[0].lineno - 1 if node.body else node.lineno
    return " ".join(lines[node.lineno - 1 : max(end, node.lineno)])


def top_level(classes: list[ClassInfo]) -> list[ClassInfo]:
    """Classes no other class in the file uses: the file's outermost models."""
    names = {c.name for c in classes}
    used = set()
    for c in classes:
        used |= (c.references & names) - {c.name}
    return [c for c in classes if c.name not in used]
