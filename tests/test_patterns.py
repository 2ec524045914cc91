"""The pattern library on hand-built graphs and on models (hand-written ones, and transformers
models at tiny random-init configs): what is recognised, and the dims it reports."""

from __future__ import annotations

import pytest

from fuselens.analysis.patterns import find_patterns

from conftest import only_model
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


def test_gemm_block_k0_is_what_the_first_gemm_contracts_over_behind_a_reshape():
    """Attention's output projection reads the heads' output reshaped to [.., heads * head_dim]:
    K0 is that width (what the GEMM contracts over), not the head_dim before the reshape."""
    b = Builder()
    heads = b.input([2, 128, 8, 64], name="attn")  # [batch, tokens, heads, head_dim]
    merged = b.op("reshape", heads, shape=[2, 128, 512], params={"steps": [("reshape", [2, 128, 512])]})
    residual = b.input([2, 128, 1024], name="residual")
    w1, w2 = b.param([1024, 512], name="o_proj"), b.param([3072, 1024], name="up")
    s = b.op("add", residual, b.op("linear", merged, w1, shape=[2, 128, 1024]))
    b.output(b.op("linear", rmsnorm(b, s), w2, shape=[2, 128, 3072]), s)
    (block,) = [m for m in find_patterns(b.graph) if m.name == "gemm-residual-rmsnorm-gemm"]
    assert (block.dims["M"], block.dims["K0"], block.dims["N"], block.dims["K1"]) == (256, 512, 1024, 3072)
    assert block.summary.startswith("GEMM [256×512]·[512×1024] → + residual → RMSNorm → GEMM [1024×3072]")


LLAMA = """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         vocab_size=1000)
    model = LlamaForCausalLM(config)  # fuselens: input=(2, 64)
    """


def test_gemm_block_dims_on_a_transformers_llama(write_model, analyze):
    """In a real Llama the attention output projection (o_proj) is fed by the attention output
    reshaped from [2, 64, 4, 64] to [2, 64, 256]: its K0 is the hidden size, 256; the MLP's down
    projection contracts over the intermediate size, 512."""
    pytest.importorskip("transformers")
    model = only_model(analyze(write_model(LLAMA)))
    blocks = [p for p in model.patterns if p.name == "gemm-residual-rmsnorm-gemm"]
    by_gemm = {p.ops[0].module: p for p in blocks}  # the module of the first GEMM
    assert sorted(by_gemm) == ["model.layers.0.mlp", "model.layers.0.self_attn", "model.layers.1.mlp"]
    attn = by_gemm["model.layers.0.self_attn"]  # o_proj -> + residual -> post-attention norm -> MLP
    assert attn.multiplicity == 2  # both layers
    assert [op.target for op in attn.ops][::8] == ["linear", "linear"]
    assert (attn.dims["M"], attn.dims["K0"], attn.dims["N"], attn.dims["K1"]) == (128, 256, 256, 512)
    assert attn.summary.startswith("GEMM [128×256]·[256×256] → + residual → RMSNorm → GEMM [256×512]")
    for module in ("model.layers.0.mlp", "model.layers.1.mlp"):  # down_proj contracts over the MLP's width
        assert by_gemm[module].dims["K0"] == 512, by_gemm[module].dims


# ---- activations: tanh-approximate GELU, quick GELU, GeGLU ------------------------------------

ACTIVATIONS = """
    import math

    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class M(nn.Module):  # fuselens: input=(4, 32, 64)
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 128)
            self.out = nn.Linear(128, 64)

        def forward(self, x):
            h = self.fc(x)
            new = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
            fast = 0.5 * h * (1.0 + torch.tanh(h * 0.7978845608 * (1.0 + 0.044715 * h * h)))
            one_op = F.gelu(h, approximate="tanh")
            quick = h * torch.sigmoid(1.702 * h)
            return self.out(new) + self.out(fast) + self.out(one_op) + self.out(quick)
    """


def test_tanh_gelu_and_quick_gelu_are_named_however_they_are_spelled(write_model, analyze):
    model = only_model(analyze(write_model(ACTIVATIONS)))
    found = {(p.name, p.lines[0]): p for p in model.patterns}
    new, fast = found[("gelu-tanh", 16)], found[("gelu-tanh", 17)]
    assert [op.target for op in new.ops] == ["mul", "pow", "mul", "add", "mul", "tanh", "add", "mul"]
    assert [op.target for op in fast.ops] == ["mul", "mul", "mul", "mul", "add", "mul", "tanh", "add", "mul"]
    assert new.summary == (
        "tanh-approximate GELU (gelu_new) spelled out as 8 ops (mul → pow → mul → add → mul → tanh → add → mul)"
    )
    h = 4 * 32 * 128 * 4  # bytes of one [4, 32, 128] float32 value
    for p in (new, fast):
        assert (p.estimate.bytes_after, p.dims) == (2 * h, {"shape": [4, 32, 128], "dtype": "float32"})
        assert p.estimate.bytes_before > 3 * p.estimate.bytes_after  # 8 or 9 passes become one
        (cluster_id,) = p.clusters  # the whole spelled-out GELU is one fused cluster
        (cluster,) = [c for c in model.clusters if c.id == cluster_id]
        assert sorted(op.target for op in cluster.ops) == sorted(op.target for op in p.ops)
    one = found[("gelu-tanh", 18)]
    assert [op.target for op in one.ops] == ["gelu"] and one.estimate.speedup_bound == 1.0
    assert one.summary == "tanh-approximate GELU as one op (already one kernel in eager)"
    quick = found[("quick-gelu", 19)]
    assert [op.target for op in quick.ops] == ["mul", "sigmoid", "mul"]
    assert quick.summary == "quick GELU (x * sigmoid(1.702 * x)) spelled out as 3 ops (mul → sigmoid → mul)"
    assert (quick.estimate.bytes_before, quick.estimate.bytes_after) == (7 * h, 2 * h)
    assert sorted(found) == [("gelu-tanh", 16), ("gelu-tanh", 17), ("gelu-tanh", 18), ("quick-gelu", 19)]


def test_look_alike_activations_are_not_named_gelu(write_model, analyze):
    """Exact (erf) GELU, SiLU, Mish and a tanh-GELU with a wrong constant compute something else."""
    source = """
        import math

        import torch
        import torch.nn as nn
        import torch.nn.functional as F


        class M(nn.Module):  # fuselens: input=(4, 64)
            def forward(self, x):
                h = x * 2
                erf = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))
                silu = h * torch.sigmoid(h)
                mish = h * torch.tanh(F.softplus(h))
                wrong = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.05 * torch.pow(h, 3.0))))
                return erf, silu, mish, wrong, F.gelu(h)
        """
    model = only_model(analyze(write_model(source)))
    assert model.clusters  # they fuse ...
    assert [p.name for p in model.patterns] == []  # ... but none of them is a tanh or quick GELU


GEGLU = """
    import math

    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class M(nn.Module):  # fuselens: input=(4, 32, 64)
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(64, 256)
            self.up = nn.Linear(64, 256)
            self.proj = nn.Linear(64, 512)
            self.down = nn.Linear(256, 64)

        def forward(self, x, y):
            g = self.gate(x)
            t5 = 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * torch.pow(g, 3.0))))
            a = self.down(t5 * self.up(x))
            hidden, gate = self.proj(x).chunk(2, dim=-1)
            b = self.down(hidden * F.gelu(gate))
            c = F.gelu(y) * y  # not a GLU: neither operand comes from a GEMM
            return a + b, c
    """


def test_geglu_with_two_projections_or_one_split_in_halves(write_model, analyze):
    model = only_model(analyze(write_model(GEGLU), input_shapes=["4,32,64", "4,32,256"]))
    found = {(p.name, p.lines[0]): p for p in model.patterns}
    t5 = found[("geglu", 18)]  # T5 v1.1's gated-gelu: gelu_new(wi_0(x)) * wi_1(x)
    assert [op.target for op in t5.ops] == ["mul", "pow", "mul", "add", "mul", "tanh", "add", "mul", "mul"]
    assert t5.dims == {"tokens": 128, "hidden": 256, "activation": "gelu-tanh", "dtype": "float32"}
    assert t5.summary == "GeGLU: gelu_tanh(gate) * up; a GEMM epilogue could also skip writing gate/up"
    value = 128 * 256 * 4
    assert t5.estimate.bytes_after == 3 * value  # read gate and up, write the product
    halves = found[("geglu", 21)]  # diffusers' GEGLU: proj(x).chunk(2) -> hidden * gelu(gate)
    assert [op.target for op in halves.ops] == ["gelu", "mul"]
    assert halves.dims == {"tokens": 128, "hidden": 256, "activation": "gelu", "dtype": "float32"}
    assert halves.estimate.bytes_after == 3 * value  # the projection's [.., 512] once, the product
    assert "gelu-tanh" in {p.name for p in model.patterns}
    assert [p.lines[0] for p in model.patterns if p.name == "geglu"] == [18, 21]  # not line 22


GPT2 = """
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=128, vocab_size=1000)
    model = GPT2LMHeadModel(config)  # fuselens: input=(2, 32)
    """


def test_gpt2_mlp_activation_is_named_gelu_tanh(write_model, analyze):
    """GPT-2's MLP activation is `gelu_new`, spelled out in transformers (NewGELUActivation)."""
    pytest.importorskip("transformers")
    model = only_model(analyze(write_model(GPT2)))
    (act,) = [p for p in model.patterns if p.name == "gelu-tanh"]
    assert act.multiplicity == 2  # one per layer
    assert {op.module for op in act.ops} == {"transformer.h.0.mlp.act"}
    assert [op.target for op in act.ops] == ["mul", "pow", "mul", "add", "mul", "tanh", "add", "mul"]
    assert act.dims == {"shape": [2, 32, 256], "dtype": "float32"}
    (cluster_id,) = act.clusters
    (cluster,) = [c for c in model.clusters if c.id == cluster_id]
    assert [op.target for op in cluster.ops] == [op.target for op in act.ops]
