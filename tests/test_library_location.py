"""A library's code is a library's wherever the library is installed.

A model whose code is a package's maps into the package's files and applies as a library patch whether
the package was installed into site-packages, into a folder of its own with `pip install --target` and
put on PYTHONPATH, or is a plain folder on PYTHONPATH: what the process imported decides, never a
folder's name.  Each case runs the command line as a user would, in processes of their own with that
PYTHONPATH: analyze, apply, run the patched model (the kernels in the Triton interpreter) against the
package's own code, restore.  Code in another file of the user's own project is not patched, and the
cluster says why and what to do.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest

from fuselens.pipeline.analyze import analyze_file

pytestmark = pytest.mark.slow

# A norm and its gate, as a package would write them: one cluster, in the package's `forward`.
LAYERS = """
import torch
from torch import nn


class GatedNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return torch.nn.functional.silu(self.weight * x)
"""

USER = """
import torch
from tinynorm.layers import GatedNorm

torch.manual_seed(0)
model = GatedNorm(64)  # fuselens: input=(8, 64)
"""

# Runs the applied file as a script does, then the package's own code on the same weights and input.
CHECK = """
import importlib.util, json, sys
import torch
spec = importlib.util.spec_from_file_location("user", sys.argv[1])
user = importlib.util.module_from_spec(spec)
spec.loader.exec_module(user)
kernels = sys.modules["user_kernels"]
launches = []
for name, kernel in list(vars(kernels).items()):
    if name.startswith("_cluster") and "_kernel" in name and hasattr(kernel, "__getitem__"):
        class Counted:
            def __init__(self, kernel):
                self.kernel = kernel
            def __getitem__(self, grid):
                launches.append(grid)
                return self.kernel[grid]
        setattr(kernels, name, Counted(kernel))
x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    patched = user.model(x)
    kernels.uninstall()
    library = user.model(x)
print(json.dumps({"launches": len(launches), "diff": (patched - library).abs().max().item()}))
"""


def _wheel(folder: str) -> str:
    """A wheel of the package `tinynorm`, as a build backend writes one (the files, METADATA, WHEEL, RECORD)."""
    dist = "tinynorm-0.1.0.dist-info"
    files = {
        "tinynorm/__init__.py": "",
        "tinynorm/layers.py": LAYERS,
        f"{dist}/METADATA": "Metadata-Version: 2.1\nName: tinynorm\nVersion: 0.1.0\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist}/top_level.txt": "tinynorm\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    path = os.path.join(folder, "tinynorm-0.1.0-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path


def _installed_with_pip_target(tmp_path) -> str:
    target = str(tmp_path / "target")
    wheel = _wheel(str(tmp_path))
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", target, wheel]
    done = subprocess.run(pip, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert os.path.isdir(os.path.join(target, "tinynorm-0.1.0.dist-info"))
    return target


def _plain_folder(tmp_path) -> str:
    folder = tmp_path / "vendored"
    (folder / "tinynorm").mkdir(parents=True)
    (folder / "tinynorm" / "__init__.py").write_text("")
    (folder / "tinynorm" / "layers.py").write_text(LAYERS)
    return str(folder)


def _cli(args: list[str], folder, pythonpath: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": pythonpath, **env}
    return subprocess.run(
        [sys.executable, "-m", "fuselens.cli.main", *args], capture_output=True, text=True, cwd=folder, env=environ
    )


@pytest.mark.parametrize(
    ("install", "distribution"),
    [
        pytest.param(_installed_with_pip_target, "tinynorm", id="pip-target"),
        pytest.param(_plain_folder, "", id="pythonpath"),
    ],
)
def test_a_package_off_site_packages_maps_and_applies_as_a_library_patch(tmp_path, install, distribution):
    packages = install(tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    path = project / "user.py"
    path.write_text(textwrap.dedent(USER).lstrip())
    written = path.read_bytes()
    layers = os.path.join(packages, "tinynorm", "layers.py")

    done = _cli(["analyze", "--json", str(tmp_path / "report.json"), str(path)], project, packages)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["libraries"] == [
        {"name": "tinynorm", "root": packages, "distribution": distribution, "version": "0.1.0" if distribution else ""}
    ]
    (cluster,) = report["models"][0]["clusters"]
    assert cluster["file"] == layers and {op["file"] for op in cluster["ops"]} == {layers}
    assert cluster["applies"] == "patch", cluster["apply_detail"]
    assert cluster["apply_detail"].startswith("tinynorm/layers.py lines ")
    assert cluster["patch"]["function"]["module"] == "tinynorm.layers"

    done = _cli(["apply", "--yes", str(path)], project, packages)
    assert done.returncode == 0, done.stdout + done.stderr
    assert path.read_text().count("\ninstall()") == 1
    check = [sys.executable, "-c", CHECK, str(path)]
    env = {**os.environ, "PYTHONPATH": f"{project}{os.pathsep}{packages}", "TRITON_INTERPRET": "1"}
    ran = subprocess.run(check, capture_output=True, text=True, cwd=project, env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert result["launches"] >= 1 and result["diff"] < 1e-5, result

    done = _cli(["restore", "--yes", str(path)], project, packages)
    assert done.returncode == 0, done.stdout + done.stderr
    assert path.read_bytes() == written


def test_code_in_another_file_of_the_project_says_why_it_is_not_patched(tmp_path):
    """The same layer in a module beside the user's file is the user's own code: no patch replaces it,
    and the cluster says where it is and what would apply it."""
    (tmp_path / "tinynorm").mkdir()
    (tmp_path / "tinynorm" / "__init__.py").write_text("")
    (tmp_path / "tinynorm" / "layers.py").write_text(LAYERS)
    path = tmp_path / "user.py"
    path.write_text(textwrap.dedent(USER).lstrip())
    report = analyze_file(str(path))
    assert report.libraries == []
    (cluster,) = report.models[0].clusters
    assert cluster.applies == "no"
    assert cluster.apply_detail.startswith("its code is in layers.py (GatedNorm.forward), not in this file; ")
    assert "another file of your project" in cluster.apply_detail
