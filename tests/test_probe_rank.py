"""A weight's effective rank (the singular values holding 99% of its energy), as the probe finds it: from
every eigenvalue of its Gram matrix where the weight is small, by a randomized range finder with bounds
that hold the true rank where it is large."""

from __future__ import annotations

import pytest
import torch

from fuselens.analysis.probe import numerics
from fuselens.analysis.probe.recorder import LOW_RANK_SHARE


def _exact(weight: torch.Tensor) -> int:
    singular = torch.linalg.svdvals(weight.double())
    held = singular.square().cumsum(0) / singular.square().sum()
    return int((held < numerics.ENERGY).sum()) + 1


def _spectrum(rows: int, cols: int, values: torch.Tensor, seed: int) -> torch.Tensor:
    """A rows × cols weight with the singular values `values` (random singular vectors)."""
    generator = torch.Generator().manual_seed(seed)
    left = torch.linalg.qr(torch.randn(rows, len(values), generator=generator)).Q
    right = torch.linalg.qr(torch.randn(cols, len(values), generator=generator)).Q
    return (left * values) @ right.T


SPECTRA = {
    "initialised": lambda rows, cols, seed: (
        torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 0.02
    ),
    "fast decay": lambda rows, cols, seed: _spectrum(rows, cols, torch.logspace(0, -3, min(rows, cols)), seed),
    "slow decay": lambda rows, cols, seed: _spectrum(rows, cols, torch.logspace(0, -1, min(rows, cols)), seed),
    "rank 16 and noise": lambda rows, cols, seed: _spectrum(
        rows, cols, torch.cat([torch.ones(16), torch.full((min(rows, cols) - 16,), 1e-3)]), seed
    ),
}


@pytest.mark.parametrize("shape", [(768, 768), (3072, 768), (512, 1536)])
@pytest.mark.parametrize("spectrum", list(SPECTRA))
def test_a_large_weights_rank_lies_within_its_bounds_and_a_low_one_is_exact(shape, spectrum):
    weight = SPECTRA[spectrum](*shape, 0)
    exact, found = _exact(weight), numerics.effective_rank(weight)
    assert found.low <= exact <= found.high and found.low <= found.rank <= found.high, (exact, found)
    assert found.high - found.low <= 0.45 * min(shape), (exact, found)
    if exact <= LOW_RANK_SHARE * min(shape):  # (where a low-rank opportunity is decided)
        assert found.rank == found.high == exact and found.high - found.low <= 2, (exact, found)


def test_a_low_rank_is_found_exactly_by_the_range_finder():
    weight = SPECTRA["rank 16 and noise"](1024, 768, 1)
    assert numerics.effective_rank(weight) == numerics.Rank(16, 16, 16)


def test_a_small_weights_rank_is_exact():
    weight = SPECTRA["slow decay"](200, 256, 2)
    found = numerics.effective_rank(weight)
    assert found.rank == found.low == found.high == _exact(weight)


def test_the_rank_leaves_the_callers_random_state_as_it_was():
    torch.manual_seed(5)
    before = torch.random.get_rng_state()
    numerics.effective_rank(SPECTRA["initialised"](768, 768, 3))
    assert torch.equal(torch.random.get_rng_state(), before)
