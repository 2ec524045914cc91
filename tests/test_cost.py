"""The cost model: bytes with and without fusion, and the regime on each device."""

from __future__ import annotations

from fuselens.analysis.cost import cluster_bytes, device_profile, op_bytes, regime
from fuselens.contracts.units import bytes_label

from graphs import Builder


def test_unfused_counts_reads_and_writes_fused_counts_inputs_and_outputs_once():
    b = Builder()
    x = b.input([1024, 1024])  # 4 MiB
    y = b.op("mul", x, 2.0)
    z = b.op("relu", y)
    w = b.op("add", z, 1.0)
    b.output(w)
    g = b.graph
    assert op_bytes(g, g[y]) == 8 * 2**20
    unfused, fused = cluster_bytes(g, [y, z, w], [x], [w])
    assert (unfused, fused) == (24 * 2**20, 8 * 2**20)


def test_dtype_sizes_and_broadcast_operands_count_their_own_size():
    b = Builder()
    x = b.input([1024, 1024], dtype="bfloat16")  # 2 MiB
    bias = b.param([1024], dtype="bfloat16")
    y = b.op("add", x, bias, dtype="bfloat16")
    g = b.graph
    assert op_bytes(g, g[y]) == 2 * 2**20 + 2048 + 2 * 2**20


def test_views_of_one_tensor_are_read_once():
    b = Builder()
    x = b.input([64, 128])
    lo = b.op("getitem", x, shape=[64, 64], params={"steps": [("slice", 1, 0, 1)]})
    hi = b.op("getitem", x, shape=[64, 64], params={"steps": [("slice", 1, 64, 1)]})
    y = b.op("add", lo, hi, shape=[64, 64])
    g = b.graph
    assert op_bytes(g, g[lo]) == 0
    _, fused = cluster_bytes(g, [y], [lo, hi], [y])
    assert fused == 64 * 128 * 4 + 64 * 64 * 4


def test_regime_depends_on_the_device():
    b = Builder()
    x = b.input([8192, 1024])  # 32 MiB: exp moves 64 MiB, more than an H200's L2, less than a 4090's
    y = b.op("exp", x)
    small = b.input([256, 256])
    z = b.op("exp", small)
    g = b.graph
    h200 = device_profile("h200")
    assert regime(g, [y], 64 * 2**20, h200) == "dram-bound"
    assert regime(g, [z], 512 * 1024, h200) == "launch-bound"
    assert regime(g, [y], 64 * 2**20, device_profile("rtx4090")) == "l2-resident"  # 72 MB of L2
    assert device_profile("h100", peak_gbps=2000).peak_gbps == 2000


def test_a_gemm_cluster_saves_its_products_round_trip_and_is_bound_by_its_multiply_adds():
    """`gelu(linear(x, w, b))` over 16k rows of 4096 into 11008, bf16: both sides read x, w and b and
    write one [16384, 11008] result; unfused, the GEMM writes it and the GELU reads it back and writes
    its own.  The 1.5 TFLOP of multiply-adds take longer than that traffic on an H200: compute-bound,
    and launch-bound only for a product too small for either to matter."""
    b = Builder()
    x = b.input([16384, 4096], dtype="bfloat16")
    w = b.param([11008, 4096], dtype="bfloat16")
    bias = b.param([11008], dtype="bfloat16", name="b")
    gemm = b.op("linear", x, w, bias, shape=[16384, 11008], dtype="bfloat16")
    gelu = b.op("gelu", gemm, dtype="bfloat16")
    b.output(gelu)
    g = b.graph
    reads = (16384 * 4096 + 11008 * 4096 + 11008) * 2
    out = 16384 * 11008 * 2
    unfused, fused = cluster_bytes(g, [gemm, gelu], [x, w, bias], [gelu])
    assert (unfused, fused) == (reads + out + 2 * out, reads + out)
    h200 = device_profile("h200")
    assert regime(g, [gemm, gelu], fused, h200) == "compute-bound"
    assert regime(g, [gelu], fused, h200) == "dram-bound"  # the same bytes with no GEMM
    tiny = Builder()
    xs = tiny.input([4, 64], dtype="bfloat16")
    ws = tiny.param([64, 64], dtype="bfloat16")
    small = tiny.op("linear", xs, ws, shape=[4, 64], dtype="bfloat16")
    relu = tiny.op("relu", small, dtype="bfloat16")
    assert regime(tiny.graph, [small, relu], 1024, h200) == "launch-bound"


def test_labels():
    assert bytes_label(384 * 2**20) == "384 MB"
    assert bytes_label(None) == "unknown"
    assert bytes_label(1536) == "1.5 KB"


def test_a_loss_reads_each_row_of_logits_once_and_writes_one_value_per_row():
    """log_softmax then the target's pick: unfused, the log-probabilities are written and read back
    (the gather itself reads only what it picks); fused, the logits are read once."""
    b = Builder()
    logits = b.input([4096, 32000], dtype="bfloat16")
    target = b.input([4096, 1], dtype="int64")
    logp = b.op("log_softmax", logits, dtype="float32", params={"dims": [1], "keepdim": True})
    picked = b.op("gather", logp, target, shape=[4096, 1], params={"dims": [1], "keepdim": True})
    loss = b.op("neg", picked, shape=[4096, 1])
    g = b.graph
    rows, vocab = 4096, 32000
    assert op_bytes(g, g[picked]) == rows * 8 + 2 * rows * 4  # its indices, and the element each picks
    unfused, fused = cluster_bytes(g, [logp, picked, loss], [logits, target], [loss])
    assert fused == rows * vocab * 2 + rows * 8 + rows * 4
    assert unfused == (rows * vocab * 2 + rows * vocab * 4) + (rows * 8 + rows * 8) + rows * 8
