"""Inlay hints: the traffic a cluster saves, at the end of its last line."""

from __future__ import annotations

from lsprotocol import types as lsp

from fuselens.contracts.report import Report
from fuselens.contracts.units import bytes_label

from .text import end_of_line, same_file


def inlay_hints(report: Report, path: str, lines: list[str], first: int, last: int) -> list[lsp.InlayHint]:
    """Hints for clusters ending within lines first..last (1-based, inclusive)."""
    hints = []
    for _, c in report.clusters():
        end = c.lines[1]
        if not same_file(c.file, path) or not first <= end <= last or c.bytes_saved is None:
            continue
        label = f"⚡ −{bytes_label(c.bytes_saved)}"
        if c.multiplicity > 1:
            label += f" ×{c.multiplicity}"
        hints.append(
            lsp.InlayHint(
                position=end_of_line(lines, end),
                label=label,
                padding_left=True,
                kind=None,
                tooltip=f"{c.id}: {c.op_chain} [{c.regime}]",
            )
        )
    return hints
