"""Inlay hints: the traffic a cluster saves, at the end of the last line it shows on (for a model with
declared dynamic sizes, at which size of their ranges, its tooltip the saving over the range); with
a profile, each line's measured share of the forward."""

from __future__ import annotations

from lsprotocol import types as lsp

from fuselens.contracts.profile import Profile
from fuselens.contracts.report import Cluster, Model, Report
from fuselens.contracts.units import bytes_label

from .measured import LineMeasure, measured_lines, time_label
from .ranges import analyzed_at, dynamic_entry, tooltip_lines
from .text import end_of_line, shown_at

# Lines whose measured share of the forward is below this get no hint: the editor stays readable.
MIN_SHARE = 0.01


def inlay_hints(
    report: Report, path: str, lines: list[str], first: int, last: int, profile: Profile | None = None
) -> list[lsp.InlayHint]:
    """Hints for clusters whose shown lines end within first..last (1-based, inclusive): one per line,
    summing the clusters that end there (a line reaching a library's layers reaches several); and,
    with a profile, one for each line there that took at least 1% of the forward."""
    by_line: dict[int, list[tuple[Model, Cluster]]] = {}
    for model, c in report.clusters():
        shown = shown_at(c.file, c.lines, c.reached_from, model, path)
        if shown is None or not first <= shown[1] <= last or c.bytes_saved is None:
            continue
        by_line.setdefault(shown[1], []).append((model, c))
    hints = [_hint(lines, line, clusters) for line, clusters in sorted(by_line.items())]
    if profile is not None:
        timed = measured_lines(profile, path)
        hints += [
            _time_hint(lines, line, m)
            for line, m in sorted(timed.items())
            if first <= line <= last and m.share >= MIN_SHARE
        ]
    return sorted(hints, key=lambda h: (h.position.line, h.position.character))


def _time_hint(lines: list[str], line: int, measure: LineMeasure) -> lsp.InlayHint:
    label = f"◔ {time_label(measure.us)} {measure.share:.0%}"
    tooltip = f"measured: {time_label(measure.us)} per forward ({measure.share:.1%}): {', '.join(measure.ops[:5])}"
    return lsp.InlayHint(position=end_of_line(lines, line), label=label, padding_left=True, tooltip=tooltip)


def _hint(lines: list[str], line: int, found: list[tuple[Model, Cluster]]) -> lsp.InlayHint:
    clusters = [c for _, c in found]
    if len(clusters) == 1:
        model, c = found[0]
        label = f"⚡ −{bytes_label(c.bytes_saved)}"
        if c.multiplicity > 1:
            label += f" ×{c.multiplicity}"
        tooltip = f"{c.id}: {c.op_chain} [{c.regime}]"
        ranged = dynamic_entry(model, c.id)
        if ranged is not None:  # the saving is the analysis binding's: say which, and over what range
            label += f" {analyzed_at(ranged[0])}"
            tooltip = "\n".join([tooltip, *tooltip_lines(*ranged)])
    else:
        saved = sum((c.bytes_saved or 0) * c.multiplicity for c in clusters)
        label = f"⚡ −{bytes_label(saved)} in {len(clusters)} clusters"
        tooltip = "\n".join(f"{c.id}: {c.op_chain} [{c.regime}]" for c in clusters)
    return lsp.InlayHint(position=end_of_line(lines, line), label=label, padding_left=True, kind=None, tooltip=tooltip)
