"""Index and value terms: what the planner computes a kernel's coordinates, addresses and values as.

A term is a small tree of frozen dataclasses.  Its leaves say what they are: a domain coordinate
(`Dim`, printed `c<i>`), a statement's value (`Value`, `v<n>`), an input's stride (`Stride`,
`in<k>_s<j>`), a load of an input at coordinates (`Load`), a name the kernel has (`Name`: the row
width `C`, a number of the model's `sc<k>`) or a literal (`Lit`).  Operators, calls and methods join
them, and `Paren` is a pair of parentheses where the kernel's text has them.  `str(term)` is the
Triton text the kernel holds; the passes that ask what a term reads (which coordinates, which loaded
values) walk it (`dims`, `values`) and never read that text back.

Operators print as written, without parentheses of their own: a tree whose text would group
otherwise (a sum under a product, a comparison under another) is refused where it is built.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

# How tightly each operator binds, as Python (and Triton's frontend) parse them.
_BINDS = {
    "<": 1,
    "<=": 1,
    ">": 1,
    ">=": 1,
    "==": 1,
    "!=": 1,
    "|": 2,
    "^": 3,
    "&": 4,
    "+": 6,
    "-": 6,
    "*": 7,
    "/": 7,
    "//": 7,
    "%": 7,
}
_UNARY = 8
_ATOM = 10
# Operators whose right operand may be a term of the same operator unparenthesised: `a + b + c`.
_ASSOCIATIVE = frozenset({"+", "*", "&", "|", "^"})


class Term:
    """A kernel expression.  Arithmetic operators build `Bin` terms; comparisons are `compare`'s."""

    __slots__ = ()

    def children(self) -> tuple[Term, ...]:
        return ()

    def binds(self) -> int:
        return _ATOM

    def leaves(self) -> Iterator[Term]:
        """The leaves, in the order the text has them."""
        children = self.children()
        if not children:
            yield self
        for child in children:
            yield from child.leaves()

    def __add__(self, other: TermLike) -> Bin:
        return Bin("+", self, term(other))

    def __sub__(self, other: TermLike) -> Bin:
        return Bin("-", self, term(other))

    def __mul__(self, other: TermLike) -> Bin:
        return Bin("*", self, term(other))

    def __truediv__(self, other: TermLike) -> Bin:
        return Bin("/", self, term(other))

    def __floordiv__(self, other: TermLike) -> Bin:
        return Bin("//", self, term(other))

    def __mod__(self, other: TermLike) -> Bin:
        return Bin("%", self, term(other))

    def __and__(self, other: TermLike) -> Bin:
        return Bin("&", self, term(other))

    def __or__(self, other: TermLike) -> Bin:
        return Bin("|", self, term(other))

    def __xor__(self, other: TermLike) -> Bin:
        return Bin("^", self, term(other))

    def __radd__(self, other: TermLike) -> Bin:
        return Bin("+", term(other), self)

    def __rsub__(self, other: TermLike) -> Bin:
        return Bin("-", term(other), self)

    def __rmul__(self, other: TermLike) -> Bin:
        return Bin("*", term(other), self)

    def __rtruediv__(self, other: TermLike) -> Bin:
        return Bin("/", term(other), self)

    def __neg__(self) -> Unary:
        return Unary("-", self)

    def __invert__(self) -> Unary:
        return Unary("~", self)

    def to(self, dtype: str) -> Method:
        """`self.to(dtype)`: a cast."""
        return Method(self, "to", (Name(dtype),))


TermLike = Term | int | float | str


@dataclass(frozen=True, slots=True)
class Dim(Term):
    """The kernel's coordinate along domain dim `index`."""

    index: int

    def __str__(self) -> str:
        return f"c{self.index}"


@dataclass(frozen=True, slots=True)
class Value(Term):
    """The value of the plan's statement `v<number>`."""

    number: int

    @property
    def name(self) -> str:
        return f"v{self.number}"

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Stride(Term):
    """Input `input`'s stride along its dim `dim`, a kernel argument."""

    input: int
    dim: int

    def __str__(self) -> str:
        return f"in{self.input}_s{self.dim}"


@dataclass(frozen=True, slots=True)
class Name(Term):
    """A name the kernel has: an argument (`C`, `e0`, `sc1`), a Triton one (`tl.float32`), `None`."""

    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class Lit(Term):
    """A literal, as the kernel's text spells it (`1.5`, `float('-inf')`, `0`)."""

    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class Paren(Term):
    inner: Term

    def children(self) -> tuple[Term, ...]:
        return (self.inner,)

    def __str__(self) -> str:
        return f"({self.inner})"


@dataclass(frozen=True, slots=True)
class Bin(Term):
    op: str
    left: Term
    right: Term

    def __post_init__(self) -> None:
        own = _BINDS[self.op]
        right = self.right.binds()
        loose = self.left.binds() < own or right < own or (right == own and self.op not in _ASSOCIATIVE)
        if loose or (own == 1 and (self.left.binds() == 1 or right == 1)):
            raise ValueError(f"`{self}` would group otherwise than its terms: parenthesise an operand")

    def binds(self) -> int:
        return _BINDS[self.op]

    def children(self) -> tuple[Term, ...]:
        return (self.left, self.right)

    def __str__(self) -> str:
        return f"{self.left} {self.op} {self.right}"


@dataclass(frozen=True, slots=True)
class Unary(Term):
    op: str  # "-" | "~"
    operand: Term

    def __post_init__(self) -> None:
        if self.operand.binds() < _UNARY:
            raise ValueError(f"`{self}` would group otherwise than its terms: parenthesise the operand")

    def binds(self) -> int:
        return _UNARY

    def children(self) -> tuple[Term, ...]:
        return (self.operand,)

    def __str__(self) -> str:
        return f"{self.op}{self.operand}"


@dataclass(frozen=True, slots=True)
class Call(Term):
    """`function(args, keyword=value, ...)`."""

    function: str
    args: tuple[Term, ...]
    keywords: tuple[tuple[str, Term], ...] = ()

    def children(self) -> tuple[Term, ...]:
        return (*self.args, *(value for _, value in self.keywords))

    def __str__(self) -> str:
        parts = [str(a) for a in self.args] + [f"{k}={v}" for k, v in self.keywords]
        return f"{self.function}({', '.join(parts)})"


@dataclass(frozen=True, slots=True)
class Method(Term):
    """`target.method(args)`."""

    target: Term
    method: str
    args: tuple[Term, ...] = ()

    def children(self) -> tuple[Term, ...]:
        return (self.target, *self.args)

    def __str__(self) -> str:
        return f"{self.target}.{self.method}({', '.join(map(str, self.args))})"


@dataclass(frozen=True, slots=True)
class Load(Term):
    """The address of input `input`'s element at `coords`: its pointer plus each coordinate times its
    stride (`at`: (dim, coordinate) of each dim the load steps along; none for a single element)."""

    input: int
    at: tuple[tuple[int, Term], ...]

    def binds(self) -> int:
        return _BINDS["+"]

    def children(self) -> tuple[Term, ...]:
        return tuple(c for _, c in self.at)

    def offset(self) -> Term:
        """The element offset, Σ coordinate * stride."""
        terms = [c * Stride(self.input, j) for j, c in self.at]
        if not terms:
            return ZERO
        total: Term = terms[0]
        for t in terms[1:]:
            total = total + t
        return total

    def __str__(self) -> str:
        return f"in{self.input}_ptr + ({self.offset()})"


ZERO = Lit("0")
NONE = Name("None")  # an optional operand left out (a clamp without its lower bound)


def term(value: TermLike) -> Term:
    """`value` as a term: a term itself, a number as its literal, a string as a name."""
    if isinstance(value, Term):
        return value
    if isinstance(value, bool):
        raise TypeError("a bool has no one spelling as a term")
    if isinstance(value, (int, float)):
        return Lit(literal(value))
    return Name(value)


def literal(value: object) -> str:
    """A Python number (or bool) as the kernel's text spells it."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
        text = repr(value)
        return text if ("." in text or "e" in text) else text + ".0"
    raise TypeError(f"constant {value!r} has no Triton literal")


def paren(inner: TermLike) -> Paren:
    return Paren(term(inner))


def call(function: str, *args: TermLike, **keywords: TermLike) -> Call:
    return Call(function, tuple(term(a) for a in args), tuple((k, term(v)) for k, v in keywords.items()))


def compare(left: TermLike, op: str, right: TermLike) -> Bin:
    """`left <op> right` for a comparison (`<`, `==`, ...)."""
    return Bin(op, term(left), term(right))


def all_of(*conditions: Term) -> Term | None:
    """The conditions joined with `&`, or None for none."""
    if not conditions:
        return None
    joined = conditions[0]
    for c in conditions[1:]:
        joined = joined & c
    return joined


def dims(t: Term | None) -> set[int]:
    """The domain coordinates `t` reads."""
    return {leaf.index for leaf in t.leaves() if isinstance(leaf, Dim)} if t is not None else set()


def values(t: Term | None) -> list[str]:
    """The statements whose values `t` reads, by name, in the order its text names them."""
    if t is None:
        return []
    return list(dict.fromkeys(leaf.name for leaf in t.leaves() if isinstance(leaf, Value)))


def reads_values(t: Term) -> bool:
    """Whether `t` reads a value the kernel computed (an index it loaded), not only positions."""
    return any(isinstance(leaf, Value) for leaf in t.leaves())
