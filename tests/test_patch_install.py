"""A library patch is installed only over the code it was made for, finds its function behind the
wrappers a library puts around it, and keeps the function's closure.

The first tests check `analysis/code_identity.py` itself, and that a kernel module carries exactly
that code (the analysis records a function's code with it, `install()` compares with it).  The last
ones apply a user's file whose model is a small library installed in a temporary `site-packages`:
the library is edited on disk after `apply`, and a fresh process runs the user's file.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import textwrap
import types

import pytest

from fuselens.analysis import code_identity
from fuselens.analysis.code_identity import code_differences, find_function, fingerprint
from fuselens.codegen.patches import _copy, patched_kernels, runtime
from fuselens.contracts.plain import from_plain
from fuselens.contracts.report import CodeFingerprint, LibraryFunction


def _module(folder, name: str, text: str) -> types.ModuleType:
    """`text` written to `folder/name.py` and imported from there (so that its source can be read)."""
    path = os.path.join(folder, f"{name}.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(textwrap.dedent(text).lstrip("\n"))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCALE = """
class Base:
    def forward(self, xs):
        return xs


class Scale(Base):
    def forward(self, xs):
        # each item twice over
        return [x * 2 for x in super().forward(xs)]
"""


def _scale(folder, name: str, text: str = SCALE):
    return _module(folder, name, text).Scale.forward.__code__


def test_the_same_code_compiled_again_is_no_difference(tmp_path):
    first, again = _scale(tmp_path, "first"), _scale(tmp_path, "again")  # two files, two code objects
    assert first is not again
    assert fingerprint(first) == fingerprint(again)
    assert code_differences(fingerprint(first), fingerprint(again)) == []


@pytest.mark.parametrize(
    ("edit", "what"),
    [
        # a constant inside the comprehension: a nested code object's constants
        (("x * 2", "x * 3"), ["its source text", "its constants"]),
        # an operator inside the comprehension: a nested code object's bytecode
        (("x * 2", "x + 2"), ["its source text", "its bytecode"]),
        # a comment: the same bytecode, other text
        (("# each item twice over", "# each item, doubled"), ["its source text"]),
        # no more `super()`: no more `__class__` cell
        (("super().forward(xs)", "Base.forward(self, xs)"), None),
    ],
)
def test_an_edited_body_is_a_difference_that_says_what_changed(tmp_path, edit, what):
    made_for = fingerprint(_scale(tmp_path, "original"))
    live = fingerprint(_scale(tmp_path, "edited", SCALE.replace(*edit)))
    found = code_differences(made_for, live)
    if what is None:
        assert "the variables it closes over (__class__ → none)" in found
    else:
        assert found == what


def test_the_kernel_module_carries_the_analysis_own_code_identity(tmp_path):
    text = runtime("_fuselens_model_kernels")
    for function in (fingerprint, code_differences, find_function, code_identity.wrapped_by):
        assert inspect.getsource(function) in text
    # The runtime section runs on its own (a kernel module is standalone), and computes what the analysis does.
    namespace: dict = {"__name__": "model_kernels"}
    exec(compile(text, "model_kernels.py", "exec"), namespace)
    library = _module(tmp_path, "library", SCALE)
    code = library.Scale.forward.__code__
    assert namespace["fingerprint"](code) == fingerprint(code)
    assert namespace["find_function"](library, "Scale.forward") is library.Scale.forward


WRAPPED = """
import functools


def use_kernel_forward_from_hub(layer_name):
    # The shape of `kernels.use_kernel_forward_from_hub` on a function: an instance whose class's
    # `forward` calls it.
    def decorator(func):
        class Func:
            def forward(self, *args, **kwargs):
                return func(*args, **kwargs)

            __call__ = forward

        return Func()

    return decorator


def logged(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)

    return wrapper


@use_kernel_forward_from_hub("rotary_pos_emb")
def rotate(x, c, s):
    return x * c + x * s


@logged
def scaled(x):
    return x * 2


class Layer:
    @staticmethod
    def static(x):
        return x + 1

    @classmethod
    def built(cls, x):
        return cls

    @property
    def width(self):
        return 4
"""


@pytest.mark.parametrize("qualname", ["rotate", "scaled", "Layer.static", "Layer.built", "Layer.width"])
def test_the_function_is_found_behind_its_wrapper(tmp_path, qualname):
    library = _module(tmp_path, "wrapped", WRAPPED)
    function = find_function(library, qualname)
    assert function is not None and function.__code__.co_qualname == qualname
    assert function.__code__.co_filename == library.__file__
    assert find_function(library, "rotate.missing") is None and find_function(library, "missing") is None


def test_the_function_is_found_behind_the_kernels_hub_decorator(tmp_path):
    pytest.importorskip("kernels")
    text = textwrap.dedent(
        """
        from kernels import use_kernel_forward_from_hub


        @use_kernel_forward_from_hub("rotary_pos_emb")
        def rotate(x, c, s):
            return x * c + x * s
        """
    )
    library = _module(tmp_path, "hub", text)
    assert not isinstance(library.rotate, types.FunctionType)  # the decorator made it an nn.Module
    function = find_function(library, "rotate")
    assert function is not None and function.__code__.co_qualname == "rotate"
    assert library.rotate(2.0, 3.0, 4.0) == function(2.0, 3.0, 4.0) == 14.0


def _other_python(minimum: int = 11) -> str | None:
    """An interpreter of another minor version than this one, 3.`minimum` or later (fuselens supports 3.11
    on), if the machine has one."""
    candidates = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3")))
    candidates += [f"/usr/bin/python3.{minor}" for minor in range(11, 16)]
    for exe in candidates:
        if not os.access(exe, os.X_OK):
            continue
        done = subprocess.run([exe, "-c", "import sys; print(sys.version_info.minor)"], capture_output=True, text=True)
        minor = done.stdout.strip()
        if done.returncode == 0 and minor.isdigit() and int(minor) >= minimum and int(minor) != sys.version_info.minor:
            return exe
    return None


def test_under_another_python_the_source_decides(tmp_path):
    """Analysis on one Python, the model on another: the same source is the same code, though the
    bytecode differs; edited source, or source that cannot be read, is not."""
    exe = _other_python()
    if exe is None:
        pytest.skip("no Python of another minor version on this machine")
    made_for = fingerprint(_scale(tmp_path, "library"))
    script = textwrap.dedent(
        """
        import json, sys
        namespace = {"__name__": "model_kernels"}
        exec(sys.stdin.read(), namespace)
        fingerprint = namespace["fingerprint"]
        out = {}
        for name in ("library", "edited"):
            code = {}
            exec(compile(open(name + ".py").read(), name + ".py", "exec"), code)
            out[name] = fingerprint(code["Scale"].forward.__code__)
        unread = {}
        exec(compile(open("library.py").read(), "/no/such/folder/library.py", "exec"), unread)
        out["unread"] = fingerprint(unread["Scale"].forward.__code__)
        print(json.dumps(out))
        """
    )
    _module(tmp_path, "edited", SCALE.replace("x * 2", "x * 3"))
    done = subprocess.run(
        [exe, "-c", script], input=runtime("_fuselens_model_kernels"), capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    there = json.loads(done.stdout)
    assert there["library"]["python"] != made_for["python"]
    assert there["library"]["source"] == made_for["source"]
    assert code_differences(made_for, there["library"]) == []
    assert code_differences(made_for, there["edited"]) == ["its source text"]
    assert code_differences(made_for, there["unread"])[0].startswith("its source (unreadable, and Python 3.")


GENERIC = """
class Scale[T]:
    def forward(self, x):
        return x * 2, T.__name__
"""

# In a Python that runs a library `generic_lib` (3.12 on): what its `Scale.forward` is, as the kernel
# module's runtime says; then, with the kernel module `patched_lib` beside it, what install() does.
DESCRIBE = """
import json, sys
sys.path.insert(0, ".")
import generic_lib
namespace = {"__name__": "model_kernels"}
exec(sys.stdin.read(), namespace)
print(json.dumps(namespace["fingerprint"](generic_lib.Scale.forward.__code__)))
"""
INSTALL = """
import json, sys, warnings
sys.path.insert(0, ".")
import generic_lib, patched_lib
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    installed = patched_lib.install()
patched = generic_lib.Scale().forward(5)
patched_lib.uninstall()
print(json.dumps([installed, [str(w.message) for w in caught], patched, generic_lib.Scale().forward(5)]))
"""


def test_a_method_that_closes_over_its_type_parameter_keeps_its_cell(tmp_path):
    """Python 3.12's generic classes: a method closes over its class's type parameter.  The patched copy
    closes over the same name, and reads the library's own cell once installed."""
    exe = _other_python(minimum=12)
    if exe is None:
        pytest.skip("no Python 3.12 or later on this machine")
    library = tmp_path / "generic_lib.py"
    library.write_text(GENERIC.lstrip("\n"))
    run = functools.partial(subprocess.run, capture_output=True, text=True, cwd=tmp_path)
    done = run([exe, "-c", DESCRIBE], input=runtime("_fuselens_patched_lib"))
    assert done.returncode == 0, done.stderr
    made_for = from_plain(CodeFingerprint, json.loads(done.stdout))
    assert made_for.free_variables == ["T"]
    source = GENERIC.lstrip("\n").split("\n", 1)[1]
    function = LibraryFunction("generic_lib", "Scale.forward", str(library), 2, 3, source, made_for)
    copy = _copy(function, source.replace("x * 2", "x * 3"), [])  # what a kernel call would stand for
    (tmp_path / "patched_lib.py").write_text(runtime("_fuselens_patched_lib") + "\n\n" + copy)
    done = run([exe, "-c", INSTALL])
    assert done.returncode == 0, done.stderr
    installed, warned, patched, library_result = json.loads(done.stdout)
    assert (installed, warned) == (["generic_lib.Scale.forward"], [])
    assert patched == [15, "T"] and library_result == [10, "T"]


# A small library in the shape of transformers' modeling code: a norm module, and a function that a
# decorator of the shape of `kernels.use_kernel_forward_from_hub` turns into an `nn.Module` instance.
LIBRARY = """
import torch
from torch import nn


def use_kernel_forward_from_hub(layer_name):
    def decorator(func):
        class Func(nn.Module):
            def forward(self, *args, **kwargs):
                return func(*args, **kwargs)

        return Func()

    return decorator


class RMSNorm(nn.Module):
    def __init__(self, width, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


@use_kernel_forward_from_hub("rotary_pos_emb")
def rotate(x, cos, sin):
    cos = cos.unsqueeze(0)
    sin = sin.unsqueeze(0)
    return x * cos + torch.tanh(x) * sin


class Block(nn.Module):
    def __init__(self, width=16, length=8):
        super().__init__()
        self.norm = RMSNorm(width)
        self.proj = nn.Linear(width, width)
        angles = torch.arange(length * width, dtype=torch.float32).reshape(length, width) / 7.0
        self.register_buffer("cos", torch.cos(angles))
        self.register_buffer("sin", torch.sin(angles))

    def forward(self, x):
        h = self.proj(self.norm(x))
        return rotate(h, self.cos, self.sin)
"""

USER = """
from tinylib.layers import Block

model = Block()  # fuselens: input=(2, 8, 16)
"""

# Imports the user's file in a fresh process (its install() runs), and runs its model with the kernels
# installed, then with the library's own code.
RUN = """
import json, sys, warnings
import torch
sys.path[:0] = sys.argv[1:3]
torch.manual_seed(0)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import tiny
kernels = sys.modules["tiny_kernels"]
x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    installed = kernels.install()
    patched = tiny.model(x)
    kernels.uninstall()
    library = tiny.model(x)
print(json.dumps({
    "warnings": [str(w.message) for w in caught if issubclass(w.category, UserWarning)],
    "installed": installed,
    "patched": patched.tolist(),
    "library": library.tolist(),
}))
"""


@pytest.fixture
def tiny_library(tmp_path, monkeypatch):
    """(site-packages folder, the library's file, the user's file): the user's file applied."""
    from fuselens.contracts.options import AnalyzeOptions
    from fuselens.pipeline.apply import apply_file

    site = tmp_path / "site-packages"
    (site / "tinylib").mkdir(parents=True)
    (site / "tinylib" / "__init__.py").write_text("")
    library = site / "tinylib" / "layers.py"
    library.write_text(LIBRARY.lstrip("\n"))
    user = tmp_path / "user" / "tiny.py"
    user.parent.mkdir()
    user.write_text(USER.lstrip("\n"))
    monkeypatch.syspath_prepend(str(site))
    try:
        result = apply_file(str(user), AnalyzeOptions(), None, lambda r: True)
    finally:
        for name in [n for n in sys.modules if n == "tinylib" or n.startswith("tinylib.")]:
            del sys.modules[name]
    assert not result.refused and result.applied, result.skipped
    return str(site), str(library), str(user)


def _run(site: str, user: str) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", RUN, site, os.path.dirname(user)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _close(a, b, tol=1e-4) -> bool:
    import torch

    return torch.allclose(torch.tensor(a), torch.tensor(b), atol=tol, rtol=tol)


@pytest.mark.slow
def test_a_library_edited_after_apply_runs_unpatched_with_a_warning(tiny_library):
    site, library, user = tiny_library
    with open(os.path.join(os.path.dirname(user), "tiny_kernels.py"), encoding="utf-8") as fh:
        promised = sorted(patched_kernels(fh.read()))
    # The projection starts a cluster of `rotate`'s ops (behind its wrapper): Block.forward is patched for it.
    assert promised == ["tinylib.layers.Block.forward", "tinylib.layers.RMSNorm.forward"]

    before = _run(site, user)
    assert before["warnings"] == [] and before["installed"] == promised
    assert _close(before["patched"], before["library"])  # the kernels, in the Triton interpreter

    # Another version of the library: the norm's body changed, its first line and signature did not.
    with open(library, encoding="utf-8") as fh:
        text = fh.read()
    edited = text.replace("x.pow(2).mean(-1, keepdim=True)", "x.pow(2).mean(-1, keepdim=True) * 4")
    assert edited != text
    with open(library, "w", encoding="utf-8") as fh:
        fh.write(edited)

    after = _run(site, user)
    (warning,) = after["warnings"]
    assert warning.startswith("tinylib.layers.RMSNorm.forward is not the code its fused kernels were made for: ")
    assert "its source text" in warning and "its constants" in warning
    assert after["installed"] == ["tinylib.layers.Block.forward"]
    assert _close(after["patched"], after["library"])  # the edited library's output
    assert not _close(after["library"], before["library"], 1e-2)  # which the edit did change
