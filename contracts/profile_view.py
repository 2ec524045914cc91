"""A profile as a results view: the same panel, markdown and page a validation shows in.

Per model: the lines by measured time as its table, the time by cluster and by opaque op as its
chart (`chart.profile_figure`), and one line with the forward's total and what is attributed.  Every
cell is text, as in a validation's view.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from .chart import profile_figure
from .profile import ModelProfile, Profile
from .report import Library
from .results_view import HistoryTable, ModelResults, ResultsView
from .units import bytes_label, library_path

TOP_LINES = 15


def profile_view(
    file: str,
    profile: Profile,
    libraries: Sequence[Library] = (),
    analyzed_inputs: Mapping[str, Sequence[Sequence[int]]] | None = None,
) -> ResultsView:
    """The profile as a results view; `libraries` (the report's) name their files from the package down;
    `analyzed_inputs` (each model's analyzed input shapes) let a heading say when it ran at smaller ones."""
    where = f"on {profile.device}" if profile.mode == "cuda" else "on the CPU (each op's CPU time)"
    training = profile.step != "forward"
    share = f"% of the {'step' if training else 'forward'}"
    columns = ["line", "time", *(["backward"] if training else []), share, "calls", "ops", "clusters"]
    analyzed = analyzed_inputs or {}
    models = []
    for m in profile.models:
        no_data = _no_data(m)
        models.append(
            ModelResults(
                name=m.name,
                heading=f"{m.name}{_inputs_text(m, analyzed.get(m.name))}: where the time of a {profile.step} "
                f"goes, {where}",
                rows=[] if no_data else _rows(m, file, training, libraries),
                whole_model="" if no_data else _totals(m, profile.step),
                chart={"data": [], "layout": {}} if no_data else profile_figure(m, profile.step, where),
                history=HistoryTable(),
                no_data=no_data,
            )
        )
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


def _no_data(model: ModelProfile) -> str:
    """Why `model` has no chart or table to show ("" when it has them)."""
    if model.problem:
        return f"{model.name} was not profiled: {model.problem}"
    if model.forward_us <= 0:
        return f"the profiler recorded no time in {model.name}'s forward"
    return ""


def _inputs_text(model: ModelProfile, analyzed: Sequence[Sequence[int]] | None) -> str:
    """The text after the name: " at 1×256×1024", and when those are smaller than the analyzed inputs,
    which those were and why (a CPU profiles within a budget); "" when the model did not run."""
    if not model.inputs:
        return ""
    ran = ", ".join(_shape(s) for s in model.inputs)
    if analyzed is None or [list(s) for s in analyzed] == model.inputs:
        return f" at {ran}"
    budget = f", to move at most {bytes_label(model.cpu_budget_bytes)} a forward" if model.cpu_budget_bytes else ""
    return f" at {ran} (smaller than the analyzed {', '.join(_shape(s) for s in analyzed)}{budget})"


def _shape(shape: Sequence[int]) -> str:
    return "×".join(map(str, shape)) or "scalar"


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
