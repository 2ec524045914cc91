"""The library modules a model needs: what the worker host keeps imported.

Jobs are forks of the warm worker host, and each imported a model's library (transformers' Llama:
seconds of CPU) afresh, on every save; the host imports what the server names here once
(`worker/preload.py`), and the jobs forked after that start with it.  Before a file's job the server
names the file's own imports (`file_imports`, from its syntax tree: nothing of the file runs here),
so that its first job starts with them; after it, the modules its analysis found the model's code
in, and torch's symbolic-shape modules for a model with dynamic sizes (`library_modules`).
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Iterator

from fuselens.contracts.report import Report
from fuselens.worker.protocol import ModuleImport

MAX_IMPORTS = 64  # the most import statements of one file the host is asked to run
MAX_SOURCE_CHARS = 1 << 20  # a longer buffer is no model's file: its imports are not read
ALWAYS_IMPORTED = frozenset({"torch"})  # what the worker host imports as it starts

# What following a model's declared sizes as symbols imports (`analysis/symbolic.py`): torch's shape
# environment, which imports all of torch._dynamo (seconds of CPU) the first time it is made.
SYMBOLIC_SHAPE_MODULES = ("torch._dynamo", "torch.fx.experimental.symbolic_shapes", "torch._subclasses.fake_tensor")


def library_modules(report: Report) -> list[str]:
    """The import names of the installed libraries' files that hold the report's clusters' ops, in
    the order they come ("transformers.models.llama.modeling_llama"), and torch's symbolic-shape
    modules when a model of the report has dynamic sizes."""
    found: dict[str, None] = {}
    if any(model.dynamic is not None for model in report.models):
        found.update(dict.fromkeys(SYMBOLIC_SHAPE_MODULES))
    for _, cluster in report.clusters():
        for file in [cluster.file, *(op.file for op in cluster.ops)]:
            name = _module_name(report, file)
            if name:
                found[name] = None
    return list(found)


def _module_name(report: Report, file: str) -> str:
    """The import name of `file` in one of the report's libraries ("" in none)."""
    for library in report.libraries:
        package = os.path.join(library.root, library.name)
        if not file.startswith(package + os.sep) or not file.endswith(".py"):
            continue
        parts = os.path.relpath(file[: -len(".py")], library.root).split(os.sep)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)
    return ""


def file_imports(text: str) -> list[ModuleImport]:
    """The absolute import statements that run when the file `text` is imported (at module level, in
    its `if`, `try` and `with` blocks and its class bodies, not in its functions nor under `if
    TYPE_CHECKING`), of modules outside the standard library and torch, in the order they come; []
    for a file that does not parse."""
    if len(text) > MAX_SOURCE_CHARS:
        return []
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    found: dict[tuple[str, tuple[str, ...]], None] = {}
    for node in _run_at_import(tree.body):
        statements: list[tuple[str, tuple[str, ...]]]
        if isinstance(node, ast.Import):
            statements = [(alias.name, ()) for alias in node.names]
        elif node.level == 0 and node.module:
            statements = [(node.module, tuple(alias.name for alias in node.names))]
        else:
            continue  # a relative import: the project's own package
        for module, names in statements:
            top = module.partition(".")[0]
            if top not in ALWAYS_IMPORTED and top not in sys.stdlib_module_names:
                found[(module, names)] = None
    return [ModuleImport(module, list(names)) for module, names in found][:MAX_IMPORTS]


def _run_at_import(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of `body` that importing the module runs (or may, down a branch)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _type_checking(node.test):
            yield from _run_at_import(node.orelse)
        elif isinstance(node, ast.If | ast.For | ast.While | ast.AsyncFor):
            yield from _run_at_import(node.body)
            yield from _run_at_import(node.orelse)
        elif isinstance(node, ast.With | ast.AsyncWith | ast.ClassDef):
            yield from _run_at_import(node.body)
        elif isinstance(node, ast.Try | ast.TryStar):
            yield from _run_at_import(node.body)
            for handler in node.handlers:
                yield from _run_at_import(handler.body)
            yield from _run_at_import(node.orelse)
            yield from _run_at_import(node.finalbody)


def _type_checking(test: ast.expr) -> bool:
    """`TYPE_CHECKING` or `typing.TYPE_CHECKING`: a block that never runs."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )
