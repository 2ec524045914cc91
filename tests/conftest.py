"""Shared helpers: analysing a model written into a temporary file."""

from __future__ import annotations

import os
import textwrap

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def write_model(tmp_path):
    """write_model(source, name="model.py") -> path of a model file in a fresh folder."""

    def write(source: str, name: str = "model.py") -> str:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source).lstrip("\n"))
        return str(path)

    return write


@pytest.fixture
def analyze():
    """analyze(path, **AnalyzeOptions fields) -> Report."""
    from fuselens.worker.analyze import AnalyzeOptions, analyze_file

    def run(path: str, **options):
        return analyze_file(path, AnalyzeOptions(**options))

    return run


def example(name: str) -> str:
    return os.path.join(EXAMPLES, name)


def only_model(report, name: str | None = None):
    models = [m for m in report.models if m.status == "analysed" and (name is None or m.name == name)]
    assert len(models) == 1, [(m.name, m.status, m.problem) for m in report.models]
    return models[0]


def chains(model) -> list[str]:
    return [c.op_chain for c in model.clusters]


def pytest_collection_modifyitems(config, items):
    """GPU tests run only where CUDA is; elsewhere they are skipped, saying why."""
    if not any("gpu" in item.keywords for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
