"""The rewrite of a hand-written attention into `F.scaled_dot_product_attention` (or FlexAttention).

The graph says what the code computes (`attention.py`: the two matmuls, the scale, the masks, the
softmax, the casts, the dropout); this module finds the statements that compute it in the analyzed
file and writes them as one call with the same meaning:

- the statements run from the first that computes a part of it to the one holding the product with v,
  in one block of one function; the statements between are either parts of the attention (each assigns
  a name that the next part reads, and nothing after reads: they go) or other code that reads none of
  them (it stays, in its place);
- in the statement of the product, the product's expression becomes the call; q, k, v, the mask and
  the scale are the code's own expressions, read where the call is written: a name one of the removed
  statements rebinds (a repeat of k's heads, `q = q * self.scale`) is read as it was before them;
- the scale is always passed (`scale=`, as the code computes it: `1 / math.sqrt(self.head_dim)`), a
  boolean mask is passed as the positions to keep (`~mask`, a flipped comparison), or as `is_causal=True`
  where it is exactly causal over square scores (a `tril` buffer or a triangle of ones sliced from its
  corner); an additive one as it is, in q's dtype; a dropout only in training, as the module's own
  flag says (`dropout_p=self.drop.p if self.drop.training else 0.0`); repeated key and value heads with
  `enable_gqa=True` (torch 2.5) instead of the repeat; the output cast to the dtype the product had;
- a function of the score alone before the softmax (soft-capping with tanh) is no argument of SDPA: it
  becomes FlexAttention's `score_mod` where torch has `torch.nn.attention.flex_attention`.

Whatever does not fit is a `Refusal` that says which line and why.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from fuselens.contracts import report as R

from .attention import Attention, _reaches
from .graph import Graph, Node, Ref
from .patterns import Match
from .rewrites import Refusal
from .sourcemap import SourceIndex

SDPA = "scaled_dot_product_attention"
_DROPOUT_MODULES = frozenset({"torch.nn.modules.dropout.Dropout"})
FLEX_MODULE = "torch.nn.attention.flex_attention"


class _Refused(Exception):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.refusal = Refusal(code, detail)


def attention_rewrite(graph: Graph, match: Match, source: SourceIndex) -> R.Rewrite | Refusal:
    """The rewrite of the attention `match` found in `graph`, in the analyzed file `source`."""
    parts: Attention = match.parts
    if parts.refusal is not None:
        return Refusal(*parts.refusal)
    try:
        return _Writer(graph, parts, source).rewrite()
    except _Refused as exc:
        return exc.refusal


# ---- the statements ------------------------------------------------------------------------------


@dataclass
class _Statement:
    index: int  # in its block
    node: ast.stmt
    binds: list[str]  # the names it assigns
    removed: bool = False  # a part of the attention: the rewrite drops it


@dataclass
class _Form:
    """The fused call's arguments, as source text."""

    q: str = ""
    k: str = ""
    v: str = ""
    scale: list[str] = field(default_factory=list)  # factors
    mask: str = ""  # attn_mask=
    causal: bool = False
    dropout: str = ""  # dropout_p=
    gqa: bool = False
    score_mod: str = ""  # a lambda's body in `score`, `b`, `h`, `q_idx`, `kv_idx`
    notes: list[str] = field(default_factory=list)


class _Writer:
    def __init__(self, graph: Graph, parts: Attention, source: SourceIndex) -> None:
        self.graph, self.parts, self.source = graph, parts, source
        pv = graph[parts.pv]
        frame = pv.source
        if frame is None or os.path.abspath(frame.file) != source.path:
            where = os.path.basename(frame.file) if frame is not None else "no file"
            raise _Refused("elsewhere", f"its code is in {where}, not in the analyzed file")
        self.frame = frame
        function = source.function_at(frame.line, frame.function)
        if function is None:
            raise _Refused("elsewhere", f"the function {frame.function} holding it was not found in the file")
        self.function = function
        self.spans: dict[tuple[int, int, int, int], int] = {}  # an op's span in this function -> its node
        self.form = _Form()
        self.operands: list[tuple[ast.expr, str]] = []  # what the call reads, checked once the range is known
        self.read: set[int] = set()  # the attention's ops the reading of its expressions came by
        self.fills: list[tuple[Node, ast.expr]] = []  # `masked_fill(mask, -inf)`, in the code's order
        self.added: list[tuple[Node, ast.expr, str]] = []  # `scores + mask` (and the mask's dtype)
        self.uses_torch = False  # the call's text names `torch`

    # -- where each op is ----------------------------------------------------------------------

    def _span_here(self, node: Node) -> tuple[int, int, int, int] | None:
        """The span, in this function's call, of the expression that made `node` (the op itself, or the
        call of a helper or module that made it)."""
        for f in node.stack:
            if f.invocation == self.frame.invocation and f.col >= 0:
                return f.span
        return None

    def _called_elsewhere(self, node: Node, span: tuple[int, int, int, int] | None) -> _Refused:
        """Why an op of the attention that another function computes (a module the scores go through, a
        helper) stops the rewrite of this function's lines."""
        inner = node.stack[0].function if node.stack else "another function"
        if span is not None:
            function = self.source.function_at(span[0], self.frame.function)
            call = (
                next(
                    (e for e in ast.walk(function) if isinstance(e, ast.Call) and _span(e) == span),
                    None,
                )
                if function is not None
                else None
            )
            if call is not None and self._module_called(call) is not None:
                module = (self._module_called(call) or "").rsplit(".", 1)[-1]
                return _Refused(
                    "modified",
                    f"the scores go through the module `{_text(self.source.text, call.func)}` ({module}) at line "
                    f"{span[0]}, which computes `{node.op}` in {inner}: a fused call cannot run it",
                )
            where = f" called at line {span[0]}"
        else:
            where = ""
        return _Refused(
            "elsewhere",
            f"`{node.op}` is computed in {inner}{where}, another function than the product with v "
            f"({self.frame.function}): one rewrite of {self.frame.function}'s lines cannot stand for it",
        )

    def _own_ops(self) -> list[int]:
        parts = self.parts
        ops = [parts.qk, parts.pv, *parts.chain]
        if parts.q_scale is not None:
            ops.append(parts.q_scale)
        return ops

    def rewrite(self) -> R.Rewrite:
        for i in self._own_ops():
            node = self.graph[i]
            span = self._span_here(node)
            if span is None or (node.stack and node.stack[0].invocation != self.frame.invocation):
                raise self._called_elsewhere(node, span)
            self.spans.setdefault(span, i)
        for ids in self.parts.repeats.values():
            for i in ids:
                span = self._span_here(self.graph[i])
                if span is not None:
                    self.spans.setdefault(span, i)
        block, last = self._block_of(self.spans_of([self.parts.pv])[0])
        first = min(self._index_in(block, span) for span in self.spans_of(self._own_ops()))
        first = min([first, *self._repeats_before(block, first)])
        statements = [_Statement(k, block[k], _bound(block[k])) for k in range(first, last + 1)]
        for st in statements[:-1]:
            if not isinstance(st.node, (ast.Assign, ast.Expr, ast.AnnAssign, ast.Pass)):
                what = type(st.node).__name__.lower()
                raise _Refused(
                    "elsewhere",
                    f"a `{what}` statement at line {st.node.lineno} sits between the attention's lines: "
                    "a rewrite replaces straight-line statements",
                )
        self.statements = statements
        final = statements[-1]
        pv_expr = self._expression_at(final.node, self.spans_of([self.parts.pv])[0])
        self._check_dtypes()
        self._explain(pv_expr)
        self._check_every_op_read()
        self._check_operands()
        self._check_what_stays(statements)
        self._check_nothing_later_reads(block, last, statements)
        return self._written(statements, pv_expr)

    def _repeats_before(self, block: list[ast.stmt], first: int) -> list[int]:
        """The statements of `block` before `first` that repeat k's and v's heads, where the call can repeat
        them itself (`enable_gqa`): the range starts there, so that they can go."""
        repeats = self.parts.repeats
        if not (repeats.get("k") and repeats.get("v")) or not _torch_has("2.5"):
            return []
        found = []
        for i in repeats["k"] + repeats["v"]:
            span = self._span_here(self.graph[i])
            index = next((k for k, st in enumerate(block[:first]) if span is not None and _holds(st, span)), None)
            if index is not None:
                found.append(index)
        return found

    def spans_of(self, ids: list[int]) -> list[tuple[int, int, int, int]]:
        by_node = {i: s for s, i in self.spans.items()}
        return [by_node[i] for i in ids if i in by_node]

    def _block_of(self, span: tuple[int, int, int, int]) -> tuple[list[ast.stmt], int]:
        """The statement list, in the function, whose statement holds `span`, and that statement's index."""
        for body in _blocks(self.function):
            for k, st in enumerate(body):
                if _holds(st, span) and not any(_holds(inner, span) for b in _blocks_in(st) for inner in b):
                    return body, k
        raise _Refused("elsewhere", f"the product with v at line {span[0]} is not in a statement of its own")

    def _index_in(self, block: list[ast.stmt], span: tuple[int, int, int, int]) -> int:
        for k, st in enumerate(block):
            if _holds(st, span):
                if any(_holds(inner, span) for b in _blocks_in(st) for inner in b):
                    break
                return k
        raise _Refused(
            "elsewhere",
            f"the attention's ops at lines {span[0]} and {self.frame.line} are not in one block of statements "
            "(an `if` or a loop holds some of them)",
        )

    def _expression_at(self, node: ast.AST, span: tuple[int, int, int, int]) -> ast.expr:
        for inner in ast.walk(node):
            if isinstance(inner, ast.expr) and _span(inner) == span:
                return inner
        raise _Refused("elsewhere", f"the expression at line {span[0]} was not found in the file as analyzed")

    # -- what the code computes, read from the product inward ------------------------------------

    def _op(self, expr: ast.expr) -> Node | None:
        """The graph's op made by `expr` (by its span), if it made one of the attention's."""
        i = self.spans.get(_span(expr))
        if i is not None:
            self.read.add(i)
        return self.graph[i] if i is not None else None

    def _check_every_op_read(self) -> None:
        """Every op of the attention is one the reading of its expressions came by: an op the statements'
        values do not show (`scores.masked_fill_(mask, -inf)`, which changes the scores in place) would
        be left out of the call."""
        parts = self.parts
        ops = [parts.qk, parts.pv, *parts.chain, *([parts.q_scale] if parts.q_scale is not None else [])]
        for i in ops:
            node = self.graph[i]
            if i not in self.read and node.op != "to_same":
                raise _Refused(
                    "modified",
                    f"`{node.op}` at line {node.line} changes the scores where the rewrite cannot follow "
                    "(in place, or by a name it does not read): it would be left out of the call",
                )

    def _check_dtypes(self) -> None:
        """q, k and v of one dtype, as a fused call takes them."""
        metas = {
            name: self.graph[i].meta
            for name, i in (("q", self.graph[self.parts.qk].refs[0].node), ("k", self.parts.k_t), ("v", self.parts.v))
        }
        dtypes = {name: meta.dtype for name, meta in metas.items() if meta is not None}
        if len(set(dtypes.values())) > 1:
            listed = ", ".join(f"{name} {dtype}" for name, dtype in dtypes.items())
            raise _Refused("shape", f"q, k and v are of different dtypes ({listed}): a fused call takes one")

    def _resolve(self, expr: ast.expr, at: int) -> ast.expr:
        """`expr`, read in statement `at`; a name a statement before it (in the range) assigns is that
        statement's value, which the attention then consumes (the statement goes)."""
        while isinstance(expr, ast.Name) and isinstance(expr.ctx, ast.Load):
            binder = self._binder(expr.id, at)
            if binder is None or not isinstance(binder.node, ast.Assign) or len(binder.binds) != 1:
                return expr
            if not isinstance(binder.node.targets[0], ast.Name):
                return expr
            binder.removed = True
            expr = binder.node.value
            at = binder.index - self.statements[0].index
        return expr

    def _binder(self, name: str, at: int, kept_only: bool = False) -> _Statement | None:
        """The statement of the range, before the one at `at` (an index into the range), whose binding of
        `name` is the one read there (`kept_only`: once the removed statements are gone)."""
        for st in reversed(self.statements[:at]):
            if name in st.binds and not (kept_only and st.removed):
                return st
        return None

    def _position(self, expr: ast.expr) -> int:
        """The index, in the range, of the statement holding `expr`."""
        for k, st in enumerate(self.statements):
            if _holds(st.node, _span(expr)):
                return k
        return len(self.statements) - 1

    def _explain(self, pv_expr: ast.expr) -> None:
        """Read the call's arguments off the code, from the product with v inward."""
        self._op(pv_expr)
        probs, v = _matmul_operands(pv_expr)
        self.form.v = self._operand(self._unrepeated(v, "v"), "v")
        at = self._position(pv_expr)
        scores = self._probabilities(self._resolve(probs, at))
        self._scores(scores)

    def _probabilities(self, expr: ast.expr) -> ast.expr:
        """Through the casts and the dropout back to the softmax; its input (the scores)."""
        while True:
            node = self._op(expr)
            if node is not None and node.op == "softmax":
                return self._resolve(self._tensor_operand(expr), self._position(expr))
            if (node is not None and node.op == "dropout") or (node is None and self._is_dropout_call(expr)):
                self.form.dropout = self._dropout_text(expr)
                expr = self._resolve(self._tensor_operand(expr), self._position(expr))
                continue
            if (node is not None and node.op in ("cast", "to_same")) or (node is None and _is_cast_call(expr)):
                expr = self._resolve(self._tensor_operand(expr), self._position(expr))
                continue
            raise self._not_expressible(expr, "the probabilities")

    def _scores(self, expr: ast.expr) -> None:
        """From the softmax's input back to the scores' matmul: masks, functions of the score, scales."""
        parts = self.parts
        mods: list[tuple[ast.expr, Node]] = []
        while True:
            node = self._op(expr)
            if node is not None and node.id == parts.qk:
                break
            if node is None and _is_cast_call(expr):
                expr = self._resolve(self._tensor_operand(expr), self._position(expr))
                continue
            if node is None:
                raise self._not_expressible(expr, "the scores")
            at = self._position(expr)
            if node.op in ("cast", "to_same"):
                expr = self._resolve(self._tensor_operand(expr), at)
            elif node.id in parts.fills:
                target, mask = self._masked_fill_operands(expr)
                self._boolean_mask(node, mask)
                expr = self._resolve(target, at)
            elif node.id in parts.additive:
                score_side, mask = self._sides(expr)
                self._additive_mask(node, mask)
                expr = self._resolve(score_side, at)
            elif node.id in parts.scales:
                score_side, factor = self._sides(expr)
                self.form.scale.insert(0, self._factor(expr, factor))
                expr = self._resolve(score_side, at)
            elif node.id in parts.score_mods:
                mods.insert(0, (expr, node))
                expr = self._resolve(self._tensor_operand(expr), at)
            else:
                raise self._not_expressible(expr, "the scores")
        self._query_and_key(expr)
        if mods:
            self._score_mod(mods)

    def _query_and_key(self, qk_expr: ast.expr) -> None:
        q, k_t = _matmul_operands(qk_expr)
        at = self._position(qk_expr)
        q = self._resolve(q, at)
        node = self._op(q)
        if node is not None and node.id == self.parts.q_scale:
            tensor, factor = self._sides(q)
            self.form.scale.insert(0, self._factor(q, factor))
            q = self._resolve(tensor, self._position(q))
        self.form.q = self._operand(q, "q")
        k_t = self._resolve(k_t, at)
        k_meta = self.graph[self.parts.k_t].meta
        k = _untransposed(k_t, len(k_meta.shape) if k_meta is not None else 0)
        if k is None:
            self.form.k = f"{self._operand(k_t, 'k')}.transpose(-2, -1)"
        else:
            self.form.k = self._operand(self._unrepeated(self._resolve(k, self._position(k)), "k"), "k")

    def _unrepeated(self, expr: ast.expr, which: str) -> ast.expr:
        """k or v before the repeat of its heads for the query's, where the call can repeat them itself
        (`enable_gqa`, torch 2.5): the repeat's statement goes."""
        repeats = self.parts.repeats
        if not (repeats.get("k") and repeats.get("v")) or not _torch_has("2.5"):
            return expr
        resolved = self._resolve_tentatively(expr)
        node = self._op(resolved) if resolved is not None else None
        if resolved is None or node is None or node.id not in repeats.get(which, []):
            return expr
        inner = _repeat_source(resolved, node)
        if inner is None:
            return expr
        self._resolve(expr, self._position(expr))  # (the repeat's statement goes)
        self.form.gqa = True
        return inner

    def _resolve_tentatively(self, expr: ast.expr) -> ast.expr | None:
        """What `_resolve` would give, without marking anything removed."""
        at = self._position(expr)
        while isinstance(expr, ast.Name):
            binder = self._binder(expr.id, at)
            if binder is None or not isinstance(binder.node, ast.Assign) or len(binder.binds) != 1:
                return expr
            expr = binder.node.value
            at = binder.index - self.statements[0].index
        return expr

    # -- the arguments ---------------------------------------------------------------------------

    def _operand(self, expr: ast.expr, what: str) -> str:
        """The source text of an operand of the call (q, k, v, a mask, the scale), which it reads where the
        call is written (`_check_operands` checks that it reads the same values there)."""
        self.operands.append((expr, what))
        return _text(self.source.text, expr)

    def _check_operands(self) -> None:
        """Each name an operand of the call reads must be bound where the call is written as it was where
        the code read it: no removed statement in between gave it another value (nor a kept one after)."""
        last = len(self.statements) - 1
        for expr, what in self.operands:
            at = self._position(expr)
            for name in _names_read(expr):
                then = self._binder(name, at)
                now = self._binder(name, last, kept_only=True)
                if then is not now:
                    binder = then or now
                    line = binder.node.lineno if binder is not None else self.frame.line
                    raise _Refused(
                        "modified",
                        f"`{name}` in the {what} is assigned again at line {line}: the call, written where the "
                        "product with v is, would read another value",
                    )

    def _factor(self, op_expr: ast.expr, factor: ast.expr) -> str:
        """A scale factor as the code spells it: a divisor becomes `1 / divisor`."""
        text = self._operand(factor, "scale")
        if _is_division(op_expr):
            return f"1 / {_atom(factor, text)}"
        return text

    def _sides(self, expr: ast.expr) -> tuple[ast.expr, ast.expr]:
        """(the side the scores come from, the other) of a binary op (`a * b`, `a.mul(b)`, `torch.mul(a, b)`)."""
        if isinstance(expr, ast.BinOp):
            pairs = [(expr.left, expr.right), (expr.right, expr.left)]
        elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and len(expr.args) == 1:
            pairs = [(expr.func.value, expr.args[0]), (expr.args[0], expr.func.value)]
        elif isinstance(expr, ast.Call) and len(expr.args) >= 2:
            pairs = [(expr.args[0], expr.args[1]), (expr.args[1], expr.args[0])]
        else:
            raise self._not_expressible(expr, "the scores")
        for scores, other in pairs:
            if self._holds_scores(scores) and not self._holds_scores(other):
                return scores, other
        raise self._not_expressible(expr, "the scores")

    def _tensor_operand(self, expr: ast.expr) -> ast.expr:
        """The one operand of a call of one tensor (a cast, the softmax, a dropout, `tanh`) that the scores
        or probabilities come from: `x.float()`'s x, `F.softmax(x, dim=-1)`'s, `self.drop(x)`'s."""
        candidates: list[ast.expr] = []
        if isinstance(expr, ast.Call):
            if isinstance(expr.func, ast.Attribute) and self._holds_scores(expr.func.value):
                return expr.func.value  # a method of the tensor (`x.float()`, `x.type_as(y)`, `x.softmax(-1)`)
            candidates += list(expr.args) + [k.value for k in expr.keywords]
        elif isinstance(expr, ast.UnaryOp):
            candidates.append(expr.operand)
        elif isinstance(expr, ast.BinOp):
            return self._sides(expr)[0]
        holding = [c for c in candidates if self._holds_scores(c)]
        if len(holding) != 1:
            raise self._not_expressible(expr, "the scores")
        return holding[0]

    def _masked_fill_operands(self, expr: ast.expr) -> tuple[ast.expr, ast.expr]:
        """(the scores, the mask) of `scores.masked_fill(mask, value)` or `torch.masked_fill(scores, mask, value)`."""
        if isinstance(expr, ast.Call):
            target = self._tensor_operand(expr)
            if isinstance(expr.func, ast.Attribute) and target is expr.func.value:
                arguments = _bound_arguments(expr, ["mask", "value"])
            else:
                arguments = _bound_arguments(expr, ["input", "mask", "value"])
            if "mask" in arguments:
                return target, arguments["mask"]
        raise _Refused(
            "modified", f"the masked fill at line {expr.lineno} is not written as `x.masked_fill(mask, value)`"
        )

    def _holds_scores(self, expr: ast.expr) -> bool:
        """Whether the scores' matmul (or q's scale) is among what `expr` computes, its names followed."""
        resolved = self._resolve_tentatively(expr)
        if resolved is None:
            return False
        targets = {i for i in (self.parts.qk, self.parts.q_scale) if i is not None}
        for inner in ast.walk(resolved):
            if isinstance(inner, ast.expr) and self.spans.get(_span(inner)) in targets:
                return True
            if isinstance(inner, ast.Name) and inner is not resolved:
                deeper = self._resolve_tentatively(inner)
                if deeper is not None and deeper is not inner and self._holds_scores(deeper):
                    return True
        return False

    def _boolean_mask(self, node: Node, mask: ast.expr) -> None:
        """`masked_fill(mask, -inf)`: the positions it fills, for `_masks` to pass."""
        value = next((a for a in node.args if not isinstance(a, Ref)), None)
        if not (isinstance(value, float) and value == float("-inf")):
            raise _Refused(
                "mask",
                f"the mask at line {node.line} fills {value!r}, not -inf: a fused call's boolean mask leaves "
                "-inf there, which differs where a row's every key is masked",
            )
        self._operand(mask, "mask")
        self.fills.insert(0, (node, mask))

    def _additive_mask(self, node: Node, mask: ast.expr) -> None:
        """`scores + mask`: the mask, for `_masks` to pass."""
        operand = next((r.node for r in node.refs if not _reaches(self.graph, r.node, self.parts.qk)), None)
        meta = self.graph[operand].meta if operand is not None else None
        if meta is None or meta.dtype == "bool":
            raise _Refused("mask", f"the mask added at line {node.line} is not a float tensor")
        self._operand(mask, "mask")
        self.added.insert(0, (node, mask, meta.dtype))

    def _masks(self) -> None:
        """The masks as the call takes them: one boolean mask exactly causal over square scores as
        `is_causal=True`; else the positions to keep (a comparison flipped, `~mask`, several or'ed); an
        additive mask as it is (several summed), with the filled positions as -inf in it
        (`torch.where(filled, -inf, mask)`: the same, as scores are finite); in q's dtype."""
        text = self.source.text
        if len(self.fills) == 1 and not self.added and self._causal(self.fills[0][0]):
            self.form.causal = True
            return
        filled = [(m, _text(text, m)) for _, m in self.fills]
        if self.added:
            added = " + ".join(
                _atom(m, _text(text, m)) if len(self.added) > 1 else _text(text, m) for _, m, _ in self.added
            )
            dtypes = {dtype for _, _, dtype in self.added}
            if filled:
                where = " | ".join(_atom(m, t) for m, t in filled) if len(filled) > 1 else filled[0][1]
                added = f'torch.where({where}, float("-inf"), {added})'
                self.uses_torch = True
            q_dtype = self._q_dtype()
            if dtypes != {q_dtype}:
                added = (
                    f"({added}).to({_atom_text(self.form.q)}.dtype)"
                    if " " in added
                    else f"{added}.to({_atom_text(self.form.q)}.dtype)"
                )
                self.form.notes.append(
                    f"the mask is cast from {', '.join(sorted(dtypes))} to the query's dtype ({q_dtype})"
                )
            self.form.mask = added
        elif len(filled) == 1:
            self.form.mask = _negated(text, filled[0][0])
        elif filled:
            self.form.mask = "~(" + " | ".join(_atom(m, t) for m, t in filled) + ")"

    def _q_dtype(self) -> str:
        meta = self.graph[self.graph[self.parts.qk].refs[0].node].meta
        return meta.dtype if meta else ""

    def _causal(self, fill: Node) -> bool:
        """Whether `masked_fill(mask, -inf)` masks exactly the keys after each query over square scores:
        its mask a causal buffer's or a triangle of ones (`torch.ones(T, T).tril()`) sliced from the corner,
        compared or negated to the positions above the diagonal."""
        scores = self.graph[self.parts.qk].meta
        if scores is None or scores.shape[-1] != scores.shape[-2]:
            return False
        masked = _evaluate_mask(self.graph, fill.refs[1].node, scores.shape[-1])
        if masked is None:
            return False
        n = masked.shape[-1]
        return torch.equal(masked.bool(), torch.ones(n, n, dtype=torch.bool).triu(1))

    def _score_mod(self, mods: list[tuple[ast.expr, Node]]) -> None:
        """The functions of the score between the scale and the masks, as a `score_mod`'s body."""
        op, line = mods[0][1].op, mods[0][1].line
        if not _has_flex():
            raise _Refused(
                "torch",
                f"`{op}` at line {line} is a function of the score that scaled_dot_product_attention cannot take, "
                f"and this torch has no FlexAttention ({FLEX_MODULE}, torch 2.5) whose score_mod could",
            )
        if self.form.dropout:
            raise _Refused("torch", f"`{op}` at line {line} needs FlexAttention's score_mod, which takes no dropout")
        if self.form.mask:
            raise _Refused(
                "mask",
                f"`{op}` at line {line} needs FlexAttention's score_mod, and the mask is no causal one it can take",
            )
        last = mods[-1][0]
        first_input = self._tensor_operand(mods[0][0])
        body = _replaced(last, _span(first_input), ast.Name("score", ast.Load()))
        for name in sorted(_names_read(body) - {"score"}):
            self.operands.append((_named(name, last), "function of the score"))
        self.form.score_mod = ast.unparse(body)

    def _dropout_text(self, expr: ast.expr) -> str:
        """`dropout_p=`: the dropout's rate where it drops (a module: as its own `training` says; a function:
        as its `training` argument says), else 0.0."""
        if not isinstance(expr, ast.Call):
            raise self._not_expressible(expr, "the probabilities")
        if self._module_called(expr) is not None:
            callee = _text(self.source.text, expr.func)
            self.operands.append((expr.func, "dropout"))
            return f"{callee}.p if {callee}.training else 0.0"
        arguments = _bound_arguments(expr, ["input", "p", "training", "inplace"])
        p = arguments.get("p")
        p_text = self._operand(p, "dropout") if p is not None else "0.5"
        training = arguments.get("training") or arguments.get("train")
        if training is None:
            return p_text
        return f"{p_text} if {self._operand(training, 'dropout')} else 0.0"

    def _module_called(self, expr: ast.Call) -> str | None:
        """The class of the model's module that `self.<attr>(...)` calls (None for any other call)."""
        func = expr.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"):
            return None
        owner = self.frame.owner
        return self.graph.module_types.get(f"{owner}.{func.attr}" if owner else func.attr)

    def _is_dropout_call(self, expr: ast.expr) -> bool:
        if not isinstance(expr, ast.Call):
            return False
        module = self._module_called(expr)
        if module is not None:
            return module in _DROPOUT_MODULES
        name = _dotted(expr.func)
        return name is not None and "." in name and name.rsplit(".", 1)[1] in ("dropout", "_dropout")

    def _not_expressible(self, expr: ast.expr, what: str) -> _Refused:
        if isinstance(expr, ast.Call) and self._module_called(expr) is not None:
            module = self._module_called(expr) or ""
            return _Refused(
                "modified",
                f"{what} go through the module `{_text(self.source.text, expr.func)}` "
                f"({module.rsplit('.', 1)[-1]}) at line {expr.lineno}: a fused call cannot run it",
            )
        text = _text(self.source.text, expr)
        shown = text if len(text) <= 60 else text[:57] + "..."
        node = self._op(expr)
        op = f" (`{node.op}`)" if node is not None else ""
        return _Refused(
            "modified", f"`{shown}` at line {expr.lineno}{op} changes {what} in a way a fused call cannot express"
        )

    # -- the statements that stay, and those after -------------------------------------------------

    def _check_what_stays(self, statements: list[_Statement]) -> None:
        """The statements of the range that are not parts of the attention stay in place: none may read a
        name a removed one assigned (the scores, the probabilities); nor may the product's statement
        outside the product."""
        first = statements[0].index
        for st in statements[:-1]:
            if st.removed:
                continue
            for name in sorted(_names_read(st.node)):
                binder = self._binder(name, st.index - first)
                if binder is not None and binder.removed:
                    raise _Refused(
                        "escapes",
                        f"line {st.node.lineno} reads `{name}` of the attention (line {binder.node.lineno}): "
                        "a fused call never makes it",
                    )
        final = statements[-1]
        for name in sorted(_names_read(final.node, outside=self.spans_of([self.parts.pv])[0])):
            binder = self._binder(name, len(statements) - 1)
            if binder is not None and binder.removed:
                raise _Refused(
                    "escapes",
                    f"line {final.node.lineno} reads `{name}` of the attention besides the product with v: "
                    "a fused call never makes it",
                )

    def _check_nothing_later_reads(self, block: list[ast.stmt], last: int, statements: list[_Statement]) -> None:
        """No code after the rewritten lines reads a name a removed statement assigned (unless it is
        assigned again first): the probabilities returned or stored later."""
        gone: set[str] = set()
        for st in statements:
            gone -= set(st.binds)
            if st.removed:
                gone |= set(st.binds)
        for later in block[last + 1 :]:
            read = _names_read(later) & gone
            if read:
                raise _Refused(
                    "escapes",
                    f"line {later.lineno} reads `{sorted(read)[0]}`, which the attention's lines assign: "
                    "a fused call never makes it",
                )
            gone -= set(_bound(later))
        if gone and _reads_after_block(self.function, block, gone):
            raise _Refused("escapes", f"`{sorted(gone)[0]}`, which the attention's lines assign, is read after them")

    # -- the text written ----------------------------------------------------------------------------

    def _written(self, statements: list[_Statement], pv_expr: ast.expr) -> R.Rewrite:
        form = self.form
        self._masks()
        self.parts.written_mask = (
            "causal" if form.causal else "additive" if self.added else "boolean" if self.fills else "none"
        )
        self.parts.written_flex = bool(form.score_mod)
        needed = "2.5" if form.gqa or form.score_mod else "2.1"
        tree = self.source.tree
        callee, imports = _flex_name(tree) if form.score_mod else _functional_name(tree)
        call = _call_text(callee, form)
        out = self.graph[self.parts.pv].meta
        if out is not None and out.dtype != self._q_dtype():
            call += f".to(torch.{out.dtype})"
            form.notes.append(f"its output is cast to {out.dtype}, as the product with v had it")
        names_torch = (
            self.uses_torch or call.startswith("torch.") or ".to(torch." in call or "torch.where(q_idx" in call
        )
        if names_torch and not _binds(tree, "torch", "torch"):
            imports.append("import torch")
        lines = self.source.text.splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        _check_whole_lines(lines, statements)
        first_line = statements[0].node.lineno
        final = statements[-1].node
        last_line = final.end_lineno or final.lineno
        removed_lines = {
            n
            for st in statements[:-1]
            if st.removed
            for n in range(st.node.lineno, (st.node.end_lineno or st.node.lineno) + 1)
        }
        written = [lines[n - 1] for n in range(first_line, final.lineno) if n not in removed_lines]
        written.append(_call_statement(lines, final, _span(pv_expr), call))
        span = f"line {first_line}" if first_line == last_line else f"lines {first_line}–{last_line}"
        if form.score_mod:
            form.notes.append("flex_attention runs fused only when compiled (torch.compile the model or the call)")
        shown = "FlexAttention" if form.score_mod else callee
        return R.Rewrite(
            id="",
            file=self.source.path,
            start_line=first_line,
            end_line=last_line,
            original="".join(lines[first_line - 1 : last_line]),
            text="".join(written),
            imports=imports,
            torch_version=needed,
            title=f"Rewrite {span} as {shown} (the scores stay on chip)",
            call=call,
            note="; ".join(form.notes),
        )


# ---- helpers on the syntax tree ---------------------------------------------------------------------


def _span(node: ast.AST) -> tuple[int, int, int, int]:
    return (
        getattr(node, "lineno", 0),
        getattr(node, "col_offset", -1),
        getattr(node, "end_lineno", 0) or 0,
        getattr(node, "end_col_offset", -1) or -1,
    )


def _holds(node: ast.AST, span: tuple[int, int, int, int]) -> bool:
    """Whether `span` lies within `node`'s."""
    return _holds_span(_span(node), span)


def _blocks(function: ast.AST) -> Iterator[list[ast.stmt]]:
    """Every statement list inside `function` (its body first)."""
    stack = [function]
    while stack:
        node = stack.pop()
        for body in _blocks_in(node):
            yield body
            stack += body


def _blocks_in(node: ast.AST) -> list[list[ast.stmt]]:
    out = []
    for name in ("body", "orelse", "finalbody", "handlers"):
        value = getattr(node, name, None)
        if isinstance(value, list) and value and isinstance(value[0], (ast.stmt, ast.excepthandler)):
            out.append(value)
    return out


def _bound(st: ast.stmt) -> list[str]:
    """The names a statement assigns (at its own level: not in a nested function)."""
    targets: list[ast.expr] = []
    if isinstance(st, ast.Assign):
        targets = st.targets
    elif isinstance(st, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
        targets = [st.target]
    out = []
    for t in targets:
        out += [n.id for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(st, (ast.With, ast.AsyncWith)):
        out += [
            n.id
            for item in st.items
            if item.optional_vars
            for n in ast.walk(item.optional_vars)
            if isinstance(n, ast.Name)
        ]
    return out


def _names_read(node: ast.AST, outside: tuple[int, int, int, int] | None = None) -> set[str]:
    names = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Load):
            if outside is not None and _holds_span(outside, _span(inner)):
                continue
            names.add(inner.id)
    return names


def _holds_span(outer: tuple[int, int, int, int], inner: tuple[int, int, int, int]) -> bool:
    return (outer[0], outer[1]) <= (inner[0], inner[1]) and (inner[2], inner[3]) <= (outer[2], outer[3])


def _reads_after_block(function: ast.AST, block: list[ast.stmt], names: set[str]) -> bool:
    """Whether code after the block (in an enclosing block, later) reads one of `names`: a loop's next turn
    or the code after an `if` holding the attention."""
    if any(block is body for body in _blocks_in(function)):
        return False
    end = block[-1].end_lineno or block[-1].lineno
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in names and node.lineno > end:
            return True
    return False


def _matmul_operands(expr: ast.expr) -> tuple[ast.expr, ast.expr]:
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.MatMult):
        return expr.left, expr.right
    if isinstance(expr, ast.Call):
        name = _dotted(expr.func) or ""
        if isinstance(expr.func, ast.Attribute) and name.split(".")[-1] in ("matmul", "bmm", "__matmul__"):
            if len(expr.args) == 2:
                return expr.args[0], expr.args[1]  # torch.matmul(a, b)
            if len(expr.args) == 1:
                return expr.func.value, expr.args[0]  # a.matmul(b)
    raise _Refused("modified", f"the product at line {expr.lineno} is not written as `a @ b` or `torch.matmul(a, b)`")


def _is_torch_call(expr: ast.Call) -> bool:
    name = _dotted(expr.func) or ""
    return name.startswith(("torch.", "F.", "nn.functional."))


def _is_division(expr: ast.expr) -> bool:
    if isinstance(expr, ast.BinOp):
        return isinstance(expr.op, ast.Div)
    name = _dotted(expr.func) if isinstance(expr, ast.Call) else None
    return name is not None and name.split(".")[-1] in ("div", "divide", "true_divide", "__truediv__")


_CAST_METHODS = frozenset({"float", "half", "bfloat16", "double", "to", "type_as", "type", "contiguous"})


def _is_cast_call(expr: ast.expr) -> bool:
    return (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Attribute)
        and expr.func.attr in _CAST_METHODS
        and not _is_torch_call(expr)
    )


def _bound_arguments(call: ast.Call, names: list[str]) -> dict[str, ast.expr]:
    out = dict(zip(names, call.args, strict=False))
    out.update({k.arg: k.value for k in call.keywords if k.arg})
    return out


def _untransposed(expr: ast.expr, rank: int) -> ast.expr | None:
    """k where `expr` is k with its last two dims swapped, as written (`k.transpose(-2, -1)`, `k.mT`,
    `k.transpose(2, 3)` of a 4-d k, `k.permute(0, 1, 3, 2)`); None otherwise."""
    if isinstance(expr, ast.Attribute) and expr.attr == "mT":
        return expr.value
    if not (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)):
        return None
    numbers = [_int(a) for a in expr.args]
    if any(n is None for n in numbers) or expr.keywords:
        return None
    dims = [n + rank if n is not None and n < 0 else n for n in numbers]
    last_two = {rank - 2, rank - 1}
    if expr.func.attr in ("transpose", "swapaxes", "swapdims") and len(dims) == 2 and set(dims) == last_two:
        return expr.func.value
    if expr.func.attr == "permute" and dims == [*range(rank - 2), rank - 1, rank - 2]:
        return expr.func.value
    if expr.func.attr == "t" and not dims and rank == 2:
        return expr.func.value
    return None


def _int(node: ast.expr) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int(node.operand)
        return -inner if inner is not None else None
    return None


def _repeat_source(expr: ast.expr, node: Node) -> ast.expr | None:
    """The tensor whose heads a repeat's expression repeats: `k.repeat_interleave(n, dim=1)`'s k,
    `torch.repeat_interleave(k, n, dim=1)`'s, `v[:, :, None].expand(...).reshape(...)`'s v, a helper's
    first argument (`repeat_kv(k, n_rep)`)."""
    if not isinstance(expr, ast.Call):
        return None
    if isinstance(expr.func, ast.Attribute) and expr.func.attr == "repeat_interleave":
        return expr.args[0] if _is_torch_call(expr) and expr.args else expr.func.value
    if isinstance(expr.func, ast.Attribute) and expr.func.attr == "reshape":
        expanded = expr.func.value
        if (
            isinstance(expanded, ast.Call)
            and isinstance(expanded.func, ast.Attribute)
            and expanded.func.attr == "expand"
        ):
            indexed = expanded.func.value
            if isinstance(indexed, ast.Subscript):
                return indexed.value
        return None
    if isinstance(expr.func, ast.Name) and expr.args and node.stack and node.stack[0].function != "":
        return expr.args[0]  # a helper of the model's (its ops are in it)
    return None


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _text(source: str, node: ast.expr) -> str:
    segment = ast.get_source_segment(source, node)
    return segment if segment is not None else ast.unparse(node)


_ATOMS = (ast.Name, ast.Attribute, ast.Call, ast.Constant, ast.Subscript)


def _atom(node: ast.expr, text: str) -> str:
    """`text` (of `node`) as an operand of a binary operator or an attribute: parenthesized unless atomic."""
    if isinstance(node, _ATOMS) and not (
        isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and node.value < 0
    ):
        return text
    return f"({text})"


def _atom_text(text: str) -> str:
    return text if text.replace(".", "").replace("_", "").isalnum() else f"({text})"


_FLIPPED = {ast.Eq: "!=", ast.NotEq: "==", ast.Lt: ">=", ast.GtE: "<", ast.Gt: "<=", ast.LtE: ">"}


def _negated(source: str, mask: ast.expr) -> str:
    """The positions a boolean mask keeps, where `masked_fill(mask, -inf)` fills `mask`'s: a comparison
    flipped (`== 0` becomes `!= 0`), a negation taken off, else `~mask`."""
    if isinstance(mask, ast.Compare) and len(mask.ops) == 1 and type(mask.ops[0]) in _FLIPPED:
        flipped = _FLIPPED[type(mask.ops[0])]
        return f"{_text(source, mask.left)} {flipped} {_text(source, mask.comparators[0])}"
    if isinstance(mask, ast.UnaryOp) and isinstance(mask.op, ast.Invert):
        return _text(source, mask.operand)
    return f"~{_atom(mask, _text(source, mask))}"


def _replaced(tree: ast.expr, span: tuple[int, int, int, int], by: ast.expr) -> ast.expr:
    """A copy of `tree` with the subexpression at `span` put as `by`."""

    class Put(ast.NodeTransformer):
        def visit(self, node: ast.AST) -> ast.AST:
            if isinstance(node, ast.expr) and _span(node) == span:
                return by
            return super().visit(node)

    replaced = Put().visit(copy.deepcopy(tree))
    assert isinstance(replaced, ast.expr)
    return replaced


def _check_whole_lines(lines: list[str], statements: list[_Statement]) -> None:
    """Each statement of the range on lines of its own: a line it shares with other code (`a = 1; b = 2`)
    cannot be taken out or rewritten as a whole."""
    for st in statements:
        node = st.node
        start = lines[node.lineno - 1]
        before = start.encode()[: node.col_offset].decode(errors="replace")
        end_line = lines[(node.end_lineno or node.lineno) - 1].encode()
        after = end_line[node.end_col_offset or 0 :].decode(errors="replace").strip()
        if before.strip() or (after and not after.startswith("#")):
            raise _Refused("elsewhere", f"line {node.lineno} holds other code beside the attention's statement")


def _replace_span(lines: list[str], statement: ast.stmt, span: tuple[int, int, int, int], text: str) -> str:
    """The lines of `statement` with the expression at `span` written as `text`."""
    first, last = statement.lineno, statement.end_lineno or statement.lineno
    block = [line.encode() for line in lines[first - 1 : last]]
    line0, col0, line1, col1 = span
    head = b"".join(block[: line0 - first]) + block[line0 - first][:col0]
    tail = block[line1 - first][col1:] + b"".join(block[line1 - first + 1 :])
    return (head + text.encode() + tail).decode()


_WIDTH = 100  # a written line longer than this has its call's arguments on lines of their own


def _call_statement(lines: list[str], statement: ast.stmt, span: tuple[int, int, int, int], call: str) -> str:
    """The product's statement with the call in place of the product: the parentheses the product stood
    in (`(attn @ v).transpose(1, 2)`) dropped, and the arguments on lines of their own where the line
    would be long, as a formatter writes them."""
    span = _without_parentheses(lines, span)
    one_line = _replace_span(lines, statement, span, call)
    if max(len(line) for line in one_line.splitlines()) <= _WIDTH or "\n" in call:
        return one_line
    callee, arguments = call.split("(", 1)
    arguments, _, after = arguments.rpartition(")")
    indent = " " * (len(lines[statement.lineno - 1]) - len(lines[statement.lineno - 1].lstrip()))
    inner = indent + "    "
    if len(inner) + len(arguments) + 1 <= _WIDTH:
        body = f"{inner}{arguments}\n"
    else:
        body = "".join(f"{inner}{argument},\n" for argument in _split_arguments(arguments))
    return _replace_span(lines, statement, span, f"{callee}(\n{body}{indent}){after}")


def _split_arguments(arguments: str) -> list[str]:
    """A call's argument list split at its top-level commas."""
    out, depth, start, quote = [], 0, 0, ""
    for i, ch in enumerate(arguments):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(arguments[start:i].strip())
            start = i + 1
    out.append(arguments[start:].strip())
    return [a for a in out if a]


def _without_parentheses(lines: list[str], span: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """`span` with the parentheses right around it, which a call no longer needs (never a call's own)."""
    line0, col0, line1, col1 = span
    head = lines[line0 - 1].encode()[:col0].rstrip()
    tail = lines[line1 - 1].encode()[col1:].lstrip()
    if head.endswith(b"(") and tail.startswith(b")"):
        before = head[:-1].rstrip()
        if not before or not (before[-1:].isalnum() or before[-1:] in (b"_", b")", b"]")):
            return line0, len(head) - 1, line1, col1 + (len(lines[line1 - 1].encode()[col1:]) - len(tail)) + 1
    return span


def _call_text(callee: str, form: _Form) -> str:
    args = [form.q, form.k, form.v]
    if form.score_mod:
        body = form.score_mod
        if form.causal:
            body = f"torch.where(q_idx >= kv_idx, {body}, -float('inf'))"
        args.append(f"score_mod=lambda score, b, h, q_idx, kv_idx: {body}")
    else:
        if form.mask:
            args.append(f"attn_mask={form.mask}")
        if form.dropout:
            args.append(f"dropout_p={form.dropout}")
        if form.causal:
            args.append("is_causal=True")
    if len(form.scale) > 1:
        scale = " * ".join(f"({factor})" if " " in factor else factor for factor in form.scale)
    else:
        scale = form.scale[0] if form.scale else "1.0"
    args.append(f"scale={scale}")
    if form.gqa:
        args.append("enable_gqa=True")
    return f"{callee}({', '.join(args)})"


def _top_level_bindings(tree: ast.Module) -> list[tuple[str, str]]:
    out = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                out.append((a.asname, a.name) if a.asname else (a.name.split(".")[0], a.name.split(".")[0]))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out += [(a.asname or a.name, f"{node.module}.{a.name}") for a in node.names]
    return out


def _functional_name(tree: ast.Module) -> tuple[str, list[str]]:
    """How the file names `F.scaled_dot_product_attention`, and the import to add where it names none."""
    bindings = _top_level_bindings(tree)
    for local, target in bindings:
        if target == "torch.nn.functional":
            return f"{local}.{SDPA}", []
    for local, target in bindings:
        if target == "torch.nn":
            return f"{local}.functional.{SDPA}", []
    if any(local == "F" for local, _ in bindings) or _assigns_at_top(tree, "F"):
        if any(local == "torch" and target == "torch" for local, target in bindings):
            return f"torch.nn.functional.{SDPA}", []
        return f"torch.nn.functional.{SDPA}", ["import torch"]
    return f"F.{SDPA}", ["import torch.nn.functional as F"]


def _flex_name(tree: ast.Module) -> tuple[str, list[str]]:
    bindings = _top_level_bindings(tree)
    for local, target in bindings:
        if target == f"{FLEX_MODULE}.flex_attention":
            return local, []
    if any(local == "flex_attention" for local, _ in bindings) or _assigns_at_top(tree, "flex_attention"):
        return f"{FLEX_MODULE}.flex_attention", ["import torch.nn.attention.flex_attention"]
    return "flex_attention", [f"from {FLEX_MODULE} import flex_attention"]


def _assigns_at_top(tree: ast.Module, name: str) -> bool:
    return any(name in _bound(node) for node in tree.body) or any(
        isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name for node in tree.body
    )


def _torch_has(version: str) -> bool:
    have = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2] if p.isdigit())
    return have >= tuple(int(p) for p in version.split("."))


def _has_flex() -> bool:
    try:
        return importlib.util.find_spec(FLEX_MODULE) is not None
    except (ImportError, ValueError):
        return False


# ---- a mask's values, where they follow from its code ---------------------------------------------


def _evaluate_mask(graph: Graph, node_id: int, n: int, depth: int = 0) -> torch.Tensor | None:
    """The mask's values over its last two dims at n×n, where they follow from a buffer of known
    values (`Graph.triangles`) or a factory of ones, sliced from the corner, and the elementwise ops
    a causal mask is written with (a triangle, a comparison with 0 or 1, a negation, a cast to bool);
    None where they do not."""
    if depth > 16:
        return None
    node = graph[node_id]
    meta = node.meta
    if meta is None or len(meta.shape) < 2 or tuple(meta.shape[-2:]) != (n, n):
        return None
    if node.op == "buffer":
        kind = graph.triangles.get(node.name)
        if kind is None:
            return None
        lower = torch.ones(n, n).tril()
        return lower if kind == "tril" else 1 - lower
    if node.op == "ones":
        return torch.ones(n, n)
    inputs = node.inputs
    if not inputs:
        return None
    if node.op in ("tril", "triu"):
        inner = _evaluate_mask(graph, inputs[0], n, depth + 1)
        diagonal = node.params.get("diagonal")
        if inner is None or not isinstance(diagonal, int):
            return None
        return inner.tril(diagonal) if node.op == "tril" else inner.triu(diagonal)
    if node.cls.free:
        if node.op == "getitem" and not _corner_slice(node):
            return None
        source = graph[inputs[0]].meta
        if source is None or len(source.shape) < 2:
            return None
        if tuple(source.shape[-2:]) != (n, n):
            if node.op != "getitem":
                return None
            whole = (
                _evaluate_mask(graph, inputs[0], source.shape[-1], depth + 1)
                if source.shape[-1] == source.shape[-2]
                else None
            )
            return whole[:n, :n] if whole is not None else None
        return _evaluate_mask(graph, inputs[0], n, depth + 1)
    inner = _evaluate_mask(graph, inputs[0], n, depth + 1)
    if inner is None:
        return None
    numbers = [a for a in node.args if not isinstance(a, Ref)]
    if node.op in ("eq", "ne") and len(numbers) == 1 and numbers[0] in (0, 1) and len(node.refs) == 1:
        return (inner == numbers[0]) if node.op == "eq" else (inner != numbers[0])
    if node.op in ("logical_not", "bitwise_not"):
        return inner == 0
    if node.op == "cast" and node.params.get("dtype") == "bool":
        return inner != 0
    if node.op in ("cast", "to_same"):
        return inner
    return None


def _corner_slice(node: Node) -> bool:
    """A getitem whose steps, on the last two dims, slice from their first element one by one."""
    meta = node.meta
    if meta is None:
        return False
    rank = len(meta.shape)
    for step in node.params.get("steps", []):
        kind = step[0]
        if kind == "slice":
            _, dim, start, stride = step
            if dim >= rank - 2 and (start, stride) != (0, 1):
                return False
        elif kind == "select" and step[1] >= rank - 2:
            return False
    return True


def _named(name: str, at: ast.expr) -> ast.Name:
    """A name read at `at`'s place (for the check that the call reads it as the code did)."""
    node = ast.Name(name, ast.Load())
    return ast.copy_location(node, at)


def _binds(tree: ast.Module, local: str, target: str) -> bool:
    return (local, target) in _top_level_bindings(tree)
