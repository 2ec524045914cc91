"""Rich rendering of a report: the compiler-style tables `fuselens analyze` prints.

Everything a report says (messages, hints, reasons, details, code lines, file names) is data,
not markup: it goes to rich through `_literal`, so that a hint naming the TOML table
"[tool.fuselens.models.RMSNorm]" prints as written instead of being read as a style tag."""

from __future__ import annotations

import os

from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from fuselens.contracts.inductor import InductorComparison
from fuselens.contracts.report import PASS_THROUGH_BACKWARD, TORCH_BACKWARD, Cluster, Model, Problem, Report
from fuselens.contracts.units import bytes_label

from .output import console_for_output
from .render_dynamic import render_dynamic


def render_report(
    report: Report, explain_rejections: bool = False, show_kernels: bool = False, console: Console | None = None
) -> None:
    console = console or console_for_output()
    for problem in report.problems:
        _render_problem(console, problem)
    for model in report.models:
        _render_model(console, report, model, explain_rejections, show_kernels)
    if not report.models and not report.problems:
        console.print(
            f"{_literal(_rel(report.file))}: no models found (nn.Module classes, or model objects bound at module level)"
        )


def _render_problem(console: Console, problem: Problem) -> None:
    """A problem with the whole file (it could not be read, parsed or imported), and its hint."""
    where = f"{_rel(problem.file)}:{problem.line}" if problem.file else ""
    console.print(f"[bold red]error[/] {_literal(where)} {_literal(problem.message)}")
    if problem.hint:
        console.print(f"  [dim]hint:[/] {_literal(problem.hint)}")


def _render_model(console: Console, report: Report, model: Model, explain: bool, show_kernels: bool) -> None:
    """One model: its header line, then why it was not analyzed or what the analysis found."""
    console.print(_header(model))
    if model.status == "skipped":
        _render_skipped(console, model)
    elif model.status == "error" and model.problem:
        _render_error(console, model.problem)
    else:
        _render_findings(console, report, model, explain, show_kernels)
    console.print()


def _header(model: Model) -> Text:
    """`file:line Class  inputs (shape) dtype, ...  from <source>`."""
    header = Text()
    header.append(f"{_rel(model.file)}:{model.line} ", style="dim")
    header.append(model.name, style="bold")
    if model.inputs:
        shapes = ", ".join(f"({', '.join(map(str, i.shape or []))}) {i.dtype}" for i in model.inputs)
        header.append(f"  inputs {shapes}", style="cyan")
        if model.inputs_source:
            header.append(f"  from {model.inputs_source}", style="dim")
    return header


def _render_skipped(console: Console, model: Model) -> None:
    """A model not analyzed (no example inputs, say): why, then its notes or else the hint."""
    console.print(f"  [yellow]skipped[/]: {_literal(model.problem.message if model.problem else '')}")
    if model.notes:
        console.print(f"  [dim]{_literal('; '.join(model.notes))}[/]")
    elif model.problem and model.problem.hint:
        console.print(f"  [dim]hint: {_literal(model.problem.hint)}[/]")


def _render_error(console: Console, problem: Problem) -> None:
    """A model whose analysis failed: where and why, and the hint."""
    where = f"{_rel(problem.file or '')}:{problem.line}"
    console.print(f"  [bold red]error[/] {_literal(where)} {_literal(problem.message)}")
    if problem.hint:
        console.print(f"  [dim]{_literal(problem.hint)}[/]")


def _render_findings(console: Console, report: Report, model: Model, explain: bool, show_kernels: bool) -> None:
    """An analyzed model's sections, in the order they print."""
    _render_totals(console, report, model)
    if model.partial:
        console.print(f"  [yellow]partly analyzed[/]: {_literal(model.partial)}")
    _render_graph_breaks(console, model)
    _render_clusters(console, model)
    render_dynamic(console, model)
    _render_patterns(console, model)
    _render_rejections(console, model, explain)
    _render_comparison(console, model)
    _render_notes(console, model)
    if show_kernels:
        _render_kernels(console, model)


def _render_totals(console: Console, report: Report, model: Model) -> None:
    """One line: ops traced, clusters, the traffic fusing them avoids of theirs and of the forward's, the device."""
    avoidable = model.totals.bytes_avoidable or 0
    # Branch clusters are on paths the main trace did not take: their traffic is not part of this forward.
    cluster_traffic = sum((c.bytes_unfused or 0) * c.multiplicity for c in model.clusters if not c.branch)
    device = report.device.name if report.device else ""
    console.print(
        f"  {model.ops_total} ops traced · {len(model.clusters)} fusable cluster(s) · "
        f"{bytes_label(avoidable)} of {bytes_label(cluster_traffic)} cluster traffic avoidable "
        f"({bytes_label(model.totals.bytes_total)} moved by the whole forward) · {_literal(device)}"
    )
    if model.training:
        console.print(
            "  training mode: dropout draws a random mask and BatchNorm updates its running statistics, "
            "so neither is fused"
        )


def _render_graph_breaks(console: Console, model: Model) -> None:
    """Each graph break: its line and reason, and the code that caused it."""
    for brk in model.graph_breaks:
        where = _literal(_where(brk.file, [brk.line, brk.line], model.file))
        where = where if not where.isdigit() else f"line {where}"
        reached = f" (reached from line {brk.reached_from.line})" if brk.reached_from else ""
        times = f" ×{brk.multiplicity}" if brk.multiplicity > 1 else ""
        console.print(f"  [yellow]graph break[/] {where}{reached}{times}: {_literal(brk.reason)}")
        if brk.code:
            console.print(f"    [dim]{_literal(brk.code)}[/]")


def _render_clusters(console: Console, model: Model) -> None:
    """The cluster table, then a note for each cluster on a branch and each that is not applied by an edit."""
    if not model.clusters:
        return
    console.print(_cluster_table(model.clusters, model.file))
    for c in model.clusters:
        if c.branch:
            console.print(f"  [dim]* {_literal(c.id)} is {_literal(c.branch)}[/]")
    for c in model.clusters:
        if c.applies == "edit":
            continue
        reached = f"; reached from line {c.reached_from.line}" if c.reached_from else ""
        how = "applies as a library patch" if c.applies == "patch" else "does not apply"
        detail = c.apply_detail or c.mapping_detail
        console.print(f"  [dim]{_literal(c.id)} {how}: {_literal(detail)}{reached}[/]")
    for c in model.clusters:
        if not c.backward and c.kernel is not None:
            console.print(f"  [dim]{_literal(c.id)} has no backward kernel: {_literal(c.backward_detail)}[/]")
    _render_training(console, model)


def _backward_cell(c: Cluster) -> str:
    """How the cluster's backward runs: one kernel, nothing to compute, torch's scatter into a table
    (the forward still fused), or its own ops in eager."""
    if c.backward == PASS_THROUGH_BACKWARD:
        return "[green]pass-through[/]"
    if c.backward == TORCH_BACKWARD:
        return "[green]torch[/]"
    return "[green]kernel[/]" if c.backward else "[dim]eager[/]"


def _render_training(console: Console, model: Model) -> None:
    """How many clusters train with their kernels (a backward kernel, or none needed), and what their forwards keep for the
    backward against what eager autograd keeps for the same ops."""
    trained = [c for c in model.clusters if c.backward]
    if not trained:
        return
    line = f"  training: {len(trained)} of {len(model.clusters)} cluster(s) train with their kernels"
    passed = sum(c.backward == PASS_THROUGH_BACKWARD for c in trained)
    if passed:
        line += f" ({passed} of them pass their outputs' gradients on, with nothing to compute)"
    scattered = sum(c.backward == TORCH_BACKWARD for c in trained)
    if scattered:
        line += f" ({scattered} with torch's scatter of an embedding's gradient into its table)"
    measured = [c for c in trained if c.saved_bytes_fused is not None and c.saved_bytes_eager is not None]
    if measured:
        fused = sum((c.saved_bytes_fused or 0) * c.multiplicity for c in measured)
        eager = sum((c.saved_bytes_eager or 0) * c.multiplicity for c in measured)
        line += f"; their forwards keep {bytes_label(fused)} for the backward (eager autograd: {bytes_label(eager)})"
    console.print(line)


_CLUSTER_COLUMNS: tuple[tuple[str, JustifyMethod], ...] = (
    ("id", "left"),
    ("kind", "left"),
    ("ops", "left"),
    ("unfused → fused", "right"),
    ("saved", "right"),
    ("regime", "left"),
    ("applies", "left"),
    ("backward", "left"),
    ("lines", "right"),
    ("×", "right"),
)


def _cluster_table(clusters: list[Cluster], model_file: str) -> Table:
    table = Table(show_edge=True, header_style="bold")
    for col, justify in _CLUSTER_COLUMNS:
        table.add_column(col, justify=justify)
    for c in clusters:
        table.add_row(*_cluster_row(c, model_file))
    return table


def _cluster_row(c: Cluster, model_file: str) -> list[str]:
    """id, kind (`*` on a branch), the op chain (the first five of a long one), traffic, saving,
    regime, how it applies (edit, patch, no) in its colour, whether its gradients are a kernel, lines,
    multiplicity."""
    ops = c.op_chain if len(c.ops) <= 6 else " → ".join(o.target for o in c.ops[:5]) + f" … ({len(c.ops)} ops)"
    traffic = f"{bytes_label(c.bytes_unfused)} → {bytes_label(c.bytes_fused)}"
    style = {"edit": "green", "patch": "cyan"}.get(c.applies, "yellow")
    kind = c.kind + (" *" if c.branch else "")
    return [
        _literal(c.id),
        _literal(kind),
        _literal(ops),
        traffic,
        _saved(c),
        _literal(c.regime or "—"),
        f"[{style}]{_literal(c.applies)}[/]",
        _backward_cell(c),
        _literal(_where(c.file, c.lines, model_file)),
        str(c.multiplicity),
    ]


def _render_patterns(console: Console, model: Model) -> None:
    """The compound fusions recognised (RMSNorm, SwiGLU, ...) and their estimated bound."""
    if not model.patterns:
        return
    table = Table(title="patterns", show_edge=True, header_style="bold", title_justify="left")
    for col in ("pattern", "lines", "eager → fused", "bound", "×", "clusters", "what"):
        table.add_column(col)
    for p in model.patterns:
        est = p.estimate
        traffic = f"{bytes_label(est.bytes_before)} → {bytes_label(est.bytes_after)}"
        bound = f"{est.speedup_bound:.2f}×" if est.speedup_bound else "—"
        table.add_row(
            _literal(p.name),
            _literal(_where(p.file, p.lines, model.file)),
            traffic,
            bound,
            str(p.multiplicity),
            _literal(", ".join(p.clusters) or "—"),
            _literal(p.summary),
        )
    console.print(table)
    for p in model.patterns:
        where = _literal(_where(p.file, p.lines, model.file))
        if p.rewrite is not None:
            runs = f" ({_literal(p.dims['backend_detail'])})" if p.dims.get("backend_detail") else ""
            console.print(
                f"  {_literal(p.name)} {where}: `fuselens apply` rewrites it ({p.rewrite.id}) as "
                f"{_literal(p.rewrite.call)}{runs}",
                highlight=False,
            )
        elif p.refusal:
            console.print(f"  {_literal(p.name)} {where}: no rewrite: {_literal(p.refusal_detail)}", highlight=False)


def _render_rejections(console: Console, model: Model, explain: bool) -> None:
    """With `explain`, the ops left unfused and why, then why each cluster stopped where it did;
    otherwise one line that counts them."""
    if not model.rejections:
        return
    if not explain:
        console.print(f"  [dim]{len(model.rejections)} op(s) left unfused; --explain-rejections says why[/]")
        return
    table = Table(title="left unfused", show_edge=True, header_style="bold", title_justify="left")
    for col in ("op", "line", "reason", "×", "why"):
        table.add_column(col)
    for r in model.rejections:
        table.add_row(
            _literal(r.ops[0].target),
            _literal(_where(r.file, r.lines, model.file)),
            _literal(r.reason),
            str(r.multiplicity),
            _literal(r.detail),
        )
    console.print(table)
    for c in model.clusters:
        for b in c.boundaries:
            console.print(
                f"  [dim]{_literal(c.id)}: `{_literal(b.op.target)}` (line {b.op.line}) not joined: "
                f"{_literal(b.reason)}: {_literal(b.detail)}[/]"
            )


def _render_comparison(console: Console, model: Model) -> None:
    """The torch.compile comparison (`--vs-inductor`), or why it is missing."""
    if model.inductor is not None:
        _render_inductor(console, model.inductor)
    elif model.inductor_error:
        console.print(f"  [yellow]torch.compile comparison failed[/]: {_literal(model.inductor_error)}")


def _render_inductor(console: Console, comparison: InductorComparison) -> None:
    """Per cluster, whether torch.compile fused the same ops, and the fusions only it makes."""
    counts = comparison.status_counts()
    backend = "Inductor's Triton backend for CPU tensors" if comparison.backend == "triton-cpu" else "Inductor on CUDA"
    table = Table(
        title=f"torch.compile ({backend}): agrees on {counts.get('agree', 0)}/{len(comparison.clusters)}",
        show_edge=True,
        header_style="bold",
        title_justify="left",
    )
    for col in ("cluster", "status", "Inductor kernels", "difference"):
        table.add_column(col)
    for c in comparison.clusters:
        names = sorted({k.name for i in c.instances for k in i.kernels})
        style = {"agree": "green", "not-found": "dim"}.get(c.status, "yellow")
        table.add_row(
            _literal(c.cluster),
            f"[{style}]{_literal(c.status)}[/]",
            _literal(", ".join(names) or "—"),
            _literal(c.summary),
        )
    console.print(table)
    for u in comparison.unmatched:
        why = sorted({o.reason for o in u.ops if o.reason})
        rejected = f"; fuselens did not ({', '.join(why)})" if why else ""
        console.print(
            f"  [yellow]only torch.compile fuses[/] {_literal(u.summary)} in {_literal(u.name)}{_literal(rejected)}"
        )


def _render_notes(console: Console, model: Model) -> None:
    for note in model.notes:
        console.print(f"  [dim]note: {_literal(note)}[/]")


def _render_kernels(console: Console, model: Model) -> None:
    """`--show-kernels`: each cluster's generated kernel and launcher, highlighted."""
    for c in model.clusters:
        if c.kernel:
            console.print(f"\n[bold]{_literal(c.kernel.name)}[/] ({_literal(c.kernel.strategy)})")
            console.print(Syntax(c.kernel.source, "python", theme="ansi_dark", line_numbers=False))


def _literal(value: object) -> str:
    """`value` as text rich prints as written: a report's text is data, and rich would read
    "[tool.fuselens.models.RMSNorm]" in a hint as a style tag and drop it."""
    return escape(str(value))


def _saved(c: Cluster) -> str:
    if c.bytes_unfused in (None, 0) or c.bytes_fused is None:
        return "—"
    return f"{100 * (c.bytes_unfused - c.bytes_fused) / c.bytes_unfused:.0f}%"


def _lines(lines: list[int]) -> str:
    return f"{lines[0]}" if lines[0] == lines[1] else f"{lines[0]}–{lines[1]}"


def _where(file: str, lines: list[int], model_file: str) -> str:
    """Lines of the model's own file by number; lines elsewhere (a library's) with the file's name."""
    if not file or os.path.abspath(file) == os.path.abspath(model_file):
        return _lines(lines)
    return f"{os.path.basename(file)}:{_lines(lines)}"


def _rel(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel
