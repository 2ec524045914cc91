"""Where fuselens keeps its per-user files, outside every project: its configuration (the folders the
user trusts) and its caches (the measured copy bandwidth, the views the editor opens), in the XDG
locations, `~/.config` and `~/.cache` unless `$XDG_CONFIG_HOME` / `$XDG_CACHE_HOME` say otherwise."""

from __future__ import annotations

import os


def user_config_folder() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "fuselens")


def user_cache_folder() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fuselens")
