"""The kernels a plan gets: each variant a class that says when it applies, writes its kernel(s) and
writes its launch; which variants a plan gets, and how its launcher picks between them, here.

An elementwise plan always gets the 2-D tile kernel (`TileKernel`), a row plan the whole-row and
looped row kernels (`RowKernels`), a GEMM cluster's plan the fused GEMM (`GemmKernel`); the others are for layouts and shapes those serve badly, each
tried at call time before the ones it falls back to (`Family.tried`).  `docs/ARCHITECTURE.md`
tabulates them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plan import KernelPlan
from .base import Context, Launch, Variant
from .elementwise import AcrossKernel, FlatKernel, TileKernel, WideKernel
from .gemm import GemmKernel
from .groups import SplitGroupKernels
from .rows import AcrossRowKernel, RowKernels

__all__ = ["ELEMENTWISE", "GEMM", "ROWS", "Context", "Family", "Launch", "Variant", "family_of"]


@dataclass(frozen=True)
class Family:
    """The variants of one kind of plan."""

    prefix: str  # of the strategy the report shows
    written: tuple[type[Variant], ...]  # every variant, in the order the kernel module holds their kernels
    tried: tuple[type[Variant], ...]  # in the order the launcher tries them; the last always applies
    # Pairs that never both apply to one plan (what one needs, the other rules out); checked.
    exclusive: tuple[tuple[type[Variant], type[Variant]], ...]

    def variants(self, plan: KernelPlan) -> list[Variant]:
        """The variants `plan` gets, in the module's order."""
        chosen = [v() for v in self.written if v.applies(plan)]
        kinds = {type(v) for v in chosen}
        if self.tried[-1] not in kinds:
            raise AssertionError(f"{self.tried[-1].__name__} must run every plan it is the fallback of")
        for a, b in self.exclusive:
            if a in kinds and b in kinds:
                raise AssertionError(
                    f"{a.__name__} and {b.__name__} both apply: their launches cannot pick between them"
                )
        return chosen

    def strategy(self, variants: list[Variant]) -> str:
        return self.prefix + "/".join(v.strategy for v in variants)

    def launch(self, variants: list[Variant], context: Context) -> list[str]:
        """The launcher's lines that pick a kernel and launch it: each variant tried in turn, falling
        back to the launch of those after it."""
        by_kind = {type(v): v for v in variants}
        launch = Launch()
        for kind in reversed(self.tried):
            if kind in by_kind:
                launch = by_kind[kind].launch(context, launch)
        return launch.lines()


ELEMENTWISE = Family(
    "elementwise-",
    written=(FlatKernel, TileKernel, AcrossKernel, WideKernel),
    tried=(FlatKernel, WideKernel, AcrossKernel, TileKernel),
    # The wide kernel takes the row dim the full-size inputs fold into their rows; an input read across
    # them along a row dim of its own leaves no such dim (`plan.folds_a_row_dim`).
    exclusive=((WideKernel, AcrossKernel),),
)
ROWS = Family(
    "",
    written=(RowKernels, SplitGroupKernels, AcrossRowKernel),
    tried=(SplitGroupKernels, AcrossRowKernel, RowKernels),
    # The split kernels are a group norm's; the across row kernel walks the rows of any other.
    exclusive=((SplitGroupKernels, AcrossRowKernel),),
)


# A GEMM cluster's product and epilogue: one kernel (its epilogue's own kernels are an elementwise plan's).
GEMM = Family("", written=(GemmKernel,), tried=(GemmKernel,), exclusive=())


def family_of(plan: KernelPlan) -> Family:
    if plan.kind == "gemm-epilogue":
        return GEMM
    return ELEMENTWISE if plan.kind == "elementwise" else ROWS
