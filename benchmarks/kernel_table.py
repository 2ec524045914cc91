"""The CUDA kernels one call launches, with their device time: a table to read beside a benchmark's figures."""

from __future__ import annotations


def top_kernels(fn, rows: int = 15) -> str:
    """`fn` called once (after a warm-up call) under `torch.profiler`, its kernels by device time, slowest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=70)
