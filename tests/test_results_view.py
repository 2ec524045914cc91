"""The results view of a validation: its chart (a Plotly figure built without plotly), the file's history
of earlier runs in the user's cache folder, and the view every editor and the CLI show."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from fuselens.contracts.chart import results_figure
from fuselens.contracts.folders import user_cache_folder
from fuselens.contracts.history import HISTORY_LIMIT, ValidationRun, unrecorded
from fuselens.contracts.profile import ClusterTime, LineTime, ModelProfile, OpaqueTime, Profile
from fuselens.contracts.profile_view import profile_view
from fuselens.contracts.results_view import results_view, view_markdown
from fuselens.contracts.validation import (
    RESULT_COLUMNS,
    BackwardCheck,
    ClusterCheck,
    ModelCheck,
    ModelValidation,
    Timing,
    TrainingTiming,
    ValidationReport,
    result_rows,
    step_errors,
)
from fuselens.server import git, history

T0 = datetime(2025, 1, 31, 12, 3, 4, tzinfo=UTC)


def timed_report(fused: tuple[float, float] = (10.0, 20.0)) -> ValidationReport:
    """A validation on a GPU: two clusters timed against eager and torch.compile."""
    clusters = [
        ClusterCheck(
            "c0",
            "cluster0",
            "verified",
            ops="mul → relu → add",
            max_abs=1e-6,
            atol=1e-5,
            rtol=1e-5,
            timing=Timing(
                eager_us=30.0,
                compiled_us=12.0,
                fused_us=fused[0],
                achieved_gbps=2900.0,
                pct_of_peak=97.0,
                speedup_vs_eager=3.0,
                speedup_vs_compiled=1.2,
            ),
        ),
        ClusterCheck(
            "c1",
            "cluster1",
            "verified",
            ops="tanh → mul → softmax",
            max_abs=2e-6,
            atol=1e-5,
            rtol=1e-5,
            timing=Timing(eager_us=50.0, compiled_us=25.0, fused_us=fused[1]),  # no bandwidth measured
        ),
    ]
    model = ModelValidation("Net", [[4096, 1024]], ["float32"], clusters, ModelCheck("matches", ["c0", "c1"]))
    return ValidationReport("model.py", "cuda", "NVIDIA H200", [model], versions={"torch": "2.13.0", "triton": "3.8.0"})


def interpreted_report() -> ValidationReport:
    """A validation in the Triton interpreter: numerics only, one of them exact, one mismatched."""
    clusters = [
        ClusterCheck(
            "c0", "cluster0", "verified", ops="mul → relu → add", max_abs=0.0, atol=1e-4, rtol=1e-4, tolerance_ratio=0.0
        ),
        ClusterCheck(
            "c1",
            "cluster1",
            "mismatch",
            ops="gelu → sigmoid → mul",
            max_abs=3e-2,
            atol=1e-4,
            rtol=1e-4,
            tolerance_ratio=150.0,
        ),
        ClusterCheck("c2", "cluster2", "error", ops="tanh → mul → softmax", message="launch failed"),
    ]
    model = ModelValidation("Net", [[128, 1024]], ["float32"], clusters, ModelCheck("mismatch", ["c0", "c1"]))
    return ValidationReport("model.py", "interpret", "cpu", [model])


def names(figure: dict) -> list[str]:
    return [trace["name"] for trace in figure["data"]]


def series(figure: dict, name: str) -> dict:
    (trace,) = [t for t in figure["data"] if t["name"] == name]
    return trace


def check_with_plotly(figure: dict) -> None:
    """plotly itself accepts the figure (an unknown property or a bad value raises)."""
    go = pytest.importorskip("plotly.graph_objects")
    go.Figure(figure)


# ---- the chart -----------------------------------------------------------------------------------


def test_a_timed_validation_charts_eager_torch_compile_and_fused_time_per_cluster():
    model = timed_report().models[0]
    figure = results_figure(model, "on NVIDIA H200")
    assert names(figure) == ["eager", "torch.compile (default)", "fused", "fused: % of copy ceiling"]
    assert series(figure, "eager")["y"] == [30.0, 50.0]
    assert series(figure, "torch.compile (default)")["y"] == [12.0, 25.0]
    fused = series(figure, "fused")
    assert fused["type"] == "bar" and fused["x"] == ["c0", "c1"] and fused["y"] == [10.0, 20.0]
    assert fused["text"] == ["2900 GB/s, 97% of the copy ceiling", ""]  # c1's bandwidth was not measured
    ceiling = series(figure, "fused: % of copy ceiling")
    assert ceiling["yaxis"] == "y2" and ceiling["y"] == [97.0, None]
    layout = figure["layout"]
    title = layout["title"]["text"]
    assert "Net" in title and "NVIDIA H200" in title and "torch.compile (default)" in title
    assert layout["yaxis"]["title"]["text"].startswith("µs") and layout["barmode"] == "group"
    assert layout["yaxis2"]["overlaying"] == "y"
    json.dumps(figure, allow_nan=False)  # plain JSON: what the server sends and the webview reads
    check_with_plotly(figure)


def test_earlier_runs_add_a_faded_series_each_newest_first():
    model = timed_report().models[0]
    earlier = [
        ("2025-01-30 09:00 UTC", timed_report((14.0, 28.0)).models[0]),
        ("2025-01-31 08:00 UTC", timed_report((12.0, 24.0)).models[0]),
    ]
    figure = results_figure(model, "on NVIDIA H200", earlier)
    assert names(figure)[3:5] == ["fused, 2025-01-31 08:00 UTC", "fused, 2025-01-30 09:00 UTC"]
    assert series(figure, "fused, 2025-01-30 09:00 UTC")["y"] == [14.0, 28.0]
    assert series(figure, "fused, 2025-01-31 08:00 UTC")["opacity"] < 1
    check_with_plotly(figure)


def test_an_interpreter_validation_charts_each_error_against_its_tolerance():
    model = interpreted_report().models[0]
    figure = results_figure(model, "in the Triton interpreter (numerics only)")
    # no time series (nothing was timed): each error as a share of its tolerance, and the line at 1
    assert names(figure) == ["max |error| / tolerance", "tolerance: atol + rtol·|expected|"]
    errors = series(figure, "max |error| / tolerance")
    # A log axis cannot draw 0 or a check with no number: those clusters are named in words instead.
    assert errors["x"] == ["c0", "c1", "c2"] and errors["y"] == [None, 150.0, None]
    assert "mismatch" in errors["hovertext"][1] and "atol 0.0001" in errors["hovertext"][1]
    assert "150× its tolerance" in errors["hovertext"][1]
    assert series(figure, "tolerance: atol + rtol·|expected|")["y"] == [1.0, 1.0, None]
    layout = figure["layout"]
    assert layout["yaxis"]["type"] == "log"
    assert {(a["x"], a["text"]) for a in layout["annotations"]} == {("c0", "exact (0)"), ("c2", "error")}
    assert "Triton interpreter" in layout["title"]["text"] and "tolerance" in layout["title"]["text"]
    check_with_plotly(figure)


def test_a_bar_is_over_the_line_exactly_when_its_check_failed():
    """The bars are what the verdict compares (|error| against atol + rtol·|expected|, element by
    element), not max |error| against atol alone: an error above atol that the relative part covers
    is under the line, as its status says."""
    import torch

    from fuselens.validate.numerics import compare

    expected = torch.tensor([1000.0, 500.0, 2.0, 0.5])
    cases = {  # an error above atol (1e-4) on a large value, within rtol·|expected|; and one past both
        "c0": expected + torch.tensor([0.05, 0.0, 0.0, 0.0]),
        "c1": expected + torch.tensor([0.0, 0.02, 0.0, 0.0]),
        "c2": expected + torch.tensor([0.0, 0.0, 1e-3, 0.0]),
    }
    checks = []
    for cid, actual in cases.items():
        cmp = compare(actual, expected)
        checks.append(
            ClusterCheck(cid, cid, "verified" if cmp.ok else "mismatch", max_abs=cmp.max_abs, atol=cmp.atol,
                         rtol=cmp.rtol, tolerance_ratio=cmp.tolerance_ratio)
        )  # fmt: skip
    assert [c.status for c in checks] == ["verified", "verified", "mismatch"]
    assert all(c.max_abs > c.atol for c in checks)  # every error is above atol: the old line was under all three
    figure = results_figure(ModelValidation("Net", [[4]], ["float32"], checks), "in the Triton interpreter")
    bars = series(figure, "max |error| / tolerance")["y"]
    line = series(figure, "tolerance: atol + rtol·|expected|")["y"]
    assert [bar > at for bar, at in zip(bars, line, strict=True)] == [c.status == "mismatch" for c in checks], bars


def test_a_model_with_nothing_to_validate_still_has_a_titled_chart():
    figure = results_figure(ModelValidation("Empty", [[4]], ["float32"]), "on NVIDIA H200")
    assert figure["data"] == [] and "no clusters" in figure["layout"]["title"]["text"]


def test_infinite_errors_stay_out_of_the_figures_json():
    report = interpreted_report()
    report.models[0].clusters[1].max_abs = float("inf")
    figure = results_figure(report.models[0], "in the Triton interpreter (numerics only)")
    json.dumps(figure, allow_nan=False)
    assert ("c1", "inf (mismatch)") in {(a["x"], a["text"]) for a in figure["layout"]["annotations"]}


# ---- the history ---------------------------------------------------------------------------------


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "project" / "model.py"
    path.parent.mkdir()
    path.write_text("# a model\n")
    return str(path)


def test_each_validation_is_kept_in_the_users_cache_folder_not_the_project(model_file):
    lines: list[str] = []
    first, earlier = history.record(model_file, timed_report((14.0, 28.0)), lines.append, now=T0)
    assert earlier == [] and first.time == "2025-01-31T12:03:04Z"
    second, earlier = history.record(model_file, timed_report(), lines.append, now=T0 + timedelta(hours=1))
    assert [run.time for run in earlier] == ["2025-01-31T12:03:04Z"]
    assert earlier[0].report.models[0].clusters[0].timing.fused_us == 14.0  # read back whole, as a report
    assert second.device == "NVIDIA H200" and second.versions == {"torch": "2.13.0", "triton": "3.8.0"}
    path = history.history_path(model_file)
    assert path.startswith(os.path.join(user_cache_folder(), "history") + os.sep)
    assert os.listdir(os.path.dirname(model_file)) == ["model.py"]  # nothing written into the project
    assert [run.time for run in history.load(model_file, lines.append)] == [first.time, second.time]
    assert lines == []


def test_the_history_is_keyed_by_the_files_resolved_path(model_file, tmp_path):
    link = tmp_path / "elsewhere.py"
    link.symlink_to(model_file)
    history.record(model_file, timed_report(), print, now=T0)
    assert len(history.load(str(link), print)) == 1
    assert history.history_path(str(link)) == history.history_path(model_file)


def test_the_history_keeps_the_last_runs_only(model_file):
    for minute in range(HISTORY_LIMIT + 5):
        history.record(model_file, interpreted_report(), print, now=T0 + timedelta(minutes=minute))
    runs = history.load(model_file, print)
    assert len(runs) == HISTORY_LIMIT
    assert runs[0].time == "2025-01-31T12:08:04Z" and runs[-1].time == "2025-01-31T12:27:04Z"  # the oldest 5 dropped


def test_a_run_that_checked_nothing_is_not_kept(model_file):
    nothing = ValidationReport(model_file, "cuda", "", problems=["no CUDA device here"])
    run, earlier = history.record(model_file, nothing, print, now=T0)
    assert run.time == "" and earlier == [] and history.load(model_file, print) == []


@pytest.mark.parametrize(
    "content, why",
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe\x00garbage", "not JSON"),
        (b'__import__("os").system("touch /tmp/owned")', "not JSON"),  # read as data, never run
        (b'["a", "list"]', "not a validation history"),
        (b'{"schema_version": 99, "file": "x", "runs": []}', "schema version 99"),
    ],
)
def test_a_corrupt_history_is_skipped_with_a_log_line_and_started_afresh(model_file, content, why):
    path = history.history_path(model_file)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(content)
    lines: list[str] = []
    assert history.load(model_file, lines.append) == []
    assert len(lines) == 1 and why in lines[0] and path in lines[0], lines
    _, earlier = history.record(model_file, timed_report(), lines.append, now=T0)
    assert earlier == [] and len(history.load(model_file, print)) == 1  # the next run replaced it


def test_another_files_history_is_not_taken_for_this_ones(model_file, tmp_path):
    other = tmp_path / "other.py"
    other.write_text("")
    history.record(str(other), timed_report(), print, now=T0)
    shutil.copy(history.history_path(str(other)), history.history_path(model_file))
    lines: list[str] = []
    assert history.load(model_file, lines.append) == []
    assert "it is the history of" in lines[0] and "other.py" in lines[0]


def test_a_run_that_does_not_read_is_skipped_and_the_others_kept(model_file):
    history.record(model_file, timed_report(), print, now=T0)
    history.record(model_file, timed_report(), print, now=T0 + timedelta(minutes=1))
    path = history.history_path(model_file)
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    data["runs"][0]["report"]["models"] = "not a list"
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    lines: list[str] = []
    assert [run.time for run in history.load(model_file, lines.append)] == ["2025-01-31T12:04:04Z"]
    assert len(lines) == 1 and "skipped a run" in lines[0] and "runs[0].report.models" in lines[0]


def test_a_history_that_cannot_be_written_is_logged_not_raised(model_file, monkeypatch, tmp_path):
    blocked = tmp_path / "cache-is-a-file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    lines: list[str] = []
    run, earlier = history.record(model_file, timed_report(), lines.append, now=T0)
    assert run.report.models and earlier == []
    assert any("not written" in line for line in lines), lines


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_each_run_keeps_the_commit_checked_out_in_the_files_repository(model_file):
    repo = os.path.dirname(model_file)

    def run_git(*args: str) -> str:
        env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}
        command = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", repo, *args]
        return subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout.strip()

    assert git.head_revision(model_file) is None  # no repository yet
    run_git("init", "-q", "-b", "main")
    run_git("add", "model.py")
    run_git("commit", "-q", "-m", "a model")
    head = run_git("rev-parse", "HEAD")
    assert git.head_revision(model_file) == head  # a loose ref
    run_git("pack-refs", "--all")
    assert git.head_revision(model_file) == head  # a packed one
    run_git("checkout", "-q", "--detach")
    assert git.head_revision(model_file) == head  # a detached HEAD
    run, _ = history.record(model_file, timed_report(), print, now=T0)
    assert run.revision == head


# ---- the view ------------------------------------------------------------------------------------


def test_every_check_that_ends_in_an_error_says_why(model_file):
    """A kernel, a backward kernel or a whole-model check that ended in an error: the view gives each
    reason (the table has room for the status only), as the editors' notification and log do."""
    clusters = [
        ClusterCheck("c0", "cluster0", "error", ops="mul → relu", message="the kernel failed: out of resources"),
        ClusterCheck(
            "c1", "cluster1", "verified", ops="gelu", backward=BackwardCheck("error", message="grad of x is None")
        ),
    ]
    whole = ModelCheck("matches", ["c1"], training=ModelCheck("error", ["c1"], message="the step failed: OOM"))
    report = ValidationReport(
        model_file, "interpret", "cpu", [ModelValidation("Net", [[8, 16]], ["float32"], clusters, whole)]
    )
    assert step_errors(report) == [
        "c0 (cluster0): error: the kernel failed: out of resources",
        "c1 backward: error: grad of x is None",
        "Net as a whole in training mode: error: the step failed: OOM",
    ]
    latest, earlier = history.record(model_file, report, print, now=T0)
    view = results_view(latest, earlier)
    assert view.problems == step_errors(report)[:2]
    assert view.models[0].whole_model == (
        "whole model with c1 applied: matches; training: error (the step failed: OOM)"
    )
    text = view_markdown(view)
    assert all(line in text for line in (*view.problems, view.models[0].whole_model)), text


def test_the_view_has_the_table_the_chart_and_the_earlier_runs(model_file):
    first, _ = history.record(model_file, timed_report((14.0, 28.0)), print, now=T0)
    latest, earlier = history.record(model_file, timed_report(), print, now=T0 + timedelta(days=1))
    view = results_view(latest, earlier)
    assert view.where == "on NVIDIA H200" and view.earlier_runs == 1 and view.versions["torch"] == "2.13.0"
    assert view.summary == (
        "Validated on NVIDIA H200 at 2025-02-01 12:03 UTC · torch 2.13.0 · triton 3.8.0 · 1 earlier run of this file"
    )
    assert "torch.compile (default) µs" in view.columns
    (model,) = view.models
    assert model.heading == "Net at 4096×1024 float32, on NVIDIA H200"
    assert model.rows[0][:3] == ["c0", "mul → relu → add", "verified"]
    assert model.rows[0][view.columns.index("fused µs")] == "10.0"
    assert model.rows[0][view.columns.index("backward")] == "—"  # no backward kernel was checked
    assert model.whole_model == "whole model with c0, c1 applied: matches"
    assert names(model.chart)[3] == "fused, 2025-01-31 12:03 UTC"
    assert model.history.columns == ["run", "device", "torch", "revision", "c0", "c1", "whole model"]
    assert model.history.rows == [
        ["latest", "NVIDIA H200", "2.13.0", "—", "10.0 µs", "20.0 µs", "matches"],
        ["2025-01-31 12:03 UTC", "NVIDIA H200", "2.13.0", "—", "14.0 µs", "28.0 µs", "matches"],
    ]
    assert first.time == "2025-01-31T12:03:04Z"

    text = view_markdown(view)
    lines = text.splitlines()
    assert lines[0] == "### Net at 4096×1024 float32, on NVIDIA H200"
    assert "#### Earlier runs of this file" in lines
    assert "| 2025-01-31 12:03 UTC | NVIDIA H200 | 2.13.0 | — | 14.0 µs | 28.0 µs | matches |" in lines


def test_a_first_run_has_no_history_table():
    view = results_view(unrecorded(interpreted_report()))
    assert view.models[0].history.rows == [] and view.earlier_runs == 0
    assert "Earlier runs" not in view_markdown(view)
    row = view.models[0].rows[1]
    assert row[:4] == ["c1", "gelu → sigmoid → mul", "mismatch", "3.0e-02"]


def test_the_history_table_names_each_runs_headline_number():
    earlier = ValidationRun("2025-01-30T10:00:00Z", "cpu", interpreted_report(), revision="0123456789abcdef")
    view = results_view(ValidationRun("2025-01-31T10:00:00Z", "cpu", interpreted_report()), [earlier])
    assert view.models[0].history.rows[1] == [
        "2025-01-30 10:00 UTC",
        "Triton interpreter",
        "—",
        "0123456789",
        "err 0.0e+00",
        "err 3.0e-02 (mismatch)",
        "error",
        "mismatch",
    ]


def test_the_table_gives_each_backward_kernel_s_gradient_check():
    """A cluster whose backward kernel was checked shows the check and its largest difference from
    eager autograd, and whose gradient that is when there are several; one without a backward
    kernel shows a dash."""
    trained = ClusterCheck("c0", "cluster0", "verified", ops="silu → mul", max_abs=0.0)
    trained.backward = BackwardCheck(
        "verified", ["gate", "up"], max_abs=0.03125, per_input={"gate": 0.03125, "up": 0.0}, worst_input="gate"
    )
    wrong = ClusterCheck("c1", "cluster1", "verified", ops="mul → add", max_abs=0.0)
    wrong.backward = BackwardCheck(
        "mismatch", ["x"], max_abs=0.5, message="max |error| 0.5 exceeds ...", per_input={"x": 0.5}, worst_input="x"
    )
    plain = ClusterCheck("c2", "cluster2", "verified", ops="embedding → add", max_abs=0.0)
    model = ModelValidation("Net", [[8, 64]], ["float32"], [trained, wrong, plain])
    column = RESULT_COLUMNS.index("backward")
    assert [row[column] for row in result_rows(model)] == ["verified 3.1e-02 (gate)", "mismatch 5.0e-01", "—"]


def test_the_table_gives_a_training_step_s_time_forward_and_backward_apart():
    """On a GPU a cluster with a backward kernel shows its fused training step, the forward and the
    backward in it, and how it compares with torch.compile's step; the others show dashes."""
    trained = ClusterCheck("c0", "cluster0", "verified", ops="cast → cross_entropy", max_abs=0.0)
    trained.backward = BackwardCheck("verified", ["logits"], max_abs=0.0)
    trained.backward.timing = TrainingTiming(
        eager_forward_us=900.0,
        eager_step_us=3000.0,
        compiled_forward_us=600.0,
        compiled_step_us=1800.0,
        fused_forward_us=400.0,
        fused_step_us=1200.0,
        step_vs_eager=2.5,
        step_vs_compiled=1.5,
    )
    plain = ClusterCheck("c1", "cluster1", "verified", ops="embedding → add", max_abs=0.0)
    model = ModelValidation("Net", [[8, 64]], ["float32"], [trained, plain])
    step, versus = RESULT_COLUMNS.index("fused fwd + bwd µs"), RESULT_COLUMNS.index("fwd + bwd vs torch.compile")
    assert [(row[step], row[versus]) for row in result_rows(model)] == [("1200.0 (400.0 + 800.0)", "1.50×"), ("—", "—")]
    assert trained.backward.timing.backward_us("compiled") == 1200.0


# ---- markup in a report --------------------------------------------------------------------------

# A report's strings come from the model's code, a remote runner's output and the history file: plotly
# draws a little HTML in every label, so that this one, unescaped, blew a hover label over the chart.
MARKUP = '<span style="font-size:400px">big</span>'
SHOWN = html.escape(MARKUP, quote=False)  # what plotly turns back into the characters, shown as text


def marked_up_report(timed: bool) -> ValidationReport:
    """A validation with `MARKUP` in every string: names, ops, statuses, the device, the file."""
    timing = Timing(eager_us=30.0, compiled_us=12.0, fused_us=10.0, achieved_gbps=2900.0, pct_of_peak=97.0)
    clusters = [
        ClusterCheck(
            f"c{i}{MARKUP}",
            f"cluster{i}{MARKUP}",
            f"verified{MARKUP}",
            ops=f"mul → relu{MARKUP}",
            max_abs=max_abs,
            atol=1e-4,
            rtol=1e-4,
            tolerance_ratio=None if max_abs is None else max_abs / 1e-4,
            message=MARKUP,
            timing=timing if timed else None,
        )
        for i, max_abs in enumerate([3e-5, 0.0, None])  # drawn, and two named in words (exact, no number)
    ]
    whole = ModelCheck(f"matches{MARKUP}", [c.id for c in clusters])
    model = ModelValidation(f"Net{MARKUP}", [[4, 8]], [f"float32{MARKUP}"], clusters, whole)
    return ValidationReport(
        f"model{MARKUP}.py",
        "cuda" if timed else "interpret",
        f"NVIDIA H200{MARKUP}",
        [model],
        problems=[MARKUP],
        versions={"torch": MARKUP},
    )


def plotly_figures(page: str) -> list[tuple[list, dict]]:
    """The (data, layout) of every `Plotly.newPlot` on the page, as the browser's JavaScript reads them."""
    decoder = json.JSONDecoder()
    figures = []
    for call in re.finditer(r'Plotly\.newPlot\(\s*"[^"]*",\s*', page):
        data, end = decoder.raw_decode(page, call.end())
        layout, _ = decoder.raw_decode(page, re.compile(r",\s*").match(page, end).end())
        figures.append((data, layout))
    return figures


def strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def assert_shown_as_text(page: str) -> list[tuple[list, dict]]:
    """No markup from the report on the page or in its charts; each chart names it as text."""
    outside_scripts = re.sub(r"<script.*?</script>", "", page, flags=re.S)
    assert MARKUP not in outside_scripts and "<span" not in outside_scripts
    assert html.escape(MARKUP) in outside_scripts  # the tables and headings: HTML-escaped text
    figures = plotly_figures(page)
    assert figures
    for data, layout in figures:
        assert not [s for s in strings([data, layout]) if "<span" in s or "</span" in s]
        assert SHOWN in layout["title"]["text"]
    return figures


@pytest.mark.parametrize("timed", [True, False], ids=["timed", "interpreted"])
def test_markup_in_every_report_string_shows_as_text_on_the_results_page(timed: bool):
    results_page = pytest.importorskip("fuselens.cli.results_page")
    earlier = [ValidationRun(f"yesterday{MARKUP}", "cpu", marked_up_report(timed))]  # a history run's time
    view = results_view(unrecorded(marked_up_report(timed)), earlier)

    (figure,) = assert_shown_as_text(results_page.page(view))
    data, layout = figure
    for trace in data:  # the axis's categories, and the labels a hover shows
        assert all(SHOWN in x for x in trace["x"]), trace
        assert all(SHOWN in h for h in trace.get("hovertext", [SHOWN])), trace
    series_name = "fused" if timed else "max |error| / tolerance"
    assert any(trace["name"] == f"{series_name}, yesterday{SHOWN}" for trace in data)
    if not timed:  # the clusters a log axis cannot draw are named in words, their status among them
        assert {a["x"] for a in layout["annotations"]} == {f"c1{SHOWN}", f"c2{SHOWN}"}
        assert f"verified{SHOWN}" in {a["text"] for a in layout["annotations"]}


def test_markup_in_every_profile_string_shows_as_text_on_the_results_page():
    results_page = pytest.importorskip("fuselens.cli.results_page")
    model = ModelProfile(
        f"Net{MARKUP}",
        forward_us=100.0,
        attributed_us=90.0,
        unattributed_us=10.0,
        lines=[LineTime(f"lib{MARKUP}.py", 3, f"Net.forward{MARKUP}", 60.0, 0.6, 2, ops=[MARKUP], clusters=[MARKUP])],
        clusters=[ClusterTime(f"c0{MARKUP}", 60.0, 0.6, 2, 20.0, 1.6, 1, 1)],
        opaque=[OpaqueTime(f"matmul{MARKUP}", 30.0, 0.3, ops=[f"mm{MARKUP}"])],
    )
    profile = Profile("cuda", f"NVIDIA H200{MARKUP}", 10, 3, step=f"forward{MARKUP}", models=[model])
    view = profile_view(f"model{MARKUP}.py", profile)

    (figure,) = assert_shown_as_text(results_page.page(view))
    measured = figure[0][0]
    assert measured["x"] == [f"c0{SHOWN}", f"matmul{SHOWN}", "unattributed"]
    assert f"matmul{SHOWN}: mm{SHOWN}" in measured["hovertext"]


def test_a_profile_names_the_inputs_it_ran_at_and_why_they_are_smaller_than_the_analyzed_ones():
    ran = ModelProfile(
        "LlamaBlock", forward_us=100.0, attributed_us=100.0, unattributed_us=0.0, inputs=[[2, 256, 1024]]
    )
    ran.cpu_budget_bytes = 256 * 2**20
    profile = Profile("cpu", "cpu", 10, 3, models=[ran])
    view = profile_view("model.py", profile, analyzed_inputs={"LlamaBlock": [[4, 2048, 1024]]})
    assert view.models[0].heading.startswith(
        "LlamaBlock at 2×256×1024 (smaller than the analyzed 4×2048×1024, to move at most 256 MB a forward): "
    )
    same = profile_view("model.py", profile, analyzed_inputs={"LlamaBlock": [[2, 256, 1024]]})
    assert same.models[0].heading.startswith("LlamaBlock at 2×256×1024: where the time")


def test_a_model_not_profiled_says_why_in_place_of_an_empty_chart():
    """On every page that shows a profile (VS Code's panel, Neovim's markdown, the CLI's HTML)."""
    refused = ModelProfile("Huge", 0.0, 0.0, 0.0, problem="its forward moves 8.0 GB even at (2, 8192)")
    view = profile_view("model.py", Profile("cpu", "cpu", 10, 3, models=[refused]))
    (model,) = view.models
    assert model.no_data == "Huge was not profiled: its forward moves 8.0 GB even at (2, 8192)"
    assert model.chart["data"] == [] and model.rows == []
    assert "_No data: Huge was not profiled: its forward moves 8.0 GB" in view_markdown(view)
    assert "| line |" not in view_markdown(view)  # no empty table either
    results_page = pytest.importorskip("fuselens.cli.results_page")
    page = results_page.page(view)
    assert "No data: Huge was not profiled" in page and "plotly" not in page.lower()


def test_a_model_validated_at_each_of_its_sizes_compares_each_with_the_same_size_before():
    def over_seq(fused: float) -> ValidationReport:
        report = timed_report((fused, fused))
        (model,) = report.models
        report.models = [replace(model, inputs=[[seq, 1024]], binding={"seq": seq}) for seq in (1, 4096)]
        report.models[0].clusters = [replace(c, timing=replace(c.timing, fused_us=fused / 8)) for c in model.clusters]
        return report

    earlier = ValidationRun("2025-01-30T09:00:00Z", "NVIDIA H200", over_seq(14.0))
    view = results_view(ValidationRun("2025-01-31T09:00:00Z", "NVIDIA H200", over_seq(12.0)), [earlier])
    short, long = view.models
    assert short.heading.startswith("Net at 1×1024") and long.heading.startswith("Net at 4096×1024")
    # Each size's chart has the one earlier run at that size: its fused times, not the other size's.
    assert series(short.chart, "fused, 2025-01-30 09:00 UTC")["y"] == [14.0 / 8, 14.0 / 8]
    assert series(long.chart, "fused, 2025-01-30 09:00 UTC")["y"] == [14.0, 14.0]
    assert len(short.history.rows) == len(long.history.rows) == 2
