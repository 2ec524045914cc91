"""`fuselens profile`: measured time attributed to lines, clusters and opaque ops.

On a CPU the profile measures each op's own CPU time, through the same attribution the GPU's kernel
times go through: every torch call of the model runs in a profiler range of its own, and each op
counts once, in the innermost range around it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fuselens.contracts.options import AnalyzeOptions, ProfileOptions
from fuselens.contracts.profile import PROFILE_VERSION
from fuselens.pipeline.profile import profile_file

from conftest import example

pytest.importorskip("torch")

FAST = ProfileOptions(iterations=2, warmup=1, device="cpu")


def _llama():
    report = profile_file(
        example("llama_block.py"),
        AnalyzeOptions(input_shapes=["2,32,1024"], dtypes=["float32"], param_dtype="float32"),
        FAST,
    )
    (model,) = report.profile.models
    return report, model


def _line_of(path: str, snippet: str) -> int:
    with open(path, encoding="utf-8") as fh:
        return next(i for i, text in enumerate(fh, 1) if snippet in text)


def _analyzed(report):
    return next(m for m in report.models if m.status == "analyzed")


def test_every_microsecond_is_attributed_once_and_the_model_code_gets_almost_all():
    _, model = _llama()
    assert model.problem == "" and model.forward_us > 0
    assert model.attributed_us + model.unattributed_us == pytest.approx(model.forward_us, rel=1e-6)
    assert model.attributed_us >= 0.95 * model.forward_us
    # Lines are exclusive: together they are the attributed time, and so are clusters plus opaque ops.
    assert sum(line.us for line in model.lines) == pytest.approx(model.attributed_us, rel=1e-3)
    inside = sum(c.us for c in model.clusters) + sum(o.us for o in model.opaque)
    assert inside == pytest.approx(model.attributed_us, rel=1e-3)
    assert [line.us for line in model.lines] == sorted((line.us for line in model.lines), reverse=True)


def test_lines_name_their_ops_and_clusters_and_gemms_stay_opaque():
    report, model = _llama()
    with open(example("llama_block.py"), encoding="utf-8") as fh:
        source = fh.read().splitlines()
    by_line = {line.line: line for line in model.lines if line.file == report.file}

    def at(snippet: str):
        return by_line[next(i for i, text in enumerate(source, 1) if snippet in text)]

    # RMSNorm's body runs for both norms: its lines hold both norm clusters.
    norm = at("h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)")
    norms = {c.id for c in _analyzed(report).clusters if any(op.line == norm.line for op in c.ops)}
    assert set(norm.clusters) >= norms and len(norms) == 2
    assert at("up = self.w_up(h)").ops == ["linear"] and at("up = self.w_up(h)").clusters == []
    # (the gate's projection starts the SwiGLU cluster: its time is that cluster's)
    swiglu = next(c.id for c in _analyzed(report).clusters if c.op_chain == "linear → silu → mul")
    assert at("gate = self.w_gate(h)").ops == ["linear"] and at("gate = self.w_gate(h)").clusters == [swiglu]
    assert "GEMM" in {o.kind for o in model.opaque}
    gemm = next(o for o in model.opaque if o.kind == "GEMM")
    assert "linear" in gemm.ops and "matmul" in gemm.ops
    # Every cluster of the report ran, and its measured time leads to an Amdahl bound above 1.
    assert {c.id for c in model.clusters} == {c.id for c in _analyzed(report).clusters}
    for c in model.clusters:
        assert c.us > 0 and c.calls > 0 and c.predicted_fused_us < c.us and c.amdahl_speedup > 1.0
    assert sorted(c.rank_by_time for c in model.clusters) == list(range(1, len(model.clusters) + 1))
    assert sorted(c.rank_by_bytes for c in model.clusters) == list(range(1, len(model.clusters) + 1))


REPEATED = """
import torch, torch.nn as nn, torch.nn.functional as F


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(256, 256)

    def forward(self, x):
        return x + F.gelu(self.proj(x)) * 0.5


class Net(nn.Module):  # fuselens: input=(64, 256)
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
"""


def test_a_line_of_repeated_layers_sums_their_calls_under_one_cluster(write_model):
    path = write_model(REPEATED)
    report = profile_file(path, AnalyzeOptions(), FAST)
    (model,) = report.profile.models
    (cluster,) = _analyzed(report).clusters
    assert cluster.multiplicity == 3
    body = next(line for line in model.lines if line.line == _line_of(path, "return x + F.gelu"))
    assert body.calls == 3 * 4  # linear, gelu, mul, add in each of three layers
    assert body.clusters == [cluster.id]
    (timed,) = model.clusters
    assert timed.id == cluster.id and timed.calls == 3 * 4  # linear, gelu, mul, add: the cluster's ops


LIBRARY = """
import torch
import torch.nn as nn
from transformers import LlamaConfig, LlamaModel


class Wrapper(nn.Module):  # fuselens: input=(1, 16) int64
    def __init__(self):
        super().__init__()
        config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
        self.model = LlamaModel(config)

    def forward(self, ids):
        return self.model(input_ids=ids).last_hidden_state
"""


def test_a_library_model_is_attributed_to_the_library_lines_and_the_users_line_that_reached_them(write_model):
    pytest.importorskip("transformers")
    path = write_model(LIBRARY)
    report = profile_file(path, AnalyzeOptions(), FAST)
    (model,) = report.profile.models
    # Most of the time, not a share: the few calls that record no op (about 0.4% of the forward on
    # an idle machine) take longer under load, while every op's time lands on a line.
    assert model.problem == "" and model.attributed_us > 0.5 * model.forward_us
    library = [line for line in model.lines if line.library]
    assert library and all("transformers" in line.file for line in library)
    assert {line.entry_line for line in library} == {_line_of(path, "return self.model(input_ids=ids)")}
    assert any(line.clusters for line in library)


def test_the_cli_prints_the_ranking_and_writes_a_versioned_profile_section(tmp_path):
    out = tmp_path / "profile.json"
    cmd = [sys.executable, "-m", "fuselens.cli.main", "profile", example("example_net.py"), "--on", "cpu",
           "--iterations", "2", "--warmup", "1", "--json", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=os.environ | {"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert "lines by time" in done.stdout and "clusters by measured time" in done.stdout
    assert "attributed to the model's code" in done.stdout
    data = json.loads(out.read_text())
    assert data["profile"]["version"] == PROFILE_VERSION and data["profile"]["mode"] == "cpu"
    (model,) = data["profile"]["models"]
    assert model["lines"] and model["forward_us"] > 0


def test_an_applied_file_is_profiled_beside_the_code_before_apply(tmp_path, monkeypatch):
    """After `fuselens apply`, each kernel's time counts on the line that calls it, and the code the
    kernel module keeps is profiled in the same run: every applied kernel is set beside its cluster's
    time before and the time the cost model predicted.  On a CPU no kernel fits a call: the lines they
    stand in for run as written, and the profile says so instead of grading the cost model on them."""
    import shutil

    from fuselens.pipeline.apply import apply_file

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # a plain CPU: no kernel can run
    path = str(tmp_path / "example_net.py")
    shutil.copy(example("example_net.py"), path)
    options = AnalyzeOptions(input_shapes=["256,1024"], dtypes=["float32"])
    apply_file(path, options, None, lambda _: True)
    report = profile_file(path, options, FAST)
    (model,) = report.profile.models
    assert model.before_us is not None and model.before_us > 0
    assert model.applied == [] and model.kernels == {} and model.cost_model_error == {}
    assert model.fell_back == ["cluster0", "cluster1", "cluster2"]
    # the lines kept for where the kernel does not fit ran, and their time is theirs
    kept = next(line for line in model.lines if line.line == _line_of(path, "    x = F.relu(x)"))
    assert kept.file == path and kept.ops == ["relu"] and kept.us > 0

    # In the Triton interpreter (set before Triton is imported: a process of its own) the kernels fit the
    # calls and run: their time counts on the calling line.
    out = tmp_path / "profile.json"
    cmd = [sys.executable, "-m", "fuselens.cli.main", "profile", path, "--on", "cpu", "--input-shape", "16,1024",
           "--iterations", "1", "--warmup", "1", "--json", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=os.environ | {"TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr
    (model,) = json.loads(out.read_text())["profile"]["models"]
    assert [(a["kernel"], a["cluster"], a["reference"]) for a in model["applied"]] == [
        ("cluster0", "c0", False),
        ("cluster1", "c1", False),
        ("cluster2", "c2", False),
    ]
    assert model["fell_back"] == []
    call = next(line for line in model["lines"] if line["line"] == _line_of(path, "= cluster0("))
    assert call["ops"] == ["cluster0"] and call["us"] == pytest.approx(model["kernels"]["cluster0"])


def test_a_training_step_gives_each_backward_op_to_the_forward_call_that_made_it():
    """The backward runs in autograd's engine, outside the calls' ranges; each of its ops is counted
    for the forward call whose op made its autograd node."""
    report = profile_file(
        example("llama_block.py"),
        AnalyzeOptions(input_shapes=["2,32,1024"], dtypes=["float32"], param_dtype="float32", train=True),
        ProfileOptions(iterations=2, warmup=1, device="cpu", train=True),
    )
    assert report.profile.step == "training step"
    (model,) = report.profile.models
    assert 0 < model.backward_us < model.forward_us
    assert model.attributed_us >= 0.95 * model.forward_us
    assert sum(line.backward_us for line in model.lines) == pytest.approx(model.backward_us, rel=1e-3)
    # Every cluster's ops have gradients to compute: the norms' weights, q and k through RoPE and
    # the softmax, SwiGLU's gate and up projections.
    assert {c.id for c in model.clusters} == {c.id for c in _analyzed(report).clusters}
    for c in model.clusters:
        assert 0 < c.backward_us < c.us, c
    gate = next(line for line in model.lines if line.ops == ["linear"])
    assert gate.backward_us > 0  # a GEMM's backward: two more GEMMs


def test_the_profile_is_a_results_view_with_its_lines_and_a_chart_of_clusters_and_opaque_ops():
    """The panel, markdown and page a validation shows in show a profile too: its lines by time as
    the table, and a bar per cluster (beside its predicted fused time) and per kind of op outside."""
    from fuselens.contracts.profile_view import profile_view, time_text
    from fuselens.contracts.results_view import view_markdown

    report, model = _llama()
    view = profile_view(report.file, report.profile)
    assert view.kind == "profile" and view.columns[:3] == ["line", "time", "% of the forward"]
    (shown,) = view.models
    assert [row[0] for row in shown.rows] == [f"llama_block.py:{line.line}" for line in model.lines[: len(shown.rows)]]
    measured, predicted = shown.chart["data"]
    assert measured["x"] == [c.id for c in model.clusters] + [o.kind for o in model.opaque]
    assert measured["y"][0] == pytest.approx(model.clusters[0].us / 1000)
    assert predicted["x"] == [c.id for c in model.clusters]
    assert shown.whole_model.startswith(f"{time_text(model.forward_us)} per forward, ")
    text = view_markdown(view)
    assert text.startswith("### LlamaBlock at 2×32×1024: where the time of a forward goes"), text[:200]
    assert "| line | time |" in text


# ---- a CPU profile is bounded by default ------------------------------------------------------------

_INSTALLED = os.path.join(os.path.dirname(sys.executable), "fuselens")
COMMAND = [_INSTALLED] if os.path.exists(_INSTALLED) else [sys.executable, "-m", "fuselens.cli.main"]

# Runs the command given in its arguments and prints the peak resident memory of that process (its only
# child), in bytes.
_PEAK_RSS = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], stdin=subprocess.DEVNULL)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print("peak-rss", peak if sys.platform == "darwin" else peak * 1024)
sys.exit(done.returncode)
"""


def _peak_rss(*args: str, cwd=None) -> tuple[subprocess.CompletedProcess, int]:
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, *COMMAND, *args], capture_output=True, text=True, cwd=cwd, timeout=900
    )
    peak = next(int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("peak-rss "))
    return done, peak


@pytest.mark.slow
def test_profiling_the_llama_example_on_a_cpu_stays_within_its_memory_bound(tmp_path):
    """The README's `fuselens profile examples/llama_block.py` on a CPU: its inputs (4, 2048, 1024) in
    bf16 took 18.5 GB and 97 s; the profile now runs it at smaller inputs with the same clusters, and
    says so."""
    out = tmp_path / "profile.json"
    done, peak = _peak_rss("profile", example("llama_block.py"), "--on", "cpu", "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert peak < 2 * 2**30, f"peak RSS {peak / 2**30:.1f} GiB"
    said = " ".join(done.stdout.split())
    assert (
        "profiled at (2, 256, 1024), not the analyzed (4, 2048, 1024): on a CPU a forward moves at most 256 MB" in said
    )
    (model,) = json.loads(out.read_text())["profile"]["models"]
    assert model["inputs"] == [[2, 256, 1024]] and model["cpu_budget_bytes"] == 256 * 2**20
    assert {c["id"] for c in model["clusters"]} == {f"c{k}" for k in range(7)}  # every cluster measured


def test_full_size_profiles_a_cpu_at_the_analyzed_shapes(tmp_path):
    out = tmp_path / "profile.json"
    cmd = ["profile", example("example_net.py"), "--on", "cpu", "--iterations", "1", "--warmup", "0"]
    done = subprocess.run([*COMMAND, *cmd, "--full-size", "--json", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    (model,) = json.loads(out.read_text())["profile"]["models"]
    assert model["inputs"] == [[16384, 1024]] and model["cpu_budget_bytes"] is None
    assert "profiled at" not in done.stdout


HUGE = """
import torch


class Huge(torch.nn.Module):  # fuselens: input=(8, 32768) float32
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(32768, 49152, bias=False)  # 6 GiB of weights

    def forward(self, x):
        return torch.relu(self.proj(x) * 2.0)
"""


def test_a_model_too_large_for_a_cpu_is_refused_before_its_weights_are_made(write_model):
    done, peak = _peak_rss("profile", write_model(HUGE), "--on", "cpu")
    assert done.returncode == 1, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert "its forward moves 6.0 GB even at (2, 32768), the smallest inputs that keep its clusters" in said, said
    assert "pass --full-size to profile it here anyway" in said
    assert peak < 2**30  # the 6 GiB of weights were never made


NESTED = """
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):  # fuselens: input=(2, seq, 32) dims=seq:1..64
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(32)

    def forward(self, x):
        return F.gelu(self.norm(x)) * 2.0


class Outer(nn.Module):  # fuselens: input=(2, 16, 32)
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return self.block(x[:, :7]).sum(1) + self.block(x).sum(1)
"""


def _profile_saving_corpus(tmp_path, source: str) -> tuple[subprocess.CompletedProcess, dict]:
    path = tmp_path / "nested.py"
    path.write_text(source)
    out = tmp_path / "profile.json"
    args = ["profile", str(path), "--on", "cpu", "--full-size", "--iterations", "1", "--warmup", "0"]
    done = subprocess.run(
        [sys.executable, "-m", "fuselens.cli.main", *args, "--save-corpus", "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200"},
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done, {m["name"]: m["sizes_seen"] for m in json.loads(out.read_text())["profile"]["models"]}


def test_the_sizes_a_profile_sees_are_printed_as_the_corpus_where_the_source_declares_them(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("# the project's own settings\n[tool.black]\nline-length = 100\n")
    before = pyproject.read_bytes()
    done, seen = _profile_saving_corpus(tmp_path, NESTED)
    # The block at its own binding (the middle of its default corpus), and at the two sizes Outer calls it at.
    assert seen == {"Block": {"seq": [7, 8, 16]}, "Outer": {}}
    assert "sizes seen: seq = 7, 8, 16" in done.stdout
    assert "[tool.fuselens.models.Block]\ndims = { seq = { min = 1, max = 64, corpus = [7, 8, 16] } }" in done.stdout
    assert "its sizes are not declared in a pyproject.toml" in " ".join(done.stdout.split())
    assert pyproject.read_bytes() == before  # the model's source and an unrelated pyproject are left as they were


PYPROJECT_DIMS = """# the project's own settings
[tool.black]
line-length = 100  # as the team agreed

[tool.fuselens.models.Block]
inputs = [[2, "seq", 32]]
dims = { seq = { min = 1, max = 64, corpus = [1, 64] } }  # the lengths we serve
"""


def test_the_sizes_a_profile_sees_become_the_corpus_in_the_pyproject_that_declares_them(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(PYPROJECT_DIMS)
    done, seen = _profile_saving_corpus(
        tmp_path, NESTED.replace(" dims=seq:1..64", "").replace("input=(2, seq, 32) ", "")
    )
    assert seen["Block"] == {"seq": [7, 16, 64]}  # (its binding now the middle of the corpus declared: 64)
    assert f"corpus seen for Block saved in {pyproject}" in " ".join(done.stdout.split())
    # Only the corpus changed: the comments, the other tables and the layout are the user's.
    assert pyproject.read_text() == PYPROJECT_DIMS.replace("corpus = [1, 64]", "corpus = [7, 16, 64]")
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".pyproject-")]  # nothing half written left
