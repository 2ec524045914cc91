"""The results chart: one Plotly figure per validated model, as a plain dict (`{"data": [...],
"layout": {...}}`), built without plotly so that every layer can build it.

The server sends it to VS Code's results view, which hands it to plotly.js; the CLI hands it to
the Python plotly package for `fuselens validate --html`: one chart, drawn the same everywhere.

Where clusters were timed (on a GPU) it shows each cluster's CUDA-graph time, eager against
torch.compile (in the mode validation compiles with) against the fused kernel, and the kernel's
share of the measured copy ceiling.  Where they were not (the Triton interpreter), it shows each
cluster's largest error as a share of the tolerance its check uses (atol + rtol·|expected|, element
by element), so that the chart always has something to say, and says what the status does.  Earlier runs of the same file add one faded series each.

The figure carries no colours: each place that draws it applies its own theme.

plotly reads a little HTML in every string it draws (`<br>`, `<b>`, `<span style=...>`, `<a href=...>`),
in titles, legends, axis labels, hover labels and annotations alike.  Every string a report brings
(a model's or cluster's name, its ops, its status, the device, a run's time) goes in escaped
(`_text`), so that it shows as the text it is; the only markup is the figure's own (a `<br>` in
a title, `<extra>` in a hover template).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from .probe import HISTOGRAM_WIDTH, histogram_edges
from .profile import ModelProfile
from .validation import COMPILE_MODE, ClusterCheck, ModelValidation, Timing

Figure = dict[str, Any]

COMPILED = f"torch.compile ({COMPILE_MODE})"  # the series of torch.compile's times, its mode named
EARLIER_SERIES = 3  # earlier runs drawn in the chart (the history table lists every run kept)
EARLIER_OPACITY = 0.45

EarlierModels = Sequence[tuple[str, ModelValidation]]  # (the run's label, its validation of this model), oldest first


def results_figure(model: ModelValidation, where: str, earlier: EarlierModels = ()) -> Figure:
    """The chart of `model`'s validation (`where`: "on NVIDIA H200", "in the Triton interpreter ...")."""
    if not model.clusters:
        return {"data": [], "layout": _layout(f"{_text(model.name)}: no clusters to validate", "")}
    if is_timed(model):
        return _times_figure(model, where, earlier)
    return _numerics_figure(model, where, earlier)


def is_timed(model: ModelValidation) -> bool:
    """Whether any cluster of `model` has a GPU time to chart."""
    return any(_timing(c).fused_us is not None or _timing(c).eager_us is not None for c in model.clusters)


# ---- on a GPU: time per cluster ------------------------------------------------------------------


def _times_figure(model: ModelValidation, where: str, earlier: EarlierModels) -> Figure:
    clusters = model.clusters
    fused = _bar("fused", clusters, [_timing(c).fused_us for c in clusters])
    fused["text"] = [_bandwidth(_timing(c)) for c in clusters]
    fused["textposition"] = "outside"
    data = [
        _bar("eager", clusters, [_timing(c).eager_us for c in clusters]),
        _bar(COMPILED, clusters, [_timing(c).compiled_us for c in clusters]),
        fused,
    ]
    for label, before in _recent(earlier):
        times = [_timing(_same(before, c)).fused_us for c in clusters]
        data.append({**_bar(f"fused, {_text(label)}", clusters, times), "opacity": EARLIER_OPACITY})
    layout = _layout(
        f"{_text(model.name)}: CUDA-graph time per cluster {_text(where)},<br>eager vs {COMPILED} vs fused",
        "µs (lower is better)",
    )
    ceiling = [_finite(_timing(c).pct_of_peak) for c in clusters]
    if any(p is not None for p in ceiling):
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "fused: % of copy ceiling",
                "x": _ids(clusters),
                "y": ceiling,
                "yaxis": "y2",
                "text": [_bandwidth(_timing(c)) for c in clusters],
                "hovertemplate": "%{x}: %{y:.0f}% of the measured copy ceiling (%{text})<extra></extra>",
                "marker": {"symbol": "diamond", "size": 10},
            }
        )
        layout["yaxis2"] = {
            "title": {"text": "% of the measured copy ceiling"},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            "showgrid": False,
        }
    return {"data": data, "layout": layout}


def _bandwidth(t: Timing) -> str:
    """The kernel's bandwidth ("2980 GB/s, 97% of the copy ceiling"), as much of it as was measured."""
    parts = []
    if _finite(t.achieved_gbps) is not None:
        parts.append(f"{t.achieved_gbps:.0f} GB/s")
    if _finite(t.pct_of_peak) is not None:
        parts.append(f"{t.pct_of_peak:.0f}% of the copy ceiling")
    return ", ".join(parts)


# ---- without timings: numerics per cluster -------------------------------------------------------

ERRORS = "max |error| / tolerance"  # the bars: what the verdict compares with 1
TOLERANCE = "tolerance: atol + rtol·|expected|"  # the line at 1 they pass under


def _numerics_figure(model: ModelValidation, where: str, earlier: EarlierModels) -> Figure:
    """Each cluster's largest error as a share of the tolerance it is checked against, element by
    element (atol + rtol·|expected|): a bar at most 1 is a check that passed, above it one that did not,
    so the chart says what the status column says."""
    clusters = model.clusters
    errors = _bar(ERRORS, clusters, [_drawable(c.tolerance_ratio) for c in clusters])
    errors["hovertext"] = [_error_hover(c) for c in clusters]
    errors["hoverinfo"] = "text"
    data = [
        errors,
        {
            "type": "scatter",
            "mode": "markers",
            "name": TOLERANCE,
            "x": _ids(clusters),
            "y": [1.0 if c.tolerance_ratio is not None else None for c in clusters],
            "marker": {"symbol": "line-ew-open", "size": 30, "line": {"width": 3}},
            "hovertemplate": "%{x}: passes at most 1<extra></extra>",
        },
    ]
    for label, before in _recent(earlier):
        values = [_drawable(_ratio(_same(before, c))) for c in clusters]
        data.append({**_bar(f"{ERRORS}, {_text(label)}", clusters, values), "opacity": EARLIER_OPACITY})
    layout = _layout(
        f"{_text(model.name)}: largest error per cluster,<br>{_text(where)}, as a share of its tolerance",
        "max |error| / (atol + rtol·|expected|)",
    )
    layout["yaxis"]["type"] = "log"  # errors span decades below their tolerance (1e-7 in fp32, 1e-2 in bf16)
    # A log axis cannot draw 0 (an exact match) or a check that never produced a number: say it in words.
    layout["annotations"] = [
        {
            "x": _text(c.id),
            "xref": "x",
            "y": 0,
            "yref": "paper",
            "yanchor": "bottom",
            "text": _text(note),
            "showarrow": False,
        }
        for c in clusters
        if (note := _undrawn(c))
    ]
    return {"data": data, "layout": layout}


def _drawable(value: float | None) -> float | None:
    """`value` where a log axis can draw it (a positive, finite number), else a gap."""
    return value if value is not None and math.isfinite(value) and value > 0 else None


def _undrawn(c: ClusterCheck) -> str:
    """Why `c`'s error has no bar ("" when it has one)."""
    if c.max_abs is None:
        return c.status
    if c.max_abs == 0:
        return "exact (0)"
    if not math.isfinite(c.max_abs):
        return f"{c.max_abs} ({c.status})"
    if c.tolerance_ratio is None:  # a run kept from before the ratio was recorded
        return f"{c.status}, max |error| {c.max_abs:.1e}"
    if not math.isfinite(c.tolerance_ratio):  # an error where the tolerance is 0
        return f"over a tolerance of 0 ({c.status})"
    return ""


def _error_hover(c: ClusterCheck) -> str:
    error = "—" if c.max_abs is None else f"{c.max_abs:.2e}"
    share = "" if c.tolerance_ratio is None else f", {c.tolerance_ratio:.3g}× its tolerance"
    tolerance = "" if c.atol is None else f"; passes within atol {c.atol:g} + rtol {c.rtol or 0:g}·|expected|"
    return f"{_text(c.id)} ({_text(c.ops)}): {_text(c.status)}, max |error| {error}{share}{tolerance}"


# ---- shared --------------------------------------------------------------------------------------


def _bar(name: str, clusters: list[ClusterCheck], values: list[float | None]) -> dict[str, Any]:
    return {
        "type": "bar",
        "name": name,
        "x": _ids(clusters),
        "y": [_finite(v) for v in values],
        "hovertext": [_text(c.ops) for c in clusters],
    }


def _ids(clusters: Sequence[ClusterCheck]) -> list[str]:
    """The clusters' ids, the x axis's categories (the annotations name the same, escaped alike)."""
    return [_text(c.id) for c in clusters]


def _text(value: str) -> str:
    """A report's string as plotly shows it: as the text it is, never as markup.  (plotly turns
    `&lt;`, `&gt;` and `&amp;` back into the characters they stand for.)"""
    return html.escape(value, quote=False)


def _layout(title: str, y_title: str) -> dict[str, Any]:
    # Two lines from the left edge: centred on one line, the title ran off both sides of a panel
    # half the window wide (plotly does not wrap titles itself).
    return {
        "title": {"text": title, "x": 0, "xanchor": "left"},
        "barmode": "group",
        "xaxis": {"title": {"text": "cluster"}, "type": "category"},
        "yaxis": {"title": {"text": y_title}},
        "legend": {"orientation": "h", "y": -0.25},
        "margin": {"t": 80, "r": 70},
    }


def _recent(earlier: EarlierModels) -> list[tuple[str, ModelValidation]]:
    """The earlier runs the chart draws: the latest few, newest first."""
    return list(reversed(earlier[-EARLIER_SERIES:]))


def _same(model: ModelValidation, check: ClusterCheck) -> ClusterCheck | None:
    """`model`'s check of the cluster `check` is of (matched by id), if it checked it."""
    return next((c for c in model.clusters if c.id == check.id), None)


def _ratio(check: ClusterCheck | None) -> float | None:
    return check.tolerance_ratio if check else None


def _timing(check: ClusterCheck | None) -> Timing:
    return (check.timing if check else None) or Timing()


def _finite(value: float | None) -> float | None:
    """A number JSON and plotly can carry (no inf, no NaN), else a gap."""
    return value if value is not None and math.isfinite(value) else None


# ---- a profile: where the measured time goes -----------------------------------------------------


def profile_figure(model: ModelProfile, step: str, where: str) -> Figure:
    """A profiled model's measured time: one bar per cluster (beside the time the cost model predicts
    for it fused) and per kind of op outside the clusters, then what no call issued; ms per `step`."""
    clusters = model.clusters
    step, where = _text(step), _text(where)
    ids = [_text(c.id) for c in clusters]
    names = ids + [_text(o.kind) for o in model.opaque]
    measured: list[float] = [c.us / 1000 for c in clusters] + [o.us / 1000 for o in model.opaque]
    shares = [f"{c.share:.1%}" for c in clusters] + [f"{o.share:.1%}" for o in model.opaque]
    hover = [
        f"{_text(c.id)}: {c.calls} ops, rank {c.rank_by_time} by time, {c.rank_by_bytes} by bytes saved"
        for c in clusters
    ]
    hover += [f"{_text(o.kind)}: {_text(', '.join(o.ops[:4]))}" for o in model.opaque]
    gains = [f"the {step} {c.amdahl_speedup:.2f}× faster with {i} fused" for c, i in zip(clusters, ids, strict=True)]
    if model.unattributed_us > 0:
        names.append("unattributed")
        measured.append(model.unattributed_us / 1000)
        shares.append(f"{model.unattributed_us / model.forward_us:.1%}" if model.forward_us else "")
        hover.append("kernels no call of the model issued")
    data = [
        {"type": "bar", "name": "measured", "x": names, "y": measured, "text": shares, "textposition": "outside",
         "hovertext": hover},
        {"type": "bar", "name": "fused, predicted", "x": ids,
         "y": [c.predicted_fused_us / 1000 for c in clusters],
         "hovertext": gains},
    ]  # fmt: skip
    layout = _layout(
        f"{_text(model.name)}: measured time per {step} {where},<br>by cluster and by op outside them", "ms"
    )
    layout["xaxis"] = {"title": {"text": "cluster, or op outside the clusters"}, "type": "category"}
    return {"data": data, "layout": layout}


# ---- a probe: the values through each GEMM site ----------------------------------------------------


def probe_figure(sites: Sequence[tuple[str, list[int]]], title: str) -> Figure:
    """Each site's histogram of log2|x| (`sites`: its label and its counts), as the share of the values
    in each bin: one step line per site, so that sites of any size share one axis."""
    edges = histogram_edges()
    bins = [f"2^{int(e)}..2^{int(e) + HISTOGRAM_WIDTH}" for e in edges]
    bins[0], bins[-1] = f"< 2^{int(edges[1])}", f"≥ 2^{int(edges[-1])}"
    data = []
    for label, counts in sites:
        total = sum(counts)
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "line": {"shape": "hvh"},
                "name": _text(label),
                "x": bins,
                "y": [c / total if total else 0.0 for c in counts],
                "customdata": counts,
                "hovertemplate": f"{_text(label)}: %{{y:.1%}} of the values in %{{x}} (%{{customdata}})<extra></extra>",
            }
        )
    layout = _layout(title, "share of the nonzero values")
    layout["xaxis"] = {"title": {"text": "|x|"}, "type": "category"}
    layout["yaxis"]["tickformat"] = ".0%"
    return {"data": data, "layout": layout}
