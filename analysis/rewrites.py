"""Which named patterns have a source rewrite, and the builder that makes each.

A pattern of such a kind gets either a `Rewrite` (`contracts/report.py`: whole lines of the analyzed
file and the text written in their place, with the imports and torch version it needs) or a `Refusal`
that names what stops it, from `REWRITE_REFUSALS`.  A builder reads the graph the pattern was found in
and the analyzed file's text; it never writes anything (`codegen/rewrites.py` and `fuselens apply`
do).  Ids, and the clusters a rewrite replaces, are given with the clusters' (`pipeline/kernels.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fuselens.contracts import report as R

from .graph import Graph
from .loss_rewrite import Refused, linear_cross_entropy_rewrite
from .patterns import Match
from .sourcemap import SourceIndex


@dataclass(frozen=True)
class Refusal:
    """Why a pattern of a kind that has a rewrite gets none here."""

    code: str  # a key of REWRITE_REFUSALS
    detail: str  # the sentence that says precisely what stops it

    def __post_init__(self) -> None:
        assert self.code in R.REWRITE_REFUSALS, self.code


# A builder: the rewrite of the pattern `match` of `graph` in the analyzed file `source`, or why none.
Builder = Callable[[Graph, Match, SourceIndex], "R.Rewrite | Refusal"]


def _linear_cross_entropy(graph: Graph, match: Match, source: SourceIndex) -> R.Rewrite | Refusal:
    try:
        return linear_cross_entropy_rewrite(graph, match.output, source)
    except Refused as refused:
        return Refusal(refused.code, refused.detail)


def _attention(graph: Graph, match: Match, source: SourceIndex) -> R.Rewrite | Refusal:
    from .attention_source import attention_rewrite  # (it reads this module's Refusal)

    return attention_rewrite(graph, match, source)


BUILDERS: dict[str, Builder] = {"linear-cross-entropy": _linear_cross_entropy, "attention": _attention}


def rewrite_of(graph: Graph, match: Match, source: SourceIndex) -> R.Rewrite | Refusal | None:
    """The rewrite of `match`, or why it has none; None for a kind of pattern that has no rewrite."""
    builder = BUILDERS.get(match.name)
    return builder(graph, match, source) if builder is not None else None
