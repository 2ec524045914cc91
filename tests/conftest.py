"""Shared helpers: analyzing a model written into a temporary file."""

from __future__ import annotations

import json
import os
import re
import tempfile
import textwrap

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")

os.environ.setdefault("OMP_NUM_THREADS", "1")
# fuselens's per-user caches (the views the editor opens, the measured bandwidth) go to a folder of the
# run's own, for every server, worker and command the tests start; Hugging Face's stays where it was.
_USER_CACHE = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
os.environ.setdefault("HF_HOME", os.path.join(_USER_CACHE, "huggingface"))
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="fuselens-test-cache-")
# Triton reads TRITON_INTERPRET when it is imported (its own `@triton.jit` functions are made then), so
# whether kernels run in its interpreter is decided here, once for the run, before any test imports it.
# Without a CUDA device (CI) the interpreter is on, and the tests marked `interpreter` check the kernels'
# numerics in it.  On a CUDA device the GPU tests run compiled kernels, and the `interpreter` tests skip
# unless the run was started with TRITON_INTERPRET=1 (`TRITON_INTERPRET=1 pytest -m interpreter`).
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
# The robustness suite's figures, one file a test module: the folder is the run's, shared by
# pytest-xdist's workers (they inherit it from the process that starts them), read for the summary.
os.environ.setdefault("FUSELENS_ROBUSTNESS_DIR", tempfile.mkdtemp(prefix="fuselens-robustness-"))


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
    """analyze(path, **AnalyzeOptions fields) -> Report; `models` as an editor sends them (plain dicts)."""
    from fuselens.contracts.config import model_settings
    from fuselens.contracts.options import AnalyzeOptions
    from fuselens.pipeline.analyze import analyze_file

    def run(path: str, **options):
        models = {name: model_settings(entry, f"models.{name}") for name, entry in options.pop("models", {}).items()}
        return analyze_file(path, AnalyzeOptions(models=models, **options))

    return run


@pytest.fixture(scope="module")
def figures(request):
    """A dict for the numbers a module's tests want quoted (the robustness suite: tests/test_robust_*.py).
    At the end of the module they are printed (seen with `pytest -s`) and written as JSON to
    `$FUSELENS_ROBUSTNESS_DIR/<module>.json` (by default a fresh folder for the run)."""
    data: dict = {}
    yield data
    name = request.module.__name__.rsplit(".", 1)[-1]
    folder = os.environ["FUSELENS_ROBUSTNESS_DIR"]
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=True, default=str)
    print(f"\n---- {name} figures ({path}) ----\n{json.dumps(data, indent=2, sort_keys=True, default=str)}")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The robustness suite's counts, in every run's summary (CI runs `pytest -q -n 2`), from the files
    the modules wrote, whichever worker ran them."""
    folder = os.environ["FUSELENS_ROBUSTNESS_DIR"]
    names = sorted(f for f in os.listdir(folder) if f.endswith(".json")) if os.path.isdir(folder) else []
    if not names:
        return
    terminalreporter.section("robustness figures")
    for file in names:
        with open(os.path.join(folder, file), encoding="utf-8") as fh:
            data = json.load(fh)
        terminalreporter.write_line(f"{file[: -len('.json')]}: {json.dumps(data, sort_keys=True)}")


@pytest.fixture
def kernel_launches(monkeypatch):
    """kernel_launches(module) -> a list that records, from then on, the name of each Triton kernel of a
    generated kernel module (`_cluster3_kernel_tile`, `_cluster3_backward_kernel_block`, not the helpers
    they call) at each launch: what shows that a kernel ran, not the reference code."""
    from triton.runtime.jit import KernelInterface

    def record(module) -> list[str]:
        launched: list[str] = []
        for name, kernel in list(vars(module).items()):
            if isinstance(kernel, KernelInterface) and re.match(r"_cluster\d+_", name):
                monkeypatch.setattr(module, name, _Launched(kernel, name, launched))
        return launched

    return record


class _Launched:
    """A Triton kernel that records its name in `launched` when launched (`kernel[grid](...)`)."""

    def __init__(self, kernel, name: str, launched: list[str]):
        self.kernel, self.name, self.launched = kernel, name, launched

    def __getitem__(self, grid):
        self.launched.append(self.name)
        return self.kernel[grid]


def example(name: str) -> str:
    return os.path.join(EXAMPLES, name)


def only_model(report, name: str | None = None):
    models = [m for m in report.models if m.status == "analyzed" and (name is None or m.name == name)]
    assert len(models) == 1, [(m.name, m.status, m.problem) for m in report.models]
    return models[0]


def chains(model) -> list[str]:
    return [c.op_chain for c in model.clusters]


def pytest_collection_modifyitems(config, items):
    """Tests marked `timing` (they assert wall-clock time or latency) run only when the -m expression
    names them (`pytest -m timing`), so a busy machine cannot fail a plain `pytest` or
    `pytest -m "not slow"`.  Interpreter tests run only when the run interprets kernels (see
    INTERPRETING).  GPU tests run only where CUDA is; elsewhere they are skipped, saying why."""
    if "timing" not in (config.getoption("markexpr") or ""):
        timed = [item for item in items if item.get_closest_marker("timing")]
        if timed:
            config.hook.pytest_deselected(items=timed)
            items[:] = [item for item in items if not item.get_closest_marker("timing")]
    if not INTERPRETING:
        interpreted = pytest.mark.skip(
            reason="runs kernels in the Triton interpreter: start the run with TRITON_INTERPRET=1"
        )
        for item in items:
            if item.get_closest_marker("interpreter"):
                item.add_marker(interpreted)
    if not any("gpu" in item.keywords for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
