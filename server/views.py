"""Views: what fuselens generated for a document, as read-only files the editor opens.

A view (a cluster's kernel, a model's kernel module, torch.compile's kernels for a cluster) is
written to the user's cache folder, one folder per workspace, never into the project: opening a
kernel leaves nothing to commit or ignore.  Views are rewritten on every request, read-only so
that an edit cannot be mistaken for one `fuselens apply` would keep, and never through a link.
"""

from __future__ import annotations

import hashlib
import os
import stat

from fuselens.codegen import files
from fuselens.contracts.folders import user_cache_folder

READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH


class ViewRefused(Exception):
    """The view was not written; the message says why."""


def views_folder(workspace: str, kind: str) -> str:
    """`<cache>/views/<workspace name>-<digest of its path>/<kind>`, made if missing: the digest keeps
    two workspaces of one name apart."""
    real = os.path.realpath(workspace)
    digest = hashlib.sha256(real.encode()).hexdigest()[:12]
    folder = os.path.join(user_cache_folder(), "views", f"{os.path.basename(real) or 'root'}-{digest}", kind)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return folder


def is_view(path: str) -> bool:
    """Whether `path` is one of the views (generated code the editor shows, never a model to analyze)."""
    views = os.path.realpath(os.path.join(user_cache_folder(), "views"))
    return os.path.commonpath([views, os.path.realpath(path)]) == views


def write_view(folder: str, name: str, text: str) -> str:
    """The read-only file `name` in `folder` holding `text`; its path."""
    path = os.path.join(folder, os.path.basename(name))
    try:
        files.replace_text(path, text)
        os.chmod(path, READ_ONLY)
    except (files.Refused, OSError) as exc:
        raise ViewRefused(str(exc)) from None
    return path
