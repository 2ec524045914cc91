"""Dynamic shapes: sizes declared as named ranges, answered as expressions and at each size of a corpus.

Declarations are read from every place a model's inputs can be given (pyproject.toml, the class-line
comment, the editor's settings, `--dim`); the analysis runs at one binding and adds expressions of the
declared sizes, the guards the model puts on them, and per-size rows.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fuselens.analysis.config import Source, resolve
from fuselens.contracts.config import ConfigError, from_comment, model_settings
from fuselens.contracts.dims import default_corpus
from fuselens.contracts.dynamic import ExpressionError, evaluate
from fuselens.contracts.options import AnalyzeOptions
from fuselens.contracts.plain import ContractError
from fuselens.contracts.report import SCHEMA_VERSION, Report
from fuselens.contracts.schema import validate_report
from fuselens.pipeline.analyze import analyze_file

from conftest import example
from lsp_helpers import Client, server_fixture


def _resolved(entry: dict, where: str = "pyproject.toml [tool.fuselens.models.Block]"):
    return resolve([Source(where, model_settings(entry, where))])


# ---- declarations ------------------------------------------------------------------------------


def test_pyproject_table_binds_the_inputs_at_the_middle_of_each_corpus():
    config = _resolved(
        {
            "inputs": [["batch", "seq", 4096]],
            "dims": {"batch": {"min": 1, "max": 64}, "seq": {"min": 1, "max": 8192, "corpus": [1, 128, 2048, 8192]}},
        }
    )
    (spec,) = config.inputs
    assert spec.symbols == ["batch", "seq", None]
    assert spec.shape == [config.dims["batch"].binding, 2048, 4096]
    assert config.dims["seq"].corpus == [1, 128, 2048, 8192]
    assert config.dims["batch"].corpus == default_corpus(1, 64) == [1, 2, 8, 32, 64]


def test_comment_declares_inputs_and_dims_in_one_line():
    settings = from_comment(
        "class Block(nn.Module):  # fuselens: input=(4, seq, 1024) bfloat16 dims=seq:1..8192@1,128,2048,8192",
        "the inline comment on line 3",
    )
    assert settings is not None and settings.inputs is not None
    assert settings.inputs[0].dtype == "bfloat16"
    assert settings.inputs[0].symbols == [None, "seq", None]
    assert settings.dims["seq"].corpus == [1, 128, 2048, 8192]


def test_several_dims_in_a_comment_are_separated_by_semicolons():
    settings = from_comment("# fuselens: input=(batch, seq) dims=batch:1..64;seq:1..4096", "c")
    assert settings is not None
    assert sorted(settings.dims) == ["batch", "seq"]
    assert settings.dims["seq"].corpus == default_corpus(1, 4096)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"inputs": [["seq", 64]], "dims": {"sq": {"min": 1, "max": 8}}}, "unknown symbol 'sq'"),
        ({"inputs": [["seq", 64]], "dims": {"seq": {"min": 9, "max": 8}}}, "seq has min 9 > max 8"),
        (
            {"inputs": [["seq", 64]], "dims": {"seq": {"min": 1, "max": 8, "corpus": [1, 16]}}},
            "seq.corpus has 16 outside its range 1..8",
        ),
        ({"inputs": [["seq", 64]]}, "names 'seq', whose range is not declared"),
        ({"inputs": [["seq", 64]], "dims": {"seq": {"min": 0, "max": 8}}}, "seq.min must be a positive integer"),
        ({"inputs": [["seq", 64]], "dims": {"seq": {"min": 1, "max": 8, "step": 2}}}, "unknown key 'step'"),
    ],
)
def test_bad_declarations_say_what_is_wrong_and_where(entry, message):
    with pytest.raises(ConfigError) as caught:
        _resolved(entry)
    assert message in str(caught.value)
    assert "pyproject.toml" in str(caught.value)


@pytest.mark.parametrize(
    ("comment", "message"),
    [
        ("input=(4, n) dims=n:1..x", "'x' in 'n:1..x' is not an integer"),
        ("input=(4, n) dims=n=1..8", "must look like seq:1..8192@1,128,2048,8192"),
        ("input=(4, n) dims=n:1..8;n:2..4", "n is declared twice"),
    ],
)
def test_bad_declarations_in_a_comment_name_the_line(comment, message):
    with pytest.raises(ConfigError) as caught:
        from_comment(f"class Block(nn.Module):  # fuselens: {comment}", "the inline comment on line 5")
    assert str(caught.value).startswith("the inline comment on line 5: ") and message in str(caught.value)


def test_sizes_are_listed_as_the_shapes_name_them():
    sources = [
        Source("--dim", model_settings({"dims": {"batch": {"min": 1, "max": 64}}}, "--dim")),
        Source("p", model_settings({"inputs": [["seq", "batch", 8]], "dims": {"seq": {"min": 1, "max": 8}}}, "p")),
    ]
    assert list(resolve(sources).dims) == ["seq", "batch"]


def test_dims_declared_for_other_inputs_than_those_analyzed_are_left_aside():
    table = Source(
        "pyproject.toml", model_settings({"inputs": [["seq", 64]], "dims": {"seq": {"min": 1, "max": 8}}}, "p")
    )
    cli = Source("--input-shape", model_settings({"inputs": [[4, 64]]}, "--input-shape"))
    config = resolve([cli, table])
    assert config.inputs is not None and config.inputs[0].shape == [4, 64]
    assert config.dims == {}


# ---- a Llama-style block with a dynamic sequence length, through the command line ------------------------

LLAMA_TABLE = """
[tool.fuselens.models.LlamaBlock]
inputs = [[2, "seq", 256]]
dims = {{ seq = {{ min = 1, max = {max_seq}, corpus = {corpus} }} }}
dtype = "bfloat16"
param_dtype = "bfloat16"
init = {{ dim = 256, n_heads = 4, hidden = 512, max_len = 2048 }}
"""


def fuselens(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "fuselens.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        env=env,
    )


def llama_project(folder: Path, max_seq: int = 2048, corpus: str = "[1, 128, 1024, 2048]") -> Path:
    """The Llama-style example block, with a RoPE cache of 2048 rows, and its sequence length declared dynamic."""
    path = folder / "llama.py"
    shutil.copy(example("llama_block.py"), path)
    (folder / "pyproject.toml").write_text(LLAMA_TABLE.format(max_seq=max_seq, corpus=corpus))
    return path


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_llama_block_costs_are_expressions_of_seq_in_the_json(tmp_path):
    path = llama_project(tmp_path)
    out = tmp_path / "report.json"
    done = fuselens("analyze", str(path), "--model-class", "LlamaBlock", "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    validate_report(data)
    (model,) = data["models"]
    dynamic = model["dynamic"]
    assert dynamic["symbolic"] and dynamic["binding"] == {"seq": 1024}
    assert [p["seq"] for p in dynamic["points"]] == [1, 128, 1024, 2048]
    by_id = {c["id"]: c for c in model["clusters"]}
    for entry in dynamic["clusters"]:
        assert entry["symbolic"], entry["note"]
        cluster = by_id[entry["cluster"]]
        # Expressions in the declared size, kept as trees, that give the concrete analysis at its binding.
        assert "seq" in entry["bytes_unfused"]["text"] and "seq" in json.dumps(entry["bytes_fused"]["tree"])
        assert evaluate(entry["bytes_unfused"]["tree"], {"seq": 1024}) == cluster["bytes_unfused"]
        assert evaluate(entry["bytes_fused"]["tree"], {"seq": 1024}) == cluster["bytes_fused"]
        for point in entry["points"]:
            assert point["bytes_fused"] == evaluate(entry["bytes_fused"]["tree"], point["binding"])
    softmax = next(
        e for e in dynamic["clusters"] if any(op["target"] == "softmax" for op in by_id[e["cluster"]]["ops"])
    )
    assert softmax["bytes_fused"]["tree"] == ["*", 32, ["**", "seq", 2]]  # 2 × 4 heads × seq² × bf16, in and out
    # The attention scores' softmax is launch-bound at short sequences and DRAM-bound at long ones: said where.
    assert softmax["points"][0]["regime"] == "launch-bound"
    assert softmax["points"][-1]["regime"] == "dram-bound"
    assert any(c["below"] == "launch-bound" and 128 < c["at"] <= 1024 for c in softmax["changes"])
    patterns = {p["name"]: p for p in dynamic["patterns"]}
    assert patterns["attention"]["symbolic"] and "seq**2" in patterns["attention"]["bytes_before"]["text"]


def test_llama_block_table_has_a_row_per_sequence_length_and_the_rope_guard_at_its_line(tmp_path):
    path = llama_project(tmp_path)
    done = fuselens("analyze", str(path), "--model-class", "LlamaBlock")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "dynamic sizes: seq = 1..2048 at 1, 128, 1024, 2048 (analyzed at seq = 1024)" in out
    rope = line_of(path, "cos = self.cos_cached[:s]")
    assert f"guard seq <= 2048 (llama.py:{rope}: cos = self.cos_cached[:s])" in out
    table = out[out.index("per shape") :]
    rows = [line for line in table.splitlines() if ("→" in line and "launch-bound" in line) or "dram-bound" in line]
    assert len(rows) >= 4
    assert "c3 bytes: 192*seq**2 → 32*seq**2" in out
    assert "c3 is launch-bound below seq = " in out


def test_a_range_beyond_the_rope_cache_is_refused_at_the_slicing_line(tmp_path):
    path = llama_project(tmp_path, max_seq=8192, corpus="[1, 128, 2048, 8192]")
    out = tmp_path / "report.json"
    done = fuselens("analyze", str(path), "--model-class", "LlamaBlock", "--json", str(out))
    assert done.returncode == 1
    rope = line_of(path, "cos = self.cos_cached[:s]")
    assert f"llama.py:{rope}" in done.stdout
    assert "seq = 1..8192" in done.stdout and "goes beyond what the model allows: seq <= 2048" in done.stdout
    assert "the model runs at seq = 1..2048" in done.stdout
    (model,) = json.loads(out.read_text())["models"]
    assert model["status"] == "error" and model["problem"]["line"] == rope
    # The same range from the command line is refused the same way, naming where it came from.
    done = fuselens("analyze", str(path), "--model-class", "LlamaBlock", "--dim", "seq=1..4096")
    assert done.returncode == 1 and "seq = 1..4096 (--dim)" in done.stdout and f"llama.py:{rope}" in done.stdout
    # Analyzed at a size past the cache (the corpus's middle, 4096), the trace itself fails: the refusal
    # is still the bound's, found by a trace at small sizes, not the shape mismatch it leads to.
    done = fuselens("analyze", str(path), "--model-class", "LlamaBlock", "--dim", "seq=1..8192@1,128,4096,8192")
    assert done.returncode == 1
    assert f"llama.py:{rope} seq = 1..8192 (--dim) goes beyond what the model allows: seq <= 2048" in done.stdout
    assert "must match" not in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dim", "sq=1..64"], "--dim: unknown symbol 'sq'"),
        (["--dim", "seq=64..8"], "--dim: seq has min 64 > max 8"),
        (["--dim", "seq=1..64@1,128"], "--dim: seq.corpus has 128 outside its range 1..64"),
        (["--dim", "seq=1-64"], "needs a range min..max"),
        (["--input-shape", "2,len,256"], "the input shape names 'len', whose range is not declared"),
    ],
)
def test_bad_declarations_on_the_command_line_are_refused_clearly(tmp_path, args, message):
    path = llama_project(tmp_path)
    done = fuselens("analyze", str(path), "--model-class", "LlamaBlock", *args)
    assert done.returncode != 0
    assert message in done.stdout + done.stderr


# ---- through the engine --------------------------------------------------------------------------------

VISION = """
import torch.nn as nn
import torch.nn.functional as F


class ResBlock(nn.Module):
    def __init__(self, channels: int = 32, emb_dim: int = 64, groups: int = 8):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, channels)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.emb = nn.Linear(emb_dim, channels)
        self.norm2 = nn.GroupNorm(groups, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x, t):
        h = F.silu(self.norm1(x))
        h = self.conv1(h)
        e = self.emb(F.silu(t))
        h = h + e[:, :, None, None]
        h = F.silu(self.norm2(h))
        h = self.conv2(h)
        return (x + h) * 0.7071
"""


def test_a_vision_block_with_a_dynamic_resolution_costs_in_res_squared(tmp_path):
    path = tmp_path / "vision.py"
    path.write_text(VISION)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.fuselens.models.ResBlock]\ninputs = [[2, 32, "res", "res"], [2, 64]]\n'
        "dims = { res = { min = 8, max = 256 } }\n"
    )
    report = analyze_file(str(path))
    (model,) = report.models
    dynamic = model.dynamic
    assert dynamic is not None and dynamic.symbolic
    assert [s.used_by for s in dynamic.sizes] == [["x[2]", "x[3]"]]
    assert [p["res"] for p in dynamic.points] == default_corpus(8, 256) == [8, 16, 64, 128, 256]
    assert model.inputs[0].shape == [2, 32, 64, 64]  # the analysis binding: the middle of the corpus
    for entry, cluster in zip(dynamic.clusters, model.clusters, strict=True):
        assert entry.cluster == cluster.id and entry.symbolic
        assert entry.bytes_unfused is not None and entry.bytes_fused is not None
        # A GroupNorm's view regroups H×W: the sizes stay a polynomial in res, no division left.
        assert "res**2" in entry.bytes_fused.text and "//" not in entry.bytes_fused.text
        assert entry.bytes_fused.at({"res": 64}) == cluster.bytes_fused
        assert [p.bytes_fused for p in entry.points] == [entry.bytes_fused.at(p) for p in dynamic.points]
    first = dynamic.clusters[0]
    assert first.points[0].regime == "launch-bound" and first.points[-1].regime != "launch-bound"
    assert first.changes and first.changes[0].size == "res"
    assert Report.from_dict(report.to_dict()).models[0].dynamic == dynamic


def test_a_model_whose_sizes_cannot_be_followed_is_analyzed_again_at_each_point(tmp_path):
    path = tmp_path / "gated.py"
    path.write_text(
        textwrap.dedent(
            """\
            import torch
            import torch.nn as nn


            class Gated(nn.Module):  # fuselens: input=(4, n) dims=n:16..4096@16,256,4096
                def forward(self, x):
                    if x.mean() > 0:
                        x = x * 2
                    return torch.relu(x) + 1
            """
        )
    )
    (model,) = analyze_file(str(path)).models
    dynamic = model.dynamic
    assert dynamic is not None and not dynamic.symbolic
    assert "reads a value" in dynamic.note and "gated.py:7" in dynamic.note
    assert dynamic.clusters
    for entry in dynamic.clusters:
        assert not entry.symbolic and "the analysis at each point" in entry.note
        assert entry.bytes_fused is None
        fused = [p.bytes_fused for p in entry.points]
        assert None not in fused and fused[1] == 16 * fused[0] and fused[2] == 16 * fused[1]


def test_a_static_model_has_no_dynamic_section_and_older_reports_are_refused_by_version():
    report = analyze_file(example("example_net.py"), AnalyzeOptions(input_shapes=["64,32"]))
    assert all(m.dynamic is None for m in report.models)
    older = {**report.to_dict(), "schema_version": SCHEMA_VERSION - 1}
    with pytest.raises(ContractError, match=f"schema_version {SCHEMA_VERSION - 1} is not {SCHEMA_VERSION}"):
        Report.from_dict(older)


def test_expression_trees_evaluate_without_parsing_text():
    assert evaluate(["+", ["*", 2, "seq"], ["//", ["**", "res", 2], "res"]], {"seq": 3, "res": 5}) == 11
    assert evaluate(["<=", "seq", 2048], {"seq": 4096}) is False
    with pytest.raises(ExpressionError):
        evaluate(["+", "seq", "len"], {"seq": 1})


# ---- the editor: sizes declared in its settings, the range in the diagnostic and the hover ---------------

WIDE = """\
import torch
import torch.nn as nn


class Wide(nn.Module):
    def forward(self, x):
        return torch.relu(x * 2) + 1
"""

editor = server_fixture(
    configuration={
        "fuselens": {
            "models": {
                "Wide": {"inputs": [[4, "n"]], "dims": {"n": {"min": 16, "max": 4096, "corpus": [16, 256, 4096]}}}
            }
        }
    }
)


@pytest.mark.asyncio(loop_scope="module")
async def test_the_editor_speaks_of_the_declared_range(editor: Client):
    uri = editor.open("wide.py", WIDE)
    (diagnostic,) = [d for d in await editor.diagnostics_of(uri) if d.code == "elementwise"]
    # Three float32 [4, n] ops, each a read and a write (96n bytes), against one read and one write (32n):
    # 1 KB saved at n = 16, 256 KB at n = 4096.
    assert diagnostic.message.startswith("fusable: mul → relu → add, 24 KB → 8 KB")  # at n = 256
    assert diagnostic.message.endswith("; saves 1 KB–256 KB over n 16..4096"), diagnostic.message
    hover = await editor.hover(uri, 7)
    assert hover is not None
    text = hover.contents.value
    assert "**over n 16..4096**: `96*n` → `32*n` bytes" in text
    assert "| n | unfused → fused | regime | speedup |" in text
    for row in ("| 16 | 1.5 KB → 512 B | launch-bound | 3.00× |", "| 4096 | 384 KB → 128 KB | launch-bound | 3.00× |"):
        assert row in text, text
    # The inlay hint and the code lens give the binding's saving, and say it is the binding's, of which range.
    (hint,) = await editor.inlay_hints(uri)
    assert hint.label == "⚡ −16 KB at n=256 of 16..4096"
    assert isinstance(hint.tooltip, str) and "saves 1 KB–256 KB over n 16..4096" in hint.tooltip
    titles = [lens.command.title for lens in await editor.code_lenses(uri) if lens.command is not None]
    assert "1 fusable cluster · 16 KB of 24 KB avoidable at n=256 of 16..4096 · 1 applicable" in titles, titles
    # Following sizes as symbols imports torch._dynamo: the worker host keeps it for the next saves' jobs.
    await editor.wait_until(
        lambda: any("keeping torch._dynamo loaded for the jobs" in m.message for m in editor.log_messages),
        "the worker to keep the symbolic-shape modules loaded",
    )
    version = editor.save_text(uri, editor.texts[uri] + "\n")
    (again,) = [d for d in await editor.diagnostics_of(uri, version) if d.code == "elementwise"]
    assert again.message == diagnostic.message


def test_a_mask_buffer_bounds_seq_but_its_whole_length_is_allowed():
    """nanoGPT slices a causal mask of 1024 rows by the sequence length: `seq <= 1024` bounds the range,
    while the trace's `Ne(seq, 1024)` (the slice takes all of the buffer there) refuses nothing."""
    options = AnalyzeOptions(model_class="Block", input_shapes=["2,seq,768"], dims=["seq=1..1024"])
    (model,) = analyze_file(example("nanogpt_attention.py"), options).models
    assert model.status == "analyzed" and model.dynamic is not None
    conditions = {g.condition.text for g in model.dynamic.guards}
    assert {"seq <= 1024", "Ne(seq, 1024)"} <= conditions
    options = AnalyzeOptions(model_class="Block", input_shapes=["2,seq,768"], dims=["seq=1..2048"])
    (model,) = analyze_file(example("nanogpt_attention.py"), options).models
    assert model.status == "error" and model.problem is not None
    assert "goes beyond what the model allows: seq <= 1024" in model.problem.message
    assert "the model runs at seq = 1..1024" in model.problem.message


def test_a_size_the_code_makes_a_number_is_answered_by_analyzing_each_point(tmp_path):
    path = tmp_path / "pinned.py"
    path.write_text(
        textwrap.dedent(
            """\
            import torch
            import torch.nn as nn


            class Pinned(nn.Module):  # fuselens: input=(4, n) dims=n:16..4096@16,256,4096
                def forward(self, x):
                    width = int(x.shape[1])
                    return torch.relu(x.reshape(4, width) * 2) + 1
            """
        )
    )
    (model,) = analyze_file(str(path)).models
    dynamic = model.dynamic
    assert dynamic is not None and not dynamic.symbolic
    assert "the model's code fixes Eq(n, 256)" in dynamic.note, dynamic.note
    (entry,) = dynamic.clusters
    assert entry.bytes_fused is None  # no expression that would claim n = 256 everywhere
    assert [p.bytes_fused for p in entry.points] == [2 * 4 * n * 4 for n in (16, 256, 4096)]


def test_a_model_traced_on_real_values_says_its_costs_are_the_bindings_only(tmp_path):
    path = tmp_path / "counted.py"
    path.write_text(
        textwrap.dedent(
            """\
            import torch
            import torch.nn as nn


            class Counted(nn.Module):  # fuselens: input=(4, n) dims=n:16..256
                def forward(self, x):
                    k = int(x.abs().sum().item()) % 3 + 1
                    return torch.relu(x * k) + 1
            """
        )
    )
    done = fuselens("analyze", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "costs are given at the analysis binding only: the model was traced on real values" in done.stdout
    assert "per shape" not in done.stdout


def test_a_size_analyzed_at_one_is_not_taken_for_a_number_over_its_range(tmp_path):
    path = tmp_path / "at_one.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\n"
        "class AtOne(nn.Module):  # fuselens: input=(4, n) dims=n:1..64@1\n"
        "    def forward(self, x):\n        return torch.relu(x * 2) + 1\n"
    )
    (model,) = analyze_file(str(path)).models
    assert model.dynamic is not None and not model.dynamic.symbolic
    assert "n is analyzed at 1, which torch takes as a number" in model.dynamic.note
    assert all(entry.bytes_fused is None and not entry.changes for entry in model.dynamic.clusters)


# ---- validating at every size of the declared range ----------------------------------------------------

SMALL_LLAMA_TABLE = """
[tool.fuselens.models.LlamaBlock]
inputs = [[2, "seq", 64]]
dims = { seq = { min = 1, max = 32, corpus = [1, 8, 32] } }
init = { dim = 64, n_heads = 2, hidden = 128, max_len = 32 }
"""


def validated_bindings(done: subprocess.CompletedProcess, out: Path) -> list[dict]:
    """Each binding's validation from `validate --json`, after checking the run passed."""
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())["models"]


def assert_kernels_ran_everywhere(models: list[dict]) -> None:
    """Every kernel computed what its lines do at each binding, and the patched model ran them all (as many
    launches as at the analysis binding): a kernel that took a size for a constant would have fallen back."""
    launches = {m["model"]["kernel_launches"] for m in models}
    assert len(launches) == 1 and launches.pop() > 0, [m["model"] for m in models]
    for m in models:
        assert m["clusters"] and all(c["status"] == "verified" for c in m["clusters"]), m
        assert m["model"]["status"] == "matches", m["model"]
        assert m["model"]["training"] is None or m["model"]["training"]["status"] == "matches"


@pytest.mark.slow
@pytest.mark.interpreter
def test_validate_checks_the_llama_block_at_every_corpus_point_and_the_edges_of_seq(tmp_path):
    path = tmp_path / "llama.py"
    shutil.copy(example("llama_block.py"), path)
    (tmp_path / "pyproject.toml").write_text(SMALL_LLAMA_TABLE)
    out = tmp_path / "validation.json"
    done = fuselens("validate", str(path), "--interpret", "--json", str(out))
    models = validated_bindings(done, out)
    # The corpus, then the range's ends, 1, an odd size (17) and a prime (31).
    assert [m["binding"] for m in models] == [{"seq": s} for s in (1, 8, 32, 17, 31)]
    assert [m["inputs"] for m in models] == [[[2, s, 64]] for s in (1, 8, 32, 17, 31)]
    assert_kernels_ran_everywhere(models)
    # One row per binding in the printed summary.
    summary = done.stdout[done.stdout.index("LlamaBlock over its declared sizes") :]
    assert "kernel launches" in summary
    for s in (1, 8, 32, 17, 31):
        assert f"seq={s} " in summary and f"(2, {s}, 64)" in summary


@pytest.mark.slow
@pytest.mark.interpreter
def test_validate_checks_the_vision_block_at_every_resolution_of_its_range(tmp_path):
    path = tmp_path / "vision.py"
    path.write_text(VISION)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.fuselens.models.ResBlock]\ninputs = [[2, 32, "res", "res"], [2, 64]]\n'
        "dims = { res = { min = 4, max = 16, corpus = [4, 8, 16] } }\n"
    )
    out = tmp_path / "validation.json"
    models = validated_bindings(fuselens("validate", str(path), "--interpret", "--json", str(out)), out)
    # No 1 in a range from 4; an odd 11 and the prime 13 beside the corpus.
    assert [m["binding"]["res"] for m in models] == [4, 8, 16, 11, 13]
    assert [m["inputs"][0] for m in models] == [[2, 32, r, r] for r in (4, 8, 16, 11, 13)]
    assert_kernels_ran_everywhere(models)


def test_validation_sizes_cover_the_ends_one_an_odd_size_and_a_prime():
    from fuselens.contracts.dynamic import Size
    from fuselens.validate.bindings import edge_sizes

    assert edge_sizes(Size("seq", 1, 8192, [1, 8192], 2048)) == [1, 4097, 8191, 8192]
    assert edge_sizes(Size("res", 8, 256, [8, 256], 64)) == [8, 133, 251, 256]
    assert edge_sizes(Size("n", 5, 5, [5], 5)) == [5]


@pytest.mark.slow
@pytest.mark.interpreter
def test_the_dynamic_shapes_benchmark_runs_small_on_a_cpu(tmp_path):
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "dynamic_shapes.py"
    done = subprocess.run(
        [sys.executable, str(script), "--tiny", "--only", "vision", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = json.loads((tmp_path / "dynamic_shapes.json").read_text())["rows"]
    assert row["applied"] and [p["res"] for p in row["points"]] == [4, 7, 16]
    for point in row["points"]:
        assert point["applied_recompiles"] == 0 and point["max_abs"] < 1e-4
    table = (tmp_path / "dynamic_shapes.md").read_text()
    assert "| vision | res = 7 |" in table and "applied vs best compile" in table


def test_each_clusters_regime_at_the_analysis_binding_is_the_reports_own_gemm_epilogues_too(tmp_path):
    path = tmp_path / "llama.py"
    shutil.copy(example("llama_block.py"), path)
    (tmp_path / "pyproject.toml").write_text(
        LLAMA_TABLE.replace("dim = 256, n_heads = 4, hidden = 512", "dim = 1024, n_heads = 8, hidden = 2816")
        .replace('[2, "seq", 256]', '[2, "seq", 1024]')
        .format(max_seq=2048, corpus="[1, 1024, 2048]")
    )
    report = analyze_file(str(path))
    (model,) = [m for m in report.models if m.status == "analyzed"]
    assert model.dynamic is not None and model.dynamic.binding == {"seq": 1024}
    regimes = {c.id: c.regime for c in model.clusters}
    # The GEMM + SwiGLU epilogue multiplies for longer than it moves its bytes at the binding.
    assert "compute-bound" in regimes.values()
    for entry in model.dynamic.clusters:
        assert entry.symbolic, entry.note
        (at_binding,) = [p for p in entry.points if p.binding == model.dynamic.binding]
        assert at_binding.regime == regimes[entry.cluster], entry.cluster
