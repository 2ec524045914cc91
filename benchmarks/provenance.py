"""What a benchmark's figures were measured with: the code, the toolchain, the device.

Every results.json carries this, so that a table can be traced to the revision that made it:
the git revision when the tree is a checkout (and whether it had uncommitted changes), and
always a digest of the package's own source files, which a copy of the tree without `.git`
(a remote machine) still has.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SOURCE_FOLDERS = ("analysis", "codegen", "contracts", "pipeline", "profiling", "validate", "worker", "cli")


def provenance() -> dict[str, str | None]:
    import torch

    info: dict[str, str | None] = {
        "git_revision": _git("rev-parse", "HEAD"),
        "git_dirty": None,
        "source_sha256": source_digest(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": _driver(),
    }
    if info["git_revision"]:
        info["git_dirty"] = "yes" if _git("status", "--porcelain", "--untracked-files=no") else "no"
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


def source_digest() -> str:
    """sha256 over the package's Python sources, in path order."""
    digest = hashlib.sha256()
    for folder in _SOURCE_FOLDERS:
        for base, dirs, names in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(n for n in names if n.endswith(".py")):
                path = os.path.join(base, name)
                digest.update(os.path.relpath(path, ROOT).encode() + b"\0")
                with open(path, "rb") as fh:
                    digest.update(fh.read())
    return digest.hexdigest()[:16]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def line(info: dict[str, str | None]) -> str:
    """One line for a table's header."""
    code = info["git_revision"][:10] if info.get("git_revision") else f"source {info['source_sha256']}"
    if info.get("git_dirty") == "yes":
        code += " (with uncommitted changes)"
    tools = ", ".join(f"{k} {info[k]}" for k in ("torch", "triton", "cuda", "driver") if info.get(k))
    return f"{code}; {tools}"
