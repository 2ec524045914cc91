"""A projection onto a vocabulary whose logits only its cross-entropy reads ("linear-cross-entropy"): the
forms people write it in, what a training step of it holds with and without the logits, and the reasons
it is refused where a fused loss cannot stand in for the code."""

from __future__ import annotations

import pytest

from conftest import only_model

HEAD = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Head(nn.Module):
    def __init__(self, hidden=4096, vocab=128256, bias=False):
        super().__init__()
        self.lm_head = nn.Linear(hidden, vocab, bias=bias)
        self.cap = 30.0

    def forward(self, h, targets):
{body}
"""


def pattern(report, name="linear-cross-entropy"):
    found = [p for p in only_model(report).patterns if p.name == name]
    return found[0] if found else None


def analyzed(write_model, analyze, body: str, shapes=("8,2048,4096", "8,2048"), dtype="bfloat16"):
    source = HEAD.format(body="\n".join("        " + line for line in body.strip().splitlines()))
    path = write_model(source)
    return analyze(path, input_shapes=list(shapes), dtypes=[dtype, "int64"], param_dtype=dtype)


@pytest.mark.parametrize(
    "body",
    [
        "logits = self.lm_head(h)\n"
        "return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1), ignore_index=-100)",
        "return F.cross_entropy(self.lm_head(h).float().flatten(0, 1), targets.flatten())",
        "logp = F.log_softmax(self.lm_head(h).float(), dim=-1)\n"
        "return F.nll_loss(logp.reshape(-1, logp.shape[-1]), targets.reshape(-1))",
        "logp = F.log_softmax(self.lm_head(h).float(), dim=-1)\n"
        "return -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)",
    ],
    ids=["cross_entropy", "inline", "nll_loss", "gather"],
)
def test_a_head_and_its_loss_are_named_with_the_logits_memory(write_model, analyze, body):
    """16k tokens over a 128k vocabulary in bf16, upcast: the logits alone are 4 GB, and eager's step holds
    three float32 copies of them at once in the loss's backward; the fused loss a gigabyte of logits."""
    found = pattern(analyzed(write_model, analyze, body))
    assert found is not None and not found.refusal and found.rewrite is not None
    memory = found.memory
    tokens, vocabulary = 8 * 2048, 128256
    assert (memory.tokens, memory.vocabulary, memory.hidden, memory.dtype) == (tokens, vocabulary, 4096, "bfloat16")
    assert memory.upcast and memory.logits_bytes == memory.logits_grad_bytes == tokens * vocabulary * 2
    assert memory.upcast_bytes == memory.saved_bytes == tokens * vocabulary * 4
    assert (
        memory.peak_bytes_eager == 3 * memory.saved_bytes
    )  # the loss's backward: log-probs, their gradient, its input's
    assert memory.chunk_tokens == 4096 and memory.peak_bytes_fused < memory.peak_bytes_eager / 5
    assert found.dims == {"tokens": tokens, "vocabulary": vocabulary, "hidden": 4096, "dtype": "bfloat16"}


def test_without_an_upcast_the_loss_keeps_bf16_log_probabilities(write_model, analyze):
    found = pattern(
        analyzed(write_model, analyze, "return F.cross_entropy(self.lm_head(h).view(-1, 128256), targets.view(-1))")
    )
    memory = found.memory
    assert not memory.upcast and memory.upcast_bytes == 0 and memory.saved_bytes == memory.logits_bytes
    assert memory.peak_bytes_eager == 3 * memory.logits_bytes


def test_a_classifier_over_few_classes_is_not_a_vocabulary(write_model, analyze):
    source = write_model(HEAD.format(body="        return F.cross_entropy(self.lm_head(h), targets)"))
    settings = {"Head": {"init": {"hidden": 512, "vocab": 10}}}
    report = analyze(source, input_shapes=["64,512", "64"], dtypes=["float32", "int64"], models=settings)
    assert pattern(report) is None
    assert pattern(report, "cross-entropy") is not None  # the loss alone is still named


@pytest.mark.parametrize(
    ("body", "reason", "detail"),
    [
        (
            "logits = self.lm_head(h)\n"
            "loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))\n"
            "return loss, logits",
            "escapes",
            "the logits (line 13) are also returned",
        ),
        (
            "logits = self.lm_head(h)\n"
            "next_token = logits[:, -1].argmax(-1)\n"
            "return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1)), next_token",
            "escapes",
            "(line 13) are also read by `getitem` (line 14)",
        ),
        (
            "logits = torch.tanh(self.lm_head(h) / self.cap) * self.cap\n"
            "return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))",
            "soft-capping",
            "`tanh` (line 13) soft-caps the logits",
        ),
        (
            "logits = self.lm_head(h) * 0.5\n"
            "return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))",
            "modified",
            "`mul` (line 13) change the logits",
        ),
        (
            "logits = F.linear(h, self.lm_head.weight[:128000])\n"
            "return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))",
            "weight",
            "takes a `getitem` of `lm_head.weight` as its weight",
        ),
        (
            "logits = self.lm_head(h).view(-1, 128256)\n"
            "return F.cross_entropy(logits, targets.view(-1), weight=torch.ones(128256, device=h.device))",
            "class-weights",
            "`cross_entropy` (line 14) weights its classes",
        ),
    ],
    ids=["returned", "sampled", "soft-capped", "scaled", "sliced-weight", "class-weights"],
)
def test_where_a_fused_loss_cannot_stand_in_it_says_why(write_model, analyze, body, reason, detail):
    found = pattern(analyzed(write_model, analyze, body))
    assert found is not None and found.rewrite is None
    assert found.refusal == reason and detail in found.refusal_detail, found.refusal_detail
