"""What a sketch computes of one tensor: 2:4 groups, fake quantization at int8 and fp8, the effective rank.

Each takes a float32 tensor laid out with the dim that matters last (the reduction dim for 2:4, the
channel dim for per-channel scales) and runs on the tensor's own device.
"""

from __future__ import annotations

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


def effective_rank(weight: torch.Tensor) -> int:
    """The number of singular values of `weight` (as a matrix: its first dim against the rest) that hold
    `ENERGY` of its squared Frobenius norm: from the eigenvalues of its Gram matrix (the squared singular
    values), a fraction of an SVD's time."""
    matrix = weight.detach().float().reshape(weight.shape[0], -1)
    if matrix.shape[0] > matrix.shape[1]:
        matrix = matrix.T
    energy = torch.linalg.eigvalsh(matrix @ matrix.T).clamp_min(0).flip(0)
    total = float(energy.sum())
    if total <= 0:
        return 0
    held = energy.cumsum(0) / total
    return int((held < ENERGY).sum()) + 1


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
