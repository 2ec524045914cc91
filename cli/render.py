"""Rich rendering of a report: the compiler-style tables `fuselens analyze` prints."""

from __future__ import annotations

import os

from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from fuselens.contracts.units import bytes_label
from fuselens.contracts.report import Cluster, Model, Report


def _saved(c: Cluster) -> str:
    if c.bytes_unfused in (None, 0) or c.bytes_fused is None:
        return "—"
    return f"{100 * (c.bytes_unfused - c.bytes_fused) / c.bytes_unfused:.0f}%"


def _lines(lines: list[int]) -> str:
    return f"{lines[0]}" if lines[0] == lines[1] else f"{lines[0]}–{lines[1]}"


def _rel(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def render_report(report: Report, explain_rejections: bool = False, show_kernels: bool = False,
                  console: Console | None = None) -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:  # logs and pipes: wide enough that tables stay one row per cluster
            console = Console(width=160)
    for problem in report.problems:
        where = f"{_rel(problem.file)}:{problem.line}" if problem.file else ""
        console.print(f"[bold red]error[/] {where} {problem.message}")
        if problem.hint:
            console.print(f"  [dim]hint:[/] {problem.hint}")
    for model in report.models:
        _render_model(console, report, model, explain_rejections, show_kernels)
    if not report.models and not report.problems:
        console.print(f"{_rel(report.file)}: no nn.Module classes found")


def _render_model(console: Console, report: Report, model: Model, explain: bool, show_kernels: bool) -> None:
    header = Text()
    header.append(f"{_rel(model.file)}:{model.line} ", style="dim")
    header.append(model.name, style="bold")
    if model.inputs:
        shapes = ", ".join(f"({', '.join(map(str, i.shape or []))}) {i.dtype}" for i in model.inputs)
        header.append(f"  inputs {shapes}", style="cyan")
        if model.inputs_source:
            header.append(f"  from {model.inputs_source}", style="dim")
    console.print(header)
    if model.status == "skipped":
        console.print(f"  [yellow]skipped[/]: {model.problem.message if model.problem else ''}")
        if model.notes:
            console.print(f"  [dim]{'; '.join(model.notes)}[/]")
        elif model.problem and model.problem.hint:
            console.print(f"  [dim]hint: {model.problem.hint}[/]")
        console.print()
        return
    if model.status == "error" and model.problem:
        p = model.problem
        console.print(f"  [bold red]error[/] {_rel(p.file or '')}:{p.line} {p.message}")
        if p.hint:
            console.print(f"  [dim]{p.hint}[/]")
        console.print()
        return
    totals = model.totals
    avoidable = totals.bytes_avoidable or 0
    cluster_traffic = sum((c.bytes_unfused or 0) * c.multiplicity for c in model.clusters if not c.branch)
    console.print(
        f"  {model.ops_total} ops traced · {len(model.clusters)} fusable cluster(s) · "
        f"{bytes_label(avoidable)} of {bytes_label(cluster_traffic)} cluster traffic avoidable "
        f"({bytes_label(totals.bytes_total)} moved by the whole forward) · {report.device.name if report.device else ''}")
    for brk in model.graph_breaks:
        console.print(f"  [yellow]graph break[/] line {brk.line}: {brk.reason}")
        if brk.code:
            console.print(f"    [dim]{brk.code}[/]")
    if model.clusters:
        table = Table(show_edge=True, header_style="bold")
        for col, justify in (("id", "left"), ("kind", "left"), ("ops", "left"), ("unfused → fused", "right"),
                             ("saved", "right"), ("regime", "left"), ("map", "left"), ("lines", "right"),
                             ("×", "right")):
            table.add_column(col, justify=justify)
        for c in model.clusters:
            ops = c.op_chain if len(c.ops) <= 6 else " → ".join(o.target for o in c.ops[:5]) + f" … ({len(c.ops)} ops)"
            traffic = f"{bytes_label(c.bytes_unfused)} → {bytes_label(c.bytes_fused)}"
            style = {"exact": "green", "pointer": "yellow"}.get(c.mapping, "red")
            kind = c.kind + (" *" if c.branch else "")
            table.add_row(c.id, kind, ops, traffic, _saved(c), c.regime or "—", f"[{style}]{c.mapping}[/]",
                          _lines(c.lines), str(c.multiplicity))
        console.print(table)
        for c in model.clusters:
            if c.branch:
                console.print(f"  [dim]* {c.id} is {c.branch}[/]")
        pointers = [c for c in model.clusters if c.mapping != "exact"]
        for c in pointers:
            console.print(f"  [dim]{c.id} maps as {c.mapping}: {c.mapping_detail}[/]")
    if model.patterns:
        table = Table(title="patterns", show_edge=True, header_style="bold", title_justify="left")
        for col in ("pattern", "lines", "eager → fused", "bound", "×", "clusters", "what"):
            table.add_column(col)
        for p in model.patterns:
            est = p.estimate
            table.add_row(p.name, _lines(p.lines), f"{bytes_label(est.bytes_before)} → {bytes_label(est.bytes_after)}",
                          f"{est.speedup_bound:.2f}×" if est.speedup_bound else "—", str(p.multiplicity),
                          ", ".join(p.clusters) or "—", p.summary)
        console.print(table)
    if model.rejections:
        if explain:
            table = Table(title="left unfused", show_edge=True, header_style="bold", title_justify="left")
            for col in ("op", "line", "reason", "×", "why"):
                table.add_column(col)
            for r in model.rejections:
                table.add_row(r.ops[0].target, str(r.lines[0]), r.reason, str(r.multiplicity), r.detail)
            console.print(table)
            for c in model.clusters:
                for b in c.boundaries:
                    console.print(f"  [dim]{c.id}: `{b.op.target}` (line {b.op.line}) not joined: {b.reason}: {b.detail}[/]")
        else:
            console.print(f"  [dim]{len(model.rejections)} op(s) left unfused; --explain-rejections says why[/]")
    if model.inductor is not None:
        _render_inductor(console, model)
    elif model.inductor_error:
        console.print(f"  [yellow]torch.compile comparison failed[/]: {model.inductor_error}")
    for note in model.notes:
        console.print(f"  [dim]note: {note}[/]")
    if show_kernels:
        for c in model.clusters:
            if c.kernel:
                console.print(f"\n[bold]{c.kernel.name}[/] ({c.kernel.strategy})")
                console.print(Syntax(c.kernel.source, "python", theme="ansi_dark", line_numbers=False))
    console.print()


def _render_inductor(console: Console, model: Model) -> None:
    comparison = model.inductor
    counts = comparison.status_counts()
    backend = "Inductor's Triton backend for CPU tensors" if comparison.backend == "triton-cpu" else "Inductor on CUDA"
    table = Table(title=f"torch.compile ({backend}): agrees on {counts.get('agree', 0)}/{len(comparison.clusters)}",
                  show_edge=True, header_style="bold", title_justify="left")
    for col in ("cluster", "status", "Inductor kernels", "difference"):
        table.add_column(col)
    for c in comparison.clusters:
        names = sorted({k.name for i in c.instances for k in i.kernels})
        style = {"agree": "green", "not-found": "dim"}.get(c.status, "yellow")
        table.add_row(c.cluster, f"[{style}]{c.status}[/]", ", ".join(names) or "—", c.summary)
    console.print(table)
    for u in comparison.unmatched:
        console.print(f"  [yellow]only torch.compile fuses[/] {u.summary} ({u.name})")
