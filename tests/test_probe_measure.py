"""`fuselens validate --probe`: each opportunity the probe names made with PyTorch's kernels at its site
and measured against the dense GEMM, the output error on the probe's own batches (anywhere) and the
time (on a CUDA device)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fuselens.contracts.options import AnalyzeOptions
from fuselens.contracts.probe import PROBE_VERSION, ProbeOptions, ProbeReport

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLANTED = os.path.join(REPO, "examples", "probe_planted.py")
COMMAND = [sys.executable, "-m", "fuselens.cli.main", "validate", "--probe"]


def _line_of(snippet: str) -> int:
    with open(PLANTED, encoding="utf-8") as fh:
        return next(number for number, text in enumerate(fh, 1) if snippet in text)


def _measured(data: dict, snippet: str) -> list[dict]:
    (model,) = data["models"]
    (site,) = [s for s in model["sites"] if s["line"] == _line_of(snippet)]
    return site["measured"]


@pytest.fixture(scope="module")
def on_cpu(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path_factory.mktemp("measured") / "probe.json"
    done = subprocess.run(
        [*COMMAND, PLANTED, "--on", "cpu", "--json", str(out)], capture_output=True, text=True, timeout=600
    )
    with open(out, encoding="utf-8") as fh:
        return done, json.load(fh)


def test_the_planted_structures_measure_as_the_probe_said_on_a_cpu(on_cpu):
    done, data = on_cpu
    assert done.returncode == 0, done.stderr
    assert data["measured_on"] == "cpu" and data["probe_version"] == PROBE_VERSION

    (sparse,) = _measured(data, "self.sparse(")
    assert sparse["kind"] == "sparse-2:4" and "input pruned to 2:4" in sparse["implementation"]
    assert sparse["calls"] == 8 and sparse["error"] < 1e-6

    fp8, int8 = _measured(data, "self.outlier(")
    assert "float8" in fp8["implementation"] and "int8" in int8["implementation"]
    for quantized in (fp8, int8):  # the outlier channels smoothed into the weight: below one scale per tensor
        assert quantized["error"] < quantized["per_tensor_error"]
    assert int8["error"] < 0.01 < int8["per_tensor_error"]

    (low_rank,) = _measured(data, "self.low_rank(")
    assert "rank 16" in low_rank["implementation"] and low_rank["error"] < 1e-4

    (memoised,) = _measured(data, "self.repeated(")
    assert memoised["error"] == 0.0 and "7 of 8 calls were hits" in memoised["note"]

    assert _measured(data, "self.plain(") == []


def test_without_a_gpu_each_measurement_says_its_time_needs_one(on_cpu):
    _, data = on_cpu
    measured = [m for site in data["models"][0]["sites"] for m in site["measured"]]
    assert len(measured) == 5
    for m in measured:
        assert m["status"] == "error-only" and m["dense_ms"] is None and m["specialised_ms"] is None
        assert "timing needs a CUDA GPU" in m["note"]
    assert (
        "timing needs a CUDA GPU"
        in subprocess.run(
            [*COMMAND, PLANTED, "--on", "cpu"], capture_output=True, text=True, timeout=600, env=_wide()
        ).stdout
    )


def _wide() -> dict[str, str]:
    return {**os.environ, "COLUMNS": "240"}


def test_a_probe_report_of_the_first_version_still_loads():
    from fuselens.pipeline.probe import probe_file

    report = probe_file(PLANTED, AnalyzeOptions(), ProbeOptions(batches=2, device="cpu"))
    first = report.to_dict() | {"probe_version": 1}
    first.pop("measured_on")
    for site in first["models"][0]["sites"]:
        site.pop("measured"), site.pop("code")
        for opportunity in site["opportunities"]:
            opportunity.pop("role"), opportunity.pop("scheme")
    loaded = ProbeReport.from_dict(first)
    assert loaded.measured_on == "" and all(not s.measured for s in loaded.models[0].sites)
    assert [o.kind for s in loaded.models[0].sites for o in s.opportunities] == [
        o.kind for s in report.models[0].sites for o in s.opportunities
    ]


@pytest.mark.gpu
def test_on_a_gpu_each_specialisation_is_timed_against_the_dense_gemm(tmp_path):
    out = tmp_path / "probe.json"
    done = subprocess.run(
        [*COMMAND, PLANTED, "--on", "cuda", "--json", str(out)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    measured = [m for site in data["models"][0]["sites"] for m in site["measured"]]
    assert data["measured_on"] == "cuda" and len(measured) == 5
    for m in measured:  # (a 64-wide float32 GEMM is smaller than some of PyTorch's kernels take: it says so)
        timed = m["status"] == "timed" and m["dense_ms"] > 0 and m["specialised_ms"] > 0
        assert timed or (m["status"] == "not-measured" and "PyTorch refused it here" in m["note"]), m
    assert {m["kind"] for m in measured if m["status"] == "timed"} >= {"low-rank", "memoize"}
    (low_rank,) = _measured(data, "self.low_rank(")
    assert low_rank["error"] < 1e-2  # (the factors in the model's float32, on the GPU's TF32-free matmul)


@pytest.mark.gpu
def test_fp8_and_2_4_run_on_pytorch_kernels_at_a_gpu_size():
    import torch

    from fuselens.validate import specialisations
    from fuselens.validate import specialised_gemms as made

    generator = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16, generator=generator)
    calls = [(torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16, generator=generator), weight)]
    channel_max = calls[0][0].abs().amax(0).float()
    fp8 = specialisations.measure("quantize", calls, lambda w: made.quantized(w, "fp8", True, channel_max))
    sparse = specialisations.measure("sparse-2:4", calls, made.sparse_weight)
    for m in (fp8, sparse):
        assert m.status == "timed" and m.dense_ms and m.specialised_ms
    assert "_scaled_mm" in fp8.implementation and fp8.error is not None and fp8.error < 0.1
    assert fp8.kernel_ms and sparse.kernel_ms is None  # (the fp8 kernel alone, its input quantized ahead)
    assert "to_sparse_semi_structured" in sparse.implementation


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_a_quantized_gemms_kernel_alone_computes_what_the_whole_call_does(fmt):
    """What `kernel_ms` times (the kernel on an input quantized ahead) is the same GEMM as the call
    timed with its quantization: only where the input's quantization runs differs."""
    import torch

    from fuselens.validate import specialised_gemms as made

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 64, generator=generator)
    x = torch.randn(3, 5, 64, generator=generator)
    _, gemm = made.quantized(weight, fmt, True, x.abs().amax((0, 1)))
    whole = gemm(x)
    alone = gemm.kernel_on(x)()
    assert whole.shape == (3, 5, 48)
    assert torch.equal(alone.reshape(whole.shape), whole)
    assert (whole - x @ weight.T).norm() / (x @ weight.T).norm() < 0.1
