#!/usr/bin/env bash
# Screenshots of the Neovim plugin at work, for the README (see README.md beside this file).
#
#   editors/screenshots/nvim.sh [OUT_DIR]          (default: docs/images)
#
# Writes, from a copy of examples/example_net.py:
#   nvim.png          cluster diagnostics as virtual text, inlay hints (0.10+), the code lens above
#                     the class line, a cluster's hover and the statusline
#   nvim-results.png  :FuselensResults after a validation in the Triton interpreter
#
# How: the real Neovim runs in a detached tmux pane of a fixed size with only this plugin (a
# minimal init written below, a private HOME, the copy's folder in `trusted_folders`) and walks
# through the scene; `tmux capture-pane -e` takes the screen with its colours, terminal_html.py
# turns it into an HTML page of the same grid, and headless Chromium renders that. No display.
#
# Environment:
#   NVIM             the Neovim to run (default: nvim on PATH; README.md says where a 0.11 comes from)
#   FUSELENS_PYTHON  an interpreter with fuselens and torch (default: the repository's .venv)
#   CHROMIUM         the browser (default: chromium)
#   COLS, ROWS       the terminal size (default 172x54)
#   SCENES           which to take (default: all: "main results kernel syntax-error no-gpu untrusted")
#   KEEP=1           keep the work folder (captured ANSI text, HTML, logs) and print its path
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT_DIR=$(realpath -m "${1:-$REPO/docs/images}")
NVIM=$(command -v "${NVIM:-nvim}")
PYTHON=${FUSELENS_PYTHON:-$REPO/.venv/bin/python}
CHROMIUM=${CHROMIUM:-chromium}
COLS=${COLS:-172}
ROWS=${ROWS:-54}
SCENES=${SCENES:-main results kernel syntax-error no-gpu untrusted}

for tool in tmux "$CHROMIUM" python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool (Debian: apt-get install -y tmux chromium)" >&2; exit 2; }
done
[[ -x $PYTHON ]] || { echo "no Python with fuselens at $PYTHON (set FUSELENS_PYTHON)" >&2; exit 2; }

WORK=$(mktemp -d /tmp/fuselens-nvim-shots.XXXXXX)
SOCKET=$WORK/tmux.sock
# Quit Neovim (and with it the server) before its pane goes: killing the pane alone can leave
# Neovim's embedded core, and the server under it, running.
quit_neovim() {
  tmux -S "$SOCKET" send-keys Escape ':qa!' Enter 2>/dev/null || return 0
  for _ in $(seq 20); do
    tmux -S "$SOCKET" has-session 2>/dev/null || break
    sleep 0.25
  done
  tmux -S "$SOCKET" kill-server 2>/dev/null || true
}
cleanup() {
  quit_neovim
  if [[ ${KEEP:-} == 1 ]]; then echo "work folder: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# The minimal init: only the plugin, set up as a user would, plus what makes the picture. The
# scene ($FUSELENS_SCENE) runs in steps polled every 250 ms, and writes $FUSELENS_READY when the
# screen shows what it is for.
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

local fuselens = require("fuselens")
fuselens.setup({
  python = os.getenv("FUSELENS_PYTHON"),
  -- The untrusted scene trusts nothing; the others, the project.
  trusted_folders = os.getenv("FUSELENS_TRUST") == "0" and {} or { os.getenv("FUSELENS_PROJECT") },
  -- No GPU here: validate in the Triton interpreter without asking, but in the scene of the question.
  interpret = os.getenv("FUSELENS_INTERPRET") ~= "0",
  settings = { compareInductor = false },
})

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

local function float_open()
  for _, win in ipairs(vim.api.nvim_list_wins()) do
    if vim.api.nvim_win_get_config(win).relative ~= "" then
      return true
    end
  end
  return false
end

local function syntax_error_shown(bufnr)
  for _, d in ipairs(vim.diagnostic.get(bufnr)) do
    if d.source == "fuselens" and d.code == "syntax" then
      return true
    end
  end
  return false
end

local function ready()
  vim.cmd("redrawstatus!")
  vim.cmd("redraw")
  vim.fn.writefile({}, os.getenv("FUSELENS_READY"))
end

-- Each scene: a list of steps; a step returns true when it is done.
local scenes = {
  main = {
    function() return analyzed(0) end,
    function() -- the hover under the last line of cluster c2
      vim.api.nvim_win_set_cursor(0, { 30, 15 }) -- return F.softmax(x, dim=-1)
      -- Sizes and placement are taken by 0.11+ (older ones place it where it fits).
      vim.lsp.buf.hover({ max_width = 100, max_height = 20, anchor_bias = "below" })
      return true
    end,
    function() return float_open() end,
  },
  results = {
    function() return analyzed(0) end,
    function()
      fuselens.validate(0)
      return true
    end,
    function() return fuselens.state.results[vim.api.nvim_get_current_buf()] ~= nil end,
    function()
      vim.cmd("FuselensResults")
      vim.cmd("resize 24")
      vim.cmd("normal! gg")
      return true
    end,
  },
  kernel = { -- "Show kernel" on cluster c1: its kernel and launcher, a read-only view
    function() return analyzed(0) end,
    function()
      fuselens.show_kernel(0, "c1")
      return true
    end,
    function() return vim.api.nvim_buf_get_name(0):find("_cluster1%.py$") ~= nil end,
  },
  ["syntax-error"] = { -- an unmatched bracket, saved: the diagnostic names the line
    function() return analyzed(0) end,
    function()
      vim.api.nvim_buf_set_lines(0, 29, 30, false, { "        return F.softmax(x, dim=-1))" })
      vim.cmd("write")
      vim.api.nvim_win_set_cursor(0, { 30, 0 })
      return true
    end,
    function() return syntax_error_shown(0) end,
  },
  -- These two end on a prompt or a message, which the shell waits for on the screen.
  ["no-gpu"] = {
    function() return analyzed(0) end,
    function()
      fuselens.validate(0)
      return true
    end,
    function() return false end,
  },
  untrusted = { function() return false end },
}

local steps, index = scenes[os.getenv("FUSELENS_SCENE")], 1
local timer = (vim.uv or vim.loop).new_timer()
timer:start(500, 250, vim.schedule_wrap(function()
  if index > #steps then
    timer:stop()
    ready()
  elseif steps[index]() then
    index = index + 1
  end
end))
LUA

printf '%s\n' 'set -g status off' 'set -g default-terminal tmux-256color' 'set -sg escape-time 0' >"$WORK/tmux.conf"
mkdir -p "$OUT_DIR"
echo "$("$NVIM" --version | head -1), ${COLS}x${ROWS}"

take() { # take SCENE OUT.png [TEXT]: TEXT on the screen, when given, is what the scene waits for
  local scene=$1 out=$2 text=${3:-} project=$WORK/$1/project home=$WORK/$1/home
  local trust=1 interpret=1
  [[ $scene == untrusted ]] && trust=0
  [[ $scene == no-gpu ]] && interpret=0
  mkdir -p "$project" "$home"
  cp "$REPO/examples/example_net.py" "$project/"
  printf '[project]\nname = "models"\n' >"$project/pyproject.toml"
  rm -f "$WORK/ready"
  tmux -S "$SOCKET" -f "$WORK/tmux.conf" new-session -d -x "$COLS" -y "$ROWS" -c "$project" \
    env HOME="$home" XDG_CONFIG_HOME="$home/.config" XDG_CACHE_HOME="$home/.cache" \
        XDG_DATA_HOME="$home/.local/share" XDG_STATE_HOME="$home/.local/state" \
        FUSELENS_PLUGIN="$REPO/editors/nvim" FUSELENS_PYTHON="$PYTHON" FUSELENS_SCENE="$scene" \
        FUSELENS_PROJECT="$project" FUSELENS_READY="$WORK/ready" FUSELENS_TRUST="$trust" \
        FUSELENS_INTERPRET="$interpret" \
        "$NVIM" -i NONE -u "$WORK/init.lua" example_net.py
  for _ in $(seq 600); do
    [[ -e $WORK/ready ]] && break
    if [[ -n $text ]] && tmux -S "$SOCKET" capture-pane -p | grep -q "$text"; then
      touch "$WORK/ready"
      break
    fi
    # Two messages in a row (the validation's summary after its progress) leave Neovim at a
    # hit-enter prompt, where the scene's timer does not run: answer it as a user would.
    if [[ -z $text ]] && tmux -S "$SOCKET" capture-pane -p | grep -q "Press ENTER or type command to continue"; then
      tmux -S "$SOCKET" send-keys Enter
    fi
    sleep 0.5
  done
  [[ -e $WORK/ready ]] || { tmux -S "$SOCKET" capture-pane -p; echo "$scene: timed out" >&2; exit 1; }
  sleep 1
  tmux -S "$SOCKET" capture-pane -e -N -p >"$WORK/$scene.ansi"
  quit_neovim
  local size
  size=$(python3 "$HERE/terminal_html.py" "$WORK/$scene.ansi" "$WORK/$scene.html" "$COLS" "$ROWS")
  "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-background-networking --no-first-run \
    --hide-scrollbars --user-data-dir="$WORK/chromium" --screenshot="$out" --window-size="$size" \
    "file://$WORK/$scene.html" 2>/dev/null
  echo "wrote $out (${size/,/x})"
}

for scene in $SCENES; do
  case $scene in
    main) take main "$OUT_DIR/nvim.png" ;;
    results) take results "$OUT_DIR/nvim-results.png" ;;
    kernel) take kernel "$OUT_DIR/nvim-kernel.png" ;;
    syntax-error) take syntax-error "$OUT_DIR/nvim-syntax-error.png" ;;
    no-gpu) take no-gpu "$OUT_DIR/nvim-no-gpu-prompt.png" "No CUDA GPU" ;;
    untrusted) take untrusted "$OUT_DIR/nvim-untrusted.png" "trust" ;;
    *) echo "unknown scene $scene (main, results, kernel, syntax-error, no-gpu, untrusted)" >&2; exit 2 ;;
  esac
done
