"""The dynamic-shape section of `fuselens analyze`'s output: a model's costs over its declared sizes.

Under the cluster table (whose numbers are at the analysis binding): the declared sizes and the
guards the model puts on them, one row per cluster and point of the corpus (bytes unfused → fused,
regime, expected speedup), each cluster's bytes as expressions, and where its regime changes."""

from __future__ import annotations

import os

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fuselens.contracts.dynamic import DynamicCluster, DynamicShapes, PointCost
from fuselens.contracts.report import Model
from fuselens.contracts.units import bytes_label


def render_dynamic(console: Console, model: Model) -> None:
    dynamic = model.dynamic
    if dynamic is None:
        return
    console.print(f"  [bold]dynamic sizes[/]: {escape(_sizes(dynamic))}")
    for guard in dynamic.guards:
        code = f": {guard.code}" if guard.code else ""
        where = f"{os.path.basename(guard.file)}:{guard.line}" if guard.file else "?"
        console.print(f"  [dim]guard {escape(guard.condition.text)} ({escape(where)}{escape(code)})[/]")
    if dynamic.note:
        console.print(f"  [yellow]{escape(dynamic.note)}[/]")
    if any(entry.points for entry in dynamic.clusters):
        console.print(_point_table(dynamic))
    for entry in dynamic.clusters:
        _render_cluster_lines(console, entry)


def _sizes(dynamic: DynamicShapes) -> str:
    parts = []
    for size in dynamic.sizes:
        corpus = ", ".join(map(str, size.corpus))
        parts.append(f"{size.name} = {size.min}..{size.max} at {corpus} (analyzed at {size.name} = {size.binding})")
    return "; ".join(parts)


def _point_table(dynamic: DynamicShapes) -> Table:
    table = Table(show_edge=True, header_style="bold", title="per shape", title_justify="left")
    table.add_column("id")
    for size in dynamic.sizes:
        table.add_column(size.name, justify="right")
    table.add_column("unfused → fused", justify="right")
    table.add_column("saved", justify="right")
    table.add_column("regime")
    table.add_column("speedup", justify="right")
    for entry in dynamic.clusters:
        for k, point in enumerate(entry.points):
            first = k == 0
            table.add_row(
                escape(entry.cluster) if first else "",
                *(str(point.binding.get(s.name, "")) for s in dynamic.sizes),
                f"{bytes_label(point.bytes_unfused)} → {bytes_label(point.bytes_fused)}",
                bytes_label(_saved(point)),
                point.regime or "unknown",
                f"{point.speedup:.2f}×" if point.speedup is not None else "",
                end_section=k == len(entry.points) - 1,
            )
    return table


def _saved(point: PointCost) -> int | None:
    if point.bytes_unfused is None or point.bytes_fused is None:
        return None
    return point.bytes_unfused - point.bytes_fused


def _render_cluster_lines(console: Console, entry: DynamicCluster) -> None:
    if entry.bytes_unfused is not None and entry.bytes_fused is not None:
        console.print(
            f"  [dim]{escape(entry.cluster)} bytes: {escape(entry.bytes_unfused.text)} → {escape(entry.bytes_fused.text)}[/]"
        )
    elif entry.note:
        console.print(f"  [yellow]{escape(entry.cluster)}[/] [dim]{escape(entry.note)}[/]")
    for change in entry.changes:
        console.print(f"  [dim]{escape(entry.cluster)} is {escape(change.text)}[/]")
