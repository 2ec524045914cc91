"""Nothing is dropped silently: every op a kernel could take, or that reduces, selects or orders along
dims, ends in a cluster of the report or in its rejections, with a reason code and a sentence.

Small models, each built around one way an op can stay alone: a single op, a reduction, `torch.max`
with a dim and its values or indices, `topk`, `sort`, `argmax`, ops that return several tensors, ops
on integers and booleans, in-place ops, a view between two ops, pooling, a scan, a branch the
example inputs do not take.  The ops are those a trace of each model records (each path of a branch),
independently of the report.
"""

from __future__ import annotations

import pytest

from fuselens.analysis import capture, loader
from fuselens.analysis.unlowered import reductive
from fuselens.contracts.config import InputSpec
from fuselens.contracts.options import AnalyzeOptions
from fuselens.contracts.report import REJECTION_REASONS
from fuselens.pipeline.analyze import analyze_file

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"

# name -> (the forward's body, its input, dtype)
MODELS = {
    "one-elementwise-op": ("return torch.relu(x)", "4,8", "float32"),
    "one-reduction": ("return x.sum(-1)", "4,8", "float32"),
    "max-with-a-dim": ("return torch.max(x, 1)", "4,8", "float32"),
    "max-values": ("return torch.max(x * 2, -1).values.exp()", "4,8", "float32"),
    "min-indices": ("return torch.min(x.exp(), dim=-1).indices + 1", "4,8", "float32"),
    "max-over-all": ("return torch.max(x * 2)", "4,8", "float32"),
    "topk": ("return torch.topk(x * 2, 3, dim=-1).values.sigmoid()", "4,8", "float32"),
    "sort": ("return torch.sort(x.exp(), dim=-1)[0] + 1", "4,8", "float32"),
    "argmax": ("return torch.argmax(x * 2, dim=-1)", "4,8", "float32"),
    "argmax-alone": ("return torch.argmax(x, dim=-1)", "4,8", "float32"),
    "var-mean": ("v, m = torch.var_mean(x * 2, -1)\n        return v + m", "4,8", "float32"),
    "aminmax": ("a, b = torch.aminmax(x * 2, dim=-1)\n        return a * b", "4,8", "float32"),
    "median-and-mode": ("return torch.median(x * 2, -1).values + torch.mode(x, -1).values", "4,8", "float32"),
    "integer-ops": ("return (x * 2 + 1) // 3", "4,8", "int64"),
    "bool-op-alone": ("return ~x", "4,8", "bool"),
    "comparisons-into-a-bool-sum": ("return ((x > 0) & (x < 3)).sum(-1)", "4,8", "float32"),
    "in-place-on-the-input": ("x.mul_(2)\n        return x.relu()", "4,8", "float32"),
    "in-place-on-an-intermediate": ("y = x * 2\n        y.add_(1)\n        return y.relu()", "4,8", "float32"),
    "view-between-two-ops": ("y = (x * 2).view(4, 2, 4)\n        return y.relu()", "4,8", "float32"),
    "reshape-between-two-ops": ("return (x.exp().reshape(32) + 1).sigmoid()", "4,8", "float32"),
    "average-pooling": ("return F.avg_pool2d(x.relu(), 2) * 2", "2,3,8,8", "float32"),
    "max-pooling": ("return F.max_pool2d(x * 2, 2).exp()", "2,3,8,8", "float32"),
    "global-pooling": ("return F.adaptive_avg_pool2d(x.relu(), 1) * 2", "2,3,8,8", "float32"),
    "reduction-over-a-leading-dim": ("return (x * 2).sum(0)", "4,8", "float32"),
    "scans": ("return torch.cummax(x * 2, -1).values + torch.logcumsumexp(x, -1)", "4,8", "float32"),
    "other-reductions": ("return torch.nansum(x * 2, -1) + torch.count_nonzero(x, -1)", "4,8", "float32"),
    "a-write-between-two-ops": ("y = x * 2\n        y[:, 0] = 0\n        return y.relu()", "4,8", "float32"),
    "a-branch-not-taken": (
        "h = x * 2\n        if h.mean() > 0:\n            return torch.sigmoid(h)\n"
        "        return torch.max(h.exp(), -1).values.tanh()",
        "4,8",
        "float32",
    ),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_every_op_left_out_of_a_cluster_says_why(write_model, name):
    body, shape, dtype = MODELS[name]
    path = write_model(f"{HEADER}class M(nn.Module):\n    def forward(self, x):\n        {body}\n")
    report = analyze_file(path, AnalyzeOptions(input_shapes=[shape], dtypes=[dtype]))
    (model,) = report.models
    assert model.status == "analyzed", model.problem
    clustered = {(op.target, op.line) for c in model.clusters for op in c.ops}
    rejected = {(op.target, op.line) for r in model.rejections for op in r.ops}
    ops = _candidates(path, InputSpec([int(n) for n in shape.split(",")], dtype))
    assert ops, "the model has ops to account for"
    unaccounted = ops - clustered - rejected
    assert not unaccounted, f"left out without a reason: {sorted(unaccounted)}"
    for r in model.rejections:
        assert r.reason in REJECTION_REASONS and r.detail, r


def _candidates(path: str, spec: InputSpec) -> set[tuple[str, int]]:
    """(op, line) of every op of each path through the model's forward that a kernel could take or
    that reduces, selects or orders along dims, from a trace of its own."""
    user = capture.UserCode()
    module = loader.import_file(path, user)
    model = loader.build(loader.model_classes(module)["M"], {}, user, "").model
    names = loader.forward_input_names(model, 1)
    main = capture.trace(model, loader.meta_inputs([spec]), names, user)
    paths = [main] + [
        capture.trace(model, loader.meta_inputs([spec]), names, user, [*main.branches[:i], not main.branches[i]])
        for i in range(len(main.branches))
    ]
    return {
        (node.op, node.line or 0) for trace in paths for node in trace.graph if node.cls.absorbable or reductive(node)
    }


# name -> (the forward's body, the op left out, its reason, what its sentence says to write, the forward
# written so, the op that then joins a cluster)
REWRITES = {
    "var-mean": (
        "v, m = torch.var_mean(x * 2, -1)\n        return v + m",
        "var_mean",
        "no-lowering",
        "`torch.var(x, dim)` and `x.mean(dim)` apart",
        "v, m = torch.var(x * 2, -1), (x * 2).mean(-1)\n        return v + m",
        "var",
    ),
    "aminmax": (
        "a, b = torch.aminmax(x * 2, dim=-1)\n        return a * b",
        "aminmax",
        "no-lowering",
        "`torch.amin(x, dim)` and `torch.amax(x, dim)` apart",
        "return torch.amin(x * 2, -1) * torch.amax(x * 2, -1)",
        "amax",
    ),
}


@pytest.mark.parametrize("name", list(REWRITES))
def test_a_rejection_names_the_rewrite_that_fuses(write_model, name):
    """Where an op that fuses computes what the rejected one does, the sentence says how to write it,
    and written so, it joins its neighbours in a cluster."""
    body, op, reason, advice, rewritten, joins = REWRITES[name]
    shape = "2,3,8,8" if "pool" in body else "4,8"
    options = AnalyzeOptions(input_shapes=[shape], dtypes=["float32"])
    before = analyze_file(
        write_model(f"{HEADER}class M(nn.Module):\n    def forward(self, x):\n        {body}\n"), options
    )
    (rejection,) = [r for r in before.models[0].rejections if r.ops[0].target == op]
    assert rejection.reason == reason and advice in rejection.detail, rejection
    after = analyze_file(
        write_model(f"{HEADER}class M(nn.Module):\n    def forward(self, x):\n        {rewritten}\n", "rewritten.py"),
        options,
    )
    assert any(joins in c.op_chain.split(" → ") for c in after.models[0].clusters), after.models[0].rejections
