"""What in a file could be a model, from its syntax alone (nothing is imported).

A model is a class deriving from `nn.Module` (directly, through another class of the file, or
through a library's model class), an `nn.Module` object bound at module level
(`model = AutoModelForCausalLM.from_config(cfg)`), or a model class imported from another of
the user's files and configured for this one.  Which of the candidates found here really are
models is decided once the file is imported (`loader.find_models`); this pass gives their lines,
the text an inline `# fuselens:` comment is read from, and whether importing the file is worth it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from .parsed import parse


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


@dataclass
class Binding:
    """A module-level `name = <call>`: it may bind a model object."""

    name: str
    line: int
    end_line: int
    text: str  # the statement's lines (an inline `# fuselens:` comment may sit on any of them)


@dataclass
class Candidates:
    """Everything of a file that may turn out to be a model."""

    classes: list[ClassInfo] = field(default_factory=list)
    bindings: list[Binding] = field(default_factory=list)
    imports: dict[str, int] = field(default_factory=dict)  # imported name -> its import line

    def worth_importing(self) -> bool:
        """Whether anything here can be a model (a file of plain functions is not imported)."""
        return bool(self.classes or self.bindings)

    def outermost(self) -> set[str]:
        """Classes no other class of the file uses: the file's outermost models."""
        return {c.name for c in top_level(self.classes)}


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_base_name(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    return ""


def find_candidates(source: str) -> Candidates:
    tree = parse(source)
    lines = source.splitlines()
    return Candidates(_classes(tree, lines), _bindings(tree, lines), _imports(tree))


def find_classes(source: str) -> list[ClassInfo]:
    """Top-level classes with a base class: each may derive from nn.Module (imports decide)."""
    return _classes(parse(source), source.splitlines())


def _classes(tree: ast.Module, lines: list[str]) -> list[ClassInfo]:
    classes = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or not node.bases:
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
        classes.append(info)
    return classes


def _bindings(tree: ast.Module, lines: list[str]) -> list[Binding]:
    out = []
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Call):
            targets = [node.target]
        end = node.end_lineno or node.lineno
        text = " ".join(lines[node.lineno - 1 : end])
        out += [Binding(t.id, node.lineno, end, text) for t in targets if isinstance(t, ast.Name)]
    return out


def _imports(tree: ast.Module) -> dict[str, int]:
    found = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                found[alias.asname or alias.name] = node.lineno
    return found


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
