"""The sizes a model with declared dynamic sizes is validated at, and its input shapes at each.

A kernel made at the analysis binding must compute what the lines do at every size of the declared
range, so a validation checks each point of the corpus and the sizes where a kernel that baked in a
size, or chose its tiles for one, goes wrong first: the range's ends, 1 where the range has it (a
broadcast), an odd size (a tile's masked tail) and a prime (no tile divides it).  Each size is moved
alone, the others at their analysis binding, as the corpus's points do.
"""

from __future__ import annotations

import re

from fuselens.contracts.config import InputSpec
from fuselens.contracts.dynamic import DynamicShapes, Size

_DIM = re.compile(r"^(?P<input>.+)\[(?P<dim>\d+)\]$")


def edge_sizes(size: Size) -> list[int]:
    """The sizes of `size`'s range a kernel fails at first: min, max, 1, an odd size, a prime."""
    low, high = size.min, size.max
    found = [low, high]
    if low <= 1:
        found.append(1)
    odd = _odd_near((low + high) // 2, low, high)
    if odd is not None:
        found.append(odd)
    prime = _largest_prime(low, high, avoid=set(found))
    if prime is not None:
        found.append(prime)
    return sorted(set(found))


def validation_bindings(dynamic: DynamicShapes) -> list[dict[str, int]]:
    """Every binding to validate at: the corpus's points, then each size's edges with the others at the
    analysis binding, each once, in that order."""
    out: list[dict[str, int]] = []
    for point in dynamic.points:
        if point not in out:
            out.append(dict(point))
    for size in dynamic.sizes:
        for value in edge_sizes(size):
            binding = {**dynamic.binding, size.name: value}
            if binding not in out:
                out.append(binding)
    return out


def specs_at(
    specs: list[InputSpec], names: list[str], dynamic: DynamicShapes, binding: dict[str, int]
) -> list[InputSpec]:
    """`specs` (the analysis binding's shapes) with each declared size's dims at its value in `binding`."""
    out = [InputSpec(list(s.shape), s.dtype, high=s.high) for s in specs]
    for size in dynamic.sizes:
        for place in size.used_by:
            match = _DIM.match(place)
            if match is None or match["input"] not in names:
                continue
            spec = out[names.index(match["input"])]
            dim = int(match["dim"])
            if dim < len(spec.shape):
                spec.shape[dim] = binding.get(size.name, size.binding)
    return out


def _odd_near(middle: int, low: int, high: int) -> int | None:
    """An odd size at or just past `middle` that is neither end of the range (nor 1)."""
    for value in (middle | 1, (middle | 1) - 2):
        if low < value < high and value > 1:
            return value
    return None


def _largest_prime(low: int, high: int, avoid: set[int]) -> int | None:
    """The largest prime in [low, high] not already in `avoid` (a prime end counts for itself)."""
    for value in range(high, max(low, 2) - 1, -1):
        if value not in avoid and _is_prime(value):
            return value
    return None


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    k = 2
    while k * k <= n:
        if n % k == 0:
            return False
        k += 1
    return True
