"""Building a model to analyze it: its small tensors are real, and the same in every analysis."""

from __future__ import annotations

import pytest
import torch

from conftest import only_model

# A mixture of experts small enough that its router's weights are real tensors (initialised from torch's
# random generator): how many tokens each expert gets, and so the shapes of the experts' clusters, follow
# from those weights in the run on real values that takes the analysis past `torch.where`.
MOE = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class LoopMoE(nn.Module):{comment}
    def __init__(self, dim=32, hidden=64, experts=4):
        super().__init__()
        self.router = nn.Linear(dim, experts)
        self.up = nn.ModuleList(nn.Linear(dim, hidden) for _ in range(experts))
        self.down = nn.ModuleList(nn.Linear(hidden, dim) for _ in range(experts))

    def forward(self, x):
        weights = F.softmax(self.router(x), dim=-1)
        best = weights.argmax(-1)
        out = torch.zeros_like(x)
        for e in range(len(self.up)):
            (rows,) = torch.where(best == e)
            h = F.gelu(self.up[e](x[rows])) * 2.0
            out[rows] = self.down[e](h) * weights[rows, e, None]
        return out + 1.0
"""

# A model object bound at module level, of a class from another file: built when the file is imported.
BOUND = "from moe import LoopMoE\n\nmodel = LoopMoE()  # fuselens: input=(64, 32)\n"


def _write(write_model, bound: bool) -> str:
    if not bound:
        return write_model(MOE.format(comment="  # fuselens: input=(64, 32)"))
    write_model(MOE.format(comment=""), "moe.py")
    return write_model(BOUND)


@pytest.mark.parametrize("bound", [False, True], ids=["class", "module-level object"])
def test_a_model_whose_routing_follows_its_weights_gives_the_same_report_every_time(write_model, analyze, bound):
    path = _write(write_model, bound)
    reports = []
    for seed in (1, 2):  # whatever state the caller left torch's generator in
        torch.manual_seed(seed)
        model = only_model(analyze(path))
        assert any("traced past the data-dependent op" in note for note in model.notes), model.notes
        reports.append([(c.op_chain, [i.shape for i in c.inputs], c.multiplicity) for c in model.clusters])
    assert reports[0] == reports[1]
    assert sum(m for chain, _, m in reports[0] if chain == "gelu → mul") == 4  # each expert got tokens


def test_building_a_model_leaves_the_callers_random_generator_as_it_was(write_model, analyze):
    path = _write(write_model, bound=True)
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    only_model(analyze(path))
    assert torch.equal(torch.rand(4), expected)
