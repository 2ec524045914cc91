"""What the editor says of a cluster over the declared ranges of its model's sizes.

Read from the report's dynamic section (`contracts/dynamic.py`): the diagnostic's range of the
traffic a cluster saves across the corpus, the inlay hint's range of sizes and the tooltip's saving
and regime changes, the model's code lens's range, and the hover's expressions, per-shape table and
regime changes.  Plain text from plain data; nothing here evaluates more than the report holds."""

from __future__ import annotations

from fuselens.contracts.dynamic import DynamicCluster, DynamicShapes
from fuselens.contracts.report import Model
from fuselens.contracts.units import bytes_label


def dynamic_entry(model: Model, cluster_id: str) -> tuple[DynamicShapes, DynamicCluster] | None:
    """The model's dynamic section and the cluster's entry in it, for a model with declared sizes."""
    if model.dynamic is None:
        return None
    entry = model.dynamic.cluster(cluster_id)
    return (model.dynamic, entry) if entry is not None else None


def over(dynamic: DynamicShapes) -> str:
    """`seq 1..8192`, `batch 1..64, seq 1..8192`."""
    return ", ".join(f"{s.name} {s.min}..{s.max}" for s in dynamic.sizes)


def saved_over_range(dynamic: DynamicShapes, entry: DynamicCluster) -> str:
    """`; saves 8 KB–16 MB over seq 1..8192` ("" where no point has a count)."""
    saved = saved_range(entry)
    return f"; saves {saved} over {over(dynamic)}" if saved else ""


def analyzed_at(dynamic: DynamicShapes) -> str:
    """`at seq=1024 of 1..8192`: the binding the report's own numbers are at, and each size's range."""
    return "at " + ", ".join(
        f"{s.name}={dynamic.binding.get(s.name, s.binding)} of {s.min}..{s.max}" for s in dynamic.sizes
    )


def tooltip_lines(dynamic: DynamicShapes, entry: DynamicCluster) -> list[str]:
    """The inlay hint's tooltip on a dynamic cluster: its saving over the range, where its regime changes."""
    saved = saved_range(entry)
    lines = [f"saves {saved} over {over(dynamic)}"] if saved else [f"over {over(dynamic)}"]
    return lines + [f"{entry.cluster} is {c.text}" for c in entry.changes]


def saved_range(entry: DynamicCluster) -> str:
    """`8 KB–16 MB`: the least and most the cluster saves at the corpus's points ("" where none has a count)."""
    saved = [
        p.bytes_unfused - p.bytes_fused
        for p in entry.points
        if p.bytes_unfused is not None and p.bytes_fused is not None
    ]
    if not saved:
        return ""
    low, high = min(saved), max(saved)
    return bytes_label(low) if low == high else f"{bytes_label(low)}–{bytes_label(high)}"


def hover_section(dynamic: DynamicShapes, entry: DynamicCluster) -> str:
    """The formula, a table of the corpus points, and where the regime changes."""
    lines = [f"**over {over(dynamic)}**"]
    if entry.bytes_unfused is not None and entry.bytes_fused is not None:
        lines[0] += f": `{entry.bytes_unfused.text}` → `{entry.bytes_fused.text}` bytes"
    elif entry.note:
        lines.append(f"_{entry.note}_")
    names = [s.name for s in dynamic.sizes]
    table = [
        "| " + " | ".join([*names, "unfused → fused", "regime", "speedup"]) + " |",
        "|" + "---:|" * len(names) + "---:|---|---:|",
    ]
    for p in entry.points:
        speedup = f"{p.speedup:.2f}×" if p.speedup is not None else ""
        cells = [
            *(str(p.binding.get(n, "")) for n in names),
            f"{bytes_label(p.bytes_unfused)} → {bytes_label(p.bytes_fused)}",
        ]
        table.append("| " + " | ".join([*cells, p.regime or "unknown", speedup]) + " |")
    parts = ["\n\n".join(lines), "\n".join(table)]
    if entry.changes:
        parts.append("; ".join(c.text for c in entry.changes))
    return "\n\n".join(parts)
