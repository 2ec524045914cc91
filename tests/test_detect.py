"""Detection on hand-built graphs: legality, named rejections, and no silent drops."""

from __future__ import annotations

from fuselens.analysis.detect import detect
from fuselens.analysis.ops import OpClass
from fuselens.analysis.unlowered import reductive
from fuselens.codegen.plan import check

from graphs import Builder


def ops_of(graph, group) -> list[str]:
    return [graph[i].op for i in sorted(group.members) if graph[i].cls.absorbable]


def run(b: Builder):
    return detect(b.graph, check)


def assert_no_silent_drops(graph, det) -> None:
    seen: dict[int, str] = {}
    for i, group in enumerate(det.clusters):
        for m in group.members:
            if graph[m].cls.absorbable:
                assert m not in seen, f"{graph[m].op} in two places"
                seen[m] = f"cluster {i}"
    for r in det.rejected:
        assert r.node not in seen, f"{graph[r.node].op} both clustered and rejected"
        assert r.reason and r.detail
        seen[r.node] = r.reason
    # Ops that reduce, select or order along dims that no kernel computes are named too (`torch.max(x, dim)`).
    accounted = {n.id for n in graph if n.cls.absorbable or reductive(n)}
    assert accounted == set(seen), f"dropped: {[graph[i].op for i in accounted - set(seen)]}"


def test_a_chain_is_one_cluster():
    b = Builder()
    x = b.input([64, 32])
    y = b.op("relu", b.op("mul", x, 2.0))
    b.output(b.op("add", y, 1.0))
    det = run(b)
    assert [ops_of(b.graph, g) for g in det.clusters] == [["mul", "relu", "add"]]
    assert_no_silent_drops(b.graph, det)


def test_a_diamond_inside_the_group_is_fine():
    b = Builder()
    x = b.input([64, 32])
    t = b.op("sigmoid", x)
    b.output(b.op("add", b.op("mul", t, 2.0), t))  # t is read twice, both inside
    det = run(b)
    assert [ops_of(b.graph, g) for g in det.clusters] == [["sigmoid", "mul", "add"]]


def test_an_escaping_value_becomes_a_second_output():
    b = Builder()
    x = b.input([64, 32])
    s = b.op("add", x, b.input([64, 32], name="r"))
    y = b.op("relu", s)
    b.output(y, s)  # s is also returned
    det = run(b)
    assert [ops_of(b.graph, g) for g in det.clusters] == [["add", "relu"]]


def test_fan_out_of_a_smaller_value_is_split_and_named():
    b = Builder()
    x = b.input([64, 32])
    bias = b.param([32], name="bias")
    b2 = b.op("mul", bias, 2.0)  # [32]
    y = b.op("add", x, b2)  # [64, 32]
    z = b.op("relu", y)
    b.output(z, b2)  # the [32] value escapes too: a [64, 32] kernel cannot write it once
    det = run(b)
    assert [ops_of(b.graph, g) for g in det.clusters] == [["add", "relu"]]
    rejected = {b.graph[r.node].op: r for r in det.rejected}
    assert rejected["mul"].reason == "fan-out"
    assert "[32]" in rejected["mul"].detail
    assert_no_silent_drops(b.graph, det)


def test_a_path_through_an_opaque_op_breaks_convexity():
    b = Builder()
    x = b.input([64, 32])
    w = b.param([32, 32])
    a = b.op("relu", x)
    mm = b.op("linear", a, w)  # opaque
    c = b.op("add", a, mm)  # joining a and c would put `linear` inside a cycle
    d = b.op("mul", c, 3.0)
    b.output(d)
    det = run(b)
    chains = [ops_of(b.graph, g) for g in det.clusters]
    assert chains == [["add", "mul"]]
    rejected = {b.graph[r.node].op: r for r in det.rejected}
    assert rejected["relu"].reason == "convexity" and "`linear`" in rejected["relu"].detail
    assert_no_silent_drops(b.graph, det)


def test_all_legal_sub_clusters_survive_a_failing_component():
    b = Builder()
    x = b.input([64, 32])
    a = b.op("mul", b.op("exp", x), 2.0)  # left part
    r = b.op("cumsum", a, params={"dims": [1], "keepdim": True, "scan": True})  # no lowering in the middle
    c = b.op("add", b.op("sigmoid", r), 1.0)  # right part
    b.output(c)
    det = run(b)
    assert [ops_of(b.graph, g) for g in det.clusters] == [["exp", "mul"], ["sigmoid", "add"]]
    assert {b.graph[r.node].op: r.reason for r in det.rejected} == {"cumsum": "no-lowering"}
    assert_no_silent_drops(b.graph, det)


def test_a_reduction_over_a_leading_dim_joins_its_producer():
    b = Builder()
    x = b.input([64, 32])
    y = b.op("exp", x)
    s = b.op("sum", y, shape=[32], params={"dims": [0], "keepdim": False})
    b.output(b.op("mul", s, 2.0))
    det = run(b)
    assert [ops_of(b.graph, g) for g in det.clusters] == [["exp", "sum", "mul"]]
    assert_no_silent_drops(b.graph, det)


def test_a_reduction_of_a_whole_tensor_is_rejected():
    b = Builder()
    x = b.input([64, 32])
    y = b.op("exp", x)
    s = b.op("sum", y, shape=[], params={"dims": [0, 1], "keepdim": False})
    b.output(s)
    det = run(b)
    assert {b.graph[r.node].op: r.reason for r in det.rejected} == {"sum": "reduction", "exp": "no-neighbour"}
    assert "to one value" in next(r for r in det.rejected if b.graph[r.node].op == "sum").detail


def test_two_reductions_over_different_dims_of_one_tensor_do_not_share_a_kernel():
    b = Builder()
    x = b.input([8, 16, 32])
    y = b.op("exp", x)
    over_channels = b.op("sum", y, shape=[8, 32], params={"dims": [1], "keepdim": False})
    over_rows = b.op("sum", y, shape=[8, 16], params={"dims": [2], "keepdim": False})
    b.output(over_channels, over_rows)
    det = run(b)
    assert [ops_of(b.graph, g) for g in det.clusters] == [["exp", "sum"]]
    (refused,) = det.rejected
    assert refused.reason == "reduction" and "different rows" in refused.detail
    assert_no_silent_drops(b.graph, det)


def test_a_norm_that_updates_running_statistics_is_refused_as_aliasing():
    b = Builder()
    x = b.input([4, 8, 5, 7])
    mean, var = b.param([8], name="running_mean"), b.param([8], name="running_var")
    h = b.op("mul", x, 2.0)
    params = {"dims": [0, 2, 3], "keepdim": True, "eps": 1e-5, "training": True, "updates": True}
    bn = b.op("batch_norm", h, mean, var, None, None, params=params)
    b.graph[bn].cls = OpClass.REDUCTION  # with batch statistics (capture records it so)
    b.output(b.op("relu", bn))
    det = run(b)
    refused = {b.graph[r.node].op: r for r in det.rejected}
    assert refused["batch_norm"].reason == "aliasing"
    assert "running mean and variance" in refused["batch_norm"].detail
    assert_no_silent_drops(b.graph, det)


def test_two_row_spaces_do_not_share_a_kernel():
    b = Builder()
    x = b.input([64, 32])
    m = b.op("mean", x, shape=[64, 1], params={"dims": [1], "keepdim": True})
    t = b.op("transpose", x, shape=[32, 64], params={"steps": [("permute", [1, 0])]})
    m2 = b.op("mean", t, shape=[32, 1], params={"dims": [1], "keepdim": True})
    s = b.op("add", m2, 1.0)
    b.output(m, s)
    det = run(b)
    assert [ops_of(b.graph, g) for g in det.clusters] == [["mean", "add"]]
    assert_no_silent_drops(b.graph, det)


def test_inplace_on_a_private_intermediate_is_fused_but_on_an_input_it_is_aliasing():
    b = Builder()
    x = b.input([64, 32])
    y = b.op("mul", x, 2.0)
    z = b.op("add", y, 1.0, params={"mutates": y})
    b.graph[z].inplace = True
    w = b.op("relu", x, params={"mutates": x})  # writes into the caller's tensor
    b.graph[w].inplace = True
    b.output(z, w)
    det = run(b)
    assert [ops_of(b.graph, g) for g in det.clusters] == [["mul", "add"]]
    assert {b.graph[r.node].op: r.reason for r in det.rejected} == {"relu": "aliasing"}


def test_no_fusion_across_a_graph_break():
    b = Builder()
    x = b.input([64, 32])
    y = b.op("relu", x)
    z = b.op("mul", y, 2.0)
    b.graph[z].piece = 1
    w = b.op("add", z, 1.0)
    b.graph[w].piece = 1
    b.output(w)
    det = run(b)
    assert [ops_of(b.graph, g) for g in det.clusters] == [["mul", "add"]]
    assert {b.graph[r.node].op: r.reason for r in det.rejected} == {"relu": "graph-break"}


def test_views_between_ops_are_glue_and_never_ops():
    b = Builder()
    x = b.input([64, 32])
    y = b.op("exp", x)
    t = b.op("transpose", y, shape=[32, 64], params={"steps": [("permute", [1, 0])]})
    z = b.op("mul", t, 2.0)
    b.output(z)
    det = run(b)
    (group,) = det.clusters
    assert ops_of(b.graph, group) == ["exp", "mul"]
    assert t in group.members and b.graph[t].cls is OpClass.VIEW
