"""The kernel module's section for the fused linear cross-entropy: the runtime's `linear_cross_entropy`
(`runtime/linear_loss.py`), which a rewrite of a "linear-cross-entropy" pattern calls where the installed
torch has no `F.linear_cross_entropy`.  Text only, as the rest of the module is."""

from __future__ import annotations

from .module import section
from .runtime_source import runtime_source

LOSS_SECTION = "linear_cross_entropy"  # the section's name, and the function the rewritten code imports


def fused_loss_section() -> str:
    return section(
        LOSS_SECTION,
        "a projection onto a vocabulary and its cross-entropy, the logits computed a chunk of tokens at a time",
        runtime_source("linear_loss"),
    )
