"""`fuselens probe`: what the values flowing through each GEMM allow, site by site.

The models run in the worker process (`fuselens.worker`), as the editor's jobs do, never in this one:
the file's code, and the data function it names, are the user's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fuselens.contracts.options import AnalyzeOptions
from fuselens.contracts.probe import (
    MeasuredSpecialisation,
    ModelProbe,
    Opportunity,
    ProbeOptions,
    ProbeReport,
    ProbeSite,
    RoleSketch,
    rank_text,
)
from fuselens.contracts.probe_view import probe_view
from fuselens.contracts.results_view import view_markdown
from fuselens.contracts.units import bytes_label
from fuselens.server.probe_job import probe_in_worker
from fuselens.server.workers import JobFailed

from . import results_page
from .output import console_for_output


def run_probe(args: argparse.Namespace, analyze_options: AnalyzeOptions, measure: bool = False) -> int:
    """`fuselens probe`; with `measure` (`fuselens validate --probe`), each opportunity is also made with
    PyTorch's kernels and measured against the dense GEMM."""
    missing = results_page.plotly_missing() if args.html else ""
    if missing:  # said before the probe runs, not after
        print(missing, file=sys.stderr)
        return 2
    console = console_for_output()
    options = ProbeOptions(
        data=args.data or "",
        synthetic=args.synthetic,
        batches=args.batches,
        sample_every=args.sample_every or 0,
        device=args.on or "",
        working_directory=os.getcwd(),
        measure=measure,
    )

    def progress(message: str, fraction: float | None = None) -> None:
        if args.json != "-":
            console.print(f"[dim]… {escape(message)}[/]", highlight=False)

    try:
        report = asyncio.run(probe_in_worker(os.path.abspath(args.file), analyze_options, options, progress))
    except JobFailed as exc:
        print(f"fuselens: the probe did not finish ({exc.kind}): {exc}", file=sys.stderr)
        return 1
    if args.json:
        text = json.dumps(report.to_dict(), indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
    view = probe_view(report)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write(view_markdown(view))
    if args.html:
        results_page.write_page(args.html, view)
    if args.json != "-":
        render_probe(report, console)
    else:
        for line in _problems(report):
            print(f"fuselens: {line}", file=sys.stderr)
    return 0 if report.ok else 1


def _problems(report: ProbeReport) -> list[str]:
    return [*report.problems, *(f"{m.name}: {m.problem}" for m in report.models if m.problem)]


def render_probe(report: ProbeReport, console: Console) -> None:
    for problem in report.problems:
        console.print(f"[red]{escape(problem)}[/]", highlight=False)
    for model in report.models:
        _render_model(console, report, model)


def _render_model(console: Console, report: ProbeReport, model: ModelProbe) -> None:
    console.print(f"[bold]{escape(model.name)}[/]  data: {escape(model.data_source)}", highlight=False)
    if model.problem:
        console.print(f"  [red]{escape(model.problem)}[/]", highlight=False)
        return
    every = f", one call in {report.sample_every} sketched" if report.sample_every > 1 else ""
    console.print(f"  {model.batches} batches on {report.device}{every}", highlight=False)
    table = Table(title="GEMM sites", title_justify="left", header_style="bold", show_lines=True)
    for column in ("line", "op", "calls", "input", "weight", "output", "opportunities"):
        table.add_column(column, justify="left")
    for site in model.sites:
        roles = {r.role: r for r in site.roles}
        table.add_row(
            _where(site, report.file),
            escape(site.op),
            _calls(site),
            *(_role_cell(roles.get(role)) for role in ("input", "weight", "output")),
            _opportunities_cell(site.opportunities),
        )
    console.print(table)
    measured = [(site, m) for site in model.sites for m in site.measured]
    if measured:
        console.print(_measured_table(report, measured))


def _measured_table(report: ProbeReport, measured: list[tuple[ProbeSite, MeasuredSpecialisation]]) -> Table:
    table = Table(
        title=f"Opportunities made with PyTorch's kernels, on {report.measured_on}",
        title_justify="left",
        header_style="bold",
    )
    for column in (
        "line",
        "opportunity",
        "made with",
        "error",
        "per-tensor error",
        "dense ms",
        "made ms",
        "kernel alone ms",
        "note",
    ):
        table.add_column(column, justify="left")
    for site, m in measured:
        speedup = f" ({m.speedup:.2f}×)" if m.speedup else ""
        table.add_row(
            _where(site, report.file),
            escape(m.kind),
            escape(m.implementation or "—"),
            "—" if m.error is None else f"{m.error:.2%}",
            "—" if m.per_tensor_error is None else f"{m.per_tensor_error:.2%}",
            "—" if m.dense_ms is None else f"{m.dense_ms:.4f}",
            "—" if m.specialised_ms is None else f"{m.specialised_ms:.4f}{speedup}",
            "—" if m.kernel_speedup is None else f"{m.kernel_ms:.4f} ({m.kernel_speedup:.2f}×)",
            escape(m.note),
        )
    return table


def _where(site: ProbeSite, home: str) -> str:
    shown = os.path.basename(site.file) if site.file == home else site.file
    return escape(f"{shown}:{site.line}")


def _calls(site: ProbeSite) -> str:
    text = f"{site.calls}"
    if site.layers > 1:
        text += f"\n{site.layers} layers"
    if site.sampled != site.calls:
        text += f"\n{site.sampled} sketched"
    text += f"\n{site.distinct_inputs} distinct inputs"
    if site.residual_ratio is not None:
        text += f"\nresidual ratio {site.residual_ratio:.1%}"
    return text


def _role_cell(sketch: RoleSketch | None) -> str:
    if sketch is None:
        return "—"
    lines = [
        f"{tuple(sketch.shape)}",
        f"zeros {sketch.zero_fraction:.1%} · 2:4 {sketch.sparse_24_fraction:.1%}",
        f"max/median ch {sketch.channel_max_to_median:.1f}",
        f"int8 {sketch.int8_error:.2%}/{sketch.int8_channel_error:.2%} ch",
        f"fp8 {sketch.fp8_error:.2%}/{sketch.fp8_channel_error:.2%} ch",
    ]
    if sketch.outlier_channels:
        lines.append(f"outliers {sketch.outlier_channels[:8]}")
    if sketch.effective_rank is not None:
        lines.append(f"rank {rank_text(sketch)} of {sketch.rank_of}")
    return escape("\n".join(lines))


def _opportunities_cell(found: list[Opportunity]) -> str:
    if not found:
        return "[dim]none[/]"
    parts = []
    for o in found:
        saving = []
        if o.flops_saved:
            saving.append(f"{o.flops_saved / 1e6:.3g} MFLOP")
        if o.bytes_saved:
            saving.append(bytes_label(o.bytes_saved))
        error = "exact" if o.error is None else f"error {o.error:.2%}"
        parts.append(
            f"[bold]{escape(o.kind)}[/]: {escape(o.summary)}\n  {escape(o.evidence)}\n"
            f"  saves {escape(' + '.join(saving) or 'nothing measurable')} per forward · {escape(error)}"
        )
    return "\n".join(parts)
