"""Which code a library patch was made for: finding a library function and saying what its code is.

A library patch replaces one function's code, and may only replace the code it was made for.  The
analysis finds the function (`find_function`) and records what its code is (`fingerprint`, kept in
the report's `LibraryFunction`); the kernel module's `install()` finds the function again the same
way at run time, and patches it only where `code_differences` between the two records is empty.

The kernel module carries these functions' own text (`codegen/patches.py` embeds each one with
`inspect.getsource`), so that the analysis and the installed module cannot disagree.  So: the
standard library modules imported here and nothing else, no module-level names, and every function
of this module is one the kernel module carries.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import sys
import types


def find_function(module: types.ModuleType, qualname: str) -> types.FunctionType | None:
    """The function object whose code `module`'s file defines as `qualname`, followed from the module's
    name for it through what a decorator may have put in its place: `__wrapped__`, `__func__`, a
    wrapper's closure, an object's class (transformers' `@use_kernel_forward_from_hub` turns a function
    into an `nn.Module` instance whose class's `forward` closes over it).  None when nothing is by that
    name, or no function with that code is reachable from it."""
    file = getattr(module, "__file__", None)
    start = named_object(module, qualname)
    if not isinstance(file, str) or start is None:
        return None
    seen: set[int] = set()
    frontier = [start]
    for _ in range(6):  # a wrapper's layers: an instance, its class, the class's method, the method's closure
        following = []
        for obj in frontier:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, types.FunctionType) and is_code_of(obj.__code__, file, qualname):
                return obj
            following += wrapped_by(obj)
        frontier = following
    return None


def named_object(module: types.ModuleType, qualname: str) -> object | None:
    """What `module` names `qualname`: each part from its owner's own namespace (a method of a class, not
    an inherited one), or None."""
    owner: object = module
    for part in qualname.split("."):
        namespace = getattr(owner, "__dict__", None)
        if namespace is None or not hasattr(namespace, "get"):
            return None
        owner = namespace.get(part)
        if owner is None:
            return None
    return owner


def is_code_of(code: types.CodeType, file: str, qualname: str) -> bool:
    """Whether `code` is the code `file` defines as `qualname` (a patched copy is not: its file is the
    kernel module's)."""
    return code.co_qualname == qualname and os.path.normcase(os.path.abspath(code.co_filename)) == os.path.normcase(
        os.path.abspath(file)
    )


def wrapped_by(obj: object) -> list[object]:
    """Where `obj` may keep a function it stands in for."""
    if isinstance(obj, types.ModuleType):
        return []
    if isinstance(obj, types.FunctionType):
        cells = [cell.cell_contents for cell in obj.__closure__ or () if not is_empty_cell(cell)]
        return [obj.__dict__.get("__wrapped__"), *cells]
    if isinstance(obj, (staticmethod, classmethod, types.MethodType)):
        return [obj.__func__]
    if isinstance(obj, property):
        return [obj.fget]
    if isinstance(obj, type):
        return list(vars(obj).values())
    if isinstance(obj, functools.partial):
        return [obj.func]
    own = getattr(obj, "__dict__", None)
    inside = [own.get(name) for name in ("__wrapped__", "__func__")] if isinstance(own, dict) else []
    kind = type(obj)
    return inside + ([kind] if kind.__module__ != "builtins" else [])


def is_empty_cell(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (reading it is the test)
    except ValueError:
        return True
    return False


def fingerprint(code: types.CodeType) -> dict[str, str | list[str]]:
    """What `code` is: digests of its source text ("" where it cannot be read), its bytecode, its
    constants and its names, each through the code objects nested in it (its comprehensions, lambdas and
    inner functions); the names of the variables it closes over; and the Python version whose bytecode
    it is."""
    try:
        source = "".join(inspect.getsourcelines(code)[0])
    except (OSError, TypeError):
        source = ""
    parts: dict[str, list[object]] = {"bytecode": [], "constants": [], "names": []}
    describe_code(code, parts)
    return {
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "source": short_digest(source) if source else "",
        "bytecode": short_digest(parts["bytecode"]),
        "constants": short_digest(parts["constants"]),
        "names": short_digest(parts["names"]),
        "free_variables": list(code.co_freevars),
    }


def describe_code(code: types.CodeType, parts: dict[str, list[object]]) -> None:
    """Add `code`'s bytecode, constants and names to `parts`, then those of the code objects in it."""
    parts["bytecode"].append(
        (code.co_code, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags)
    )
    parts["constants"].append([constant_text(value) for value in code.co_consts])
    parts["names"].append((code.co_names, code.co_varnames, code.co_cellvars, code.co_freevars))
    for value in code.co_consts:
        if isinstance(value, types.CodeType):
            describe_code(value, parts)


def constant_text(value: object) -> object:
    """`value` as text that is the same in every process: a frozenset's items in order (their order
    follows string hashing, which differs between processes), a code object by its name (its contents
    are described on their own)."""
    if isinstance(value, types.CodeType):
        return ("code", value.co_qualname)
    if isinstance(value, (tuple, frozenset)):
        items = [constant_text(v) for v in value]
        return (type(value).__name__, sorted(items, key=repr) if isinstance(value, frozenset) else items)
    return (type(value).__name__, repr(value))


def short_digest(value: object) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def code_differences(made_for: dict[str, str | list[str]], live: dict[str, str | list[str]]) -> list[str]:
    """What differs between the code a patch was made for and the code there now, in words ([]: it is
    the same code).

    Bytecode, constants and names are compared only under the Python version the patch was made with:
    another minor version compiles the same source to other bytecode (3.12 inlines comprehensions, 3.14
    keeps small integers and docstrings out of a code object's constants), so there the source text
    alone says whether the code is the same, and a source that cannot be read is a difference.  Under
    the same version, the bytecode decides when a source cannot be read (a library installed without
    its .py files)."""
    found = []
    same_python = made_for["python"] == live["python"]
    if made_for["source"] and live["source"]:
        if made_for["source"] != live["source"]:
            found.append("its source text")
    elif not same_python:
        found.append(f"its source (unreadable, and Python {live['python']} is not {made_for['python']})")
    if same_python:
        found += [f"its {part}" for part in ("bytecode", "constants", "names") if made_for[part] != live[part]]
    before, now = list(made_for["free_variables"]), list(live["free_variables"])
    if before != now:
        found.append(f"the variables it closes over ({', '.join(before) or 'none'} → {', '.join(now) or 'none'})")
    return found
