"""What the analysis of a save costs.

The language server analyzes a file on every save, in a job forked from its worker host: whatever the
job reads of the host's memory (a table of every imported module, say) is copied into it page by page,
and whatever it does once per layer of a model, it does twelve times for a 12-layer GPT.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import types

import pytest

from fuselens.contracts.config import model_settings
from fuselens.contracts.options import AnalyzeOptions
from fuselens.pipeline.analyze import analyze_file

from lsp_helpers import EXAMPLES, example_text


class _Watched(types.ModuleType):
    """An imported module that counts how often its file is asked for."""

    asked = 0

    @property  # type: ignore[override]
    def __file__(self) -> str:
        type(self).asked += 1
        return os.path.join(os.sep, "nowhere", "watched.py")


def test_a_saves_analysis_asks_no_other_module_for_its_file(tmp_path):
    """The analyzed file was just imported, so no table of the imported modules names it yet: telling
    that it is the user's own code takes no look at the others (reading their files, two thousand
    of them, was a third of a small model's job)."""
    sys.modules["fuselens_test_watched"] = watched = _Watched("fuselens_test_watched")
    try:
        path = tmp_path / "example_net.py"
        path.write_text(example_text())
        report = analyze_file(str(path), AnalyzeOptions(), code=False)
    finally:
        del sys.modules["fuselens_test_watched"]
    assert [c.kernel.name for _, c in report.clusters() if c.kernel] == ["cluster0", "cluster1", "cluster2"]
    assert type(watched).asked == 0


JOB = """
import sys
from fuselens.contracts.options import AnalyzeOptions
from fuselens.pipeline.analyze import analyze_file
from fuselens.worker.jobs import warm_up

warm_up()
before = set(sys.modules)
analyze_file(sys.argv[1], AnalyzeOptions(), code=False)
print(" ".join(sorted(m for m in set(sys.modules) - before if m.startswith("fuselens."))))
"""


@pytest.mark.parametrize("name", ["llama_block.py", "gpt.py", "nanogpt_attention.py"])
def test_a_job_forked_from_the_warm_worker_imports_none_of_fuselens(name: str):
    """The worker host analyzes a model once before it forks its jobs, so that what an analysis imports
    only when a model needs it (the attention pattern's rewrite, for the Llama block's attention written
    out) is imported once, not again in every job on every save (a fifth of the Llama block's job)."""
    done = subprocess.run(
        [sys.executable, "-c", JOB, os.path.join(EXAMPLES, name)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


def _cpu_ms(layers: int) -> float:
    settings = model_settings({"init": {"n_layers": layers}}, "models.GPT")
    started = time.process_time()
    analyze_file(os.path.join(EXAMPLES, "gpt.py"), AnalyzeOptions(models={"GPT": settings}), code=False)
    return (time.process_time() - started) * 1000


@pytest.mark.timing
def test_the_layers_a_gpt_repeats_cost_a_save_a_fifth_of_one_layer_each():
    """A save's analysis of the 12-layer GPT example costs at most 3.4 times that of the same GPT with
    one layer (its embeddings and head): each repeated layer, built, traced, detected and mapped, a
    fifth of what the one-layer model costs.  CPU time in one process, the two in turn (a busy machine
    slows both alike)."""
    _cpu_ms(1), _cpu_ms(12)  # (first calls: lazy imports, caches)
    timed: dict[int, list[float]] = {1: [], 12: []}
    for _ in range(7):
        for layers in (1, 12):
            timed[layers].append(_cpu_ms(layers))
    one, twelve = statistics.median(timed[1]), statistics.median(timed[12])
    assert twelve <= 3.4 * one, f"12 layers {twelve:.0f} ms CPU, 1 layer {one:.0f} ms"
