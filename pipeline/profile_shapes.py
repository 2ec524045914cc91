"""The input shapes a profile runs a model at on a CPU: bounded, so that the profile is too.

The example inputs are sized for a GPU (a Llama block's 4 x 2048 tokens); on a CPU one forward at
that size takes seconds and gigabytes, and a profile runs thirteen.  By default a CPU profiles at
smaller inputs that keep every cluster the analysis found (the shapes validation shrinks the same
way, `validate/shapes.py`), halved until the forward moves at most `CPU_FORWARD_BYTES` by the cost
model; a model that moves more than `CPU_REFUSED_BYTES` even then (its weights alone, say) is not
profiled there.  `--full-size` profiles at the analyzed shapes instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from fuselens.analysis import capture, cost
from fuselens.analysis.graph import Graph
from fuselens.codegen.plan import KernelPlan
from fuselens.contracts.config import InputSpec
from fuselens.contracts.units import bytes_label
from fuselens.validate.runner import Subject
from fuselens.validate.shapes import scaled_specs, traced_signatures

CPU_FORWARD_BYTES = 256 << 20  # what a forward profiled on a CPU moves at most, by default
CPU_REFUSED_BYTES = 16 * CPU_FORWARD_BYTES  # past this even at the smallest shapes, a CPU does not profile it


class TooLarge(Exception):
    """The model moves too much to profile on a CPU by default; the message says so, for the user."""


def cpu_shapes(
    subject: Subject, specs: list[InputSpec], names: Sequence[str], user_code: capture.UserCode
) -> list[InputSpec]:
    """`specs`, or smaller ones with the same clusters whose forward moves at most `CPU_FORWARD_BYTES`.
    TooLarge when even the smallest such shapes move more than `CPU_REFUSED_BYTES`."""
    signatures = traced_signatures(subject.meta(user_code), names, user_code, _forward_bytes)
    chosen = scaled_specs(specs, signatures, CPU_FORWARD_BYTES)
    traced = signatures(chosen)
    if traced is not None and traced[1] > CPU_REFUSED_BYTES:
        shapes = ", ".join(f"({', '.join(map(str, s.shape))})" for s in chosen)
        raise TooLarge(
            f"its forward moves {bytes_label(traced[1])} even at {shapes}, the smallest inputs that keep its "
            f"clusters: more than a CPU profiles by default ({bytes_label(CPU_REFUSED_BYTES)}); profile it on a "
            "GPU, or pass --full-size to profile it here anyway"
        )
    return chosen


def _forward_bytes(graph: Graph, plans: list[KernelPlan]) -> int:
    """What the forward moves, its ops each a kernel of its own: its time and its memory grow with it."""
    return cost.model_bytes(graph)
