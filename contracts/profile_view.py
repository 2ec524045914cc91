"""A profile as a results view: the same panel, markdown and page a validation shows in.

Per model: the lines by measured time as its table, the time by cluster and by opaque op as its
chart (`chart.profile_figure`), and one line with the forward's total and what is attributed.  Every
cell is text, as in a validation's view.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .chart import profile_figure
from .profile import ModelProfile, Profile
from .report import Library
from .results_view import HistoryTable, ModelResults, ResultsView
from .units import library_path

TOP_LINES = 15


def profile_view(file: str, profile: Profile, libraries: Sequence[Library] = ()) -> ResultsView:
    """The profile as a results view; `libraries` (the report's) name their files from the package down."""
    where = f"on {profile.device}" if profile.mode == "cuda" else "on the CPU (each op's CPU time)"
    training = profile.step != "forward"
    share = f"% of the {'step' if training else 'forward'}"
    columns = ["line", "time", *(["backward"] if training else []), share, "calls", "ops", "clusters"]
    models = [
        ModelResults(
            name=m.name,
            heading=f"{m.name}: where the time of a {profile.step} goes, {where}",
            rows=[] if m.problem else _rows(m, file, training, libraries),
            whole_model=m.problem or _totals(m, profile.step),
            chart={"data": [], "layout": {}} if m.problem else profile_figure(m, profile.step, where),
            history=HistoryTable(),
        )
        for m in profile.models
    ]
    versions = dict(profile.versions)
    return ResultsView(
        file=file,
        time="",
        where=where,
        summary=" · ".join(
            [f"Profiled {where}: mean of {profile.iterations} after {profile.warmup} warm-up"]
            + [f"{k} {v}" for k, v in sorted(versions.items())]
        ),
        revision="",
        versions=versions,
        columns=columns,
        models=models,
        problems=[],
        earlier_runs=0,
        kind="profile",
    )


def _rows(model: ModelProfile, file: str, training: bool, libraries: Sequence[Library]) -> list[list[str]]:
    rows = []
    for line in model.lines[:TOP_LINES]:
        where = f"{shown_path(line.file, file, libraries)}:{line.line}" + (
            f" (from line {line.entry_line})" if line.entry_line is not None else ""
        )
        backward = [time_text(line.backward_us)] if training else []
        rows.append(
            [where, time_text(line.us), *backward, f"{line.share:.1%}", str(line.calls), ", ".join(line.ops[:4]),
             ", ".join(line.clusters)]
        )  # fmt: skip
    return rows


def _totals(model: ModelProfile, step: str) -> str:
    attributed = model.attributed_us / model.forward_us if model.forward_us else 0.0
    parts = [f"{time_text(model.forward_us)} per {step}, {attributed:.1%} attributed to the model's code"]
    parts += [f"{o.kind} {o.share:.0%}" for o in model.opaque]
    if model.clusters:
        top = model.clusters[0]
        parts.append(
            f"{top.id} the longest cluster ({top.share:.1%}; the {step} {top.amdahl_speedup:.2f}× with it fused)"
        )
    return " · ".join(parts)


def time_text(us: float) -> str:
    return f"{us / 1000:.3f} ms" if us >= 1000 else f"{us:.1f} µs"


def shown_path(path: str, home: str, libraries: Sequence[Library] = ()) -> str:
    """A line's file as a table names it: the profiled file by name, a library's from its package down."""
    if os.path.abspath(path) == os.path.abspath(home):
        return os.path.basename(path)
    shown = library_path(path, libraries)
    return shown if shown != path else os.path.basename(path)
