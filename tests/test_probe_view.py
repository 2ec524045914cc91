"""The probe's results view: each GEMM site of the planted example as a row, and the distribution of the
values into each site charted, in the page `fuselens probe --html` writes and the markdown the editors
show."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLANTED = os.path.join(REPO, "examples", "probe_planted.py")


def _line_of(snippet: str) -> int:
    with open(PLANTED, encoding="utf-8") as fh:
        return next(number for number, text in enumerate(fh, 1) if snippet in text)


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("view")
    done = subprocess.run(
        [sys.executable, "-m", "fuselens.cli.main", "validate", "--probe", PLANTED, "--on", "cpu",
         "--html", str(out / "probe.html"), "--markdown", str(out / "probe.md")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {name: (out / name).read_text(encoding="utf-8") for name in ("probe.html", "probe.md")}


def _figure(page: str) -> dict:
    """The chart's figure as the page hands it to plotly."""
    match = re.search(r"Plotly\.newPlot\(\s*\"[^\"]+\",\s*(\[.*?\]),\s*(\{.*?\}),\s*\{", page, re.S)
    assert match, "no chart in the page"
    return {"data": json.loads(match.group(1)), "layout": json.loads(match.group(2))}


def test_the_page_charts_the_values_into_each_site_and_the_outliers_show_in_the_top_bins(written):
    figure = _figure(written["probe.html"])
    names = [trace["name"] for trace in figure["data"]]
    lines = ["self.sparse(", "self.outlier(", "self.low_rank(", "self.repeated(", "self.plain("]
    assert names == [f"probe_planted.py:{_line_of(s)} linear" for s in lines]
    by_name = {trace["name"]: trace for trace in figure["data"]}
    for trace in figure["data"]:
        assert abs(sum(trace["y"]) - 1.0) < 1e-6 and len(trace["x"]) == 16
    outlier = by_name[f"probe_planted.py:{_line_of('self.outlier(')} linear"]
    plain = by_name[f"probe_planted.py:{_line_of('self.plain(')} linear"]
    top = outlier["x"].index("2^4..2^6")  # the outlier channels: fifty times N(0, 1)
    assert outlier["y"][top] > 0.005 and plain["y"][top] == 0.0
    assert "the values into each GEMM site" in figure["layout"]["title"]["text"]


def test_the_tables_give_each_site_its_opportunities_and_what_they_measured(written):
    markdown = written["probe.md"]
    rows = {row.split(" | ")[0].lstrip("| "): row for row in markdown.splitlines() if row.startswith("| probe_")}
    assert len(rows) == 5
    sparse = rows[f"probe_planted.py:{_line_of('self.sparse(')}"]
    assert "| 50.0% | 100.0% |" in sparse and "sparse-2:4: 0.00% error" in sparse
    assert "| 17, 3 |" in rows[f"probe_planted.py:{_line_of('self.outlier(')}"]
    assert rows[f"probe_planted.py:{_line_of('self.plain(')}"].endswith("| — | — |")
    assert "<h1>fuselens probe of " in written["probe.html"] and "self.sparse" not in markdown
