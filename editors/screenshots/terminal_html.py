"""A terminal screen, as `tmux capture-pane -e -p` prints it, as an HTML page of the same grid.

    python3 terminal_html.py SCREEN.ansi OUT.html COLS ROWS

Prints the browser window size, "WIDTH,HEIGHT" in pixels, that shows the page exactly, for
`chromium --headless --screenshot --window-size=...`. Each cell sits on a fixed grid, whatever
width the font's glyph for a character has, so box drawing and arrows line up as in the terminal.
"""

from __future__ import annotations

import html
import math
import re
import sys
import unicodedata

FG, BG = "#e0e2ea", "#14161b"  # Neovim's default Normal (NvimLightGrey2 on NvimDarkGrey2)
FONT, LINE, PAD = 14, 18, 12  # px
CELL_WIDTH = 0.602  # of the font size: a DejaVu Sans Mono cell
BASE16 = [
    "#000000", "#cd3131", "#0dbc79", "#e5e510", "#2472c8", "#bc3fbc", "#11a8cd", "#e5e5e5",
    "#666666", "#f14c4c", "#23d18b", "#f5f543", "#3b8eea", "#d670d6", "#29b8db", "#ffffff",
]  # fmt: skip
UNDERLINE_STYLES = {"2": "double", "3": "wavy", "4": "dotted", "5": "dashed"}
SGR = re.compile(r"(\x1b\[[0-9;:]*m)")


def hex_colour(red: int, green: int, blue: int) -> str:
    return f"#{red:02x}{green:02x}{blue:02x}"


def xterm_colour(n: int) -> str:
    """The colour of xterm's 256-colour palette entry `n`."""
    if n < 16:
        return BASE16[n]
    if n < 232:
        n -= 16
        level = [0, 95, 135, 175, 215, 255]
        return hex_colour(level[n // 36], level[n // 6 % 6], level[n % 6])
    grey = 8 + 10 * (n - 232)
    return hex_colour(grey, grey, grey)


def apply_sgr(state: dict[str, str | bool], params: str) -> None:
    """Update the pen `state` with one SGR sequence's parameters ("1;38;5;12", "4:3", ...)."""
    codes = params.split(";") if params else ["0"]
    i = 0
    while i < len(codes):
        main, _, sub = codes[i].partition(":")
        n = int(main or 0)
        if n == 0:
            state.clear()
        elif n in (1, 3, 7, 9):
            state[{1: "bold", 3: "italic", 7: "reverse", 9: "strike"}[n]] = True
        elif n == 4 and sub == "0":
            state.pop("underline", None)
        elif n == 4:  # 4, or 4:N for curly, double, ...
            state["underline"] = UNDERLINE_STYLES.get(sub, "solid")
        elif n in (22, 23, 24, 27, 29):
            state.pop({22: "bold", 23: "italic", 24: "underline", 27: "reverse", 29: "strike"}[n], None)
        elif n in (38, 48, 58):  # 38;5;N or 38;2;R;G;B (and 48 for the background, 58 the underline)
            key = {38: "fg", 48: "bg", 58: "ul"}[n]
            if codes[i + 1] == "5":
                state[key] = xterm_colour(int(codes[i + 2]))
                i += 2
            elif codes[i + 1] == "2":
                red, green, blue = (int(x) for x in codes[i + 2 : i + 5])
                state[key] = hex_colour(red, green, blue)
                i += 4
        elif n in (39, 49, 59):
            state.pop({39: "fg", 49: "bg", 59: "ul"}[n], None)
        elif 30 <= n <= 37 or 90 <= n <= 97:
            state["fg"] = BASE16[n - 30 if n < 90 else n - 82]
        elif 40 <= n <= 47 or 100 <= n <= 107:
            state["bg"] = BASE16[n - 40 if n < 100 else n - 92]
        i += 1


def css(state: dict[str, str | bool]) -> str:
    fg, bg = str(state.get("fg", FG)), str(state.get("bg", BG))
    if state.get("reverse"):
        fg, bg = bg, fg
    out = [f"color:{fg}", f"background:{bg}"]
    if state.get("bold"):
        out.append("font-weight:bold")
    if state.get("italic"):
        out.append("font-style:italic")
    lines = []
    if state.get("underline"):
        lines.append("underline")
        out += [f"text-decoration-style:{state['underline']}", f"text-decoration-color:{state.get('ul', fg)}"]
    if state.get("strike"):
        lines.append("line-through")
    if lines:
        out.append("text-decoration-line:" + " ".join(lines))
    return ";".join(out)


def cell(ch: str) -> str:
    """One character on the grid: a wide one takes two cells, and any character that is not ASCII
    sits in a box of its width, whatever the width of the glyph the font has for it."""
    if ord(ch) < 128:
        return html.escape(ch)
    width = 2 if unicodedata.east_asian_width(ch) in "WF" else 1
    return f'<span class="c{width}">{html.escape(ch)}</span>'


def screen_html(text: str, cols: int, rows: int) -> str:
    state: dict[str, str | bool] = {}
    rows_html = []
    for line in text.split("\n")[:rows]:
        parts, run, run_css = [], [], css(state)
        for token in SGR.split(line):
            if token.startswith("\x1b["):
                parts.append((run_css, "".join(run)))
                apply_sgr(state, token[2:-1])
                run, run_css = [], css(state)
            else:
                run.extend(cell(ch) for ch in token)
        parts.append((run_css, "".join(run)))
        spans = "".join(f'<span style="{style}">{body}</span>' for style, body in parts if body)
        rows_html.append(f'<div class="row">{spans}</div>')
    return f"""<!doctype html>
<meta charset="utf-8">
<style>
  html, body {{ margin: 0; background: {BG}; }}
  .screen {{ font: {FONT}px/{LINE}px "DejaVu Sans Mono", monospace; color: {FG}; padding: {PAD}px;
             white-space: pre; width: {cols}ch; text-underline-offset: 3px; }}
  .row {{ height: {LINE}px; }}
  .row > span {{ display: inline-block; height: {LINE}px; vertical-align: top; }}
  .c1, .c2 {{ display: inline-block; text-align: center; }}
  .c1 {{ width: 1ch; }}
  .c2 {{ width: 2ch; }}
</style>
<div class="screen">{"".join(rows_html)}</div>
"""


def window_size(cols: int, rows: int) -> str:
    return f"{math.ceil(cols * CELL_WIDTH * FONT) + 2 * PAD},{rows * LINE + 2 * PAD}"


def main(argv: list[str]) -> None:
    src, dst, cols, rows = argv[0], argv[1], int(argv[2]), int(argv[3])
    with open(src, encoding="utf-8") as fh:
        text = fh.read()
    with open(dst, "w", encoding="utf-8") as fh:
        fh.write(screen_html(text, cols, rows))
    print(window_size(cols, rows))


if __name__ == "__main__":
    main(sys.argv[1:])
