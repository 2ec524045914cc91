"""Timing on a CUDA device: the kernel, eager, and torch.compile of the same ops.

Every figure is a median over many runs of device time measured with CUDA events,
after warm-up.  "graph" times replay a CUDA graph of one call, which removes launch
gaps and shows what the GPU itself spends; "launch" times call the Python function
back to back without a graph, which adds each implementation's host overhead (our
launcher, eager's dispatcher, torch.compile's wrapper).

The bandwidth ceiling is a large device-to-device copy (bytes read plus written),
measured once per device and cached; `peak_gbps` overrides it.
"""

from __future__ import annotations

import json
import os
import statistics
from typing import Any, Callable

import torch

CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fuselens", "peak.json")


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


def time_launch_us(fn: Callable[[], Any], repeats: int = 15) -> float:
    """Median µs per call of `fn` called back to back (host overhead included)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    n = _iterations_for(fn)
    return statistics.median(_events_ms(fn, n) for _ in range(repeats)) * 1000


def time_graph_us(fn: Callable[[], Any], repeats: int = 15) -> float:
    """Median µs per call of `fn` captured once into a CUDA graph and replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up on a side stream, as graph capture requires
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    replay = graph.replay
    for _ in range(3):
        replay()
    torch.cuda.synchronize()
    n = _iterations_for(replay)
    return statistics.median(_events_ms(replay, n) for _ in range(repeats)) * 1000


def time_us(fn: Callable[[], Any]) -> float:
    """CUDA-graph time when `fn` can be captured; host-inclusive time when it cannot (a model
    that reads a tensor's value, say, synchronises and cannot live in a graph)."""
    try:
        return time_graph_us(fn)
    except RuntimeError:
        torch.cuda.synchronize()
        return time_launch_us(fn)


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
    src = torch.empty(size_bytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    # Two copies: the copy engine (cudaMemcpy) and a streaming kernel on the SMs, which is
    # what fused kernels compete with; the faster of the two is the ceiling.
    engine = time_graph_us(lambda: dst.copy_(src))
    kernel = time_graph_us(lambda: torch.neg(src, out=dst))
    gbps = 2 * size_bytes / (min(engine, kernel) * 1e-6) / 1e9
    del src, dst
    torch.cuda.empty_cache()
    cached[name] = round(gbps, 1)
    try:
        os.makedirs(os.path.dirname(CACHE), exist_ok=True)
        with open(CACHE, "w", encoding="utf-8") as fh:
            json.dump(cached, fh)
    except OSError:
        pass
    return gbps


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """torch.compile with static shapes and a fresh compile (no reuse across shapes)."""
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False, fullgraph=False)


def time_implementations(eager: Callable[..., Any], fused: Callable[..., Any], args: list[torch.Tensor],
                         bytes_fused: int | None, peak: float) -> dict[str, Any]:
    """Times eager, torch.compile and the fused kernel on `args`; the fields of `results.Timing`."""
    inductor = compiled(eager)
    with torch.no_grad():
        inductor(*args)  # compile outside the timed region
        out: dict[str, Any] = {
            "eager_us": time_graph_us(lambda: eager(*args)),
            "compiled_us": time_graph_us(lambda: inductor(*args)),
            "fused_us": time_graph_us(lambda: fused(*args)),
            "eager_launch_us": time_launch_us(lambda: eager(*args)),
            "compiled_launch_us": time_launch_us(lambda: inductor(*args)),
            "fused_launch_us": time_launch_us(lambda: fused(*args)),
        }
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
