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
        held = self.admission.run(self.admission.queue(name)) if background else self.admission.turn()
        async with held:
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


class Comparisons(Jobs):
    """Background jobs of documents that stop when preempted, and the order things happened in."""

    def __init__(self, admission: Admission):
        super().__init__(admission)
        self.events: list[str] = []

    def compare(self, document: str, idle: float = 0.0) -> asyncio.Task:
        self.release[document] = asyncio.Event()
        return asyncio.ensure_future(self._compare(document, idle))

    async def _compare(self, document: str, idle: float) -> None:
        queued = self.admission.queue(document, idle)
        while True:
            async with self.admission.run(queued) as turn:
                self.events.append(f"start {document}")
                released = asyncio.ensure_future(self.release[document].wait())
                await asyncio.wait([released, turn.preempted], return_when=asyncio.FIRST_COMPLETED)
                if released.done():
                    self.events.append(f"done {document}")
                    return
                released.cancel()
            self.events.append(f"put back {document}")
            queued = self.admission.queue(document, place=turn.place)

    async def _run(self, name: str, background: bool) -> None:
        async with self.admission.turn():
            self.events.append(f"start {name}")
            await self.release[name].wait()
        self.events.append(f"done {name}")


async def test_no_comparison_starts_while_an_analysis_runs_though_turns_are_free():
    jobs = Comparisons(Admission(limit=4))
    analysis = jobs.start("analysis")
    await jobs.settle()
    comparison = jobs.compare("other.py")
    await jobs.settle()
    assert jobs.events == ["start analysis"]  # three turns free, but an analysis runs
    jobs.release["analysis"].set()
    await jobs.settle()
    assert jobs.events == ["start analysis", "done analysis", "start other.py"]
    jobs.release["other.py"].set()
    await asyncio.gather(analysis, comparison)


async def test_an_analysis_stops_a_running_comparison_which_runs_again_after_it():
    jobs = Comparisons(Admission(limit=2))
    comparison = jobs.compare("other.py")
    await jobs.settle()
    analysis = jobs.start("analysis")
    await jobs.settle()
    assert jobs.events == ["start other.py", "start analysis", "put back other.py"]
    assert jobs.admission.running == 1 and jobs.admission.running_background == 0
    jobs.release["analysis"].set()
    await jobs.settle()
    assert jobs.events[-2:] == ["done analysis", "start other.py"]
    jobs.release["other.py"].set()
    await asyncio.gather(analysis, comparison)
    assert jobs.events[-1] == "done other.py"


async def test_the_front_documents_comparison_goes_first_and_keeps_its_turn_while_it_waits():
    admission = Admission(limit=2)
    jobs = Comparisons(admission)
    analysis = jobs.start("analysis")
    await jobs.settle()
    queued = [jobs.compare("a.py"), jobs.compare("b.py")]
    admission.set_front("front.py")
    front = jobs.compare("front.py", idle=0.05)  # saved just now: it waits out its idle time
    await jobs.settle()
    jobs.release["analysis"].set()
    await jobs.settle()
    assert jobs.events == ["start analysis", "done analysis"]  # the turn is kept for the front document
    await front_started(jobs)
    assert jobs.events[-1] == "start front.py"
    jobs.release["front.py"].set()
    await jobs.settle()
    assert jobs.events[-1] == "start a.py"  # then the others, in the order they were queued
    admission.set_front("b.py")
    jobs.release["a.py"].set()
    await asyncio.gather(front, *queued[:1])
    jobs.release["b.py"].set()
    await asyncio.gather(analysis, *queued)
    assert [e for e in jobs.events if e.startswith("start")] == [
        "start analysis",
        "start front.py",
        "start a.py",
        "start b.py",
    ]


async def test_a_put_back_comparison_keeps_its_place_in_the_queue():
    admission = Admission(limit=2)
    jobs = Comparisons(admission)
    first = jobs.compare("first.py")
    await jobs.settle()
    second = jobs.compare("second.py")
    analysis = jobs.start("analysis")
    await jobs.settle()
    assert jobs.events == ["start first.py", "start analysis", "put back first.py"]
    jobs.release["analysis"].set()
    await jobs.settle()
    assert jobs.events[-1] == "start first.py"  # queued before second.py: still before it
    jobs.release["first.py"].set()
    jobs.release["second.py"].set()
    await asyncio.gather(first, second, analysis)


async def front_started(jobs: Comparisons) -> None:
    """Wait until the front document's comparison has waited out its idle time and started."""
    async with asyncio.timeout(10):
        while "start front.py" not in jobs.events:
            await asyncio.sleep(0.01)
