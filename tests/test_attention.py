"""Hand-written attention: one pattern whose bytes count the score matrix's traffic, rewritten by
`fuselens apply` into `F.scaled_dot_product_attention` (or FlexAttention), and the rewritten model
computing what the model as written computes: in eval mode and in training mode, forward and
gradients, with its dropout still dropping in training.  Where no fused call can compute it as
written, the report says why and nothing is rewritten."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import EXAMPLES, only_model

# example -> (model, the attention's lines, the rewrite's lines as `fuselens apply` writes them)
REWRITTEN = {
    "llama_block.py": (
        "LlamaBlock",
        [62, 64],
        """\
        attn = F.scaled_dot_product_attention(
            q, k, v, scale=1 / math.sqrt(self.head_dim)
        ).transpose(1, 2).reshape(b, s, d)
""",
    ),
    "nanogpt_attention.py": (
        "Block",
        [65, 69],
        """\
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            dropout_p=self.attn_dropout.p if self.attn_dropout.training else 0.0,
            is_causal=True,
            scale=1.0 / math.sqrt(k.size(-1)),
        ) # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
""",
    ),
    "encoder_attention.py": (
        "EncoderLayer",
        [36, 40],
        """\
        context = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=bias,
            dropout_p=self.dropout.p if self.dropout.training else 0.0,
            scale=1 / math.sqrt(self.head_dim),
        ).permute(0, 2, 1, 3).contiguous()
""",
    ),
}


def copied(tmp_path, name: str) -> str:
    shutil.copy(os.path.join(EXAMPLES, name), tmp_path / name)
    shutil.copy(os.path.join(EXAMPLES, "pyproject.toml"), tmp_path / "pyproject.toml")
    return str(tmp_path / name)


def attention_of(report, model: str | None = None):
    (pattern,) = [p for p in only_model(report, model).patterns if p.name == "attention"]
    return pattern


# ---- the pattern ----------------------------------------------------------------------------------


def _scores(b: int, h: int, s: int) -> int:
    return b * h * s * s


@pytest.mark.parametrize(
    "name, before, after",
    [
        # bf16 q, k, v, out of 4×8×2048×128; the scores 4×8×2048×2048: written by q @ kᵀ (bf16), read and
        # written by the divide (bf16), read (bf16) and written (fp32) by `.float()`, read and written by
        # the softmax (fp32), read (fp32) and written (bf16) by `.type_as(q)`, read by the product with v.
        (
            "llama_block.py",
            _scores(4, 8, 2048) * (2 + 2 * 2 + (2 + 4) + 2 * 4 + (4 + 2) + 2) + 4 * (4 * 8 * 2048 * 128 * 2),
            4 * (4 * 8 * 2048 * 128 * 2),
        ),
        # fp32 8×12×1024×64; the scores written, scaled, filled (reading the 1024×1024 boolean mask),
        # normalised, read by the product; in eval mode the dropout is no op.
        (
            "nanogpt_attention.py",
            _scores(8, 12, 1024) * 4 * (1 + 2 + 2 + 2 + 1) + 1024 * 1024 + 4 * (8 * 12 * 1024 * 64 * 4),
            4 * (8 * 12 * 1024 * 64 * 4) + 1024 * 1024,
        ),
        # fp32 8×12×512×64 and an additive 8×1×1×512 mask: written, divided, added, normalised (`.float()`
        # and `.type_as` move nothing in float32), read by the product.
        (
            "encoder_attention.py",
            _scores(8, 12, 512) * 4 * (1 + 2 + 2 + 2 + 1) + 8 * 512 * 4 + 4 * (8 * 12 * 512 * 64 * 4),
            4 * (8 * 12 * 512 * 64 * 4) + 8 * 512 * 4,
        ),
    ],
)
def test_each_examples_attention_is_one_pattern_counting_the_score_matrix(tmp_path, analyze, name, before, after):
    model, lines, _ = REWRITTEN[name]
    report = analyze(copied(tmp_path, name))
    pattern = attention_of(report, model)
    assert pattern.lines == lines
    assert (pattern.estimate.bytes_before, pattern.estimate.bytes_after) == (before, after)
    assert pattern.rewrite is not None and not pattern.refusal
    # The softmax's cluster is the attention's: the rewrite replaces it, and no softmax pattern is named.
    assert pattern.rewrite.replaces == pattern.clusters and pattern.clusters
    assert "softmax" not in {p.name for p in only_model(report, model).patterns}
    assert pattern.dims["regime"] == "dram-bound"


def test_the_llama_blocks_attention_says_which_kernel_runs_it(tmp_path, analyze):
    """bf16, head dim 128, no mask: FlashAttention on the profiled H200; the encoder's fp32 scores with
    an additive mask: the memory-efficient kernel."""
    llama = attention_of(analyze(copied(tmp_path, "llama_block.py")))
    assert llama.dims["backend"] == "flash"
    assert llama.dims["backend_detail"] == "FlashAttention: bfloat16, head dim 128, no mask"
    encoder = attention_of(analyze(copied(tmp_path, "encoder_attention.py")), "EncoderLayer")
    assert encoder.dims["backend"] == "efficient"
    assert "an additive mask (FlashAttention takes none but a causal one)" in encoder.dims["backend_detail"]


# ---- `fuselens apply`, and the rewritten model against the original --------------------------------


def fuselens(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fuselens.cli.main", *args], capture_output=True, text=True, cwd=cwd)


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def built(module, name: str, dropout: float):
    """The example's model at small sizes, with its attention's dropout at `dropout` (its other dropouts
    drop nothing: what differs between runs is the attention's)."""
    torch.manual_seed(0)
    if name == "nanogpt_attention.py":
        model = module.Block(module.GPTConfig(block_size=64, n_embd=64, n_head=4, dropout=0.0))
        model.attn.attn_dropout.p = dropout
        return model, [torch.randn(3, 48, 64)]
    if name == "encoder_attention.py":
        model = module.EncoderLayer(hidden=64, heads=4, intermediate=128, dropout=0.0)
        model.attention.dropout.p = dropout
        lengths = torch.tensor([40, 17, 33])
        return model, [torch.randn(3, 40, 64), (torch.arange(40)[None, :] < lengths[:, None]).long()]
    return module.LlamaBlock(dim=64, n_heads=4, hidden=96, max_len=64), [torch.randn(3, 40, 64)]


def run(model, inputs: list[torch.Tensor], seed: int = 0):
    """The output, and the gradients of a loss of it: the parameters' and the float inputs'."""
    model.zero_grad(set_to_none=True)
    inputs = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    torch.manual_seed(seed)
    out = model(*inputs)
    (out.square().mean()).backward()
    grads = {n: p.grad for n, p in model.named_parameters()} | {f"input{i}": x.grad for i, x in enumerate(inputs)}
    return out.detach(), {k: v for k, v in grads.items() if v is not None}


def assert_same(a, b, atol: float = 2e-5) -> None:
    (out_a, grads_a), (out_b, grads_b) = a, b
    torch.testing.assert_close(out_b, out_a, atol=atol, rtol=1e-4)
    assert grads_a.keys() == grads_b.keys()
    for key in grads_a:
        torch.testing.assert_close(grads_b[key], grads_a[key], atol=atol, rtol=1e-3, msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REWRITTEN))
def test_apply_rewrites_the_attention_and_the_model_computes_what_it_did(tmp_path, name):
    """`fuselens apply` (validating first, as it does by default) rewrites the attention's lines; the
    rewritten model, with the original's weights, gives the original's outputs and gradients in eval mode
    and in training mode with its dropout at 0; with a dropout of 0.5 its outputs differ from run to run
    as the original's do, and average to the eval output as theirs do."""
    _, (first, last), written = REWRITTEN[name]
    path = copied(tmp_path, name)
    with open(path, encoding="utf-8") as fh:
        original = fh.read()
    done = fuselens("apply", "--cluster", "r0", "--yes", path, cwd=tmp_path)
    assert done.returncode == 0 and "applied r0" in done.stdout, done.stdout + done.stderr
    with open(path, encoding="utf-8") as fh:
        applied = fh.read()
    lines = original.splitlines(keepends=True)
    assert applied == "".join(lines[: first - 1]) + written + "".join(lines[last:])
    assert "cluster" not in applied  # the rewrite alone: the clusters it replaces are not applied beside it

    want_module, got_module = load(os.path.join(EXAMPLES, name), "original"), load(path, "rewritten")
    for mode in ("eval", "train"):
        want, inputs = built(want_module, name, dropout=0.0)
        got, _ = built(got_module, name, dropout=0.0)
        got.load_state_dict(want.state_dict())
        getattr(want, mode)(), getattr(got, mode)()
        assert_same(run(want, inputs), run(got, inputs))

    want, inputs = built(want_module, name, dropout=0.5)
    got, _ = built(got_module, name, dropout=0.5)
    got.load_state_dict(want.state_dict())
    if name == "llama_block.py":
        return  # (no dropout)
    with torch.no_grad():
        reference = want.eval()(*inputs)
        want.train(), got.train()
        draws = {
            label: torch.stack([model(*inputs) for _ in range(300)])
            for label, model in (("original", want), ("rewritten", got))
        }
    for label, outs in draws.items():
        spread = (outs - reference).abs().mean().item()
        assert spread > 0.05 * reference.abs().mean().item(), f"{label}: training mode drops nothing"
        error = (outs.mean(0) - reference).abs().mean().item()
        assert error < 0.25 * spread, f"{label}: its mean is not the eval output ({error} against {spread})"
    ratio = (draws["rewritten"] - reference).abs().mean() / (draws["original"] - reference).abs().mean()
    assert 0.8 < ratio.item() < 1.25, ratio  # dropped and scaled alike


@pytest.mark.slow
def test_restore_puts_the_hand_written_attention_back(tmp_path):
    path = copied(tmp_path, "nanogpt_attention.py")
    with open(path, encoding="utf-8") as fh:
        original = fh.read()
    assert fuselens("apply", "--yes", "--no-check", path, cwd=tmp_path).returncode == 0
    with open(path, encoding="utf-8") as fh:
        assert "scaled_dot_product_attention" in fh.read()
    restored = fuselens("restore", "--yes", path, cwd=tmp_path)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert "attention (rewritten as F.scaled_dot_product_attention)" in restored.stdout
    with open(path, encoding="utf-8") as fh:
        assert fh.read() == original


# ---- what else is rewritten: grouped heads, soft-capping ----------------------------------------------

GROUPED = """
import torch
import torch.nn as nn


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


class GroupedAttention(nn.Module):  # fuselens: input=(2, 16, 64) float32
    def __init__(self, dim=64, heads=8, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
        v = repeat_kv(v, self.heads // self.kv_heads)
        scores = q @ k.transpose(-2, -1) / self.head_dim**0.5
        return torch.softmax(scores, dim=-1) @ v
"""

CAPPED = """
import torch
import torch.nn as nn


class CappedAttention(nn.Module):  # fuselens: input=(2, 16, 64) float32
    def __init__(self, dim=64, heads=4, cap=5.0):
        super().__init__()
        self.heads, self.cap = heads, cap
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5
        scores = self.cap * torch.tanh(scores / self.cap)
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, d)
"""


def rewritten_module(write_model, analyze, source: str, name: str):
    """The model file's text after its rewrite, written beside it and imported; with the original module."""
    from fuselens.codegen import edits

    path = write_model(source, f"{name}.py")
    report = analyze(path)
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    new = edits.apply_line_edits(text, edits.fix_edits(text, report, ["r0"]))
    out = os.path.join(os.path.dirname(path), f"{name}_rewritten.py")
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(new)
    return report, new, load(path, name), load(out, f"{name}_rewritten")


def test_grouped_heads_are_passed_unrepeated_with_enable_gqa(write_model, analyze):
    report, new, original, rewritten = rewritten_module(write_model, analyze, GROUPED, "grouped")
    pattern = attention_of(report)
    assert pattern.rewrite.torch_version == "2.5"
    forward = new[new.index("    def forward") :]
    assert "enable_gqa=True" in forward and "repeat_interleave" not in forward and "repeat_kv" not in forward
    torch.manual_seed(0)
    want = original.GroupedAttention()
    got = rewritten.GroupedAttention()
    got.load_state_dict(want.state_dict())
    x = torch.randn(2, 16, 64)
    assert_same(run(want, [x]), run(got, [x]))


def test_soft_capping_becomes_flex_attentions_score_mod(write_model, analyze):
    """`cap * tanh(scores / cap)` is no argument of scaled_dot_product_attention: FlexAttention's score_mod
    computes it (and the causal mask, in it).  On a CPU FlexAttention runs forward only."""
    report, new, original, rewritten = rewritten_module(write_model, analyze, CAPPED, "capped")
    rewrite = attention_of(report).rewrite
    assert "from torch.nn.attention.flex_attention import flex_attention" in new
    assert rewrite.call == (
        "flex_attention(q, k, v, score_mod=lambda score, b, h, q_idx, kv_idx: torch.where(q_idx >= kv_idx, "
        "self.cap * torch.tanh(score / self.cap), -float('inf')), scale=(d // self.heads) ** -0.5)"
    )
    assert "compiled" in rewrite.note
    torch.manual_seed(0)
    want = original.CappedAttention()
    got = rewritten.CappedAttention()
    got.load_state_dict(want.state_dict())
    x = torch.randn(2, 16, 64)
    with torch.no_grad():
        torch.testing.assert_close(got(x), want(x), atol=2e-5, rtol=1e-4)


# ---- where no fused call computes it as written: nothing is rewritten, and the report says why --------

HEADER = """
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
"""


def attention_class(forward: str, init: str = "", extra: str = "") -> str:
    """A model file whose attention's lines are `forward` (after q, k and v of 2×4×16×8 are made)."""
    body = textwrap.indent(textwrap.dedent(forward).strip("\n"), " " * 8)
    made = textwrap.indent(textwrap.dedent(init).strip("\n"), " " * 8) + "\n" if init.strip() else ""
    return (
        HEADER
        + textwrap.dedent(extra)
        + "\n\nclass Attention(nn.Module):  # fuselens: input=(2, 16, 32) float32\n"
        + "    def __init__(self):\n"
        + "        super().__init__()\n"
        + "        self.qkv = nn.Linear(32, 96)\n"
        + made
        + "\n"
        + "    def forward(self, x):\n"
        + "        b, s, _ = x.shape\n"
        + "        q, k, v = self.qkv(x).view(b, s, 3, 4, 8).permute(2, 0, 3, 1, 4)\n"
        + body
        + "\n"
    )


REFUSED = {
    "the probabilities returned": (
        attention_class("""
            probs = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1)
            return probs @ v, probs
        """),
        "escapes",
        "the probabilities are returned by the forward: a fused call never writes them",
    ),
    "the probabilities stored": (
        attention_class("""
            scores = q @ k.transpose(-2, -1) / math.sqrt(8)
            probs = scores.softmax(-1)
            out = probs @ v
            self.attention_map = probs
            return out
        """),
        "escapes",
        "line {self.attention_map} reads `probs`, which the attention's lines assign: a fused call never makes it",
    ),
    "the scores changed by another module": (
        attention_class(
            """
            scores = q @ k.transpose(-2, -1) / math.sqrt(8)
            scores = self.position_bias(scores)
            return scores.softmax(-1) @ v
            """,
            init="self.position_bias = RelativeBias()\n",
            extra=textwrap.dedent("""

                class RelativeBias(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.table = nn.Parameter(torch.zeros(4, 1, 16))

                    def forward(self, scores):
                        return scores + self.table
                """),
        ),
        "modified",
        "the scores go through the module `self.position_bias` (RelativeBias) at line {scores = self.position_bias}, "
        "which computes `add` in RelativeBias.forward: a fused call cannot run it",
    ),
    "a mask computed from the scores": (
        attention_class("""
            scores = q @ k.transpose(-2, -1) / math.sqrt(8)
            scores = scores.masked_fill(scores < scores.mean(-1, keepdim=True), float("-inf"))
            return scores.softmax(-1) @ v
        """),
        "mask",
        "the mask at line {scores = scores.masked_fill} is computed from the scores themselves: a fused call takes a mask "
        "made before them",
    ),
    "a mask filled with a finite number": (
        attention_class("""
            scores = q @ k.transpose(-2, -1) / math.sqrt(8)
            scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), -1e9)
            return scores.softmax(-1) @ v
        """),
        "mask",
        "the mask at line {scores = scores.masked_fill} fills -1000000000.0, not -inf: a fused call's boolean mask leaves "
        "-inf there, which differs where a row's every key is masked",
    ),
    "the scores masked in place": (
        attention_class("""
            scores = q @ k.transpose(-2, -1) / math.sqrt(8)
            scores.masked_fill_(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
            return scores.softmax(-1) @ v
        """),
        "modified",
        "`masked_fill` at line {scores.masked_fill_} changes the scores where the rewrite cannot follow (in place, "
        "or by a name it does not read): it would be left out of the call",
    ),
    "the softmax in a helper": (
        attention_class(
            """
            scores = q @ k.transpose(-2, -1) / math.sqrt(8)
            return normalised(scores) @ v
            """,
            extra=textwrap.dedent("""

                def normalised(scores):
                    return torch.softmax(scores, dim=-1)
                """),
        ),
        "elsewhere",
        "`softmax` is computed in normalised called at line {return normalised}, another function than the "
        "product with v (Attention.forward): one rewrite of Attention.forward's lines cannot stand for it",
    ),
    "an `if` between its lines": (
        attention_class("""
            scores = q @ k.transpose(-2, -1) / math.sqrt(8)
            if s > 1:
                scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
            return scores.softmax(-1) @ v
        """),
        "elsewhere",
        "the attention's ops at lines {scores = scores.masked_fill} and {return scores} are not in one block of "
        "statements (an `if` or a loop holds some of them)",
    ),
}


def at_lines(template: str, text: str) -> str:
    """`template` with each `{code}` put as the line of `text` that `code` begins (after its indentation)."""
    lines = [line.strip() for line in text.splitlines()]
    return re.sub(
        r"\{([^}]*)\}", lambda m: str(next(i + 1 for i, line in enumerate(lines) if line.startswith(m[1]))), template
    )


@pytest.mark.parametrize("case", list(REFUSED))
def test_an_attention_no_fused_call_computes_as_written_is_reported_with_why_and_left_alone(
    write_model, analyze, tmp_path, case
):
    source, code, template = REFUSED[case]
    path = write_model(source)
    with open(path, encoding="utf-8") as fh:
        why = at_lines(template, fh.read())
    pattern = attention_of(analyze(path))
    assert pattern.rewrite is None
    assert pattern.refusal == code and why in pattern.refusal_detail, pattern.refusal_detail
    assert pattern.estimate.bytes_before > pattern.estimate.bytes_after  # still reported, with its bytes
    done = fuselens("apply", "--yes", "--no-check", path, cwd=tmp_path)
    assert (
        f"attention (Attention, lines {pattern.lines[0]}–{pattern.lines[1]}): not rewritten: "
        in done.stdout.replace("\n", " ")
    ), done.stdout
    with open(path, encoding="utf-8") as fh:
        assert "scaled_dot_product_attention" not in fh.read()
