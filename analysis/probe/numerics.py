"""What a sketch computes of one tensor: 2:4 groups, fake quantization at int8 and fp8, the effective rank.

Each takes a float32 tensor laid out with the dim that matters last (the reduction dim for 2:4, the
channel dim for per-channel scales) and runs on the tensor's own device.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

INT8_MAX = 127.0
FP8_MAX = 448.0  # the largest finite float8 e4m3fn
ENERGY = 0.99  # the share of a weight's squared singular values its effective rank holds
TINY = 1e-30


def groups_of_four(x: torch.Tensor) -> torch.Tensor:
    """`x`'s last dim cut into groups of 4 (a trailing remainder left out): shape (groups, 4)."""
    size = x.shape[-1] // 4 * 4
    return x[..., :size].reshape(-1, 4)


def sparse_24_groups(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """How many groups of 4 along the last dim have at most 2 nonzeros (a device scalar), and how many
    groups there are."""
    groups = groups_of_four(x)
    return ((groups != 0).sum(-1) <= 2).sum(), groups.shape[0]


def prune_24(x: torch.Tensor) -> torch.Tensor:
    """`x` with the 2 smallest magnitudes of every group of 4 along the last dim set to zero (a trailing
    remainder kept): what a 2:4 sparse kernel computes with."""
    size = x.shape[-1] // 4 * 4
    groups = x[..., :size].reshape(-1, 4)
    keep = groups.abs().topk(2, dim=-1).indices
    pruned = torch.zeros_like(groups).scatter_(-1, keep, groups.gather(-1, keep))
    out = x.clone()
    out[..., :size] = pruned.reshape(*x.shape[:-1], size)
    return out


def _scale(absmax: torch.Tensor, largest: float) -> torch.Tensor:
    return absmax.clamp_min(TINY) / largest


def int8(x: torch.Tensor, absmax: torch.Tensor) -> torch.Tensor:
    """`x` through symmetric int8 and back, scaled by `absmax`: a scalar (one scale for the tensor) or
    one per channel (the last dim)."""
    scale = _scale(absmax, INT8_MAX)
    return (x / scale).round().clamp(-INT8_MAX, INT8_MAX) * scale


def fp8(x: torch.Tensor, absmax: torch.Tensor) -> torch.Tensor:
    """`x` through float8 e4m3 and back, scaled so that `absmax` (the tensor's, or each channel's) is
    the format's largest value; where torch has no float8, e4m3's 3 mantissa bits are rounded to."""
    scale = _scale(absmax, FP8_MAX)
    scaled = (x / scale).clamp(-FP8_MAX, FP8_MAX)
    if hasattr(torch, "float8_e4m3fn"):
        return scaled.to(torch.float8_e4m3fn).float() * scale
    mantissa, exponent = torch.frexp(scaled)  # (no float8: round the mantissa to 4 significant bits)
    return torch.ldexp((mantissa * 16).round() / 16, exponent) * scale


@dataclass
class Rank:
    """A weight's effective rank: `rank`, known to lie in [`low`, `high`] (all three equal where exact)."""

    rank: int
    low: int
    high: int


def effective_rank(weight: torch.Tensor, share: float = 0.25) -> Rank:
    """The number of singular values of `weight` (as a matrix: its first dim against the rest) that hold
    `ENERGY` of its squared Frobenius norm.  Its Gram matrix G (on the smaller side) has the squared
    singular values as eigenvalues and its trace is the energy, exactly.  A weight whose smaller dim is
    at most `EXACT_RANK_DIM` has all its eigenvalues found; a larger one only those of G on a random
    subspace a little larger than `share` of the dim, sharpened by power iterations: they bound the
    rank from above, and with the energy the subspace missed, from below (`_bounds`).  Within the
    subspace (where a low rank is decided) the bounds are close, and the rank given is the high one;
    above it they are wider (up to 45% of the dim apart on the spectra tests/test_probe_rank.py draws), and
    the rank given is an estimate within them: such a rank decides nothing, it is shown."""
    matrix = weight.detach().float().reshape(weight.shape[0], -1)
    if matrix.shape[0] > matrix.shape[1]:
        matrix = matrix.T
    gram = matrix @ matrix.T
    total = float(gram.trace())
    if total <= 0:
        return Rank(0, 0, 0)
    smaller = gram.shape[0]
    if smaller <= EXACT_RANK_DIM:
        with _one_thread(gram.device):
            energy = torch.linalg.eigvalsh(gram.double()).clamp_min(0).flip(0)
        held = energy.cumsum(0) / float(energy.sum())
        rank = int((held < ENERGY).sum()) + 1
        return Rank(rank, rank, rank)
    sketch = min(smaller, math.ceil(share * smaller) + OVERSAMPLE)
    captured, missed_squares = _ritz_values(gram, sketch)
    return _bounds(captured, missed_squares, total, smaller)


EXACT_RANK_DIM = 256  # a weight whose smaller dim is at most this has its rank found from every eigenvalue
OVERSAMPLE = 16  # the random subspace's dims beyond the ranks it decides
POWER_ITERATIONS = 1


@contextlib.contextmanager
def _one_thread(device: torch.device) -> Iterator[None]:
    """On a CPU, torch's ops on one thread for a while: a QR or an eigendecomposition of a few hundred
    dims is a chain of small steps, each waiting on every thread, where a machine busy with other work
    keeps one of them waiting (a 768-dim eigendecomposition took
    197 ms on 2 threads of a busy 2-core machine, 35 ms on one)."""
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _orthonormal(columns: torch.Tensor) -> torch.Tensor:
    with _one_thread(columns.device):
        return torch.linalg.qr(columns).Q


def _ritz_values(gram: torch.Tensor, sketch: int) -> tuple[torch.Tensor, float]:
    """G's eigenvalues on a `sketch`-dim subspace found by a randomized range finder with power
    iterations (draws of their own generator, the same every run), largest first: each is at most the
    eigenvalue of G of its rank; and the sum of the squared eigenvalues of what the subspace leaves of
    G (P⊥ G P⊥, P the projection on it): ‖G‖² − 2‖PG‖² + ‖PGP‖², Frobenius norms."""
    generator = torch.Generator(device=gram.device).manual_seed(0)
    basis = gram @ torch.randn(gram.shape[0], sketch, device=gram.device, generator=generator)
    for _ in range(POWER_ITERATIONS):
        basis = gram @ _orthonormal(basis)
    basis = _orthonormal(basis)
    projected = basis.T @ gram
    inside = projected @ basis
    with _one_thread(gram.device):
        captured = torch.linalg.eigvalsh(inside.double()).clamp_min(0).flip(0)
    squares = [float(t.double().square().sum()) for t in (gram, projected, inside)]
    return captured, max(squares[0] - 2 * squares[1] + squares[2], 0.0)


def _bounds(captured: torch.Tensor, missed_squares: float, total: float, smaller: int) -> Rank:
    """The rank from the subspace's eigenvalues `captured` (largest first) and the energy it missed.

        High: the Ritz values' sums are at most G's, so where they reach the goal the rank is no more; past
        them the missed energy spread evenly over the dims left reaches it soonest at the most.  Low: no r
        singular values hold more than the captured r plus all the missed energy; past the subspace none
        c more of them hold at most √(c · `missed_squares`) (Cauchy–Schwarz on the eigenvalues the subspace
    missed).  The rank given is the high bound where the subspace holds it, else an estimate between
    the bounds: the dims the missed eigenvalues need were they to fall linearly from the smallest
    captured one to zero."""
    cumulative = captured.cumsum(0)
    held, sketch = float(cumulative[-1]), captured.shape[0]
    missed, goal = max(total - held, 0.0), ENERGY * total
    if held >= goal:
        high = int((cumulative < goal).sum()) + 1
        low = int((cumulative + missed < goal).sum()) + 1
        return Rank(high, low, high)
    short, last = goal - held, max(float(captured[-1]), TINY)
    left = smaller - sketch
    high = min(smaller, sketch + math.ceil(short / max(missed, TINY) * left))
    low = min(high, sketch + math.ceil(short * short / max(missed_squares, TINY)))
    # A ramp from `last` down to zero holding `missed` is 2·missed/last dims long, and its first n dims
    # hold last·(n − n²/(2·length)): solved for `short`.  Where it is longer than the dims left, the
    # missed energy is spread evenly over them instead.
    length = 2 * missed / last
    reach = length * (1 - math.sqrt(max(1 - short / missed, 0.0))) if length <= left else short / missed * left
    rank = min(high, max(low, sketch + math.ceil(reach)))
    return Rank(rank, low, high)


def low_rank_factors(weight: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`weight` (as a matrix) ≈ left @ right, of `rank`: its leading singular triplets."""
    u, s, v = _leading(weight.detach().float().reshape(weight.shape[0], -1), rank)
    return (u[:, :rank] * s[:rank]).contiguous(), v[:, :rank].T.contiguous()


def _leading(matrix: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The leading `count` singular triplets of `matrix` (and a few more), by a randomized SVD whose
    draws are the same every run and leave the caller's random state as it was."""
    devices = [matrix.device] if matrix.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(0)
        return torch.svd_lowrank(matrix, q=min(count + 8, min(matrix.shape)), niter=3)
