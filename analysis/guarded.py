"""The code that replaces a region: the kernel where it computes what the lines do, the lines elsewhere.

A kernel is made for what the analysis saw: tensors of some ranks, dtypes and size relations, on a
device it runs on, the modules the lines call set up as they were, the mode they ran in.  The same
lines run for every call of their function (another layer's norm at another rank, a model set up
otherwise, training), so the rewritten code asks each kernel first and keeps the original lines for
every call no kernel takes:

    if cluster0.fits(x, self.weight, self.eps):
        return cluster0(x, self.weight, self.eps)
    else:
        h = x.float()
        ...

or, for an expression the call stands in for on its line,
`x = cluster0(x) if cluster0.fits(x) else F.relu(x * 2.0)`.  Several kernels made for the same lines
(one a rank) are asked in turn (`elif`).

An input the code computes there (`self.gate_proj(x)`, `q @ k.transpose(-2, -1)`) is evaluated once,
in the question (`gate_proj := self.gate_proj(x)`), and both the kernel's call and the original lines
read it from that name.  A convolution whose bias add the kernel takes runs ahead of the question
without its bias; where no kernel runs, its bias is added back before the original lines go on.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .regions import NoRegion, Region, Span, _contains, _replaced, _text


@dataclass(frozen=True)
class Alternative:
    """One kernel the rewritten code may call: as the code reaches it (`cluster0`,
    `_fuselens_llama_kernels.cluster0`), and whether its `fits` checks modules the lines call (it is
    then given the function's `self`)."""

    call: str
    module: bool = False


@dataclass
class Guarded:
    """The text of lines `first`..`last` rewritten; for an in-place expression also the expression that
    stands where the original one stood (`replaced` -> `expression`)."""

    text: str
    replaced: str = ""
    expression: str = ""


def guarded(region: Region, alternatives: list[Alternative], lines: list[str], carried: int = 0) -> Guarded:
    """Lines `region.first`..`region.last` of `lines` rewritten to ask each kernel of `alternatives`
    in turn, and to run the original lines where none fits.  `carried`: the statements to run ahead
    that end on a line up to it are left out (another rewrite that ends there writes them:
    `carried_ahead`)."""
    if not alternatives:
        raise ValueError("no kernel to call")
    temps = _temporaries(region)
    if temps and region.conditions:
        # The `if`s are asked first (the arguments may need them: `self.norm.weight` where `self.norm` may
        # be None), so where they fail the arguments the question computes would not be there for the
        # lines: the tests then choose between the kernels' form, asked without them, and the lines.
        if not region.conditions_first:
            raise NoRegion("its code computes the kernel's inputs inside `if`s whose tests read what runs ahead of it")
        return _under_conditions(region, guarded(replace(region, conditions=[]), alternatives, lines), lines)
    asked = _arguments(region, temps, bind=True)
    passed = _arguments(region, temps, bind=False)
    paths = "".join(f"{condition} and " for condition in region.conditions)  # the `if`s the lines sit in
    made = f", made=({', '.join(c.path for c in region.made)},)" if region.made else ""
    questions = [
        f"{paths}{a.call}.fits({', '.join(asked if k == 0 else passed)}{', module=self' if a.module else ''}{made})"
        for k, a in enumerate(alternatives)
    ]
    span = region.in_place
    if span is not None:
        return _in_place(region, alternatives, questions, passed, temps, lines, span)
    return _statements(region, alternatives, questions, passed, temps, lines, carried)


def dispatched(regions: list[Region], written: list[Guarded], lines: list[str]) -> Guarded:
    """The same lines rewritten for kernels that need them rewritten in different ways (ResnetBlock2D's
    shortcut convolution, run in some blocks and not in others): each rewrite (`written`, by
    `guarded`) runs where the tests of the `if`s its kernels' ops sit in hold, the lines as written
    where none does.  A rewrite asked on no test can only be the last."""
    if any(r.in_place is not None for r in regions):
        raise NoRegion("a rewrite of an expression in place cannot be chosen among others")
    if any(not r.conditions or not r.conditions_first for r in regions[:-1]):
        raise NoRegion("no test tells where each rewrite runs")
    first, last = regions[0].first, regions[0].last
    indent = lines[first - 1][: len(lines[first - 1]) - len(lines[first - 1].lstrip())]
    out = []
    for k, (region, text) in enumerate(zip(regions, written, strict=True)):
        if region.conditions and region.conditions_first:
            out.append(f"{indent}{'if' if k == 0 else 'elif'} {' and '.join(region.conditions)}:\n")
        elif k == 0:
            raise NoRegion("no test tells where each rewrite runs")
        else:
            out.append(f"{indent}else:\n")
        out.append(_indented(text.text, indent))
    if regions[-1].conditions and regions[-1].conditions_first:
        out.append(f"{indent}else:\n")
        out.append(_indented("".join(line + "\n" for line in lines[first - 1 : last]), indent))
    return Guarded("".join(out))


def _under_conditions(region: Region, written: Guarded, lines: list[str]) -> Guarded:
    """`written` (a rewrite asked on no test) where the tests of the region's `if`s hold, the code as
    written elsewhere."""
    tests = " and ".join(region.conditions)
    if written.expression:  # an expression in place: a conditional expression around it
        span = region.in_place
        assert span is not None
        return _in_line(lines, span, f"({written.expression}) if {tests} else {written.replaced}", written.replaced)
    first = lines[region.first - 1]
    indent = first[: len(first) - len(first.lstrip())]
    original = "".join(line + "\n" for line in lines[region.first - 1 : region.last])
    return Guarded(
        f"{indent}if {tests}:\n{_indented(written.text, indent)}{indent}else:\n{_indented(original, indent)}"
    )


def carried_ahead(region: Region, line: int) -> str | None:
    """The convolution module whose call without its bias is all the region runs ahead on `line` (its
    first), when another rewrite ends on that line: that rewrite can carry the statement, made without
    the bias in each of its branches (`unbiased_calls`), and this one leaves it out (`carried`)."""
    if region.conditions and _temporaries(region):
        return None  # its rewrite runs under the tests, and the lines as written else (`_under_conditions`)
    on_line = [span for span in region.ahead if span[0] <= line]
    unbiased = [(stmt, call) for stmt, call, _ in region.unbiased_statements if stmt[0] <= line]
    if line != region.first or not on_line or len(unbiased) != 1 or on_line != [unbiased[0][0]]:
        return None
    bias, _ = region.biases.get(unbiased[0][1], ("", 0))
    return bias.removesuffix(".bias") if bias.endswith(".bias") else None


def unbiased_calls(text: str, conv: str) -> str:
    """`text` (lines of code) with each call of the convolution module `conv` on one value
    (`self.conv2(h)`) made without its bias, as the kernel after it adds the bias."""
    prefix = "if True:\n"
    tree = ast.parse(prefix + text)
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == conv and len(n.args) == 1 and not n.keywords
    ]
    lines = [line.encode() for line in text.splitlines()]
    chunk: list[bytes | None] = list(lines)
    for call in sorted(calls, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        arg = call.args[0]
        span = (call.lineno - 1, call.col_offset, (call.end_lineno or call.lineno) - 1, call.end_col_offset or 0)
        inner = _text(
            [line.decode() for line in lines],
            (arg.lineno - 1, arg.col_offset, (arg.end_lineno or 0) - 1, arg.end_col_offset or 0),
        )
        chunk = _replaced(chunk, 1, span, f"{conv}._conv_forward({inner}, {conv}.weight, None)".encode())
    return "".join(c.decode() + "\n" for c in chunk if c is not None)


def _temporaries(region: Region) -> dict[int, str]:
    """A new name for each argument the code computes where it stands (argument index -> name)."""
    taken = set(region.taken)
    temps: dict[int, str] = {}
    for k, span in enumerate(region.argument_spans):
        if span is None:
            continue
        base = _name_for(region.arguments[k]) or f"fused_in{k}"
        name, n = base, 1
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        taken.add(name)
        temps[k] = name
    return temps


def _name_for(text: str) -> str:
    """`gate_proj` for `self.gate_proj(x)`, `matmul` for `torch.matmul(q, k)`; "" for an operator."""
    try:
        node: ast.AST = ast.parse(text, mode="eval").body
    except SyntaxError:
        return ""
    while isinstance(node, (ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    if isinstance(node, ast.Attribute) and node.attr == "_conv_forward":  # `self.skip._conv_forward(...)`: skip
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _arguments(region: Region, temps: dict[int, str], bind: bool) -> list[str]:
    """The call's arguments: each computed one by its new name, bound to its text where `bind`."""
    return [
        (f"{temps[k]} := {text}" if bind else temps[k]) if k in temps else text
        for k, text in enumerate(region.arguments)
    ]


def _fallback_text(
    region: Region, temps: dict[int, str], lines: list[str], within: Span, skip: Sequence[Span] = ()
) -> str:
    """The whole lines of span `within` as the code wrote them, each computed argument read from its new
    name (a convolution that ran without its bias gets it added back), less the statements `skip`."""
    lo, hi = within[0], within[2]
    replaced: list[tuple[Span, str]] = []
    for k, name in temps.items():
        span = region.argument_spans[k]
        if span is not None and _contains(within, span) and not any(_contains(s, span) for s in skip):
            replaced.append((span, _with_bias(name, *region.biases[span]) if span in region.biases else name))
    replaced += [(span, "") for span in skip if _contains(within, span)]
    chunk: list[bytes | None] = [line.encode() for line in lines[lo - 1 : hi]]
    for span, text in sorted(replaced, key=lambda e: e[0], reverse=True):
        chunk = _replaced(chunk, lo, span, text.encode())
    return "".join(c.decode() + "\n" for c in chunk if c is not None)


def _with_bias(name: str, bias: str, spatial: int, bare: bool = False) -> str:
    """`name`, a convolution's result without its bias, with the bias the code passed added back
    (parenthesised unless `bare`)."""
    if not bias:
        raise NoRegion("the convolution's bias is not spelled out where it is called")
    view = ", ".join([":"] + ["None"] * spatial)
    added = f"{name} if {bias} is None else {name} + {bias}[{view}]"
    return added if bare else f"({added})"


# ---- an expression in place ------------------------------------------------------------------


def _in_place(
    region: Region,
    alternatives: list[Alternative],
    questions: list[str],
    passed: list[str],
    temps: dict[int, str],
    lines: list[str],
    span: Span,
) -> Guarded:
    original = _text(lines, span)
    fallback = _rebased_fallback(region, temps, lines, span)
    chosen = " else ".join(
        f"{a.call}({', '.join(passed)}) if {q}" for a, q in zip(alternatives, questions, strict=True)
    )
    return _in_line(lines, span, f"{chosen} else {fallback}", original)


def _in_line(lines: list[str], span: Span, expression: str, original: str) -> Guarded:
    """The line holding `span` with `expression` (a conditional one) where `original` stood,
    parenthesised unless it is the statement's whole value or a call's one argument."""
    text = lines[span[0] - 1]
    bare = _is_whole_value(text, span) or _is_only_argument(text, span)
    written = expression if bare else f"({expression})"
    line = text.encode()
    return Guarded((line[: span[1]] + written.encode() + line[span[3] :]).decode() + "\n", original, written)


def _rebased_fallback(region: Region, temps: dict[int, str], lines: list[str], span: Span) -> str:
    """The expression at `span` with each computed argument read from its new name."""
    line = _fallback_text(region, temps, lines, span).rstrip("\n").encode()
    tail = len(lines[span[0] - 1].encode()) - span[3]
    return line[span[1] : len(line) - tail].decode()


def _is_whole_value(line: str, span: Span) -> bool:
    """Whether the expression at `span` is the whole value of the statement on `line` (`x = <it>`,
    `return <it>`): the conditional expression then needs no parentheses."""
    stripped = line.lstrip()
    offset = len(line.encode()) - len(stripped.encode())
    try:
        statement = ast.parse(stripped).body[0]
    except (SyntaxError, IndexError):
        return False
    value = getattr(statement, "value", None)
    if not isinstance(statement, (ast.Assign, ast.AnnAssign, ast.Return)) or value is None:
        return False
    return (value.col_offset + offset, value.end_col_offset + offset) == (span[1], span[3]) and (
        value.lineno == value.end_lineno == 1
    )


def _is_only_argument(line: str, span: Span) -> bool:
    """Whether the expression at `span` is the one argument of a call (`f(<it>)`), which parenthesises it."""
    encoded = line.encode()
    return encoded[: span[1]].rstrip().endswith(b"(") and encoded[span[3] :].lstrip().startswith(b")")


# ---- statements --------------------------------------------------------------------------------


def _statements(
    region: Region,
    alternatives: list[Alternative],
    questions: list[str],
    passed: list[str],
    temps: dict[int, str],
    lines: list[str],
    carried: int = 0,
) -> Guarded:
    first = lines[region.first - 1]
    indent = first[: len(first) - len(first.lstrip())]
    whole = (region.first, 0, region.last, len(lines[region.last - 1].encode()))
    # The statements that stay before the call run first, as the kernel's call needs them (a convolution
    # without its bias); then each kernel is asked, and else the rest of the lines run as written.
    out = [region.rewrite_spans(alternatives[0].call, lines, span) for span in region.ahead if span[2] > carried]
    for k, (alternative, question) in enumerate(zip(alternatives, questions, strict=True)):
        out.append(f"{indent}{'if' if k == 0 else 'elif'} {question}:\n")
        body = region.rewrite_spans(alternative.call, lines, whole, passed, region.ahead)
        out.append(_indented(body, indent))
    out.append(f"{indent}else:\n")
    restored = "".join(_restored(region, call, name, indent) for _, call, name in region.unbiased_statements)
    out.append(_indented(restored + _fallback_text(region, temps, lines, whole, region.ahead), indent))
    return Guarded("".join(out))


def _restored(region: Region, call: Span, name: str, indent: str) -> str:
    """The statement that adds back the bias of the convolution at `call`, bound to `name`, where no
    kernel ran: under the tests of the `if`s it sits in (where they fail, the convolution did not run)."""
    statement = f"{name} = {_with_bias(name, *region.biases[call], bare=True)}\n"
    conditions = region.unbiased_conditions.get(call, [])
    if not conditions:
        return f"{indent}{statement}"
    return f"{indent}if {' and '.join(conditions)}:\n{indent}    {statement}"


def _indented(text: str, indent: str) -> str:
    """`text` (lines of code at `indent` or deeper) one level deeper, as the body of an `if`."""
    lines = text.splitlines(keepends=True)
    while lines and not lines[0].strip():  # what went ahead may leave blank lines at the top
        lines.pop(0)
    lines = [line for k, line in enumerate(lines) if line.strip() or (k and lines[k - 1].strip())]  # and twice
    if not lines:
        return f"{indent}    pass\n"
    return "".join(f"    {line}" if line.strip() else line for line in lines)
