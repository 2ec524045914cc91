-- fuselens for Neovim: starts `fuselens serve --stdio` for Python buffers and adds
-- :FuselensAnalyze, :FuselensValidate, :FuselensResults, :FuselensShowKernel and :FuselensRestart.
--
--   require("fuselens").setup({
--     python = "/path/to/venv/bin/python",    -- or cmd = {...}; default: `fuselens` on PATH
--     trusted_folders = { "~/src/models" },   -- analysis runs model code: only here
--     settings = { device = "h100", models = { Net = { inputs = { { 8, 1024 } } } } },
--     interpret = true,                       -- validate in the Triton interpreter (no GPU)
--   })
--
-- Diagnostics, hover and code actions are Neovim's own LSP features; this file adds what
-- they need from fuselens: trust, settings, code lens refresh, inlay hints, commands, the hover's
-- kernel links (hover.lua) and K for the hover where Neovim does not map it.

local compat = require("fuselens.compat")
local hover = require("fuselens.hover")
local lenses = require("fuselens.lenses")
local trust = require("fuselens.trust")

local M = {}

local NAME = "fuselens"

local defaults = {
  cmd = nil, -- the whole server command; overrides `python`
  python = nil, -- an interpreter with fuselens: runs `python -m fuselens.cli.main serve --stdio`
  filetypes = { "python" },
  root_markers = { "pyproject.toml", ".git" },
  trusted_folders = {},
  -- Server settings, as in VS Code: device, peakGbps, severity, show, inlayHints, codeLens,
  -- models, worker = { python, timeoutSeconds, validateTimeoutSeconds, memoryMb }, remoteRunner, remoteProfiler.
  settings = {},
  -- Validation options: nil lets the server ask on a machine without CUDA; true always
  -- checks numerics in the Triton interpreter; false never does.
  interpret = nil,
  inlay_hints = true,
  codelens = true,
  -- The hover float: a border, and a size cap so that a cluster's hover never covers the code.
  hover = { border = "rounded", max_width = 100, max_height = 30 },
  on_attach = nil, -- function(client, bufnr), called after fuselens' own
}

M.config = vim.deepcopy(defaults)

-- What the plugin has seen, for statuslines and tests: require("fuselens").state. Everything about a
-- document is kept by its buffer number: the status and :FuselensResults are of the buffer they are for.
M.state = {
  clusters = {}, -- bufnr -> number of cluster diagnostics
  problems = {}, -- bufnr -> what stopped its analysis, in a status's words ("syntax error"), or nil
  analyzing = {}, -- bufnr -> true from the moment it is sent for analysis (open, save) until its diagnostics
  -- bufnr -> its commands not yet answered, oldest first (a validation and a profile can run at once):
  -- each { doing = "validating" | "profiling", order = when it was sent, token = its work-done progress }
  running = {},
  progress = {}, -- token -> { title, message, percentage, done }
  progress_log = {}, -- every work-done progress value received, in order
  last_result = {}, -- command name -> what the server answered last
  results = {}, -- bufnr -> its last validation's or profile's result: :FuselensResults shows its view
  results_buffers = {}, -- bufnr -> the scratch buffer :FuselensResults shows its results in
  results_buffer = nil, -- the results buffer shown last
}

-- What the status says a long command of the server's is doing while it runs.
local DOING = {
  ["fuselens.validateAll"] = "validating",
  ["fuselens.validateKernel"] = "validating",
  ["fuselens.profile"] = "profiling",
  ["fuselens.probe"] = "probing",
}

local function server_cmd(cfg)
  if cfg.cmd then
    return cfg.cmd
  end
  if cfg.python then
    return { vim.fn.expand(cfg.python), "-m", "fuselens.cli.main", "serve", "--stdio" }
  end
  return { "fuselens", "serve", "--stdio" }
end

-- The server runs from a folder of the plugin's own: `python -m` puts the working directory
-- first on sys.path, and the workspace must not supply the code that runs.
local function neutral_dir()
  local dir = vim.fn.stdpath("cache") .. "/fuselens"
  vim.fn.mkdir(dir, "p")
  return dir
end

--- The client attached to `bufnr`, if any.
function M.client(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local list = (vim.lsp.get_clients or vim.lsp.get_active_clients)()
  for _, client in ipairs(list) do
    if client.name == NAME and vim.lsp.buf_is_attached(bufnr, client.id) then
      return client
    end
  end
  return nil
end

local function notify(message, level)
  vim.notify("fuselens: " .. message, level or vim.log.levels.INFO)
end

--- Ask for the code lenses of `bufnr` again and draw them (lenses.lua: above the class line);
--- Neovim's own lens display where the plugin cannot keep them in Neovim's lens store.
local function refresh_lenses(bufnr)
  if not vim.api.nvim_buf_is_valid(bufnr) then
    return
  end
  local client = M.client(bufnr)
  if client and lenses.supported() then
    lenses.refresh(client, bufnr)
  elseif client then
    compat.refresh_codelens(bufnr)
  end
end

--- Tell statuslines the status changed (`User FuselensStatus`), and draw them again: Neovim redraws a
--- statusline on its own only when something else is redrawn, not while a validation runs.
local function status_changed()
  pcall(vim.cmd, "doautocmd <nomodeline> User FuselensStatus")
  pcall(vim.cmd, "redrawstatus!")
end

local commands_sent = 0 -- (orders the commands running at once)

--- `run`, one of `bufnr`'s commands, has its answer: the buffer's status is that of the others, if any.
local function answered(bufnr, run)
  local runs = M.state.running[bufnr] or {}
  for i, other in ipairs(runs) do
    if other == run then
      table.remove(runs, i)
      break
    end
  end
  if #runs == 0 then
    M.state.running[bufnr] = nil
  end
end

--- Send workspace/executeCommand; `on_result(result)` gets the server's answer. A validation or a
--- profile shows in `bufnr`'s status while it runs, and its results are `bufnr`'s.
local function execute(client, bufnr, command, arguments, on_result)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local run = nil
  if DOING[command] then
    commands_sent = commands_sent + 1
    run = { doing = DOING[command], order = commands_sent }
  end
  if run then
    M.state.running[bufnr] = M.state.running[bufnr] or {}
    table.insert(M.state.running[bufnr], run)
    status_changed()
  end
  compat.request(client, "workspace/executeCommand", { command = command, arguments = arguments }, function(err, result)
    if run then
      answered(bufnr, run)
    end
    if err then
      status_changed()
      notify(err.message or tostring(err), vim.log.levels.WARN)
      return
    end
    M.state.last_result[command] = result
    if type(result) == "table" and result.results_markdown then
      M.state.results[bufnr] = result -- :FuselensResults in this buffer shows its view
    end
    status_changed()
    if on_result then
      on_result(result)
    end
  end, bufnr)
end

local function validate_options()
  if M.config.interpret == nil then
    return vim.empty_dict()
  end
  return { interpret = M.config.interpret }
end

--- Put the cursor on the definition of `kernel` in the current buffer, if it is there.
local function go_to_definition(kernel)
  for i, line in ipairs(vim.api.nvim_buf_get_lines(0, 0, -1, false)) do
    if line:sub(1, #kernel + 5) == "def " .. kernel .. "(" then
      vim.api.nvim_win_set_cursor(0, { i, 0 })
      return
    end
  end
end

--- fuselens.showKernel with `args` ([uri] or [uri, cluster or model]): the server shows the view.
local function show_kernel_view(client, bufnr, args)
  execute(client, bufnr, "fuselens.showKernel", args, function(result)
    -- A client that supports window/showDocument has been shown the file by the server, at the
    -- kernel; Neovim 0.7 does not support it, and the plugin opens the view there.
    local caps = vim.lsp.protocol.make_client_capabilities()
    local shown = caps.window and caps.window.showDocument and caps.window.showDocument.support
    if result and result.path and not shown then
      vim.cmd("split " .. vim.fn.fnameescape(result.path))
      if result.kernels and #result.kernels == 1 then
        go_to_definition(result.kernels[1])
      end
    end
  end)
end

-- Every command a lens carries runs through a client-side handler: Neovim sends a lens's command
-- to the server itself only for commands without one, and then redraws the lenses its own way.
-- Lenses run `fuselens.validateAll [uri, model]`; its handler adds the validation options (the
-- third argument) before passing the command on to the server.
local function client_commands()
  local function validate(command, ctx)
    local client = vim.lsp.get_client_by_id(ctx.client_id)
    local args = vim.deepcopy(command.arguments or {})
    args[2] = args[2] == nil and vim.NIL or args[2]
    args[3] = validate_options()
    execute(client, ctx.bufnr, command.command, args)
  end
  local function show_kernel(command, ctx)
    show_kernel_view(vim.lsp.get_client_by_id(ctx.client_id), ctx.bufnr, command.arguments or {})
  end
  -- The Profile and Probe lenses: the lens then gives what was measured.
  local function profile(command, ctx)
    execute(vim.lsp.get_client_by_id(ctx.client_id), ctx.bufnr, command.command, command.arguments or {}, function()
      refresh_lenses(ctx.bufnr)
    end)
  end
  return {
    ["fuselens.validateAll"] = validate,
    ["fuselens.validateKernel"] = validate,
    ["fuselens.showKernel"] = show_kernel,
    ["fuselens.profile"] = profile,
    ["fuselens.probe"] = profile,
  }
end

--- Run the server's `command` with `arguments` for `bufnr`, as a link in its hover names it ("Open the
--- kernel"): through the plugin's handler of that command where it has one, as a lens would.
local function run_link(bufnr, command, arguments)
  local client = M.client(bufnr)
  if not client then
    notify("no fuselens server for this buffer", vim.log.levels.WARN)
    return
  end
  local handler = client_commands()[command]
  if handler then
    handler({ title = command, command = command, arguments = arguments }, { client_id = client.id, bufnr = bufnr })
  else
    execute(client, bufnr, command, arguments)
  end
end

-- A diagnostic that stopped the analysis, by its code, as the status names it: "0 clusters" would
-- say the file was analyzed. The first five are problems in the file; the others, an analysis that
-- did not finish.
local PROBLEM_WORDS = {
  syntax = "syntax error",
  import = "import error",
  construct = "model not built",
  inputs = "no inputs",
  trace = "forward failed",
  timeout = "analysis timed out",
  memory = "analysis out of memory",
  crash = "analysis crashed",
  internal = "analysis failed",
  unavailable = "no worker",
}

local function problem_of(diagnostics)
  for _, d in ipairs(diagnostics or {}) do
    if d.source == "fuselens" and PROBLEM_WORDS[d.code] then
      return PROBLEM_WORDS[d.code]
    end
  end
  return nil
end

local function count_clusters(diagnostics)
  local n = 0
  for _, d in ipairs(diagnostics or {}) do
    if d.source == "fuselens" and type(d.data) == "table" and d.data.cluster then
      n = n + 1
    end
  end
  return n
end

local function live(token)
  local p = token and M.state.progress[token]
  return p ~= nil and not p.done
end

--- The server begins a work-done progress for each command's work as it starts it (one after another:
--- a validation, then the same in the interpreter): it belongs to a running command that has none
--- going, one doing what its title says ("fuselens: profiling Net") where there is one, the one sent
--- first where several are alike.
local function own_progress(token, title)
  local owner, owner_fits
  for _, runs in pairs(M.state.running) do
    for _, run in ipairs(runs) do
      local fits = title ~= nil and title:find(run.doing, 1, true) ~= nil
      local better = owner == nil or (fits and not owner_fits) or (fits == owner_fits and run.order < owner.order)
      if not live(run.token) and better then
        owner, owner_fits = run, fits
      end
    end
  end
  if owner then
    owner.token = token
  end
end

local function handlers()
  return {
    -- (nil on 0.11+, where vim.lsp.buf.hover() draws the float: setup() follows its links then)
    ["textDocument/hover"] = hover.handler(compat.hover_handler(M.config.hover), run_link, M.config.hover),
    -- New diagnostics mean a new analysis: lenses are answered from it, so ask for them now.
    ["textDocument/publishDiagnostics"] = function(err, result, ctx, config)
      vim.lsp.handlers["textDocument/publishDiagnostics"](err, result, ctx, config)
      local bufnr = vim.uri_to_bufnr(result.uri)
      M.state.clusters[bufnr] = count_clusters(result.diagnostics)
      M.state.problems[bufnr] = problem_of(result.diagnostics)
      M.state.analyzing[bufnr] = nil
      status_changed()
      if M.config.codelens and vim.api.nvim_buf_is_loaded(bufnr) then
        vim.schedule(function()
          refresh_lenses(bufnr)
        end)
      end
    end,
    ["workspace/inlayHint/refresh"] = function(err, result, ctx, config)
      local default = vim.lsp.handlers["workspace/inlayHint/refresh"]
      local answer = default and default(err, result, ctx, config) or vim.NIL
      -- Once the re-requested hints are in, make sure they are drawn (see compat.redraw_inlay_hints).
      vim.defer_fn(function()
        local client = vim.lsp.get_client_by_id(ctx.client_id)
        for bufnr in pairs(client and client.attached_buffers or {}) do
          compat.redraw_inlay_hints(bufnr)
        end
      end, 300)
      return answer
    end,
    -- Lenses are drawn by the plugin (lenses.lua); Neovim's own refresh would draw them a second time.
    ["workspace/codeLens/refresh"] = function(_, _, ctx)
      local client = vim.lsp.get_client_by_id(ctx.client_id)
      for bufnr in pairs(client and client.attached_buffers or {}) do
        vim.schedule(function()
          refresh_lenses(bufnr)
        end)
      end
      return vim.NIL
    end,
    ["$/progress"] = function(err, result, ctx, config)
      local value = result and result.value or {}
      local token = tostring(result and result.token)
      if value.kind == "begin" then
        own_progress(token, value.title)
      end
      local entry = M.state.progress[token] or {}
      entry.title = value.title or entry.title
      entry.message = value.message or entry.message
      entry.percentage = value.percentage or entry.percentage
      entry.done = value.kind == "end"
      M.state.progress[token] = entry
      table.insert(M.state.progress_log, { token = token, kind = value.kind, title = value.title,
                                           message = value.message, percentage = value.percentage })
      status_changed()
      return vim.lsp.handlers["$/progress"](err, result, ctx, config)
    end,
  }
end

--- The diagnostics of fuselens' namespace sorted by severity, whatever the user's global config: a
--- cluster (information) and a pattern (hint) often share a line, and unsorted, the hint's message is
--- the one virtual text shows and its sign the one the line gets, for every cluster of the llama block.
local function sort_diagnostics(client)
  local ok, namespace = pcall(vim.lsp.diagnostic.get_namespace, client.id, false)
  if ok and namespace then
    vim.diagnostic.config({ severity_sort = true }, namespace)
  end
end

--- `bufnr` was sent for analysis (opened, saved): "analyzing" until its diagnostics come back. Only in a
--- folder the plugin trusts: elsewhere the server may analyze nothing, and the status would spin.
local function sent_for_analysis(client, bufnr)
  if client.config.init_options and client.config.init_options.workspaceTrusted then
    M.state.analyzing[bufnr] = true
    status_changed()
  end
end

--- K shows the hover in `bufnr` where Neovim does not map it so itself (before 0.10, K runs 'keywordprg':
--- pydoc in a Python buffer), by the rule of later Neovims: unless the user mapped K or chose their
--- own 'keywordprg'.
local function map_hover_key(bufnr)
  if compat.maps_hover_key() or not compat.keywordprg_is_default(bufnr) then
    return
  end
  vim.api.nvim_buf_call(bufnr, function()
    if vim.fn.maparg("K", "n") == "" then
      vim.keymap.set("n", "K", vim.lsp.buf.hover, { buffer = bufnr, desc = "vim.lsp.buf.hover()" })
    end
  end)
end

local function on_attach(client, bufnr)
  sort_diagnostics(client)
  map_hover_key(bufnr)
  sent_for_analysis(client, bufnr)
  local analysis = vim.api.nvim_create_augroup("fuselens_analysis_" .. bufnr, { clear = true })
  vim.api.nvim_create_autocmd("BufWritePost", {
    group = analysis,
    buffer = bufnr,
    callback = function()
      sent_for_analysis(client, bufnr)
    end,
  })
  if M.config.inlay_hints then
    compat.enable_inlay_hints(bufnr) -- Neovim 0.10+; older ones show the diagnostics only
  end
  if M.config.codelens then
    local group = vim.api.nvim_create_augroup("fuselens_codelens_" .. bufnr, { clear = true })
    vim.api.nvim_create_autocmd({ "BufEnter", "InsertLeave" }, {
      group = group,
      buffer = bufnr,
      callback = function()
        refresh_lenses(bufnr)
      end,
    })
  end
  if M.config.on_attach then
    M.config.on_attach(client, bufnr)
  end
end

local function client_config(root)
  local cfg = M.config
  return {
    name = NAME,
    cmd = server_cmd(cfg),
    cmd_cwd = neutral_dir(),
    root_dir = root,
    init_options = {
      settings = cfg.settings,
      workspaceTrusted = trust.workspace_trusted(root, cfg.trusted_folders),
    },
    settings = { fuselens = cfg.settings }, -- answers workspace/configuration
    handlers = handlers(),
    commands = client_commands(),
    on_attach = on_attach,
  }
end

--- Start or reuse the server for `bufnr` (a Python file on disk).
function M.attach(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local file = vim.api.nvim_buf_get_name(bufnr)
  if vim.bo[bufnr].buftype ~= "" or file == "" then
    return nil
  end
  local root = compat.find_root(file, M.config.root_markers) or vim.fn.fnamemodify(file, ":p:h")
  return compat.start(client_config(root), bufnr)
end

local function current(bufnr)
  local client = M.client(bufnr)
  if not client then
    notify("no fuselens server for this buffer", vim.log.levels.WARN)
  end
  return client, vim.uri_from_bufnr(bufnr)
end

--- Cluster ids in the buffer's diagnostics (for completion and :FuselensValidate).
function M.cluster_ids(bufnr)
  local ids = {}
  for _, d in ipairs(vim.diagnostic.get(bufnr or 0)) do
    local data = d.user_data and d.user_data.lsp and d.user_data.lsp.data or d.data
    if d.source == "fuselens" and type(data) == "table" and data.cluster then
      table.insert(ids, data.cluster)
    end
  end
  return ids
end

function M.analyze(bufnr)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  local client, uri = current(bufnr)
  if client then
    execute(client, bufnr, "fuselens.analyze", { uri }, function(result)
      if result and result.scheduled == false then
        notify("this folder is not trusted: add it to trusted_folders in require('fuselens').setup{}",
          vim.log.levels.WARN)
      end
    end)
  end
end

--- Validate one cluster's kernel, or all of the file's kernels when `cluster` is nil.
function M.validate(bufnr, cluster)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  local client, uri = current(bufnr)
  if not client then
    return
  end
  if cluster and cluster ~= "" then
    execute(client, bufnr, "fuselens.validateKernel", { uri, cluster, validate_options() })
  else
    execute(client, bufnr, "fuselens.validateAll", { uri, vim.NIL, validate_options() })
  end
end

function M.show_kernel(bufnr, which)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  local client, uri = current(bufnr)
  if not client then
    return
  end
  local args = { uri }
  if which and which ~= "" then
    args[2] = which
  end
  show_kernel_view(client, bufnr, args)
end

function M.restart()
  for _, client in ipairs((vim.lsp.get_clients or vim.lsp.get_active_clients)()) do
    if client.name == NAME then
      compat.stop(client)
    end
  end
  vim.defer_fn(function()
    for _, bufnr in ipairs(vim.api.nvim_list_bufs()) do
      if vim.api.nvim_buf_is_loaded(bufnr) and vim.tbl_contains(M.config.filetypes, vim.bo[bufnr].filetype) then
        M.attach(bufnr)
      end
    end
  end, 500)
end

--- `markdown` (the server's results view for the buffer `bufnr`) in that buffer's read-only scratch
--- buffer, named after its file.
local function show_markdown(bufnr, markdown)
  local buf = M.state.results_buffers[bufnr]
  if not (buf and vim.api.nvim_buf_is_valid(buf)) then
    buf = vim.api.nvim_create_buf(false, true) -- unlisted scratch: nothing to save
    local file = vim.fn.fnamemodify(vim.api.nvim_buf_get_name(bufnr), ":~:.")
    pcall(vim.api.nvim_buf_set_name, buf, "fuselens://results/" .. file)
    vim.bo[buf].filetype = "markdown"
    M.state.results_buffers[bufnr] = buf
  end
  vim.bo[buf].modifiable = true
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, vim.split(markdown, "\n", { plain = true }))
  vim.bo[buf].modifiable = false
  M.state.results_buffer = buf
  if vim.fn.bufwinnr(buf) == -1 then
    vim.cmd("botright split")
    vim.api.nvim_win_set_buf(0, buf)
  end
  return buf
end

--- The results of the buffer's last validation or profile in this session (the server's markdown: its
--- table, and for a validation the file's earlier runs) in a scratch buffer of its own. Before any,
--- the last validation the server kept for the buffer's file, if there is one.
function M.show_results(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local latest = M.state.results[bufnr]
  if latest and latest.results_markdown then
    return show_markdown(bufnr, latest.results_markdown)
  end
  local client = M.client(bufnr)
  if not client then
    notify("no validation yet: run :FuselensValidate", vim.log.levels.INFO)
    return nil
  end
  execute(client, bufnr, "fuselens.validationResults", { vim.uri_from_bufnr(bufnr) }, function(result)
    if type(result) == "table" and result.results_markdown then
      show_markdown(bufnr, result.results_markdown)
    else
      notify(((type(result) == "table" and result.message) or "no validation yet") .. ": run :FuselensValidate",
        vim.log.levels.INFO)
    end
  end)
  return nil
end


--- The buffer a statusline is drawn for: the window's (a statusline sets g:statusline_winid), else
--- the current one.
local function statusline_buffer()
  local win = vim.g.statusline_winid
  if win and vim.api.nvim_win_is_valid(win) then
    return vim.api.nvim_win_get_buf(win)
  end
  return vim.api.nvim_get_current_buf()
end

local function progress_text(p)
  return p.title .. (p.percentage and (" " .. p.percentage .. "%") or "")
end

--- What the validations and profiles running for `bufnr` show: the progress of the newest that reports
--- some.
local function running_status(bufnr)
  local runs = M.state.running[bufnr] or {}
  for i = #runs, 1, -1 do
    local p = live(runs[i].token) and M.state.progress[runs[i].token]
    if p and p.title then
      return progress_text(p)
    end
  end
  if #runs > 0 then -- begun, with no progress yet or between two (waiting for the worker, or for an answer)
    return "fuselens: " .. runs[#runs].doing .. "…"
  end
  -- Progress no command of the plugin's began (another client's, say): shown wherever one looks.
  local owned = {}
  for _, others in pairs(M.state.running) do
    for _, r in ipairs(others) do
      if r.token then
        owned[r.token] = true
      end
    end
  end
  for token, other in pairs(M.state.progress) do
    if not other.done and other.title and not owned[token] then
      return progress_text(other)
    end
  end
  return nil
end

--- A short status of `bufnr` (default: the buffer the statusline is drawn for) for statuslines:
--- "fuselens: validating c0 40%", "fuselens: analyzing", "fuselens: 3 clusters", "fuselens: syntax
--- error", "fuselens: analysis timed out", or "".
function M.status(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and statusline_buffer() or bufnr
  local running = running_status(bufnr)
  if running then
    return running
  end
  if M.state.analyzing[bufnr] then
    return "fuselens: analyzing"
  end
  if M.state.problems[bufnr] then
    return "fuselens: " .. M.state.problems[bufnr]
  end
  local n = M.state.clusters[bufnr]
  if n == nil then
    return ""
  end
  return ("fuselens: %d cluster%s"):format(n, n == 1 and "" or "s")
end

local function define_commands()
  local function complete_clusters()
    return M.cluster_ids(0)
  end
  vim.api.nvim_create_user_command("FuselensAnalyze", function()
    M.analyze()
  end, { desc = "fuselens: analyze this file now" })
  vim.api.nvim_create_user_command("FuselensValidate", function(opts)
    M.validate(nil, opts.args)
  end, { nargs = "?", complete = complete_clusters, desc = "fuselens: validate a cluster's kernel (or all)" })
  vim.api.nvim_create_user_command("FuselensShowKernel", function(opts)
    M.show_kernel(nil, opts.args)
  end, { nargs = "?", complete = complete_clusters, desc = "fuselens: open the generated kernels" })
  vim.api.nvim_create_user_command("FuselensResults", function()
    M.show_results()
  end, { desc = "fuselens: this file's last validation or profile, and its earlier runs" })
  vim.api.nvim_create_user_command("FuselensRestart", function()
    M.restart()
  end, { desc = "fuselens: restart the language server" })
end

function M.setup(opts)
  M.config = vim.tbl_deep_extend("force", vim.deepcopy(defaults), opts or {})
  define_commands()
  local group = vim.api.nvim_create_augroup("fuselens", { clear = true })
  lenses.follow_window_widths(group)
  hover.follow_links(group, function(bufnr)
    return M.client(bufnr) ~= nil
  end, run_link, M.config.hover)
  vim.api.nvim_create_autocmd("FileType", {
    group = group,
    pattern = M.config.filetypes,
    callback = function(args)
      M.attach(args.buf)
    end,
  })
  -- Buffers already open when setup() runs (lazy loading).
  for _, bufnr in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(bufnr) and vim.tbl_contains(M.config.filetypes, vim.bo[bufnr].filetype) then
      M.attach(bufnr)
    end
  end
end

return M
