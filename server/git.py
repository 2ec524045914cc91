"""The commit checked out in the git repository that holds a file, read from the repository's own
files (`.git/HEAD`, its ref, `packed-refs`) rather than by running git: no process to start, and
nothing of the repository's configuration (hooks, fsmonitor) runs."""

from __future__ import annotations

import os
import re

from fuselens.contracts.reading import read_text

SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")  # SHA-1, or SHA-256 repositories
MAX_READ = 16 << 20  # HEAD and a ref are a line each; a packed-refs larger than this is not read


def head_revision(file: str) -> str | None:
    """The commit HEAD names in `file`'s repository; None outside one, or when it cannot be read."""
    git_dir = _git_dir(os.path.dirname(os.path.realpath(file)))
    if git_dir is None:
        return None
    head = _read(os.path.join(git_dir, "HEAD"))
    if head is None:
        return None
    if SHA.match(head):  # a detached HEAD
        return head
    if not head.startswith("ref: "):
        return None
    return _ref(git_dir, head.removeprefix("ref: ").strip())


def _git_dir(folder: str) -> str | None:
    """The git directory of the repository `folder` is in: `.git`, or where a `.git` file (a worktree,
    a submodule) points."""
    while True:
        dot_git = os.path.join(folder, ".git")
        if os.path.isdir(dot_git):
            return dot_git
        if os.path.isfile(dot_git):
            pointer = _read(dot_git) or ""
            if pointer.startswith("gitdir: "):
                return os.path.normpath(os.path.join(folder, pointer.removeprefix("gitdir: ").strip()))
            return None
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def _ref(git_dir: str, ref: str) -> str | None:
    """The commit `ref` ("refs/heads/main") names: a loose ref, else a packed one.  A worktree keeps
    its branches in the repository it shares (`commondir`)."""
    if not ref.startswith("refs/") or ".." in ref.split("/"):
        return None
    common = _read(os.path.join(git_dir, "commondir"))
    roots = [git_dir] + ([os.path.normpath(os.path.join(git_dir, common))] if common else [])
    for root in roots:
        loose = _read(os.path.join(root, *ref.split("/")))
        if loose and SHA.match(loose):
            return loose
    for root in roots:
        for line in (_read(os.path.join(root, "packed-refs")) or "").splitlines():
            sha, _, name = line.partition(" ")
            if name == ref and SHA.match(sha):
                return sha
    return None


def _read(path: str) -> str | None:
    """The file's text; None when it is not there or not read (a FIFO, a file past MAX_READ): the
    repository's folders may be anyone's, up to `/`, and a read must never wait on one."""
    try:
        return read_text(path, MAX_READ, errors="replace").strip()
    except OSError:  # (Unreadable is one)
        return None
