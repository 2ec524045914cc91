"""Diagnostics: one per cluster, plus patterns, graph breaks, rejections and problems."""

from __future__ import annotations

import os

from lsprotocol import types as lsp

from fuselens.contracts.inductor import UnmatchedFusion
from fuselens.contracts.report import (
    Cluster,
    GraphBreak,
    Library,
    Model,
    Pattern,
    Problem,
    Rejection,
    Report,
    SourceRef,
)
from fuselens.contracts.units import bytes_label, library_path
from fuselens.worker.protocol import Failure

from .ranges import dynamic_entry, saved_over_range
from .text import lines_range, path_to_uri, same_file, shown_at

SOURCE = "fuselens"
SEVERITY = {
    "error": lsp.DiagnosticSeverity.Error,
    "warning": lsp.DiagnosticSeverity.Warning,
    "information": lsp.DiagnosticSeverity.Information,
    "hint": lsp.DiagnosticSeverity.Hint,
}


def cluster_message(c: Cluster, libraries: list[Library], model: Model | None = None) -> str:
    saved = ""
    if c.bytes_unfused and c.bytes_fused is not None:
        saved = f" (−{100 * (c.bytes_unfused - c.bytes_fused) / c.bytes_unfused:.0f}% DRAM traffic)"
    text = f"fusable: {c.op_chain}, {bytes_label(c.bytes_unfused)} → {bytes_label(c.bytes_fused)}{saved}"
    if c.regime:
        text += f" [{c.regime}]"
    ranged = dynamic_entry(model, c.id) if model is not None else None
    if ranged is not None:
        text += saved_over_range(*ranged)
    if c.multiplicity > 1:
        text += f" ×{c.multiplicity} ({bytes_label(c.total_bytes_unfused)} → {bytes_label(c.total_bytes_fused)} in all)"
    if c.branch:
        text += f" — {c.branch}"
    if c.applies == "patch" and c.patch is not None:
        where = f"{library_path(c.patch.function.file, libraries)}:{c.lines[0]}"
        text += f"; applies as a patch of {c.patch.function.qualname} ({where}), installed at run time"
    elif c.applies == "no" and c.apply_detail:
        text += f"; not applicable: {c.apply_detail}"
        shown = library_path(c.file, libraries)
        if shown != c.file and shown not in c.apply_detail:  # say where a library's code is
            text += f" (its code: {shown}:{c.lines[0]})"
    elif c.mapping != "exact":
        text += f"; not replaceable here: {c.mapping_detail}"
    return text


def diagnostics(
    report: Report,
    path: str,
    lines: list[str],
    severity: str,
    show: list[str],
    failure: Failure | None = None,
    pattern_severity: str = "hint",
) -> list[lsp.Diagnostic]:
    """Everything the report says about the document at `path`, filtered by the `show` setting.

    What lives in this file shows at its own lines.  What lives in a library the file uses (a
    transformers decoder layer, say) shows at the user's line that reaches it, with links to the
    library's lines."""
    out: list[lsp.Diagnostic] = []
    if failure is not None:
        out.append(_failure(failure, path, lines))
    if "problems" in show:
        out += [_problem(problem, path, lines) for problem in report.problems]
    cluster_severity = SEVERITY.get(severity, lsp.DiagnosticSeverity.Information)
    for model in report.models:
        if "problems" in show:
            out += _model_problems(model, path, lines)
        if "breaks" in show:
            out += [d for brk in model.graph_breaks if (d := _graph_break(brk, model, path, lines, report.libraries))]
        if "clusters" in show:
            out += [
                d for c in model.clusters if (d := _cluster(c, model, path, lines, cluster_severity, report.libraries))
            ]
            out += [
                d
                for p in model.patterns
                if rewritable_kind(p, path)
                and (d := _pattern(p, model, path, lines, cluster_severity, report.libraries, _device(report)))
            ]
        if "patterns" in show:
            shown_as = SEVERITY.get(pattern_severity, lsp.DiagnosticSeverity.Hint)
            out += [
                d
                for p in model.patterns
                if not rewritable_kind(p, path) and (d := _pattern(p, model, path, lines, shown_as, report.libraries))
            ]
            if model.inductor is not None:
                out += [d for f in model.inductor.unmatched if (d := _inductor_only(f, path, lines))]
        if "rejections" in show:
            out += [d for r in model.rejections if (d := _rejection(r, model, path, lines, report.libraries))]
    return out


def _model_problems(model: Model, path: str, lines: list[str]) -> list[lsp.Diagnostic]:
    if model.problem and model.status == "error":
        return [_problem(model.problem, path, lines, prefix=f"{model.name}: ")]
    if model.partial and same_file(model.file, path):
        return [
            lsp.Diagnostic(
                range=lines_range(lines, model.line, model.line),
                severity=lsp.DiagnosticSeverity.Warning,
                message=f"{model.name} is partly analyzed: {model.partial}",
                source=SOURCE,
                code="partial",
            )
        ]
    if model.status == "skipped" and not model.notes and same_file(model.file, path):
        hint = model.problem.hint if model.problem else ""
        return [
            lsp.Diagnostic(
                range=lines_range(lines, model.line, model.line),
                severity=lsp.DiagnosticSeverity.Hint,
                message=f"{model.name} was not analyzed: no example inputs. {hint}",
                source=SOURCE,
                code="no-inputs",
            )
        ]
    return []


def _elsewhere(
    file: str, lines: list[int], libraries: list[Library], function: str = ""
) -> lsp.DiagnosticRelatedInformation:
    """The link from a user's line to the library lines it reaches."""
    where = f"{library_path(file, libraries)}:{lines[0]}" + (f"–{lines[1]}" if lines[1] != lines[0] else "")
    return lsp.DiagnosticRelatedInformation(
        location=lsp.Location(path_to_uri(file), lsp.Range(lsp.Position(lines[0] - 1, 0), lsp.Position(lines[1], 0))),
        message=f"in {where}" + (f" ({function})" if function else ""),
    )


def _placed(
    file: str,
    lines: list[int],
    reached_from: SourceRef | None,
    model: Model,
    path: str,
    doc: list[str],
    libraries: list[Library],
) -> tuple[lsp.Range, list[lsp.DiagnosticRelatedInformation]] | None:
    """Where an item shows in this document, and the link to its code when that is elsewhere."""
    shown = shown_at(file, lines, reached_from, model, path)
    if shown is None:
        return None
    related = [] if same_file(file, path) or not file else [_elsewhere(file, lines, libraries)]
    return lines_range(doc, shown[0], shown[1]), related


def _graph_break(
    brk: GraphBreak, model: Model, path: str, lines: list[str], libraries: list[Library]
) -> lsp.Diagnostic | None:
    placed = _placed(brk.file, [brk.line, brk.line], brk.reached_from, model, path, lines, libraries)
    if placed is None:
        return None
    rng, related = placed
    return lsp.Diagnostic(
        range=rng,
        severity=lsp.DiagnosticSeverity.Warning,
        source=SOURCE,
        code="graph-break",
        message=f"graph break: {brk.reason}",
        related_information=related or None,
    )


def _cluster(
    c: Cluster,
    model: Model,
    path: str,
    lines: list[str],
    severity: lsp.DiagnosticSeverity,
    libraries: list[Library],
) -> lsp.Diagnostic | None:
    placed = _placed(c.file, c.lines, c.reached_from, model, path, lines, libraries)
    if placed is None:
        return None
    rng, related = placed
    if related:
        related = [_elsewhere(c.file, c.lines, libraries, c.function)]
    for op in c.ops:
        if op.file and op.line:
            here = same_file(op.file, path)
            at = (
                lines_range(lines, op.line, op.line)
                if here
                else lsp.Range(lsp.Position(op.line - 1, 0), lsp.Position(op.line - 1, 0))
            )
            shape = f"{op.target} {'×'.join(map(str, op.shape or []))} {op.dtype or ''}".strip()
            related.append(
                lsp.DiagnosticRelatedInformation(location=lsp.Location(path_to_uri(op.file), at), message=shape)
            )
    return lsp.Diagnostic(
        range=rng,
        severity=severity,
        source=SOURCE,
        code=c.kind,
        message=cluster_message(c, libraries, model),
        related_information=related,
        data={"cluster": c.id},
    )


def _device(report: Report) -> str:
    return report.device.name if report.device is not None else ""


def _pattern(
    p: Pattern,
    model: Model,
    path: str,
    lines: list[str],
    severity: lsp.DiagnosticSeverity,
    libraries: list[Library],
    device: str = "",
) -> lsp.Diagnostic | None:
    est = p.estimate
    if not est.speedup_bound or est.speedup_bound <= 1.0:
        return None
    placed = _placed(p.file, p.lines, p.reached_from, model, path, lines, libraries)
    if placed is None:
        return None
    rng, related = placed
    if rewritable_kind(p, path):
        message = pattern_message(p, device)
    else:
        message = (
            f"pattern {p.name}: {bytes_label(est.bytes_before)} → {bytes_label(est.bytes_after)}, "
            f"bound {est.speedup_bound:.2f}× — {p.summary}"
        )
        if p.multiplicity > 1:
            message += f" ×{p.multiplicity}"
    return lsp.Diagnostic(
        range=rng,
        severity=severity,
        source=SOURCE,
        code=f"pattern:{p.name}",
        message=message,
        related_information=related or None,
        data={"pattern": p.name, "rewrite": p.rewrite.id} if p.rewrite is not None else None,
    )


def rewritable_kind(p: Pattern, path: str) -> bool:
    """A pattern of the file at `path` of a kind that has a source rewrite (an attention): it is shown as a
    cluster is, with the rewrite that fuses it, or why there is none.  (One in a library's code, which no
    rewrite of the file reaches, is shown as the other patterns are.)"""
    return (p.rewrite is not None or bool(p.refusal)) and same_file(p.file, path)


def pattern_message(p: Pattern, device: str = "") -> str:
    """A rewritable pattern, said as a cluster is: what it moves against the fused call, the regime, and
    the rewrite with the kernel it runs (or why there is no rewrite)."""
    est = p.estimate
    saved = ""
    if est.bytes_before and est.bytes_after is not None:
        saved = f" (−{100 * (est.bytes_before - est.bytes_after) / est.bytes_before:.0f}% DRAM traffic)"
    text = f"fusable: {p.name}, {bytes_label(est.bytes_before)} → {bytes_label(est.bytes_after)}{saved}"
    if p.dims.get("regime"):
        text += f" [{p.dims['regime']}]"
    if p.multiplicity > 1:
        text += f" ×{p.multiplicity}"
    if p.rewrite is not None:
        callee = p.rewrite.call.split("(", 1)[0]
        on = f" on {device}" if device else ""
        runs = f" ({p.dims['backend_detail']}{on})" if p.dims.get("backend_detail") else ""
        text += f"; the quick fix rewrites it as {callee}{runs}"
    elif p.refusal:
        text += f"; no rewrite: {p.refusal_detail}"
    return text


def _inductor_only(fusion: UnmatchedFusion, path: str, lines: list[str]) -> lsp.Diagnostic | None:
    lines_here = [o.line for o in fusion.ops if o.line and same_file(o.file, path)]
    if len(lines_here) < 2:
        return None
    reasons = sorted({o.reason for o in fusion.ops if o.reason})
    why = f"; fuselens did not ({', '.join(reasons)})" if reasons else ""
    return lsp.Diagnostic(
        range=lines_range(lines, min(lines_here), max(lines_here)),
        severity=lsp.DiagnosticSeverity.Hint,
        source=SOURCE,
        code="inductor-only",
        message=f"torch.compile fuses {fusion.summary} in {fusion.name}{why}",
    )


def _rejection(
    r: Rejection, model: Model, path: str, lines: list[str], libraries: list[Library]
) -> lsp.Diagnostic | None:
    placed = _placed(r.file, r.lines, r.reached_from, model, path, lines, libraries)
    if placed is None:
        return None
    rng, related = placed
    return lsp.Diagnostic(
        range=rng,
        severity=lsp.DiagnosticSeverity.Hint,
        source=SOURCE,
        code=r.reason,
        message=f"not fused: `{r.ops[0].target}` — {r.reason}: {r.detail}",
        related_information=related or None,
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
