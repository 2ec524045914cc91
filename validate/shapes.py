"""Choosing smaller input shapes that keep a model's clusters: to validate at, and to profile at on a CPU.

The Triton interpreter costs about a millisecond per program launched, so validating
at a 16384x1024 example shape would take minutes.  We shrink the example inputs dim by
dim (halving, never to 1, which would change broadcasting) while a meta trace of the
model still finds the same clusters, until the largest cluster is small; a dim that inputs share
(a batch, a sequence: the same size at the same place), which halving in one of them alone makes
disagree, is halved in all of them at once.  Validating at
a shape different from the one the kernels were generated for is also the test that no
size was baked into them.  A profile on a CPU shrinks them the same way until its forward
moves few enough bytes (`pipeline/profile.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from fuselens.analysis import capture, loader
from fuselens.analysis.detect import detect
from fuselens.analysis.graph import Graph
from fuselens.analysis.instances import signature_of_ops
from fuselens.codegen.plan import KernelPlan, check, plan_cluster
from fuselens.contracts.config import InputSpec

Signatures = Callable[[list[InputSpec]], "tuple[tuple, int] | None"]  # (clusters in detection order, a size)
Size = Callable[[Graph, list[KernelPlan]], int]  # the size of a trace that shrinking brings under a bound

MAX_DOMAIN = 1 << 17  # elements in the largest cluster's iteration space


def largest_cluster(graph: Graph, plans: list[KernelPlan]) -> int:
    """Elements in the largest cluster's iteration space."""
    return max((_numel(p.domain) for p in plans), default=0)


def traced_signatures(
    meta_model: torch.nn.Module, names: Sequence[str], user_code: capture.UserCode, size: Size = largest_cluster
) -> Signatures:
    """`signatures` for `scaled_specs`: a meta trace of `meta_model` at the trial shapes, its clusters in
    the order they are detected (instances are found by their place in it) and its `size`."""

    def signatures(trial: list[InputSpec]) -> tuple[tuple, int] | None:
        try:
            t = capture.trace(meta_model, loader.meta_inputs(trial), list(names), user_code)
        except capture.CaptureError:
            return None
        plans = [plan_cluster(t.graph, c.members) for c in detect(t.graph, check).clusters]
        return tuple(signature_of_ops(t.graph, p.compute) for p in plans), size(t.graph, plans)

    return signatures


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def scaled_specs(specs: list[InputSpec], signatures: Signatures, bound: int = MAX_DOMAIN) -> list[InputSpec]:
    """Smaller input specs that keep the same clusters, in the same order, until their size is at most
    `bound` (or no dim can be halved).

    `signatures(specs)` traces at `specs` and returns (the cluster signatures in detection order, the size:
    by default the largest cluster's numel), or None when the model cannot run at those shapes.
    """
    reference = signatures(specs)
    if reference is None:
        return specs
    wanted, largest = reference
    current = [InputSpec(list(s.shape), s.dtype, high=s.high) for s in specs]
    frozen: set[tuple[int, int]] = set()
    while largest > bound:
        progress = False
        for i, spec in enumerate(current):
            for d, size in enumerate(spec.shape):
                if (i, d) in frozen or size < 4 or largest <= bound:
                    continue
                trial = _halved(current, [(i, d)])
                result = signatures(trial)
                if result is None or result[0] != wanted:
                    trial = _halved(current, _sharing(current, i, d))
                    result = signatures(trial) if trial != current else None
                if result is None or result[0] != wanted:
                    frozen.add((i, d))
                    continue
                current, largest = trial, result[1]
                progress = True
        if not progress:
            break
    return current


def _halved(specs: list[InputSpec], dims: list[tuple[int, int]]) -> list[InputSpec]:
    """`specs` with each (input, dim) of `dims` halved."""
    trial = [InputSpec(list(s.shape), s.dtype, high=s.high) for s in specs]
    for i, d in dims:
        trial[i].shape[d] //= 2
    return trial


def _sharing(specs: list[InputSpec], i: int, d: int) -> list[tuple[int, int]]:
    """Input `i`'s dim `d` and the same dim of every other input of its size there (a batch, a sequence
    that two inputs share, which halving in one of them alone makes disagree); [] where none shares it."""
    size = specs[i].shape[d]
    shared = [(j, d) for j, s in enumerate(specs) if j != i and d < len(s.shape) and s.shape[d] == size]
    return [(i, d), *shared] if shared else []
