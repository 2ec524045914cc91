-- Drives the fuselens plugin in headless Neovim the way a user would, and writes what
-- happened to $FUSELENS_RESULTS as JSON for tests/test_nvim.py to assert on.
--   $FUSELENS_MODE = "full": diagnostics, hover (K, its kernel link), lens -> validation, quick fix
--   $FUSELENS_MODE = "untrusted": the folder is not trusted; nothing may be analyzed
--   $FUSELENS_MODE = "library": a transformers model; diagnostics, hover and the quick fix of a
--                               cluster in the library's code, the analysis after saving, then the
--                               quick fix of a second cluster there
--   $FUSELENS_MODE = "checkout": the file in a git repository: a syntax error saved, then
--                                `git checkout` of the file from Neovim; then a validation whose
--                                whole-model check ends in an error, and what the user is told
--   $FUSELENS_MODE = "kinds": the quick fixes $FUSELENS_FIXES lists, one after the other, each
--                             after the analysis of the previous one; then, where $FUSELENS_RESTORE
--                             names them, the restore of one cluster and of every cluster
--   $FUSELENS_MODE = "timeout": a model whose analysis does not finish within its time limit
local fuselens = require("fuselens")
local results = { steps = {}, errors = {} }
local v = vim.version()
results.nvim = ("%d.%d.%d"):format(v.major, v.minor, v.patch)

local function save()
  results.messages = _G.fuselens_test_messages
  vim.fn.writefile({ vim.fn.json_encode(results) }, os.getenv("FUSELENS_RESULTS"))
end

local function step(name, fn)
  local ok, err = pcall(fn)
  if ok then
    table.insert(results.steps, name)
  else
    results.errors[name] = tostring(err)
  end
  save()
  return ok
end

local function wait(ms, what, predicate)
  if not vim.wait(ms, predicate, 100) then
    error("timed out waiting for " .. what)
  end
end

--- The statusline texts drawn since the `from`th (what the user saw, in order).
local function statuslines_since(from)
  return vim.list_slice(_G.fuselens_test_statuslines, from + 1)
end

--- The virtual text at the end of 0-based `line` of `buf`, from every namespace: the diagnostics' own
--- are anonymous (not in nvim_get_namespaces()), so every id up to past the last named one.
local function virtual_text_on(buf, line)
  local last = 0
  for _, id in pairs(vim.api.nvim_get_namespaces()) do
    last = math.max(last, id)
  end
  local text = {}
  for ns = 1, last + 100 do
    local ok, marks = pcall(vim.api.nvim_buf_get_extmarks, buf, ns, { line, 0 }, { line, -1 }, { details = true })
    for _, mark in ipairs(ok and marks or {}) do
      for _, chunk in ipairs(mark[4].virt_text or {}) do
        table.insert(text, chunk[1])
      end
    end
  end
  return table.concat(text)
end

--- The signs on 0-based `line` of `buf`, each { kind = "Error" | "Warn" | "Info" | "Hint", priority }:
--- the sign column shows the one of the highest priority. (0.10+ draws them as extmarks; before, as
--- placed signs.)
local function signs_on(buf, line)
  local out = {}
  if vim.fn.has("nvim-0.10") == 1 then
    local marks = vim.api.nvim_buf_get_extmarks(buf, -1, { line, 0 }, { line, -1 }, { details = true, type = "sign" })
    for _, mark in ipairs(marks) do
      local group = mark[4].sign_hl_group or ""
      table.insert(out, { kind = group:match("Diagnostic%a*(%u%l+)$") or group, priority = mark[4].priority })
    end
  else
    for _, placed in ipairs(vim.fn.sign_getplaced(buf, { group = "*", lnum = line + 1 })) do
      for _, sign in ipairs(placed.signs) do
        table.insert(out, { kind = sign.name:match("(%u%l+)$") or sign.name, priority = sign.priority })
      end
    end
  end
  return out
end

local function ours(bufnr)
  local out = {}
  for _, d in ipairs(vim.diagnostic.get(bufnr)) do
    if d.source == "fuselens" then
      table.insert(out, d)
    end
  end
  return out
end

--- Make the next vim.ui.select choose the item whose label matches `pattern`; the labels
--- offered go to results[`key`] (default "ui_select").
local function choose(pattern, key)
  local original = vim.ui.select
  vim.ui.select = function(items, opts, on_choice)
    vim.ui.select = original
    local labels, chosen = {}, nil
    for _, item in ipairs(items) do
      local label = opts.format_item and opts.format_item(item) or tostring(item)
      table.insert(labels, label)
      if chosen == nil and label:find(pattern) then
        chosen = item
      end
    end
    results[key or "ui_select"] = labels
    on_choice(chosen)
  end
end

--- The floating window open, if any.
local function open_float()
  for _, win in ipairs(vim.api.nvim_list_wins()) do
    if vim.api.nvim_win_get_config(win).relative ~= "" then
      return win
    end
  end
  return nil
end

--- What the hover float `win` shows: its text, and how it is drawn.
local function hover_shown(win)
  local lines = vim.api.nvim_buf_get_lines(vim.api.nvim_win_get_buf(win), 0, -1, false)
  local config = vim.api.nvim_win_get_config(win)
  local bordered = false -- (a float without a border reports none, or blank padding: "" and " ")
  for _, part in ipairs(type(config.border) == "table" and config.border or {}) do
    local char = type(part) == "table" and part[1] or part
    bordered = bordered or (char ~= "" and char ~= " ")
  end
  return table.concat(lines, "\n"), {
    bordered = bordered,
    width = vim.api.nvim_win_get_width(win),
    height = vim.api.nvim_win_get_height(win),
    linebreak = vim.wo[win].linebreak,
    line_widths = vim.tbl_map(vim.fn.strdisplaywidth, lines),
  }
end

--- The text of the hover window at (`line`, `col`), closed after reading.
local function hover_at(line, col)
  vim.api.nvim_win_set_cursor(0, { line, col })
  vim.lsp.buf.hover()
  local float
  wait(15000, "the hover window", function()
    float = open_float()
    return float ~= nil
  end)
  local text, window = hover_shown(float)
  results.hover_window = window
  vim.api.nvim_win_close(float, true)
  return text
end

--- Press `keys` as a user types them (mappings apply).
local function press(keys)
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(keys, true, false, true), "mx", false)
end

--- Apply the code action at the cursor whose title matches `pattern`, as a user would; every
--- title offered goes to results[`key`] (default "action_titles").
local function code_action(pattern, key)
  key = key or "action_titles"
  if vim.fn.has("nvim-0.8") == 1 then
    results[key] = {}
    vim.lsp.buf.code_action({
      filter = function(action)
        table.insert(results[key], action.title)
        return action.title:find(pattern) ~= nil
      end,
      apply = true,
    })
  else
    choose(pattern, key) -- 0.7 has no filter/apply: the picker is how a user chooses
    vim.lsp.buf.code_action()
  end
end

-- Every publishDiagnostics, in order (the plugin's handler calls the global one).
local publications = {}
local publish = vim.lsp.handlers["textDocument/publishDiagnostics"]
vim.lsp.handlers["textDocument/publishDiagnostics"] = function(err, result, ctx, config)
  local entry = { version = result and result.version, diagnostics = {} }
  for _, d in ipairs(result and result.diagnostics or {}) do
    table.insert(entry.diagnostics, { line = d.range.start.line + 1, severity = d.severity, message = d.message })
  end
  table.insert(publications, entry)
  return publish(err, result, ctx, config)
end

local model = os.getenv("FUSELENS_MODEL")
local bufnr

--- The names of the buffers with changes not written (the user would have to save them).
local function modified_buffers()
  local out = {}
  for _, b in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(b) and vim.bo[b].modified then
      table.insert(out, vim.fn.fnamemodify(vim.api.nvim_buf_get_name(b), ":t"))
    end
  end
  return out
end

--- How many library patches the kernel module at `path` holds on disk.
local function patches_on_disk(path)
  if vim.fn.filereadable(path) == 0 then
    return 0
  end
  local _, count = table.concat(vim.fn.readfile(path), "\n"):gsub("# %-%-%-%- library patch: ", "")
  return count
end

step("open", function()
  vim.cmd("edit " .. vim.fn.fnameescape(model))
  bufnr = vim.api.nvim_get_current_buf()
  wait(20000, "the client to attach", function()
    return fuselens.client(bufnr) ~= nil
  end)
  local client = fuselens.client(bufnr)
  results.cmd = client.config.cmd
  results.root_dir = client.config.root_dir
  results.workspace_trusted = client.config.init_options.workspaceTrusted
end)

if os.getenv("FUSELENS_MODE") == "timeout" then
  step("analysis timed out", function()
    wait(120000, "the diagnostic of the timeout", function()
      for _, d in ipairs(vim.diagnostic.get(bufnr)) do
        if d.source == "fuselens" and d.code == "timeout" then
          return true
        end
      end
      return false
    end)
    results.status = fuselens.status(bufnr)
    results.statuslines = _G.fuselens_test_statuslines
  end)
  save()
  vim.cmd("qa!")
  return
end

if os.getenv("FUSELENS_MODE") == "untrusted" then
  step("no analysis", function()
    -- The server tells the user once; wait for that, then a little more for any diagnostics.
    wait(20000, "the server's explanation", function()
      for _, m in ipairs(_G.fuselens_test_messages) do
        if m:find("trust") then
          return true
        end
      end
      return false
    end)
    vim.wait(3000, function()
      return #ours(bufnr) > 0
    end, 100)
    results.diagnostics = #ours(bufnr)
  end)
  save()
  vim.cmd("qa!")
  return
end

if os.getenv("FUSELENS_MODE") == "library" then
  local MODEL_LINE = 5 -- model = LlamaForCausalLM(config)

  step("library diagnostics", function()
    wait(240000, "diagnostics of the library's clusters", function() -- the first import of transformers
      return #ours(bufnr) > 0
    end)
    results.diagnostics = {}
    for _, d in ipairs(ours(bufnr)) do
      local lsp = d.user_data and d.user_data.lsp or {}
      local related = {}
      for _, r in ipairs(lsp.relatedInformation or {}) do
        table.insert(related, { uri = r.location.uri, range = r.location.range, message = r.message }) -- 0-based
      end
      table.insert(results.diagnostics, { lnum = d.lnum + 1, end_lnum = d.end_lnum + 1, severity = d.severity,
                                          message = d.message, related = related })
    end
    results.status = fuselens.status(bufnr)
  end)

  step("library hover", function()
    results.hover = hover_at(MODEL_LINE, 8)
  end)

  step("library quick fix", function()
    vim.api.nvim_win_set_cursor(0, { MODEL_LINE, 0 })
    code_action("LlamaRMSNorm%.forward %(library code%)")
    wait(15000, "the edit", function()
      return table.concat(vim.api.nvim_buf_get_lines(bufnr, 0, -1, false), "\n"):find("install%(%)") ~= nil
    end)
    results.buffer = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
    local module = vim.fn.fnamemodify(model, ":h") .. "/llama_user_kernels.py"
    wait(15000, "the kernel module", function()
      return vim.fn.filereadable(module) == 1 or vim.fn.bufloaded(module) == 1
    end)
    results.module_on_disk_before_save = vim.fn.filereadable(module) == 1 and #vim.fn.readfile(module) > 0
    results.published_before_save = #publications
    vim.cmd("silent! write") -- the model's buffer, the one the user edits; no other is saved
    results.module = table.concat(vim.fn.readfile(module), "\n")
    results.model_on_disk = table.concat(vim.fn.readfile(model), "\n")
  end)

  step("analysis after saving", function()
    local before = results.published_before_save
    wait(240000, "diagnostics after saving", function()
      return #publications > before
    end)
    results.after_save = publications[#publications]
    local client = fuselens.client(bufnr)
    results.server_running = client ~= nil and not client.is_stopped()
    results.status_after_save = fuselens.status(bufnr)
  end)

  step("second library quick fix", function()
    -- The module exists now: the second patch must reach it on disk too, with nothing to save.
    local module = vim.fn.fnamemodify(model, ":h") .. "/llama_user_kernels.py"
    local before = #publications
    for i, line in ipairs(vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)) do
      if line:find("model = LlamaForCausalLM(config)", 1, true) then
        vim.api.nvim_win_set_cursor(0, { i, 0 })
      end
    end
    code_action("LlamaMLP%.forward %(library code%)", "second_action_titles")
    wait(15000, "the second patch in the kernel module on disk", function()
      return patches_on_disk(module) >= 2
    end)
    results.second_module = table.concat(vim.fn.readfile(module), "\n")
    results.modified_after_second = modified_buffers()
    wait(240000, "the analysis with both patches", function()
      if #publications == before then
        return false
      end
      for _, d in ipairs(publications[#publications].diagnostics) do
        if d.message:find("patch of LlamaMLP.forward (", 1, true) then
          return false
        end
      end
      return true
    end)
    results.after_second = publications[#publications]
    results.status_after_second = fuselens.status(bufnr)
  end)

  results.publications = publications
  save()
  vim.cmd("qa!")
  return
end

if os.getenv("FUSELENS_MODE") == "checkout" then
  local dir, name = vim.fn.fnamemodify(model, ":h"), vim.fn.fnamemodify(model, ":t")
  local function git(...)
    local out = vim.fn.system({ "git", "-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.com", ... })
    if vim.v.shell_error ~= 0 then
      error("git: " .. out)
    end
  end
  local function syntax_error()
    for _, d in ipairs(vim.diagnostic.get(bufnr)) do
      if d.source == "fuselens" and d.code == "syntax" then
        return true
      end
    end
    return false
  end
  local function clusters()
    local n = 0
    for _, d in ipairs(ours(bufnr)) do
      n = n + (d.message:find("^fusable:") and 1 or 0)
    end
    return n
  end

  step("diagnostics", function()
    wait(240000, "3 cluster diagnostics", function()
      return clusters() == 3
    end)
  end)

  step("syntax error saved", function()
    git("init", "-q")
    git("add", name)
    git("commit", "-q", "-m", "a model")
    for i, line in ipairs(vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)) do
      if line == "        x = F.relu(x)" then
        vim.api.nvim_buf_set_lines(bufnr, i - 1, i, false, { "        x = F.relu(x" })
      end
    end
    vim.cmd("silent write")
    wait(60000, "the syntax error", syntax_error)
    results.status_with_the_error = fuselens.status(bufnr)
  end)

  step("checkout", function()
    -- From Neovim, as a user would (or with a git plugin). Back from a shell command (or when the
    -- terminal regains focus), Neovim checks the files it shows and reloads one whose buffer has no
    -- unsaved changes ('autoread'); its main loop does that, which a script does not return to, so
    -- the script asks for the check itself.
    local start = vim.loop.hrtime()
    vim.cmd("silent !git -C " .. vim.fn.shellescape(dir) .. " checkout -- " .. vim.fn.shellescape(name))
    vim.cmd("checktime")
    wait(60000, "the diagnostics of the file checked out", function()
      return not syntax_error() and clusters() == 3
    end)
    results.checkout_seconds = (vim.loop.hrtime() - start) / 1e9
    results.status_after_checkout = fuselens.status(bufnr)
    results.buffer_after_checkout = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
  end)

  step("validation error", function()
    -- The kernel module's name is taken by a file of the user's: the whole-model check cannot run.
    vim.fn.writefile({ "def mine():", "    pass" }, dir .. "/" .. name:gsub("%.py$", "_kernels.py"))
    local told = #_G.fuselens_test_messages
    vim.cmd("FuselensValidate")
    wait(240000, "the validation", function()
      return fuselens.state.last_result["fuselens.validateAll"] ~= nil
    end)
    results.validation_messages = vim.list_slice(_G.fuselens_test_messages, told + 1)
    local model_win = vim.api.nvim_get_current_win()
    vim.cmd("FuselensResults")
    results.results_lines = vim.api.nvim_buf_get_lines(vim.api.nvim_get_current_buf(), 0, -1, false)
    vim.cmd("close")
    vim.api.nvim_set_current_win(model_win)
  end)

  save()
  vim.cmd("qa!")
  return
end

if os.getenv("FUSELENS_MODE") == "kinds" then
  local function text()
    return table.concat(vim.api.nvim_buf_get_lines(bufnr, 0, -1, false), "\n")
  end
  local function line_of(code)
    for i, line in ipairs(vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)) do
      if line:find(code, 1, true) then
        return i
      end
    end
    error("no line holds " .. code)
  end
  local function analyzed_again(before)
    vim.cmd("silent! write")
    wait(240000, "the analysis of the saved file", function()
      return #publications > before and publications[#publications].version == vim.lsp.util.buf_versions[bufnr]
    end)
  end
  results.fixes = {}
  local function fix(kind, code, pattern, expected)
    step("fix " .. kind, function()
      local before = #publications
      vim.api.nvim_win_set_cursor(0, { line_of(code), 8 })
      code_action(pattern)
      wait(15000, "the edit", function()
        return text():find(expected, 1, true) ~= nil
      end)
      results.fixes[kind] = { titles = results.action_titles, buffer = text() }
      analyzed_again(before)
    end)
  end

  local clusters = tonumber(os.getenv("FUSELENS_CLUSTERS"))
  step("diagnostics", function()
    wait(240000, clusters .. " cluster diagnostics", function()
      return #ours(bufnr) >= clusters
    end)
    results.original = text()
    -- What the user reads at the end of each cluster's first line, with Neovim's default diagnostic
    -- config: the virtual text of the line's diagnostics (a pattern's hint may share the line).
    results.cluster_lines = {}
    for _, d in ipairs(ours(bufnr)) do
      if d.message:find("^fusable:") then
        table.insert(results.cluster_lines, { line = d.lnum + 1, message = d.message, shown = virtual_text_on(bufnr, d.lnum),
                                              signs = signs_on(bufnr, d.lnum) })
      end
    end
    results.patterns = 0
    for _, d in ipairs(ours(bufnr)) do
      if d.severity == vim.diagnostic.severity.HINT then
        results.patterns = results.patterns + 1
      end
    end
  end)
  -- Each fix: { kind, a line of code it starts on, the action's title pattern, what the edit writes }.
  for _, f in ipairs(vim.fn.json_decode(os.getenv("FUSELENS_FIXES"))) do
    fix(f[1], f[2], f[3], f[4])
  end
  -- Every fix's kernels, on disk, though only the model's buffer was ever saved.
  local module = model:gsub("%.py$", "_kernels.py")
  results.module_after_fixes = vim.fn.filereadable(module) == 1 and table.concat(vim.fn.readfile(module), "\n") or ""
  results.modified_after_fixes = modified_buffers()
  -- { one = { a line of code, the action's title pattern, what the restore writes back },
  --   all = a line of code }
  local restore = os.getenv("FUSELENS_RESTORE") ~= "" and vim.fn.json_decode(os.getenv("FUSELENS_RESTORE")) or nil
  if restore == nil then
    save()
    vim.cmd("qa!")
    return
  end
  step("restore one", function()
    local before = #publications
    local code, pattern, expected = restore.one[1], restore.one[2], restore.one[3]
    vim.api.nvim_win_set_cursor(0, { line_of(code), 8 })
    code_action(pattern)
    wait(15000, "the restored lines", function()
      return text():find(expected, 1, true) ~= nil
    end)
    results.restore_titles = results.action_titles
    results.restored_one = text()
    analyzed_again(before)
  end)
  if restore.all ~= nil then
    step("restore all", function()
      vim.api.nvim_win_set_cursor(0, { line_of(restore.all), 8 })
      code_action("^Restore the original code of every fused cluster")
      wait(15000, "every cluster restored", function()
        return text():find("cluster", 1, true) == nil
      end)
      results.restored_all = text()
    end)
  end
  vim.cmd("silent! write")
  results.model_on_disk = table.concat(vim.fn.readfile(model), "\n")
  save()
  vim.cmd("qa!")
  return
end

step("diagnostics", function()
  wait(240000, "3 cluster diagnostics", function()
    return #ours(bufnr) >= 3
  end)
  results.diagnostics = {}
  for _, d in ipairs(ours(bufnr)) do
    table.insert(results.diagnostics, { lnum = d.lnum + 1, end_lnum = d.end_lnum + 1, severity = d.severity,
                                        message = d.message })
  end
  results.cluster_ids = fuselens.cluster_ids(bufnr)
  local ih = vim.lsp.inlay_hint
  if type(ih) == "table" and ih.get then -- Neovim 0.10+
    wait(10000, "inlay hints", function()
      return #ih.get({ bufnr = bufnr }) > 0
    end)
    results.inlay_hints = {}
    for _, h in ipairs(ih.get({ bufnr = bufnr })) do
      local label = h.inlay_hint.label
      table.insert(results.inlay_hints, type(label) == "string" and label or label[1].value)
    end
  end
  results.status = fuselens.status(bufnr)
  results.statuslines_at_open = statuslines_since(0)
end)

step("hover", function()
  results.hover = hover_at(19, 12) -- x = F.relu(x)
end)

--- `fn`, then the model's buffer back in a window of its own, however `fn` ended (a float left open,
--- the cursor in it, another buffer shown), so that the steps after it start as they would have.
local function then_back_to_the_model(fn)
  return function()
    local ok, err = pcall(fn)
    for _, win in ipairs(vim.api.nvim_list_wins()) do
      if vim.api.nvim_win_get_config(win).relative ~= "" then
        vim.api.nvim_win_close(win, true)
      end
    end
    vim.cmd("silent! only")
    vim.cmd("buffer " .. bufnr)
    if not ok then
      error(err, 0)
    end
  end
end

--- Press K on 0-based `line`, `col` of the model and wait for the hover float. Before 0.10, K runs
--- 'keywordprg' (pydoc for Python, which headless Neovim would wait on): a command stands in for it
--- here, once the plugin has attached, and says when K ran it.
local function press_k(line, col)
  results.keywordprg_ran = nil
  vim.api.nvim_create_user_command("FuselensTestKeywordprg", function(opts)
    results.keywordprg_ran = opts.args
  end, { nargs = "*", force = true })
  vim.bo[bufnr].keywordprg = ":FuselensTestKeywordprg"
  vim.api.nvim_win_set_cursor(0, { line, col })
  press("K")
  wait(15000, "the hover window", function()
    return open_float() ~= nil or results.keywordprg_ran ~= nil
  end)
  if results.keywordprg_ran then
    error("K ran 'keywordprg' (" .. results.keywordprg .. ") on " .. results.keywordprg_ran)
  end
  return open_float()
end

step("K", then_back_to_the_model(function()
  results.keywordprg = vim.bo[bufnr].keywordprg
  results.hover_from_k, results.hover_window_from_k = hover_shown(press_k(19, 12)) -- x = F.relu(x)
end))

step("open the kernel from the hover", then_back_to_the_model(function()
  -- K, K again to go into the float, then <CR> on the cluster's "Open the kernel".
  local float = press_k(19, 12)
  press("K")
  wait(15000, "the cursor in the hover window", function()
    return vim.api.nvim_get_current_win() == float
  end)
  for row, line in ipairs(vim.api.nvim_buf_get_lines(0, 0, -1, false)) do
    local col = line:find("Open the kernel", 1, true)
    if col then
      vim.api.nvim_win_set_cursor(0, { row, col + 4 })
      break
    end
  end
  press("<CR>")
  wait(15000, "the kernel view", function()
    return vim.api.nvim_buf_get_name(0):find("example_net_cluster0%.py$") ~= nil
  end)
  results.kernel_view = {
    path = vim.api.nvim_buf_get_name(0),
    readonly = vim.bo.readonly,
    line = vim.api.nvim_get_current_line(),
    floats = open_float() ~= nil,
  }
end))

step("codelens", function()
  wait(30000, "code lenses", function()
    return #vim.lsp.codelens.get(bufnr) >= 3
  end)
  results.lenses = {}
  for _, lens in ipairs(vim.lsp.codelens.get(bufnr)) do
    table.insert(results.lenses, { line = lens.range.start.line + 1, title = lens.command and lens.command.title })
  end
end)

--- What is drawn for the lenses: the plugin's virtual lines, and any end-of-line virtual text on
--- the class line from any namespace (Neovim's own lens display included).
local function lens_drawing(buf)
  buf = buf or bufnr
  local drawn = {}
  for _, mark in ipairs(require("fuselens.lenses").drawn(buf)) do
    table.insert(drawn, { line = mark.line + 1, above = mark.above, rows = mark.rows })
  end
  local line = vim.lsp.codelens.get(buf)[1].range.start.line
  local at_line_end = {}
  for _, ns in pairs(vim.api.nvim_get_namespaces()) do
    for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(buf, ns, { line, 0 }, { line, -1 }, { details = true })) do
      for _, chunk in ipairs(mark[4].virt_text or {}) do
        table.insert(at_line_end, chunk[1])
      end
    end
  end
  return { width = vim.api.nvim_win_get_width(0), drawn = drawn, at_line_end = at_line_end }
end

step("lens drawing", function()
  wait(10000, "the lenses drawn", function()
    return #require("fuselens.lenses").drawn(bufnr) > 0
  end)
  results.lens_drawing = { lens_drawing() }
  -- A wider editor: the lenses are laid out again for the new width. Headless Neovim has no UI
  -- to resize, so the test fires the event a terminal's resize fires.
  vim.o.columns = 200
  vim.cmd("doautocmd VimResized")
  wait(5000, "the lenses laid out for 200 columns", function()
    local marks = require("fuselens.lenses").drawn(bufnr)
    return #marks == 1 and #marks[1].rows == 1
  end)
  table.insert(results.lens_drawing, lens_drawing())
  vim.o.columns = 80
end)

step("results before validating", function()
  -- Nothing validated in this session yet: the server answers with the run its history kept.
  local model_win = vim.api.nvim_get_current_win()
  vim.cmd("FuselensResults")
  wait(20000, "the kept results", function()
    local buf = fuselens.state.results_buffer
    return buf ~= nil and vim.api.nvim_buf_is_valid(buf) and vim.api.nvim_buf_get_lines(buf, 0, 1, false)[1] ~= ""
  end)
  local buf = fuselens.state.results_buffer
  results.kept_results = { modifiable = vim.bo[buf].modifiable, lines = vim.api.nvim_buf_get_lines(buf, 0, -1, false) }
  vim.cmd("close")
  vim.api.nvim_set_current_win(model_win)
end)

step("validate from the lens", function()
  local from = #_G.fuselens_test_statuslines
  vim.api.nvim_win_set_cursor(0, { 11, 0 }) -- the class line carries the lenses
  choose("^Validate all$")
  vim.lsp.codelens.run()
  wait(240000, "the validation result", function()
    return fuselens.state.last_result["fuselens.validateAll"] ~= nil
  end)
  local result = fuselens.state.last_result["fuselens.validateAll"]
  results.validation = { mode = result.mode, problems = result.problems, error = result.error,
                         message = result.message, clusters = {} }
  for _, m in ipairs(result.models or {}) do
    for _, c in ipairs(m.clusters or {}) do
      results.validation.clusters[c.id] = c.status
    end
    results.validation.model = m.model and m.model.status
  end
  results.progress = fuselens.state.progress_log
  results.statuslines_validating = statuslines_since(from)
end)

step("results view", function()
  local model_win = vim.api.nvim_get_current_win()
  vim.cmd("FuselensResults")
  local buf = vim.api.nvim_get_current_buf()
  results.results_view = {
    name = vim.fn.fnamemodify(vim.api.nvim_buf_get_name(buf), ":t"),
    filetype = vim.bo[buf].filetype,
    modifiable = vim.bo[buf].modifiable,
    lines = vim.api.nvim_buf_get_lines(buf, 0, -1, false),
  }
  vim.cmd("close")
  vim.api.nvim_set_current_win(model_win)
end)

step("profile another file", function()
  -- A second model (the example at a smaller input) opened beside the validated one, and profiled
  -- from its Profile lens: its status, its lens and its results are its own.
  local other = vim.fn.fnamemodify(model, ":h") .. "/other_net.py"
  local lines = vim.fn.readfile(model)
  for i, line in ipairs(lines) do
    lines[i] = line:gsub("input=%(16384, 1024%)", "input=(512, 1024)")
  end
  vim.fn.writefile(lines, other)
  vim.cmd("edit " .. vim.fn.fnameescape(other))
  local buf = vim.api.nvim_get_current_buf()
  wait(240000, "its cluster diagnostics", function()
    return #ours(buf) >= 3
  end)
  wait(30000, "its lenses", function()
    return #vim.lsp.codelens.get(buf) >= 4 and #require("fuselens.lenses").drawn(buf) > 0
  end)
  -- Whatever the status of the validated file says while this one profiles (each change, in order).
  local validated_status, recording = {}, false
  vim.api.nvim_create_autocmd("User", {
    pattern = "FuselensStatus",
    callback = function()
      local text = recording and fuselens.status(bufnr)
      if not text then
        return
      end
      if validated_status[#validated_status] ~= text then
        table.insert(validated_status, text)
      end
    end,
  })
  local from = #_G.fuselens_test_statuslines
  recording = true
  vim.api.nvim_win_set_cursor(0, { 11, 0 })
  choose("^Profile$")
  vim.lsp.codelens.run()
  wait(240000, "the profile", function()
    return fuselens.state.last_result["fuselens.profile"] ~= nil
  end)
  wait(15000, "the lens with the measured time", function()
    for _, lens in ipairs(vim.lsp.codelens.get(buf)) do
      if lens.command and lens.command.title:find("^◔") then
        return #require("fuselens.lenses").drawn(buf) > 0
      end
    end
    return false
  end)
  recording = false
  results.profile_statuslines = statuslines_since(from)
  results.validated_status_while_profiling = validated_status
  results.profile_lens_drawing = lens_drawing(buf)
  local profile_win = vim.api.nvim_get_current_win()
  vim.cmd("FuselensResults")
  local shown = vim.api.nvim_get_current_buf()
  results.profile_results = {
    name = vim.api.nvim_buf_get_name(shown),
    lines = vim.api.nvim_buf_get_lines(shown, 0, -1, false),
  }
  vim.cmd("close")
  vim.api.nvim_set_current_win(profile_win)
  -- Back in the validated file: its own results, still.
  vim.cmd("buffer " .. bufnr)
  vim.cmd("FuselensResults")
  shown = vim.api.nvim_get_current_buf()
  results.validated_results = {
    name = vim.api.nvim_buf_get_name(shown),
    lines = vim.api.nvim_buf_get_lines(shown, 0, -1, false),
  }
  vim.cmd("close")
  vim.api.nvim_set_current_win(profile_win)
end)

step("validate and profile one file at once", function()
  -- "Validate all" and then "Profile" from the validated file's lenses, neither waiting for the other;
  -- the profiled file stays open. Each file's status, as it changes, until both answers are in.
  local other = vim.fn.bufnr(vim.fn.fnamemodify(model, ":h") .. "/other_net.py")
  vim.cmd("buffer " .. bufnr)
  fuselens.state.last_result["fuselens.validateAll"] = nil
  fuselens.state.last_result["fuselens.profile"] = nil
  local seen = { validated = {}, other = {} }
  local function record()
    for key, buf in pairs({ validated = bufnr, other = other }) do
      local text = fuselens.status(buf)
      if seen[key][#seen[key]] ~= text then
        table.insert(seen[key], text)
      end
    end
  end
  local recording = vim.api.nvim_create_autocmd("User", { pattern = "FuselensStatus", callback = record })
  vim.api.nvim_win_set_cursor(0, { 11, 0 })
  choose("^Validate all$")
  vim.lsp.codelens.run()
  choose("^Profile$")
  vim.lsp.codelens.run()
  wait(240000, "both answers", function()
    return fuselens.state.last_result["fuselens.validateAll"] ~= nil
      and fuselens.state.last_result["fuselens.profile"] ~= nil
  end)
  record()
  vim.api.nvim_del_autocmd(recording)
  results.statuses_with_both = seen
end)

step("quick fix", function()
  vim.api.nvim_win_set_cursor(0, { 18, 8 }) -- x = x * 2.0, the first line of cluster c0
  code_action("^Fuse lines 18")
  wait(15000, "the edit", function()
    return table.concat(vim.api.nvim_buf_get_lines(bufnr, 0, -1, false), "\n"):find("cluster0%(") ~= nil
  end)
  results.buffer = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
  local module = vim.fn.fnamemodify(model, ":h") .. "/example_net_kernels.py"
  -- Written by the server (writeKernelModule), or by a CreateFile edit into a buffer to save.
  wait(15000, "the kernel module", function()
    return vim.fn.filereadable(module) == 1 or vim.fn.bufloaded(module) == 1
  end)
  results.module_on_disk_before_save = vim.fn.filereadable(module) == 1 and #vim.fn.readfile(module) > 0
  vim.cmd("silent! wall")
  results.module = table.concat(vim.fn.readfile(module), "\n")
  results.model_on_disk = table.concat(vim.fn.readfile(model), "\n")
end)

step("syntax error", function()
  -- A second model with an unmatched bracket: the status names the problem, not "0 clusters".
  local broken = vim.fn.fnamemodify(model, ":h") .. "/broken.py"
  vim.fn.writefile({ "import torch.nn as nn", "", "class M(nn.Module):", "    def forward(self, x):",
                     "        return (x * 2))" }, broken)
  vim.cmd("edit " .. vim.fn.fnameescape(broken))
  local buf = vim.api.nvim_get_current_buf()
  wait(60000, "the syntax error", function()
    for _, d in ipairs(vim.diagnostic.get(buf)) do
      if d.source == "fuselens" and d.code == "syntax" then
        return true
      end
    end
    return false
  end)
  results.syntax_status = fuselens.status(buf)
end)

save()
vim.cmd("qa!")
