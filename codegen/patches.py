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
import inspect
import os
import re
import types

from fuselens.analysis import code_identity
from fuselens.contracts.report import CalledCode, Cluster, LibraryFunction

from .edits import natural_order

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


RUNTIME = '''
import functools
import hashlib
import importlib
import inspect
import os
import sys
import types
import warnings

_PATCHES = []  # (module, qualname, first line, the code it was made for, the code its kernels compute, the copy's code)
_INSTALLED = {}  # (module, qualname) -> (the library's function, its own code)
_ALIAS = "ALIAS"  # the name patched code reaches this module by, in the library's namespace


def _library_patch(module, qualname, first_line, replacement, made_for=None, calls=()):
    _PATCHES.append((module, qualname, first_line, made_for, tuple(calls), replacement.__code__))


# Finding a library function and saying what its code is: fuselens's own analysis/code_identity.py,
# the functions the analysis recorded `made_for` with.
CODE_IDENTITY


def _stands_in(code, own):
    """Whether `code` can replace `own`: the same name, parameters and closure."""
    kinds = inspect.CO_VARARGS | inspect.CO_VARKEYWORDS
    n = own.co_argcount + own.co_kwonlyargcount
    return (
        (code.co_name, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_freevars)
        == (own.co_name, own.co_argcount, own.co_posonlyargcount, own.co_kwonlyargcount, own.co_freevars)
        and code.co_varnames[:n] == own.co_varnames[:n]
        and code.co_flags & kinds == own.co_flags & kinds
    )


def _library_code(module, qualname):
    """(the library's function, its own code), also while a patch of this module is in it; (None, None)
    when it cannot be found."""
    if (module, qualname) in _INSTALLED:
        return _INSTALLED[(module, qualname)]
    try:
        function = find_function(importlib.import_module(module), qualname)
    except ImportError:
        return None, None
    return function, getattr(function, "__code__", None)


def _changes(own, first_line, made_for):
    """How the code `own` differs from the code a patch was made for, in words ("" when it does not)."""
    if own is None:
        return "it is not reachable by that name"
    if made_for is None:  # a patch written before patches recorded the code they were made for
        return "its patch does not record the code it was made for"
    changed = code_differences(made_for, fingerprint(own))
    if own.co_firstlineno != first_line:
        changed.insert(0, f"its first line ({first_line} → {own.co_firstlineno})")
    return f"{', '.join(changed)} {'differ' if len(changed) > 1 else 'differs'}" if changed else ""


def _refusal(module, qualname, first_line, made_for, calls, code):
    """(the library's function, "") when the patch's `code` may replace its code, else (None, why not)."""
    function, own = _library_code(module, qualname)
    why = _changes(own, first_line, made_for)
    if why:
        return None, f"{module}.{qualname} is not the code its fused kernels were made for: {why}"
    for called_module, called_qualname, called_first_line, called_made_for in calls:
        why = _changes(_library_code(called_module, called_qualname)[1], called_first_line, called_made_for)
        if why:
            return None, (
                f"{module}.{qualname} has fused kernels that compute {called_module}.{called_qualname}, which "
                f"is not the code they were made for: {why}"
            )
    if not _stands_in(code, own):
        return None, f"{module}.{qualname} does not take the parameters or close over the names of its patched copy"
    return function, ""


def _this_module():
    """This module as a module object (also when it was loaded without a place in sys.modules)."""
    module = sys.modules.get(__name__)
    if module is None or vars(module) is not globals():
        module = types.ModuleType(__name__)
        vars(module).update(globals())
    return module


def install():
    """Run the fused kernels inside the library functions patched below, in every model that calls
    them (built before or after).  A function whose code is not the code its patch was made for, or
    whose kernels compute the code of a function that is not (another version of the library), runs
    unpatched, with a warning that says what differs.  Returns the functions patched."""
    for module, qualname, first_line, made_for, calls, code in _PATCHES:
        if (module, qualname) in _INSTALLED:
            continue
        function, refusal = _refusal(module, qualname, first_line, made_for, calls, code)
        if function is None:
            warnings.warn(
                f"{refusal} (another version of the library?): it runs unpatched; run `fuselens apply` again",
                stacklevel=2,
            )
            continue
        own = function.__code__
        function.__globals__[_ALIAS] = _this_module()
        function.__code__ = code.replace(co_qualname=own.co_qualname)
        _INSTALLED[(module, qualname)] = (function, own)
    return sorted(f"{m}.{q}" for m, q in _INSTALLED)


def uninstall():
    """Put the library's own code back in every function `install()` patched."""
    for key, (function, own) in list(_INSTALLED.items()):
        function.__code__ = own
        del _INSTALLED[key]
        if all(f.__globals__ is not function.__globals__ for f, _ in _INSTALLED.values()):
            function.__globals__.pop(_ALIAS, None)
'''


def code_identity_source() -> str:
    """The functions of `analysis/code_identity.py`, as their own text: what the kernel module carries."""
    functions = [
        value
        for value in vars(code_identity).values()
        if isinstance(value, types.FunctionType) and value.__module__ == code_identity.__name__
    ]
    return "\n\n".join(inspect.getsource(f).rstrip("\n") + "\n" for f in functions)


def runtime(alias: str) -> str:
    """`install()`, `uninstall()` and what they need, for a module whose kernels patched code reaches as `alias`."""
    text = RUNTIME.replace('"ALIAS"', repr(alias)).replace("CODE_IDENTITY\n", code_identity_source())
    return f"# ---- library patches: install() runs the fused kernels inside a library's code\n{text}"
