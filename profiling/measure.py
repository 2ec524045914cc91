"""Measure one model's forward under `torch.profiler`, each torch call of the model in a range of its own.

The forward runs on real tensors under the same recorder the analysis traces with
(`analysis.capture`), so every torch call the model's code makes becomes the graph's nodes, with its
frames of model code, exactly as the analysis saw it.  Each call runs inside a profiler range named
after its number; every kernel the profiler records (on a CPU: every op) is then counted once, in
the innermost range around it, and what falls outside every range is kept as unattributed.

A training step (`train`) runs the forward with autograd on, then the backward of its outputs for
seeded random gradients.  The backward's ops run in autograd's engine, outside every range; each
carries the sequence number of the forward op that made it, which says whose call it belongs to.

The recorder's own Python work lies between the calls, outside every op: it costs wall time, not
kernel time, which is what the figures are.  The forward's wall time is measured apart, without
the profiler or the recorder.
"""

from __future__ import annotations

import contextlib
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from fuselens.analysis import capture
from fuselens.analysis.graph import Graph
from fuselens.contracts.options import Progress, no_progress

_RANGE = "fuselens#"


@dataclass
class Measured:
    graph: Graph  # the graph of one forward (all of them record the same)
    call_nodes: dict[int, range]  # the nodes each call of that forward recorded
    call_us: dict[int, float] = field(default_factory=dict)  # call number -> µs per forward (or step)
    backward_us: dict[int, float] = field(default_factory=dict)  # the part of it in the backward
    unattributed_us: float = 0.0  # per forward
    wall_us: float | None = None


def measure(
    model: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    names: Sequence[str],
    user_code: capture.UserCode,
    decisions: Sequence[bool],
    iterations: int,
    warmup: int,
    train: bool = False,
    progress: Progress = no_progress,
) -> Measured:
    """`progress` hears of each forward as it starts, with the fraction of the warm-up and profiled
    forwards done: on a CPU one forward can take seconds."""
    cuda = any(t.is_cuda for t in inputs)
    upstream = _Upstream(inputs[0].device if inputs else torch.device("cpu"))
    forwards = warmup + iterations
    for done in range(warmup):
        progress(f"warm-up forward {done + 1} of {warmup}", done / forwards)
        _run(model, inputs, upstream if train else None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    traces = []
    with profile(activities=activities) as prof:
        for iteration in range(iterations):
            progress(f"profiled forward {iteration + 1} of {iterations}", (warmup + iteration) / forwards)
            traced = capture.trace(
                model,
                inputs,
                names,
                user_code,
                decisions,
                real=True,
                keep_values=False,
                around_call=_ranges(iteration),
                grad=train,
            )
            if train:
                _backward(model, traced.output, upstream)
            traced.output = None
            traces.append(traced)
        if cuda:
            torch.cuda.synchronize()
    first = traces[0]
    if any(len(t.graph) != len(first.graph) for t in traces):
        raise RuntimeError("the forward recorded different graphs in different iterations")
    result = Measured(first.graph, first.call_nodes)
    times = _own_times(prof.events(), cuda)
    result.call_us = {number: total / iterations for number, total in times.per_call.items()}
    result.backward_us = {number: total / iterations for number, total in times.backward.items()}
    result.unattributed_us = times.outside / iterations
    if cuda:
        result.wall_us = _wall_us(model, inputs, upstream if train else None)
    return result


class _Upstream:
    """Seeded random gradients for a step's outputs, the same at every step."""

    def __init__(self, device: torch.device):
        self.device = device
        self.made: dict[tuple, torch.Tensor] = {}

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        key = (tuple(t.shape), t.dtype)
        if key not in self.made:
            generator = torch.Generator(device=self.device).manual_seed(len(self.made))
            self.made[key] = torch.randn(t.shape, dtype=t.dtype, device=self.device, generator=generator)
        return self.made[key]


def _run(model: torch.nn.Module, inputs: Sequence[torch.Tensor], upstream: _Upstream | None) -> None:
    """A forward, or (with `upstream`) a training step: the forward and its backward."""
    if upstream is None:
        with torch.no_grad():
            model(*inputs)
        return
    with torch.enable_grad():
        _backward(model, model(*inputs), upstream)


def _backward(model: torch.nn.Module, output, upstream: _Upstream) -> None:
    """The backward of every floating output that needs a gradient, for the seeded gradients.  The
    parameters' gradients start from none, as after `optimizer.zero_grad()`: each step's are its own."""
    outputs = [t for t in capture.tensors_in(output) if t.requires_grad and t.is_floating_point()]
    if not outputs:
        raise RuntimeError("no output of the forward needs a gradient: there is no backward to profile")
    model.zero_grad(set_to_none=True)
    torch.autograd.backward(outputs, [upstream(t) for t in outputs])


def _ranges(iteration: int):
    def around(number: int) -> contextlib.AbstractContextManager:
        return record_function(f"{_RANGE}{iteration}:{number}")

    return around


@dataclass
class _Times:
    per_call: dict[int, float] = field(default_factory=lambda: defaultdict(float))  # summed over iterations
    backward: dict[int, float] = field(default_factory=lambda: defaultdict(float))  # the part in backward
    outside: float = 0.0  # in no call's range


def _own_times(events, cuda: bool) -> _Times:
    """µs by call number, and outside every call.  A backward op counts for the forward call whose op
    made it: autograd gives both the same sequence number."""
    # An op that makes no autograd node still reads the next sequence number: the one that made node N
    # is the last forward op to carry N.
    made_by: dict[tuple[int, int], str] = {}
    for event in sorted(events, key=lambda e: e.time_range.start):
        if event.sequence_nr >= 0 and event.device_type == DeviceType.CPU and not event.name.startswith(_BACKWARD):
            range_ = _range_of(event)
            if range_ is not None:
                made_by[(event.thread, event.sequence_nr)] = range_
    times = _Times()
    for event in events:
        if event.device_type != DeviceType.CPU:
            continue  # device events count through the CPU op that launched them
        own = event.self_device_time_total if cuda else event.self_cpu_time_total
        if own <= 0:
            continue
        range_, backward = _range_of(event), False
        if range_ is None:
            engine = _backward_of(event)
            if engine is not None:
                range_ = made_by.get((engine.fwd_thread, engine.sequence_nr))
                backward = True
        if range_ is None:
            times.outside += own
            continue
        number = int(range_.rsplit(":", 1)[1])
        times.per_call[number] += own
        if backward:
            times.backward[number] += own
    return times


_BACKWARD = "autograd::engine::evaluate_function: "


def _range_of(event) -> str | None:
    """The name of the innermost call range around `event` (None: it is in none)."""
    while event is not None:
        if event.name.startswith(_RANGE):
            return event.name
        event = event.cpu_parent
    return None


def _backward_of(event):
    """The autograd engine's evaluation of a backward function that `event` is part of."""
    while event is not None:
        if event.name.startswith(_BACKWARD):
            return event
        event = event.cpu_parent
    return None


def _wall_us(
    model: torch.nn.Module, inputs: Sequence[torch.Tensor], upstream: _Upstream | None, repeats: int = 10
) -> float:
    """A forward (with `upstream`: a training step) timed alone, the median of `repeats`."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        _run(model, inputs, upstream)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)
