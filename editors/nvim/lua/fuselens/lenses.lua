-- Code lenses, drawn the way VS Code draws them: on a line of their own above the line the
-- server's lens range names (a model's `class` line), indented like it (under it when it is the
-- buffer's first line).
--
-- Neovim's own lens display puts them as virtual text at the end of that line, where they land
-- after a trailing comment (`class Net(nn.Module):  # fuselens: input=...`) and are cut off at
-- the window's edge. Here they are virtual lines (extmark `virt_lines`, Neovim 0.6+); a summary
-- wider than the window is wrapped at its separators onto further virtual lines, so nothing is
-- cut off. Where virtual lines cannot be set, the lenses go at the end of the line, shortened
-- with "…" to the room left there.
--
-- The lenses are stored where Neovim keeps its own (vim.lsp.codelens.save), so that
-- vim.lsp.codelens.run() and vim.lsp.codelens.get() work on them as on any server's.

local compat = require("fuselens.compat")

local M = {}

local api = vim.api
local ns = api.nvim_create_namespace("fuselens_codelens")

local LENS_SEPARATOR = " | " -- between two lenses of a line, as Neovim's own display writes it
local PART_SEPARATOR = " · " -- between the parts of one lens title (server/features/lenses.py)
local CONTINUATION = "  " -- further indent of a wrapped lens line
local MIN_WIDTH = 20 -- never lay out narrower than this, however narrow the window

M.namespace = ns

-- bufnr -> { lenses = CodeLens[], width = columns laid out for, inflight = bool, again = bool }
local buffers = {}

--- True where lenses can be drawn here: Neovim's lens store exists to keep them in.
function M.supported()
  return type(vim.lsp.codelens) == "table" and type(vim.lsp.codelens.save) == "function"
end

local function width_of(text)
  return vim.fn.strdisplaywidth(text)
end

--- `text` cut into pieces at most `width` columns wide (a part too long for any row).
local function hard_split(text, width)
  local pieces = {}
  local n = vim.fn.strchars(text)
  local start = 0
  while start < n do
    local len = 1
    while start + len < n and width_of(vim.fn.strcharpart(text, start, len + 1)) <= width do
      len = len + 1
    end
    table.insert(pieces, vim.fn.strcharpart(text, start, len))
    start = start + len
  end
  return pieces
end

--- The rows of virtual text that show `titles` (the lens titles of one line, in order) in `width`
--- columns, each row starting with `indent` spaces. Returns a list of rows, each a list of
--- { text, highlight } chunks. Every title is there in full: a row that would be wider than
--- `width` is broken after a separator, and the row after it is indented a little further.
function M.layout(titles, width, indent)
  width = math.max(width, MIN_WIDTH)
  if indent > width / 2 then
    indent = 0
  end
  -- Tokens: each part of each title, with the separator written after it (none after the last).
  local tokens = {}
  for i, title in ipairs(titles) do
    local parts = vim.split(title, PART_SEPARATOR, { plain = true })
    for j, part in ipairs(parts) do
      local sep, sep_hl = nil, nil
      if j < #parts then
        sep, sep_hl = PART_SEPARATOR, "LspCodeLens"
      elseif i < #titles then
        sep, sep_hl = LENS_SEPARATOR, "LspCodeLensSeparator"
      end
      table.insert(tokens, { text = part, sep = sep, sep_hl = sep_hl })
    end
  end

  local rows, row, used = {}, nil, 0
  local function new_row(extra)
    local lead = string.rep(" ", indent) .. extra
    row = { { lead, "LspCodeLens" } }
    used = width_of(lead)
    table.insert(rows, row)
  end
  new_row("")
  for _, token in ipairs(tokens) do
    -- A separator at a row's end keeps no trailing blank: " · " becomes " ·".
    local text_width = width_of(token.text)
    local sep_width = token.sep and width_of(vim.trim(token.sep)) + 1 or 0
    local fresh = #row == 1
    if not fresh and used + text_width + sep_width > width then
      new_row(CONTINUATION)
      fresh = true
    end
    local pieces = { token.text }
    if used + text_width + sep_width > width then -- too wide even for a row of its own
      pieces = hard_split(token.text, math.max(width - indent - #CONTINUATION - sep_width, 1))
    end
    for k, piece in ipairs(pieces) do
      if k > 1 then
        new_row(CONTINUATION)
      end
      table.insert(row, { piece, "LspCodeLens" })
      used = used + width_of(piece)
    end
    if token.sep then
      table.insert(row, { token.sep, token.sep_hl })
      used = used + width_of(token.sep)
    end
  end
  -- No row ends in blanks: the separator that ends a row loses its trailing space.
  for _, r in ipairs(rows) do
    local last = r[#r]
    last[1] = last[1]:gsub("%s+$", "")
  end
  return rows
end

--- The columns a lens line has in the narrowest window that shows `bufnr` (the text area: the
--- number, sign and fold columns left out), or the editor's width when no window shows it.
local function text_width(bufnr)
  local width
  for _, win in ipairs(vim.fn.win_findbuf(bufnr)) do
    local info = vim.fn.getwininfo(win)[1]
    local cols = info and (info.width - (info.textoff or 0)) or api.nvim_win_get_width(win)
    width = width and math.min(width, cols) or cols
  end
  return width or vim.o.columns
end

local function indent_of(bufnr, line)
  local text = api.nvim_buf_get_lines(bufnr, line, line + 1, false)[1] or ""
  return width_of(text:match("^%s*"))
end

--- At the end of `line`, when virtual lines cannot be set: the titles on one row, shortened with
--- "…" to the room the window has after the line's text.
local function draw_at_end(bufnr, line, titles, width)
  local text = api.nvim_buf_get_lines(bufnr, line, line + 1, false)[1] or ""
  local room = math.max(width - width_of(text) - 1, MIN_WIDTH)
  local full = table.concat(titles, LENS_SEPARATOR)
  if width_of(full) > room then
    full = vim.fn.strcharpart(full, 0, room - 1) .. "…"
  end
  api.nvim_buf_set_extmark(bufnr, ns, line, 0, { virt_text = { { full, "LspCodeLens" } }, hl_mode = "combine" })
end

--- Draw the lenses last received for `bufnr` for the width of its windows now.
function M.draw(bufnr)
  local state = buffers[bufnr]
  if not (state and api.nvim_buf_is_valid(bufnr)) then
    return
  end
  api.nvim_buf_clear_namespace(bufnr, ns, 0, -1)
  local width = text_width(bufnr)
  state.width = width
  local by_line, lines = {}, {}
  for _, lens in ipairs(state.lenses) do
    local line = lens.range.start.line
    if not by_line[line] then
      by_line[line] = {}
      table.insert(lines, line)
    end
    table.insert(by_line[line], lens.command and lens.command.title or "…")
  end
  local last = api.nvim_buf_line_count(bufnr) - 1
  for _, line in ipairs(lines) do
    if line <= last then
      local titles = by_line[line]
      local rows = M.layout(titles, width, indent_of(bufnr, line))
      -- Above the line; under it on the buffer's first line, where Neovim shows lines above only
      -- once the window is scrolled up past the top (<C-y>).
      local mark = { virt_lines = rows, virt_lines_above = line > 0 }
      local ok = compat.has("0.6") and pcall(api.nvim_buf_set_extmark, bufnr, ns, line, 0, mark)
      if not ok then
        draw_at_end(bufnr, line, titles, width)
      end
    end
  end
end

--- Draw again if the width the lenses were laid out for has changed (a window resized or split).
function M.fit(bufnr)
  local state = buffers[bufnr]
  if state and state.width ~= text_width(bufnr) then
    M.draw(bufnr)
  end
end

--- Keep every buffer's lenses laid out for the width of its windows, in autocmd `group`.
function M.follow_window_widths(group)
  -- WinResized is 0.9+; before it, WinScrolled also fires when a window is resized.
  local resized = vim.fn.exists("##WinResized") == 1 and "WinResized" or "WinScrolled"
  api.nvim_create_autocmd({ "VimResized", "BufWinEnter", resized }, {
    group = group,
    callback = function()
      vim.schedule(function()
        for bufnr in pairs(buffers) do
          M.fit(bufnr)
        end
      end)
    end,
  })
end

--- The virtual lines drawn for `bufnr`, for tests and statuslines: a list of
--- { line = 0-based line they sit on, above = bool, rows = { "text of a row", ... } }.
function M.drawn(bufnr)
  local out = {}
  for _, mark in ipairs(api.nvim_buf_get_extmarks(bufnr, ns, 0, -1, { details = true })) do
    local details = mark[4] or {}
    local rows = {}
    for _, chunks in ipairs(details.virt_lines or { details.virt_text }) do
      local text = {}
      for _, chunk in ipairs(chunks) do
        table.insert(text, chunk[1])
      end
      table.insert(rows, table.concat(text))
    end
    table.insert(out, { line = mark[2], above = details.virt_lines_above == true, rows = rows })
  end
  return out
end

--- Ask `client` for the lenses of `bufnr` and draw them. A refresh asked for while one is out
--- is sent again when that one is answered: the analysis it answers from may be newer.
function M.refresh(client, bufnr)
  if not api.nvim_buf_is_valid(bufnr) then
    return
  end
  local state = buffers[bufnr]
  if not state then
    state = { lenses = {} }
    buffers[bufnr] = state
    api.nvim_buf_attach(bufnr, false, {
      on_detach = function(_, b)
        buffers[b] = nil
      end,
    })
  end
  if state.inflight then
    state.again = true
    return
  end
  state.inflight = true
  local params = { textDocument = { uri = vim.uri_from_bufnr(bufnr) } }
  compat.request(client, "textDocument/codeLens", params, function(err, result)
    state.inflight = false
    if not err and api.nvim_buf_is_valid(bufnr) then
      state.lenses = result or {}
      vim.lsp.codelens.save(state.lenses, bufnr, client.id)
      M.draw(bufnr)
    end
    if state.again then
      state.again = false
      M.refresh(client, bufnr)
    end
  end, bufnr)
end

return M
