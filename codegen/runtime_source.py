"""The kernel module's runtime, as source text.

The modules under `codegen/runtime/` are real Python: linted, type-checked and unit-tested as they
are.  Every kernel module carries a copy of their text, so that it imports nothing of fuselens: a
module's copy is what follows its line `# ---- the kernel module's copy starts here`, where

- an import from fuselens stands for the imported module's functions, written out as their source
  (the analysis's own code, which the copy calls as the module does);
- the names in `inline` (constants the module defines above the copy) are written as their values;
- the names in `values` (assigned in the copy) are assigned another value.

Read as files, never imported: the runtime imports torch, and kernel modules are also assembled in
the language server, which never loads it.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import tokenize
import types
from pathlib import Path

_RUNTIME = Path(__file__).parent / "runtime"
MARKER = "# ---- the kernel module's copy starts here"


def runtime_source(name: str, inline: tuple[str, ...] = (), values: dict[str, str] | None = None) -> str:
    """The copy of `runtime/<name>.py`, without blank lines around it."""
    text = (_RUNTIME / f"{name}.py").read_text(encoding="utf-8")
    head, marker, copy = text.partition(MARKER + "\n")
    if not marker:
        raise ValueError(f"runtime/{name}.py has no line {MARKER!r}")
    constants = _constants(ast.parse(head))
    copy = _with_values(copy, values or {})
    copy = _inlined(copy, {n: constants[n] for n in inline})
    return _with_imports_written_out(copy).strip("\n") + "\n"


def analysis_functions(module_name: str) -> str:
    """The functions of the fuselens module `module_name`, as their own text, in their order there."""
    module = importlib.import_module(module_name)
    functions = [
        value
        for value in vars(module).values()
        if isinstance(value, types.FunctionType) and value.__module__ == module.__name__
    ]
    return "\n\n".join(inspect.getsource(f).rstrip("\n") + "\n" for f in functions)


def _constants(tree: ast.Module) -> dict[str, str]:
    """The module's constants (`NAME = <literal>`), as their values' text."""
    found = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
            found[target.id] = repr(node.value.value)
    return found


def _with_values(copy: str, values: dict[str, str]) -> str:
    """`copy` with each module-level `name = ...` of `values` assigned its value there instead."""
    lines = copy.splitlines(keepends=True)
    for node in ast.parse(copy).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in values:
                value = node.value
                assert value.end_lineno == value.lineno and value.end_col_offset is not None  # one line
                line = lines[value.lineno - 1]
                lines[value.lineno - 1] = line[: value.col_offset] + values[name] + line[value.end_col_offset :]
    return "".join(lines)


def _inlined(copy: str, constants: dict[str, str]) -> str:
    """`copy` with each name of `constants` written as its value."""
    lines = copy.splitlines(keepends=True)
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(copy).readline) if t.type == tokenize.NAME]
    for t in reversed([t for t in tokens if t.string in constants]):
        row, col = t.start
        line = lines[row - 1]
        lines[row - 1] = line[:col] + constants[t.string] + line[col + len(t.string) :]
    return "".join(lines)


def _with_imports_written_out(copy: str) -> str:
    """`copy` with each import from fuselens replaced by the imported module's functions."""
    lines = copy.splitlines(keepends=True)
    for node in reversed(ast.parse(copy).body):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fuselens."):
            assert node.end_lineno is not None
            lines[node.lineno - 1 : node.end_lineno] = [analysis_functions(node.module or "")]
    return "".join(lines)
