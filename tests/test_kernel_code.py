"""A save's analysis leaves out the kernels' code and each cluster's backward; a `GenerateJob` makes
them when something asks.  Everything else a save's analysis says is what the analysis with code says."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import statistics
import subprocess
import sys
import time

import pytest

from fuselens.contracts.options import AnalyzeOptions
from fuselens.contracts.report import BACKWARD_FIELDS, Report
from fuselens.pipeline.analyze import analyze_file
from fuselens.server.generation import NotTheSameAnalysis, with_code
from fuselens.server.workers import WorkerClient
from fuselens.worker.protocol import AnalyzeJob, Done, GenerateJob, Limits, encode

from lsp_helpers import EXAMPLES, example_text

LIMITS = Limits(120.0, 4096)


def without_code(report: Report) -> dict:
    """The report's plain form without what only the analysis with code has (and the timings)."""
    data = report.to_dict()
    for model in data["models"]:
        model.pop("timings_ms")
        for cluster in model["clusters"]:
            if cluster["kernel"] is not None:
                cluster["kernel"]["source"] = ""
            for name in BACKWARD_FIELDS:
                cluster.pop(name)
    return data


@pytest.mark.slow
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(EXAMPLES, "*.py"))), ids=os.path.basename)
def test_a_saves_analysis_says_all_the_analysis_with_code_says_but_the_code(path: str, train: bool):
    """Every cluster, rejection and edit, whether each lowers and how its kernel is called: the
    diagnostics, hovers, lenses and quick fixes of a save are those of the full analysis."""
    options = AnalyzeOptions(train=train)
    with_code, saved = analyze_file(path, options), analyze_file(path, options, code=False)
    assert any(c.kernel for _, c in with_code.clusters()), "an example with kernels"
    assert without_code(saved) == without_code(with_code)
    assert all(c.kernel is None or not c.kernel.has_code for _, c in saved.clusters())
    assert all(c.kernel is None or c.kernel.has_code for _, c in with_code.clusters())


async def test_the_worker_answers_a_save_without_the_kernels_code_and_generates_it_when_asked(tmp_path):
    path = tmp_path / "example_net.py"
    text = example_text()
    path.write_text(text)
    options = AnalyzeOptions(source_text=text)
    worker = WorkerClient()
    try:
        saved: Report = await worker.run(AnalyzeJob(str(path), options), LIMITS)
        generated: Report = await worker.run(GenerateJob(str(path), options), LIMITS)
    finally:
        await worker.stop()
    kernels = [c.kernel for _, c in saved.clusters()]
    assert [k.name for k in kernels if k] == ["cluster0", "cluster1", "cluster2"]
    assert all(k and not k.has_code for k in kernels)
    assert [c.backward_detail for _, c in saved.clusters()] == ["", "", ""]
    # What goes over the pipe on each save: the report alone, a few tens of kB, not the module's code too.
    saved_bytes, generated_bytes = (len(encode(Done(1, r.to_dict()))) for r in (saved, generated))
    assert saved_bytes < 40_000 and generated_bytes > saved_bytes + 40_000, (saved_bytes, generated_bytes)
    for _, cluster in generated.clusters():
        assert cluster.kernel and "@triton.jit" in cluster.kernel.source
        assert cluster.backward_detail.startswith("gradients of ")  # (each of these has a backward kernel)
    assert without_code(saved) == without_code(generated)


def cpu_ms(path: str, code: bool) -> float:
    started = time.process_time()
    analyze_file(path, AnalyzeOptions(), code=code)
    return (time.process_time() - started) * 1000


@pytest.mark.timing
@pytest.mark.parametrize("name", ["example_net.py", "llama_block.py"])
def test_a_saves_analysis_takes_at_most_60_percent_of_the_analysis_with_code(name: str):
    """CPU time in one process, the two analyses in turn (a busy machine slows both alike)."""
    path = os.path.join(EXAMPLES, name)
    cpu_ms(path, True), cpu_ms(path, False)  # (first calls: lazy imports, caches)
    timed: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(7):
        for code in (True, False):
            timed[code].append(cpu_ms(path, code))
    with_code, saved = statistics.median(timed[True]), statistics.median(timed[False])
    assert saved <= 0.6 * with_code, f"{saved:.0f} ms CPU without the code, {with_code:.0f} ms with it"


def test_the_code_joins_a_saves_analysis_as_a_new_report_of_the_same_clusters_only():
    """What the server published is never changed under a request answering from it; and code
    generated from an analysis that found other clusters is not taken for theirs."""
    path = os.path.join(EXAMPLES, "example_net.py")
    saved, generated = analyze_file(path, code=False), analyze_file(path)
    joined = with_code(saved, generated)
    assert [c.kernel.source for _, c in joined.clusters()] == [c.kernel.source for _, c in generated.clusters()]
    assert [c.backward_detail for _, c in joined.clusters()] == [c.backward_detail for _, c in generated.clusters()]
    assert all(not c.kernel.has_code and c.backward_detail == "" for _, c in saved.clusters())
    without_clusters = dataclasses.replace(generated, models=[dataclasses.replace(generated.models[0], clusters=[])])
    with pytest.raises(NotTheSameAnalysis):
        with_code(saved, without_clusters)


def test_the_analysis_with_code_never_waits_on_a_fifo_where_the_kernel_module_goes(tmp_path):
    """It reads the kernel module beside the model for the names the model already calls.  A FIFO there
    (or a file of gigabytes) is no module of ours: left unread, where a plain `open()` waited for ever,
    and the kernel view or the fix that asked for the code with it."""
    model = tmp_path / "fifo_net.py"
    model.write_text(example_text())
    os.mkfifo(tmp_path / "fifo_net_kernels.py")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fuselens.cli.main", "analyze", str(model), "--json", "-"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the analysis waited on the FIFO")
    finally:
        with contextlib.suppress(OSError):  # (whatever still waits on it gets its end of file)
            os.close(os.open(tmp_path / "fifo_net_kernels.py", os.O_WRONLY | os.O_NONBLOCK))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [c["kernel"]["name"] for c in report["models"][0]["clusters"]] == ["cluster0", "cluster1", "cluster2"]
