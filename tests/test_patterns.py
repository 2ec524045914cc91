"""The pattern library on hand-built graphs: what is recognised, and the dims it reports."""

from __future__ import annotations

from fuselens.analysis.patterns import find_patterns

from graphs import Builder


def names(graph) -> list[str]:
    return [m.name for m in find_patterns(graph)]


def rmsnorm(b: Builder, x: int, weight: bool = True) -> int:
    sq = b.op("pow", x, 2.0)
    mean = b.op(
        "mean",
        sq,
        shape=(*b.graph[x].meta.shape[:-1], 1),
        params={"dims": [len(b.graph[x].meta.shape) - 1], "keepdim": True},
    )
    eps = b.op("add", mean, 1e-6)
    inv = b.op("rsqrt", eps)
    y = b.op("mul", x, inv)
    if weight:
        w = b.param([b.graph[x].meta.shape[-1]], name="weight")
        y = b.op("mul", y, w)
    return y


def test_rmsnorm_spelled_out_is_recognised_with_its_bytes():
    b = Builder()
    x = b.input([4096, 1024])
    b.output(rmsnorm(b, x))
    (m,) = find_patterns(b.graph)
    assert m.name == "rmsnorm" and len(m.nodes) == 6
    assert m.bytes_after == 2 * 4096 * 1024 * 4 + 1024 * 4  # read x, the weight; write y
    assert m.bytes_before > 3 * m.bytes_after and m.speedup > 3  # six passes over x become one


def test_an_rsqrt_that_is_not_a_norm_is_not_one():
    b = Builder()
    x = b.input([64, 64])
    b.output(b.op("mul", b.op("rsqrt", b.op("add", x, 1.0)), x))
    assert "rmsnorm" not in names(b.graph)


def test_swiglu_needs_gemm_operands():
    b = Builder()
    h = b.input([8, 512])
    wg, wu = b.param([1024, 512], name="wg"), b.param([1024, 512], name="wu")
    gate = b.op("linear", h, wg, shape=[8, 1024])
    up = b.op("linear", h, wu, shape=[8, 1024])
    out = b.op("mul", b.op("silu", gate), up)
    b.output(out)
    (m,) = [p for p in find_patterns(b.graph) if p.name == "swiglu"]
    assert m.dims == {"tokens": 8, "hidden": 1024, "dtype": "float32"}
    b2 = Builder()
    a, c = b2.input([8, 1024]), b2.input([8, 1024], name="y")
    b2.output(b2.op("mul", b2.op("silu", a), c))
    assert "swiglu" not in names(b2.graph)


def test_gemm_residual_rmsnorm_gemm_derives_m_n_k():
    b = Builder()
    x = b.input([2, 128, 512])  # M = 256 tokens, K0 = 512
    residual = b.input([2, 128, 1024], name="residual")
    w1, w2 = b.param([1024, 512], name="w1"), b.param([3072, 1024], name="w2")
    g1 = b.op("linear", x, w1, shape=[2, 128, 1024])
    s = b.op("add", residual, g1)
    y = rmsnorm(b, s)
    b.output(b.op("linear", y, w2, shape=[2, 128, 3072]), s)
    found = {m.name: m for m in find_patterns(b.graph)}
    block = found["gemm-residual-rmsnorm-gemm"]
    assert block.dims["M"] == 256 and block.dims["N"] == 1024 and block.dims["K0"] == 512 and block.dims["K1"] == 3072
    assert "residual-rmsnorm" in found
    assert block.bytes_before > block.bytes_after


def test_scaled_and_masked_softmax():
    b = Builder()
    s = b.input([8, 64, 64])
    mask = b.input([64, 64], name="mask")
    scaled = b.op("mul", s, 0.125)
    masked = b.op("add", scaled, mask)
    p = b.op("softmax", masked, params={"dims": [2], "keepdim": True, "dtype": "float32"})
    b.output(p)
    (m,) = find_patterns(b.graph)
    assert m.name == "softmax" and m.dims["variant"] == "masked and scaled"
    assert len(m.nodes) == 3
