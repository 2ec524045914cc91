"""The layers import only what docs/ARCHITECTURE.md says they may: read from the source's imports."""

from __future__ import annotations

import ast
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Each package and the packages it may import, as docs/ARCHITECTURE.md draws them (top to bottom).
ALLOWED = {
    "cli": {"server", "pipeline", "codegen", "contracts"},
    "server": {"worker.protocol", "worker.confine", "worker.collector", "codegen", "contracts"},  # no torch
    "worker": {"pipeline", "contracts"},
    "pipeline": {"profiling", "validate", "codegen", "analysis", "contracts"},
    "profiling": {"codegen", "analysis", "contracts"},
    "validate": {"codegen", "analysis", "contracts"},
    "codegen": {"analysis", "contracts"},
    "analysis": {"contracts"},
    "contracts": set(),
}


def imports_of(package: str) -> list[tuple[str, str]]:
    """(file, imported fuselens module) for every import in `package`'s folder, relative ones resolved."""
    found = []
    folder = os.path.join(REPO, package)
    for root, _, files in os.walk(folder):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            here = "fuselens." + os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level:
                    base = here.split(".")[: -node.level]
                    target = ".".join(base + ([node.module] if node.module else []))
                elif isinstance(node, ast.ImportFrom):
                    target = node.module or ""
                elif isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                    found += [(os.path.relpath(path, REPO), t) for t in targets if t.startswith("fuselens.")]
                    continue
                else:
                    continue
                if target.startswith("fuselens."):
                    found.append((os.path.relpath(path, REPO), target))
    return found


def allowed(package: str, target: str) -> bool:
    """Whether `package` may import the fuselens module `target`."""
    name = target.removeprefix("fuselens.")
    return name.split(".")[0] == package or any(name == a or name.startswith(a + ".") for a in ALLOWED[package])


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_layer_imports_one_it_may_not(package):
    forbidden = [(file, target) for file, target in imports_of(package) if not allowed(package, target)]
    assert forbidden == [], f"{package}/ imports what its layer may not: {forbidden}"


def test_the_packages_import_each_other_without_cycles():
    edges = {p: {t.removeprefix("fuselens.").split(".")[0] for _, t in imports_of(p)} - {p} for p in ALLOWED}
    visiting: list[str] = []

    def visit(package: str) -> None:
        assert package not in visiting, f"import cycle: {' -> '.join([*visiting, package])}"
        visiting.append(package)
        for other in edges.get(package, ()):
            visit(other)
        visiting.pop()

    for package in ALLOWED:
        visit(package)


def test_every_package_folder_is_in_the_map():
    """A new folder of fuselens code gets a row above, so that its imports are checked too."""
    with open(os.path.join(REPO, "pyproject.toml"), encoding="utf-8") as fh:
        text = fh.read()
    packages = {
        line.split('"')[1].removeprefix("fuselens.")
        for line in text.splitlines()
        if line.startswith('"fuselens.') and "=" in line and '" = "' in line
    }
    assert packages == set(ALLOWED)


def module_graph(package: str) -> dict[str, set[str]]:
    """Each module of `package`'s folder and the modules of the same folder it imports: at the top, in
    a function, or under `if TYPE_CHECKING:` (a cycle through a type-only import still ties the two
    modules into one).  `from . import x` counts as importing the module `x` where there is one."""
    folder = os.path.join(REPO, package)
    modules = {}
    for root, _, names in os.walk(folder):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                dotted = "fuselens." + os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                modules[dotted.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package_of = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package_of.split(".")[: len(package_of.split(".")) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                found.add(base)
                found |= {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules}
        graph[module] = {m for m in found if m in modules and m != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """A cycle through each group of modules that import each other, found from the first module of
    the group in sorted order (none: [])."""
    found: list[list[str]] = []
    done: set[str] = set()
    for start in sorted(graph):
        cycle = _cycle_from(start, graph, [], done)
        if cycle is not None:
            found.append(cycle)
            done |= set(cycle)
    return found


def _cycle_from(module: str, graph: dict[str, set[str]], path: list[str], done: set[str]) -> list[str] | None:
    """A cycle reached from `module` down `path` (depth first), or None; each module found to reach
    none is added to `done`."""
    if module in path:
        return [*path[path.index(module) :], module]
    if module in done:
        return None
    path.append(module)
    for other in sorted(graph[module]):
        cycle = _cycle_from(other, graph, path, done)
        if cycle is not None:
            return cycle
    path.pop()
    done.add(module)
    return None


def test_the_server_s_modules_import_each_other_without_cycles():
    """A cycle, even through an import only the type checker reads, makes the modules on it one piece:
    none can be read, tested or replaced without the others (the handlers' modules once imported the
    server's hub for its type, and the hub imported them)."""
    assert cycles(module_graph("server")) == []


def test_the_cycle_check_finds_a_cycle_through_a_type_only_import(tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "hub.py").write_text("from . import handlers\n")
    (tmp_path / "pkg" / "handlers.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .hub import Server\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "REPO", str(tmp_path))
    assert cycles(module_graph("pkg")) == [["fuselens.pkg.handlers", "fuselens.pkg.hub", "fuselens.pkg.handlers"]]
