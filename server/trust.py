"""Workspace trust: the server runs user code only in folders the *user* trusted.

Analyzing a model means importing it, and importing is running.  So nothing runs until
trust comes from outside the workspace:

- the client says so at initialisation (`initializationOptions.workspaceTrusted`, which
  the VS Code extension fills from Workspace Trust and the Neovim plugin from its
  `trusted_folders` list in the user's own config): that trusts the workspace folders the
  client named, not every file the window opens; or
- the folder is listed in the user-level file `~/.config/fuselens/trusted-folders.json`
  (a JSON list of paths; `$XDG_CONFIG_HOME` is honoured).

Trust is per folder, on the file's resolved path.  A file the editor opens from elsewhere (a
library's source, from a link in a diagnostic) is not run for the trust of the window it opened
in; nor is a file of the packages installed under a trusted folder (a project's `.venv`): they
are a library's code, not the user's models.

Never from a file inside the workspace (its pyproject.toml, .vscode/settings.json
delivered through workspace/configuration): a cloned repository must not be able to
trust itself.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from fuselens.contracts.folders import installed, user_config_folder
from fuselens.contracts.reading import read_bytes

MAX_TRUST_FILE_BYTES = 1 << 20  # a list of folders; a larger file is not read (nothing is trusted)


def user_trust_file() -> str:
    return os.path.join(user_config_folder(), "trusted-folders.json")


def _listed_folders(path: str) -> list[str]:
    try:
        data = json.loads(read_bytes(path, MAX_TRUST_FILE_BYTES))
    except (OSError, ValueError, RecursionError):  # (Unreadable is an OSError: a FIFO, a file too large)
        return []
    return (
        [os.path.realpath(os.path.expanduser(p)) for p in data if isinstance(p, str)] if isinstance(data, list) else []
    )


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


@dataclass
class Trust:
    client_says: bool | None  # what initializationOptions said, None if it said nothing
    roots: list[str]  # workspace folders

    def trusted(self, path: str) -> bool:
        """May the model at `path` run?  Only when its resolved path lies in a folder the user trusted,
        outside the packages installed there."""
        real = os.path.realpath(path)
        if self.client_says is False or self.installed_package(real):
            return False  # (the editor's explicit "no" wins over the user-level list)
        if self.client_says and self.in_workspace(real):
            return True
        trust_file = user_trust_file()
        if any(_inside(os.path.realpath(trust_file), os.path.realpath(r)) for r in self.roots):
            return False  # a trust file inside the workspace is the workspace trusting itself
        return any(_inside(real, folder) for folder in _listed_folders(trust_file))

    def in_workspace(self, path: str) -> bool:
        """Does `path` (resolved) lie in one of the workspace folders?"""
        return self._root_of(path) is not None

    def installed_package(self, path: str) -> bool:
        """Is `path` (resolved) a file of an installed package: below a site-packages folder inside its
        workspace folder (a project's `.venv`), or anywhere in its path outside them?  (A workspace
        folder that is itself inside one, opened to work on that package, is the user's.)"""
        real = os.path.realpath(path)
        root = self._root_of(real)
        below = os.path.relpath(real, root) if root is not None else real
        return installed(below)

    def _root_of(self, path: str) -> str | None:
        real = os.path.realpath(path)
        return next((root for r in self.roots if _inside(real, root := os.path.realpath(r))), None)

    def not_a_model(self, path: str) -> bool:
        """A file the editor opened that is no model of the user's: a library's source (below
        site-packages), or, in a window the editor trusts, a file outside its folders that the user
        did not trust either (a library's source opened from a diagnostic's link).  It is left alone:
        not run, and nothing said, for it is not what the user works on."""
        if self.installed_package(path):
            return True
        return bool(self.client_says) and not self.trusted(path)

    @staticmethod
    def explanation(path: str, editor: str = "") -> str:
        """Why nothing runs in `path`'s folder, and how to trust it in `editor` (the client's name from
        `initialize`; every way when it is not one fuselens knows)."""
        listed = f'add "{os.path.dirname(path)}" to {user_trust_file()}'
        ways = {
            "code": "trust the workspace (Workspaces: Manage Workspace Trust)",
            "neovim": "add the folder to `trusted_folders` in require('fuselens').setup{}",
            "eglot": "add the folder to `fuselens-eglot-trusted-folders` in your Emacs configuration",
        }
        known = next((way for key, way in ways.items() if key in editor.lower()), None)
        if known:
            how = f"{known}, or {listed}"
        else:
            how = f"in VS Code, {ways['code']}; in Neovim, {ways['neovim']}; or {listed}"
        return f"fuselens analyzes a model by running its code, so it waits until you trust this folder: {how}."

    def not_analyzed(self, path: str) -> str:
        """Why a file outside the trusted folders, or of an installed package, is not analyzed."""
        name = os.path.basename(path)
        if self.installed_package(path):
            return f"fuselens does not analyze {name}: it is an installed package's code, not a model of yours."
        return (
            f"fuselens does not analyze {name}: it is outside the workspace folders you trusted. To analyze "
            f'it, add "{os.path.dirname(path)}" to {user_trust_file()}.'
        )


def client_trust(init_options: dict | None) -> bool | None:
    if not isinstance(init_options, dict):
        return None
    value = init_options.get("workspaceTrusted")
    return value if isinstance(value, bool) else None
