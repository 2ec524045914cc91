"""What `pip install fuselens` installs: a wheel built from this tree holds every module of the source
folders that map to `fuselens.*` packages, and the package data the code reads.  An editable install
(the README's set-up) finds modules by folder and would never show a package left out of the list."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.slow


def source_modules() -> set[str]:
    """`fuselens/<folder>/.../<name>.py` for each module under a folder that maps to a package."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        folders = tomllib.load(fh)["tool"]["setuptools"]["package-dir"]
    modules = set()
    for package, folder in folders.items():
        top = os.path.join(ROOT, folder)
        for where, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            relative = os.path.relpath(where, top)
            if "__init__.py" not in files:
                continue
            prefix = package.replace(".", "/") + ("" if relative == "." else "/" + relative)
            modules |= {f"{prefix}/{name}" for name in files if name.endswith(".py")}
    return modules


def clean_copy(to: str) -> str:
    """The tree without what builds and installs leave in it (a stale `build/` would fill the wheel)."""
    left = shutil.ignore_patterns(
        ".git", ".venv", ".whl", ".gl", "build", "*.egg-info", "node_modules", "__pycache__", ".*cache"
    )
    return shutil.copytree(ROOT, to, ignore=left)


def test_the_wheel_holds_every_module_of_the_source_tree(tmp_path):
    source = clean_copy(str(tmp_path / "src"))
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), source],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.glob("fuselens-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(source_modules() - names)
    assert missing == [], f"left out of the wheel (add their packages to [tool.setuptools] packages): {missing}"
    assert "fuselens/contracts/report.schema.json" in names
