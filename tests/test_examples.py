"""Every shipped example analyzes, and the findings a user relies on are there."""

from __future__ import annotations

import json
import os

import pytest

from fuselens.contracts.report import REJECTION_REASONS, Report
from fuselens.contracts.schema import generate_schema, load_schema, validate_report

from conftest import EXAMPLES, chains, example, only_model

EXAMPLE_FILES = sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py") and not f.endswith("_kernels.py"))


@pytest.fixture(scope="module")
def reports():
    from fuselens.pipeline.analyze import AnalyzeOptions, analyze_file

    return {name: analyze_file(example(name), AnalyzeOptions()) for name in EXAMPLE_FILES}


def test_example_net_finds_the_three_clusters_with_exact_mappings(analyze):
    model = only_model(analyze(example("example_net.py"), input_shapes=["16384,1024"]))
    # The second starts with proj1, whose result it takes as its epilogue's input instead of from memory.
    assert chains(model) == ["mul → relu → add", "linear → gelu → sigmoid → mul", "tanh → mul → softmax"]
    mb = 2**20
    proj1 = (64 + 2 + 32) * mb + 512 * 4  # x, the weight and the bias read, the result written
    assert [(c.bytes_unfused, c.bytes_fused) for c in model.clusters] == [
        (384 * mb, 128 * mb),
        (proj1 + 192 * mb, proj1),
        (192 * mb, 64 * mb),
    ]
    assert [c.mapping for c in model.clusters] == ["exact"] * 3
    assert [c.lines for c in model.clusters] == [[18, 20], [22, 25], [28, 30]]
    assert [c.regime for c in model.clusters] == ["dram-bound", "compute-bound", "dram-bound"]
    assert model.totals.bytes_avoidable == 576 * mb


@pytest.mark.parametrize("name", EXAMPLE_FILES)
def test_every_example_analyzes_and_validates_against_the_schema(reports, name):
    report = reports[name]
    assert not report.problems
    analyzed = [m for m in report.models if m.status == "analyzed"]
    assert analyzed and all(m.clusters for m in analyzed)
    assert all(m.status in ("analyzed", "skipped") for m in report.models)
    data = json.loads(json.dumps(report.to_dict()))
    validate_report(data)
    assert Report.from_dict(data).to_dict() == data


@pytest.mark.parametrize("name", EXAMPLE_FILES)
def test_no_silent_drops_and_no_phantom_traffic(reports, name):
    """Every absorbable op is in exactly one cluster or one rejection; free ops never count."""
    for model in (m for m in reports[name].models if m.status == "analyzed"):
        places = {}
        for c in model.clusters:
            for op in c.ops:
                key = (op.file, op.line, op.target, op.module, c.branch)
                places.setdefault(key, []).append(c.id)
            assert all(op.target not in ("dropout", "contiguous", "clone", "detach", "view") for op in c.ops)
            assert c.bytes_unfused > c.bytes_fused > 0
        for r in model.rejections:
            assert r.reason in REJECTION_REASONS and r.detail
            key = (r.ops[0].file, r.ops[0].line, r.ops[0].target, r.ops[0].module, "")
            assert key not in places, f"{key} is both clustered and rejected"


def test_ops_are_accounted_for_in_the_traced_graph():
    """The invariant on the graph itself, for every example (including repeated layers)."""
    from fuselens.analysis import capture, loader
    from fuselens.analysis.detect import detect
    from fuselens.codegen.plan import check
    from fuselens.contracts.config import InputSpec

    cases = [
        ("gpt.py", "GPT", [InputSpec([2, 64], "int64")], {"n_layers": 3}),
        ("llama_block.py", "LlamaBlock", [InputSpec([1, 32, 1024], "bfloat16")], {}),
        ("conv_block.py", "ResBlock", [InputSpec([2, 128, 8, 8]), InputSpec([2, 512])], {}),
        ("branchy.py", "GatedNet", [InputSpec([16, 1024])], {}),
        ("example_net.py", "ExampleNet", [InputSpec([16, 1024])], {}),
    ]
    user = capture.UserCode()
    for file, cls, specs, init in cases:
        module = loader.import_file(example(file), user)
        model = loader.build(loader.model_classes(module)[cls], init, user, "").model
        graph = capture.trace(model, loader.meta_inputs(specs), ["x"] * len(specs), user).graph
        det = detect(graph, check)
        clustered = [m for g in det.clusters for m in g.members if graph[m].cls.absorbable]
        rejected = [r.node for r in det.rejected]
        assert len(clustered) == len(set(clustered)) and not set(clustered) & set(rejected)
        absorbable = {n.id for n in graph if n.cls.absorbable and n.meta is not None}
        assert absorbable == set(clustered) | set(rejected), file


def test_llama_block_yields_rmsnorm_rope_swiglu_and_attention(reports):
    model = only_model(reports["llama_block.py"])
    patterns = {p.name for p in model.patterns}
    # The softmax is the attention's: it is named once, as the attention it is part of.
    assert {"rmsnorm", "rope", "swiglu", "attention", "gemm-residual-rmsnorm-gemm"} <= patterns
    assert "softmax" not in patterns
    ops = chains(model)
    assert any(c.startswith("cast → pow → mean → add → rsqrt") for c in ops)  # RMSNorm spelled out
    assert ops.count("mul → neg → cat → mul → add") == 2  # RoPE on q and k
    assert "linear → silu → mul" in ops  # SwiGLU, the gate's projection its GEMM
    assert any(c.endswith("softmax → cast") for c in ops)  # softmax computed in float32
    gemm = next(p for p in model.patterns if p.name == "gemm-residual-rmsnorm-gemm")
    assert gemm.dims["M"] == 4 * 2048 and gemm.dims["N"] == 1024 and gemm.dims["K0"] == 1024
    assert gemm.dims["K1"] == 2816 and gemm.dims["dtype"] == "bfloat16"
    assert gemm.estimate.bytes_before > gemm.estimate.bytes_after


def test_gpt_reports_repeated_layers_once_with_a_count(reports):
    model = only_model(reports["gpt.py"], "GPT")
    assert model.inputs[0].dtype == "int64"
    counts = sorted(c.multiplicity for c in model.clusters)
    assert max(counts) == 12  # residual add + LayerNorm in each of the 12 blocks
    repeated = max(model.clusters, key=lambda c: c.multiplicity)
    assert repeated.total_bytes_unfused == repeated.bytes_unfused * 12
    assert len(set(repeated.instances)) == 12
    skipped = {m.name: m for m in reports["gpt.py"].models if m.status == "skipped"}
    assert "analyzed inside GPT" in " ".join(skipped["Block"].notes)


def test_branchy_model_reports_the_break_and_clusters_from_both_pieces(reports):
    model = only_model(reports["branchy.py"])
    (brk,) = model.graph_breaks
    assert brk.line == 19 and "data-dependent" in brk.reason
    by_chain = {c.op_chain: c for c in model.clusters}
    assert by_chain["linear → silu → mul → add"].lines == [17, 18]  # before the break, from its GEMM on
    assert by_chain["sigmoid → mul"].lines == [20, 20]  # after it
    assert "line 19 is False" in by_chain["tanh → mul"].branch  # the other branch
    split = by_chain["linear → silu → mul → add"].boundaries
    assert any(b.reason == "graph-break" for b in split)


def test_conv_block_fuses_groupnorm_with_silu_and_the_broadcast_add(reports):
    """Each convolution's bias add joins the kernel after it (torch adds cuDNN's bias on its own)."""
    model = only_model(reports["conv_block.py"])
    assert chains(model) == ["group_norm → silu", "add → add → group_norm → silu", "add → add → mul"]
    assert all(c.mapping == "exact" for c in model.clusters)
    add = model.clusters[1]
    assert [i.name for i in add.inputs][:3] == ["h", "self.conv1.bias", "e[:, :, None, None]"]
    assert add.edit is not None and "h = self.conv1._conv_forward(h, self.conv1.weight, None)\n" in add.edit.text


def test_shipped_schema_matches_the_report_dataclasses():
    assert load_schema() == generate_schema(), (
        "regenerate: python -m fuselens.contracts.schema > contracts/report.schema.json"
    )
