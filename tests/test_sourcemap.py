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
    # the kernel where it fits the call, the lines as written everywhere else
    assert c.edit.text == (
        "        if cluster0.fits(x, self.bias):\n"
        "            y = cluster0(x, self.bias)\n"
        "        else:\n"
        "            y = x * 2.0\n"
        "            y = torch.relu(y) + self.bias\n"
    )


def test_a_statement_sharing_its_line_is_kept(write_model, analyze):
    model = only_model(analyze(write_model(MODEL)))
    c = by_chain(model)["linear → tanh → add"]  # `z = self.proj(y)` starts it, on the line before
    # `w = torch.tanh(z) + 1.0; u = self.proj(w)`: the first statement becomes the call, the second stays
    assert c.mapping == "exact" and c.lines == [line_of("z = self.proj(y)"), line_of("torch.tanh(z)")]
    k = c.kernel.name
    assert c.edit.text == (
        f"        if {k}.fits(y, self.proj.weight, self.proj.bias, module=self):\n"
        f"            w = {k}(y, self.proj.weight, self.proj.bias); u = self.proj(w)\n"
        "        else:\n"
        "            z = self.proj(y)\n"
        "            w = torch.tanh(z) + 1.0; u = self.proj(w)\n"
    )


def test_ops_in_a_helper_are_replaced_at_the_caller(write_model, analyze):
    model = only_model(analyze(write_model(MODEL)))
    # (`u = self.proj(w)` stays out: its line is the cluster before's, whose rewrite keeps it)
    c = next(c for c in model.clusters if "sigmoid" in c.op_chain)
    assert c.op_chain == "sigmoid → mul → add"
    assert c.lines == [line_of("helper(u) + u")] * 2  # where forward() calls helper(), not helper's own lines
    # the call of helper() goes with the ops it runs; the linear around them stays
    k = c.kernel.name
    assert c.mapping == "exact" and c.edit.text == f"        v = self.proj({k}(u) if {k}.fits(u) else helper(u) + u)\n"


def test_a_name_read_after_the_lines_keeps_them(write_model, analyze):
    model = only_model(analyze(write_model(MODEL)))
    c = next(c for c in model.clusters if c.op_chain.startswith("exp"))  # (its GEMM's line is helper's call's)
    # t is reassigned and its final value is what the lines leave behind: they become one call
    assert c.mapping == "exact" and c.lines == [line_of("torch.exp(v)"), line_of("t = t * 3.0")]
    k = c.kernel.name
    assert c.edit.text.split() == f"if {k}.fits(v): t = {k}(v) else: t = torch.exp(v) t = t * 3.0".split()


LAYERS = """
import torch, torch.nn as nn, torch.nn.functional as F


class Layer(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.proj = nn.Linear(32, 32)
        self.act = nn.GELU() if act == "gelu" else nn.Linear(32, 32) if act == "linear" else nn.Identity()

    def forward(self, x):
        h = self.proj(x) * 2.0
        return self.act(h) + 1.0


class Net(nn.Module):  # fuselens: input=(64, 32)
    def __init__(self, acts=("gelu", "gelu")):
        super().__init__()
        self.layers = nn.ModuleList(Layer(a) for a in acts)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
"""


def test_lines_that_compute_something_else_in_another_call_are_not_replaced(write_model, analyze):
    # Layer.forward's lines are one cluster in every layer: one call stands for them all
    model = only_model(analyze(write_model(LAYERS)))
    clusters = [(c.op_chain, c.multiplicity, c.mapping) for c in model.clusters]
    assert clusters == [("linear → mul → gelu → add", 2, "exact")]
    # With one layer's activation an Identity, a call written there would run GELU in that layer too
    mixed = LAYERS.replace('acts=("gelu", "gelu")', 'acts=("gelu", "none")')
    model = only_model(analyze(write_model(mixed)))
    # (the projections stay out: no call could stand for the lines with them either)
    assert {c.op_chain for c in model.clusters} == {"mul → gelu → add", "mul → add"}
    for c in model.clusters:
        assert c.mapping == "pointer" and c.edit is None and c.applies == "no"
        assert "one kernel call cannot stand for both" in c.apply_detail, c.apply_detail
    # An activation that no kernel can hold (a layer's lines are no cluster there): the call is written,
    # asking for the module's `act` to be the GELU it was made for, so the other layer runs its lines
    broken = LAYERS.replace('acts=("gelu", "gelu")', 'acts=("gelu", "linear")')
    model = only_model(analyze(write_model(broken)))
    gelu = next(c for c in model.clusters if "gelu" in c.op_chain)
    assert gelu.edit is not None and "cluster0.fits(x, self.proj.weight, self.proj.bias, module=self)" in gelu.edit.text


LAYER_SCALE = """
import torch, torch.nn as nn, torch.nn.functional as F


class DropPath(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        keep = torch.rand(x.shape[0], 1, device=x.device) >= self.p
        return x * keep / (1 - self.p)


class Block(nn.Module):  # fuselens: input=(8, 64)
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.gamma = nn.Parameter(torch.ones(64))
        self.drop_path = DROP

    def forward(self, x):
        y = self.fc(x)
        return x + self.drop_path(self.gamma * F.gelu(y))
"""


def test_an_identity_module_inside_the_cluster_is_replaced_with_it(write_model, analyze):
    """`nn.Identity` (what libraries put where stochastic depth is off) and a dropout of rate 0
    return their input in training too: the kernel's call stands for them."""
    for drop in ("nn.Identity()", "nn.Dropout(0.0)"):
        model = only_model(analyze(write_model(LAYER_SCALE.replace("DROP", drop))))
        (c,) = model.clusters
        assert c.op_chain == "linear → gelu → mul → add" and c.applies == "edit", (drop, c.apply_detail)
        k = c.kernel.name
        # asked with the module, whose drop_path must still be the module that was analyzed
        assert c.edit.text == (
            f"        if {k}.fits(x, self.fc.weight, self.fc.bias, self.gamma, module=self):\n"
            f"            return {k}(x, self.fc.weight, self.fc.bias, self.gamma)\n"
            "        else:\n"
            "            y = self.fc(x)\n"
            "            return x + self.drop_path(self.gamma * F.gelu(y))\n"
        )


def test_a_module_that_drops_only_in_training_is_left_to_the_lines_in_training(write_model, analyze):
    """In eval mode a dropout of rate 0.1 (or a DropPath) returns its input and runs no op: the kernel
    stands for the expression there, and its `fits` holds the module to eval mode, so that in training
    the lines run as written, dropping.  A functional dropout's mode is `self.training`."""
    for drop in ("nn.Dropout(0.1)", "DropPath(0.1)"):
        model = only_model(analyze(write_model(LAYER_SCALE.replace("DROP", drop))))
        (c,) = model.clusters
        assert c.applies == "edit", c.apply_detail
        assert "_modules = (\n    ('drop_path'," in c.kernel.source and ", False),\n    ('fc'," in c.kernel.source
    functional = LAYER_SCALE.replace("DROP", "nn.Identity()").replace(
        "self.drop_path(self.gamma * F.gelu(y))", "F.dropout(self.gamma * F.gelu(y), 0.1, self.training)"
    )
    (c,) = only_model(analyze(write_model(functional))).clusters
    assert c.applies == "edit" and "module=self" in c.edit.text and "    ('', '', {}, (), False),\n" in c.kernel.source
    # a dropout whose mode nothing in the code names stays out (and the GEMM with it: its call, and the
    # expression's, are then no one call's)
    fixed = functional.replace("0.1, self.training)", "0.1, self.fc.training)")
    (c,) = only_model(analyze(write_model(fixed))).clusters
    assert c.op_chain == "gelu → mul → add"
    assert c.applies == "no" and "(line 25) ran no op here" in c.apply_detail
