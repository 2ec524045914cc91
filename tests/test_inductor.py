"""Inductor capture and comparison: what torch.compile fused, next to what we propose.

The first half checks the comparison rules on hand-built kernels (fast, no compiler).  The
second half (`slow`) compiles real models with Inductor on the CPU and checks what a user
would see: the kernels, their lines, and how each of our clusters compares.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.utils._triton

from fuselens.analysis.inductor import capture_inductor
from fuselens.analysis.inductor_compare import compare_with_inductor
from fuselens.contracts.inductor import (
    STATUSES,
    AtenOp,
    InductorCapture,
    InductorComparison,
    InductorGraph,
    InductorKernel,
    InductorOp,
)
from fuselens.contracts.plain import from_plain
from fuselens.contracts.report import Boundary, Cluster, Model, OpRef, Rejection

from conftest import example, only_model

F = "/models/net.py"


# ---- the comparison rules, on hand-built captures ------------------------------------------


def _capture(
    ops: list[tuple],
    kernels: dict[str, list[str]],
    unattributed: dict[str, int] | None = None,
    aten: dict[str, list[tuple[str, str, str]]] | None = None,
):
    """ops: (name, op, line, producers); kernels: id -> op names, in one graph.

    aten: kernel id -> (node name, target, user op) computed there; by default each user op
    lowers to one aten node of its own name (so an op in two kernels is a recomputation)."""
    graph_ops = [
        InductorOp(name, op, f"torch.{op}", F, line, False, list(producers)) for name, op, line, producers in ops
    ]
    by_name = {o.name: o for o in graph_ops}
    graph_kernels = []
    for kid, names in kernels.items():
        for n in names:
            by_name[n].kernels.append(kid)
        lines = sorted({by_name[n].line for n in names})
        nodes = (aten or {}).get(kid) or [(n, f"aten.{by_name[n].op}.default", n) for n in names]
        aten_ops = [AtenOp(node, target, F, by_name[user].line, [user]) for node, target, user in nodes]
        graph_kernels.append(
            InductorKernel(
                kid,
                f"triton_{kid}",
                "pointwise",
                0,
                aten_ops,
                list(names),
                [[F, ln] for ln in lines],
                "",
                [],
                (unattributed or {}).get(kid, 0),
            )
        )
    return InductorCapture("cpu", "triton-cpu", True, "test", [InductorGraph(0, graph_ops, graph_kernels)])


def _op(target: str, line: int) -> OpRef:
    return OpRef(target, F, line, None, None)


def _cluster(cid: str, *ops: tuple[str, int], boundaries=()) -> Cluster:
    lines = [o[1] for o in ops]
    return Cluster(
        cid,
        "elementwise",
        [_op(t, ln) for t, ln in ops],
        [],
        [],
        F,
        [min(lines), max(lines)],
        "forward",
        "exact",
        "",
        None,
        None,
        None,
        boundaries=list(boundaries),
    )


def _rejection(target: str, line: int, reason: str, detail: str = "") -> Rejection:
    return Rejection([_op(target, line)], reason, detail, F, [line, line])


def _model(*clusters, rejections=()) -> Model:
    return Model("Net", F, 1, "analyzed", clusters=list(clusters), rejections=list(rejections))


def _status(result, cid: str) -> str:
    return next(c for c in result.clusters if c.cluster == cid).status


CHAIN = [("a", "mul", 10, []), ("b", "relu", 11, ["a"]), ("c", "sum", 12, ["b"]), ("d", "linear", 13, ["c"])]


def test_one_kernel_with_exactly_the_clusters_ops_agrees():
    result = compare_with_inductor(
        _model(_cluster("c0", ("mul", 10), ("relu", 11))), _capture(CHAIN, {"k1": ["a", "b"], "k2": ["c"], "k3": ["d"]})
    )
    (c0,) = result.clusters
    assert c0.status == "agree"
    assert [s.kernel for s in c0.instances[0].kernels] == ["k1"]
    assert "triton_k1" in c0.summary
    roles = {k.kernel: k.role for k in result.kernels}
    assert roles == {"k1": "cluster", "k2": "single-op", "k3": "single-op"}


def test_a_wider_kernel_names_what_it_absorbed_and_why_we_left_it_out():
    rejected = _rejection("sum", 12, "reduction", "sum reduces dim 0")
    result = compare_with_inductor(
        _model(_cluster("c0", ("mul", 10), ("relu", 11)), rejections=[rejected]),
        _capture(CHAIN, {"k1": ["a", "b", "c"], "k3": ["d"]}),
    )
    (c0,) = result.clusters
    assert c0.status == "inductor-wider"
    (absorbed,) = c0.instances[0].kernels[0].absorbed
    assert (absorbed.op, absorbed.line, absorbed.reason) == ("sum", 12, "reduction")
    assert "sum (line 12)" in c0.summary and "reduction" in c0.summary


def test_a_boundary_on_the_cluster_explains_an_absorbed_op_before_model_rejections():
    boundary = Boundary(_op("sum", 12), "shape", "different iteration space")
    rejected = _rejection("sum", 12, "reduction")
    result = compare_with_inductor(
        _model(_cluster("c0", ("mul", 10), ("relu", 11), boundaries=[boundary]), rejections=[rejected]),
        _capture(CHAIN, {"k1": ["a", "b", "c"]}),
    )
    assert result.clusters[0].instances[0].kernels[0].absorbed[0].reason == "shape"


def test_a_kernel_computing_part_of_an_op_names_the_part_and_recomputation_is_told_apart():
    # On CUDA a Linear's bias add joins the next pointwise kernel; the GEMM stays a library call.
    ops = [("l", "linear", 22, []), ("g", "gelu", 23, ["l"]), ("m", "mul", 24, ["g"]), ("t", "tanh", 25, ["m"])]
    aten = {
        "k1": [("mm", "aten.mm.default", "l")],
        "k2": [("add", "aten.add.Tensor", "l"), ("gelu", "aten.gelu.default", "g"), ("mul", "aten.mul.Tensor", "m")],
        "k3": [("mul", "aten.mul.Tensor", "m"), ("tanh", "aten.tanh.default", "t")],
    }
    result = compare_with_inductor(
        _model(_cluster("c0", ("gelu", 23), ("mul", 24))),
        _capture(ops, {"k1": ["l"], "k2": ["l", "g", "m"], "k3": ["m", "t"]}, aten=aten),
    )
    (c0,) = result.clusters
    assert c0.status == "inductor-wider"
    (linear,) = c0.instances[0].kernels[0].absorbed
    assert (linear.op, linear.part, linear.recomputed) == ("linear", ["add"], False)
    assert "linear's add (line 22)" in c0.summary
    assert c0.instances[0].also_in == ["k3"]  # k3 computes the mul again: a recomputation, not a split


def test_splits_list_each_kernel_with_the_lines_it_covers():
    result = compare_with_inductor(
        _model(_cluster("c0", ("mul", 10), ("relu", 11), ("sum", 12))), _capture(CHAIN, {"k1": ["a", "b"], "k2": ["c"]})
    )
    (c0,) = result.clusters
    assert c0.status == "inductor-splits"
    assert [(s.kernel, s.lines) for s in c0.instances[0].kernels] == [("k1", [10, 11]), ("k2", [12])]
    assert "2 kernels" in c0.summary


def test_misses_when_no_kernel_holds_two_of_its_ops():
    result = compare_with_inductor(
        _model(_cluster("c0", ("mul", 10), ("relu", 11))), _capture(CHAIN, {"k1": ["a"], "k2": ["b"]})
    )
    assert _status(result, "c0") == "inductor-misses"


def test_a_cluster_whose_ops_inductor_never_saw_is_not_found():
    result = compare_with_inductor(
        _model(_cluster("c0", ("tanh", 40), ("mul", 41))), _capture(CHAIN, {"k1": ["a", "b"]})
    )
    assert _status(result, "c0") == "not-found"
    assert [o.line for o in result.clusters[0].not_found] == [40, 41]


def test_the_op_name_breaks_ties_between_ops_on_one_line():
    # `F.softmax(x * 2.0)`: mul and softmax share line 20; Inductor fused softmax with tanh only.
    ops = [("a", "mul", 20, []), ("b", "softmax", 20, ["a"]), ("c", "tanh", 21, ["b"])]
    result = compare_with_inductor(
        _model(_cluster("c0", ("softmax", 20), ("tanh", 21))), _capture(ops, {"k1": ["a"], "k2": ["b", "c"]})
    )
    (c0,) = result.clusters
    assert c0.status == "agree"  # matched by line alone, the mul in k1 would have made it a split
    assert not c0.by_line_only


def test_repeated_layers_are_told_apart_by_data_edges():
    ops = [
        ("e", "embedding", 5, []),
        ("a0", "add", 30, ["e"]),
        ("n0", "layer_norm", 31, ["a0"]),
        ("l0", "linear", 32, ["n0"]),
        ("a1", "add", 30, ["l0", "a0"]),
        ("n1", "layer_norm", 31, ["a1"]),
    ]
    model = _model(_cluster("c0", ("add", 30), ("layer_norm", 31)))
    same = compare_with_inductor(model, _capture(ops, {"k1": ["a0", "n0"], "k2": ["l0"], "k3": ["a1", "n1"]}))
    assert [i.status for i in same.clusters[0].instances] == ["agree", "agree"]
    wider = compare_with_inductor(model, _capture(ops, {"k1": ["a0", "n0"], "k2": ["l0"], "k3": ["e", "a1", "n1"]}))
    c0 = wider.clusters[0]
    assert [i.status for i in c0.instances] == ["agree", "inductor-wider"]
    assert c0.status == "inductor-wider" and c0.summary.startswith("in 1 of 2 instances")


def test_a_larger_cluster_takes_the_occurrence_of_lines_it_contains():
    # RMSNorm's lines (20, 21) run twice; the second time inside "residual add + RMSNorm".
    ops = [
        ("p0", "pow", 20, []),
        ("m0", "mul", 21, ["p0"]),
        ("g", "linear", 30, ["m0"]),
        ("r", "add", 40, ["g"]),
        ("p1", "pow", 20, ["r"]),
        ("m1", "mul", 21, ["p1", "r"]),
    ]
    model = _model(_cluster("norm", ("pow", 20), ("mul", 21)), _cluster("res", ("add", 40), ("pow", 20), ("mul", 21)))
    result = compare_with_inductor(model, _capture(ops, {"k1": ["p0", "m0"], "k2": ["g"], "k3": ["r", "p1", "m1"]}))
    norm, res = result.clusters
    assert (norm.status, [s.kernel for i in norm.instances for s in i.kernels]) == ("agree", ["k1"])
    assert (res.status, [s.kernel for i in res.instances for s in i.kernels]) == ("agree", ["k3"])


def test_fusions_matching_no_cluster_are_listed_with_our_reasons():
    ops = [*CHAIN, ("e", "exp", 50, ["d"]), ("f", "softmax", 50, ["e"])]
    rejected = [_rejection("softmax", 50, "reduction", "dim 0"), _rejection("exp", 50, "no-neighbour")]
    result = compare_with_inductor(
        _model(_cluster("c0", ("mul", 10), ("relu", 11)), rejections=rejected),
        _capture(ops, {"k1": ["a", "b"], "k2": ["c"], "k3": ["d"], "k4": ["e", "f"], "k5": []}, unattributed={"k5": 3}),
    )
    (unmatched,) = result.unmatched
    assert unmatched.kernel == "k4"
    assert [(o.op, o.reason) for o in unmatched.ops] == [("exp", "no-neighbour"), ("softmax", "reduction")]
    roles = {k.kernel: k.role for k in result.kernels}
    assert roles == {
        "k1": "cluster",
        "k2": "single-op",
        "k3": "single-op",
        "k4": "unmatched-fusion",
        "k5": "unattributed",
    }


def test_the_result_is_plain_json_and_the_module_needs_no_torch():
    capture = from_plain(InductorCapture, json.loads(json.dumps(_capture(CHAIN, {"k1": ["a", "b"]}).to_dict())))
    result = compare_with_inductor(_model(_cluster("c0", ("mul", 10), ("relu", 11))), capture)
    data = json.loads(json.dumps(result.to_dict()))
    assert from_plain(InductorComparison, data) == result
    assert data["clusters"][0]["status"] in STATUSES
    assert result.status_counts()["agree"] == 1
    code = "import sys, fuselens.analysis.inductor_compare; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ---- real compiles ------------------------------------------------------------------------


def _load(path: str):
    spec = importlib.util.spec_from_file_location(f"inductor_test_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _analyze_and_capture(analyze, path: str, cls: str, init: dict, shape: list[int], dtype: str):
    report = analyze(path, model_class=cls, models={cls: {"init": init, "inputs": [shape], "dtype": dtype}})
    model = only_model(report, cls)
    net = getattr(_load(path), cls)(**init)
    torch_dtype = getattr(torch, dtype)
    x = torch.randn(shape).to(torch_dtype) if torch_dtype.is_floating_point else torch.zeros(shape, dtype=torch_dtype)
    capture = capture_inductor(net, [x])
    return model, capture, compare_with_inductor(model, capture)


def _assert_every_kernel_accounted_for(capture, result):
    kernels = {k.id: k for k in capture.kernels()}
    assert {a.kernel for a in result.kernels} == set(kernels)
    touched = {s.kernel for c in result.clusters for i in c.instances for s in i.kernels}
    unmatched = {u.kernel for u in result.unmatched}
    for kid, kernel in kernels.items():
        if kernel.is_fusion:
            assert (kid in touched) != (kid in unmatched), kernel.name
    for account in result.kernels:
        if account.kernel in touched:
            assert account.role == "cluster" and account.clusters
        elif account.kernel in unmatched:
            assert account.role == "unmatched-fusion"
        else:
            assert account.role in ("single-op", "no-user-ops", "unattributed")
    for c in result.clusters:  # every kernel named for a cluster really computes the cluster's lines
        for instance in c.instances:
            for share in instance.kernels:
                kernel_lines = {ln for _, ln in kernels[share.kernel].lines}
                assert set(share.lines) <= kernel_lines


@pytest.fixture(scope="module")
def example_net(request):
    from fuselens.pipeline.analyze import AnalyzeOptions, analyze_file

    report = analyze_file(example("example_net.py"), AnalyzeOptions(input_shapes=["64,1024"]))
    net = _load(example("example_net.py")).ExampleNet()
    capture = capture_inductor(net, [torch.randn(64, 1024)])
    return only_model(report, "ExampleNet"), net, capture


@pytest.mark.slow
def test_example_net_kernels_group_exactly_our_three_clusters(example_net):
    model, _, capture = example_net
    result = compare_with_inductor(model, capture)
    statuses = [(c.cluster, c.status) for c in result.clusters]
    assert statuses == [("c0", "agree"), ("c1", "inductor-splits"), ("c2", "agree")]
    # c1 starts with proj1: Inductor (mode "default") runs it as the library's GEMM, then the ops after it
    # as one kernel, which reads the product back
    shares = [[(s.kind, s.lines) for s in c.instances[0].kernels] for c in result.clusters]
    assert shares[1] == [("extern", [22]), ("pointwise", [23, 24, 25])]
    assert [shares[0], shares[2]] == [[("pointwise", [18, 19, 20])], [("persistent-reduction", [28, 29, 30])]]
    assert len({c.instances[0].kernels[-1].kernel for c in result.clusters}) == 3
    assert not result.unmatched
    _assert_every_kernel_accounted_for(capture, result)


@pytest.mark.slow
def test_example_net_kernels_carry_kind_ops_lines_and_triton_source(example_net):
    _, _, capture = example_net
    kernels = list(capture.kernels())
    triton = [k for k in kernels if k.kind != "extern"]
    assert [k.kind for k in triton] == ["pointwise", "pointwise", "persistent-reduction"]
    assert [k.name for k in kernels if k.kind == "extern"] == ["extern_kernels.addmm"] * 2  # the two Linears
    ops = {o.name: o for g in capture.graphs for o in g.ops}
    first = triton[0]
    assert [(ops[u].op, ops[u].line) for u in first.user_ops] == [("mul", 18), ("relu", 19), ("add", 20)]
    assert {a.target for a in first.aten_ops} == {"aten.mul.Tensor", "aten.relu.default", "aten.add.Tensor"}
    assert all(a.file == example("example_net.py") for a in first.aten_ops)
    for k in triton:
        assert k.source.startswith("@triton.jit") and f"def {k.name}(" in k.source
    # `x * 3.0` before the softmax is rewritten by a pattern that drops its provenance; it is
    # placed back into the softmax kernel by adjacency, and says so.
    softmax = triton[2]
    assert [ops[u].line for u in softmax.inferred_ops] == [29]
    assert any("line 29" in note for note in capture.notes)


@pytest.mark.slow
def test_without_the_pattern_matcher_provenance_is_exact_and_the_kernels_are_the_same(example_net):
    _, net, capture = example_net
    exact = capture_inductor(net, [torch.randn(64, 1024)], pattern_matcher=False)
    assert not any(k.inferred_ops for k in exact.kernels())

    def grouping(c):
        return [k.lines for k in c.kernels()]

    assert grouping(exact) == grouping(capture)


@pytest.mark.slow
def test_a_second_capture_compiles_afresh_and_finds_the_same_kernels(example_net):
    _, net, capture = example_net
    again = capture_inductor(net, [torch.randn(64, 1024)])
    assert [(k.id, k.name, k.user_ops) for k in again.kernels()] == [
        (k.id, k.name, k.user_ops) for k in capture.kernels()
    ]
    assert all(k.aten_ops for k in again.kernels())  # provenance was emitted again, not skipped by a cache


ISOLATION_CHECK = """
import logging, os, sys
import torch, torch.utils._triton
from torch._inductor import config
from torch._inductor.runtime.triton_heuristics import CachingAutotuner
from fuselens.analysis.inductor import InductorCaptureError, capture_inductor

def state():
    env = {k: os.environ.get(k) for k in ("TRITON_INTERPRET", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    # torch's own LazyTraceHandler removes itself at the first compile of any process
    handlers = [h for h in logging.getLogger("torch.__trace").handlers if type(h).__name__ != "LazyTraceHandler"]
    return (config.get_config_copy(), handlers, torch.utils._triton.triton_hash_with_backend,
            CachingAutotuner.precompile, env, torch.is_grad_enabled())

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(torch.relu(self.proj(x * 2.0)) + 1.0)

class Broken(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) @ torch.ones(3, 3)  # shape mismatch

before = state()
net = Net().train()
capture_inductor(net, [torch.randn(4, 8)])
assert state() == before, "state changed by a capture"
assert all(m.training for m in net.modules()), "training flags not restored"
try:
    capture_inductor(Broken(), [torch.randn(4, 5)])
except InductorCaptureError:
    pass
else:
    raise AssertionError("no InductorCaptureError")
assert state() == before, "state changed by a failed capture"
# (importing torch._dynamo creates the cache folder itself; nothing may be written into it)
written = [f for _, _, files in os.walk(os.environ["TORCHINDUCTOR_CACHE_DIR"]) for f in files]
assert not written, f"wrote to the user's cache: {written}"
# Inductor's Triton helpers stay compilable: a later CUDA compile in this process still works
import triton
from torch._inductor.runtime import triton_helpers
assert isinstance(triton_helpers.promote_to_tensor, triton.runtime.jit.JITFunction), "helpers interpreted"
print("isolated")
"""


@pytest.mark.slow
def test_capture_leaves_no_global_state_changed_even_when_it_fails(tmp_path):
    # A fresh interpreter, so that a leak from an earlier capture in this process cannot hide one.
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "user-inductor-cache"))
    env.pop("TRITON_INTERPRET", None)
    run = subprocess.run([sys.executable, "-c", ISOLATION_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "isolated" in run.stdout, run.stderr[-3000:]


@pytest.mark.slow
def test_llama_block_every_inductor_kernel_is_accounted_for(analyze):
    model, capture, result = _analyze_and_capture(
        analyze,
        example("llama_block.py"),
        "LlamaBlock",
        {"dim": 64, "n_heads": 4, "hidden": 128, "max_len": 64},
        [2, 16, 64],
        "float32",
    )
    _assert_every_kernel_accounted_for(capture, result)
    assert {c.status for c in result.clusters} <= set(STATUSES) - {"not-found"}
    by_id = {c.id: c for c in model.clusters}
    norms = [c for c in result.clusters if by_id[c.cluster].op_chain == "pow → mean → add → rsqrt → mul → mul"]
    assert [c.status for c in norms] == ["agree"]  # RMSNorm: one kernel, as we propose


@pytest.mark.slow
def test_gpt_every_inductor_kernel_is_accounted_for_and_repeated_blocks_are_instances(analyze):
    init = {"vocab": 128, "max_len": 32, "d_model": 64, "n_heads": 4, "n_layers": 2, "dropout": 0.0}
    model, capture, result = _analyze_and_capture(analyze, example("gpt.py"), "GPT", init, [2, 16], "int64")
    _assert_every_kernel_accounted_for(capture, result)
    assert all(c.status != "not-found" for c in result.clusters)
    for cluster, comparison in zip(model.clusters, result.clusters, strict=True):
        assert len(comparison.instances) == cluster.multiplicity, cluster.op_chain
    extern = [k for k in capture.kernels() if k.kind == "extern"]
    assert len(extern) == 2 * 5 + 1  # per block: qkv, attention, proj, fc, out; then the head


@pytest.mark.slow
def test_meta_models_and_meta_inputs_are_materialised_small(analyze):
    init = {"vocab": 128, "max_len": 32, "d_model": 64, "n_heads": 4, "n_layers": 1, "dropout": 0.0}
    cls = _load(example("gpt.py")).GPT
    with torch.device("meta"):
        meta_model = cls(**init)
    meta_capture = capture_inductor(meta_model, [torch.empty(2, 16, dtype=torch.int64, device="meta")])
    real_capture = capture_inductor(cls(**init), [torch.zeros(2, 16, dtype=torch.int64)])
    assert [(k.name, k.lines) for k in meta_capture.kernels()] == [(k.name, k.lines) for k in real_capture.kernels()]
    assert all(p.is_meta for p in meta_model.parameters())  # the caller's model is untouched


COLUMN_SUM = """
    import torch
    import torch.nn as nn


    class ColumnSum(nn.Module):  # fuselens: input=(64, 256) float32
        def forward(self, x):
            h = x * 2.0
            h = torch.relu(h)
            return h.sum()  # to one value: no kernel of ours reduces a whole tensor


    class TwoReductions(nn.Module):  # fuselens: input=(64, 256) float32
        def forward(self, x):
            h = torch.tanh(x)
            a = h.sum(dim=-1, keepdim=True)
            b = h.amax(dim=0, keepdim=True)
            return h - a - b
"""


@pytest.mark.slow
def test_inductor_fusing_across_a_reduction_we_reject_is_wider_with_our_reason(write_model, analyze):
    path = write_model(COLUMN_SUM)
    model = only_model(analyze(path, model_class="ColumnSum"), "ColumnSum")
    assert model.clusters[0].op_chain == "mul → relu" and model.rejections[0].reason == "reduction"
    capture = capture_inductor(_load(path).ColumnSum(), [torch.randn(64, 256)])
    (c0,) = compare_with_inductor(model, capture).clusters
    assert c0.status == "inductor-wider"
    (absorbed,) = c0.instances[0].kernels[0].absorbed
    assert (absorbed.op, absorbed.line, absorbed.reason) == ("sum", 9, "reduction")
    assert "which we left out: reduction" in c0.summary


@pytest.mark.slow
def test_reductions_over_two_axes_make_inductor_split_our_cluster(write_model, analyze):
    path = write_model(COLUMN_SUM)
    model = only_model(analyze(path, model_class="TwoReductions"), "TwoReductions")
    assert model.clusters[0].op_chain == "tanh → sum → sub"
    capture = capture_inductor(_load(path).TwoReductions(), [torch.randn(64, 256)])
    result = compare_with_inductor(model, capture)
    c0 = result.clusters[0]  # (the amax over the other axis and the last sub are a cluster of their own)
    assert c0.status == "inductor-splits"
    shares = c0.instances[0].kernels
    assert len(shares) >= 2
    assert sorted({ln for s in shares for ln in s.lines}) == sorted({op.line for op in model.clusters[0].ops})
    _assert_every_kernel_accounted_for(capture, result)


@pytest.mark.slow
def test_a_graph_break_gives_two_graphs_and_the_branch_not_taken_is_not_found(analyze):
    path = example("branchy.py")
    model = only_model(analyze(path, model_class="GatedNet", input_shapes=["64,1024"]), "GatedNet")
    capture = capture_inductor(_load(path).GatedNet(), [torch.randn(64, 1024)])
    assert len(capture.graphs) == 2 and any("graph break" in note for note in capture.notes)
    result = compare_with_inductor(model, capture)
    status = {c.op_chain: s.status for c, s in zip(model.clusters, result.clusters, strict=True)}
    branches = [status["sigmoid → mul"], status["tanh → mul"]]  # which one runs depends on the weights
    assert sorted(branches) == ["agree", "not-found"]
    # after the break, in the second graph: the projection a library GEMM, the clamp and mul one kernel
    assert status["linear → clamp → mul"] == "inductor-splits"
    _assert_every_kernel_accounted_for(capture, result)


LIBRARY_LLAMA = """
from transformers import LlamaConfig, LlamaModel

config = LlamaConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128)
model = LlamaModel(config)
"""


@pytest.mark.slow
def test_clusters_on_a_librarys_lines_meet_the_kernels_inductor_made_of_them(tmp_path):
    """A transformers model built in the user's file: every op runs on the library's lines, where the
    clusters sit.  Inductor's ops are placed on the same lines, so each cluster is compared (none
    "not found"), and what only Inductor fuses is said once."""
    from fuselens.contracts.options import AnalyzeOptions
    from fuselens.pipeline.compare import compare_file

    path = tmp_path / "library_llama.py"
    path.write_text(LIBRARY_LLAMA)
    (tmp_path / "pyproject.toml").write_text('[tool.fuselens.models.model]\ninputs = [[2, 32]]\ndtype = "int64"\n')
    result = compare_file(str(path), AnalyzeOptions())
    assert not result.errors
    (comparison,) = result.models.values()
    statuses = [c.status for c in comparison.clusters]
    assert statuses and "not-found" not in statuses, statuses
    # The MLP's gate projection starts a cluster of ours; Inductor leaves it a library GEMM (an extern kernel).
    gemm = next(
        c for c in comparison.clusters if c.summary.startswith("Inductor splits") and "extern_kernels.mm" in c.summary
    )
    assert any(s.kind == "extern" for i in gemm.instances for s in i.kernels)
    for fusion in comparison.unmatched:
        assert "fuses" not in fusion.summary and all(o.line for o in fusion.ops), fusion.summary
