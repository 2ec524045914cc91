"""Python source written line by line at an indentation level: what the kernel and launcher printers
write into, so that a block's lines are indented by the block they are written in, never by hand."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

_TAB = "    "


class CodeBuffer:
    """Lines of code, each written at the indentation of the blocks open when it is written."""

    def __init__(self, lines: Iterable[str] = ()) -> None:
        self._lines: list[str] = []
        self._depth = 0
        self.write(*lines)

    def write(self, *texts: str) -> CodeBuffer:
        """Each text's lines at the current indentation (a blank line stays blank)."""
        for text in texts:
            for line in text.split("\n"):
                self._lines.append(_TAB * self._depth + line if line else "")
        return self

    def splice(self, other: CodeBuffer) -> CodeBuffer:
        """`other`'s lines, indented by the blocks open here."""
        return self.write(*other.lines())

    @contextmanager
    def indent(self) -> Iterator[CodeBuffer]:
        """Lines written inside are one level deeper."""
        self._depth += 1
        try:
            yield self
        finally:
            self._depth -= 1

    @contextmanager
    def block(self, header: str) -> Iterator[CodeBuffer]:
        """`header` (`if CONTIG:`, `for ...:`), then the lines written inside, one level deeper."""
        self.write(header)
        with self.indent():
            yield self

    def branches(self, condition: str, then: CodeBuffer, otherwise: CodeBuffer, note: str = "") -> CodeBuffer:
        """`if condition:` (with a trailing `note`) over `then`, `else:` over `otherwise`."""
        with self.block(f"if {condition}:" + (f"  # {note}" if note else "")):
            self.splice(then)
        with self.block("else:"):
            self.splice(otherwise)
        return self

    def lines(self) -> list[str]:
        return list(self._lines)

    def text(self) -> str:
        return "\n".join(self._lines)
