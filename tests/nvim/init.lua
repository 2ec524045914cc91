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
  settings = { severity = "warning", compareInductor = false, worker = { timeoutSeconds = 240 } },
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
