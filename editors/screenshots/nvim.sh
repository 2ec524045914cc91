#!/usr/bin/env bash
# Screenshots of the Neovim plugin at work (see README.md beside this file).
#
#   editors/screenshots/nvim.sh [OUT_DIR]          (default: docs/images)
#
# Writes, from a copy of examples/example_net.py (and examples/branchy.py beside it for the status):
#   nvim.png               cluster diagnostics as virtual text, inlay hints (0.10+), the code lens
#                          above the class line, a cluster's hover and the statusline
#   nvim-hover.png         the hover of the cluster under the cursor: its summary and kernel link first
#   nvim-results.png       :FuselensResults after a validation in the Triton interpreter
#   nvim-status.png        two models side by side, each window's statusline its own: one validating
#                          (its progress), the other analyzed (its clusters)
#   nvim-kernel.png, nvim-syntax-error.png, nvim-no-gpu-prompt.png, nvim-untrusted.png
#
# How: the real Neovim runs in a tmux pane (terminal_shot.sh) with only this plugin (a minimal init
# written below, a private HOME, the copy's folder in `trusted_folders`) and walks through the scene.
#
# Environment:
#   NVIM             the Neovim to run (default: nvim on PATH; README.md says where a 0.11 comes from)
#   FUSELENS_PYTHON  an interpreter with fuselens and torch (default: the repository's .venv)
#   CHROMIUM         the browser (default: chromium)
#   COLS, ROWS       the terminal size (default 172x54)
#   SCENES           which to take (default: the README's, "main results kernel syntax-error no-gpu
#                    untrusted"; "hover" and "status" are taken into editors/screenshots, see
#                    README.md)
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
QUIT_KEYS=(Escape ':qa!' Enter)

# shellcheck source=terminal_shot.sh
. "$HERE/terminal_shot.sh"
shot_setup nvim

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

-- Analyzed, whatever it found: the statusline counts its clusters.
local function settled(bufnr)
  return fuselens.state.clusters[bufnr] ~= nil and not fuselens.state.analyzing[bufnr]
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
  hover = { -- K on the middle line of cluster c1: the cluster under the cursor
    function() return analyzed(0) end,
    function()
      vim.api.nvim_win_set_cursor(0, { 24, 18 }) -- x = torch.sigmoid(x)
      vim.lsp.buf.hover({ max_width = 100, max_height = 30, anchor_bias = "below" })
      return true
    end,
    function() return float_open() end,
  },
  status = { -- each window's statusline is its own buffer's: one validating, the other analyzed
    function() return analyzed(0) end,
    function()
      vim.cmd("rightbelow vsplit branchy.py")
      return true
    end,
    function() return settled(vim.api.nvim_get_current_buf()) end,
    function()
      vim.cmd("wincmd h")
      vim.api.nvim_win_set_cursor(0, { 18, 8 })
      fuselens.validate(0)
      return true
    end,
    -- Past its start: the validation has reported how far it is.
    function() return fuselens.status(vim.api.nvim_get_current_buf()):find("[1-9]%d*%%") ~= nil end,
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

mkdir -p "$OUT_DIR"
echo "$("$NVIM" --version | head -1), ${COLS}x${ROWS}"

# Two messages in a row (the validation's summary after its progress) leave Neovim at a hit-enter
# prompt, where the scene's timer does not run: answer it as a user would.
shot_poll() {
  if shot_screen | grep -q "Press ENTER or type command to continue"; then
    tmux -S "$SOCKET" send-keys Enter
  fi
}

take() { # take SCENE OUT.png [TEXT]: TEXT on the screen, when given, is what the scene waits for
  local scene=$1 out=$2 text=${3:-} project=$WORK/$1/models
  local trust=1 interpret=1
  [[ $scene == untrusted ]] && trust=0
  [[ $scene == no-gpu ]] && interpret=0
  shot_project "$project" example_net.py branchy.py
  shot_start "$project" "$scene" \
    FUSELENS_PLUGIN="$REPO/editors/nvim" FUSELENS_TRUST="$trust" FUSELENS_INTERPRET="$interpret" \
    "$NVIM" -i NONE -u "$WORK/init.lua" example_net.py
  shot_wait "$scene" "$text"
  # The status scene is of a validation that runs.
  if [[ $scene == status ]]; then shot_capture "$scene" "fuselens: validating"; else shot_capture "$scene"; fi
  shot_render "$scene" "$out"
}

for scene in $SCENES; do
  case $scene in
    main) take main "$OUT_DIR/nvim.png" ;;
    hover) take hover "$OUT_DIR/nvim-hover.png" ;;
    results) take results "$OUT_DIR/nvim-results.png" ;;
    status) take status "$OUT_DIR/nvim-status.png" ;;
    kernel) take kernel "$OUT_DIR/nvim-kernel.png" ;;
    syntax-error) take syntax-error "$OUT_DIR/nvim-syntax-error.png" ;;
    no-gpu) take no-gpu "$OUT_DIR/nvim-no-gpu-prompt.png" "No CUDA GPU" ;;
    untrusted) take untrusted "$OUT_DIR/nvim-untrusted.png" "trust" ;;
    *) echo "unknown scene $scene (main, hover, results, status, kernel, syntax-error, no-gpu, untrusted)" >&2; exit 2 ;;
  esac
done
