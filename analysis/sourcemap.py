"""Source mapping: where a cluster lives in the user's code, and whether its lines can be
replaced by one call.

Each op carries the innermost frame of the user's code that made it (file, line,
function, and which call of that function), plus the names the calling frame had for
its operands.  A cluster maps

- `exact` when every op comes from one call of one function in the analyzed file,
  its lines are whole sibling statements that contain no op outside the cluster, each
  external input has a name at the first line, each escaping output is bound to a
  name (or returned) by those lines, and no other name they assign is read later.
  Only then is a call-site edit offered;
- `pointer` when the ops can be located but the lines cannot simply be replaced (the
  detail says why);
- `unavailable` when no op has a user-code location.

Clusters reached through shared code (a layer class used N times) point at that
class's lines: the innermost frame is the layer's own `forward`.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field

from fuselens.contracts.report import Mapping as MappingQuality
from fuselens.contracts.units import library_path

from .graph import Frame, Graph, Node
from .ops import OpClass


@dataclass
class Mapping:
    quality: MappingQuality
    detail: str
    file: str = ""
    function: str = ""
    lines: tuple[int, int] = (0, 0)
    input_names: list[str | None] = field(default_factory=list)
    output_names: list[str | None] = field(default_factory=list)
    returns: bool = False  # the last statement returns the cluster's (single) output
    indent: str = ""


class SourceIndex:
    """Parsed source of the analyzed file, to reason about statements and names."""

    def __init__(self, path: str, text: str):
        self.path = os.path.abspath(path)
        self.text = text
        self.lines = text.splitlines()
        self.tree = ast.parse(text)
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


def _statement_blocks(fn: ast.AST):
    """Every list of sibling statements inside `fn` (its body, if/for/with bodies, ...)."""
    for node in ast.walk(fn):
        for attr in ("body", "orelse", "finalbody"):
            block = getattr(node, attr, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block
        for handler in getattr(node, "handlers", []) or []:
            yield handler.body


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


def map_cluster(
    graph: Graph,
    compute: list[int],
    members: set[int],
    inputs: list[int],
    outputs: list[int],
    source: SourceIndex | None,
) -> Mapping:
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
    if not place.innermost:
        if len(place.functions) > 1:
            return _with(
                base,
                f"its ops come from several functions ({', '.join(place.functions)}); "
                f"shown where {place.function} calls them",
            )
        return _with(
            base,
            f"its ops come from different calls of {place.functions[0]} (for example two layers); "
            f"shown where {place.function} makes those calls",
        )
    file = place.file
    if source is None or os.path.abspath(file) != source.path:
        return _with(base, f"its code is in {_shown(file)} ({place.function}), not in this file")
    fn = source.function_at(base.lines[0], place.function)
    if fn is None:
        return _with(base, "the function holding it could not be found in the source")
    block = _enclosing_block(fn, base.lines)
    if block is None:
        return _with(base, "its lines are not whole statements of one block")
    statements, start, end = block
    base.lines = (start, end)
    base.indent = _indent(source.line_text(start))
    invocation = place.invocation
    intruder = _intruder(graph, members, inputs, file, invocation, start, end)
    if intruder is not None:
        return _with(base, f"line {intruder.line} also runs `{intruder.op}`, which is not part of the cluster")
    names_in = _input_names(graph, compute, members, inputs)
    if None in names_in:
        missing = inputs[names_in.index(None)]
        return _with(base, f"an input ({_what(graph[missing])}) has no name at line {start}")
    base.input_names = names_in
    stored = _stored_names(statements)
    for name in _named(names_in):
        for root in _names_in(name):
            if root in stored and _assigned_before_use(statements, root):
                return _with(base, f"`{root}` is reassigned before the cluster reads it")
    last = statements[-1]
    if isinstance(last, ast.Return):
        if len(outputs) != 1 or not _returned(graph, outputs[0], last):
            return _with(base, "the returned value is not the cluster's single output")
        base.returns = True
        base.output_names = [None]
    else:
        names_out = _output_names(graph, members, outputs)
        if None in names_out:
            return _with(base, "an output of the cluster is not bound to a name by these lines")
        if any(n not in stored for n in names_out):
            return _with(base, "an output's name is not assigned by these lines")
        base.output_names = names_out
        leftover = stored - set(names_out)
        read_later = _read_after(fn, end, leftover)
        if read_later:
            return _with(base, f"`{sorted(read_later)[0]}` is assigned in these lines and used later")
    if any(isinstance(s, (ast.Return,)) for s in statements[:-1]):
        return _with(base, "a return statement sits inside the lines")
    base.quality = "exact"
    base.detail = "the lines can be replaced by one kernel call"
    return base


def _shown(file: str) -> str:
    """A file as a message names it: a library's from its package down, another of the user's by name."""
    shown = library_path(file)
    return shown if shown != file else os.path.basename(file)


def _with(mapping: Mapping, detail: str) -> Mapping:
    mapping.detail = detail
    return mapping


def _what(node: Node) -> str:
    return (
        f"`{node.name}`" if node.name else f"the result of `{node.op}`" + (f" on line {node.line}" if node.line else "")
    )


def _indent(text: str) -> str:
    return text[: len(text) - len(text.lstrip())]


def _enclosing_block(fn: ast.AST, lines: tuple[int, int]):
    """The sibling statements covering `lines`, extended to whole statements."""
    first, last = lines
    for block in _statement_blocks(fn):
        covering = [s for s in block if s.lineno <= last and (s.end_lineno or s.lineno) >= first]
        if not covering:
            continue
        if covering[0].lineno <= first and (covering[-1].end_lineno or covering[-1].lineno) >= last:
            if any(
                isinstance(s, (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.FunctionDef, ast.ClassDef))
                for s in covering
            ):
                continue  # the ops sit in a nested block; look for that block instead
            return covering, covering[0].lineno, covering[-1].end_lineno or covering[-1].lineno
    return None


def _intruder(
    graph: Graph, members: set[int], inputs: list[int], file: str, invocation: int, start: int, end: int
) -> Node | None:
    for node in graph:
        if node.id in members or node.source is None or node.cls is OpClass.SOURCE:
            continue
        if node.id in inputs and node.cls is OpClass.VIEW and node.expr:
            continue  # an inline view of a named value (`e[:, :, None, None]`): passed as an argument
        if node.cls is OpClass.IDENTITY and node.op in ("dropout", "to_same", "detach", "contiguous", "alias"):
            continue  # moves nothing: replacing its line loses nothing
        src = node.source
        if src.file == file and src.invocation == invocation and start <= src.line <= end:
            return node
    return None


def _input_names(graph: Graph, compute: list[int], members: set[int], inputs: list[int]) -> list[str | None]:
    names: list[str | None] = []
    for value in inputs:
        name = None
        for op in sorted(members):
            node = graph[op]
            if value in node.inputs and value in node.operand_names:
                name = node.operand_names[value]
                break
        if name is None and graph[value].cls is OpClass.VIEW and graph[value].expr:
            name = graph[value].expr
        names.append(name)
    return names


def _named(names: list[str | None]) -> list[str]:
    """`names`, every one of them known: an exact mapping names each input, and each output
    unless its lines end in the `return` that hands back the single one."""
    known = [n for n in names if n is not None]
    if len(known) != len(names):
        raise ValueError(f"an unnamed value among {names}: only an exact mapping names them all")
    return known


def _names_in(expression: str) -> set[str]:
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        return {expression}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def _output_names(graph: Graph, members: set[int], outputs: list[int]) -> list[str | None]:
    names: list[str | None] = []
    for value in outputs:
        name = None
        for user in graph.users(value):
            if user not in members and value in graph[user].operand_names:
                name = graph[user].operand_names[value]
                break
        names.append(name)
    return names


def _returned(graph: Graph, value: int, stmt: ast.Return) -> bool:
    """The output is computed by the return statement itself (its last op is on those lines)."""
    src = graph[value].source
    return src is not None and stmt.lineno <= src.line <= (stmt.end_lineno or stmt.lineno)


def _stored_names(statements: list[ast.stmt]) -> set[str]:
    stored = set()
    for s in statements:
        for node in ast.walk(s):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                stored.add(node.id)
    return stored


def _assigned_before_use(statements: list[ast.stmt], name: str) -> bool:
    """True if `name` is assigned by a statement before the first statement that reads it."""
    for s in statements:
        loads = any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) for n in ast.walk(s))
        if loads:
            return False
        stores = any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(s))
        if stores:
            return True
    return False


def _read_after(fn: ast.AST, line: int, names: set[str]) -> set[str]:
    if not names:
        return set()
    read = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.lineno > line and node.id in names:
            read.add(node.id)
    return read


def replacement(mapping: Mapping, call_name: str, args: list[str]) -> str:
    """The statement that replaces the cluster's lines."""
    call = f"{call_name}({', '.join(args)})"
    if mapping.returns:
        return f"{mapping.indent}return {call}"
    targets = ", ".join(_named(mapping.output_names))
    return f"{mapping.indent}{targets} = {call}"
