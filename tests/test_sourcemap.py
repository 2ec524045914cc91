"""Source mapping: which clusters can be replaced by one call, and why the others cannot."""

from __future__ import annotations

from conftest import only_model

MODEL = """
import torch, torch.nn as nn, torch.nn.functional as F


def helper(x):
    return torch.sigmoid(x) * 2


class Net(nn.Module):  # fuselens: input=(64, 32)
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 32)
        self.bias = nn.Parameter(torch.zeros(32))

    def forward(self, x):
        y = x * 2.0
        y = torch.relu(y) + self.bias
        z = self.proj(y)
        w = torch.tanh(z) + 1.0; u = self.proj(w)
        v = self.proj(helper(u) + u)
        t = torch.exp(v)
        t = t * 3.0
        return self.proj(t)
"""


def line_of(snippet: str) -> int:
    return next(i for i, text in enumerate(MODEL.lstrip("\n").splitlines(), 1) if snippet in text)


def by_chain(model):
    return {c.op_chain: c for c in model.clusters}


def test_exact_mapping_names_inputs_and_outputs(write_model, analyze):
    model = only_model(analyze(write_model(MODEL)))
    c = by_chain(model)["mul → relu → add"]
    assert c.mapping == "exact" and c.lines == [line_of("y = x * 2.0"), line_of("torch.relu(y)")]
    assert [i.name for i in c.inputs] == ["x", "self.bias"]
    assert c.edit.text == "        y = cluster0(x, self.bias)\n"


def test_another_op_on_the_same_line_prevents_replacing_it(write_model, analyze):
    model = only_model(analyze(write_model(MODEL)))
    c = by_chain(model)["tanh → add"]
    assert c.mapping == "pointer" and "also runs `linear`" in c.mapping_detail and c.edit is None


def test_ops_in_a_helper_point_at_the_caller(write_model, analyze):
    model = only_model(analyze(write_model(MODEL)))
    c = next(c for c in model.clusters if "sigmoid" in c.op_chain)
    assert c.mapping == "pointer" and "helper" in c.mapping_detail
    assert c.lines == [line_of("helper(u) + u")] * 2  # where forward() calls helper(), not helper's own lines


def test_a_name_read_after_the_lines_keeps_them(write_model, analyze):
    model = only_model(analyze(write_model(MODEL)))
    c = next(c for c in model.clusters if c.op_chain.startswith("exp"))
    # t is reassigned and its final value is what the lines leave behind: they become one call
    assert c.mapping == "exact" and c.lines == [line_of("torch.exp(v)"), line_of("t = t * 3.0")]
    assert c.edit.text.strip() == f"t = {c.kernel.name}(v)"
