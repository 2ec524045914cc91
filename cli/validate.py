"""`fuselens validate`: check kernels against eager and print one row per cluster; keep the run in the
file's validation history and write the results view (`--markdown`, `--html`) beside the earlier runs."""

from __future__ import annotations

import argparse
import json
import os
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fuselens.contracts.dynamic import describe_binding
from fuselens.contracts.options import AnalyzeOptions, ValidateOptions
from fuselens.contracts.results_view import ResultsView, results_view, view_markdown
from fuselens.contracts.validation import (
    RESULT_COLUMNS,
    BackwardCheck,
    ModelValidation,
    ValidationReport,
    timing_cells,
    training_cells,
)
from fuselens.server import history

from . import results_page
from .output import console_for_output


def run_validate(args: argparse.Namespace, analyze_options: AnalyzeOptions) -> int:
    missing = results_page.plotly_missing() if args.html else ""
    if missing:  # said before the validation runs (and torch loads), not after
        print(missing, file=sys.stderr)
        return 2
    from fuselens.pipeline.validate import validate_file

    console = console_for_output()
    options = ValidateOptions(
        interpret=args.interpret, clusters=args.cluster, benchmark=not args.no_benchmark, peak_gbps=args.peak_gbps
    )

    def progress(message: str, fraction=None) -> None:
        console.print(f"[dim]… {escape(message)}[/]")

    report = validate_file(args.file, analyze_options, options, progress)
    latest, earlier = history.record(args.file, report, _warn)
    write_results(args, report, results_view(latest, earlier))
    render_validation(report, console)
    return 0 if report.ok else 1


def write_results(args: argparse.Namespace, report: ValidationReport, view: ResultsView) -> None:
    """The files asked for: the report as JSON (what a remote runner hands back), the results view as
    markdown and as an HTML page."""
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report.to_dict(), fh, indent=2)
            fh.write("\n")
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write(view_markdown(view))
    if args.html:
        results_page.write_page(args.html, view)


def _warn(line: str) -> None:
    print(f"fuselens: {line}", file=sys.stderr)


def _err(value) -> str:
    return "—" if value is None else f"{value:.2e}"


def _backward_cell(check: BackwardCheck | None) -> str:
    """The gradients' check: its status and largest difference from eager, "—" without a backward kernel."""
    if check is None:
        return "—"
    style = "green" if check.status == "verified" else "bold red"
    return f"[{style}]{escape(check.status)}[/] {_err(check.max_abs)}"


def _kernels_cell(model: ModelValidation) -> str:
    """How many of the kernels reached at a binding computed what their lines do."""
    reached = [c for c in model.clusters if c.status != "not-reached"]
    verified = [c for c in reached if c.status == "verified"]
    style = "green" if len(verified) == len(reached) else "bold red"
    unreached = len(model.clusters) - len(reached)
    return f"[{style}]{len(verified)}/{len(reached)} verified[/]" + (f", {unreached} not reached" if unreached else "")


def render_bindings(name: str, models: list[ModelValidation], console: Console) -> None:
    """One row per binding of a model's declared sizes: its kernels' and whole model's checks, and the
    kernels the patched model launched (fewer at one size than at another: a kernel's `fits` said no
    there, and its lines ran)."""
    console.print(f"[bold]{escape(name)}[/] over its declared sizes")
    table = Table(show_edge=True, header_style="bold")
    for col in ("sizes", "inputs", "kernels", "worst |err|", "whole model", "kernel launches", "patched speedup"):
        table.add_column(col)
    for m in models:
        errors = [c.max_abs for c in m.clusters if c.max_abs is not None]
        whole = m.model
        style = {"matches": "green", "skipped": "yellow"}.get(whole.status, "bold red") if whole else ""
        table.add_row(
            escape(describe_binding(m.binding)),
            escape(", ".join(f"({', '.join(map(str, s))})" for s in m.inputs)),
            _kernels_cell(m),
            _err(max(errors) if errors else None),
            f"[{style}]{escape(whole.status)}[/]" if whole else "—",
            str(whole.kernel_launches) if whole and whole.kernel_launches is not None else "—",
            f"{whole.speedup:.2f}×" if whole and whole.speedup else "—",
        )
    console.print(table)
    console.print()


def render_validation(report: ValidationReport, console: Console) -> None:
    # Messages, names and devices are data, not markup: escaped, so that "[...]" in them prints as written.
    for problem in report.problems:
        console.print(f"[bold red]error[/] {escape(problem)}")
    where = "Triton interpreter on CPU" if report.mode == "interpret" else report.device
    for model in report.models:
        shapes = ", ".join(f"({', '.join(map(str, s))}) {d}" for s, d in zip(model.inputs, model.dtypes, strict=True))
        at = f" ({describe_binding(model.binding)})" if model.binding else ""
        console.print(f"[bold]{escape(model.name)}[/]{escape(at)} validated at {escape(shapes)} · {escape(where)}")
        table = Table(show_edge=True, header_style="bold")
        for col in (
            "cluster",
            "kernel",
            "status",
            "instances",
            "max |err|",
            "max rel",
            "tolerance",
            "backward",
            "note",
        ):
            table.add_column(col)
        timed = any(c.timing for c in model.clusters)
        if timed:
            for col in RESULT_COLUMNS[5:]:  # the results table's timing columns, the compile mode named
                table.add_column(col, justify="right")
        for c in model.clusters:
            style = {"verified": "green", "not-reached": "yellow"}.get(c.status, "bold red")
            row = [
                escape(c.id),
                escape(c.kernel),
                f"[{style}]{escape(c.status)}[/]",
                str(c.instances),
                _err(c.max_abs),
                _err(c.max_rel),
                f"{c.atol:g}/{c.rtol:g}" if c.atol is not None else "—",
                _backward_cell(c.backward),
                escape(c.message or (c.backward.message if c.backward else "")),
            ]
            if timed:
                row += [*timing_cells(c.timing), *training_cells(c.backward.timing if c.backward else None)]
            table.add_row(*row)
        console.print(table)
        m = model.model
        if m is not None:
            style = {"matches": "green", "skipped": "yellow"}.get(m.status, "bold red")
            detail = m.message or (f"max |err| {_err(m.max_abs)}" if m.max_abs is not None else "")
            applied = ", ".join(m.applied) or "none"
            outcome = f"[{style}]{escape(m.status)}[/] {escape(detail)}"
            launches = f" ({m.kernel_launches} kernel launches)" if m.kernel_launches is not None else ""
            console.print(f"  whole model with {escape(applied)} applied{launches}: {outcome}")
            for what, extra in (("in training mode", m.training), ("at other sizes", m.other_shapes)):
                if extra is not None:
                    style = {"matches": "green", "skipped": "yellow"}.get(extra.status, "bold red")
                    console.print(f"    {what}: [{style}]{escape(extra.status)}[/] {escape(extra.message)}")
            if m.speedup:
                console.print(f"  whole-model speedup: {m.speedup:.2f}×")
        console.print()
    for name in dict.fromkeys(m.name for m in report.models if m.binding):
        render_bindings(name, [m for m in report.models if m.name == name], console)
    if not report.models and not report.problems:
        console.print(f"nothing to validate: {escape(os.path.relpath(report.file))} has no fusable cluster")
