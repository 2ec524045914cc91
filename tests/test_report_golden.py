"""The report a save's analysis sends the editor, field by field (`tests/golden/reports/`).

For every example in examples/ (in eval and in training mode), every code generator case of
`tests/golden/models/`, a mixture of experts traced past its data-dependent op, and a few library models
of the tests' corpus, the analysis the language server runs on a save (`code=False`) is run again and
its report compared with the one recorded.  Whatever the analysis does to get there faster (a model built
without values, a repeated layer's work done once), the diagnostics, hovers, lenses and quick fixes made
from the report stay what they were.  `FUSELENS_UPDATE_GOLDEN=1 pytest tests/test_report_golden.py`
records the reports again (and removes recorded ones no case makes any more), to be read in the diff.

Normalised: the timings, the versions of torch and fuselens, and the folders a path starts with (the
model's own, the repository's, the installed packages').
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import sysconfig
from pathlib import Path

import pytest
from test_codegen_golden import CASES, EXAMPLES, MODELS, REPO
from test_weights import MOE

from fuselens.contracts.options import AnalyzeOptions
from fuselens.pipeline.analyze import analyze_file

from library_corpus import CORPUS

REPORTS = Path(__file__).resolve().parent / "golden" / "reports"
UPDATE = os.environ.get("FUSELENS_UPDATE_GOLDEN") == "1"

# Library models of the corpus, one of each kind: a decoder, experts looping over their tokens (a break
# and the run on real values past it), an encoder, a vision model.
LIBRARY = ["llama", "mixtral-eager-experts", "bert", "convnext"]


def plain_report(path: Path, options: AnalyzeOptions) -> str:
    """The save's report as JSON, with what differs from one run or machine to another left out."""
    data = analyze_file(str(path), options, code=False).to_dict()
    for name in ("torch_version", "tool_version"):
        data.pop(name)
    for model in data["models"]:
        model.pop("timings_ms")
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    folders = [
        (str(path.parent), "<model folder>"),
        (sysconfig.get_paths()["purelib"], "<site-packages>"),  # (before the repository: a venv may be in it)
        (str(REPO), "<repository>"),
    ]
    for folder, name in folders:
        text = text.replace(json.dumps(folder)[1:-1], name)
    return text


def recorded(golden: Path, text: str) -> None:
    """`text` is the recorded `golden` (or, under FUSELENS_UPDATE_GOLDEN=1, becomes it)."""
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        if not golden.exists() or golden.read_text(encoding="utf-8") != text:
            golden.write_text(text, encoding="utf-8")
        return
    assert golden.exists(), f"no {golden.relative_to(REPO)}: FUSELENS_UPDATE_GOLDEN=1 records it"
    before = golden.read_text(encoding="utf-8")
    if before != text:
        diff = difflib.unified_diff(
            before.splitlines(keepends=True), text.splitlines(keepends=True), golden.name, "analyzed now"
        )
        pytest.fail(f"the save's report differs from {golden.relative_to(REPO)}:\n{''.join(list(diff)[:80])}")


def example_copy(name: str, folder: Path) -> Path:
    shutil.copy(REPO / "examples" / "pyproject.toml", folder / "pyproject.toml")
    return Path(shutil.copy(REPO / "examples" / name, folder / name))


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_an_examples_report_is_the_recorded_one(name: str, train: bool, tmp_path):
    path = example_copy(name, tmp_path)
    mode = "train" if train else "eval"
    recorded(REPORTS / "examples" / f"{path.stem}.{mode}.json", plain_report(path, AnalyzeOptions(train=train)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_codegen_cases_report_is_the_recorded_one(name: str, tmp_path):
    inputs = CASES[name]
    path = Path(shutil.copy(MODELS / f"{name}.py", tmp_path / "model.py"))
    options = AnalyzeOptions(input_shapes=[s for s, _ in inputs], dtypes=[d for _, d in inputs])
    recorded(REPORTS / "cases" / f"{name}.json", plain_report(path, options))


# Experts chosen by a router whose constructor derives a buffer from its weights' values, and (the second)
# reads one of them in an `if`: what a run past `torch.where` routes where follows from those values.
ROUTED_BY_A_BUFFER = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Routed(nn.Module):  # fuselens: input=(64, 32)
    def __init__(self, dim=32, experts=4):
        super().__init__()
        self.router = nn.Linear(dim, experts)
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(experts))
        self.register_buffer("shift", self.router.weight.detach().mean(1) * 4.0){check}

    def forward(self, x):
        best = (self.router(x) + self.shift).argmax(-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            (rows,) = torch.where(best == e)
            out[rows] = F.gelu(expert(x[rows])) * 2.0
        return out
"""
READS_A_VALUE = """
        if float(self.shift.abs().max()) > 100.0:
            raise ValueError("a router initialised out of range")"""
ROUTED = {
    "moe": MOE.format(comment="  # fuselens: input=(64, 32)"),
    "moe-routed-by-a-buffer": ROUTED_BY_A_BUFFER.format(check=""),
    "moe-whose-constructor-reads-a-value": ROUTED_BY_A_BUFFER.format(check=READS_A_VALUE),
}


@pytest.mark.parametrize("name", sorted(ROUTED))
def test_a_report_traced_past_a_data_dependent_op_is_the_recorded_one(name: str, tmp_path):
    """The experts' shapes follow from the router's real values, in a run on them past `torch.where`."""
    path = tmp_path / "moe.py"
    path.write_text(ROUTED[name])
    text = plain_report(path, AnalyzeOptions())
    assert "traced past the data-dependent op" in text
    recorded(REPORTS / "routed" / f"{name}.json", text)


# An attention masked by a causal mask buffer small enough to be built with its values: the attention
# pattern reads it as causal from them.
SMALL_MASK = """
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):  # fuselens: input=(2, 64, 64)
    def __init__(self, dim=64, heads=4, block=64):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.register_buffer("mask", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        return (att @ v).transpose(1, 2).contiguous().view(b, t, c)
"""


def test_a_report_that_reads_a_mask_buffers_values_is_the_recorded_one(tmp_path):
    path = tmp_path / "attention.py"
    path.write_text(SMALL_MASK)
    text = plain_report(path, AnalyzeOptions())
    assert "is_causal=True" in text
    recorded(REPORTS / "small-mask.json", text)


@pytest.mark.slow
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CORPUS if c.id in LIBRARY])
def test_a_library_models_report_is_the_recorded_one(case, tmp_path):
    path = Path(case.write(str(tmp_path)))
    recorded(REPORTS / "library" / f"{case.id}.json", plain_report(path, AnalyzeOptions()))


def test_every_recorded_report_has_its_case():
    expected = {f"examples/{Path(n).stem}.{mode}.json" for n in EXAMPLES for mode in ("eval", "train")}
    expected |= {f"cases/{name}.json" for name in CASES} | {f"routed/{name}.json" for name in ROUTED}
    expected |= {f"library/{name}.json" for name in LIBRARY} | {"small-mask.json"}
    stale = sorted({str(p.relative_to(REPORTS)) for p in REPORTS.rglob("*.json")} - expected)
    if UPDATE:
        for name in stale:
            (REPORTS / name).unlink()
        return
    assert not stale, f"recorded reports of no case: {stale}"
