-- The hover float's links to the server's commands ("Open the kernel"), made followable.
--
-- The server writes them as markdown links to `command:fuselens.showKernel?<url-encoded JSON
-- arguments>` URIs, which VS Code runs. Neovim shows the float's markdown as text: its hidden
-- address still takes room (0.7 shows it whole; 0.11 conceals it, and the wrapped rows it fills
-- stay blank), and nothing follows it. So, in a hover float of a buffer fuselens is attached to,
-- each such link is replaced by its label, underlined, and <CR> or gx on it runs its command
-- through the client that showed it (workspace/executeCommand). The window also breaks lines at
-- words, and is fitted to the text left.

local M = {}

local api = vim.api
local ns = api.nvim_create_namespace("fuselens_hover")

-- [label](command:fuselens.name?arguments): the arguments are percent-encoded, so hold no ")".
local LINK = "%[([^%]]*)%]%((command:(fuselens%.[%w_.]+)%??([^%)%s]*))%)"
local FOLLOW_KEYS = { "<CR>", "gx" }

local floats = {} -- float buffer -> { source = the buffer hovered, links = its links (`unlinked`) }

local function percent_decoded(text)
  return (text:gsub("%%(%x%x)", function(hex)
    return string.char(tonumber(hex, 16))
  end))
end

--- The arguments of a command URI's query: a JSON list (or a single value, as VS Code takes it).
local function arguments_of(query)
  if query == "" then
    return {}
  end
  local ok, decoded = pcall(vim.fn.json_decode, percent_decoded(query))
  if not ok then
    return nil
  end
  return (vim.islist or vim.tbl_islist)(decoded) and decoded or { decoded }
end

--- `lines` with each link to a fuselens command replaced by its label, and the links: each
--- { row (0-based), col, end_col (bytes of the label in its row), command, arguments }.
local function unlinked(lines)
  local out, links = {}, {}
  for row, line in ipairs(lines) do
    local text, from = "", 1
    while true do
      local s, e, label, _, command, query = line:find(LINK, from)
      if not s then
        break
      end
      text = text .. line:sub(from, s - 1)
      local arguments = arguments_of(query)
      if arguments then
        table.insert(links, { row = row - 1, col = #text, end_col = #text + #label, command = command,
                              arguments = arguments })
        text = text .. label
      else
        text = text .. line:sub(s, e) -- not one the plugin can run: left as the server wrote it
      end
      from = e + 1
    end
    out[row] = text .. line:sub(from)
  end
  return out, links
end

--- The link under the cursor, else the first after it (on its line or below).
local function link_at(links, row, col)
  for _, link in ipairs(links) do
    if link.row > row or (link.row == row and link.end_col > col) then
      return link
    end
  end
  return nil
end

--- The window the user was in before the float: the one showing the buffer hovered.
local function source_window(source)
  local previous = vim.fn.win_getid(vim.fn.winnr("#"))
  if previous ~= 0 and api.nvim_win_is_valid(previous) and api.nvim_win_get_buf(previous) == source then
    return previous
  end
  for _, win in ipairs(api.nvim_tabpage_list_wins(0)) do
    if api.nvim_win_get_buf(win) == source and api.nvim_win_get_config(win).relative == "" then
      return win
    end
  end
  return nil
end

--- Follow the link at the cursor of the float buffer `buf`: close the float, go back to the code,
--- and run the link's command there (what it opens must not open in the float).
local function follow(buf, run)
  local entry = floats[buf]
  local cursor = api.nvim_win_get_cursor(0)
  local link = entry and link_at(entry.links, cursor[1] - 1, cursor[2])
  if not link then
    vim.notify("fuselens: no link here", vim.log.levels.INFO)
    return
  end
  local float = api.nvim_get_current_win()
  local back = source_window(entry.source)
  if back then
    api.nvim_set_current_win(back)
  end
  if api.nvim_win_is_valid(float) then
    api.nvim_win_close(float, true)
  end
  run(entry.source, link.command, link.arguments)
end

--- The rows `line` takes in `width` columns, broken at words as 'linebreak' breaks it (for
--- Neovim before 0.10, which cannot say how many rows a window's text takes).
local function rows_of(line, width)
  local rows, used, since_break = 1, 0, 0
  for _, char in ipairs(vim.fn.split(line, "\\zs")) do
    local w = vim.fn.strdisplaywidth(char)
    if used + w > width then
      rows = rows + 1
      used = since_break < used and since_break or 0 -- the word carried to the next row
      since_break = used
    end
    used = used + w
    since_break = char:find("^[ \t!@*%-+;:,./?]$") and 0 or since_break + w
  end
  return rows
end

--- Fit the float to its text, now shorter: as wide as its widest line (never wider than it was),
--- and as high as its rows at that width, broken at words.
local function fit(win, lines, max_height)
  local widest = 1
  for _, line in ipairs(lines) do
    widest = math.max(widest, vim.fn.strdisplaywidth(line))
  end
  local width = math.min(api.nvim_win_get_width(win), widest)
  api.nvim_win_set_width(win, width)
  local rows
  if api.nvim_win_text_height then
    rows = api.nvim_win_text_height(win, {}).all
  else
    rows = 0
    for _, line in ipairs(lines) do
      rows = rows + rows_of(line, width)
    end
  end
  local cap = math.max(api.nvim_win_get_height(win), max_height or 0)
  api.nvim_win_set_height(win, math.max(1, math.min(rows, cap, vim.o.lines - 2)))
end

--- Make the hover float `win` (showing `buf`, the hover of `source`) follow its fuselens links:
--- `run(source, command, arguments)` runs one. A float without any is left as it is.
function M.decorate(buf, win, source, run, opts)
  if floats[buf] or not (api.nvim_buf_is_valid(buf) and api.nvim_win_is_valid(win)) then
    return
  end
  local lines, links = unlinked(api.nvim_buf_get_lines(buf, 0, -1, false))
  if #links == 0 then
    return
  end
  floats[buf] = { source = source, links = links }
  local modifiable = vim.bo[buf].modifiable
  vim.bo[buf].modifiable = true
  api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  vim.bo[buf].modifiable = modifiable
  for _, link in ipairs(links) do
    api.nvim_buf_set_extmark(buf, ns, link.row, link.col, { end_col = link.end_col, hl_group = "Underlined" })
  end
  for _, key in ipairs(FOLLOW_KEYS) do
    vim.keymap.set("n", key, function()
      follow(buf, run)
    end, { buffer = buf, nowait = true, desc = "fuselens: follow the link (open the kernel)" })
  end
  api.nvim_create_autocmd("BufWipeout", {
    buffer = buf,
    once = true,
    callback = function()
      floats[buf] = nil
    end,
  })
  vim.wo[win].linebreak = true -- long lines break between words
  fit(win, lines, opts and opts.max_height)
end

--- The hover float `win` if it shows the hover of a buffer (else nil): Neovim 0.11+ marks the
--- float with the buffer it was opened from and the request it answers.
local function hovered_from(win)
  local ok, source = pcall(api.nvim_win_get_var, win, "lsp_floating_bufnr")
  local hover = pcall(api.nvim_win_get_var, win, "textDocument/hover")
  return ok and hover and source or nil
end

--- Decorate every hover float of a buffer `attached(buf)` says fuselens is attached to, as it opens.
--- Before 0.11, the client's hover handler hands its float to `M.decorate` itself (`handler`);
--- 0.11+ opens the float in vim.lsp.buf.hover(), and sets its markdown filetype once it is there.
function M.follow_links(group, attached, run, opts)
  api.nvim_create_autocmd("FileType", {
    group = group,
    pattern = "markdown",
    callback = function(args)
      for _, win in ipairs(api.nvim_list_wins()) do
        local source = api.nvim_win_get_buf(win) == args.buf and hovered_from(win)
        if source and attached(source) then
          M.decorate(args.buf, win, source, run, opts)
        end
      end
    end,
  })
end

--- A textDocument/hover handler that draws the float with `base` (the client's), then decorates it.
function M.handler(base, run, opts)
  if not base then
    return nil
  end
  return function(err, result, ctx, config)
    local buf, win = base(err, result, ctx, config)
    if buf and win then
      M.decorate(buf, win, ctx.bufnr, run, opts)
    end
    return buf, win
  end
end

return M
