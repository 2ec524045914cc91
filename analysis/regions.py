"""Which code one call of a cluster's kernel can replace, and the arguments that call takes.

Every op carries, for each frame of model code, the span of the expression that frame was
evaluating: the op itself in the innermost frame, the call that led to it in its callers
(`rotate_half(q)`, `self.mlp_norm(x)`).  At the cluster's common frame (the innermost call all of
its ops happen inside) those spans pick out, in the function's syntax tree, the expressions the
cluster computes: its *roots*, the largest expressions made of cluster ops only.  Everything else
inside a root is either a constant (the kernel has it), or an *argument*: a name, a parameter
reached through `self`, or a subexpression computed by other ops (`q @ k.transpose(-2, -1)`),
whose text the call passes on.

The rewrite puts one call before the first statement with a root and binds every output of the
cluster to a name; each root is replaced by its output's name (or, for a single root with a single
output, by the call itself, in place).  A root that is the whole right-hand side of an assignment
binds that assignment's names, and the assignment goes; `x = x + attn` followed by
`h = self.mlp_norm(x)` becomes `x, h = cluster4(x, attn, self.mlp_norm.weight)`.

A cluster has no region (and a reason why) when a call at the common frame also runs ops outside
the cluster, an argument would be evaluated earlier than the code it depends on, an output is an
intermediate that the code never names, or the code is not where the trace says it is.
"""

from __future__ import annotations

import ast
import copy
import functools
import linecache
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .graph import Graph, Node
from .module_checks import ModuleCheck, Unreachable, module_checks
from .ops import OpClass

Span = tuple[int, int, int, int]  # (line, col, end line, end col): 1-based lines, UTF-8 byte columns

# Ops whose call never needs to stay outside a kernel's call: they move no data.
_FREE = frozenset({"dropout", "to_same", "detach", "contiguous", "alias"})
# Those that give their operand itself, in any mode and for gradients too.
_THE_SAME = frozenset({"to_same", "contiguous", "alias"})

# Convolutions, whose bias add a cluster can take in; and the modules whose call is only theirs.
_CONVOLUTIONS = frozenset({"conv1d", "conv2d", "conv3d"})
_CONV_MODULES = frozenset(f"torch.nn.modules.conv.Conv{k}d" for k in (1, 2, 3))


class NoRegion(Exception):
    """No code can be replaced by the cluster's call; the message says why, for the user."""


class MixedCall(NoRegion):
    """A call at the cluster's common frame also runs ops outside the cluster: `inside` are the cluster's
    ops that call runs, which may be a cluster of their own, in the called code."""

    def __init__(self, message: str, inside: set[int]):
        super().__init__(message)
        self.inside = inside


@dataclass
class Region:
    """What one call of the kernel replaces: lines `first`..`last` of `file`, inside `function`."""

    file: str
    function: str
    first: int
    last: int
    arguments: list[str]  # the call's arguments, one per cluster input, as source text
    outputs: list[str]  # the names the call's results are bound to, one per output ([] when none is)
    _edits: list[tuple[Span, str]] = field(default_factory=list)  # spans and what replaces them ("{call}")
    # The modules the call must find as they were (`module_checks`), reached from the function's `self`.
    checks: list[ModuleCheck] = field(default_factory=list)
    # The modules the lines make or look up where they call them (`ACT2FN[activation]`): the call asks
    # each expression (the check's `path`) again and checks its class and settings.
    made: list[ModuleCheck] = field(default_factory=list)
    # Where each argument's text stands in the code (an expression of other ops the code computes there,
    # `self.gate_proj(x)`), None for a name, a parameter or a number: the guarded form evaluates such an
    # argument once, for the kernel's call or for the original code (`analysis/guarded.py`).
    argument_spans: list[Span | None] = field(default_factory=list)
    # A convolution whose bias add the cluster takes (its call's span): how the code spells that bias, and
    # the convolution's spatial dims; and the statements binding such a convolution's whole result
    # (statement span, call span, the name bound), which stay, calling it without its bias.
    biases: dict[Span, tuple[str, int]] = field(default_factory=dict)
    unbiased_statements: list[tuple[Span, Span, str]] = field(default_factory=list)
    # The tests of the `if`s such a statement sits in (by its call's span), as asked: where the kernel
    # does not run, its bias goes back only where the convolution ran.
    unbiased_conditions: dict[Span, list[str]] = field(default_factory=dict)
    # The statements before the call that stay (such a convolution's among them), in order: the guarded
    # form runs them ahead of asking the kernels.
    ahead: list[Span] = field(default_factory=list)
    taken: set[str] = field(default_factory=set)  # the names the function uses: new ones must differ
    # The tests of the `if`s the cluster's ops are inside, as asked beside `fits` (the kernel stands for
    # the branch the analyzed call took).
    conditions: list[str] = field(default_factory=list)
    # Whether those tests read what they read where they stand before any of the lines run (nothing
    # run ahead binds a name they read): lines whose kernels need other code ahead can then be chosen by them.
    conditions_first: bool = True

    def rewrite_spans(
        self, name: str, lines: list[str], within: Span, arguments: list[str] | None = None, skip: Sequence[Span] = ()
    ) -> str:
        """The whole lines of span `within` (inside the region) rewritten to call the kernel `name` with
        `arguments` (the region's own by default): the edits inside it, less the statements `skip`."""
        call = f"{name}({', '.join(self.arguments if arguments is None else arguments)})"
        lo, hi = within[0], within[2]
        edits = [(span, text.format(call=call)) for span, text in self._edits if _contains(within, span)]
        edits = [(span, text) for span, text in edits if not any(_contains(s, span) for s in skip)]
        edits += [(span, "") for span in skip if _contains(within, span)]
        chunk: list[bytes | None] = [line.encode() for line in lines[lo - 1 : hi]]
        for span, replacement in sorted(edits, key=lambda e: e[0], reverse=True):
            chunk = _replaced(chunk, lo, span, replacement.encode())
        return "".join(c.decode() + "\n" for c in chunk if c is not None)

    @property
    def in_place(self) -> Span | None:
        """The span of the one expression the call stands in place of, when that is the whole rewrite (one
        line, nothing else dropped or rebound)."""
        if len(self._edits) != 1 or self.first != self.last or self.unbiased_statements:
            return None
        span, text = self._edits[0]
        return span if text == "{call}" and span[0] == span[2] == self.first else None

    def call(self, name: str) -> str:
        return f"{name}({', '.join(self.arguments)})"

    def same_code(self, other: Region) -> bool:
        """Whether `other` replaces the very code this region does (what differs is only its arguments)."""
        return sorted(self._edits) == sorted(other._edits)

    def statement(self, name: str) -> str:
        """The call as it reads in the rewritten code, for display."""
        if not self.outputs:
            return self.call(name)
        return f"{', '.join(self.outputs)} = {self.call(name)}"

    def stands_in_for(self, lines: list[str]) -> str | None:
        """The source text of the one expression the call replaces in place on the region's last line,
        when the rest of the rewrite only drops statements (`F.silu(self.norm1(x))` in
        `h = self.conv1(F.silu(self.norm1(x)))`): another cluster's rewrite of that line can then
        carry this call where it carries that text."""
        on_last = [(span, text) for span, text in self._edits if text and span[2] == self.last]
        if len(on_last) != 1 or on_last[0][1] != "{call}" or on_last[0][0][0] != self.last:
            return None
        return _text(lines, on_last[0][0])

    def rewrite(self, name: str, lines: list[str]) -> str:
        """Lines `first`..`last` (1-based, of `lines`) rewritten to call the kernel `name`."""
        chunk: list[bytes | None] = [line.encode() for line in lines[self.first - 1 : self.last]]
        for span, replacement in sorted(self._edits, key=lambda e: e[0], reverse=True):
            chunk = _replaced(chunk, self.first, span, replacement.format(call=self.call(name)).encode())
        text = [c.decode() for c in chunk if c is not None]  # statements that went leave no line
        return "".join(t + "\n" for t in text)


def find_region(
    graph: Graph,
    compute: list[int],
    members: set[int],
    inputs: list[int],
    outputs: list[int],
    invocation: int,
    function: ast.FunctionDef | ast.AsyncFunctionDef,
    lines: list[str],
    file: str,
    numbers: Sequence[tuple[str, dict[int, str]]] = (),
) -> Region:
    """The code a call of the cluster replaces in `function` (the frame of call `invocation`);
    `numbers`: the numbers of the model's state the kernel takes after its tensors, each as the op's
    call spells it and what each frame calls it (`analysis.scalars`)."""
    spans = _Spans(graph, members, invocation)
    ast_of = _AstIndex.of(function)
    has_self = bool(function.args.args) and function.args.args[0].arg == "self"
    made = _modules_made_at_call(graph, members, invocation, ast_of, lines)
    roots = _roots(spans, ast_of, graph, compute)
    ran = list(spans.of.values())
    placement = _statements(function, roots, lambda root, own: _stays_unbiased(root, own, spans, outputs), ran)
    block, statements = placement.block, placement.statements
    unbiased = {k: _target_of(root, own) for k, (root, own) in enumerate(zip(roots, placement.inner, strict=True))}
    unbiased = {
        k: name
        for k, name in unbiased.items()
        if _stays_unbiased(roots[k], placement.inner[k], spans, outputs)
        and (statements[k] in placement.staying or not isinstance(block[statements[k]], ast.If))
    }
    named = {spans.unbiased[_span(roots[k].node) or (0, 0, 0, 0)]: name for k, name in unbiased.items()}
    placed = [
        (named[v], None) if v in named else _argument(v, roots, spans, members, graph, lines, invocation, has_self)
        for v in inputs
    ]
    _check_one_value_each(placed)
    arguments = [text for text, _ in placed]
    arguments += [_number_argument(text, at, invocation, function) for text, at in numbers]
    rewritten = {k: _without_bias(_span(roots[k].node) or (0, 0, 0, 0), roots, spans, graph, lines) for k in unbiased}
    region = _rewrite(graph, roots, outputs, placement, arguments, function, lines, file, rewritten, spans)
    region.argument_spans = [span for _, span in placed] + [None] * len(numbers)
    region.biases = {span: _bias(span, roots, spans, graph, lines) for span in spans.unbiased}
    region.unbiased_statements = [
        (_span(placement.inner[k]) or (0, 0, 0, 0), _span(roots[k].node) or (0, 0, 0, 0), name)
        for k, name in unbiased.items()
    ]
    region.unbiased_conditions = {
        _span(roots[k].node) or (0, 0, 0, 0): [_condition(test, taken, lines) for test, taken in placement.paths[k]]
        for k in unbiased
    }
    texts = [at[invocation] for _, at in numbers if invocation in at]
    code = [_span(root.node) or (0, 0, 0, 0) for root in roots]
    leaves = [_span(leaf) or (0, 0, 0, 0) for root in roots for leaf in root.leaves]
    try:
        region.checks = module_checks(
            graph, invocation, spans.owner, code, leaves, has_self, spans.skipped, texts, spans.moded
        )
    except Unreachable as exc:
        raise NoRegion(str(exc)) from exc
    region.made = made
    return region


def _stays_unbiased(root: _Root, own: ast.stmt, spans: _Spans, outputs: list[int]) -> bool:
    """Whether the root is a convolution's whole call bound to a name (`h = self.conv1(h)`, its own
    statement `own`) whose bias add the cluster takes: that statement stays, calling the convolution
    without its bias, and the kernel's call reads the name."""
    return _span(root.node) in spans.unbiased and bool(_target_of(root, own)) and root.value not in outputs


# ---- spans at the common frame ---------------------------------------------------------------


class _Spans:
    """For each op that ran inside call `invocation`: the span there of the expression leading to it."""

    def __init__(self, graph: Graph, members: set[int], invocation: int):
        self.of: dict[int, Span] = {}
        self.skipped: set[str] = set()  # modules whose call the kernel's call leaves out (an `nn.Identity`)
        self.moded: set[str] = set()  # those it leaves out in eval mode only (a dropout): "" for `self`
        self.cluster: dict[Span, list[int]] = {}
        self.foreign: dict[Span, list[int]] = {}
        in_call = graph.in_call(invocation)
        # The module path of the frame's `self`.
        self.owner = in_call[0][0].stack[in_call[0][1]].owner if in_call else ""
        # Each time the function evaluates an expression (a loop evaluates it once an iteration), its ops
        # run one after another: the ops of one evaluation, by span, are those of the cluster's.
        evaluation: dict[int, tuple[Span, int]] = {}
        count: dict[Span, int] = {}
        previous: Span | None = None
        for node, depth in in_call:
            frame = node.stack[depth]
            if node.cls is OpClass.SOURCE and node.op in ("param", "buffer", "const", "input"):
                continue
            if frame.col < 0:
                raise NoRegion(f"the trace has no column positions for line {frame.line}")
            if frame.span != previous:
                count[frame.span] = count.get(frame.span, -1) + 1
                previous = frame.span
            evaluation[node.id] = (frame.span, count[frame.span])
            self.of[node.id] = frame.span
            side = self.cluster if node.id in members else self.foreign
            side.setdefault(frame.span, []).append(node.id)
        ours = {evaluation[m] for m in members if m in evaluation}
        # A convolution's call whose bias add is the cluster's (`self.conv1(h)` feeding a norm): the
        # call stays, as the convolution without its bias, passed to the kernel's call.
        self.unbiased: dict[Span, int] = {}
        for span in self.cluster:
            others = [i for i in self.foreign.get(span, []) if not _free(graph[i]) and evaluation[i] in ours]
            if len(others) == 1 and _bias_left_to(graph, others[0], members):
                self.unbiased[span] = others[0]
            elif others:
                op = graph[others[0]]
                raise MixedCall(
                    f"the call on line {span[0]} also runs `{op.op}`, which is not part of the cluster",
                    set(self.cluster[span]),
                )


def _modules_made_at_call(
    graph: Graph, members: set[int], invocation: int, ast_of: _AstIndex, lines: list[str]
) -> list[ModuleCheck]:
    """The modules the cluster's ops ran in that are none of the model's, called through an expression
    that makes or looks one up at the call (`ACT2FN[activation](x)`, `nn.SiLU()(x)`): the call asks the
    expression again and checks what it gives is of the class and settings the kernel was made for (the
    check's `path` is the expression).  One reached by a name (a module a library makes once, where it
    defines a function) is that object each time, and its code is checked; an expression that may do
    more than look one up or make one is refused."""
    made: dict[str, ModuleCheck] = {}
    for m in sorted(members):
        node = graph[m]
        frame = next((f for f in node.stack if f.invocation == invocation), None)
        if not node.stray_module or node.stray_check is None or frame is None:
            continue
        call = ast_of.by_span.get(frame.span)
        if not isinstance(call, ast.Call):
            continue  # the op itself: the module was entered before the lines were (it calls them)
        if _reference(call.func):
            continue
        if not _looked_up(call.func):
            raise NoRegion(
                f"it runs a `{node.stray_module}` made where line {frame.line} calls it, not one of the model's "
                "modules, by an expression that may do more than make it: no check can ask it again"
            )
        text = _text(lines, _span(call.func) or frame.span)
        identity, settings = node.stray_check
        check = made.setdefault(text, ModuleCheck(text, identity, settings, None))
        if (check.type_name, check.settings) != (identity, settings):
            raise NoRegion(f"`{text}` gives modules set up otherwise in the analyzed call itself")
    return list(made.values())


def _reference(expr: ast.expr) -> bool:
    """A name, or an attribute path from one (`rotate`, `self.act`, `layers.gelu`)."""
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return isinstance(expr, ast.Name)


def _looked_up(expr: ast.expr) -> bool:
    """An expression that only looks a module up or makes one, safe to ask again: `ACT2FN[activation]`,
    `nn.SiLU()`, `nn.GELU(approximate="tanh")`."""
    if isinstance(expr, ast.Subscript):
        key = expr.slice
        return _reference(expr.value) and (isinstance(key, ast.Constant) or _reference(key))
    if isinstance(expr, ast.Call):  # a class by name, or as looked up (`ACTIVATIONS[kind]()`)
        arguments = [*expr.args, *(k.value for k in expr.keywords)]
        made_by = _reference(expr.func) or (isinstance(expr.func, ast.Subscript) and _looked_up(expr.func))
        return made_by and all(isinstance(a, ast.Constant) for a in arguments)
    return False


def _free(node: Node) -> bool:
    return node.cls is OpClass.IDENTITY and node.op in _FREE


def _bias_left_to(graph: Graph, node_id: int, members: set[int]) -> bool:
    """A convolution (recorded without its bias) whose result only the cluster reads: its bias add."""
    return graph[node_id].op in _CONVOLUTIONS and set(graph.users(node_id)) <= members


class _AstIndex:
    """The function's expressions and statements, by span; the names it binds or reads (arguments
    included), and its statements, in `ast.walk`'s order.  Read only once made."""

    def __init__(self, function: ast.AST):
        self.by_span: dict[Span, ast.AST] = {}
        self.parent: dict[ast.AST, ast.AST] = {}
        self.names: frozenset[str] = frozenset()
        self.statements: list[ast.stmt] = []
        names: set[str] = set()
        for node in ast.walk(function):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
            span = _span(node)
            if span is not None and (isinstance(node, ast.expr) or span not in self.by_span):
                self.by_span[span] = node  # an expression wins over the statement of the same span
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.stmt):
                self.statements.append(node)
        self.names = frozenset(names)

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def of(function: ast.AST) -> _AstIndex:
        """The index of `function`, made once for all the clusters whose code it holds (each of a
        model's repeated layers has one there).  The cache holds the function, so its key stays its."""
        return _AstIndex(function)

    def inside(self, outer: ast.AST, inner: Span) -> bool:
        span = _span(outer)
        return span is not None and _contains(span, inner)


def _span(node: ast.AST) -> Span | None:
    if not hasattr(node, "lineno") or getattr(node, "end_lineno", None) is None:
        return None
    return node.lineno, node.col_offset, node.end_lineno, node.end_col_offset  # type: ignore[attr-defined]


def _contains(outer: Span, inner: Span) -> bool:
    return (outer[0], outer[1]) <= (inner[0], inner[1]) and (inner[2], inner[3]) <= (outer[2], outer[3])


# ---- roots -----------------------------------------------------------------------------------


@dataclass
class _Root:
    node: ast.AST  # the expression (or an augmented assignment's statement)
    value: int  # the graph node whose value it computes
    leaves: list[ast.AST]  # its parts computed outside the cluster, or not tensors at all
    dropouts: list[ast.AST]  # the leaves that are dropouts of a plain name (`self.drop(h)`), kept in the call


def _roots(spans: _Spans, ast_of: _AstIndex, graph: Graph, compute: list[int]) -> list[_Root]:
    """The largest expressions made of cluster ops only, in source order."""
    nodes: dict[ast.AST, int] = {}
    for span, ids in spans.cluster.items():
        expr = ast_of.by_span.get(span)
        if expr is None:
            raise NoRegion(f"no expression of the source matches what line {span[0]} ran")
        nodes[expr] = max(ids)  # the last op of a call is the value the call returns
    if not any(n in spans.of for n in compute):
        raise NoRegion("none of its ops ran in that function")
    outermost = [n for n in nodes if not any(n is not o and ast_of.inside(o, _span(n) or (0, 0, 0, 0)) for o in nodes)]
    roots = []
    for node in sorted(outermost, key=lambda n: _span(n) or (0, 0, 0, 0)):
        leaves = _leaves(node, nodes, spans, ast_of, graph)
        dropouts = [leaf for leaf in leaves if _drops_in_training(leaf, spans, graph)]
        roots.append(_Root(node, nodes[node], leaves, dropouts))
    return roots


def _leaves(
    node: ast.AST, cluster: dict[ast.AST, int], spans: _Spans, ast_of: _AstIndex, graph: Graph
) -> list[ast.AST]:
    """The parts of a root that are not cluster ops: names, constants, and subexpressions of other ops."""
    if _span(node) in spans.unbiased:
        return [node]  # the convolution's call, passed on without its bias
    leaves: list[ast.AST] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.keyword):
            child = child.value
        elif not isinstance(child, ast.expr):
            continue  # operators, contexts
        # A method of a computed value (`torch.cumsum(m, 1).type_as(m)`): its receiver is the part
        # (where it computes something: a cast to the dtype a value has is passed as that value).
        receiver = child.value if isinstance(child, ast.Attribute) else None
        if isinstance(node, ast.Call) and child is node.func and receiver is not None and not _reference(receiver):
            ran = spans.foreign.get(_span(receiver) or (0, 0, 0, 0), [])
            if not ran or not all(graph[i].op in _THE_SAME for i in ran):
                child = receiver
        leaves += _part_leaves(child, cluster, spans, ast_of, graph)
    return leaves


def _part_leaves(
    part: ast.expr, cluster: dict[ast.AST, int], spans: _Spans, ast_of: _AstIndex, graph: Graph
) -> list[ast.AST]:
    if part in cluster:
        return _leaves(part, cluster, spans, ast_of, graph)
    wraps_cluster_ops = any(ast_of.inside(part, _span(k) or (0, 0, 0, 0)) for k in cluster)
    module = _module_called_without_ops(part, spans, graph)
    drops = _drops_in_training(part, spans, graph)
    if drops and not wraps_cluster_ops and _wrapped_name(part) is not None:
        return [part]  # `self.drop(h)`: the call runs before the kernel's, in training too, and passes its result
    if drops and wraps_cluster_ops and isinstance(part, ast.Call) and part.args:
        # In eval mode it returned its input: the kernel stands for it there, and in training (where it
        # drops) the call runs the lines as written (the mode is checked on the module, or on `self`
        # for `F.dropout(h, p, self.training)`).
        where = f"`{ast.unparse(part)}` (line {getattr(part, 'lineno', 0)})"
        if module is not None:
            spans.moded.add(module[len(spans.owner) + 1 :] if spans.owner else module)
        elif _reads_self_training(part):
            spans.moded.add("")
        else:
            raise NoRegion(f"{where} ran no op here, but may drop in training, and nothing here says when")
        return _part_leaves(part.args[0], cluster, spans, ast_of, graph)
    if drops:
        where = f"`{ast.unparse(part)}` (line {getattr(part, 'lineno', 0)})"
        raise NoRegion(f"{where} ran no op here, but drops in training: the kernel's call would skip it")
    if not wraps_cluster_ops:
        return [part]
    if module is not None:  # `self.drop_path(...)` where it is an nn.Identity: the value itself
        assert isinstance(part, ast.Call)
        spans.skipped.add(module[len(spans.owner) + 1 :] if spans.owner else module)
        return _part_leaves(part.args[0], cluster, spans, ast_of, graph)
    # Syntax around cluster ops that runs no op: a tuple, a method looked up (`h.pow(2).mean`).
    if not isinstance(part, (ast.Tuple, ast.List, ast.Starred, ast.Slice, ast.Attribute)):
        where = f"`{ast.unparse(part)}` (line {getattr(part, 'lineno', 0)})"
        raise NoRegion(f"{where} wraps the cluster's ops in code outside it")
    return _leaves(part, cluster, spans, ast_of, graph)


def _reads_self_training(call: ast.Call) -> bool:
    """Whether a functional dropout's mode is `self.training` (`F.dropout(h, 0.1, self.training)`)."""
    mode = call.args[2] if len(call.args) > 2 else next((k.value for k in call.keywords if k.arg == "training"), None)
    return isinstance(mode, ast.Attribute) and mode.attr == "training" and _self_path(mode.value) == ""


def _drops_in_training(part: ast.AST, spans: _Spans, graph: Graph) -> bool:
    """A call that ran no op here but may drop in training: a dropout module, a `DropPath`, `F.dropout`."""
    if not isinstance(part, ast.expr):
        return False
    module = _module_called_without_ops(part, spans, graph)
    return (module is not None and module not in graph.passthrough) or _dropout_called_without_ops(part, spans)


def _module_called_without_ops(part: ast.expr, spans: _Spans, graph: Graph) -> str | None:
    """The path of the module `part` calls on one value (`self.drop_path(x)`), when that call ran no
    op: an `nn.Identity` returns its input in any mode, but a dropout (or a `DropPath`) that
    returned its input in eval mode drops in training."""
    if not (isinstance(part, ast.Call) and len(part.args) == 1 and not part.keywords):
        return None
    if _span(part) in spans.cluster or _span(part) in spans.foreign:
        return None  # it ran ops
    path = _self_path(part.func)
    if not path:
        return None
    path = f"{spans.owner}.{path}" if spans.owner else path
    return path if path in graph.module_types else None


def _dropout_called_without_ops(part: ast.expr, spans: _Spans) -> bool:
    """`F.dropout(h, 0.1, self.training)` in eval mode: it returned its input."""
    if not isinstance(part, ast.Call) or _span(part) in spans.cluster or _span(part) in spans.foreign:
        return False
    name = part.func.attr if isinstance(part.func, ast.Attribute) else getattr(part.func, "id", "")
    return "dropout" in name


def _wrapped_name(part: ast.AST) -> str | None:
    """`h` for a call that drops in training, `self.drop(h)` or `F.dropout(h, 0.1, self.training)`,
    when what it drops is a plain name."""
    if isinstance(part, ast.Call) and part.args and isinstance(part.args[0], ast.Name):
        return part.args[0].id
    return None


def _self_path(expr: ast.expr) -> str | None:
    """`drop_path` for `self.drop_path`, `blocks.0.drop` for `self.blocks[0].drop`; None when the
    expression is not an attribute path from `self`."""
    if isinstance(expr, ast.Name):
        return "" if expr.id == "self" else None
    if isinstance(expr, ast.Attribute):
        base = _self_path(expr.value)
        return None if base is None else (f"{base}.{expr.attr}" if base else expr.attr)
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant) and isinstance(expr.slice.value, int):
        base = _self_path(expr.value)
        return None if not base else f"{base}.{expr.slice.value}"
    return None


# ---- arguments -------------------------------------------------------------------------------


def _argument(
    value: int,
    roots: list[_Root],
    spans: _Spans,
    members: set[int],
    graph: Graph,
    lines: list[str],
    invocation: int,
    has_self: bool,
) -> tuple[str, Span | None]:
    """The source text the call passes for cluster input `value`, and where that text stands when it is
    an expression of the code: the leaf expression that computes it, the attribute path of a
    parameter, or the name the frame had for it when the cluster's own ops read it (an earlier op may
    have read it under a name rebound since)."""
    node = graph[value]
    span = spans.of.get(value)
    if span is not None and spans.unbiased.get(span) == value:
        return _without_bias(span, roots, spans, graph, lines), span
    if span is not None:
        for root in roots:
            for leaf in root.leaves:
                if _span(leaf) == span:
                    if isinstance(leaf, (*_CONTAINERS, ast.Starred)):
                        raise NoRegion(
                            f"`{_text(lines, span)}` holds several values, where the kernel takes one tensor"
                        )
                    return _text(lines, span), (span if _computes(leaf) else None)
    if node.op in ("param", "buffer"):
        path = _attribute_path(node, graph, roots, spans, invocation) if has_self else ""
        if path and all(part.isidentifier() for part in path.split(".")):
            return path, None
        # A function of no module (`causal_conv1d_fn(x, weight, bias)`), or a path through a list of
        # layers: the name the frame had for it where any op read it.
        for user in sorted(graph.users(value)):
            name = graph[user].names_at.get(invocation, {}).get(value)
            if name is not None:
                return name, None
        raise NoRegion(f"`{node.name}` is not reachable from the code to replace")
    for member in sorted(set(graph.users(value)) & members):
        name = graph[member].names_at.get(invocation, {}).get(value)
        if name is not None:
            return _through_dropout(name, roots, lines)
    if span is not None and node.op in _THE_SAME and node.inputs:
        # A cast to the dtype it already has (`x.to(torch.float32)` of a float32 `x`), a `contiguous()` of a
        # contiguous tensor: the kernel takes the operand, which its `fits` holds to the analyzed dtype,
        # where the cast changes nothing (and the kernel reads any strides).
        operand = node.inputs[0]
        name = node.names_at.get(invocation, {}).get(operand)
        if name is not None:
            return name, None
        return _argument(operand, roots, spans, members | {value}, graph, lines, invocation, has_self)
    if span is not None and node.cls is OpClass.VIEW and not set(node.inputs) & members:
        # A view of a value from outside the cluster, inside the cluster's expression
        # (`timesteps[:, None].float()`): the call passes the view's own text (`e[:, :, None]`).
        inside = [root for root in roots if _contains(_span(root.node) or (0, 0, 0, 0), span)]
        expr = next((n for root in inside for n in ast.walk(root.node) if _span(n) == span), None)
        if isinstance(expr, ast.expr) and not _computes(expr):
            return _text(lines, span), None
    if span is not None:
        raise NoRegion(f"an input (`{node.op}` on line {span[0]}) is computed in the middle of the code to replace")
    raise NoRegion(f"an input ({_what(node)}) has no name in the code to replace")


def _check_one_value_each(placed: list[tuple[str, Span | None]]) -> None:
    """Each input of the kernel is one expression of the code: one that makes several of them (a list
    comprehension of slices, which a `cat` takes) cannot be passed for each."""
    spans = [span for _, span in placed if span is not None]
    for text, span in placed:
        if span is not None and spans.count(span) > 1:
            raise NoRegion(f"`{text}` makes several of the kernel's inputs at once: no call can pass each of them")


_CONTAINERS = (ast.List, ast.Tuple, ast.Set, ast.Dict, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _computes(expr: ast.AST) -> bool:
    """Whether evaluating `expr` does work worth doing once: a call or an operator, not a name, an
    attribute, a constant or a subscript of them (`self.norm.weight`, `e[:, :, None]`)."""
    return any(
        isinstance(n, (ast.Call, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.NamedExpr))
        for n in ast.walk(expr)
    )


def _through_dropout(name: str, roots: list[_Root], lines: list[str]) -> tuple[str, Span | None]:
    """`self.drop(h)` for input `h` when the replaced code reads it only through that dropout, which
    returned it unchanged in eval mode: the call passes the dropout's result, so it drops in training
    (and its span, where the code calls it)."""
    dropped = [(root, leaf) for root in roots for leaf in root.dropouts if _wrapped_name(leaf) == name]
    if not dropped:
        return name, None
    places = sorted({_span(leaf) or (0, 0, 0, 0) for _, leaf in dropped})
    texts = sorted({_text(lines, span) for span in places})
    # A later statement may rebind the name; within one expression it is one value.
    bare = any(isinstance(leaf, ast.Name) and leaf.id == name for root, _ in dropped for leaf in root.leaves)
    if bare or len(texts) > 1:
        raise NoRegion(f"`{name}` is read through `{texts[0]}` and also otherwise: one kernel input cannot be both")
    return texts[0], places[0] if len(places) == 1 else None


def _without_bias(span: Span, roots: list[_Root], spans: _Spans, graph: Graph, lines: list[str]) -> str:
    """The convolution's call at `span` rewritten to leave out its bias, which the kernel adds:
    `self.conv1(h)` becomes `self.conv1._conv_forward(h, self.conv1.weight, None)` (what an
    `nn.Conv2d` runs, padding mode included), `F.conv2d(h, w, b, padding=1)` passes `None` for `b`."""
    call = next(n for r in roots for n in ast.walk(r.node) if isinstance(n, ast.Call) and _span(n) == span)
    where = f"`{ast.unparse(call)}` (line {call.lineno})"
    path = _self_path(call.func)
    if path:
        module = f"{spans.owner}.{path}" if spans.owner else path
        if graph.module_types.get(module) not in _CONV_MODULES or len(call.args) != 1 or call.keywords:
            kind = graph.module_types.get(module, "module").rsplit(".", 1)[-1]
            raise NoRegion(f"{where} adds its bias in the cluster, but a `{kind}`'s call cannot be made without it")
        conv, arg = _text(lines, _span(call.func) or span), _text(lines, _span(call.args[0]) or span)
        return f"{conv}._conv_forward({arg}, {conv}.weight, None)"
    unbiased = copy.deepcopy(call)
    if len(unbiased.args) > 2:
        unbiased.args[2] = ast.Constant(None)
    else:
        for keyword in unbiased.keywords:
            if keyword.arg == "bias":
                keyword.value = ast.Constant(None)
    if ast.dump(unbiased) == ast.dump(call):
        raise NoRegion(f"{where} adds its bias in the cluster, but its bias argument is not spelled out")
    return ast.unparse(unbiased)


def _bias(span: Span, roots: list[_Root], spans: _Spans, graph: Graph, lines: list[str]) -> tuple[str, int]:
    """How the code spells the bias of the convolution called at `span` (`self.conv1.bias`, or the
    functional call's bias argument), and the convolution's spatial dims."""
    call = next((n for r in roots for n in ast.walk(r.node) if isinstance(n, ast.Call) and _span(n) == span), None)
    spatial = int(graph[spans.unbiased[span]].op[4])  # conv1d, conv2d, conv3d
    if call is None:
        return "", spatial
    path = _self_path(call.func)
    if path:
        return f"{_text(lines, _span(call.func) or span)}.bias", spatial
    if len(call.args) > 2:
        return _text(lines, _span(call.args[2]) or span), spatial
    bias = next((k.value for k in call.keywords if k.arg == "bias"), None)
    return (_text(lines, _span(bias) or span) if bias is not None else ""), spatial


def _number_argument(text: str, at: dict[int, str], invocation: int, function: ast.AST) -> str:
    """What the code to replace calls a number of the model's state that an op inside it takes."""
    spelled = at.get(invocation)
    if spelled is None:
        where = getattr(function, "name", "the function")
        raise NoRegion(f"`{text}` is computed in code that `{where}` calls, so its kernel call cannot pass it")
    return spelled


def _attribute_path(param: Node, graph: Graph, roots: list[_Root], spans: _Spans, invocation: int) -> str:
    """`self.mlp_norm.weight` for a parameter reached from the frame whose `self` is a parent module."""
    in_call = graph.in_call(invocation)
    if not in_call:
        raise NoRegion(f"`{param.name}` is not reachable from the code to replace")
    owner = in_call[0][0].stack[in_call[0][1]].owner
    prefix = owner + "." if owner else ""
    own = next((name for name in graph.names_of(param.name) if name.startswith(prefix)), None)
    if own is None:
        raise NoRegion(f"`{param.name}` is not an attribute of the module whose code is replaced")
    return "self." + own[len(prefix) :]


def _what(node: Node) -> str:
    return f"`{node.name}`" if node.name else f"the result of `{node.op}`"


def _text(lines: list[str], span: Span) -> str:
    line, col, end_line, end_col = span
    chunk = [text.encode() for text in lines[line - 1 : end_line]]
    if len(chunk) == 1:
        return chunk[0][col:end_col].decode()
    parts = [chunk[0][col:], *chunk[1:-1], chunk[-1][:end_col]]
    return " ".join(p.decode().strip() for p in parts)


# ---- statements ------------------------------------------------------------------------------


@dataclass
class _Placement:
    """Where the roots are: the block of sibling statements holding every root, the index in it of
    each root's statement, each root's own statement (the block's, or one inside an `if` of the block),
    and the tests of those `if`s with the branch the roots are in (True: its body)."""

    block: list[ast.stmt]
    statements: list[int]
    inner: list[ast.stmt]
    conditions: list[tuple[ast.expr, bool]] = field(default_factory=list)
    paths: list[list[tuple[ast.expr, bool]]] = field(default_factory=list)  # each root's `if`s
    staying: set[int] = field(default_factory=set)  # the `if`s (block indices) that stay whole
    # The bodies of `if`s without an `else` beside the roots in their branches that ran no op: where
    # their tests fail they run nothing, so the kernel asks that (in `conditions`) and they go with it.
    untaken: list[Span | None] = field(default_factory=list)


def _statements(
    function: ast.AST, roots: list[_Root], stays: Callable[[_Root, ast.stmt], bool], ran: list[Span]
) -> _Placement:
    """Where the roots are (`_Placement`): in one block of statements, or inside `if`s of one block,
    each on the branch the analyzed call took.  `stays(root, own statement)`: whether the root's
    statement stays where it is (a convolution run without its bias), so that an `if` holding only
    such roots may hold other code too: that `if` stays whole."""
    nested = []
    for block in _blocks(function):
        found = [next((i for i, s in enumerate(block) if _within(root.node, s)), None) for root in roots]
        if any(i is None for i in found):
            continue
        indices = [i for i in found if i is not None]
        if not any(isinstance(block[i], _COMPOUND) for i in indices):
            return _Placement(block, indices, [block[i] for i in indices], [], [[] for _ in indices])
        nested.append((block, indices))
    if not nested:
        raise NoRegion("its code is not in one block of statements")
    # Blocks holding every root nest in one another, outer first: the innermost holds them most closely.
    block, indices = nested[-1]
    inner: list[ast.stmt] = []
    paths: list[list[tuple[ast.expr, bool]]] = []
    conditions: list[tuple[ast.expr, bool]] = []
    for root, i in zip(roots, indices, strict=True):
        statement, path = _inside_ifs(block[i], root)
        inner.append(statement)
        paths.append(path)
        conditions += [c for c in path if not any(c[0] is d[0] for d in conditions)]
    staying = {i for i in indices if _only_staying(block[i], roots, indices, inner, stays)}
    idle = _check_branches_hold_only_roots(block, [i for i in indices if i not in staying], inner, ran)
    conditions += [(statement.test, False) for statement in idle]
    untaken = [_span(s) for statement in idle for s in statement.body]
    return _Placement(block, indices, inner, conditions, paths, staying, untaken)


def _only_staying(
    statement: ast.stmt,
    roots: list[_Root],
    indices: list[int],
    inner: list[ast.stmt],
    stays: Callable[[_Root, ast.stmt], bool],
) -> bool:
    """Whether `statement` is an `if` whose roots all stay where they are (`_statements`)."""
    held = [k for k, i in enumerate(indices) if _within(roots[k].node, statement)]
    return isinstance(statement, ast.If) and all(stays(roots[k], inner[k]) for k in held)


_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.Match)


def _inside_ifs(statement: ast.stmt, root: _Root) -> tuple[ast.stmt, list[tuple[ast.expr, bool]]]:
    """The root's own statement inside `statement`, and the tests of the `if`s around it with the branch
    it is in; loops, `with`s and `try`s around it are refused: a call ahead of them would change when
    (or in which context) the cluster's ops run."""
    path: list[tuple[ast.expr, bool]] = []
    while isinstance(statement, _COMPOUND):
        if not isinstance(statement, ast.If):
            kind = type(statement).__name__.lower().removeprefix("async")
            raise NoRegion(f"its code is inside a `{kind}` statement (line {statement.lineno})")
        branch = statement.body if any(_within(root.node, s) for s in statement.body) else statement.orelse
        path.append((statement.test, branch is statement.body))
        found = next((s for s in branch if _within(root.node, s)), None)
        if found is None:
            raise NoRegion(f"its code is in the test of the `if` on line {statement.lineno}")
        statement = found
    return statement, path


def _check_branches_hold_only_roots(
    block: list[ast.stmt], indices: list[int], inner: list[ast.stmt], ran: list[Span]
) -> list[ast.If]:
    """Each `if` branch the roots are in holds nothing else: where the kernel runs, the whole `if` goes.
    Nothing but an `if` without an `else` whose body ran no op (`if temb is not None:` where there was
    none), returned: the kernel stands for the call where its test fails."""
    own = {id(s) for s in inner}
    idle: list[ast.If] = []

    def check(statement: ast.stmt) -> None:
        if id(statement) in own or not isinstance(statement, ast.If):
            return
        holds = any(_within(r, s) for r in inner for s in statement.body)
        for s in statement.body if holds else statement.orelse:
            if isinstance(s, ast.If) and not s.orelse and not any(_within(r, s) for r in inner) and not _ran_in(s, ran):
                idle.append(s)
                continue
            if id(s) not in own and not (isinstance(s, ast.If) and any(_within(r, s) for r in inner)):
                raise NoRegion(f"line {s.lineno} runs code outside the cluster in the `if` on line {statement.lineno}")
            check(s)

    for i in set(indices):
        check(block[i])
    return idle


def _ran_in(statement: ast.If, ran: list[Span]) -> bool:
    """Whether any op ran in the body of `statement`."""
    body = (statement.body[0].lineno, 0, statement.end_lineno or statement.lineno, 1 << 30)
    return any(_contains(body, span) for span in ran)


def _untaken_branches(block: list[ast.stmt], indices: list[int], inner: list[ast.stmt]) -> list[Span | None]:
    """The statements of the branches of the roots' `if`s that the roots are not in."""
    spans: list[Span | None] = []
    pending = [block[i] for i in set(indices)]
    while pending:
        statement = pending.pop()
        if not isinstance(statement, ast.If) or any(statement is s for s in inner):
            continue
        holds = any(_within(r, s) for r in inner for s in statement.body)
        taken, other = (statement.body, statement.orelse) if holds else (statement.orelse, statement.body)
        spans += [_span(s) for s in other]
        pending += taken
    return spans


def _blocks(function: ast.AST):
    """Every list of sibling statements inside `function` (its body, if/for/with/try bodies, handlers)."""
    for node in ast.walk(function):
        for attr in ("body", "orelse", "finalbody"):
            block = getattr(node, attr, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block
        for handler in getattr(node, "handlers", []) or []:
            yield handler.body


def _within(node: ast.AST, statement: ast.stmt) -> bool:
    inner, outer = _span(node), _span(statement)
    return inner is not None and outer is not None and _contains(outer, inner)


def _stored(statement: ast.stmt) -> set[str]:
    return {n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _target_of(root: _Root, statement: ast.stmt) -> str:
    """The name `statement` binds to `root`'s value, when the root is its whole right-hand side."""
    if isinstance(statement, ast.Assign) and statement.value is root.node and len(statement.targets) == 1:
        target = statement.targets[0]
        return target.id if isinstance(target, ast.Name) else ""
    if isinstance(statement, ast.AnnAssign) and statement.value is root.node and isinstance(statement.target, ast.Name):
        return statement.target.id
    if _updated_in_place(root, statement):  # `x += r`: the name updated holds the root's value
        return _updated_in_place(root, statement) or ""
    return ""


# ---- the rewrite -----------------------------------------------------------------------------


@dataclass
class _Rewrite:
    """How the block changes: the call runs at statement `call_at`; statements in `gone` (index →
    the name each bound) are replaced by it; `edits` say what replaces which span."""

    block: list[ast.stmt]
    roots: list[_Root]
    statements: list[int]  # the block index of each root's statement
    call_at: int
    inner: list[ast.stmt] = field(default_factory=list)  # each root's own statement (in an `if`, or the block's)
    # The branches of those `if`s the analyzed call did not take: where the kernel runs, they do not.
    untaken: list[Span | None] = field(default_factory=list)
    gone: dict[int, str] = field(default_factory=dict)
    idle: set[int] = field(default_factory=set)  # `if`s that go as their body ran nothing (`_ifs_not_taken`)
    unbiased: set[int] = field(default_factory=set)  # statements that stay, calling a convolution without its bias
    bound_late: dict[str, int] = field(default_factory=dict)  # an output name the call binds → where it was bound
    edits: list[tuple[Span, str]] = field(default_factory=list)

    def kept(self, lo: int, hi: int) -> list[ast.stmt]:
        """The statements with index in [lo, hi) that stay."""
        return [self.block[j] for j in range(lo, hi) if j not in self.gone]

    def own(self, root: _Root) -> ast.stmt:
        """The root's own statement."""
        return self.inner[next(k for k, r in enumerate(self.roots) if r is root)]


def _rewrite(
    graph: Graph,
    roots: list[_Root],
    outputs: list[int],
    placement: _Placement,
    arguments: list[str],
    function: ast.AST,
    lines: list[str],
    file: str,
    unbiased: dict[int, str],
    spans: _Spans,
) -> Region:
    """`unbiased`: the roots whose statement stays, rewritten (root index -> the text of the root)."""
    block, statements = placement.block, placement.statements
    placed = {root.value: (root, i) for root, i in zip(roots, statements, strict=True)}
    for value in outputs:
        if value not in placed:
            raise NoRegion(f"a value the cluster computes inside line {graph[value].line or 0} is used elsewhere too")
    plan = _Rewrite(block, roots, statements, min(placed[v][1] for v in outputs), placement.inner)
    plan.untaken = _untaken_branches(block, [i for i in statements if i not in placement.staying], placement.inner)
    plan.untaken += placement.untaken
    for k, text in unbiased.items():
        root, i = roots[k], statements[k]
        plan.edits.append((_span(root.node) or (0, 0, 0, 0), text.replace("{", "{{").replace("}", "}}")))
        plan.unbiased.add(i)
        name = _target_of(root, placement.inner[k])
        if _read_later(block, i, name, [_span(r.node) for r in roots] + plan.untaken, function):
            raise NoRegion(f"`{name}` is assigned on line {block[i].lineno} and used outside the cluster")
    for k, (root, i) in enumerate(zip(roots, statements, strict=True)):
        if k in unbiased:
            continue
        if isinstance(block[i], ast.If):
            plan.gone[i] = _target_of(root, plan.inner[k]) or plan.gone.get(i, "")  # the whole `if` goes
            if not plan.gone[i]:
                raise NoRegion(f"a value the cluster computes on line {plan.inner[k].lineno} is not named")
        elif root.value not in outputs:
            name = _target_of(root, block[i])
            if not name:
                raise NoRegion(f"an intermediate value on line {block[i].lineno} is not named")
            plan.gone[i] = name
    conditions = placement.conditions + _ifs_not_taken(plan, spans)
    if len(outputs) == 1:
        names = _call_in_place(plan, placed[outputs[0]])
    else:
        names = _call_binding(plan, [placed[v] for v in outputs], function, lines)
    _check_reads_at_call(plan)
    _check_late_bindings(plan)
    _check_dropped_names(plan, outputs, function)
    ahead = _statements_ahead(plan)
    _check_conditions_ahead(plan, conditions)
    first, last = block[min(statements)], block[max(statements)]
    region = Region(
        file, getattr(function, "name", ""), first.lineno, last.end_lineno or last.lineno, arguments, names, plan.edits
    )
    region.ahead = ahead
    region.conditions = [_condition(test, taken, lines) for test, taken in conditions]
    read = {n.id for test, _ in conditions for n in ast.walk(test) if isinstance(n, ast.Name)}
    bound = set().union(*(_stored(s) for s in plan.kept(min(statements), plan.call_at)))
    region.conditions_first = not (read & bound)
    region.taken = set(_AstIndex.of(function).names)
    return region


def _call_in_place(plan: _Rewrite, output: tuple[_Root, int]) -> list[str]:
    """One output: the call stands where the expression computing it stood (`x = cluster0(x)`,
    `return cluster2(x)`), and the statements naming intermediates go."""
    root, i = output
    if any(j > i for j in plan.statements):
        raise NoRegion(f"code after line {plan.block[i].lineno} feeds the cluster's result")
    statement = plan.block[i]
    if isinstance(statement, ast.If):  # the `if` that computes it goes whole: the call binds its name
        name = plan.gone[i]
        plan.edits.append((_span(statement) or (0, 0, 0, 0), f"{name} = {{call}}"))
        plan.edits += [(_span(plan.block[j]) or (0, 0, 0, 0), "") for j in plan.gone if j != i]
        return [name]
    updated = _updated_in_place(root, statement)
    if updated is not None:  # `x /= s`: the kernel's result is a new tensor, bound to the name updated
        plan.edits.append((_span(statement) or (0, 0, 0, 0), f"{updated} = {{call}}"))
    else:
        plan.edits.append((_span(root.node) or (0, 0, 0, 0), "{call}"))
    plan.edits += [(_span(plan.block[j]) or (0, 0, 0, 0), "") for j in plan.gone]
    name = updated or _target_of(root, statement)
    return [name] if name else []


def _updated_in_place(root: _Root, statement: ast.stmt) -> str | None:
    """The name an augmented assignment (`x /= s`) whose update is the root updates in place."""
    if not isinstance(statement, ast.AugAssign):
        return None
    if root.node is not statement and _span(root.node) != _span(statement):
        return None
    if not isinstance(statement.target, ast.Name):
        raise NoRegion(f"line {statement.lineno} updates `{ast.unparse(statement.target)}` in place")
    return statement.target.id


def _call_binding(plan: _Rewrite, outputs: list[tuple[_Root, int]], function: ast.AST, lines: list[str]) -> list[str]:
    """Several outputs: one statement binds them all where the first is computed
    (`x, h = cluster4(...)`); an output that was a whole right-hand side binds that name (and its
    statement goes), any other is bound to a fresh name that stands where the expression stood."""
    taken = set(_AstIndex.of(function).names)
    names: list[str] = []
    for k, (root, i) in enumerate(outputs):
        name = _target_of(root, plan.own(root))
        if isinstance(plan.block[i], ast.If) and (not name or name in names):
            raise NoRegion(f"a value the cluster computes inside the `if` on line {plan.block[i].lineno} is not named")
        if name and name not in names:
            plan.gone[i] = name
            if i != plan.call_at:
                plan.bound_late[name] = i
        else:
            name = _fresh(f"fused_{k}", taken)
            taken.add(name)
            plan.edits.append((_span(root.node) or (0, 0, 0, 0), name))
        names.append(name)
    binding = f"{', '.join(names)} = {{call}}"
    at = plan.block[plan.call_at]
    if plan.call_at in plan.gone:
        plan.edits.append((_span(at) or (0, 0, 0, 0), binding))
    else:
        text = lines[at.lineno - 1]
        indent = text[: len(text) - len(text.lstrip())]
        plan.edits.append(((at.lineno, at.col_offset, at.lineno, at.col_offset), f"{binding}\n{indent}"))
    plan.edits += [(_span(plan.block[j]) or (0, 0, 0, 0), "") for j in plan.gone if j != plan.call_at]
    return names


def _check_reads_at_call(plan: _Rewrite) -> None:
    """The call evaluates every root's inputs where it stands: no statement that stays between a
    root and the call may rebind a name the root reads (unless the name is the cluster's own value,
    bound by an earlier root), and no return may sit between the cluster's ops."""
    lo, hi = min(plan.statements), max(plan.statements)
    for statement in plan.kept(lo, hi):
        if isinstance(statement, ast.Return):
            raise NoRegion(f"a return statement (line {statement.lineno}) sits between the cluster's ops")
    for root, i in zip(plan.roots, plan.statements, strict=True):
        if i in plan.unbiased:
            continue  # it runs where it stands
        reads = {n.id for leaf in root.leaves for n in ast.walk(leaf) if isinstance(n, ast.Name)}
        reads -= _internal_names(plan, i, reads)
        between = plan.kept(i + 1, plan.call_at) if i < plan.call_at else plan.kept(plan.call_at, i)
        for statement in between:
            clash = _stored(statement) & reads
            if clash:
                raise NoRegion(
                    f"`{sorted(clash)[0]}` is assigned on line {statement.lineno}, between the cluster's ops"
                )


def _internal_names(plan: _Rewrite, i: int, reads: set[str]) -> set[str]:
    """Names read at statement `i` whose value there is the cluster's own: last bound by a root."""
    internal = set()
    for name in reads:
        for j in range(i - 1, min(plan.statements) - 1, -1):
            if name in _stored(plan.block[j]):
                if j in plan.statements and any(
                    _target_of(r, plan.own(r)) == name
                    for r, k in zip(plan.roots, plan.statements, strict=True)
                    if k == j
                ):
                    internal.add(name)
                break
    return internal


def _statements_ahead(plan: _Rewrite) -> list[Span]:
    """The statements that stay before the call, in order.  The guarded form (`analysis/guarded.py`)
    runs them first, then asks whether the kernel runs, from the inputs its call takes, and else runs
    the rest of the original lines.  That keeps what each computes: the statements that go compute
    only the cluster's own values, which nothing ahead reads (`_check_dropped_names`), nor rebinds
    between them and the call (`_check_reads_at_call`); a convolution that loses its bias to the
    kernel is among them (the call reads its result)."""
    if plan.unbiased and plan.call_at <= max(plan.unbiased):
        raise NoRegion(
            f"the cluster's result is bound on line {plan.block[plan.call_at].lineno}, before a convolution whose "
            "bias the kernel adds: the convolution could not run first"
        )
    lo = min(plan.statements)
    return [_span(statement) or (0, 0, 0, 0) for statement in plan.kept(lo, plan.call_at)]


def _ifs_not_taken(plan: _Rewrite, spans: _Spans) -> list[tuple[ast.expr, bool]]:
    """An `if` without an `else` between the cluster's ops whose body ran no op (T5's norm casts to the
    weight's dtype only for half-precision weights): where its test is false, the body does not run,
    so the rewrite asks for that beside `fits` and leaves the `if` out where the kernel runs.  (Had the
    body run code of no op at all, the test is true and the lines run: nothing is lost.)"""
    ran = list(spans.of.values())
    found = []
    for j in range(min(plan.statements), max(plan.statements) + 1):
        statement = plan.block[j]
        if j in plan.gone or j in plan.unbiased or not isinstance(statement, ast.If) or statement.orelse:
            continue
        if not _ran_in(statement, ran):
            plan.gone[j] = ""
            plan.idle.add(j)
            plan.untaken += [_span(s) for s in statement.body]
            found.append((statement.test, False))
    return found


def _check_conditions_ahead(plan: _Rewrite, conditions: list[tuple[ast.expr, bool]]) -> None:
    """The tests of the `if`s the cluster's ops are inside are asked ahead of the lines, beside the
    kernel's `fits`: each must read there what it read where it stood, so no statement before its `if`
    that goes, nor one that stays but runs ahead of the question from after it, may bind a name it reads."""
    for test, _ in conditions:
        reads = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
        if any(isinstance(n, ast.NamedExpr) for n in ast.walk(test)):
            raise NoRegion(f"the test on line {test.lineno} assigns a name")
        at = next(
            j
            for j in range(len(plan.block))
            if _contains(_span(plan.block[j]) or (0, 0, 0, 0), _span(test) or (0, 0, 0, 0))
        )
        # (an `if` that goes as it ran nothing binds nothing where the kernel runs: its test is asked false)
        before = [plan.block[j] for j in plan.gone if j < at and j not in plan.idle]
        after = plan.kept(at + 1, plan.call_at)
        for statement in before + after:
            clash = _stored(statement) & reads
            if clash:
                raise NoRegion(
                    f"`{sorted(clash)[0]}`, which the test on line {test.lineno} reads, is assigned on line "
                    f"{statement.lineno}: nothing ahead of the lines can ask the test"
                )


def _condition(test: ast.expr, taken: bool, lines: list[str]) -> str:
    """The test as the question beside `fits` asks it: as written, or negated for an `else` branch."""
    text = _text(lines, _span(test) or (0, 0, 0, 0))
    simple = isinstance(test, (ast.Name, ast.Attribute, ast.Call, ast.Compare, ast.Subscript))
    if taken:
        return text if simple else f"({text})"
    return f"not {text}" if simple and not isinstance(test, ast.Compare) else f"not ({text})"


def _check_late_bindings(plan: _Rewrite) -> None:
    """An output the call binds before the line that bound it: code in between saw the old value."""
    for name, i in plan.bound_late.items():
        for statement in plan.kept(plan.call_at, i):
            if name in _names_in(statement):
                raise NoRegion(f"`{name}` is used on line {statement.lineno}, before the cluster computes it")


def _check_dropped_names(plan: _Rewrite, outputs: list[int], function: ast.AST) -> None:
    """A name bound to an intermediate, whose statement goes, must not be read outside the cluster's
    own expressions before it is bound again."""
    inside = [_span(root.node) for root in plan.roots] + plan.untaken
    for j, name in plan.gone.items():
        if name in plan.bound_late or j == plan.call_at:
            continue  # an output: the call binds it
        if _read_later(plan.block, j, name, inside, function):
            raise NoRegion(f"`{name}` is assigned on line {plan.block[j].lineno} and used outside the cluster")


def _read_later(block: list[ast.stmt], j: int, name: str, inside: list[Span | None], function: ast.AST) -> bool:
    def outside(statement: ast.AST) -> bool:
        return any(
            isinstance(n, ast.Name)
            and n.id == name
            and isinstance(n.ctx, ast.Load)
            and not any(s is not None and _contains(s, _span(n) or (0, 0, 0, 0)) for s in inside)
            for n in ast.walk(statement)
        )

    for statement in block[j + 1 :]:
        if outside(statement):
            return True
        if name in _stored(statement):
            return False
    end = block[-1].end_lineno or block[-1].lineno
    later = [n for n in _AstIndex.of(function).statements if n.lineno > end]
    return any(outside(statement) for statement in later)


def _names_in(statement: ast.stmt) -> set[str]:
    return {n.id for n in ast.walk(statement) if isinstance(n, ast.Name)}


def _fresh(base: str, taken: set[str]) -> str:
    if base not in taken:
        return base
    k = 1
    while f"{base}_{k}" in taken:
        k += 1
    return f"{base}_{k}"


def _replaced(chunk: list[bytes | None], first: int, span: Span, text: bytes) -> list[bytes | None]:
    """`chunk` (lines from `first`) with `span` replaced by `text`; whole lines replaced by nothing
    become None, which the caller drops."""
    line, col, end_line, end_col = span
    a, b = line - first, end_line - first
    head, tail = (chunk[a] or b"")[:col], (chunk[b] or b"")[end_col:]
    if not text and not head.strip() and not tail.strip():
        return [*chunk[:a], None, *chunk[b + 1 :]]
    if not text and not head.strip() and tail.lstrip().startswith(b"#"):
        # The statement went; its comment stays, where the statement was indented.
        return [*chunk[:a], head + tail.lstrip(), *chunk[b + 1 :]]
    return [*chunk[:a], head + text + tail, *chunk[b + 1 :]]


def source_lines(file: str, text: str | None = None) -> list[str]:
    """The lines of `file`: `text` when given (the analyzed editor buffer), else as linecache has them."""
    if text is not None:
        return text.splitlines()
    return [line.rstrip("\n") for line in linecache.getlines(os.path.abspath(file))]
