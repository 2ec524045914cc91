"""Measure one model's forward under `torch.profiler`, each torch call of the model in a range of its own.

The forward runs on real tensors under the same recorder the analysis traces with
(`analysis.capture`), so every torch call the model's code makes becomes the graph's nodes, with its
frames of model code, exactly as the analysis saw it.  Each call runs inside a profiler range named
after its number; every kernel the profiler records (on a CPU: every op) is then counted once, in
the innermost range around it, and what falls outside every range is kept as unattributed.

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

_RANGE = "fuselens#"


@dataclass
class Measured:
    graph: Graph  # the graph of one forward (all of them record the same)
    call_nodes: dict[int, range]  # the nodes each call of that forward recorded
    call_us: dict[int, float] = field(default_factory=dict)  # call number -> µs per forward
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
) -> Measured:
    cuda = any(t.is_cuda for t in inputs)
    with torch.no_grad():
        for _ in range(warmup):
            model(*inputs)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    traces = []
    with profile(activities=activities) as prof:
        for iteration in range(iterations):
            traces.append(
                capture.trace(
                    model,
                    inputs,
                    names,
                    user_code,
                    decisions,
                    real=True,
                    keep_values=False,
                    around_call=_ranges(iteration),
                )
            )
        if cuda:
            torch.cuda.synchronize()
    first = traces[0]
    if any(len(t.graph) != len(first.graph) for t in traces):
        raise RuntimeError("the forward recorded different graphs in different iterations")
    result = Measured(first.graph, first.call_nodes)
    per_call, outside = _own_times(prof.events(), cuda)
    for number, total in per_call.items():
        result.call_us[number] = total / iterations
    result.unattributed_us = outside / iterations
    if cuda:
        result.wall_us = _wall_us(model, inputs)
    return result


def _ranges(iteration: int):
    def around(number: int) -> contextlib.AbstractContextManager:
        return record_function(f"{_RANGE}{iteration}:{number}")

    return around


def _own_times(events, cuda: bool) -> tuple[dict[int, float], float]:
    """µs by call number (summed over iterations), and the µs outside every call's range."""
    per_call: dict[int, float] = defaultdict(float)
    outside = 0.0
    for event in events:
        if event.device_type != DeviceType.CPU:
            continue  # device events count through the CPU op that launched them
        own = event.self_device_time_total if cuda else event.self_cpu_time_total
        if own <= 0:
            continue
        number = _call_of(event)
        if number is None:
            outside += own
        else:
            per_call[number] += own
    return per_call, outside


def _call_of(event) -> int | None:
    while event is not None:
        if event.name.startswith(_RANGE):
            return int(event.name.rsplit(":", 1)[1])
        event = event.cpu_parent
    return None


def _wall_us(model: torch.nn.Module, inputs: Sequence[torch.Tensor], repeats: int = 10) -> float:
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(*inputs)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)
