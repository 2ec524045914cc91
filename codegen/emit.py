"""Emission: a `KernelPlan` -> the text of its `@triton.jit` kernels and of its launcher.

The plan's kernel variants (`variants/`) each write their kernel and their launch; the launcher
(`launcher.py`) reads every size and stride at call time and tries the variants' launches in turn,
so one generated module serves every shape; the only constants are the model's own (slice offsets,
head splits), and the launcher checks those before launching.
"""

from __future__ import annotations

from dataclasses import dataclass

from .kernel_text import closure, coords, used_coords
from .launcher import launcher_text
from .lowering import helpers_used
from .plan import KernelPlan
from .variants import Context, family_of


@dataclass
class Emitted:
    kernels: str  # the @triton.jit function(s)
    launcher: str  # the Python launcher, the reference, the op registration and the public function
    strategy: str
    helpers: list[str]


def emit(
    plan: KernelPlan,
    name: str,
    input_names: list[str],
    output_names: list[str],
    doc: str,
    comments: dict[str, str],
    reference: str | None,
    number_names: list[str] | None = None,
    trains: list[int] | None = None,
) -> Emitted:
    """The kernels and launcher of `plan` as the public function `name`, which takes `input_names`,
    then `number_names` (one for each of `plan.scalars`)."""
    family = family_of(plan)
    variants = family.variants(plan)
    context = Context(plan, f"_{name}_kernel", input_names, comments)
    # Every kernel of a plan takes the same arguments, so the divisors are gathered up front.
    used = used_coords(closure(plan, [o.stmt for o in plan.outputs], lambda s: True), plan)
    if any(v.every_row_coordinate for v in variants):
        used |= set(range(plan.row_dims))
    coords(plan, used, "r", context.divisors)
    for variant in variants:
        variant.gather_divisors(context)
    taken = len(context.divisors.exprs)
    kernels = "\n\n".join(variant.kernels(context) for variant in variants)
    launch = family.launch(variants, context)
    if len(context.divisors.exprs) != taken:
        raise AssertionError("a kernel divides by a size its arguments do not take the magic number of")
    numbers = number_names if number_names is not None else [slot.name for slot in plan.scalars]
    divisors = context.divisor_values()
    text = launcher_text(plan, name, input_names, numbers, doc, divisors, launch, reference, trains)
    return Emitted(kernels, text, family.strategy(variants), helpers_used(kernels))
