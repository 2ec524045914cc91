"""Building a model to analyze it: its small tensors are real, and the same in every analysis."""

from __future__ import annotations

import subprocess
import sys

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


# Layers each just small enough to be built with real values (a million elements makes a weight), 240 MB
# of them in all; and the same just big enough to be built on meta.
PROJECTIONS = """
import torch.nn as nn


class Projections(nn.Module):  # fuselens: input=(8, {width})
    def __init__(self, layers: int = 60, width: int = {width}):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x).relu() * 2.0
        return x
"""

PEAK_MEMORY = """
import resource, sys
from fuselens.pipeline.analyze import analyze_file
report = analyze_file(sys.argv[1], code=False)
assert report.models[0].status == "analyzed", report.models[0].problem
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def _peak_mb(path: str) -> int:
    done = subprocess.run([sys.executable, "-c", PEAK_MEMORY, path], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_a_saves_analysis_gives_its_weights_no_memory(tmp_path):
    """The analysis on a save traces a model on meta: weights small enough to be built with real values
    are never filled in, so a model of many small layers costs what one of large layers costs (a 12-layer
    GPT's 768 x 768 projections took a quarter of its analysis)."""
    (tmp_path / "small").mkdir()
    (tmp_path / "large").mkdir()
    small, large = tmp_path / "small" / "model.py", tmp_path / "large" / "model.py"
    small.write_text(PROJECTIONS.format(width=1000))
    large.write_text(PROJECTIONS.format(width=1024))
    grown = _peak_mb(str(small)) - _peak_mb(str(large))
    assert grown < 60, f"the model of small layers took {grown} MB more at its peak than the one of large layers"
