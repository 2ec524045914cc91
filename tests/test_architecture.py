"""The layers import only what docs/ARCHITECTURE.md says they may: read from the source's imports."""

from __future__ import annotations

import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Each package and the packages it may import, as docs/ARCHITECTURE.md draws them (top to bottom).
ALLOWED = {
    "cli": {"server", "pipeline", "codegen", "contracts"},
    "server": {"worker.protocol", "worker.confine", "codegen", "contracts"},  # never torch (test_server_process)
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
