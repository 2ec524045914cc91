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

MAX_MODULES = 64  # the most modules a host keeps imported on request, over its life
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")

# The top-level packages of the modules this process imported on request (a forked job inherits it).
PRELOADED: set[str] = set()
_tried: set[str] = set()


def preload(names: list[str]) -> list[str]:
    """Import the modules `names` that qualify and are not imported yet; a line for the log each."""
    said = []
    for name in names:
        if name in _tried or name in sys.modules or len(_tried) >= MAX_MODULES:
            continue
        _tried.add(name)
        problem = _refused(name)
        if problem:
            said.append(f"not keeping {name[:200]} loaded: {problem}")
            continue
        threads = threading.active_count()
        started = time.perf_counter()
        try:
            importlib.import_module(name)
        except Exception as exc:  # an import that fails only costs speed: each job tries on its own
            said.append(f"not keeping {name} loaded: importing it failed: {type(exc).__name__}: {exc}"[:500])
            continue
        PRELOADED.add(name.partition(".")[0])
        said.append(f"keeping {name} loaded for the jobs ({(time.perf_counter() - started) * 1000:.0f} ms to import)")
        if threading.active_count() > threads:  # forking a process with more threads can deadlock
            said.append(f"importing {name} started a thread in the worker")
    return said


def _refused(name: str) -> str:
    """Why `name` is not imported here ("" if it may be)."""
    if len(name) > 200 or not _NAME.match(name):
        return "not a module name"
    top = name.partition(".")[0]
    if top in sys.stdlib_module_names or top == "__main__":
        return "a module of the standard library"
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return "not installed where the worker finds its packages"
    return ""


def forget_shadowed(folder: str) -> None:
    """In a job for a model in `folder`: drop the preloaded packages that a module of the same name in
    `folder` would shadow (it comes first on sys.path), and their submodules."""
    for top in PRELOADED:
        try:
            local = importlib.machinery.PathFinder.find_spec(top, [folder])
        except (ImportError, ValueError, OSError):
            local = None
        if local is None or local.origin is None:
            continue  # (a folder without __init__.py, a namespace portion, does not come first)
        for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
            del sys.modules[name]


def folder_of(path: str) -> str:
    """The folder a model's imports resolve from first: the real file's (`analysis/loader.py`)."""
    return os.path.dirname(os.path.realpath(path))
