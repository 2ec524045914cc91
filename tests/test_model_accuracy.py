"""The whole-model check of a narrow model: as accurate as eager, judged against float64."""

from __future__ import annotations

import os

import torch

from fuselens.contracts.config import model_settings
from fuselens.contracts.options import AnalyzeOptions, ValidateOptions
from fuselens.pipeline.validate import validate_file
from fuselens.validate.numerics import as_accurate_as_eager, tolerance

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def test_a_bf16_gpt_with_its_kernels_applied_matches_as_accurately_as_eager():
    """Four bf16 layers amplify a rounding's difference past bf16's element tolerance in the logits
    (here the interpreter's, which truncates to bf16 where a GPU rounds to nearest); the applied
    model is still about as close to the model in float64 as eager is, so it matches, and the check
    says how far off each is."""
    config = {
        "inputs": [{"shape": [2, 64], "dtype": "int64", "high": 512}],
        "init": {"vocab": 512, "max_len": 64, "d_model": 64, "n_heads": 4, "n_layers": 4},
        "param_dtype": "bfloat16",
    }
    result = validate_file(
        os.path.join(EXAMPLES, "gpt.py"),
        AnalyzeOptions(models={"GPT": model_settings(config, "the test")}),
        ValidateOptions(interpret=True),
    )
    assert not result.problems, result.problems
    (model,) = result.models
    assert [c.status for c in model.clusters] == ["verified"] * len(model.clusters)
    check = model.model
    assert check is not None and check.status == "matches", check
    atol, _ = tolerance(torch.bfloat16)
    assert check.max_abs is not None and check.max_abs > atol
    assert "as accurate as eager" in check.message and "float64" in check.message


def test_an_output_further_from_float64_than_eager_s_is_not_as_accurate():
    gen = torch.Generator().manual_seed(0)
    exact = torch.randn(4096, generator=gen, dtype=torch.float64)
    eager = (exact + 0.01 * torch.randn(4096, generator=gen, dtype=torch.float64)).to(torch.bfloat16)
    like_eager = (exact + 0.01 * torch.randn(4096, generator=gen, dtype=torch.float64)).to(torch.bfloat16)
    worse = (exact + 0.05 * torch.randn(4096, generator=gen, dtype=torch.float64)).to(torch.bfloat16)
    assert as_accurate_as_eager(like_eager, eager, exact).ok
    off = as_accurate_as_eager(worse, eager, exact)
    assert not off.ok and off.error > 2 * off.eager_error
    with_nan = like_eager.clone()
    with_nan[7] = float("nan")
    assert not as_accurate_as_eager(with_nan, eager, exact).ok
