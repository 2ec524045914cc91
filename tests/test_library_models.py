"""Library models, written as users write them: transformers' and diffusers' own model classes at tiny sizes.

For each architecture of `library_corpus.ALL_CASES` (decoder LLMs, state-space models, mixtures of
experts, encoders, encoder-decoders, vision models, audio encoders, diffusion UNets, a DiT and a VAE), a
user's file binds the model at module level (or wraps it in a class) with its inputs in a `# fuselens:`
comment or in `pyproject.toml`.  What the user relies on is checked: the model is analyzed; every op of
its clusters is placed at a line of the library's own files, not the user's; `fuselens apply` then
`fuselens restore` gives the file back byte for byte.  For the architectures of `library_corpus.CORPUS`,
more: repeated layers fold; decoders have no graph break; the experts of a mixture of experts are
analyzed; every cluster has a kernel, and every instance of every cluster verifies against eager in the
Triton interpreter, and so do the gradients of every backward.  (Whether each patched model computes what the library does is measured for the whole
corpus by `benchmarks/library_apply.py`.)
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

from fuselens.contracts import report as R
from fuselens.contracts.options import AnalyzeOptions, ValidateOptions
from fuselens.pipeline.analyze import analyze_file
from fuselens.pipeline.apply import apply_file

from library_corpus import ALL_CASES, CORPUS, Case

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing comes from the hub: every model is built from its config
transformers = pytest.importorskip("transformers")

# The interpreter runs kernels in numpy, which warns on log(0) (T5's relative position buckets) exactly
# where eager computes the same values.
pytestmark = [pytest.mark.slow, pytest.mark.interpreter, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

pytest.importorskip("diffusers")  # the corpus's diffusion models (the `test` extra installs it)

LIBRARY = os.path.dirname(os.path.abspath(transformers.__file__))
CASES = [pytest.param(case, id=case.id) for case in CORPUS]
EVERY_CASE = [pytest.param(case, id=case.id) for case in ALL_CASES]
ACTIVATIONS = {"transformers": "activations.py", "diffusers": "models/activations.py"}


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory):
    """analyzed(case) -> (the user's file, its report); each case is written and analyzed once."""
    done: dict[str, tuple[str, R.Report]] = {}

    def get(case: Case) -> tuple[str, R.Report]:
        if case.id not in done:
            path = case.write(str(tmp_path_factory.mktemp(case.id)))
            done[case.id] = (path, analyze_file(path))
        return done[case.id]

    return get


def _only_model(report: R.Report) -> R.Model:
    assert report.problems == []
    assert len(report.models) == 1, [(m.name, m.status) for m in report.models]
    model = report.models[0]
    assert (model.status, model.problem, model.partial) == ("analyzed", None, "")
    return model


def _modeling_file(case: Case) -> str:
    return os.path.abspath(importlib.import_module(case.modeling).__file__ or "")


def _library_folder(case: Case) -> str:
    return os.path.dirname(os.path.abspath(importlib.import_module(case.library).__file__ or ""))


@pytest.mark.parametrize("case", EVERY_CASE)
def test_every_op_of_a_library_model_is_at_a_line_of_its_library(case: Case, analyzed):
    """Each op of each cluster is at a line of the model's modeling file (or of the library files it
    shares), which the report names from the package down, and that line is code."""
    _, report = analyzed(case)
    model = _only_model(report)
    assert model.clusters
    library = _library_folder(case)
    allowed = {_modeling_file(case)} | {os.path.join(library, *f.split("/")) for f in case.shared}
    # An activation is the library's activation module's (`ACT2FN[...]`): its op is at a line there.
    activations = os.path.join(library, *ACTIVATIONS[case.library].split("/"))
    for cluster in model.clusters:
        where = f"{cluster.id} {cluster.op_chain}"
        assert cluster.file in allowed, (where, os.path.relpath(cluster.file, library))
        for op in cluster.ops:
            assert op.file in allowed | {activations}, (where, op.target, os.path.relpath(op.file, library))
            with open(op.file, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
            assert 1 <= op.line <= len(lines) and lines[op.line - 1].strip(), (where, op.target, op.line)
    (named,) = [lib for lib in report.libraries if lib.name == case.library]
    assert os.path.join(named.root, case.library) == library
    assert (named.distribution, named.version) == (case.library, importlib.import_module(case.library).__version__)
    assert any(c.file == _modeling_file(case) for c in model.clusters)


@pytest.mark.parametrize("case", EVERY_CASE)
def test_apply_then_restore_gives_back_the_users_file(case: Case, tmp_path):
    """`fuselens apply` patches what it can (each other cluster says why not), and `fuselens restore`
    puts the file back byte for byte."""
    path = case.write(str(tmp_path))
    with open(path, "rb") as fh:
        written = fh.read()
    result = apply_file(path, AnalyzeOptions(), None, lambda r: True)
    assert not result.refused, result.refused
    assert all(": " in line and not line.endswith(": ") for line in result.skipped), result.skipped
    if not result.applied:
        return
    with open(path, encoding="utf-8") as fh:
        assert fh.read().count("\ninstall()") == 1
    restore = [sys.executable, "-m", "fuselens.cli.main", "restore", "--yes", path]
    done = subprocess.run(restore, capture_output=True, text=True, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    with open(path, "rb") as fh:
        assert fh.read() == written


@pytest.mark.parametrize("case", CASES)
def test_library_model_is_analyzed_in_its_modeling_file(case: Case, analyzed):
    path, report = analyzed(case)
    model = _only_model(report)
    assert model.clusters
    modeling = _modeling_file(case)
    assert modeling.startswith(os.path.join(LIBRARY, "models") + os.sep)
    allowed = {modeling} | {os.path.join(LIBRARY, *f.split("/")) for f in case.shared}
    for cluster in model.clusters:
        where = f"{cluster.id} {cluster.op_chain}"
        assert cluster.file != path, where
        assert cluster.file in allowed, (where, os.path.relpath(cluster.file, LIBRARY))
        assert cluster.code, where  # the lines as they read in the library, for the editor to show
        assert cluster.kernel is not None and cluster.lowering == "ok", (where, cluster.lowering)
        if cluster.reached_from is not None:  # the user's line that calls into the library
            assert cluster.reached_from.file == path, where
    assert any(c.file == modeling for c in model.clusters)


@pytest.mark.parametrize("case", CASES)
def test_library_model_repeated_layers_fold(case: Case, analyzed):
    model = _only_model(analyzed(case)[1])
    # Every layer (of a stage) has the same clusters: one each, counted, as many times as there are layers
    # (or more: Llama's final norm is one more run of the layers' RMSNorm code).
    assert max(c.multiplicity for c in model.clusters) >= case.repeats
    for cluster in model.clusters:
        assert len(cluster.instances) == cluster.multiplicity == len(cluster.positions)


@pytest.mark.parametrize("case", CASES)
def test_library_model_graph_breaks_are_where_torch_compile_breaks(case: Case, analyzed):
    model = _only_model(analyzed(case)[1])
    found = {(b.file, b.code.strip()) for b in model.graph_breaks}
    assert found == {(_modeling_file(case), code) for _, code in case.breaks}
    if case.breaks:  # the trace went on past them with a run on real values, not stopped there
        assert any("traced past the data-dependent op" in note for note in model.notes), model.notes
    if case.decoder:
        assert model.inputs[0].dtype == "int64"  # token ids, without being told


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CORPUS if c.experts])
def test_library_moe_experts_are_analyzed(case: Case, analyzed):
    model = _only_model(analyzed(case)[1])
    experts = [c for c in model.clusters if all(case.experts in op.module for op in c.ops)]
    # The experts' gated activation, silu(gate) * up, in every layer (and, where an expert is its own
    # code, its down projection scaled by its routing weight: a GEMM and its epilogue).
    assert {c.op_chain for c in experts} - {"linear → mul"} == {"silu → mul"}
    layers = {instance.split(".mlp.")[0] for c in experts for instance in c.instances}
    assert layers == {"model.layers.0", "model.layers.1"}


@pytest.mark.parametrize("case", CASES)
def test_library_model_kernels_verify_in_the_interpreter(case: Case, analyzed):
    pytest.importorskip("triton")
    from fuselens.pipeline.validate import validate_file

    path, report = analyzed(case)
    model = _only_model(report)
    result = validate_file(path, AnalyzeOptions(), ValidateOptions(interpret=True))
    assert result.problems == []
    assert [m.name for m in result.models] == [model.name]
    checks = {c.id: c for c in result.models[0].clusters}
    # The validation analyzed the file again: the same clusters (the analysis is reproducible).
    assert {k: c.ops for k, c in checks.items()} == {c.id: c.op_chain for c in model.clusters}
    for cluster in model.clusters:
        check = checks[cluster.id]
        assert (check.status, check.instances) == ("verified", cluster.multiplicity), (cluster.op_chain, check)
        # Every backward kernel's gradients were compared with eager autograd's, and agree.
        assert (check.backward is not None) == bool(cluster.backward), (cluster.op_chain, cluster.backward)
        assert check.backward is None or check.backward.status == "verified", (cluster.op_chain, check.backward)
    assert result.ok


# Models outside the corpus whose backward checks once failed: a cluster that starts by writing into its
# input in place (Falcon's parallel attention: `mlp_output += attention_output`), and BART's positions,
# moved to the embeddings' device (`positions.to(inputs_embeds.device)`), which the analysis traces on meta.
GRADIENT_CASES = [
    pytest.param(
        Case(
            "falcon",
            "Falcon",
            "hidden 32, 2 layers, 4 heads, vocab 128; input (2, 16)",
            """
        from transformers import FalconConfig, FalconForCausalLM

        config = FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, vocab_size=128)
        model = FalconForCausalLM(config)  # fuselens: input=(2, 16)
        """,
            "transformers.models.falcon.modeling_falcon",
        ),
        "add → add",  # the in-place sum, then the residual
        id="falcon",
    ),
    pytest.param(
        Case(
            "bart",
            "BART",
            "d_model 32, ffn 64, 2+2 layers, 4 heads, vocab 128; input (2, 16)",
            """
        from transformers import BartConfig, BartModel

        config = BartConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=128,
                            max_position_embeddings=64)
        model = BartModel(config)  # fuselens: input=(2, 16)
        """,
            "transformers.models.bart.modeling_bart",
        ),
        "embedding → mul",  # the scaled token embedding, a piece of the embeddings' cluster that applies
        id="bart",
    ),
]


@pytest.mark.parametrize("case, chain", GRADIENT_CASES)
def test_every_backward_check_compares_gradients(case: Case, chain: str, tmp_path):
    """Every cluster with a backward has its gradients compared with eager autograd's, and they agree:
    among them Falcon's in-place sum of its two branches and BART's embeddings with their positions."""
    pytest.importorskip("triton")
    from fuselens.pipeline.validate import validate_file

    result = validate_file(case.write(str(tmp_path)), AnalyzeOptions(), ValidateOptions(interpret=True))
    assert result.problems == []
    (model,) = result.models
    checked = [c for c in model.clusters if c.backward is not None]
    assert checked
    for check in model.clusters:
        assert check.status == "verified", (check.ops, check.message)
        assert check.backward is None or check.backward.status == "verified", (check.ops, check.backward)
    assert chain in [c.ops for c in checked]


def test_a_partial_rotary_passing_nothing_through_applies_and_trains_with_its_kernel(analyzed):
    """Phi-3 concatenates each rotated query with the slice of its head past the rotary dim, empty
    when the rotary dim is the whole head: the kernel takes no empty input, its torch fallback
    replays the concatenation without it, so the query's RoPE applies as a library patch whose
    gradients are one kernel, not eager autograd."""
    case = next(c for c in CORPUS if c.id == "phi3")
    _, report = analyzed(case)
    model = _only_model(report)
    rotary = [c for c in model.clusters if {"neg", "cat", "mul", "add"} <= {op.target for op in c.ops}]
    assert rotary
    patched = [c for c in rotary if c.applies == "patch"]
    assert patched, [(c.id, c.apply_detail) for c in rotary]
    for cluster in patched:
        assert all(0 not in value.shape for value in cluster.inputs), cluster.inputs
        assert cluster.backward_detail.startswith("gradients of"), cluster.backward_detail
        assert cluster.backward not in (R.PASS_THROUGH_BACKWARD, R.TORCH_BACKWARD)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CORPUS if c.id in ("llama", "qwen2", "phi3")])
def test_the_key_cache_copy_stays_out_of_the_keys_rotary(case: Case, analyzed):
    """With a key cache, a decoder's rotated keys are copied into the still empty cache by
    `torch.cat` in the cache's own code: the copy is left out, so the keys' RoPE is the same kernel,
    applied the same way, as the queries'."""
    model = _only_model(analyzed(case)[1])
    modeling = _modeling_file(case)
    rotary = [c for c in model.clusters if {"neg", "cat", "mul", "add"} <= {op.target for op in c.ops}]
    assert len(rotary) == 2, [c.op_chain for c in model.clusters]
    for cluster in rotary:
        assert {op.file for op in cluster.ops} == {modeling}, cluster.op_chain
        assert cluster.applies == "patch", cluster.apply_detail
    assert len({tuple(c.lines) for c in rotary}) == 2  # `q_embed = ...` and `k_embed = ...`
    copies = [r for r in model.rejections if r.reason == "layer-boundary" and "only copies" in r.detail]
    assert copies and all(os.path.basename(r.file) == "cache_utils.py" for r in copies), copies


def test_a_residual_dropout_stays_in_the_norms_call(analyzed):
    """Phi-3's `residual + self.resid_attn_dropout(hidden_states)` ran no dropout in eval mode: the
    residual + RMSNorm kernel still applies, its call taking the dropout's result, so it drops in training."""
    model = _only_model(analyzed(next(c for c in CORPUS if c.id == "phi3"))[1])
    (cluster,) = [c for c in model.clusters if c.op_chain.startswith("add → pow → mean")]
    assert cluster.applies == "patch", cluster.apply_detail
    assert "self.resid_attn_dropout(hidden_states)" in cluster.apply_detail
