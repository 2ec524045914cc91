"""Python's cyclic garbage collector around the imports that stand between an editor and a file's
first diagnostics.

Importing torch and a model library allocates millions of objects, and every few thousand the
collector walks all that the process holds, finding nothing to free: an import's objects stay.  Off,
the imports take less time (`benchmarks/import_collector.py`, on a 2-core machine: torch a tenth
less, transformers' Llama a fifth less, the language server's own imports a tenth less).

So the worker host starts with it off and keeps it off while it imports (torch, each file's
libraries); once it has warmed up, with nothing else to do, it collects once and freezes what it
holds (`gc.freeze`): the collector never walks those objects again, in the host or in the jobs it
forks, whose pages then stay shared with the host instead of being copied by a collection.  A job
turns the collector on as it starts: the model's code runs as in any Python program.  A job forked
before the warm-up (a file opened as the server starts) finds what the host holds frozen too: else
its first collection would walk every object of torch and the library (0.4 s, measured, on the
path to the file's first diagnostics).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


def hold() -> None:
    """The collector off in a host that has just started, until it has warmed up (`settle`)."""
    gc.disable()


def in_job() -> None:
    """The collector on in a job, whatever the host it was forked from had it."""
    gc.enable()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The collector off for the block (imports), as it was after."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def settle() -> None:
    """Collect what is garbage, freeze the rest out of every later collection, and turn the
    collector on: the host once warmed up."""
    gc.collect()
    gc.freeze()
    gc.enable()


def before_fork() -> None:
    """Before the host forks a job: while the collector is off (not warmed up yet), freeze what the
    host holds, so that the job's collector, turned on, has nothing of the host's to walk."""
    if not gc.isenabled():
        gc.freeze()
