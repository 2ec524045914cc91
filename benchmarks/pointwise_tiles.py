"""An elementwise cluster's tiles, swept: rows and columns a tile and warps, against torch.compile.

    python benchmarks/pointwise_tiles.py [--case whisper-encoder:c0 ...] [--tile 2x1024x4 ...]

A case is a cluster of a held-out model (`held_out.py`'s cases) or of a tuning-suite example at
DRAM size (`gpu.py`'s, named by file, as `gpt.py:c0`), by its id.  The model is analyzed in bf16 and
its kernel module loaded; the cluster's first instance is traced on real values (token ids drawn over
the vocabulary); then the kernel is timed by CUDA-graph replay with each tile forced on the module's
`_pointwise_tile`, with the tile the module chooses, and against torch.compile of the cluster's ops in
modes "default" and "max-autotune-no-cudagraphs", the replays sampled in turn.  Prints µs, GB/s of
the bytes the kernel moves, and the % of the measured copy bandwidth.  Needs CUDA.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu  # beside this script: the tuning suite
import held_out

# The clusters the tile rule was set from: one load an element over 3000-wide rows, two lookups
# added, and two RoPEs (five loads an element) over 128- and 96-wide heads.
CASES = ["whisper-encoder:c0", "gpt.py:c0", "llama:c4", "phi3:c4"]
TILES = [
    "1x1024x4",
    "2x1024x4",
    "2x1024x8",
    "4x1024x8",
    "4x512x4",
    "8x256x4",
    "8x128x4",
    "16x128x4",
    "16x128x8",
    "32x32x4",
]


def model_file(case: str) -> tuple[str, dict]:
    """(the model's file, its analysis settings by model name) for a held-out case or an example."""
    from fuselens.contracts.config import model_settings

    if case in gpu.SUITE:
        cls, _, config = gpu.suite_case(case, "dram", "bfloat16")
        return os.path.join(gpu.EXAMPLES, case), {cls: model_settings(config, "the sweep")}
    return held_out.case_file(case), {"model": model_settings(held_out.settings_of(held_out.CASES[case]), "the sweep")}


@dataclass
class TracedCluster:
    """A cluster of a suite's model on real CUDA values: what a sweep times."""

    cluster: Any  # the report's cluster
    args: list  # its inputs, as the model's trace recorded them
    moved: int  # the bytes its kernel moves
    domain: list[int]  # the kernel's domain
    eager: Callable  # its ops as the model runs them
    fused: Callable  # its generated function
    kernels: Any  # the generated module


def traced_cluster(case: str, cluster_id: str) -> TracedCluster:
    """Cluster `cluster_id` of `case` (a held-out model or a tuning-suite example), analyzed in bf16,
    its kernel module loaded, its first instance traced on real values (token ids over the vocabulary)."""
    from fuselens.analysis import loader
    from fuselens.analysis.cost import cluster_bytes
    from fuselens.codegen.plan import returned_outputs
    from fuselens.contracts.config import InputSpec
    from fuselens.contracts.options import AnalyzeOptions
    from fuselens.pipeline.analyze import analyze
    from fuselens.validate import runner
    from fuselens.validate.replay import cluster_function

    path, models = model_file(case)
    analyzed = analyze(path, AnalyzeOptions(models=models))
    model = next(m for m in analyzed.report.models if m.status == "analyzed")
    cluster = next(c for c in model.clusters if c.id == cluster_id and c.kernel is not None)
    kernels = runner.load_kernel_module(analyzed.report, os.path.join(tempfile.mkdtemp(), "kernels.py"))
    config = analyzed.configs[model.name]
    real = runner.Subject(analyzed.sources[model.name], config.init, config.param_dtype).real(0, analyzed.user_code)
    inputs = loader.random_inputs(
        [InputSpec(list(i.shape or []), i.dtype, high=i.high) for i in model.inputs], "cuda", 0
    )
    names = runner.input_names(model)
    graph, plan, values = runner.traced_instances(model, real.cuda(), inputs, names, analyzed.user_code)[cluster_id][0]
    args = [values[s.node] for s in plan.inputs]
    _, moved = cluster_bytes(
        graph, plan.compute, [s.node for s in plan.inputs], [o.node for o in returned_outputs(plan)]
    )
    fused = getattr(kernels, cluster.kernel.name)
    return TracedCluster(cluster, args, moved, list(plan.domain), cluster_function(graph, plan, values), fused, kernels)


def print_times(title: str, times: dict[str, float], moved: int, peak: float) -> None:
    """µs, GB/s of `moved`, % of the copy ceiling `peak`, and the ratio to the better torch.compile mode."""
    print(title)
    best = min(v for k, v in times.items() if k.startswith("torch.compile"))
    for name, us in times.items():
        gbps = moved / (us * 1e-6) / 1e9
        print(f"  {name:40s} {us:8.2f} µs {gbps:6.0f} GB/s {100 * gbps / peak:4.0f}%  {best / us:.2f}× better compile")


def compiled_replays(eager: Callable, args: list) -> dict[str, Callable]:
    """torch.compile of the cluster's ops in both modes, each captured into a CUDA graph."""
    from fuselens.validate.gpu import compiled, graph_replay

    replays = {}
    for mode in ("default", "max-autotune-no-cudagraphs"):
        inductor = compiled(eager, mode)
        inductor(*args)
        replays[f"torch.compile ({mode})"] = graph_replay(functools.partial(inductor, *args))
    return replays


def sweep(case: str, cluster_id: str, tiles: list[str], peak: float) -> None:
    import torch

    from fuselens.validate.gpu import graph_replay, medians_in_turn

    traced = traced_cluster(case, cluster_id)
    args, fused, kernels = traced.args, traced.fused, traced.kernels
    with torch.no_grad():
        replays = compiled_replays(traced.eager, args)
        chosen = kernels._pointwise_tile
        replays["chosen tile"] = graph_replay(functools.partial(fused, *args))
        for tile in tiles:
            block_r, block_c, warps = (int(x) for x in tile.split("x"))
            kernels._pointwise_tile = lambda rows, cols, item, loads, t=(block_r, block_c, warps): t
            replays[tile] = graph_replay(functools.partial(fused, *args))  # captured with this tile
        kernels._pointwise_tile = chosen
        times = medians_in_turn(replays, 15)
    title = (
        f"{case} {cluster_id} ({traced.cluster.op_chain}), domain {traced.domain}; {traced.moved / 2**20:.1f} MB moved"
    )
    print_times(title, times, traced.moved, peak)


def on_cuda(cases: list[str], each: Callable[[str, str, float], None]) -> int:
    """`each(model, cluster id, copy ceiling in GB/s)` for every "model:cluster" of `cases`; 1 without CUDA."""
    import torch

    if not torch.cuda.is_available():
        print("needs CUDA")
        return 1
    from fuselens.validate.gpu import copy_bandwidth_gbps

    peak = copy_bandwidth_gbps()
    for case in cases:
        name, cluster_id = case.rsplit(":", 1)
        each(name, cluster_id, peak)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", help=f"model:cluster (default: {' '.join(CASES)})")
    parser.add_argument("--tile", action="append", help="BLOCK_RxBLOCK_Cxwarps (default: a set of ten)")
    args = parser.parse_args()
    return on_cuda(args.case or CASES, lambda name, cluster_id, peak: sweep(name, cluster_id, args.tile or TILES, peak))


if __name__ == "__main__":
    raise SystemExit(main())
