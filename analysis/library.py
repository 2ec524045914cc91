"""Library functions: the function object behind a cluster's code in an installed library.

A cluster whose code is a library's is applied by a patch: at run time the library function's
code object is replaced by one that calls the kernels (`codegen/patches.py`).  That works for a
function the patch can find again by its module and qualified name, whose code object is the one
on disk (not a wrapper made elsewhere), and that closes over nothing a new code object could not
close over too.  The model ran in this process, so its library modules are imported: they are
looked up in `sys.modules`, never imported here.
"""

from __future__ import annotations

import ast
import inspect
import os
import sys
import types

from fuselens.contracts.report import LibraryFunction


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
    function = _find(module, qualname)
    if function is None:
        raise NotPatchable(f"{where} is not reachable by that name")
    first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
    code = function.__code__
    if os.path.abspath(code.co_filename) != os.path.abspath(file) or code.co_firstlineno != first:
        raise NotPatchable(f"{where} is wrapped by code that is not its own")
    if set(code.co_freevars) - {"__class__"}:
        raise NotPatchable(f"{where} closes over {', '.join(code.co_freevars)}")
    last = node.end_lineno or node.lineno
    source = "".join(line + "\n" for line in lines[first - 1 : last])
    return LibraryFunction(module.__name__, qualname, os.path.abspath(file), first, last, source)


def _module_of(file: str) -> types.ModuleType | None:
    path = os.path.abspath(file)
    for module in list(sys.modules.values()):
        known = getattr(module, "__file__", None)
        if isinstance(known, str) and os.path.abspath(known) == path:
            return module
    return None


def _find(module: types.ModuleType, qualname: str) -> types.FunctionType | None:
    """The function `qualname` defines in `module` (a method from its class's own namespace, not an
    inherited one), unwrapped from decorators that say what they wrap."""
    owner: object = module
    for part in qualname.split("."):
        owner = vars(owner).get(part) if hasattr(owner, "__dict__") else None
        if owner is None:
            return None
    owner = getattr(owner, "__func__", owner)  # staticmethod, classmethod
    try:
        function = inspect.unwrap(owner)  # type: ignore[arg-type]
    except ValueError:
        return None
    return function if isinstance(function, types.FunctionType) else None
