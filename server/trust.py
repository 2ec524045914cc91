"""Workspace trust: the server runs user code only in folders the *user* trusted.

Analyzing a model means importing it, and importing is running.  So nothing runs until
trust comes from outside the workspace:

- the client says so at initialisation (`initializationOptions.workspaceTrusted`, which
  the VS Code extension fills from Workspace Trust and the Neovim plugin from its
  `trusted_folders` list in the user's own config); or
- the folder is listed in the user-level file `~/.config/fuselens/trusted-folders.json`
  (a JSON list of paths; `$XDG_CONFIG_HOME` is honoured).

Never from a file inside the workspace (its pyproject.toml, .vscode/settings.json
delivered through workspace/configuration): a cloned repository must not be able to
trust itself.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from fuselens.contracts.folders import user_config_folder
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
        """May code under `path` run?"""
        real = os.path.realpath(path)
        if self.client_says is not None:  # the editor's own trust decision covers its window
            return self.client_says
        trust_file = user_trust_file()
        if any(_inside(os.path.realpath(trust_file), os.path.realpath(r)) for r in self.roots):
            return False  # a trust file inside the workspace is the workspace trusting itself
        return any(_inside(real, folder) for folder in _listed_folders(trust_file))

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


def client_trust(init_options: dict | None) -> bool | None:
    if not isinstance(init_options, dict):
        return None
    value = init_options.get("workspaceTrusted")
    return value if isinstance(value, bool) else None
