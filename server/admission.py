"""Admission: every job that runs the user's code waits here for a turn, whatever starts it.

Analyses of open documents, validations and the background torch.compile comparisons all fork a
worker child with its own time and memory limits; without one gate, thirty files saved in a burst
fork thirty comparisons (each compiling a model with Inductor, up to 8 GB and 300 s) around the
analyses' limit, and the editor waits behind them.  So:

- at most `limit` jobs run at once, across documents and kinds;
- foreground jobs (an analysis, a validation, a profile) go first: a background job (a comparison)
  starts only while none runs or waits, and one that runs when a foreground job arrives is told to
  stop (`Turn.preempted`): it gives its turn back and queues again in its old place, and the
  foreground job has the machine to itself (on two cores a compile beside an analysis doubled it);
- background jobs run one at a time, the front document's first (the one the user last opened,
  edited, saved or hovered), then in the order they were queued.  A background job is queued at
  once (`queue`) and waits out its idle time in the queue: the front document's holds the turn
  meanwhile, so another document's does not take it just before.

Waiting is cancellable like the job itself: a comparison superseded by a newer save leaves the
queue without ever running.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

# Jobs running the user's code at once: opening twenty files must not fork twenty analyses on a laptop.
MAX_CONCURRENT_JOBS = max(2, (os.cpu_count() or 2) // 2)


@dataclass(eq=False)
class Turn:
    """One job's place: queued, then running.  A background job's `preempted` is set when a
    foreground job arrives while it runs: it should stop, and queue again with its `place`."""

    background: bool
    document: str = ""
    place: int = 0  # the order background jobs were first queued in
    ready_at: float = 0.0  # (the loop's clock) when a background job is done waiting out its idle time
    ready: bool = False
    released: bool = False
    granted: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    preempted: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Admission:
    def __init__(self, limit: int = MAX_CONCURRENT_JOBS):
        self.limit = limit
        self.running = 0
        self.running_background = 0
        self.peak = 0  # the most jobs that ever ran at once
        self.front = ""  # the document the user is working on: its background job goes first
        self._foreground: deque[Turn] = deque()  # waiting, first come first served
        self._background: list[Turn] = []  # queued, ready or still waiting out their idle time
        self._running_background: list[Turn] = []
        self._places = itertools.count()

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[Turn]:
        """Hold one of the `limit` turns while the block runs, as a foreground job: a background job
        that runs is told to stop."""
        turn = Turn(background=False, ready=True)
        self._foreground.append(turn)
        self._preempt_background()
        async with self._held(turn):
            yield turn

    def queue(self, document: str, idle: float = 0.0, place: int | None = None) -> Turn:
        """Queue a background job of `document` now, to start after `idle` seconds at the soonest
        (`run` waits for it); `place` is the one it had before it was preempted."""
        turn = Turn(background=True, document=document)
        turn.place = next(self._places) if place is None else place
        turn.ready_at = asyncio.get_running_loop().time() + idle
        self._background.append(turn)
        return turn

    @contextlib.asynccontextmanager
    async def run(self, turn: Turn, on_wait: Callable[[str], None] | None = None) -> AsyncIterator[Turn]:
        """Hold the turn of a queued background job while the block runs; `on_wait(why)` is told why
        it cannot start once its idle time is over."""
        try:
            delay = turn.ready_at - asyncio.get_running_loop().time()
            if delay > 0:
                await asyncio.sleep(delay)
        except BaseException:
            self.withdraw(turn)
            raise
        turn.ready = True
        async with self._held(turn, on_wait):
            yield turn

    def withdraw(self, turn: Turn) -> None:
        """Take a queued job out of the queue (its task was cancelled, perhaps before it ever ran)."""
        queue: deque[Turn] | list[Turn] = self._background if turn.background else self._foreground
        if turn in queue:
            queue.remove(turn)
            self._grant()  # one that leaves may let another start

    def set_front(self, document: str) -> None:
        """The user turned to `document`: its background job is the next to run."""
        if document != self.front:
            self.front = document
            self._grant()

    @contextlib.asynccontextmanager
    async def _held(self, turn: Turn, on_wait: Callable[[str], None] | None = None) -> AsyncIterator[None]:
        try:
            self._grant()
            if not turn.granted.done() and on_wait is not None:
                on_wait(self._why_waiting(turn))
            await turn.granted
        except BaseException:
            self.withdraw(turn)
            self._release(turn)  # granted just as it was cancelled: give the turn back
            raise
        try:
            yield
        finally:
            self._release(turn)

    def _grant(self) -> None:
        """Start every job that may start now."""
        while self._foreground and self.running < self.limit:
            turn = self._foreground.popleft()
            if not turn.granted.done():  # (done: its task was cancelled and has yet to leave the queue)
                self._start(turn)
        following = self._next_background()
        if following is not None and self._background_may_start():
            self._background.remove(following)
            self._start(following)

    def _background_may_start(self) -> bool:
        foreground_running = self.running - self.running_background
        return not self._foreground and foreground_running == 0 and self.running_background == 0

    def _next_background(self) -> Turn | None:
        """The queued background job to run next: the front document's (one still waiting out its
        idle time keeps the turn for it), else the first queued that is ready."""
        queued = [t for t in self._background if not t.granted.done()]
        for turn in sorted(queued, key=lambda t: (not self.front or t.document != self.front, t.place)):
            if turn.ready:
                return turn
            if self.front and turn.document == self.front:
                return None
        return None

    def _why_waiting(self, turn: Turn) -> str:
        if self._foreground or self.running > self.running_background:
            return "an analysis or a validation goes first"
        if self.running_background:
            return "another comparison runs"
        return f"the comparison of {os.path.basename(self.front)} goes first"

    def _preempt_background(self) -> None:
        for turn in self._running_background:
            if not turn.preempted.done():
                turn.preempted.set_result(None)

    def _start(self, turn: Turn) -> None:
        self.running += 1
        if turn.background:
            self.running_background += 1
            self._running_background.append(turn)
        self.peak = max(self.peak, self.running)
        turn.granted.set_result(None)

    def _release(self, turn: Turn) -> None:
        if turn.released or not turn.granted.done() or turn.granted.cancelled():
            return
        turn.released = True
        self.running -= 1
        if turn.background:
            self.running_background -= 1
            self._running_background.remove(turn)
        self._grant()
