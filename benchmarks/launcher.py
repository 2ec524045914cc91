"""What a generated launcher itself costs per call, on the host.

    python benchmarks/launcher.py [--calls 20000]

For every cluster of the shipped examples, at the GPU suite's launch-bound input sizes
(contiguous CPU tensors, small enough that allocating an output costs what the caching
allocator makes it cost on a GPU), times the public function `clusterN(...)` with each
`@triton.jit` kernel swapped for a launch that does nothing.  What remains is the generated Python: guards,
shape reads, output allocation, layout and launch shape.  That is the part of the host
overhead the code generator controls.  Triton's dispatch and the driver's launch come on
top; docs/benchmarks.md gives the total, measured on a GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


class _NoLaunch:
    """Stands in for a `@triton.jit` function: `kernel[grid](...)` returns at once."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _kernels(report, folder: str):
    """The report's kernel module, every kernel swapped for a launch that does nothing."""
    from fuselens.validate.runner import load_kernel_module

    module = load_kernel_module(report, os.path.join(folder, "kernels.py"))
    for name in dir(module):
        if name.startswith("_cluster") and "_kernel_" in name:
            setattr(module, name, _NoLaunch())
    return module


def _us_per_call(fn, args, calls: int) -> float:
    for _ in range(min(calls, 1000)):
        fn(*args)
    samples = []
    with torch.no_grad():
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            samples.append((time.perf_counter() - start) / calls * 1e6)
    return min(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    from fuselens.pipeline.analyze import AnalyzeOptions, analyze_file

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu import SUITE

    print(f"{'example':<16} {'cluster':<8} {'ops':<46} {'µs/call':>8}")
    figures = []
    for name, (cls, sizes) in SUITE.items():
        shapes, init = sizes["launch"]
        dtype = "int64" if name == "gpt.py" else "float32"
        config = {"inputs": [{"shape": shape, "dtype": dtype} for shape in shapes], "init": init}
        report = analyze_file(os.path.join(EXAMPLES, name), AnalyzeOptions(models={cls: config}))
        with tempfile.TemporaryDirectory() as folder:
            kernels = _kernels(report, folder)
            for model in report.models:
                for c in model.clusters if model.name == cls else []:
                    if not c.kernel:
                        continue
                    inputs = [torch.zeros(t.shape, dtype=getattr(torch, t.dtype)) for t in c.inputs]
                    us = _us_per_call(getattr(kernels, c.kernel.name), inputs, args.calls)
                    figures.append(us)
                    print(f"{name[:-3]:<16} {c.id:<8} {c.op_chain[:46]:<46} {us:8.1f}")
    print(
        f"\nmedian {statistics.median(figures):.1f} µs, range {min(figures):.1f}–{max(figures):.1f} µs "
        f"over {len(figures)} clusters (kernel launch itself excluded)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
