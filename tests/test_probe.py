"""`fuselens probe`: the sketches of each GEMM site on data, and the opportunities they show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from fuselens.contracts.options import AnalyzeOptions
from fuselens.contracts.plain import ContractError
from fuselens.contracts.probe import PROBE_VERSION, ProbeOptions, ProbeReport

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLANTED = os.path.join(REPO, "examples", "probe_planted.py")
COMMAND = [sys.executable, "-m", "fuselens.cli.main", "probe"]


def _line_of(path: str, snippet: str) -> int:
    with open(path, encoding="utf-8") as fh:
        return next(number for number, text in enumerate(fh, 1) if snippet in text)


def _probe(*args: str, cwd: str | None = None) -> tuple[subprocess.CompletedProcess, dict | None]:
    done = subprocess.run([*COMMAND, *args, "--json", "-"], capture_output=True, text=True, timeout=600, cwd=cwd)
    try:
        return done, json.loads(done.stdout)
    except json.JSONDecodeError:
        return done, None


def _sites(model: dict) -> dict[int, dict]:
    return {site["line"]: site for site in model["sites"]}


def _kinds(site: dict) -> list[str]:
    return [o["kind"] for o in site["opportunities"]]


def _role(site: dict, role: str) -> dict:
    return next(r for r in site["roles"] if r["role"] == role)


def test_each_planted_structure_is_found_at_its_own_line_and_the_plain_linear_gets_nothing():
    done, data = _probe(PLANTED, "--on", "cpu")
    assert done.returncode == 0, done.stderr
    ProbeReport.from_dict(data)  # the contract it claims to be
    (model,) = data["models"]
    assert model["data_source"].startswith("probe_batches()")
    sites = _sites(model)
    sparse, outlier = sites[_line_of(PLANTED, "self.sparse(")], sites[_line_of(PLANTED, "self.outlier(")]
    low, repeated = sites[_line_of(PLANTED, "self.low_rank(")], sites[_line_of(PLANTED, "self.repeated(")]
    plain = sites[_line_of(PLANTED, "self.plain(")]

    assert _kinds(sparse) == ["sparse-2:4"]
    assert _role(sparse, "input")["sparse_24_fraction"] == pytest.approx(1.0)
    assert sparse["opportunities"][0]["error"] == pytest.approx(0.0, abs=1e-6)  # already 2:4: pruning changes nothing

    assert _kinds(outlier) == ["quantize"]
    assert sorted(_role(outlier, "input")["outlier_channels"]) == [3, 17]
    (quantize,) = outlier["opportunities"]
    assert "per-channel" in quantize["summary"] and quantize["error"] < 0.015
    assert _role(outlier, "input")["int8_error"] > 3 * _role(outlier, "input")["int8_channel_error"]

    assert _kinds(low) == ["low-rank"]
    assert _role(low, "weight")["effective_rank"] == 16 and _role(low, "weight")["rank_of"] == 64
    assert low["opportunities"][0]["flops_saved"] > 0 and low["opportunities"][0]["error"] < 1e-3

    assert _kinds(repeated) == ["memoize"]
    assert repeated["calls"] == 8 and repeated["distinct_inputs"] == 1
    assert plain["distinct_inputs"] == 8

    assert _kinds(plain) == []
    assert not _role(plain, "input")["outlier_channels"] and _role(plain, "weight")["effective_rank"] > 32


def test_the_table_names_each_site_by_line_and_op():
    done = subprocess.run([*COMMAND, PLANTED, "--on", "cpu"], capture_output=True, text=True, timeout=600,
                          env=os.environ | {"COLUMNS": "200"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"probe_planted.py:{_line_of(PLANTED, 'self.outlier(')}" in done.stdout
    assert "low-rank" in done.stdout and "memoize" in done.stdout and "sparse-2:4" in done.stdout


def test_sketch_memory_does_not_grow_with_the_batches():
    import torch

    from fuselens.analysis.capture import UserCode
    from fuselens.analysis.probe.data import synthetic
    from fuselens.analysis.probe.run import probe_model
    from fuselens.contracts.config import InputSpec

    class TwoLayers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = torch.nn.Linear(64, 128), torch.nn.Linear(128, 32)

        def forward(self, x):
            h = torch.relu(self.up(x))
            return self.down(h)

    torch.manual_seed(0)
    model = TwoLayers()
    source = synthetic([InputSpec([16, 64], "float32")], "normal", 0)
    few = probe_model(model, source, 2, 1, "cpu", UserCode())
    many = probe_model(model, source, 40, 1, "cpu", UserCode())
    assert [s.calls for s in many.states] == [40, 40]
    assert [s.state_bytes() for s in few.states] == [s.state_bytes() for s in many.states]


def test_sampling_sketches_one_call_in_n():
    done, data = _probe(PLANTED, "--on", "cpu", "--sample-every", "4")
    assert done.returncode == 0, done.stderr
    site = _sites(data["models"][0])[_line_of(PLANTED, "self.plain(")]
    assert data["sample_every"] == 4 and site["calls"] == 8 and site["sampled"] == 2


LLAMA = """
from transformers import LlamaConfig, LlamaForCausalLM

config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
model = LlamaForCausalLM(config)  # fuselens: input=(2, 16) int64
"""


@pytest.mark.slow
def test_a_llama_model_is_probed_on_synthetic_inputs_from_the_cli(tmp_path):
    pytest.importorskip("transformers")
    path = tmp_path / "llama_model.py"
    path.write_text(textwrap.dedent(LLAMA))
    done, data = _probe(str(path), "--on", "cpu", "--batches", "3", cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    (model,) = data["models"]
    assert model["data_source"].startswith("synthetic normal inputs")
    linears = [s for s in model["sites"] if s["op"] == "linear" and s["file"].endswith("modeling_llama.py")]
    assert linears and all(s["library"] for s in linears)
    mlp = [s for s in linears if s["layers"] == 2]  # one line, called by both layers
    assert mlp and all(s["calls"] == 2 * 3 for s in mlp)


def _data_module(tmp_path, body: str) -> None:
    (tmp_path / "probe_data.py").write_text(textwrap.dedent(body))


@pytest.mark.parametrize(
    ("body", "function", "says"),
    [
        ("def batches():\n    raise RuntimeError('no such shard')\n", "batches", "raised RuntimeError: no such shard"),
        ("def batches():\n    yield 'text'\n", "batches", "batch 0 from probe_data:batches is a str, not a tensor"),
        ("def other():\n    return []\n", "batches", "probe_data has no batches"),
    ],
)
def test_a_bad_data_function_is_a_clear_message(tmp_path, body, function, says):
    _data_module(tmp_path, body)
    model = tmp_path / "model.py"
    with open(PLANTED, encoding="utf-8") as fh:
        model.write_text(fh.read())
    done, _ = _probe(str(model), "--on", "cpu", "--data", f"probe_data:{function}", cwd=str(tmp_path))
    assert done.returncode == 1
    assert says in done.stderr


def test_a_data_module_that_does_not_exist_is_named(tmp_path):
    done, _ = _probe(PLANTED, "--on", "cpu", "--data", "no_such_pkg.data:batches", cwd=str(tmp_path))
    assert done.returncode == 1 and "cannot import no_such_pkg.data" in done.stderr


def test_settings_name_the_data_function_and_the_sampling(tmp_path):
    _data_module(tmp_path, """
        import torch

        def batches():
            for i in range(3):
                yield torch.randn(32, 64), torch.zeros(8, 64)
    """)  # fmt: skip
    settings = '[tool.fuselens]\nprobe-data = "probe_data:batches"\nprobe-sample-every = 3\n'
    (tmp_path / "pyproject.toml").write_text(settings)
    model = tmp_path / "model.py"
    with open(PLANTED, encoding="utf-8") as fh:
        model.write_text(fh.read())
    done, data = _probe(str(model), "--on", "cpu", cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    (probed,) = data["models"]
    assert "[tool.fuselens] probe-data" in probed["data_source"] and probed["batches"] == 3
    assert data["sample_every"] == 3 and all(site["sampled"] == 1 for site in probed["sites"])


def test_the_engine_runs_synthetic_inputs_of_the_declared_shapes_without_data(tmp_path):
    from fuselens.pipeline.probe import probe_file

    model = tmp_path / "model.py"
    with open(PLANTED, encoding="utf-8") as fh:
        model.write_text(fh.read().replace("def probe_batches", "def other_batches"))
    report = probe_file(str(model), AnalyzeOptions(), ProbeOptions(synthetic="sparse", batches=2, device="cpu"))
    (probed,) = report.models
    assert probed.data_source.startswith("synthetic sparse inputs") and "(32, 64)" in probed.data_source
    plain = next(s for s in probed.sites if s.line == _line_of(PLANTED, "self.plain("))
    assert next(r for r in plain.roles if r.role == "input").zero_fraction == pytest.approx(0.9, abs=0.05)


def test_a_report_of_a_later_probe_version_is_refused_by_name():
    report = ProbeReport("model.py", "cpu", 1)
    assert ProbeReport.from_dict(report.to_dict()) == report
    with pytest.raises(ContractError, match="probe_version"):
        ProbeReport.from_dict(report.to_dict() | {"probe_version": PROBE_VERSION + 1})


OPS = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Mixed(nn.Module):  # fuselens: input=(2, 8, 16) float32
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(8, 8, 3, padding=1)
        self.mix = nn.Parameter(torch.randn(16, 16))
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        h = self.conv(x)
        h = torch.einsum("bcd,de->bce", h, self.mix)
        h = torch.bmm(h, h.transpose(1, 2))
        h = h @ x
        return x + 0.001 * F.gelu(x) + self.proj(h) * 1e-4
"""

RESIDUAL = """
import torch
import torch.nn as nn


class Nearly(nn.Module):  # fuselens: input=(4, 32) float32
    def __init__(self):
        super().__init__()
        self.branch = nn.Linear(32, 32)
        self.full = nn.Linear(32, 32)
        with torch.no_grad():
            self.branch.weight.mul_(1e-3)
            self.branch.bias.zero_()

    def forward(self, x):
        x = x + self.branch(x)
        return x + self.full(x)
"""


def test_every_gemm_op_is_a_site_at_its_line(tmp_path):
    from fuselens.pipeline.probe import probe_file

    path = tmp_path / "mixed.py"
    path.write_text(OPS)
    report = probe_file(str(path), AnalyzeOptions(), ProbeOptions(batches=2, device="cpu"))
    (probed,) = report.models
    assert probed.problem == ""
    text = OPS.splitlines()
    found = {(s.op, text[s.line - 1].strip().split(" = ")[-1][:12]) for s in probed.sites}
    assert found == {
        ("conv1d", "self.conv(x)"),
        ("einsum", "torch.einsum"),
        ("bmm", "torch.bmm(h,"),
        ("matmul", "h @ x"),
        ("linear", "return x + 0"),
    }


def test_a_residual_branch_that_barely_moves_the_stream_is_near_the_identity(tmp_path):
    from fuselens.pipeline.probe import probe_file

    path = tmp_path / "nearly.py"
    path.write_text(RESIDUAL)
    report = probe_file(str(path), AnalyzeOptions(), ProbeOptions(batches=2, device="cpu"))
    sites = {RESIDUAL.splitlines()[s.line - 1].strip(): s for s in report.models[0].sites}
    branch, full = sites["x = x + self.branch(x)"], sites["return x + self.full(x)"]
    assert [o.kind for o in branch.opportunities] == ["near-identity"]
    assert branch.residual_ratio is not None and branch.residual_ratio < 0.01
    assert full.residual_ratio is not None and full.residual_ratio > 0.1 and full.opportunities == []
