"""A cluster that no one kernel call can stand in for, split into pieces that can be.

A cluster's ops can come from several calls made by one function: a decoder's `forward` adds the
past length to its position ids in an `if` that also runs other code, then calls its rotary
embedding, whose ops take those ids on.  No region of `forward` can hold the call (the `if` must
keep its other code), but the rotary embedding's ops are one region of the function they run in.
So the cluster is split where its ops part: the ops made under each call the shared function makes
are a piece, and so are the ops it makes directly (those that pass values among themselves).  A piece that is still a cluster (two or more
ops that one kernel computes) is planned and placed again, and split again where it does not
place; the ops no piece keeps are left out, each with why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from fuselens.analysis.components import components
from fuselens.analysis.detect import Group, Rejected, describe
from fuselens.analysis.graph import Graph
from fuselens.analysis.places import common_place
from fuselens.codegen.plan import check

# How deep a piece is split again: a cluster across a layer's call and two helper calls inside it.
_DEPTH = 3

Placed = TypeVar("Placed")


def split_into_pieces(
    graph: Graph,
    group: Group,
    why: str,
    place: Callable[[Group], Placed | None],
    rejected: list[Rejected],
) -> list[tuple[Group, Placed]]:
    """The pieces of `group` that `place` places (`place(piece)`: what it found, or None where the piece
    has no region), largest first; `[]` where none does (the cluster stays whole, with its reason
    `why`).  The ops the pieces leave out are added to `rejected`."""
    placed = _placed(graph, group, place, _DEPTH)
    if not placed:
        return []
    kept = set().union(*(piece.members for piece, _ in placed))
    chains = " and ".join(_chain(graph, piece) for piece, _ in placed)
    reason = why.split("; ")[-1]
    for m in sorted(group.compute(graph)):
        if m not in kept:
            detail = f"{describe(graph[m])} is left out of the kernels of {chains}, which apply without it: {reason}"
            rejected.append(Rejected(m, "layer-boundary", detail))
    return placed


def _placed(
    graph: Graph, group: Group, place: Callable[[Group], Placed | None], depth: int
) -> list[tuple[Group, Placed]]:
    if depth == 0:
        return []
    found: list[tuple[Group, Placed]] = []
    for forms in _pieces(graph, group):
        placed = next(((piece, where) for piece in forms if (where := place(piece)) is not None), None)
        if placed is not None:
            found.append(placed)
        else:
            found += _placed(graph, forms[-1], place, depth - 1)
    return found


def _pieces(graph: Graph, group: Group) -> list[list[Group]]:
    """The group's ops split by the call they are made under, inside the call all of them share (the
    ops it makes directly are one piece): those that are still one kernel's cluster, largest first.
    Each piece in its forms: without the views of values from outside it (a view on a line of its own
    stays with the code before the piece's), then with them (a view inside the piece's expression)."""
    compute = group.compute(graph)
    shared = common_place(graph, compute)
    if shared is None:
        return []
    parts = _by_call(graph, group, shared.invocation)
    if len(parts) < 2:
        return []
    pieces = []
    for part in parts:
        for members in _connected(graph, part):
            forms = [
                Group(set(m), group.splits)
                for m in dict.fromkeys([frozenset(_between(graph, members)), frozenset(members)])
            ]
            forms = [f for f in forms if len(f.compute(graph)) >= 2 and check(graph, frozenset(f.members))[0]]
            if forms:
                pieces.append(forms)
    return sorted(pieces, key=lambda forms: (-len(forms[0].compute(graph)), min(forms[0].members)))


def _by_call(graph: Graph, group: Group, invocation: int) -> list[set[int]]:
    """The group's ops by the call of function call `invocation` they are made under (those it makes
    directly: one part)."""
    parts: dict[int, set[int]] = {}
    for m in group.members:
        stack = graph[m].stack
        at = next((k for k, f in enumerate(stack) if f.invocation == invocation), None)
        # under a call made there: that call's invocation; made there directly (or with no frame): -1
        key = stack[at - 1].invocation if at else -1
        parts.setdefault(key, set()).add(m)
    return list(parts.values())


def _between(graph: Graph, part: set[int]) -> set[int]:
    """A piece's ops and the views between them: a view of a value from outside the piece stays with
    the code around it, which passes the piece its input (as detection leaves a view of an input out)."""
    kept = {m for m in part if graph[m].cls.absorbable}
    for m in sorted(part - kept):
        if any(i in kept for i in graph[m].inputs):
            kept.add(m)
    return kept


def _connected(graph: Graph, members: set[int]) -> list[set[int]]:
    """The members as the sets that reach each other through values they pass among themselves (ops a
    function makes before and after a call, unconnected once the call's ops are a piece of their own)."""
    return components(members, ((i, m) for m in members for i in graph[m].inputs if i in members))


def _chain(graph: Graph, group: Group) -> str:
    return "`" + " → ".join(graph[i].op for i in group.compute(graph)) + "`"
