"""Torch code as the code generator writes it: expressions that know the variables they read.

A cluster's reference and its gradients are functions of plain torch statements, `    name = expression`.
Which of them a returned value needs, and which parameters they read, decide what the backward keeps
and recomputes; so each expression is a `Code`: its text and the variables it reads, gathered from the
parts it is made of (`var` for a variable, `lit` for text that reads none: a literal, `torch.float16`),
never read back from the text.  `Assign` is one statement.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Code:
    """An expression: its text, and the names of the function's variables it reads."""

    text: str
    reads: frozenset[str] = frozenset()

    def __str__(self) -> str:
        return self.text


def var(name: str) -> Code:
    """A variable of the function: a parameter, or a statement's target."""
    return Code(name, frozenset({name}))


def lit(text: str) -> Code:
    """Text that reads no variable: a literal (`1.0`, `[-1]`), a dtype (`torch.float16`)."""
    return Code(text)


def code(template: str, *parts: Code) -> Code:
    """`template` with each `{}` in it replaced by the next of `parts`; it reads what they read."""
    pieces = template.split("{}")
    if len(pieces) != len(parts) + 1:
        raise ValueError(f"{template!r} has {len(pieces) - 1} places for {len(parts)} parts")
    text = pieces[0] + "".join(f"{part}{piece}" for part, piece in zip(parts, pieces[1:], strict=True))
    return Code(text, frozenset().union(*(part.reads for part in parts)))


def joined(parts: list[Code], separator: str = ", ") -> Code:
    """`parts` one after another, `separator` between them."""
    return Code(separator.join(map(str, parts)), frozenset().union(*(part.reads for part in parts)))


@dataclass(frozen=True)
class Assign:
    """A statement of the function's body: `    target = value`."""

    target: str
    value: Code

    def __str__(self) -> str:
        return f"    {self.target} = {self.value}"

    @property
    def reads(self) -> frozenset[str]:
        return self.value.reads
