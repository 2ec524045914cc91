"""What every kernel variant is and has: the `Variant` interface, the `Context` a plan's kernels are
written in, and the `Launch` the launcher's variants are tried in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from ..kernel_args import KernelArgs
from ..kernel_text import Divisors, closure
from ..plan import KernelPlan, Stmt, full_rank_loads, padded_windows, permuted_outputs


@dataclass
class Context:
    """What a plan's kernels and launches are written from."""

    plan: KernelPlan
    kernel_name: str  # `_<name>_kernel`: each kernel is named with it and its own suffix
    input_names: list[str]  # the launcher's names for the plan's inputs
    comments: dict[str, str]  # statement name -> the source it comes from, for the trailing comment
    divisors: Divisors = field(default_factory=Divisors)
    _base: KernelArgs | None = None
    _records: dict[str, KernelArgs] = field(default_factory=dict)

    def name(self, suffix: str) -> str:
        return f"{self.kernel_name}_{suffix}"

    def statements(self) -> list[Stmt]:
        """Every statement the outputs need, in order."""
        return closure(self.plan, [o.stmt for o in self.plan.outputs], lambda s: True)

    @property
    def base(self) -> KernelArgs:
        """The arguments every kernel of the plan takes first (`plan_arguments`), recorded once the
        divisors are gathered: every kernel takes every magic number."""
        if self._base is None:
            self._base = plan_arguments(self.plan, self.input_names, self.divisors)
        return self._base

    def record(self, kernel: str, build: Callable[[KernelArgs], KernelArgs], of_plan: bool = True) -> KernelArgs:
        """The arguments of `kernel` (a suffix), built once, from the plan's (`of_plan`) or from none:
        its signature and its launch are written from this one record."""
        if kernel not in self._records:
            self._records[kernel] = build(self.base.copy() if of_plan else KernelArgs())
        return self._records[kernel]

    def divisor_values(self) -> list[str]:
        """The divisors as the launcher computes them, for their magic numbers."""
        return self.divisors.launcher_exprs(self.base)


@dataclass
class Launch:
    """The launcher's lines that launch a plan's kernels: `prelude`, what it computes before it picks
    a kernel (which the variants tried before may read), then `body`, which picks and launches."""

    prelude: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return self.prelude + self.body


class Variant:
    """One kernel (or a few launched together) of a plan."""

    suffix: ClassVar[str]  # its kernel is `_<name>_kernel_<suffix>`
    strategy: ClassVar[str]  # its part of the report's strategy ("tile", "across", ...)
    # Its kernel finds every row coordinate itself, so the divisors for all of them are gathered.
    every_row_coordinate: ClassVar[bool] = False

    @staticmethod
    def applies(plan: KernelPlan) -> bool:
        """Whether the plan gets this kernel."""
        raise NotImplementedError

    def gather_divisors(self, context: Context) -> None:
        """Register the run-time divisors the kernel uses besides the plan's row coordinates' (before any
        kernel is written: every kernel takes them all)."""

    def kernels(self, context: Context) -> str:
        """The `@triton.jit` text."""
        raise NotImplementedError

    def launch(self, context: Context, otherwise: Launch) -> Launch:
        """The launch of this kernel where the call's tensors suit it, else `otherwise` (the launch of the
        variants tried after it; nothing for the last)."""
        raise NotImplementedError


def plan_arguments(plan: KernelPlan, input_names: list[str], divisors: Divisors) -> KernelArgs:
    """The arguments every kernel of `plan` takes first, as the launcher passes them (its locals are
    named as the kernels' parameters, but for the inputs, their strides `st<k>` and what it gathers
    in one sequence), then the constexprs every kernel takes."""
    args = KernelArgs()
    for k, x in enumerate(input_names):
        args.add(f"in{k}_ptr", x)
    for k in range(len(plan.outputs)):
        args.add(f"out{k}_ptr", f"out{k}")
    args.add_each(f"d{i}" for i in range(len(plan.domain)))
    for k, slot in enumerate(plan.inputs):
        for j in sorted(slot.strides_used):
            args.add(f"in{k}_s{j}", f"st{k}[{j}]")
    for k in permuted_outputs(plan):
        for j in range(len(plan.domain)):
            args.add(f"out{k}_s{j}", f"out{k}.stride({j})")
    args.add_each(["R", "C"])
    if plan.kind == "elementwise":
        args.unpacked([f"p{i}" for i in range(plan.row_dims)], "pitches")
        if full_rank_loads(plan):
            args.unpacked([f"o{i}" for i in range(plan.row_dims)] + ["oc"], "out_strides")
    if plan.groups:
        args.add("G")
    args.add_each(f"e{k}" for k in padded_windows(plan))
    if divisors.exprs:
        args.unpacked([f"q{j}" for j in range(len(divisors.exprs))], "magic")
    args.add_each(slot.name for slot in plan.scalars if slot.runtime)
    return args.constexpr("BLOCK_R", "BLOCK_C", "INDEX_64", "WIDTH" if plan.fixed_width else "ALIGN")
