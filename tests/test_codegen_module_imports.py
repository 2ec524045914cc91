"""What the language server loads to write a kernel module: the server imports `codegen/module.py`
to assemble the module from the kernel text its reports carry, and that must load neither torch nor
the planner and emitter (docs/ARCHITECTURE.md: the server imports codegen's text-only modules)."""

from __future__ import annotations

import json
import subprocess
import sys

# The server's imports, then a kernel module written as the server writes one: with a kernel's
# section and a library patch, so every part of the runtime it carries is read.
_SERVER_WRITES_A_KERNEL_MODULE = """
import json, sys
import fuselens.server.app
from fuselens.codegen import patches
from fuselens.codegen.module import render_module, section
kernel = section("cluster0", "relu", "def cluster0(x):\\n    return x")
patch = patches.MARKER + "lib.f: cluster0\\n\\ndef f(x):\\n    return x\\n"
text = render_module("model.py", {"cluster0": kernel}, {"lib.f": patch}, "_fuselens_model_kernels")
assert "def install():" in text and "def _row_tile(" in text and "def module_settings(" in text
print(json.dumps(sorted(sys.modules)))
"""

# Never loaded where kernel modules are only written: torch (and what runs kernels), the planner and
# the emitter, and the runtime modules themselves (read as text: they import torch).
_NOT_LOADED = ("torch", "triton", "numpy")
_NOT_LOADED_CODEGEN = ("plan", "emit", "launcher", "kernel_text", "variants", "runtime")


def test_writing_a_kernel_module_in_the_server_loads_neither_torch_nor_the_planner_or_emitter():
    done = subprocess.run(
        [sys.executable, "-c", _SERVER_WRITES_A_KERNEL_MODULE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    libraries = [m for m in loaded if m.split(".")[0] in _NOT_LOADED]
    codegen = [m for m in loaded if m.startswith("fuselens.codegen.") and m.split(".")[2] in _NOT_LOADED_CODEGEN]
    assert libraries == [] and codegen == [], (libraries, codegen)
