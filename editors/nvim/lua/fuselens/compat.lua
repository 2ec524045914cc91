-- Version shims. The plugin targets Neovim 0.7 (what Debian 12 ships) and up; each function
-- here uses the newer API when it exists and a 0.7 equivalent, or nothing, when it does not.
--
--   feature             0.7                      0.8+                  0.10+
--   start a client      start_client + attach    vim.lsp.start         vim.lsp.start
--   code lens refresh   codelens.refresh()       codelens.refresh()    codelens.refresh({bufnr})
--   inlay hints         -                        -                     vim.lsp.inlay_hint.enable
--   code_action filter  (vim.ui.select picks)    {filter, apply}       {filter, apply}
--   client methods      client.request(...)      client.request(...)   client:request(...) (0.11+)
--   hover float options the client's handler   the client's handler  vim.lsp.buf.hover(opts) (0.11+)
--   K -> LSP hover      -                        -                     Neovim maps it (0.10+)

local M = {}

local uv = vim.uv or vim.loop

function M.has(version)
  return vim.fn.has("nvim-" .. version) == 1
end

--- The nearest folder above `path` holding one of `markers`, or nil.
function M.find_root(path, markers)
  local dir = vim.fn.fnamemodify(path, ":p:h")
  while dir and dir ~= "" do
    for _, marker in ipairs(markers) do
      if uv.fs_stat(dir .. "/" .. marker) then
        return dir
      end
    end
    local parent = vim.fn.fnamemodify(dir, ":h")
    if parent == dir then
      return nil
    end
    dir = parent
  end
  return nil
end

local started = {} -- root_dir -> client id (0.7 only: vim.lsp.start does this itself)

--- Start (or reuse) the client for config.root_dir and attach it to `bufnr`.
function M.start(config, bufnr)
  if vim.lsp.start then
    return vim.lsp.start(config, { bufnr = bufnr })
  end
  local id = started[config.root_dir]
  local client = id and vim.lsp.get_client_by_id(id)
  if not client or client.is_stopped() then
    id = vim.lsp.start_client(config)
    started[config.root_dir] = id
  end
  if id then
    vim.lsp.buf_attach_client(bufnr, id)
  end
  return id
end

--- client:request on 0.11+ (methods), client.request before (plain functions).
function M.request(client, method, params, handler, bufnr)
  if M.has("0.11") then
    return client:request(method, params, handler, bufnr)
  end
  return client.request(method, params, handler, bufnr)
end

function M.stop(client)
  if M.has("0.11") then
    return client:stop()
  end
  return client.stop()
end

--- Ask for code lenses of `bufnr` again, drawn by Neovim as end-of-line virtual text (the plugin
--- draws its own, lenses.lua, wherever it can keep them in Neovim's lens store).
function M.refresh_codelens(bufnr)
  if not vim.api.nvim_buf_is_valid(bufnr) then
    return
  end
  if M.has("0.10") then
    pcall(vim.lsp.codelens.refresh, { bufnr = bufnr })
  else
    vim.api.nvim_buf_call(bufnr, function()
      pcall(vim.lsp.codelens.refresh) -- works on the current buffer
    end)
  end
end

--- Turn on inlay hints for `bufnr` where Neovim can show them (0.10+); false otherwise.
function M.enable_inlay_hints(bufnr)
  local ih = vim.lsp.inlay_hint
  if type(ih) ~= "table" or type(ih.enable) ~= "function" then
    return false
  end
  -- 0.10 final: enable(true, {bufnr}); pre-releases had enable(bufnr, true).
  return pcall(ih.enable, true, { bufnr = bufnr }) or pcall(ih.enable, bufnr, true)
end

--- Turn inlay hints off and on again for `bufnr`, so freshly fetched hints get drawn.
-- Neovim 0.11/0.12 marks lines drawn while a refresh request is out as done for that
-- document version, and never redraws them when the hints arrive (neovim/neovim#33391).
function M.redraw_inlay_hints(bufnr)
  local ih = vim.lsp.inlay_hint
  if type(ih) ~= "table" or type(ih.is_enabled) ~= "function" then
    return
  end
  local ok, on = pcall(ih.is_enabled, { bufnr = bufnr })
  if ok and on then
    pcall(ih.enable, false, { bufnr = bufnr })
    pcall(ih.enable, true, { bufnr = bufnr })
  end
end

--- The client's hover handler, drawing the float with `opts` (border, max_width, max_height).  On
--- 0.11+ `vim.lsp.buf.hover()` draws its own float (its border from 'winborder') and this is nil.
function M.hover_handler(opts)
  if M.has("0.11") or not vim.lsp.with or not vim.lsp.handlers.hover then
    return nil
  end
  return vim.lsp.with(vim.lsp.handlers.hover, opts)
end

--- Whether Neovim makes K show the LSP hover itself in a buffer a client attaches to (0.10+).
function M.maps_hover_key()
  return M.has("0.10")
end

--- Whether `bufnr`'s 'keywordprg' is as Neovim or its runtime files set it (a Python ftplugin's pydoc),
--- not the user's choice: the rule by which Neovim 0.10+ maps K to the hover.
function M.keywordprg_is_default(bufnr)
  local shown = vim.api.nvim_buf_call(bufnr, function()
    return vim.api.nvim_exec("verbose setlocal keywordprg?", true)
  end)
  local value = shown:match("keywordprg=([^\n]*)")
  if value == nil or value == "" then
    return true
  end
  local from = shown:match("Last set from ([^\n]*)") -- a script ("... line 128"), or "Lua", ...
  local runtime = vim.fn.expand("$VIMRUNTIME") .. "/"
  return from == nil or from:sub(1, #runtime) == runtime
end

return M
