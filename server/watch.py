"""Which open documents a changed file affects, and a watchdog observer to notice changes.

An open model is re-analyzed when a local module it imports changes on disk, or when
the pyproject.toml that holds its example inputs does.
"""

from __future__ import annotations

import ast
import os
import threading
from collections.abc import Callable
from typing import Any

from fuselens.contracts.config import find_pyproject


def local_imports(path: str, text: str) -> set[str]:
    """Files next to (or below) `path` that its import statements would load."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    base = os.path.dirname(os.path.abspath(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                names += [module] if module else [a.name for a in node.names]
            else:
                names += [module] + [f"{module}.{a.name}" for a in node.names]
    found = set()
    for name in names:
        parts = [p for p in name.split(".") if p]
        if not parts:
            continue
        stem = os.path.join(base, *parts)
        for candidate in (stem + ".py", os.path.join(stem, "__init__.py")):
            if os.path.isfile(candidate):
                found.add(os.path.realpath(candidate))
    return found


def affects(changed: str, doc_path: str, doc_text: str) -> bool:
    changed = os.path.realpath(changed)
    if os.path.basename(changed) == "pyproject.toml":
        nearest = find_pyproject(doc_path)
        return nearest is not None and os.path.realpath(nearest) == changed
    return changed in local_imports(doc_path, doc_text)


class Watcher:
    """Calls `on_change(path)` (from the watchdog thread) for .py and pyproject.toml changes."""

    def __init__(self, roots: list[str], on_change: Callable[[str], None]):
        self.roots = [r for r in roots if os.path.isdir(r)]
        self.on_change = on_change
        self._observer: Any = None  # a watchdog Observer, once started
        self._lock = threading.Lock()

    def start(self) -> bool:
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:
            return False
        outer = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event):
                if event.is_directory or event.event_type not in ("modified", "created", "moved", "deleted"):
                    return
                path = getattr(event, "dest_path", "") or event.src_path
                watched = path.endswith(".py") or os.path.basename(path) == "pyproject.toml"
                if watched and "/.fuselens/" not in path and "/.git/" not in path:
                    outer.on_change(path)

        observer = Observer()
        for root in self.roots:
            observer.schedule(Handler(), root, recursive=True)
        observer.daemon = True
        observer.start()
        self._observer = observer
        return True

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer = None
