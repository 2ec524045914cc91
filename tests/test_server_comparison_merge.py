"""The torch.compile comparison joins an analysis as a new one: what the server published, and what a
request is answering from, never changes under it."""

from __future__ import annotations

from fuselens.contracts.inductor import ComparisonResult, InductorComparison
from fuselens.contracts.report import Model, Report
from fuselens.server.inductor import with_comparison
from fuselens.server.scheduler import Analysis


def test_the_comparison_comes_as_a_new_analysis_and_the_published_one_is_left_as_it_was():
    published = Analysis(3, "text", Report("/m.py", "sha", models=[Model("Net", "/m.py", 1, "analyzed")]))
    result = ComparisonResult(
        "/m.py", "sha", models={"Net": InductorComparison("Net", "triton-cpu")}, sources={"k0": "src"}
    )
    compared = with_comparison(published, result)
    assert compared.report.models[0].inductor == InductorComparison("Net", "triton-cpu")
    assert compared.inductor_sources == {"k0": "src"} and compared.version == 3
    assert published.report.models[0].inductor is None and published.inductor_sources is None


def test_a_model_the_comparison_could_not_compile_keeps_its_earlier_comparison_and_says_why():
    earlier = InductorComparison("Net", "triton-cpu")
    model = Model("Net", "/m.py", 1, "analyzed", inductor=earlier)
    analysis = Analysis(1, "text", Report("/m.py", "sha", models=[model]))
    result = ComparisonResult("/m.py", "sha", models={"Net": None}, errors={"Net": "compile failed"})
    compared = with_comparison(analysis, result)
    assert compared.report.models[0].inductor is earlier
    assert compared.report.models[0].inductor_error == "compile failed"
