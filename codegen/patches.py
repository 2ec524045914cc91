"""Library patches: the text that runs fused kernels inside an installed library's functions.

For each library function that holds applied clusters, the kernel module carries a copy of it
with those clusters' lines rewritten to call the kernels, and registers it.  `install()` puts the
copy's code object in the library function (`function.__code__`), which keeps the function's
globals, defaults, closure and decorators: every caller of it, in every model built before or
after, runs the kernels; the kernels fall back to the library's own operators wherever they
cannot run.  The copy closes over the same names as the library's function, so that the function
keeps its own closure cells.  `install()` first finds the function as the analysis did, and checks
that its code, and that of the functions whose code the kernels compute, is still the code the copy
was made for (the registration carries each one's fingerprint; the kernel module carries the
analysis's own `analysis/code_identity.py` to find and compare them): another version of the library
is left alone, with a warning that says what differs.  `uninstall()` puts the library's code back.

The copies reach the kernels through one name (`kernel_alias`) that `install()` binds in the
library module's namespace.  Text only: the language server builds these sections from a report.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re

from fuselens.contracts.report import CalledCode, Cluster, LibraryFunction

from .edits import natural_order
from .runtime_source import runtime_source

MARKER = "# ---- library patch: "
MARKER_RE = re.compile(r"^# ---- library patch: ([\w.]+): (\w+(?:, \w+)*)$", re.M)


def kernel_alias(module_path: str) -> str:
    """The name patched library code reaches the kernel module by: `_fuselens_llama_kernels`."""
    stem = os.path.splitext(os.path.basename(module_path))[0]
    return "_fuselens_" + re.sub(r"\W", "_", stem)


def patch_sections(clusters: list[Cluster]) -> dict[str, str]:
    """{"module.qualname": section} for the library functions holding `clusters` (those with a patch)."""
    by_function: dict[str, list[Cluster]] = {}
    for c in clusters:
        if c.patch is not None:
            f = c.patch.function
            by_function.setdefault(f"{f.module}.{f.qualname}", []).append(c)
    return {key: _section(key, group) for key, group in by_function.items()}


def patched_kernels(module_text: str) -> dict[str, list[str]]:
    """{"module.qualname": kernel names} of the patch sections in a kernel module."""
    return {m.group(1): m.group(2).split(", ") for m in MARKER_RE.finditer(module_text)}


def _section(key: str, clusters: list[Cluster]) -> str:
    function = clusters[0].patch.function  # type: ignore[union-attr]
    names = sorted((c.kernel.name for c in clusters if c.kernel), key=natural_order)
    copy = _copy(function, _applied(clusters, function), _calls(clusters))
    return f"{MARKER}{key}: {', '.join(names)}\n\n{copy}"


def _applied(clusters: list[Cluster], function: LibraryFunction) -> str:
    """The function's text with each cluster's lines replaced by its call (regions never overlap:
    a later one that would is left out)."""
    lines = function.source.splitlines(keepends=True)
    taken: list[tuple[int, int]] = []
    for c in sorted(clusters, key=lambda c: c.patch.edit.start_line):  # type: ignore[union-attr]
        edit = c.patch.edit  # type: ignore[union-attr]
        if any(edit.start_line <= last and edit.end_line >= first for first, last in taken):
            continue
        taken.append((edit.start_line, edit.end_line))
    edits = {c.patch.edit.start_line: c.patch.edit for c in clusters}  # type: ignore[union-attr]
    for first, last in sorted(taken, reverse=True):
        lines[first - function.first_line : last - function.first_line + 1] = [edits[first].text]
    return "".join(lines)


def _calls(clusters: list[Cluster]) -> list[CalledCode]:
    """The functions whose code the clusters' kernels compute, each once."""
    found: dict[tuple[str, str], CalledCode] = {}
    for c in clusters:
        for called in c.patch.calls if c.patch else []:
            found.setdefault((called.module, called.qualname), called)
    return [found[key] for key in sorted(found)]


def _copy(function: LibraryFunction, text: str, calls: list[CalledCode]) -> str:
    """The patched function as the kernel module defines it: a method inside a class (so that
    `super()` finds a `__class__` cell, as in the library), a function at top level; no decorators
    (the library's stay on its function), no defaults or annotations (the library's function keeps
    its own: only the code is swapped), closing over the names the library's function closes over;
    then its registration."""
    lines = text.splitlines(keepends=True)
    indent = lines[0][: len(lines[0]) - len(lines[0].lstrip())]
    flat = "".join(line[len(indent) :] if line.startswith(indent) else line for line in lines)
    node = ast.parse(flat).body[0]
    assert isinstance(node, ast.FunctionDef)
    body = flat.splitlines(keepends=True)[node.body[0].lineno - 1 :]
    if node.body[0].lineno == node.lineno:  # `def f(x): return x`
        body = ["    " + ast.unparse(stmt) + "\n" for stmt in node.body]
    free = function.fingerprint.free_variables
    if free:
        body = [_closure_reference(free, body[0]), *body]
    header = f"def {node.name}({_parameters(node.args)}):\n"
    owner, _, _ = function.qualname.rpartition(".")
    where = f"{function.file.rsplit(os.sep, 1)[-1]} line {function.first_line}"
    if not owner:
        copy = f"{header}{''.join(body)}"
        replacement = node.name
    else:
        wrapper = f"_Patched_{owner.replace('.', '_')}"
        copy = f"class {wrapper}:  # {function.qualname} as in {where}\n" + _indented([header, *body])
        replacement = f"{wrapper}.{node.name}"
    # A method's `__class__` cell is its class's; any other name the copy closes over is a local of a
    # function around it, as the library's function's are of the function around that.
    enclosing = [name for name in free if not (owner and name == "__class__")]
    if enclosing:
        factory = "_closure_of_" + replacement.replace(".", "_").lstrip("_")
        names = " = ".join(enclosing)
        copy = (
            f"def {factory}():\n    {names} = None  # the names {function.qualname} closes over\n"
            f"{_indented(copy.splitlines(keepends=True))}\n    return {replacement}\n"
        )
        replacement = f"{factory}()"
    return f"{copy.rstrip()}\n\n\n{_registration(function, replacement, calls)}"


def _closure_reference(free: list[str], first: str) -> str:
    """A line that never runs, naming the variables the library's function closes over (its first
    statement's indentation is `first`'s): the copy's code object then has those free variables, in
    the same order (CPython orders them by name), where the rewritten lines no longer name one (a
    `super()` call a kernel replaced); so the library's function keeps its own cells when its code is
    swapped, and its `__class__` is the library's class."""
    pad = first[: len(first) - len(first.lstrip())]
    return f"{pad}if False: {', '.join(free)}  # the names the library's code closes over\n"


def _indented(lines: list[str]) -> str:
    return "".join("    " + line if line.strip() else line for line in lines)


def _registration(function: LibraryFunction, replacement: str, calls: list[CalledCode]) -> str:
    """The call that hands `install()` the copy, where it goes, the code it was made for and the code
    of the functions its kernels compute."""
    lines = [
        f"    {function.module!r}, {function.qualname!r}, {function.first_line}, {replacement},",
        f"    made_for={dataclasses.asdict(function.fingerprint)!r},",
    ]
    if calls:
        lines.append("    calls=[")
        lines += [
            f"        ({c.module!r}, {c.qualname!r}, {c.first_line}, {dataclasses.asdict(c.fingerprint)!r}),"
            for c in calls
        ]
        lines.append("    ],")
    return "_library_patch(\n" + "\n".join(lines) + "\n)\n"


def _parameters(args: ast.arguments) -> str:
    """The parameter list without defaults or annotations: the names and kinds the code object has."""
    bare = ast.arguments(
        posonlyargs=[ast.arg(a.arg) for a in args.posonlyargs],
        args=[ast.arg(a.arg) for a in args.args],
        vararg=ast.arg(args.vararg.arg) if args.vararg else None,
        kwonlyargs=[ast.arg(a.arg) for a in args.kwonlyargs],
        kw_defaults=[None] * len(args.kwonlyargs),
        kwarg=ast.arg(args.kwarg.arg) if args.kwarg else None,
        defaults=[],
    )
    return ast.unparse(bare)


def runtime(alias: str) -> str:
    """`install()`, `uninstall()` and what they need (`runtime/patches.py`), for a module whose kernels
    patched code reaches as `alias`."""
    text = runtime_source("patches", values={"_ALIAS": repr(alias)})
    return f"# ---- library patches: install() runs the fused kernels inside a library's code\n\n{text}"
