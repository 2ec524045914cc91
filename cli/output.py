"""Where the commands print: a terminal gets rich's colours at its width; a pipe or a log gets every line
whole, never wrapped or cut at a width it does not have."""

from __future__ import annotations

from rich.console import Console
from rich.syntax import Syntax

PIPED_WIDTH = 160  # tables in a pipe or a log: wide enough for one row per cluster


def console_for_output() -> Console:
    """The console a command prints to: the terminal's, or (piped) one whose text lines are never wrapped."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=PIPED_WIDTH, soft_wrap=True)
    return console


def print_diff(console: Console, diff: str) -> None:
    """A unified diff: coloured on a terminal (long lines wrapped, never cut); as written elsewhere, so
    that it can be applied with `patch` or read whole."""
    if console.is_terminal:
        console.print(Syntax(diff, "diff", theme="ansi_dark", word_wrap=True))
        return
    console.file.write(diff)
    console.file.flush()
