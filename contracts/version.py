"""fuselens's version, from the installed package's metadata (pyproject.toml is the one place it is set)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    TOOL_VERSION = version("fuselens")
except PackageNotFoundError:  # run from a checkout that was never installed
    TOOL_VERSION = "0+unknown"
