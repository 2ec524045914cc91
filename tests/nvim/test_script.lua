-- Drives the fuselens plugin in headless Neovim the way a user would, and writes what
-- happened to $FUSELENS_RESULTS as JSON for tests/test_nvim.py to assert on.
--   $FUSELENS_MODE = "full": diagnostics, hover, lens -> validation, quick fix
--   $FUSELENS_MODE = "untrusted": the folder is not trusted; nothing may be analyzed
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

local function ours(bufnr)
  local out = {}
  for _, d in ipairs(vim.diagnostic.get(bufnr)) do
    if d.source == "fuselens" then
      table.insert(out, d)
    end
  end
  return out
end

--- Make the next vim.ui.select choose the item whose label matches `pattern`.
local function choose(pattern)
  local original = vim.ui.select
  vim.ui.select = function(items, opts, on_choice)
    vim.ui.select = original
    local labels = {}
    for _, item in ipairs(items) do
      local label = opts.format_item and opts.format_item(item) or tostring(item)
      table.insert(labels, label)
      if label:find(pattern) then
        results.ui_select = labels
        return on_choice(item)
      end
    end
    results.ui_select = labels
    on_choice(nil)
  end
end

local model = os.getenv("FUSELENS_MODEL")
local bufnr

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
end)

step("hover", function()
  vim.api.nvim_win_set_cursor(0, { 19, 12 }) -- x = F.relu(x)
  vim.lsp.buf.hover()
  local float
  wait(15000, "the hover window", function()
    for _, win in ipairs(vim.api.nvim_list_wins()) do
      if vim.api.nvim_win_get_config(win).relative ~= "" then
        float = win
        return true
      end
    end
    return false
  end)
  results.hover = table.concat(vim.api.nvim_buf_get_lines(vim.api.nvim_win_get_buf(float), 0, -1, false), "\n")
  vim.api.nvim_win_close(float, true)
end)

step("codelens", function()
  wait(30000, "code lenses", function()
    return #vim.lsp.codelens.get(bufnr) >= 3
  end)
  results.lenses = {}
  for _, lens in ipairs(vim.lsp.codelens.get(bufnr)) do
    table.insert(results.lenses, { line = lens.range.start.line + 1, title = lens.command and lens.command.title })
  end
end)

step("validate from the lens", function()
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
end)

step("quick fix", function()
  vim.api.nvim_win_set_cursor(0, { 18, 8 }) -- x = x * 2.0, the first line of cluster c0
  local pattern = "^Fuse lines 18"
  if vim.fn.has("nvim-0.8") == 1 then
    vim.lsp.buf.code_action({
      filter = function(action)
        return action.title:find(pattern) ~= nil
      end,
      apply = true,
    })
  else
    choose(pattern) -- 0.7 has no filter/apply: the picker is how a user chooses
    vim.lsp.buf.code_action()
  end
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

save()
vim.cmd("qa!")
