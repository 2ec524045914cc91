"""Admission: every job of the server waits for one of a few turns, the background comparisons last."""

from __future__ import annotations

import asyncio

import pytest

from fuselens.server.admission import Admission

pytestmark = pytest.mark.asyncio


class Jobs:
    """Jobs that hold their turn until released, and the order they started in."""

    def __init__(self, admission: Admission):
        self.admission = admission
        self.started: list[str] = []
        self.release: dict[str, asyncio.Event] = {}

    def start(self, name: str, background: bool = False) -> asyncio.Task:
        self.release[name] = asyncio.Event()
        return asyncio.ensure_future(self._run(name, background))

    async def _run(self, name: str, background: bool) -> None:
        async with self.admission.turn(background=background):
            self.started.append(name)
            await self.release[name].wait()

    async def settle(self) -> None:
        for _ in range(20):  # let every task that can move run to its next wait
            await asyncio.sleep(0)


async def test_no_more_jobs_run_than_the_limit():
    jobs = Jobs(Admission(limit=2))
    tasks = [jobs.start(f"a{i}") for i in range(5)]
    await jobs.settle()
    assert jobs.started == ["a0", "a1"] and jobs.admission.running == 2
    jobs.release["a0"].set()
    await jobs.settle()
    assert jobs.started == ["a0", "a1", "a2"]
    for event in jobs.release.values():
        event.set()
    await asyncio.gather(*tasks)
    assert jobs.admission.peak == 2 and jobs.admission.running == 0


async def test_background_jobs_run_one_at_a_time_and_after_waiting_analyses():
    jobs = Jobs(Admission(limit=3))
    comparisons = [jobs.start(f"compare{i}", background=True) for i in range(4)]
    await jobs.settle()
    assert jobs.started == ["compare0"]  # one comparison, however many documents were saved
    analyses = [jobs.start(f"analysis{i}") for i in range(3)]
    await jobs.settle()
    assert jobs.started == ["compare0", "analysis0", "analysis1"]  # the limit is 3 in all
    jobs.release["compare0"].set()
    await jobs.settle()
    assert jobs.started[-1] == "analysis2"  # an analysis waited: it goes before the next comparison
    for name in ("analysis0", "analysis1", "analysis2"):
        jobs.release[name].set()
    await jobs.settle()
    assert jobs.started[-1] == "compare1" and jobs.admission.running_background == 1
    for event in jobs.release.values():
        event.set()
    await asyncio.gather(*comparisons, *analyses)
    assert jobs.admission.peak == 3


async def test_a_cancelled_wait_leaves_the_queue():
    jobs = Jobs(Admission(limit=1))
    first = jobs.start("analysis")
    superseded = jobs.start("compare-old", background=True)
    await jobs.settle()
    superseded.cancel()
    waiting = jobs.start("compare-new", background=True)
    jobs.release["analysis"].set()
    await jobs.settle()
    assert jobs.started == ["analysis", "compare-new"]
    jobs.release["compare-new"].set()
    await asyncio.gather(first, waiting)
    with pytest.raises(asyncio.CancelledError):
        await superseded
