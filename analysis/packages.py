"""Installed packages: which one a source file of this process is part of.

A cluster whose code is a library's is applied by a patch that finds the library's function again by
its module's import name (`analysis/library.py`).  Whether a file is a library's is decided from what
this process imported, wherever the package lies (site-packages, a `pip install --target` folder on
sys.path, an editable checkout, a plain folder on PYTHONPATH), never from a folder's name: the file
is the `__file__` of a module in `sys.modules` (or, for one no module names, lies under a sys.path
entry), and its top-level package is where it was imported from.

Code the user edits is no package's: the analyzed file, and what is imported from its folder or a
folder above it (the project's own packages, run from its root).  Without an analyzed file to tell the
project by, only an installed distribution (one with metadata) counts as a package.  Torch, its
toolchain and the standard library are packages, but never model code.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from fuselens.contracts.report import Library

# Packages whose code is the toolchain's, never a model's: ops called from them are not placed there.
TOOLCHAIN = frozenset({"torch", "triton", "numpy", "fuselens", "typing_extensions", "_pytest", "pytest"})


@dataclass(frozen=True)
class Package:
    """An importable top-level package (or single-module library) as this process found it."""

    name: str  # its import name: "diffusers"
    root: str  # the folder it was imported from; its files are named from there ("diffusers/models/resnet.py")

    @property
    def toolchain(self) -> bool:
        """Torch, its toolchain or the standard library: code that is never a model's."""
        return self.name in TOOLCHAIN or self.name in sys.stdlib_module_names

    def shown(self, file: str) -> str:
        """`file` as people name it, from the package down."""
        return os.path.relpath(os.path.abspath(file), self.root)

    def distribution(self) -> tuple[str, str]:
        """The distribution that installed it and its version, from its metadata; ("", "") for a folder
        that is on the path without any (a plain folder on PYTHONPATH)."""
        return _distribution(self.name)


def package_of(file: str, home: str = "") -> Package | None:
    """The package `file` is part of, as this process imported it.  None for the user's code: the
    analyzed file `home`, and a module imported from `home`'s folder or a folder above it (with no
    `home`: a module no distribution installed); and None for a file no module or path entry of this
    process accounts for (code made at run time)."""
    if not file or file.startswith("<"):
        return None
    path = os.path.abspath(file)
    if home and path == os.path.abspath(home):
        return None  # (without a look at the modules: the file was just imported, and is in no table yet)
    found = _from_module(path) or _from_path_entry(path)
    if found is None or found.toolchain:
        return found
    if home:
        return None if _users(found.root, home) else found
    return found if found.distribution()[0] else None


def model_library(file: str, home: str) -> Package | None:
    """The package of a model library (not the toolchain's) that `file` is part of, for the analyzed
    file `home`; None for the user's code."""
    found = package_of(file, home)
    return found if found is not None and not found.toolchain else None


def libraries(files: Iterable[str], home: str) -> list[Library]:
    """The model libraries `files` are part of, each once, with the distribution that installed it."""
    found: dict[tuple[str, str], Library] = {}
    for file in sorted(set(files)):
        package = model_library(file, home)
        if package is not None and (package.name, package.root) not in found:
            found[(package.name, package.root)] = Library(package.name, package.root, *package.distribution())
    return list(found.values())


def not_a_package(file: str, home: str) -> str:
    """Why the code of `file`, not the analyzed file `home`, is no package's: a sentence that says
    what the user can do about a cluster there."""
    name = os.path.basename(file)
    if _from_module(os.path.abspath(file)) is None and _from_path_entry(os.path.abspath(file)) is None:
        return (
            f"{name} was not imported as a module of a package, so no patch can find its code again: "
            "import it from a package (installed, or a folder on PYTHONPATH) to apply it as a patch"
        )
    return (
        f"{name} is another file of your project, which `fuselens apply` does not edit from here: "
        f"apply on a file whose own code holds the cluster, or import {name} as an installed package "
        "(pip install, or a folder on PYTHONPATH outside the project) to apply it as a patch"
    )


def _users(root: str, home: str) -> bool:
    """Whether a package imported from `root` is the user's: `root` is the analyzed file's folder or
    above it (its own folder as Python sees it past links, too)."""
    for folder in {os.path.dirname(os.path.abspath(home)), os.path.dirname(os.path.realpath(home))}:
        if folder == root or folder.startswith(root.rstrip(os.sep) + os.sep):
            return True
    return False


# ---- what the process imported ------------------------------------------------------------------


class _ModuleFiles:
    """Each imported module's file, by its absolute path.  A file found is checked against the module
    still imported under its name; the table is read again only for a file not found, and only when
    `sys.modules` has changed since: a trace adds and removes a stand-in module each time
    (`capture.without_dynamo_import`), and reading ~2,000 modules again twice a trace cost more than
    the trace."""

    def __init__(self) -> None:
        self._seen = -1
        self._names: dict[str, str] = {}

    def name(self, path: str) -> str | None:
        found = self._names.get(path)
        if found is not None and _file_of(sys.modules.get(found)) == path:
            return found
        if len(sys.modules) != self._seen:
            self._seen = len(sys.modules)
            names: dict[str, str] = {}
            for name, module in list(sys.modules.items()):
                known = _file_of(module)
                if known is not None and name != "__main__":
                    names.setdefault(known, name)
            self._names = names
        return self._names.get(path)


def _file_of(module: object) -> str | None:
    known = getattr(module, "__file__", None)
    return os.path.abspath(known) if isinstance(known, str) else None


_MODULE_FILES = _ModuleFiles()


def _from_module(path: str) -> Package | None:
    """The package of the module whose file `path` is: its top-level package, found where that was
    imported from (a namespace package's part that holds the file)."""
    name = _MODULE_FILES.name(path)
    if name is None:
        return None
    top = name.partition(".")[0]
    module = sys.modules.get(top)
    if module is None:
        return None
    locations = list(getattr(module, "__path__", None) or [])  # a package's folders (several: a namespace's)
    for folder in (os.path.abspath(p) for p in locations):
        if path.startswith(folder + os.sep):
            return Package(top, os.path.dirname(folder))
    known = getattr(module, "__file__", None)
    if not locations and isinstance(known, str) and os.path.abspath(known) == path:
        return Package(top, os.path.dirname(path))  # a single-module library
    if top in TOOLCHAIN:  # its folders mapped elsewhere (an editable install's `package-dir`): still the toolchain
        return Package(top, os.path.dirname(path))
    return None


def _from_path_entry(path: str) -> Package | None:
    """For a file no imported module names: the sys.path entry it lies under (the longest), and the
    top-level package it would be imported as from there."""
    best = ""
    for entry in sys.path:
        folder = os.path.abspath(entry or os.curdir)
        if path.startswith(folder + os.sep) and len(folder) > len(best) and os.path.isdir(folder):
            best = folder
    if not best:
        return None
    top = path[len(best) + 1 :].split(os.sep, 1)[0]
    name = top[:-3] if top.endswith(".py") else top
    return Package(name, best) if name.isidentifier() else None


@functools.lru_cache(maxsize=256)
def _distribution(name: str) -> tuple[str, str]:
    for dist in _distributions_providing(name):
        return dist.metadata["Name"] or dist.name, dist.version
    return "", ""


def _distributions_providing(name: str) -> Iterable[importlib.metadata.Distribution]:
    """The installed distributions whose files include the top-level package `name`: first the one of
    the same name, which is nearly always it and is found without reading any other's metadata; then,
    where that is not it, each that the table of every installed distribution names (reading it costs
    a tenth of a second or more where many are installed, on the path of a file's first analysis)."""
    try:
        same = importlib.metadata.distribution(name)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        same = None
    if same is not None and name in _top_level_names(same):
        yield same
        return
    for dist_name in _distributions().get(name, []):
        try:
            yield importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue


def _top_level_names(dist: importlib.metadata.Distribution) -> set[str]:
    """The top-level packages and modules `dist` installs: those its `top_level.txt` declares, else
    those its list of files holds (as `importlib.metadata.packages_distributions` reads them)."""
    declared = (dist.read_text("top_level.txt") or "").split()
    if declared:
        return set(declared)
    names = set()
    for file in dist.files or ():
        if len(file.parts) > 1:
            names.add(file.parts[0])
        elif file.suffix == ".py":
            names.add(file.stem)
    return names


@functools.lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())
