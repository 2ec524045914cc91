"""Source mapping: where a cluster lives in the code, and whether one call can replace it.

Each op carries every frame of model code that made it (file, line, function, which call of
that function, and the span of the expression each frame was evaluating), plus the names each
frame had for its operands.  A cluster's place is the innermost call all of its ops happen
inside; `regions.py` finds there the code one call of its kernel can replace (an expression, or
statements, with a helper's or a submodule's whole call inside).  A cluster maps

- `exact` when that code is in the analyzed file: a call-site edit is offered;
- `pointer` when the ops can be located but the code cannot be replaced there (the detail says
  why), or when it is in another file: a library's code still has a region, which is applied by
  patching the library at run time;
- `unavailable` when no op has a location in model code.

Clusters reached through shared code (a layer class used N times) point at that class's lines:
the innermost frame is the layer's own `forward`.
"""

from __future__ import annotations

import ast
import functools
import linecache
import os
from collections.abc import Sequence
from dataclasses import dataclass

from fuselens.contracts.report import Mapping as MappingQuality

from .graph import Graph, Node
from .packages import model_library
from .parsed import parse
from .places import common_place
from .regions import MixedCall, NoRegion, Region, find_region


@dataclass
class Mapping:
    quality: MappingQuality
    detail: str
    file: str = ""
    function: str = ""
    lines: tuple[int, int] = (0, 0)
    region: Region | None = None  # the code one call of the kernel replaces (in a library's file, too)
    # Where a call there also runs other ops: the cluster's ops it runs (a cluster of their own may fit
    # the called code).
    inside: set[int] | None = None


class SourceIndex:
    """Parsed source of the analyzed file, to reason about statements and names."""

    def __init__(self, path: str, text: str):
        self.path = os.path.abspath(path)
        self.text = text
        self.lines = text.splitlines()
        self.tree = parse(text)
        self._functions = [n for n in ast.walk(self.tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]

    def function_at(self, line: int, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """The innermost def named `name` (last part of a qualname) containing `line`."""
        short = name.split(".")[-1]
        best = None
        for fn in self._functions:
            inside = fn.lineno <= line <= (fn.end_lineno or fn.lineno)
            if fn.name == short and inside and (best is None or fn.lineno > best.lineno):
                best = fn
        return best

    def line_text(self, line: int) -> str:
        return self.lines[line - 1] if 0 < line <= len(self.lines) else ""


def map_cluster(
    graph: Graph,
    compute: list[int],
    members: set[int],
    inputs: list[int],
    outputs: list[int],
    source: SourceIndex | None,
    numbers: Sequence[tuple[str, dict[int, str]]] = (),
) -> Mapping:
    """Where the cluster's code is, and the region one call of its kernel can replace there."""
    place = common_place(graph, compute)
    if place is None:
        located = [f for f in (graph[i].source for i in compute) if f is not None]
        if not located:
            return Mapping("unavailable", "no op of this cluster was called from your code")
        first = min(located, key=lambda f: f.line)
        return Mapping(
            "pointer",
            "its ops are not called from one place in your code",
            first.file,
            first.function,
            (first.line, first.line),
        )
    base = Mapping("pointer", "", place.file, place.function, place.lines)
    here = source is not None and os.path.abspath(place.file) == source.path
    index = source if here and source is not None else source_of(place.file)
    home = source.path if source is not None else ""
    elsewhere = "" if here else f"its code is in {_shown(place.file, home)} ({place.function}), not in this file"
    fn = index.function_at(base.lines[0], place.function) if index is not None else None
    if index is None or fn is None:
        return _with(base, elsewhere or "the function holding it could not be found in the source")
    paired = next((graph[m] for m in compute if "pair" in graph[m].params), None)
    if paired is not None:
        return _with(base, _pair_call(paired))
    try:
        region = find_region(
            graph, compute, members, inputs, outputs, place.invocation, fn, index.lines, place.file, numbers
        )
    except NoRegion as exc:
        base.inside = exc.inside if isinstance(exc, MixedCall) else None
        return _with(base, f"{elsewhere}; {exc}" if elsewhere else str(exc))
    base.region = region
    base.lines = (region.first, region.last)
    if not here:
        return _with(base, elsewhere)
    base.quality = "exact"
    base.detail = "the lines can be replaced by one kernel call"
    return base


def _pair_call(node: Node) -> str:
    """Why a cluster that takes in `torch.max(x, dim)` (`min`) has no region: its call returns the values
    and the indices as one tuple, and a kernel's call would stand in for one of them."""
    name = node.op.removeprefix("arg")
    where = f" (line {node.line})" if node.line else ""
    return (
        f"`torch.{name}(x, dim)`{where} returns its values and indices as one pair, which one kernel call "
        f"cannot stand in for where the code reads them; written as `torch.a{name}(x, dim)` and "
        f"`torch.arg{name}(x, dim)` it applies"
    )


@functools.lru_cache(maxsize=64)
def source_of(path: str) -> SourceIndex | None:
    """The parsed source of a file other than the analyzed one (a library's), as it is on disk
    (or as the process read it: `linecache`)."""
    text = "".join(linecache.getlines(os.path.abspath(path)))
    try:
        return SourceIndex(path, text) if text else None
    except SyntaxError:
        return None


def _shown(file: str, home: str) -> str:
    """A file as a message names it: a library's from its package down, another of the user's by name."""
    library = model_library(file, home)
    return library.shown(file) if library is not None else os.path.basename(file)


def _with(mapping: Mapping, detail: str) -> Mapping:
    mapping.detail = detail
    return mapping
