"""Library patches: `fuselens apply` on a file whose clusters are in transformers' code.

The file gets one import and one `install()`; the kernel module carries each patched library
function.  What a user relies on is checked on the corpus of `library_corpus.CORPUS`: the patched
model computes what the library's own code does, with the kernels running (the Triton
interpreter), where they cannot (CPU without it, bf16 weights on kernels made for fp32, gradients),
and under torch.compile; `uninstall()` puts the library's code back; a library that is not the code
the patch was made from is left alone, with a warning; a function that closes over its class (`super()`)
keeps its closure.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import os
import subprocess
import sys
import textwrap
import types
import warnings
from dataclasses import dataclass, field

import pytest
import torch

from fuselens.codegen.module import existing_patches
from fuselens.codegen.patches import MARKER, patched_kernels
from fuselens.contracts.options import AnalyzeOptions
from fuselens.pipeline.analyze import analyze_file
from fuselens.pipeline.apply import ApplyResult, apply_file

from library_corpus import ALL_CASES, CORPUS, Case

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.slow, pytest.mark.interpreter, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

LLAMA = next(c for c in CORPUS if c.id == "llama")

# Models whose embedding's forward calls `super().forward(...)`, a call its kernel replaces: the library's
# function closes over `__class__`, and the patched copy must too.
SUPER_CALLERS = [
    Case(
        "gemma2",
        "Gemma2",
        "hidden 32, intermediate 64, 2 layers, 4 heads (2 kv), head_dim 8, vocab 128; input (2, 16)",
        """
        from transformers import Gemma2Config, Gemma2ForCausalLM

        config = Gemma2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=8, vocab_size=128, max_position_embeddings=64)
        model = Gemma2ForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.gemma2.modeling_gemma2",
    ),
    Case(
        "gemma3",
        "Gemma3",
        "hidden 32, intermediate 64, 2 layers, 4 heads (2 kv), head_dim 8, vocab 128; input (2, 16)",
        """
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        config = Gemma3TextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=8, vocab_size=128, max_position_embeddings=64)
        model = Gemma3ForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.gemma3.modeling_gemma3",
    ),
]


def _applied(case: Case, folder) -> tuple[str, ApplyResult]:
    """The case's file after `fuselens apply`, and the result."""
    path = case.write(str(folder))
    result = apply_file(path, AnalyzeOptions(), None, lambda r: True)
    assert not result.refused, result.refused
    return path, result


def _load(path: str, name: str):
    """The user's file imported as a script would run it (its folder on sys.path), and its kernel module."""
    folder = os.path.dirname(path)
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec and spec.loader
        user = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(user)
    finally:
        sys.path.remove(folder)
    # Each test's kernel module is its own: another test's file of the same name must import its own.
    kernels = sys.modules.pop(os.path.basename(path)[:-3].replace("-", "_") + "_kernels")
    return user, kernels


def _model(user, case: Case) -> torch.nn.Module:
    name = "Seq2Seq" if case.id == "t5" else "model"
    obj = getattr(user, name)
    return (obj() if isinstance(obj, type) else obj).eval()


def _inputs(report_model) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    out = []
    for spec in report_model.inputs:
        shape = tuple(spec.shape)
        if spec.dtype == "int64":
            out.append(torch.randint(0, 100, shape, generator=generator))
        elif spec.dtype == "bool":
            out.append(torch.ones(shape, dtype=torch.bool))
        else:
            out.append(torch.randn(shape, generator=generator))
    return out


def _outputs(value) -> list[torch.Tensor]:
    leaves = torch.utils._pytree.tree_leaves(value.to_tuple() if hasattr(value, "to_tuple") else value)
    return [t.float() for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor], tol: float) -> float:
    assert len(a) == len(b) and a
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        assert x.shape == y.shape
        worst = max(worst, (x - y).abs().max().item())
        assert torch.allclose(x, y, atol=tol, rtol=tol), worst
    return worst


@dataclass
class Patched:
    result: ApplyResult
    kernels: types.ModuleType | None = None  # the kernel module the user's file imported (None: nothing applied)
    model: torch.nn.Module | None = None  # the user's model
    inputs: list[torch.Tensor] = field(default_factory=list)


@pytest.fixture
def patched(tmp_path):
    """patched(case) -> the case's file applied and imported; its patches uninstalled after the test."""
    loaded: list[types.ModuleType] = []

    def get(case: Case) -> Patched:
        path, result = _applied(case, tmp_path / case.id)

        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        if not result.applied:  # every cluster says why not, and the file is as the user wrote it
            assert result.skipped and all(": " in s for s in result.skipped)
            assert text == textwrap.dedent(case.source).lstrip("\n")
            return Patched(result)
        assert text.count("\ninstall()") == 1
        user, kernels = _load(path, f"user_{case.id.replace('-', '_')}")
        loaded.append(kernels)
        model = _model(user, case)
        report = analyze_file(case.write(str(tmp_path / f"{case.id}-original")))
        return Patched(result, kernels, model, _inputs(report.models[0]))

    yield get
    for kernels in loaded:
        kernels.uninstall()


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CORPUS])
def test_patched_library_model_computes_what_the_library_does(case: Case, patched):
    p = patched(case)
    kernels, model, inputs = p.kernels, p.model, p.inputs
    if kernels is None or model is None:
        return  # nothing of this model can be patched (the fixture checked that each cluster says why)
    installed = kernels.install()  # the file's own install() ran at import: this one finds them in place
    assert installed and all(name.startswith("transformers.") for name in installed)
    with torch.no_grad():
        fused = _outputs(model(*inputs))  # kernels in the Triton interpreter
        kernels.uninstall()
        library = _outputs(model(*inputs))
    _same(fused, library, 1e-4)


def test_patched_llama_runs_where_the_kernels_cannot(patched, monkeypatch):
    p = patched(LLAMA)
    kernels, model, inputs = p.kernels, p.model, p.inputs
    assert kernels is not None and model is not None
    half = copy.deepcopy(model).bfloat16()
    kernels.uninstall()
    with torch.no_grad():
        want32 = _outputs(model(*inputs))
        want16 = _outputs(half(*inputs))
    kernels.install()
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # CPU tensors, no interpreter: the library's ops run
    with torch.no_grad():
        _same(_outputs(model(*inputs)), want32, 0)
        # bf16 weights on kernels made for fp32: the casts the library wrote (`.to(input_dtype)`) follow
        _same(_outputs(half(*inputs)), want16, 0)
    out = model(*inputs).logits
    out.sum().backward()  # gradients: the library's ops run, and differentiate
    assert model.model.layers[0].mlp.up_proj.weight.grad is not None
    with torch.no_grad():
        compiled = torch.compile(model)
        _same(_outputs(compiled(*inputs)), want32, 1e-5)


def test_uninstall_puts_the_library_code_back(patched):
    from transformers.models.llama import modeling_llama

    own = modeling_llama.LlamaRMSNorm.forward.__code__
    kernels = patched(LLAMA).kernels
    assert kernels is not None
    assert modeling_llama.LlamaRMSNorm.forward.__code__ is not own  # the file's install() ran
    assert modeling_llama.LlamaRMSNorm.forward.__code__.co_filename == kernels.__file__
    kernels.uninstall()
    assert modeling_llama.LlamaRMSNorm.forward.__code__ is own
    assert not any(name.startswith("_fuselens_") for name in vars(modeling_llama))


def test_a_library_that_changed_is_left_alone_with_a_warning(tmp_path):
    path, _ = _applied(LLAMA, tmp_path)
    module = os.path.join(tmp_path, "llama_kernels.py")
    with open(module, encoding="utf-8") as fh:
        text = fh.read()
    # As if transformers had moved LlamaRMSNorm.forward: the line the patch was made from is elsewhere.
    target = "'LlamaRMSNorm.forward', "
    at = text.index(target, text.index(MARKER + "transformers.models.llama.modeling_llama.LlamaRMSNorm.forward"))
    at += len(target)
    line = int(text[at:].split(",")[0])
    with open(module, "w", encoding="utf-8") as fh:
        fh.write(text[:at] + str(line + 1) + text[at + len(str(line)) :])
    from transformers.models.llama import modeling_llama

    own = modeling_llama.LlamaRMSNorm.forward.__code__
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, kernels = _load(path, "user_llama_changed")
    try:
        assert any("LlamaRMSNorm.forward is not the code" in str(w.message) for w in caught)
        assert modeling_llama.LlamaRMSNorm.forward.__code__ is own
        assert "transformers.models.llama.modeling_llama.LlamaMLP.forward" in kernels.install()
    finally:
        kernels.uninstall()


def test_a_library_function_whose_body_changed_runs_unpatched_with_a_warning(tmp_path):
    path, _ = _applied(LLAMA, tmp_path)
    from transformers.models.llama import modeling_llama

    norm = modeling_llama.LlamaRMSNorm.forward
    own = norm.__code__
    # As if transformers had changed LlamaRMSNorm.forward's body, not its first line or signature: the
    # same method compiled from edited text, as the module of that version would have compiled it.
    lines, first = inspect.getsourcelines(own)
    body = "".join(lines).replace("keepdim=True)", "keepdim=True) * 4")
    assert body != "".join(lines)
    text = "\n" * (first - 2) + "class LlamaRMSNorm:\n" + body
    namespace: dict = {}
    exec(compile(text, modeling_llama.__file__, "exec"), vars(modeling_llama) | namespace, namespace)
    edited = namespace["LlamaRMSNorm"].forward.__code__
    assert (edited.co_firstlineno, edited.co_qualname) == (own.co_firstlineno, own.co_qualname)
    norm.__code__ = edited
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            user, kernels = _load(path, "user_llama_edited")
        try:
            # The norm, and the decoder layer whose kernel computes the norm's code with the residual add.
            layer, changed = sorted(str(w.message) for w in caught if issubclass(w.category, UserWarning))
            where = "transformers.models.llama.modeling_llama."
            assert changed.startswith(
                f"{where}LlamaRMSNorm.forward is not the code its fused kernels were made for: its bytecode, "
                "its constants differ"
            )
            assert layer.startswith(
                f"{where}LlamaDecoderLayer.forward has fused kernels that compute {where}LlamaRMSNorm.forward, "
                "which is not the code they were made for: its bytecode, its constants differ"
            )
            assert norm.__code__ is edited
            installed = kernels.install()
            assert f"{where}LlamaMLP.forward" in installed
            assert (
                f"{where}LlamaRMSNorm.forward" not in installed and f"{where}LlamaDecoderLayer.forward" not in installed
            )
            model = _model(user, LLAMA)
            ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
            with torch.no_grad():
                fused = _outputs(model(ids))  # the other patches' kernels, and the edited norm
                kernels.uninstall()
                edited_library = _outputs(model(ids))
                norm.__code__ = own
                library = _outputs(model(ids))
            _same(fused, edited_library, 1e-4)
            assert not torch.allclose(edited_library[0], library[0], atol=1e-2)  # the edit shows
        finally:
            kernels.uninstall()
    finally:
        norm.__code__ = own


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in SUPER_CALLERS])
def test_a_function_that_calls_super_installs_and_computes_what_the_library_does(case: Case, patched):
    p = patched(case)
    kernels, model = p.kernels, p.model
    assert kernels is not None and model is not None
    with open(kernels.__file__, encoding="utf-8") as fh:
        promised = sorted(patched_kernels(fh.read()))
    module = importlib.import_module(case.modeling)
    embedding = next(v for k, v in vars(module).items() if k.endswith("TextScaledWordEmbedding"))
    assert f"{case.modeling}.{embedding.__name__}.forward" in promised
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    kernels.uninstall()
    with torch.no_grad():
        library = model.get_input_embeddings()(ids)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        installed = kernels.install()
    assert [str(w.message) for w in caught] == []
    assert installed == promised
    forward = embedding.forward
    assert forward.__code__.co_filename == kernels.__file__  # the copy runs ...
    assert forward.__closure__[0].cell_contents is embedding  # ... with the library's `__class__` cell
    with torch.no_grad():
        fused = model.get_input_embeddings()(ids)
    _same([fused], [library], 1e-5)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(SUPER_CALLERS[0], id="gemma2"),
        # Gemma3's norm runs on q and k (4-D) and on hidden states (3-D): three kernels for one region, each
        # asked in turn by the patched copy.
        pytest.param(SUPER_CALLERS[1], id="gemma3"),
    ],
)
def test_a_patched_model_with_super_calls_computes_what_the_library_does(case: Case, patched):
    p = patched(case)
    kernels, model, inputs = p.kernels, p.model, p.inputs
    assert kernels is not None and model is not None
    with torch.no_grad():
        fused = _outputs(model(*inputs))
        kernels.uninstall()
        library = _outputs(model(*inputs))
    _same(fused, library, 1e-4)


def test_reapplying_keeps_one_install_and_the_patches(tmp_path):
    path, first = _applied(LLAMA, tmp_path)
    module = os.path.join(tmp_path, "llama_kernels.py")
    with open(module, encoding="utf-8") as fh:
        before = fh.read()
    # Again, from the command line (its analysis imports the file, whose install() patches that process):
    # the patched functions run kernels now, so there is nothing new to patch, and nothing is lost.
    cli = [sys.executable, "-m", "fuselens.cli.main", "apply", "--yes", path]
    done = subprocess.run(
        cli, capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "TRITON_INTERPRET": "0"}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    assert text.count("\ninstall()") == 1 and text.count("import install") == 2  # the try/except import
    with open(module, encoding="utf-8") as fh:
        after = fh.read()
    assert patched_kernels(after) == patched_kernels(before) and patched_kernels(after)
    for key, section in existing_patches(before).items():
        assert existing_patches(after)[key] == section
    assert first.applied


# Diffusers ResnetBlock2Ds, one widening (its shortcut convolution runs, in an `if` with other code),
# one not, one without a time embedding (its `if temb is not None:` runs nothing): one patch of the
# block's lines chooses each kernel's rewrite by the tests of the `if`s.
RESNET_BLOCKS = Case(
    "resnet-blocks",
    "three ResnetBlock2Ds (diffusers), with and without a shortcut convolution and a time embedding",
    "16 → 32 → 32 → 32 channels, 8 groups, time embedding 16; inputs (1, 16, 8, 8) + (1, 16)",
    """
    import torch.nn as nn
    from diffusers.models.resnet import ResnetBlock2D


    class TwoBlocks(nn.Module):
        def __init__(self):
            super().__init__()
            self.widen = ResnetBlock2D(in_channels=16, out_channels=32, temb_channels=16, groups=8)
            self.keep = ResnetBlock2D(in_channels=32, out_channels=32, temb_channels=16, groups=8)
            self.plain = ResnetBlock2D(in_channels=32, out_channels=32, temb_channels=None, groups=8)

        def forward(self, x, temb):
            return self.plain(self.keep(self.widen(x, temb), temb), None)
    """,
    "diffusers.models.resnet",
    library="diffusers",
    pyproject="""
    [tool.fuselens.models.TwoBlocks]
    inputs = [[1, 16, 8, 8], [1, 16]]
    """,
)
WHOLE = [*(c for c in ALL_CASES if c.id == "qwen3"), RESNET_BLOCKS]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in WHOLE])
def test_validate_checks_the_patched_library_model_as_a_whole(case: Case, tmp_path):
    """`fuselens validate` applies every cluster to a copy of the file, library patches included, and
    the patched model, its kernels running in the interpreter, computes what the library's code does:
    in eval mode, over a training step (outputs, gradients, running statistics) and at other sizes
    (Qwen3's norm runs at two ranks, ResnetBlock2D's lines sit in `if`s)."""
    from fuselens.contracts.options import ValidateOptions
    from fuselens.pipeline.validate import validate_file

    path = case.write(str(tmp_path))
    result = validate_file(path, AnalyzeOptions(), ValidateOptions(interpret=True))
    assert not result.problems, result.problems
    (model,) = result.models
    check = model.model
    assert check is not None and check.status == "matches", check
    assert check.applied and check.kernel_launches, check  # patches applied, and their kernels ran
    assert check.training is not None and check.training.status == "matches", check.training
    assert check.other_shapes is not None and check.other_shapes.status == "matches", check.other_shapes
    if case is RESNET_BLOCKS:  # every cluster of both blocks applies, the shortcut's included
        report = analyze_file(path)
        chains = [c.op_chain for _, c in report.clusters() if c.applies == "patch"]
        assert "add → add → add → div" in chains and "add → add → div" in chains, chains
        assert all(c.applies == "patch" for _, c in report.clusters()), [c.apply_detail for _, c in report.clusters()]
