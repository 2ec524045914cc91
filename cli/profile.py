"""`fuselens profile`: where a forward's measured time goes, by line and by cluster."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fuselens.contracts.options import AnalyzeOptions, ProfileOptions
from fuselens.contracts.profile import ModelProfile, Profile
from fuselens.contracts.profile_view import profile_view, shown_path, time_text
from fuselens.contracts.report import Report
from fuselens.contracts.results_view import view_markdown
from fuselens.contracts.units import bytes_label
from fuselens.pipeline.unanalyzed import unanalyzed_models

from . import results_page
from .output import console_for_output
from .save_corpus import print_corpora


def run_profile(args: argparse.Namespace, analyze_options: AnalyzeOptions) -> int:
    missing = results_page.plotly_missing() if args.html else ""
    if missing:  # said before the models run, not after
        print(missing, file=sys.stderr)
        return 2
    from fuselens.pipeline.profile import profile_file

    console = console_for_output()
    options = ProfileOptions(
        iterations=args.iterations, warmup=args.warmup, device=args.on or "", train=args.train, full_size=args.full_size
    )

    def progress(message: str, fraction=None) -> None:
        console.print(f"[dim]… {escape(message)}[/]", highlight=False)

    report = profile_file(args.file, analyze_options, options, progress)
    if args.json:
        from fuselens.contracts.schema import validate_report

        data = report.to_dict()
        validate_report(data)
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
    if report.profile is not None and (args.markdown or args.html):
        view = profile_view(report.file, report.profile, report.libraries)
        if args.markdown:
            with open(args.markdown, "w", encoding="utf-8") as fh:
                fh.write(view_markdown(view))
        if args.html:
            results_page.write_page(args.html, view)
    render_profile(report, console, args.top)
    if args.save_corpus:
        print_corpora(report, console)
    unprofiled = [] if report.problems else unanalyzed_models(report)
    for line in unprofiled:
        console.print(f"[red]not profiled[/]: {escape(line)}", highlight=False)
    failed = not report.profile or report.profile.problems or any(m.problem for m in report.profile.models)
    return 1 if report.problems or unprofiled or failed else 0


def render_profile(report: Report, console: Console, top: int = 12) -> None:
    for problem in report.problems:
        console.print(f"[red]{escape(problem.file or report.file)}:{problem.line}: {escape(problem.message)}[/]")
    profile = report.profile
    if profile is None:
        return
    for missing in profile.problems:
        console.print(f"[red]{escape(missing)}[/]: run with --on cpu for each op's CPU time here")
    for model in profile.models:
        _render_model(console, report, profile, model, top)


def _render_model(console: Console, report: Report, profile: Profile, model: ModelProfile, top: int) -> None:
    console.print(f"[bold]{escape(model.name)}[/]  {escape(_how(profile))}", highlight=False)
    if model.problem:
        console.print(f"  [red]{escape(model.problem)}[/]")
        return
    smaller = _smaller_inputs(report, model)
    if smaller:
        console.print(f"  [yellow]{escape(smaller)}[/]", highlight=False)
    if model.sizes_seen:
        seen = "; ".join(f"{size} = {', '.join(map(str, values))}" for size, values in model.sizes_seen.items())
        console.print(f"  sizes seen: {escape(seen)}", highlight=False)
    attributed = model.attributed_us / model.forward_us if model.forward_us else 0.0
    wall = f" · {_ms(model.wall_us)} wall, timed alone" if model.wall_us is not None else ""
    training = profile.step != "forward"
    backward = f" ({_ms(model.backward_us)} of it in the backward)" if training else ""
    console.print(
        f"  {_ms(model.forward_us)} per {profile.step}{backward}{wall} · {attributed:.1%} attributed to the "
        f"model's code, {_ms(model.unattributed_us)} not",
        highlight=False,
    )
    lines = Table(title="lines by time", title_justify="left", header_style="bold")
    columns = ["line", "time", *(["backward"] if training else []), "%", "calls", "ops", "clusters"]
    for column in columns:
        lines.add_column(column, justify="left" if column in ("line", "ops", "clusters") else "right")
    for line in model.lines[:top]:
        where = f"{shown_path(line.file, report.file, report.libraries)}:{line.line}"
        if line.entry_line is not None:
            where += f" (from line {line.entry_line})"
        cells = [where, _ms(line.us), *([_ms(line.backward_us)] if training else []), f"{line.share:.1%}"]
        lines.add_row(*cells, str(line.calls), ", ".join(line.ops[:4]), ", ".join(line.clusters))
    console.print(lines)
    if model.clusters:
        clusters = Table(title="clusters by measured time", title_justify="left", header_style="bold")
        columns = ["cluster", "time", *(["backward"] if training else []), "%", "calls", "fused, predicted",
                   f"{profile.step} if fused", "rank by bytes"]  # fmt: skip
        for column in columns:
            clusters.add_column(column, justify="left" if column == "cluster" else "right")
        for c in model.clusters:
            cells = [c.id, _ms(c.us), *([_ms(c.backward_us)] if training else []), f"{c.share:.1%}", str(c.calls)]
            clusters.add_row(*cells, _ms(c.predicted_fused_us), f"{c.amdahl_speedup:.3f}×", str(c.rank_by_bytes))
        console.print(clusters)
    if model.opaque:
        parts = [f"{o.kind} {_ms(o.us)} ({o.share:.1%})" for o in model.opaque]
        console.print("  outside clusters: " + " · ".join(parts), highlight=False)
    if model.applied:
        _render_applied(console, model)


def _render_applied(console: Console, model: ModelProfile) -> None:
    """The applied kernels against the code before apply, measured in the same run."""
    before = _ms(model.before_us)
    console.print(f"  before apply: {before} per forward; now {_ms(model.forward_us)}", highlight=False)
    table = Table(title="applied kernels: predicted against measured", title_justify="left", header_style="bold")
    for column in ("kernel", "cluster", "kind", "before", "predicted fused", "measured", "error"):
        table.add_column(column, justify="left" if column in ("kernel", "cluster", "kind") else "right")
    for a in model.applied:
        measured = _ms(a.measured_us) + (" (reference)" if a.reference else "")
        error = "—" if a.reference else f"{a.error:+.0%}"
        table.add_row(a.kernel, a.cluster, a.kind, _ms(a.unfused_us), _ms(a.predicted_fused_us), measured, error)
    console.print(table)
    if model.cost_model_error:
        errors = " · ".join(f"{kind} {error:+.0%}" for kind, error in model.cost_model_error.items())
        console.print(f"  cost model's mean error by kind (predicted / measured − 1): {errors}", highlight=False)
    if model.fell_back:
        console.print(
            f"  {', '.join(model.fell_back)} ran their reference here (no CUDA): their times are not the kernels'",
            highlight=False,
        )


def _smaller_inputs(report: Report, model: ModelProfile) -> str:
    """What the profile says when a CPU ran the model at smaller inputs than the analysis's."""
    analyzed = next((m for m in report.models if m.name == model.name), None)
    if analyzed is None or model.cpu_budget_bytes is None:
        return ""
    before = [list(i.shape or []) for i in analyzed.inputs]
    if not model.inputs or model.inputs == before:
        return ""
    return (
        f"profiled at {_shapes(model.inputs)}, not the analyzed {_shapes(before)}: on a CPU a forward moves at most "
        f"{bytes_label(model.cpu_budget_bytes)} by default, with the same clusters (--full-size: as analyzed)"
    )


def _shapes(shapes: list[list[int]]) -> str:
    return ", ".join(f"({', '.join(map(str, shape))})" for shape in shapes)


def _how(profile: Profile) -> str:
    what = "GPU kernel time" if profile.mode == "cuda" else "CPU time of each op"
    steps = "forwards" if profile.step == "forward" else "training steps"
    return f"{what} on {profile.device}, mean of {profile.iterations} {steps} after {profile.warmup} warm-up"


def _ms(us: float | None) -> str:
    return "—" if us is None else time_text(us)
