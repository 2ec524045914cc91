"""The source rewrite of a "linear-cross-entropy" pattern: the statements from the projection to the loss
become one call of a fused loss that never writes the logits.

    logits = self.lm_head(x)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

becomes, where the installed torch has `F.linear_cross_entropy` and its chunked path takes the call
(reduction "mean", "sum" or "none", no label smoothing),

    loss = F.linear_cross_entropy(x.flatten(0, -2), self.lm_head.weight, targets.view(-1), ignore_index=-1,
                                  options=torch.nn.LinearCrossEntropyOptions())

and elsewhere a call of the kernel module's `linear_cross_entropy` (`codegen/runtime/linear_loss.py`),
which takes any leading dims.  Both keep what the code passes the loss (`ignore_index`, `reduction`,
`label_smoothing`) as it spells it; torch's defaults agree (`ignore_index` None is -100 there for class
indices).  Eager returns the loss in the dtype the loss read the logits in: torch's chunked path returns
it in the input's, so where the code upcast the logits the call is followed by `.float()`; the kernel
module's takes that dtype (`loss_dtype`).

The statements are those holding the pattern's ops, one after another in one block of one function
of the analyzed file: every one but the last binds one name that nothing else in the function reads,
and the last holds the loss, whose expression is replaced.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

import torch.nn.functional as F

from fuselens.contracts import report as R

from .graph import Graph, Node
from .linear_loss import LinearLoss, find_linear_losses
from .sourcemap import SourceIndex

Span = tuple[int, int, int, int]

LOSS_FUNCTION = "linear_cross_entropy"  # the kernel module's fused loss
_KEYWORDS = {
    "cross_entropy": ("ignore_index", "reduction", "label_smoothing"),
    "nll_loss": ("ignore_index", "reduction"),
}
# The positional parameters of F.cross_entropy / F.nll_loss after the input and the target.
_POSITIONAL = ("weight", "size_average", "ignore_index", "reduce", "reduction", "label_smoothing")


class Refused(Exception):
    """No rewrite: `code` (a refusal code of the report) and the sentence that says what stops it."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code, self.detail = code, detail


@dataclass
class LossRewrite:
    """Lines `start_line..end_line` of `file`, as they read (`original`), and what is written there."""

    file: str
    start_line: int
    end_line: int
    original: str
    text: str
    call: str  # the fused call, for display
    imports: list[str] = field(default_factory=list)
    uses_kernel_module: bool = False  # `call` is the kernel module's `linear_cross_entropy`
    torch_version: str = ""


def linear_cross_entropy_rewrite(graph: Graph, loss: int, source: SourceIndex) -> R.Rewrite:
    """The report's rewrite of the pattern whose loss is node `loss`, for the installed torch; the kernel
    module's import is added where its path is known (`pipeline/kernels.py`)."""
    found = next(f for f in find_linear_losses(graph) if f.loss == loss)
    built = loss_rewrite(graph, found, source, hasattr(F, "linear_cross_entropy"), "")
    span = (
        f"line {built.start_line}"
        if built.start_line == built.end_line
        else f"lines {built.start_line}–{built.end_line}"
    )
    fused = f"the kernel module's {LOSS_FUNCTION}" if built.uses_kernel_module else "F.linear_cross_entropy"
    return R.Rewrite(
        id="",
        file=built.file,
        start_line=built.start_line,
        end_line=built.end_line,
        original=built.original,
        text=built.text,
        imports=[i for i in built.imports if i],
        torch_version=built.torch_version,
        title=f"Rewrite {span} as one fused loss ({fused}): the logits are never written whole",
        call=built.call,
        note="the loss is computed a chunk of tokens at a time, its log-sum-exp in float32",
        kernel_functions=[LOSS_FUNCTION] if built.uses_kernel_module else [],
    )


def loss_rewrite(
    graph: Graph, found: LinearLoss, source: SourceIndex, torch_has_it: bool, kernel_import: str
) -> LossRewrite:
    """The rewrite of `found`, or `Refused`.  `torch_has_it`: the installed torch has
    `F.linear_cross_entropy`; `kernel_import`: the statement that imports the kernel module's
    `linear_cross_entropy` into the analyzed file."""
    if found.refused is not None:
        raise Refused(*found.refused)
    linear, loss = graph[found.linear], graph[found.loss]
    frames = [_frame_here(graph[i], source) for i in (found.linear, found.loss)]
    if frames[0] is None or frames[1] is None:
        raise Refused("elsewhere", "the projection or the loss is not in the analyzed file")
    if frames[0].invocation != frames[1].invocation:
        raise Refused(
            "elsewhere", f"the projection ({_at(linear)}) and the loss ({_at(loss)}) are in different functions"
        )
    function = source.function_at(frames[1].line, frames[1].function)
    if function is None:
        raise Refused("elsewhere", f"the loss ({_at(loss)}) is not in a function of the analyzed file")
    expressions = _Expressions(function)
    loss_expr = expressions.at(frames[1].span)
    linear_call = expressions.at(frames[0].span)
    if not isinstance(linear_call, ast.Call) or loss_expr is None:
        raise Refused(
            "elsewhere", f"the projection ({_at(linear)}) or the loss ({_at(loss)}) is not a call found there"
        )
    statements = _statements(function, graph, found, source)
    lines = source.text.splitlines(keepends=True)
    arguments = _arguments(found, graph, linear_call, loss_expr, lines)
    kernel = not (torch_has_it and _torch_takes(arguments))
    call = _fused_call(found, graph, arguments, kernel, lines)
    last = statements[-1]
    dropped = {name for s in statements[:-1] for name in _bound(s)}
    _check_not_read_elsewhere(function, statements, dropped, last, loss_expr)
    start, end = statements[0].lineno, last.end_lineno or last.lineno
    original = "".join(lines[start - 1 : end])
    indent = lines[start - 1][: len(lines[start - 1]) - len(lines[start - 1].lstrip())]
    written = _replaced(lines, last, _span(loss_expr), call)
    text = indent + written.lstrip() if statements[0] is not last else written
    imports = [kernel_import] if kernel else ["import torch", "import torch.nn.functional as F"]
    return LossRewrite(source.path, start, end, original, text, call, imports, kernel, "" if kernel else "2.13")


def _frame_here(node: Node, source: SourceIndex):
    return next((f for f in node.stack if f.file == source.path), None)


def _at(node: Node) -> str:
    return f"line {node.line}" if node.line else "the model"


class _Expressions:
    """The expressions of a function by their span (as the trace's frames give them)."""

    def __init__(self, function: ast.AST):
        self.by_span: dict[Span, ast.expr] = {}
        for node in ast.walk(function):
            if isinstance(node, ast.expr):
                self.by_span.setdefault(_span(node), node)

    def at(self, span: Span) -> ast.expr | None:
        return self.by_span.get(span)


def _span(node: ast.AST) -> Span:
    return (node.lineno, node.col_offset, node.end_lineno or node.lineno, node.end_col_offset or 0)  # type: ignore[attr-defined]


def _statements(function: ast.AST, graph: Graph, found: LinearLoss, source: SourceIndex) -> list[ast.stmt]:
    """The statements holding the pattern's ops: consecutive, in one block, every one but the last an
    assignment of one name."""
    lines = set()
    for i in found.chain:
        frame = _frame_here(graph[i], source)
        if frame is not None:
            lines.add(frame.line)
    for block in _blocks(function):
        held = [k for k, s in enumerate(block) if any(s.lineno <= n <= (s.end_lineno or s.lineno) for n in lines)]
        if not held:
            continue
        chosen = block[held[0] : held[-1] + 1]
        covered = {n for s in chosen for n in range(s.lineno, (s.end_lineno or s.lineno) + 1)}
        if not lines <= covered or isinstance(chosen[-1], (ast.If, ast.For, ast.While, ast.With, ast.Try)):
            continue
        for s in chosen[:-1]:
            if not (isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)):
                raise Refused(
                    "elsewhere",
                    f"line {s.lineno}, between the projection and the loss, does more than bind one name: "
                    "one call cannot replace the lines from the projection to the loss",
                )
        return chosen
    raise Refused("elsewhere", "the projection and the loss are not statements of one block")


def _blocks(function: ast.AST):
    for node in ast.walk(function):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def _bound(statement: ast.stmt) -> set[str]:
    if isinstance(statement, ast.Assign):
        return {t.id for t in statement.targets if isinstance(t, ast.Name)}
    return set()


def _check_not_read_elsewhere(
    function: ast.AST, statements: list[ast.stmt], dropped: set[str], last: ast.stmt, loss_expr: ast.expr
) -> None:
    """The names the dropped statements bind are read only by the statements the rewrite replaces, and
    in the last of them only inside the loss's expression."""
    inside = {id(n) for s in statements[:-1] for n in ast.walk(s)} | {id(n) for n in ast.walk(loss_expr)}
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Name)
            and isinstance(node.ctx, ast.Load)
            and node.id in dropped
            and id(node) not in inside
        ):
            raise Refused(
                "escapes", f"`{node.id}` is also read on line {node.lineno}, which the fused loss would not bind"
            )


@dataclass
class _Arguments:
    hidden: str
    weight: str
    bias: str | None
    target: str
    keywords: dict[str, str]  # as the code spells them: ignore_index, reduction, label_smoothing


def _arguments(found: LinearLoss, graph: Graph, linear: ast.Call, loss: ast.expr, lines: list[str]) -> _Arguments:
    text = lambda node: _text(lines, node)  # noqa: E731
    if _is_module_call(linear, graph[found.linear]):
        module = text(linear.func)
        hidden = text(linear.args[0])
        weight = f"{module}.weight"
        bias = f"{module}.bias" if found.bias is not None else None
    else:  # F.linear(x, weight, bias)
        given = list(linear.args) + [k.value for k in linear.keywords]
        if len(given) < 2:
            raise Refused("elsewhere", f"the projection on line {linear.lineno} is not a call of `F.linear`")
        hidden, weight = text(given[0]), text(given[1])
        bias = text(given[2]) if found.bias is not None and len(given) > 2 else None
    call = _loss_call(loss, found)
    if found.form == "gather":
        index = call.args[1] if len(call.args) > 1 else next(k.value for k in call.keywords if k.arg == "index")
        return _Arguments(hidden, weight, bias, _unpicked(index, lines), {})
    target = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "target"), None)
    if target is None:
        raise Refused("elsewhere", f"the loss on line {call.lineno} has no target argument found")
    keywords = {}
    for k, value in enumerate(call.args[2:]):
        name = _POSITIONAL[k] if k < len(_POSITIONAL) else ""
        keywords[name] = text(value)
    keywords.update({k.arg: text(k.value) for k in call.keywords if k.arg})
    unknown = set(keywords) - set(_KEYWORDS[found.form]) - {"input", "target"}
    if unknown:
        raise Refused(
            "modified",
            f"the loss on line {call.lineno} takes {', '.join(sorted(unknown))}, which the fused loss does not",
        )
    keywords = {k: v for k, v in keywords.items() if k in _KEYWORDS[found.form]}
    return _Arguments(hidden, weight, bias, text(target), keywords)


def _unpicked(index: ast.expr, lines: list[str]) -> str:
    """The targets a gather's index picks with (`t.unsqueeze(-1)`, `t[..., None]`): `t`."""
    if (
        isinstance(index, ast.Call)
        and isinstance(index.func, ast.Attribute)
        and index.func.attr == "unsqueeze"
        and len(index.args) == 1
        and _literal(_text(lines, index.args[0])) == -1
    ):
        return _text(lines, index.func.value)
    return f"{_atom(_text(lines, index))}.squeeze(-1)"


def _is_module_call(call: ast.Call, linear: Node) -> bool:
    """`self.lm_head(x)`, not `F.linear(x, w)`."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name != "linear"


def _loss_call(loss: ast.expr, found: LinearLoss) -> ast.Call:
    """The loss's call (`F.cross_entropy(...)`, `F.nll_loss(...)`, `logp.gather(...)`) inside the replaced expression."""
    wanted = "gather" if found.form == "gather" else found.form
    for node in ast.walk(loss):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name == wanted:
                return node
    raise Refused("elsewhere", f"no call of `{wanted}` is found on line {loss.lineno}")


def _torch_takes(arguments: _Arguments) -> bool:
    """Whether torch's chunked path takes the call (else it computes the logits whole, as eager does)."""
    smoothing = arguments.keywords.get("label_smoothing", "0.0")
    reduction = arguments.keywords.get("reduction", "'mean'")
    return _literal(smoothing) in (0, 0.0) and _literal(reduction) in ("mean", "sum", "none")


def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None


def _fused_call(found: LinearLoss, graph: Graph, arguments: _Arguments, kernel: bool, lines: list[str]) -> str:
    keywords = dict(arguments.keywords)
    if found.form == "gather":
        keywords["reduction"] = '"none"'
    upcast = found.upcast is not None
    if kernel:
        args = [arguments.hidden, arguments.weight, arguments.target] + ([arguments.bias] if arguments.bias else [])
        if upcast:
            keywords["loss_dtype"] = "torch.float32"
        call = f"{LOSS_FUNCTION}({', '.join(args + [f'{k}={v}' for k, v in keywords.items()])})"
    else:
        hidden_meta, target_meta = graph[found.hidden].meta, graph[found.target].meta
        hidden_rank = len(hidden_meta.shape) if hidden_meta is not None else 2
        target_rank = len(target_meta.shape) if target_meta is not None else 1
        hidden = f"{_atom(arguments.hidden)}.flatten(0, -2)" if hidden_rank > 2 else arguments.hidden
        target = arguments.target
        if found.form == "gather" or target_rank > 1:
            target = f"{_atom(target)}.flatten()"
        if arguments.bias:
            keywords = {"linear_bias": arguments.bias, **keywords}
        keywords["options"] = "torch.nn.LinearCrossEntropyOptions()"
        args = [hidden, arguments.weight, target] + [f"{k}={v}" for k, v in keywords.items()]
        call = f"F.linear_cross_entropy({', '.join(args)})"
        if upcast:
            call += ".float()"
        if found.form == "gather":
            call += f".view_as({_atom(arguments.target)})"
    if found.form == "gather":
        call = call if found.squeezed else f"{call}.unsqueeze(-1)"
        call = call if found.negated else f"-{call}"
    return call


def _atom(text: str) -> str:
    """`text` as the operand of a method call."""
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return f"({text})"
    return text if isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) else f"({text})"


def _text(lines: list[str], node: ast.AST) -> str:
    first, col, last, end = _span(node)
    if first == last:
        return lines[first - 1].encode()[col:end].decode()
    parts = [lines[first - 1].encode()[col:].decode()]
    parts += lines[first : last - 1]
    parts.append(lines[last - 1].encode()[:end].decode())
    return "".join(parts)


def _replaced(lines: list[str], statement: ast.stmt, span: Span, call: str) -> str:
    """The statement's lines with the expression at `span` written as `call`."""
    first, col, last, end = span
    start, stop = statement.lineno, statement.end_lineno or statement.lineno
    head = "".join(lines[start - 1 : first - 1]) + lines[first - 1].encode()[:col].decode()
    tail = lines[last - 1].encode()[end:].decode() + "".join(lines[last:stop])
    return head + call + tail
