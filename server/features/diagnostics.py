"""Diagnostics: one per cluster, plus patterns, graph breaks, rejections and problems."""

from __future__ import annotations

import os

from lsprotocol import types as lsp

from fuselens.contracts.report import Cluster, Problem, Report
from fuselens.contracts.units import bytes_label
from fuselens.worker.protocol import Failure

from .text import lines_range, path_to_uri, same_file

SOURCE = "fuselens"
SEVERITY = {
    "error": lsp.DiagnosticSeverity.Error,
    "warning": lsp.DiagnosticSeverity.Warning,
    "information": lsp.DiagnosticSeverity.Information,
    "hint": lsp.DiagnosticSeverity.Hint,
}


def cluster_message(c: Cluster) -> str:
    saved = ""
    if c.bytes_unfused and c.bytes_fused is not None:
        saved = f" (−{100 * (c.bytes_unfused - c.bytes_fused) / c.bytes_unfused:.0f}% DRAM traffic)"
    text = f"fusable: {c.op_chain}, {bytes_label(c.bytes_unfused)} → {bytes_label(c.bytes_fused)}{saved}"
    if c.regime:
        text += f" [{c.regime}]"
    if c.multiplicity > 1:
        text += f" ×{c.multiplicity} ({bytes_label(c.total_bytes_unfused)} → {bytes_label(c.total_bytes_fused)} in all)"
    if c.branch:
        text += f" — {c.branch}"
    if c.mapping != "exact":
        text += f"; not replaceable here: {c.mapping_detail}"
    return text


def diagnostics(
    report: Report, path: str, lines: list[str], severity: str, show: list[str], failure: Failure | None = None
) -> list[lsp.Diagnostic]:
    out: list[lsp.Diagnostic] = []
    if failure is not None:
        out.append(_failure(failure, path, lines))
    if "problems" in show:
        for problem in report.problems:
            out.append(_problem(problem, path, lines))
    for model in report.models:
        if model.problem and model.status == "error" and "problems" in show:
            out.append(_problem(model.problem, path, lines, prefix=f"{model.name}: "))
        if model.status == "skipped" and not model.notes and "problems" in show:
            out.append(
                lsp.Diagnostic(
                    range=lines_range(lines, model.line, model.line),
                    severity=lsp.DiagnosticSeverity.Hint,
                    message=f"{model.name} was not analyzed: no example inputs. {model.problem.hint if model.problem else ''}",
                    source=SOURCE,
                    code="no-inputs",
                )
            )
        if "breaks" in show:
            for brk in model.graph_breaks:
                if same_file(brk.file, path):
                    out.append(
                        lsp.Diagnostic(
                            range=lines_range(lines, brk.line, brk.line),
                            severity=lsp.DiagnosticSeverity.Warning,
                            source=SOURCE,
                            code="graph-break",
                            message=f"graph break: {brk.reason}",
                        )
                    )
        if "clusters" in show:
            for c in model.clusters:
                if same_file(c.file, path):
                    out.append(_cluster(c, lines, SEVERITY.get(severity, lsp.DiagnosticSeverity.Information)))
        if "patterns" in show:
            for p in model.patterns:
                if not same_file(p.file, path) or not p.estimate.speedup_bound or p.estimate.speedup_bound <= 1.0:
                    continue
                est = p.estimate
                message = (
                    f"pattern {p.name}: {bytes_label(est.bytes_before)} → {bytes_label(est.bytes_after)}, "
                    f"bound {est.speedup_bound:.2f}× — {p.summary}"
                )
                if p.multiplicity > 1:
                    message += f" ×{p.multiplicity}"
                out.append(
                    lsp.Diagnostic(
                        range=lines_range(lines, p.lines[0], p.lines[1]),
                        severity=lsp.DiagnosticSeverity.Hint,
                        source=SOURCE,
                        code=f"pattern:{p.name}",
                        message=message,
                    )
                )
        if model.inductor is not None and "patterns" in show:
            for fusion in model.inductor.unmatched:
                lines_here = [o.line for o in fusion.ops if o.line and same_file(o.file, path)]
                if len(lines_here) < 2:
                    continue
                reasons = sorted({o.reason for o in fusion.ops if o.reason})
                why = f"; fuselens did not ({', '.join(reasons)})" if reasons else ""
                out.append(
                    lsp.Diagnostic(
                        range=lines_range(lines, min(lines_here), max(lines_here)),
                        severity=lsp.DiagnosticSeverity.Hint,
                        source=SOURCE,
                        code="inductor-only",
                        message=f"torch.compile fuses {fusion.summary} in {fusion.name}{why}",
                    )
                )
        if "rejections" in show:
            for r in model.rejections:
                if same_file(r.file, path):
                    out.append(
                        lsp.Diagnostic(
                            range=lines_range(lines, r.lines[0], r.lines[1]),
                            severity=lsp.DiagnosticSeverity.Hint,
                            source=SOURCE,
                            code=r.reason,
                            message=f"not fused: `{r.ops[0].target}` — {r.reason}: {r.detail}",
                        )
                    )
    return out


def _cluster(c: Cluster, lines: list[str], severity: lsp.DiagnosticSeverity) -> lsp.Diagnostic:
    related = [
        lsp.DiagnosticRelatedInformation(
            location=lsp.Location(
                path_to_uri(op.file),
                lines_range(lines, op.line, op.line)
                if same_file(op.file, c.file)
                else lsp.Range(lsp.Position(op.line - 1, 0), lsp.Position(op.line - 1, 0)),
            ),
            message=f"{op.target} {'×'.join(map(str, op.shape or []))} {op.dtype or ''}".strip(),
        )
        for op in c.ops
        if op.file and op.line
    ]
    return lsp.Diagnostic(
        range=lines_range(lines, c.lines[0], c.lines[1]),
        severity=severity,
        source=SOURCE,
        code=c.kind,
        message=cluster_message(c),
        related_information=related,
        data={"cluster": c.id},
    )


def _problem(problem: Problem, path: str, lines: list[str], prefix: str = "") -> lsp.Diagnostic:
    here = problem.file is None or same_file(problem.file, path)
    line = problem.line if here and problem.line else 1
    message = prefix + problem.message
    if not here and problem.file:
        message += f" (in {os.path.basename(problem.file)}:{problem.line})"
    if problem.hint:
        message += f"\n{problem.hint}"
    severity = lsp.DiagnosticSeverity.Error if problem.kind != "inputs" else lsp.DiagnosticSeverity.Warning
    rng = lines_range(lines, line, line)
    if problem.column and here:
        rng = lsp.Range(lsp.Position(line - 1, max(problem.column - 1, 0)), rng.end)
    return lsp.Diagnostic(range=rng, severity=severity, source=SOURCE, code=problem.kind, message=message)


def _failure(error: Failure, path: str, lines: list[str]) -> lsp.Diagnostic:
    here = error.file and same_file(error.file, path)
    line = error.line if here and error.line else 1
    kind = error.kind
    headline = {
        "timeout": "analysis timed out",
        "memory": "analysis ran out of memory",
        "crash": "analysis crashed",
        "internal": "fuselens failed (a bug: please report it)",
        "unavailable": "the analysis worker is unavailable",
    }.get(kind, "analysis failed")
    return lsp.Diagnostic(
        range=lines_range(lines, line, line),
        severity=lsp.DiagnosticSeverity.Error,
        source=SOURCE,
        code=kind,
        message=f"{headline}: {error.message}",
    )
