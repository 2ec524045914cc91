"""Places: where a group of ops was called from, read off the frames each op carries.

A group's place is the innermost call (one invocation of one function) that all of its ops happen
inside; the entry point is the frame of one file (the analyzed one) that reaches ops whose code is
elsewhere.  Detection uses places to keep a cluster's views of its inputs with it, source mapping to
find the code one kernel call can replace.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .graph import Frame, Graph


@dataclass
class Place:
    """Where a group of ops shows up: the innermost call all of them happen inside."""

    file: str
    function: str
    invocation: int
    lines: tuple[int, int]
    innermost: bool  # every op is called directly from that function (no helper calls in between)
    functions: list[str]  # the functions the ops are called from directly


def common_place(graph: Graph, node_ids: list[int]) -> Place | None:
    stacks = [graph[i].stack for i in node_ids if graph[i].stack]
    if not stacks:
        return None
    shared = {f.invocation for f in stacks[0]}
    for stack in stacks[1:]:
        shared &= {f.invocation for f in stack}
    if not shared:
        return None
    invocation = next(f.invocation for f in stacks[0] if f.invocation in shared)
    frames = [next(f for f in stack if f.invocation == invocation) for stack in stacks]
    lines = [f.line for f in frames]
    direct = sorted({stack[0].function for stack in stacks})
    return Place(
        frames[0].file,
        frames[0].function,
        invocation,
        (min(lines), max(lines)),
        all(stack[0].invocation == invocation for stack in stacks),
        direct,
    )


def entry_point(graph: Graph, node_ids: list[int], home: str) -> Frame | None:
    """The frame of the analyzed file `home` that reaches a group of ops whose code is elsewhere (a
    library's, another of the user's files): the innermost call there that all of them happen inside,
    else the first op's.  None when no frame of `home` reaches them (a model whose forward is all a
    library's: the model's own line stands for it then)."""
    stacks = [[f for f in graph[i].stack if os.path.abspath(f.file) == home] for i in node_ids]
    stacks = [s for s in stacks if s]
    if not stacks:
        return None
    shared = {f.invocation for f in stacks[0]}
    for stack in stacks[1:]:
        shared &= {f.invocation for f in stack}
    return next((f for f in stacks[0] if f.invocation in shared), stacks[0][0])
