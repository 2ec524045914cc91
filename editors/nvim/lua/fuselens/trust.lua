-- Workspace trust. fuselens analyzes a model by importing it, which runs its code, so the
-- server waits until the user trusts the folder. In Neovim that decision is the user's
-- `trusted_folders` list, in their own config: a folder is trusted if it is one of them or
-- lies inside one. Nothing inside the workspace (a file, a modeline, an .nvim.lua) can add to
-- it. A folder not listed is not reported as untrusted either: the server then falls back
-- to the user-level ~/.config/fuselens/trusted-folders.json (server/trust.py).

local M = {}

local function real(path)
  local uv = vim.uv or vim.loop
  local expanded = vim.fn.fnamemodify(vim.fn.expand(path), ":p"):gsub("/+$", "")
  return uv.fs_realpath(expanded) or expanded
end

--- true if `root` is inside one of `folders`; nil (not false) otherwise, so the server's own
--- user-level trust file still counts.
function M.workspace_trusted(root, folders)
  if not root or type(folders) ~= "table" then
    return nil
  end
  local dir = real(root)
  for _, folder in ipairs(folders) do
    local f = real(folder)
    if dir == f or dir:sub(1, #f + 1) == f .. "/" then
      return true
    end
  end
  return nil
end

return M
