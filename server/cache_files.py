"""Writing a JSON file into the user's cache folder so that no reader ever sees half of it.

The file is written beside its place under a temporary name, then moved into place: a reader sees the
old file or the new one, never a cut-off one, and a link at the place is replaced, never written
through.  The folder is made private to the user (0700), as every fuselens cache folder is."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any


def write_json(path: str, data: Any, prefix: str) -> None:
    """Write `data` as JSON at `path`; `prefix` names the temporary file ("history", "analysis")."""
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    # allow_nan: a cluster's error can be inf or NaN; Python's json reads back what it writes.
    text = json.dumps(data, indent=1, allow_nan=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{prefix}-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
