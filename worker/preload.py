"""Library modules the worker host keeps imported, so that the jobs it forks start with them loaded.

A model built from transformers' Llama spends seconds of CPU importing the library's modeling code
(2.3 s on a 2-core laptop, torch._dynamo and sympy with it) and a third of a second being analyzed:
each job, a fresh fork of the host, imported the library again on every save.  The server names the
modules of installed libraries its analyses found a model's code in (`Preload`); the host imports
each once, between jobs, and every job forked after that has it.

Only what an installed library's import does runs in the host, never the user's code: a name is
imported only when, from the host's own path (no working directory, no model's folder), it resolves
outside the standard library; the modules come from a report, so a job had just imported them
without harm.  A job whose model's folder holds a module of the same top-level name (a project's
own `transformers/`) forgets the host's copy first (`forget_shadowed`), so that Python imports the
user's, as it would with no host.

A file opened for the first time has no report yet: its job would import the library itself, and the
host again after it.  So before the host forks a file's job, the server sends the file's imports, read
from its syntax tree (`PreloadImports`), and the host runs those of them that name a package installed
in a site-packages folder (`preload_imports`): never a module of the user's (the model's folder, a
project on PYTHONPATH or installed in editable mode, none of which lie in one), nor one the model's
folder would shadow.  What runs is the import the job would run first, in the same order.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
import threading
import time

from fuselens.contracts.folders import installed
from fuselens.worker.protocol import ModuleImport

MAX_MODULES = 64  # the most modules a host keeps imported on request, over its life
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# The top-level packages of the modules this process imported on request (a forked job inherits it).
PRELOADED: set[str] = set()
_tried: set[str] = set()
_ran: set[tuple[str, tuple[str, ...]]] = set()  # the import statements run from a file's imports


def _budget_spent() -> bool:
    return len(_tried) + len(_ran) >= MAX_MODULES


def preload(names: list[str]) -> list[str]:
    """Import the modules `names` that qualify and are not imported yet; a line for the log each."""
    said = []
    for name in names:
        if name in _tried or name in sys.modules or _budget_spent():
            continue
        _tried.add(name)
        problem = _refused(name)
        if problem:
            said.append(f"not keeping {name[:200]} loaded: {problem}")
            continue
        said += _keep(name, lambda name=name: importlib.import_module(name))
    return said


def preload_imports(path: str, imports: list[ModuleImport]) -> list[str]:
    """Run the import statements of the model's file at `path` that name installed packages, unless
    done already; a line for the log each that ran or was refused."""
    folder = folder_of(path)
    said = []
    for statement in imports:
        names = tuple(n for n in statement.names if n != "*")  # (`import *` of a package: its whole API)
        if (statement.module, names) in _ran or _done(statement.module, names) or _budget_spent():
            continue
        shown = statement.module[:200] + (f" ({', '.join(names)[:200]})" if names else "")
        problem = _refused(statement.module) or _not_installed(statement.module, folder)
        if not problem and not all(_IDENTIFIER.match(n) for n in names):
            problem = "not a name"
        if problem:
            said.append(f"not importing {shown} for the jobs: {problem}")
            continue
        _ran.add((statement.module, names))
        said += _keep(shown, lambda statement=statement, names=names: __import__(statement.module, fromlist=names))
    return said


def _keep(shown: str, run_import) -> list[str]:
    """Run `run_import` (of the module `shown`), keeping what it imported for the jobs; lines for the log."""
    threads = threading.active_count()
    started = time.perf_counter()
    try:
        module = run_import()
    except Exception as exc:  # an import that fails only costs speed: each job tries on its own
        return [f"not keeping {shown} loaded: importing it failed: {type(exc).__name__}: {exc}"[:500]]
    PRELOADED.add(module.__name__.partition(".")[0])
    said = [f"keeping {shown} loaded for the jobs ({(time.perf_counter() - started) * 1000:.0f} ms to import)"]
    if threading.active_count() > threads:  # forking a process with more threads can deadlock
        said.append(f"importing {shown} started a thread in the worker")
    return said


def _done(module: str, names: tuple[str, ...]) -> bool:
    """Whether the statement would import nothing new: the module and each name are there already."""
    found = sys.modules.get(module)
    return found is not None and all(n in vars(found) for n in names)


def _refused(name: str) -> str:
    """Why `name` is not imported here ("" if it may be)."""
    if len(name) > 200 or not _NAME.match(name):
        return "not a module name"
    top = name.partition(".")[0]
    if top in sys.stdlib_module_names or top == "__main__":
        return "a module of the standard library"
    if _spec(top) is None:
        return "not installed where the worker finds its packages"
    return ""


def _not_installed(name: str, folder: str) -> str:
    """Why `name`, which only a model's own file names (no job has imported it yet), is not imported
    here ("" if it may be): it must be a package installed in a site-packages folder, every part of
    it, and one that the model's `folder`, first on the job's path, does not shadow."""
    top = name.partition(".")[0]
    spec = _spec(top)
    if spec is None:
        return "not installed where the worker finds its packages"
    places = list(spec.submodule_search_locations or []) or [spec.origin or ""]
    if not all(place and installed(os.path.realpath(place)) for place in places):
        return "not a package installed in a site-packages folder"
    if _shadows(folder, top):
        return f"the model's folder has a module {top} of its own"
    return ""


def _spec(top: str) -> importlib.machinery.ModuleSpec | None:
    """Where the host's own path (no working directory, no model's folder) finds the module `top`."""
    try:
        return importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None


def _shadows(folder: str, top: str) -> bool:
    """Whether `folder`, first on a job's path, holds a module `top` that Python imports instead of an
    installed one (a folder without __init__.py, a namespace portion, does not come first)."""
    try:
        local = importlib.machinery.PathFinder.find_spec(top, [folder])
    except (ImportError, ValueError, OSError):
        return False
    return local is not None and local.origin is not None


def forget_shadowed(folder: str) -> None:
    """In a job for a model in `folder`: drop the preloaded packages that a module of the same name in
    `folder` would shadow (it comes first on sys.path), and their submodules."""
    for top in PRELOADED:
        if not _shadows(folder, top):
            continue
        for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
            del sys.modules[name]


def folder_of(path: str) -> str:
    """The folder a model's imports resolve from first: the real file's (`analysis/loader.py`)."""
    return os.path.dirname(os.path.realpath(path))
