"""A probe as a results view: the same panel, markdown and page a validation shows in.

Per model: its GEMM sites as the table (the line, the op, the calls, the values' zeros and 2:4 share,
the opportunities and, after `fuselens validate --probe`, what each measured), and as the chart the
distribution of the values each site's input carries (the sketch's histogram of log2|x|).  Every cell
is text, as in a validation's view.
"""

from __future__ import annotations

from .chart import probe_figure
from .probe import MeasuredSpecialisation, ModelProbe, ProbeReport, ProbeSite, RoleSketch
from .profile_view import shown_path
from .report import Library
from .results_view import HistoryTable, ModelResults, ResultsView

COLUMNS = ["line", "op", "calls", "input zeros", "input 2:4", "outlier channels", "opportunities", "measured"]
CHARTED_ROLE = "input"  # the values flowing into the GEMM: what a sparse or quantized kernel reads


def probe_view(report: ProbeReport, libraries: list[Library] | None = None) -> ResultsView:
    where = f"on {report.device}"
    measured = f"; opportunities measured on {report.measured_on}" if report.measured_on else ""
    models = [_model(report, m, libraries or []) for m in report.models]
    versions = dict(report.versions)
    every = f", one call in {report.sample_every} sketched" if report.sample_every > 1 else ""
    return ResultsView(
        file=report.file,
        time="",
        where=where,
        summary=" · ".join([f"Probed {where}{every}{measured}"] + [f"{k} {v}" for k, v in sorted(versions.items())]),
        revision="",
        versions=versions,
        columns=list(COLUMNS),
        models=models,
        problems=list(report.problems),
        earlier_runs=0,
        kind="probe",
    )


def _model(report: ProbeReport, model: ModelProbe, libraries: list[Library]) -> ModelResults:
    no_data = model.problem or ("" if model.sites else f"{model.name} made no GEMM call on its batches")
    labels = [_label(s, report.file, libraries) for s in model.sites]
    charted = [(label, role.histogram) for label, s in zip(labels, model.sites, strict=True)
               if (role := _role(s, CHARTED_ROLE)) is not None]  # fmt: skip
    title = f"{model.name}: the values into each GEMM site, by magnitude,<br>on {model.data_source}"
    return ModelResults(
        name=model.name,
        heading=f"{model.name}: the values through each GEMM site, {model.batches} batches of {model.data_source}",
        rows=[] if no_data else [_row(label, s) for label, s in zip(labels, model.sites, strict=True)],
        whole_model="",
        chart={"data": [], "layout": {}} if no_data else probe_figure(charted, title),
        history=HistoryTable(),
        no_data=no_data,
    )


def _label(site: ProbeSite, home: str, libraries: list[Library]) -> str:
    return f"{shown_path(site.file, home, libraries)}:{site.line} {site.op}"


def _role(site: ProbeSite, role: str) -> RoleSketch | None:
    return next((r for r in site.roles if r.role == role), None)


def _row(label: str, site: ProbeSite) -> list[str]:
    inputs = _role(site, "input")
    outliers = [str(c) for r in site.roles if r.role != "output" for c in r.outlier_channels[:8]]
    return [
        label.rsplit(" ", 1)[0],
        site.op,
        str(site.calls) + (f" ({site.layers} layers)" if site.layers > 1 else ""),
        f"{inputs.zero_fraction:.1%}" if inputs else "—",
        f"{inputs.sparse_24_fraction:.1%}" if inputs else "—",
        ", ".join(outliers) or "—",
        "; ".join(o.kind + ("" if o.error is None else f" ({o.error:.2%} error)") for o in site.opportunities) or "—",
        "; ".join(_measured(m) for m in site.measured) or "—",
    ]


def _measured(m: MeasuredSpecialisation) -> str:
    if m.status == "not-measured":
        return f"{m.kind}: not measured"
    text = f"{m.kind}: {m.error:.2%} error"
    if m.speedup is not None:
        text += f", {m.speedup:.2f}× the dense GEMM"
    return text
