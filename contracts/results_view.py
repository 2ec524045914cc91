"""The results view: what every place that shows a validation shows, put together once.

Per model: its results table (`validation.py`'s columns and rows), its chart (`chart.py`), and the
runs of the same file before it (`history.py`) as a small table.  The server sends it with every
validation (VS Code draws it in a webview; Neovim shows its markdown); the CLI writes it as
markdown (`--markdown`) or as an HTML page (`--html`).  Every cell is text here, so that no editor
formats a number of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .chart import results_figure
from .history import ValidationRun, headline, run_label
from .validation import (
    RESULT_COLUMNS,
    ModelValidation,
    cluster_errors,
    model_heading,
    result_rows,
    where_validated,
    whole_model_line,
)

HISTORY_TITLE = "Earlier runs of this file"
LATEST = "latest"  # the history table's first row: the run the view is of


@dataclass
class HistoryTable:
    """Runs of one model, newest first: the one the view is of, then the earlier ones (no rows when
    there are none), each with the headline number of every cluster (`history.headline`)."""

    columns: list[str] = field(default_factory=list)  # run, device, torch, revision, each cluster, whole model
    rows: list[list[str]] = field(default_factory=list)
    title: str = HISTORY_TITLE


@dataclass
class ModelResults:
    name: str
    heading: str  # "ExampleNet at 64×256 float32, in the Triton interpreter (numerics only)"
    rows: list[list[str]]  # the results table, in RESULT_COLUMNS
    whole_model: str  # the whole-model check's line ("" when it did not run)
    chart: dict[str, Any]  # a Plotly figure: {"data": [...], "layout": {...}}
    history: HistoryTable
    no_data: str = ""  # why there is no chart (and no table) to show, said in its place ("" when there is one)


@dataclass
class ResultsView:
    file: str
    time: str  # when the run finished (ISO 8601, UTC); "" when it was not recorded
    where: str  # "on NVIDIA H200", "in the Triton interpreter (numerics only)"
    summary: str  # the line under the title: where and when it ran, the versions, the revision
    revision: str  # the commit of the file's repository ("" when unknown)
    versions: dict[str, str]  # torch, triton
    columns: list[str]  # RESULT_COLUMNS
    models: list[ModelResults]
    problems: list[str]  # the report's problems, then each kernel check that ended in an error, with its reason
    earlier_runs: int  # how many runs of the file before this one the view compares with
    kind: str = "validation"  # what the view is of: "validation", or "profile" (`profile_view.py`)


def results_view(run: ValidationRun, earlier: Sequence[ValidationRun] = ()) -> ResultsView:
    """The view of `run`, beside the runs of the same file before it (`earlier`, oldest first)."""
    report = run.report
    where = where_validated(report)
    models = []
    for model in report.models:
        # The same model at the same sizes: a model with dynamic sizes has a validation per binding.
        before = [
            (r, m) for r in earlier for m in r.report.models if (m.name, m.binding) == (model.name, model.binding)
        ]
        models.append(
            ModelResults(
                name=model.name,
                heading=model_heading(model, where),
                rows=[list(row) for row in result_rows(model)],
                whole_model=whole_model_line(model),
                chart=results_figure(model, where, [(run_label(r), m) for r, m in before]),
                history=_history_table(run, model, before),
                no_data="" if model.clusters else f"{model.name} has no clusters to validate",
            )
        )
    return ResultsView(
        file=report.file,
        time=run.time,
        where=where,
        summary=_summary(run, where, len(earlier)),
        revision=run.revision or "",
        versions=dict(run.versions),
        columns=list(RESULT_COLUMNS),
        models=models,
        # A kernel whose check ended in an error says why here (the table has room for its status only);
        # the whole model's reason is in its line.
        problems=[*report.problems, *(e for m in report.models for e in cluster_errors(m))],
        earlier_runs=len(earlier),
    )


def _summary(run: ValidationRun, where: str, earlier: int) -> str:
    """The line under the view's title: "Validated on NVIDIA H200 at 2025-01-31 12:03 UTC · torch 2.13.0 · ..."."""
    parts = [f"Validated {where}" + (f" at {run_label(run)}" if run.time else "")]
    parts += [f"{name} {version}" for name, version in sorted(run.versions.items())]
    if run.revision:
        parts.append(f"revision {run.revision[:10]}")
    if earlier:
        parts.append(f"{earlier} earlier run{'s' if earlier > 1 else ''} of this file")
    return " · ".join(parts)


def _history_table(
    latest: ValidationRun, model: ModelValidation, before: list[tuple[ValidationRun, ModelValidation]]
) -> HistoryTable:
    if not before:
        return HistoryTable()
    ids = [c.id for c in model.clusters]
    rows = [_history_row(LATEST, latest, model, ids)]
    rows += [_history_row(run_label(run), run, m, ids) for run, m in reversed(before)]
    return HistoryTable(["run", "device", "torch", "revision", *ids, "whole model"], rows)


def _history_row(label: str, run: ValidationRun, model: ModelValidation, ids: list[str]) -> list[str]:
    checks = {c.id: c for c in model.clusters}
    device = "Triton interpreter" if run.report.mode == "interpret" else run.device
    revision = run.revision[:10] if run.revision else "—"
    whole = model.model.status if model.model else "—"
    return [label, device, run.versions.get("torch", "—"), revision, *(headline(checks.get(i)) for i in ids), whole]


# ---- as markdown (Neovim's :FuselensResults, the CLI's --markdown) --------------------------------


def view_markdown(view: ResultsView) -> str:
    """Every model's results table and its earlier runs, as markdown; the problems last."""
    parts = []
    for model in view.models:
        lines = [f"### {model.heading}", ""]
        lines += [f"_No data: {model.no_data}_"] if model.no_data else _markdown_table(view.columns, model.rows)
        if model.whole_model and model.whole_model != model.no_data:
            lines += ["", model.whole_model]
        history = model.history
        if history.rows:
            lines += ["", f"#### {history.title}", "", *_markdown_table(history.columns, history.rows)]
        parts.append("\n".join(lines))
    return "\n\n".join(parts + [f"_{p}_" for p in view.problems]) + "\n"


def _markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        _markdown_row(columns),
        "|" + "---|" * len(columns),
        *(_markdown_row(row) for row in rows),
    ]


def _markdown_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"
