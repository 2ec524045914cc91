"""Work the server starts without waiting for it (a refresh request, a worker stopping, the last
analysis shown while the new one runs)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Background:
    """Holds each task it starts until the task ends: the loop keeps only weak references to tasks,
    and a task nobody holds can vanish mid-way."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Future[Any]] = set()

    def start(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
