"""The `fuselens` command as a user runs it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from fuselens.contracts.report import SCHEMA_VERSION
from fuselens.contracts.schema import validate_report

from conftest import example


def fuselens(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "fuselens.cli.main", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_analyze_prints_the_compiler_style_table():
    done = fuselens("analyze", example("example_net.py"), "--input-shape", "16384,1024")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for expected in (
        "ExampleNet",
        "mul → relu → add",
        "384 MB → 128 MB",
        "67%",
        "dram-bound",
        "edit",  # how it applies
        "18–20",
        "576 MB of 866 MB",  # (proj1's result no longer goes to memory and back: 64 MB more)
    ):
        assert expected in out, expected


def test_analyze_json_follows_the_schema(tmp_path):
    out = tmp_path / "report.json"
    done = fuselens("analyze", example("gemma_norm.py"), "--json", str(out), "--explain-rejections")
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    validate_report(data)
    assert data["schema_version"] == SCHEMA_VERSION
    assert "left unfused" in done.stdout and "convexity" in done.stdout


def test_a_syntax_error_is_reported_at_its_line(write_model):
    path = write_model("import torch\n\nclass Net(torch.nn.Module):\n    def forward(self, x)\n        return x\n")
    done = fuselens("analyze", path)
    assert done.returncode == 1
    assert "model.py:4" in done.stdout and "SyntaxError" in done.stdout


def test_an_import_error_names_the_module(write_model):
    path = write_model("import torch\nimport not_a_module_anywhere\n\nclass Net(torch.nn.Module):\n    pass\n")
    done = fuselens("analyze", path)
    assert done.returncode == 1
    assert "model.py:2" in done.stdout and "not_a_module_anywhere" in done.stdout


def test_unknown_class_and_missing_file():
    done = fuselens("analyze", example("example_net.py"), "--model-class", "Nope")
    assert done.returncode == 1 and "no model 'Nope'" in done.stdout and "ExampleNet" in done.stdout
    assert fuselens("analyze", "does/not/exist.py").returncode == 2


def test_validate_without_a_gpu_says_so_and_offers_the_interpreter():
    pytest.importorskip("triton")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    done = fuselens("validate", example("example_net.py"))
    assert done.returncode == 1
    assert "no CUDA device" in done.stdout and "--interpret" in done.stdout


def test_validate_interpret_checks_every_kernel_and_the_whole_model(tmp_path):
    table = tmp_path / "results.md"
    done = fuselens("validate", example("example_net.py"), "--interpret", "--markdown", str(table))
    rows = [line for line in table.read_text().splitlines() if re.match(r"\| c\d+ \|", line)]
    assert [row.split(" | ")[:3] for row in rows] == [
        ["| c0", "mul → relu → add", "verified"],
        ["| c1", "linear → gelu → sigmoid → mul", "verified"],
        ["| c2", "tanh → mul → softmax", "verified"],
    ]
    assert done.returncode == 0, done.stdout + done.stderr
    # Each kernel's row: the forward verified, then its backward kernel's gradients.
    lines = [line for line in done.stdout.splitlines() if re.match(r"│ c\d+ ", line)]
    assert len(lines) == 3 and all(line.count("verified") == 2 for line in lines), done.stdout
    # The patched model as a whole, its three kernels running: eval, a training step, other sizes.
    assert "whole model with c0, c1, c2 applied (3 kernel launches): matches" in done.stdout
    assert "    in training mode: matches one step (outputs, 4 gradient(s)" in done.stdout
    assert "    at other sizes: matches at [129, 1024]" in done.stdout


def test_validate_html_writes_the_table_the_chart_and_the_earlier_runs_in_one_page(tmp_path):
    """One offline page: the results table, a plotly chart (plotly.js inlined, no CDN) and the file's
    earlier runs (one seeded here, as if validated on a GPU before); --json writes the same report."""
    pytest.importorskip("plotly")
    from datetime import UTC, datetime

    from fuselens.contracts.validation import ClusterCheck, ModelValidation, Timing, ValidationReport
    from fuselens.server import history

    model = tmp_path / "example_net.py"  # a copy: a history of its own
    shutil.copy(example("example_net.py"), model)
    earlier = ValidationReport(
        str(model),
        "cuda",
        "NVIDIA H200",
        [
            ModelValidation(
                "ExampleNet",
                [[16384, 1024]],
                ["float32"],
                [
                    ClusterCheck(f"c{i}", f"cluster{i}", "verified", max_abs=1e-6, timing=Timing(fused_us=12.5))
                    for i in range(3)
                ],
            )
        ],
    )
    history.record(str(model), earlier, print, now=datetime(2025, 1, 31, 12, 3, tzinfo=UTC))

    page, report = tmp_path / "results.html", tmp_path / "results.json"
    done = fuselens("validate", str(model), "--interpret", "--html", str(page), "--json", str(report))
    assert done.returncode == 0, done.stdout + done.stderr
    text = page.read_text(encoding="utf-8")
    data = json.loads(report.read_text())
    for c in data["models"][0]["clusters"]:  # the report's numbers, as the page's table shows them
        row = f"<td>{c['id']}</td><td>{c['ops']}</td><td>{c['status']}</td><td>{c['max_abs']:.1e}</td>"
        assert row in text, row
    assert "<th>torch.compile (default) µs</th>" in text
    assert text.count('class="plotly-graph-div"') == 1  # one chart for the one model
    # The interpreter's chart: numerics, each error as a share of its tolerance; the earlier run a series of it.
    series = {json.loads(name) for name in re.findall(r'"name":("(?:[^"\\]|\\.)*")', text)}
    assert {"max |error| / tolerance", "tolerance: atol + rtol·|expected|"} <= series, series
    assert "max |error| / tolerance, 2025-01-31 12:03 UTC" in series, series
    assert "Earlier runs of this file" in text and "<td>NVIDIA H200</td>" in text and "<td>12.5 µs</td>" in text
    assert re.search(r"<script[^>]*\bsrc=", text) is None  # plotly.js is in the page, not fetched
    assert len(text) > 1_000_000  # (plotly.js itself, about 4.8 MB)


def test_validate_html_without_plotly_names_the_extra_to_install(monkeypatch, capsys, tmp_path):
    from fuselens.cli.main import main

    monkeypatch.setitem(sys.modules, "plotly", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "plotly.io", None)
    code = main(["validate", example("example_net.py"), "--interpret", "--html", str(tmp_path / "r.html")])
    assert code == 2
    assert "pip install 'fuselens[html]'" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_a_hint_prints_its_pyproject_table_as_written(write_model):
    # rich reads "[tool.fuselens.models.Net]" as a style tag unless the report's text is escaped.
    path = write_model(
        "import torch\n\n\nclass Net(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x) * 2.0\n"
    )
    done = fuselens("analyze", path)
    assert done.returncode == 1, done.stderr  # no model analyzed: the hint says how to give it inputs
    out = " ".join(done.stdout.split())  # as rich wraps it, words whole
    assert "skipped" in out
    assert "[tool.fuselens.models.Net] inputs = [[16384, 1024]] in pyproject.toml" in out, done.stdout


def test_validation_text_prints_as_written():
    import io

    from rich.console import Console

    from fuselens.cli.validate import render_validation
    from fuselens.contracts.validation import ClusterCheck, ModelCheck, ModelValidation, ValidationReport

    model = ModelValidation(
        "Net",
        [[4, 8]],
        ["float32"],
        [ClusterCheck("c0", "cluster0", "error", message="x[idx] failed: [bold] is not a style")],
        ModelCheck("error", message="see [tool.fuselens.models.Net]"),
    )
    report = ValidationReport("model.py", "interpret", "cpu", [model], problems=["[red]not markup[/red]"])
    console = Console(file=io.StringIO(), width=200)
    render_validation(report, console)
    out = console.file.getvalue()
    for text in ("[red]not markup[/red]", "x[idx] failed: [bold] is not a style", "see [tool.fuselens.models.Net]"):
        assert text in out, out
