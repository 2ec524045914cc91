"""Where fuselens keeps its per-user files, outside every project: its configuration (the folders the
user trusts) and its caches (the measured copy bandwidth, the views the editor opens), in the XDG
locations, `~/.config` and `~/.cache` unless `$XDG_CONFIG_HOME` / `$XDG_CACHE_HOME` say otherwise.
And the folders Python installs packages into, where a library's code lies."""

from __future__ import annotations

import os

# Folders Python installs packages into: what lies below one is a library's code, not a project's.
INSTALLED_PACKAGES = ("site-packages", "dist-packages")


def installed(path: str) -> bool:
    """Whether `path` lies below a folder Python installs packages into."""
    return any(part in INSTALLED_PACKAGES for part in path.split(os.sep))


def user_config_folder() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "fuselens")


def user_cache_folder() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fuselens")
