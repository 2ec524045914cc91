"""A model file, imported as a script of its folder would import it: its folder first on sys.path, so
that `from <model>_kernels import ...` finds the kernel module `fuselens apply` wrote beside it."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType


def load_model_file(path: str, name: str) -> ModuleType:
    """The module at `path`, under `name` (distinct names keep an original and its applied copy apart)."""
    sys.path.insert(0, os.path.dirname(path))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    return module
