"""Library functions: the function object behind a cluster's code in an installed library.

A cluster whose code is a library's is applied by a patch: at run time the library function's
code object is replaced by one that calls the kernels (`codegen/patches.py`).  That works for a
function the patch can find again from its module's name for it (`code_identity.find_function`,
through the wrappers a decorator puts in its place), whose code object is the one on disk, made
once rather than on each call of another function.  The patched copy closes over the same names
as the library's function, so that the function keeps its own closure cells when its code is
swapped.  What the function's code is (`code_identity.fingerprint`) is recorded, and so is the code
of every function below it whose ops a kernel computes (`called_code`), so that a patch is
installed only over the code it was made for.  The model ran in this process, so its library modules are
imported: they are looked up in `sys.modules`, never imported here.
"""

from __future__ import annotations

import ast
import os
import sys
import types

from fuselens.contracts.plain import from_plain
from fuselens.contracts.report import CalledCode, CodeFingerprint, LibraryFunction

from .code_identity import find_function, fingerprint, named_object
from .graph import Graph


class NotPatchable(Exception):
    """The function cannot be replaced at run time; the message says why, for the user."""


def library_function(
    file: str, qualname: str, node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]
) -> LibraryFunction:
    """The library function `qualname` of `file`, whose definition is `node` in `lines`."""
    module = _module_of(file)
    if module is None:
        raise NotPatchable(f"{os.path.basename(file)} is not imported as a module")
    where = f"{module.__name__}.{qualname}"
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise NotPatchable(f"{qualname} is made inside another function, so no patch can reach it")
    if isinstance(node, ast.AsyncFunctionDef):
        raise NotPatchable(f"{where} is a coroutine")
    if named_object(module, qualname) is None:
        raise NotPatchable(f"{where} is not reachable by that name")
    function = find_function(module, qualname)
    if function is None:
        raise NotPatchable(f"{where} is wrapped by code that does not keep the library's function")
    first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
    code = function.__code__
    if code.co_firstlineno != first:  # the file changed on disk since the module was imported
        raise NotPatchable(f"{where} is not the code of its lines in {os.path.basename(file)}")
    last = node.end_lineno or node.lineno
    source = "".join(line + "\n" for line in lines[first - 1 : last])
    made_for = from_plain(CodeFingerprint, fingerprint(code))
    return LibraryFunction(module.__name__, qualname, os.path.abspath(file), first, last, source, made_for)


def called_code(graph: Graph, node_ids: list[int], file: str, qualname: str) -> list[CalledCode]:
    """The functions that `qualname` of `file` calls, directly or not, in which the ops `node_ids` of
    `graph` ran: a kernel replacing those ops computes their code, so its patch is made for it too."""
    home = os.path.abspath(file)
    found: dict[tuple[str, str], CalledCode] = {}
    for i in node_ids:
        stack = graph[i].stack
        depth = next((k for k, f in enumerate(stack) if f.function == qualname and os.path.abspath(f.file) == home), 0)
        for frame in stack[:depth]:
            # A comprehension's or an inner function's code is its enclosing function's (a constant of it).
            function = frame.function.split(".<locals>.")[0]
            same_file = os.path.abspath(frame.file) == home
            if (frame.file, function) not in found and not (function == qualname and same_file):
                found[(frame.file, function)] = _called(frame.file, function)
    return list(found.values())


def _called(file: str, qualname: str) -> CalledCode:
    module = _module_of(file)
    function = find_function(module, qualname) if module is not None and "<" not in qualname else None
    if module is None or function is None:
        where = f"{module.__name__}.{qualname}" if module is not None else f"{qualname} of {os.path.basename(file)}"
        raise NotPatchable(f"its kernel computes the code of {where}, which no patch can find again to check")
    code = function.__code__
    return CalledCode(module.__name__, qualname, code.co_firstlineno, from_plain(CodeFingerprint, fingerprint(code)))


def _module_of(file: str) -> types.ModuleType | None:
    path = os.path.abspath(file)
    for module in list(sys.modules.values()):
        known = getattr(module, "__file__", None)
        if isinstance(known, str) and os.path.abspath(known) == path:
            return module
    return None
