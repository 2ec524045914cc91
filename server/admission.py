"""Admission: every job that runs the user's code waits here for a turn, whatever starts it.

Analyses of open documents, validations and the background torch.compile comparisons all fork a
worker child with its own time and memory limits; without one gate, thirty files saved in a burst
fork thirty comparisons (each compiling a model with Inductor, up to 8 GB and 300 s) around the
analyses' limit, and the editor waits behind them.  So:

- at most `limit` jobs run at once, across documents and kinds;
- background jobs (the comparisons) run one at a time, and take a turn only while no foreground
  job (an analysis, a validation) is waiting for one: what the user is looking at goes first.

Waiting is cancellable like the job itself: a comparison superseded by a newer save leaves the
queue without ever running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

# Jobs running the user's code at once: opening twenty files must not fork twenty analyses on a laptop.
MAX_CONCURRENT_JOBS = max(2, (os.cpu_count() or 2) // 2)


class Admission:
    def __init__(self, limit: int = MAX_CONCURRENT_JOBS):
        self.limit = limit
        self.running = 0
        self.running_background = 0
        self.peak = 0  # the most jobs that ever ran at once
        self._waiting_foreground = 0
        self._changed: asyncio.Condition | None = None

    @contextlib.asynccontextmanager
    async def turn(self, background: bool = False) -> AsyncIterator[None]:
        """Hold one of the `limit` turns while the block runs."""
        changed = self._condition()
        async with changed:
            if not background:
                self._waiting_foreground += 1
            try:
                await changed.wait_for(lambda: self._may_start(background))
            finally:
                if not background:
                    self._waiting_foreground -= 1
                    changed.notify_all()  # a background job may start now that none waits
            self.running += 1
            self.running_background += background
            self.peak = max(self.peak, self.running)
        try:
            yield
        finally:
            async with changed:
                self.running -= 1
                self.running_background -= background
                changed.notify_all()

    def _may_start(self, background: bool) -> bool:
        if self.running >= self.limit:
            return False
        return not background or (self.running_background == 0 and self._waiting_foreground == 0)

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:  # made on first use, inside the server's event loop
            self._changed = asyncio.Condition()
        return self._changed
