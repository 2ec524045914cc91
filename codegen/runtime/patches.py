"""The kernel module's library patches at run time: the patched copies it registers, and `install()`
and `uninstall()`, which put them in the library's functions and take them out again, where the
library's code is the code they were made for (found and compared by the analysis's own
`analysis/code_identity.py`, whose functions the kernel module carries in place of their import)."""

# ---- the kernel module's copy starts here
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
from fuselens.analysis.code_identity import code_differences, find_function, fingerprint


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
