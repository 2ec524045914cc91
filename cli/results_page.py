"""`fuselens validate --html OUT`: the results view (`contracts/results_view.py`) as one HTML page that
works offline: each model's results table, its chart drawn by plotly (its JavaScript inlined in the
page), and the earlier runs of the file.

plotly is an optional dependency (the `html` extra, which `cpu` and `test` include); without it the
page cannot be drawn, and `--html` says which extra to install before anything runs.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from fuselens.contracts.results_view import ResultsView

MISSING_PLOTLY = "fuselens validate --html needs plotly: pip install 'fuselens[html]' (or: pip install plotly)"

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.6rem; text-align: right; white-space: nowrap; }
th:nth-child(-n+3), td:nth-child(-n+3) { text-align: left; }
.note { color: #555; }
"""


def plotly_missing() -> str:
    """The message to stop with when plotly cannot be imported ("" when it can)."""
    try:
        import plotly.io  # noqa: F401
    except ImportError:
        return MISSING_PLOTLY
    return ""


def write_page(path: str, view: ResultsView) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(page(view))


def page(view: ResultsView) -> str:
    """The whole page; plotly's JavaScript is inlined once, with the first chart."""
    import plotly.io as pio

    title = f"fuselens {view.kind} of {view.file}"
    body = [f"<h1>{_text(title)}</h1>", f"<p class='note'>{_text(view.summary)}</p>"]
    charted = False
    for model in view.models:
        body.append(f"<h2>{_text(model.heading)}</h2>")
        if model.no_data:  # said in place of an empty table and chart
            body.append(f"<p class='note'>{_text('No data: ' + model.no_data)}</p>")
            continue
        body.append(_table(view.columns, model.rows))
        if model.whole_model:
            body.append(f"<p>{_text(model.whole_model)}</p>")
        body.append(pio.to_html(model.chart, include_plotlyjs=not charted, full_html=False, validate=True))
        charted = True
        if model.history.rows:
            body.append(f"<h3>{_text(model.history.title)}</h3>")
            body.append(_table(model.history.columns, model.history.rows))
    body += [f"<p class='note'><em>{_text(p)}</em></p>" for p in view.problems]
    return (
        "<!DOCTYPE html>\n<html lang='en'>\n<head>\n<meta charset='utf-8'>\n"
        f"<title>{_text(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{_text(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_text(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>{body}</tbody>\n</table>"


def _text(value: str) -> str:
    return html.escape(value, quote=True)
