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
-- they need from fuselens: trust, settings, code lens refresh, inlay hints, commands.

local compat = require("fuselens.compat")
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

-- What the plugin has seen, for statuslines and tests: require("fuselens").state
M.state = {
  clusters = {}, -- bufnr -> number of cluster diagnostics
  problems = {}, -- bufnr -> what stopped its analysis, in a status's words ("syntax error"), or nil
  progress = {}, -- token -> { title, message, percentage, done }
  progress_log = {}, -- every work-done progress value received, in order
  last_result = {}, -- command name -> what the server answered last
  last_validation = nil, -- the last validation's result: :FuselensResults shows its table and earlier runs
  results_buffer = nil, -- the scratch buffer of :FuselensResults
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

local function status_changed()
  pcall(vim.cmd, "doautocmd <nomodeline> User FuselensStatus")
end

--- Send workspace/executeCommand; `on_result(result)` gets the server's answer.
local function execute(client, bufnr, command, arguments, on_result)
  compat.request(client, "workspace/executeCommand", { command = command, arguments = arguments }, function(err, result)
    if err then
      notify(err.message or tostring(err), vim.log.levels.WARN)
      return
    end
    M.state.last_result[command] = result
    if type(result) == "table" and result.results_markdown then
      M.state.last_validation = result -- :FuselensResults shows its table
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

--- fuselens.showKernel with `args` ([uri] or [uri, cluster or model]): the server shows the view.
local function show_kernel_view(client, bufnr, args)
  execute(client, bufnr, "fuselens.showKernel", args, function(result)
    -- A client that supports window/showDocument has been shown the file by the server.
    local caps = vim.lsp.protocol.make_client_capabilities()
    local shown = caps.window and caps.window.showDocument and caps.window.showDocument.support
    if result and result.path and not shown then
      vim.cmd("split " .. vim.fn.fnameescape(result.path))
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
  return {
    ["fuselens.validateAll"] = validate,
    ["fuselens.validateKernel"] = validate,
    ["fuselens.showKernel"] = show_kernel,
  }
end

-- A diagnostic that stopped the analysis, by its code, as the status names it: "0 clusters" would
-- say the file was analyzed.
local PROBLEM_WORDS = {
  syntax = "syntax error",
  import = "import error",
  construct = "model not built",
  inputs = "no inputs",
  trace = "forward failed",
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

local function handlers()
  return {
    ["textDocument/hover"] = compat.hover_handler(M.config.hover),
    -- New diagnostics mean a new analysis: lenses are answered from it, so ask for them now.
    ["textDocument/publishDiagnostics"] = function(err, result, ctx, config)
      vim.lsp.handlers["textDocument/publishDiagnostics"](err, result, ctx, config)
      local bufnr = vim.uri_to_bufnr(result.uri)
      M.state.clusters[bufnr] = count_clusters(result.diagnostics)
      M.state.problems[bufnr] = problem_of(result.diagnostics)
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
    ["$/progress"] = function(err, result, ctx, config)
      local value = result and result.value or {}
      local token = tostring(result and result.token)
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

local function on_attach(client, bufnr)
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

--- `markdown` (the server's results view) in the read-only scratch buffer of :FuselensResults.
local function show_markdown(markdown)
  local buf = M.state.results_buffer
  if not (buf and vim.api.nvim_buf_is_valid(buf)) then
    buf = vim.api.nvim_create_buf(false, true) -- unlisted scratch: nothing to save
    vim.api.nvim_buf_set_name(buf, "fuselens://results")
    vim.bo[buf].filetype = "markdown"
    M.state.results_buffer = buf
  end
  vim.bo[buf].modifiable = true
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, vim.split(markdown, "\n", { plain = true }))
  vim.bo[buf].modifiable = false
  if vim.fn.bufwinnr(buf) == -1 then
    vim.cmd("botright split")
    vim.api.nvim_win_set_buf(0, buf)
  end
  return buf
end

--- The last validation's results table and the file's earlier runs (the server's markdown) in a
--- scratch buffer of its own. Before any validation in this session, the last run the server kept
--- for the current buffer's file, if there is one.
function M.show_results()
  local latest = M.state.last_validation
  if latest and latest.results_markdown then
    return show_markdown(latest.results_markdown)
  end
  local bufnr = vim.api.nvim_get_current_buf()
  local client = M.client(bufnr)
  if not client then
    notify("no validation yet: run :FuselensValidate", vim.log.levels.INFO)
    return nil
  end
  execute(client, bufnr, "fuselens.validationResults", { vim.uri_from_bufnr(bufnr) }, function(result)
    if type(result) == "table" and result.results_markdown then
      show_markdown(result.results_markdown)
    else
      notify(((type(result) == "table" and result.message) or "no validation yet") .. ": run :FuselensValidate",
        vim.log.levels.INFO)
    end
  end)
  return nil
end


--- A short status for statuslines: "fuselens: validating c0 40%", "fuselens: 3 clusters", or "".
function M.status(bufnr)
  for _, p in pairs(M.state.progress) do
    if not p.done and p.title then
      local pct = p.percentage and (" " .. p.percentage .. "%") or ""
      return p.title .. pct
    end
  end
  bufnr = bufnr or vim.api.nvim_get_current_buf()
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
  end, { desc = "fuselens: the last validation's results table and the file's earlier runs" })
  vim.api.nvim_create_user_command("FuselensRestart", function()
    M.restart()
  end, { desc = "fuselens: restart the language server" })
end

function M.setup(opts)
  M.config = vim.tbl_deep_extend("force", vim.deepcopy(defaults), opts or {})
  define_commands()
  local group = vim.api.nvim_create_augroup("fuselens", { clear = true })
  lenses.follow_window_widths(group)
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
