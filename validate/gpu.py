"""Timing on a CUDA device: the kernel, eager, and torch.compile of the same ops.

Every figure is a median over many runs of device time measured with CUDA events,
after warm-up.  "graph" times replay a CUDA graph of one call, which removes launch
gaps and shows what the GPU itself spends; "launch" times call the Python function
back to back without a graph, which adds each implementation's host overhead (our
launcher, eager's dispatcher, torch.compile's wrapper).  Implementations that are
compared are sampled in turn, so drift in the clock over a run falls on all of them.

The bandwidth ceiling is a large device-to-device copy (bytes read plus written),
measured once per device and cached; `peak_gbps` overrides it.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable
from typing import Any

import torch

from fuselens.contracts.folders import user_cache_folder

CACHE = os.path.join(user_cache_folder(), "peak.json")


def _events_ms(fn: Callable[[], Any], iterations: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iterations


def _iterations_for(fn: Callable[[], Any], budget_ms: float = 25.0) -> int:
    """Calls per sample: enough to fill `budget_ms`; a call longer than that (a whole model at
    DRAM size) is one sample by itself, which events time to well under a microsecond."""
    once = max(_events_ms(fn, 3), 1e-3)
    return max(1, min(2000, int(budget_ms / once)))


def graph_replay(fn: Callable[[], Any]) -> Callable[[], Any]:
    """`fn` captured once into a CUDA graph; raises RuntimeError when it cannot be captured."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up on a side stream, as graph capture requires
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    return graph.replay


def medians_in_turn(calls: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median µs per call of each entry.  Samples are taken in turn (a, b, c, a, b, c, ...):
    one compute-heavy kernel timed 18% apart at two points of one process on an H200 (the
    SM clock follows power and temperature), and samples taken in blocks would charge that
    drift to whichever implementation happened to run last."""
    counts = {name: _iterations_for(call) for name, call in calls.items()}
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            samples[name].append(_events_ms(call, counts[name]))
    return {name: statistics.median(times) * 1000 for name, times in samples.items()}


def _bound(fn: Callable[..., Any], args: list[torch.Tensor]) -> Callable[[], Any]:
    return lambda: fn(*args)


def time_graphs_us(fns: dict[str, Callable[[], Any]], repeats: int = 15) -> dict[str, float]:
    """Median µs per call of each `fn`, captured once into a CUDA graph and replayed: what the
    GPU itself spends, without launch gaps."""
    return medians_in_turn({name: graph_replay(fn) for name, fn in fns.items()}, repeats)


def time_launches_us(fns: dict[str, Callable[[], Any]], repeats: int = 15) -> dict[str, float]:
    """Median µs per call of each `fn` called back to back (host overhead included)."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    return medians_in_turn(fns, repeats)


def time_each_us(fns: dict[str, Callable[[], Any]]) -> dict[str, float]:
    """CUDA-graph times when every `fn` can be captured; host-inclusive times for all of them
    when one cannot (a model that reads a tensor's value, say, synchronises and cannot live in
    a graph), so that the figures compared are always of one kind."""
    try:
        return time_graphs_us(fns)
    except RuntimeError:
        torch.cuda.synchronize()
        return time_launches_us(fns)


def _copy_times_us(size_bytes: int) -> dict[str, float]:
    """Two copies of `size_bytes`: the copy engine (cudaMemcpy) and a streaming kernel on the SMs,
    which is what fused kernels compete with; the faster of the two is the ceiling."""
    src = torch.empty(size_bytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    return time_graphs_us({"engine": lambda: dst.copy_(src), "kernel": lambda: torch.neg(src, out=dst)})


def copy_bandwidth_gbps(peak_gbps: float | None = None, size_bytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth (read + write), cached per device name."""
    if peak_gbps:
        return peak_gbps
    name = torch.cuda.get_device_name()
    try:
        with open(CACHE, encoding="utf-8") as fh:
            cached = json.load(fh)
    except (OSError, ValueError):
        cached = {}
    if name in cached:
        return float(cached[name])
    gbps = 2 * size_bytes / (min(_copy_times_us(size_bytes).values()) * 1e-6) / 1e9
    torch.cuda.empty_cache()
    cached[name] = round(gbps, 1)
    try:
        os.makedirs(os.path.dirname(CACHE), exist_ok=True)
        with open(CACHE, "w", encoding="utf-8") as fh:
            json.dump(cached, fh)
    except OSError:
        pass
    return gbps


def compiled(fn: Callable[..., Any], mode: str = "default") -> Callable[..., Any]:
    """torch.compile in `mode` with static shapes and a fresh compile (no reuse across shapes)."""
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False, fullgraph=False, mode=mode)


def time_implementations(
    eager: Callable[..., Any],
    fused: Callable[..., Any],
    args: list[torch.Tensor],
    bytes_fused: int | None,
    peak: float,
    other_modes: list[str] | None = None,
) -> dict[str, Any]:
    """Times eager, torch.compile (mode "default", and each of `other_modes`) and the fused kernel on
    `args`, sampled in turn; the fields of `results.Timing`."""
    modes = [m for m in other_modes or [] if m != "default"]
    with torch.no_grad():
        inductors = {mode: compiled(eager, mode) for mode in ["default", *modes]}
        for inductor in inductors.values():
            inductor(*args)  # compile outside the timed region
        calls = {"eager": lambda: eager(*args), "compiled": lambda: inductors["default"](*args)}
        calls |= {f"compiled {mode}": _bound(inductors[mode], args) for mode in modes}
        calls["fused"] = lambda: fused(*args)
        graph = time_graphs_us(calls)
        launch = time_launches_us({name: calls[name] for name in ("eager", "compiled", "fused")})
    out: dict[str, Any] = {f"{name}_us": graph[name] for name in ("eager", "compiled", "fused")}
    out.update({f"{name}_launch_us": launch[name] for name in launch})
    out["compiled_modes_us"] = {mode: round(graph[f"compiled {mode}"], 2) for mode in modes}
    out["bytes_fused"] = bytes_fused
    out["peak_gbps"] = round(peak, 1)
    if bytes_fused:
        out["achieved_gbps"] = round(bytes_fused / (out["fused_us"] * 1e-6) / 1e9, 1)
        out["pct_of_peak"] = round(100 * out["achieved_gbps"] / peak, 1)
    out["speedup_vs_eager"] = round(out["eager_us"] / out["fused_us"], 3)
    out["speedup_vs_compiled"] = round(out["compiled_us"] / out["fused_us"], 3)
    for key in ("eager_us", "compiled_us", "fused_us", "eager_launch_us", "compiled_launch_us", "fused_launch_us"):
        out[key] = round(out[key], 2)
    return out
