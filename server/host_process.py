"""How a worker host process starts: its command, its environment and its session.

Nothing but asyncio is imported here, so that `fuselens serve` can start the host before anything
else of the command line or the server is imported (`start.py`): the host's import of torch is the
longest step before a file's first analysis, and it goes on while the server starts.

The host runs in the user's interpreter with a scrubbed environment: only variables a Python/CUDA
program needs pass through, never tokens or credentials.  It leads a session of its own, so that
whatever is left of it can be found and killed (`workers.py`).
"""

from __future__ import annotations

import asyncio
import os
import re

_PASS_THROUGH = re.compile(
    r"^(PATH|HOME|USER|LOGNAME|SHELL|LANG|LC_\w+|TZ|TMPDIR|TEMP|TMP|PYTHONPATH|PYTHONHOME|VIRTUAL_ENV|"
    r"CONDA_\w+|LD_LIBRARY_PATH|CUDA_\w+|NVIDIA_\w+|TRITON_\w+|TORCH_\w+|XDG_\w+|OMP_NUM_THREADS|"
    r"MKL_NUM_THREADS|HF_HUB_OFFLINE)$"
)
# A name that says it holds a credential, in whatever family it came (XDG_SESSION_COOKIE, CONDA_*_TOKEN):
# a token, secret, password, cookie, credential, private or auth anything, a session id, any key.
_SECRET = re.compile(
    r"TOKEN|SECRET|PASSW(OR)?D|PASSPHRASE|CREDENTIAL|COOKIE|PRIVATE|AUTH|SIGNATURE|SESSION_?ID|KEY(S|FILE)?(_|$)", re.I
)


def scrubbed_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = dict(os.environ if environ is None else environ)
    env = {k: v for k, v in environ.items() if _PASS_THROUGH.match(k) and not _SECRET.search(k)}
    for name in ("PYTHONPATH", "LD_LIBRARY_PATH"):
        if name in env:
            env[name] = _absolute_entries(env[name])
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _absolute_entries(search_path: str) -> str:
    """A search path without its empty and relative entries: Python (and the dynamic loader) read those
    from the working directory, where they would put whatever lies there ahead of the standard
    library (`$PYTHONPATH:/x` with PYTHONPATH unset starts with one)."""
    return os.pathsep.join(p for p in search_path.split(os.pathsep) if os.path.isabs(p))


async def start_host(python: str) -> asyncio.subprocess.Process:
    """A worker host started in `python`, its standard streams piped to us; OSError if it cannot be."""
    # -P and a working directory nobody but root can write to: nothing in the folder the editor
    # started the server from, nor in /tmp, can shadow the worker's own imports.
    return await asyncio.create_subprocess_exec(
        python,
        "-P",
        "-m",
        "fuselens.worker.host",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=scrubbed_environment(),
        cwd=os.path.abspath(os.sep),
        start_new_session=True,  # a session of its own: what is left of it can be found and killed
    )
