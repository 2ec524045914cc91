-- Minimal init for the headless Neovim tests (tests/test_nvim.py): only the plugin from
-- editors/nvim, configured the way a user would, from the environment the test sets.
vim.opt.runtimepath:prepend(os.getenv("FUSELENS_PLUGIN"))
vim.o.swapfile = false
vim.o.more = false
vim.cmd("filetype on")

local trusted = os.getenv("FUSELENS_TRUSTED")
require("fuselens").setup({
  python = os.getenv("FUSELENS_PYTHON"),
  trusted_folders = trusted and trusted ~= "" and { trusted } or {},
  interpret = true, -- no GPU here: check numerics in the Triton interpreter without asking
  settings = {
    severity = "warning",
    compareInductor = false,
    worker = { timeoutSeconds = tonumber(os.getenv("FUSELENS_ANALYSIS_TIMEOUT") or "240") },
  },
})

-- Keep every message the user would have seen (the server's window/showMessage included).
_G.fuselens_test_messages = {}
local notify = vim.notify
vim.notify = function(msg, level, opts)
  table.insert(_G.fuselens_test_messages, tostring(msg))
  return notify(msg, level, opts)
end
local show_message = vim.lsp.handlers["window/showMessage"]
vim.lsp.handlers["window/showMessage"] = function(err, result, ctx, config)
  table.insert(_G.fuselens_test_messages, result and result.message or "")
  return show_message(err, result, ctx, config)
end

-- A statusline as a user would set one, keeping every text it was drawn with (in order, each change
-- once): what the user saw, and when Neovim drew it.
_G.fuselens_test_statuslines = {}
function _G.fuselens_test_statusline()
  local text = require("fuselens").status()
  local seen = _G.fuselens_test_statuslines
  if seen[#seen] ~= text then
    table.insert(seen, text)
  end
  return text
end
vim.o.laststatus = 2
vim.o.statusline = "%!v:lua.fuselens_test_statusline()"
