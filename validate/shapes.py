"""Choosing the input shapes to validate at.

The Triton interpreter costs about a millisecond per program launched, so validating
at a 16384x1024 example shape would take minutes.  We shrink the example inputs dim by
dim (halving, never to 1, which would change broadcasting) while a meta trace of the
model still finds the same clusters, until the largest cluster is small.  Validating at
a shape different from the one the kernels were generated for is also the test that no
size was baked into them.
"""

from __future__ import annotations

from collections.abc import Callable

from fuselens.contracts.config import InputSpec

Signatures = Callable[[list[InputSpec]], "tuple[tuple, int] | None"]  # (clusters in detection order, largest size)

MAX_DOMAIN = 1 << 17  # elements in the largest cluster's iteration space


def scaled_specs(specs: list[InputSpec], signatures: Signatures, max_domain: int = MAX_DOMAIN) -> list[InputSpec]:
    """Smaller input specs that keep the same clusters, in the same order.

    `signatures(specs)` traces at `specs` and returns (the cluster signatures in detection order, largest
    cluster numel), or None when the model cannot run at those shapes.
    """
    reference = signatures(specs)
    if reference is None:
        return specs
    wanted, largest = reference
    current = [InputSpec(list(s.shape), s.dtype, high=s.high) for s in specs]
    frozen: set[tuple[int, int]] = set()
    while largest > max_domain:
        progress = False
        for i, spec in enumerate(current):
            for d, size in enumerate(spec.shape):
                if (i, d) in frozen or size < 4 or largest <= max_domain:
                    continue
                trial = [InputSpec(list(s.shape), s.dtype, high=s.high) for s in current]
                trial[i].shape[d] = size // 2
                result = signatures(trial)
                if result is None or result[0] != wanted:
                    frozen.add((i, d))
                    continue
                current, largest = trial, result[1]
                progress = True
        if not progress:
            break
    return current
