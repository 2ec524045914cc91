"""How many distinct tensors a site was called with, in constant memory: a HyperLogLog of fingerprints.

A fingerprint is a few sums of the tensor (plain, squared, and weighted by position), hashed with its
shape: two batches that agree on all of them are taken to be the same.  It costs one small copy to the
host per sketched call.  The estimate counts exactly (by linear counting) while the number is small
against `REGISTERS`, which is where a repeat matters; up to `EXACT` hashes are kept as they are and
counted exactly.
"""

from __future__ import annotations

import hashlib
import math

import torch

REGISTERS = 256  # 2**8: the first 8 bits of a hash pick the register
EXACT = 64  # distinct hashes counted exactly before the estimate takes over


def fingerprint(x: torch.Tensor) -> bytes:
    flat = x.detach().reshape(-1).float()
    weights = torch.linspace(-1.0, 1.0, flat.numel(), device=flat.device)
    sums = torch.stack(
        [
            flat.sum().double(),
            flat.square().sum().double(),
            (flat * weights).sum().double(),
        ]
    )
    return repr((tuple(x.shape), str(x.dtype), sums.tolist())).encode()


class DistinctCounter:
    """A HyperLogLog over the fingerprints added: `REGISTERS` bytes, whatever the number added."""

    def __init__(self) -> None:
        self.registers = bytearray(REGISTERS)
        self.exact: set[int] | None = set()  # None once more than EXACT were seen

    def add(self, key: bytes) -> None:
        h = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
        if self.exact is not None:
            self.exact.add(h)
            if len(self.exact) > EXACT:
                self.exact = None
        index, rest = h & (REGISTERS - 1), h >> 8
        rank = 56 - rest.bit_length() + 1  # the position of the first 1 in the remaining 56 bits
        self.registers[index] = max(self.registers[index], rank)

    def estimate(self) -> int:
        if self.exact is not None:
            return len(self.exact)
        m = REGISTERS
        alpha = 0.7213 / (1 + 1.079 / m)
        raw = alpha * m * m / sum(2.0**-r for r in self.registers)
        empty = self.registers.count(0)
        if raw <= 2.5 * m and empty:
            return round(m * math.log(m / empty))
        return round(raw)
