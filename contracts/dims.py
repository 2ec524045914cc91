"""Dynamic sizes: a dimension of a model's inputs declared as a named range instead of a number.

A decoder sees every sequence length, a server batches 1..64: an input shape may name a
size (`["batch", "seq", 4096]`) and declare its range, and optionally the sizes to answer
at (the corpus).  Each place a configuration can be given spells a declaration its own way,
and each is parsed here into the same `DimRange`:

- `[tool.fuselens.models.<C>]` and the editor's `fuselens.models.<C>`:
  `dims = { seq = { min = 1, max = 8192, corpus = [1, 128, 2048, 8192] } }`;
- the class-line comment: `dims=seq:1..8192@1,128,2048,8192` (several: `;` between them);
- the command line: `--dim seq=1..8192@1,128,2048,8192` (one per `--dim`).

Without a corpus, `default_corpus` chooses one: the minimum, up to three powers of two spread
evenly between, and the maximum.  The analysis itself runs at one concrete size per symbol,
the middle of its corpus (`DimRange.binding`), so that everything a concrete shape gives
holds unchanged; the dynamic answers come on top of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

MAX_CORPUS = 16  # sizes per symbol: each is a row of the per-shape table


class DimError(ValueError):
    """A malformed declaration of a dynamic size; the message names where it came from."""


@dataclass
class DimRange:
    """A size an input dimension takes: every integer in `min..max`, answered at `corpus`."""

    name: str
    min: int
    max: int
    corpus: list[int] = field(default_factory=list)  # ascending, within min..max
    corpus_given: bool = True  # False: `default_corpus` chose it

    @property
    def binding(self) -> int:
        """The size the concrete analysis runs at: the middle of the corpus (its upper middle)."""
        return self.corpus[len(self.corpus) // 2]

    def describe(self) -> str:
        return f"{self.name} = {self.min}..{self.max} at {', '.join(map(str, self.corpus))}"


def default_corpus(low: int, high: int) -> list[int]:
    """The minimum, up to three powers of two spread evenly (by exponent) strictly between, the maximum."""
    first = math.floor(math.log2(low)) + 1 if low > 0 else 0
    last = math.ceil(math.log2(high)) - 1 if high > 1 else -1
    exponents = list(range(first, last + 1))
    if len(exponents) > 3:
        step = (len(exponents) - 1) / 2
        exponents = sorted({exponents[round(i * step)] for i in range(3)})
    return sorted({low, *(2**e for e in exponents if low < 2**e < high), high})


def make_range(name: str, low: Any, high: Any, corpus: Any, where: str) -> DimRange:
    """A checked `DimRange`: a name, 1 <= min <= max, a corpus of sizes within the range."""
    if not isinstance(name, str) or not name.isidentifier():
        raise DimError(f"{where}: {name!r} is not a name a size can have (letters, digits, _)")
    for label, value in (("min", low), ("max", high)):
        if not _is_int(value) or value < 1:
            raise DimError(f"{where}: {name}.{label} must be a positive integer, not {value!r}")
    if low > high:
        raise DimError(f"{where}: {name} has min {low} > max {high}")
    if corpus is None:
        return DimRange(name, low, high, default_corpus(low, high), corpus_given=False)
    if not isinstance(corpus, list) or not corpus or not all(_is_int(c) for c in corpus):
        raise DimError(f"{where}: {name}.corpus must be a non-empty list of sizes, e.g. [1, 128, 2048]")
    outside = [c for c in corpus if not low <= c <= high]
    if outside:
        raise DimError(f"{where}: {name}.corpus has {', '.join(map(str, outside))} outside its range {low}..{high}")
    sizes = sorted(set(corpus))
    if len(sizes) > MAX_CORPUS:
        raise DimError(f"{where}: {name}.corpus has {len(sizes)} sizes; at most {MAX_CORPUS}")
    return DimRange(name, low, high, sizes)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---- settings tables: pyproject.toml and the editor's ------------------------------------------

_TABLE_KEYS = ("min", "max", "corpus")


def dims_table(value: Any, where: str) -> dict[str, DimRange]:
    """`{ seq = { min = 1, max = 8192, corpus = [...] } }` as `DimRange`s, by name."""
    if not isinstance(value, dict):
        raise DimError(f"{where}.dims must be a table such as {{ seq = {{ min = 1, max = 8192 }} }}")
    out = {}
    for name, entry in value.items():
        here = f"{where}.dims.{name}"
        if not isinstance(entry, dict):
            raise DimError(f"{here} must be a table such as {{ min = 1, max = 8192 }}")
        unknown = sorted(set(entry) - set(_TABLE_KEYS))
        if unknown:
            raise DimError(f"{here}: unknown key {unknown[0]!r} (known: {', '.join(_TABLE_KEYS)})")
        for key in ("min", "max"):
            if key not in entry:
                raise DimError(f"{here} needs {key}")
        out[name] = make_range(name, entry["min"], entry["max"], entry.get("corpus"), where)
    return out


# ---- the command line and the class-line comment ------------------------------------------------


def parse_dim(text: str, where: str, separator: str = "=") -> DimRange:
    """`seq=1..8192@1,128,2048` (`separator` is `=` on the command line, `:` in a comment)."""
    example = f"seq{separator}1..8192@1,128,2048,8192"
    name, found, rest = text.partition(separator)
    if not found:
        raise DimError(f"{where}: {text!r} must look like {example}")
    bounds, at, corpus_text = rest.partition("@")
    low_text, dots, high_text = bounds.partition("..")
    if not dots:
        raise DimError(f"{where}: {text!r} needs a range min..max, as in {example}")
    low, high = _integer(low_text, text, where), _integer(high_text, text, where)
    corpus = [_integer(c, text, where) for c in corpus_text.split(",")] if at else None
    return make_range(name.strip(), low, high, corpus, where)


def parse_dims(text: str, where: str, separator: str = "=") -> dict[str, DimRange]:
    """Several declarations separated by `;`: `batch:1..64;seq:1..8192@1,128`."""
    out = {}
    for part in text.split(";"):
        if part.strip():
            dim = parse_dim(part.strip(), where, separator)
            if dim.name in out:
                raise DimError(f"{where}: {dim.name} is declared twice")
            out[dim.name] = dim
    return out


def _integer(text: str, whole: str, where: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise DimError(f"{where}: {text.strip()!r} in {whole!r} is not an integer") from None
