"""The cost model: DRAM bytes moved with and without fusion, and the regime a cluster is in.

Unfused, each compute op reads its tensor operands and writes its result (an upper
bound: no cache model).  Fused, the kernel reads each external input once and writes
each escaping output once; inputs that are views of one tensor are counted once, at
most that tensor's size.  Views and identities move nothing.

A cluster that starts with a GEMM counts the GEMM as the op it is: unfused it reads its operands
and writes its result, which the ops after it read back; fused, the result never leaves the chip, so
what the fusion saves is that round trip (and the epilogue's own intermediates), while the GEMM's
reads of its operands stay on both sides.

The regime says how to read the ratio on a given device:
- `launch-bound`  the fused kernel moves so little that launch overhead dominates;
- `compute-bound` a GEMM's multiply-adds take longer than the fused kernel's traffic: the bytes saved
  are a smaller share of the time than of the traffic;
- `l2-resident`   every unfused intermediate fits in L2, so the DRAM saving is overstated;
- `dram-bound`    the traffic ratio is the speedup to expect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fuselens.contracts.report import Regime

from .gemms import GEMM_OPS, flops, gemm_form
from .graph import DTYPE_BYTES, Graph, Node
from .ops import OpClass


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    peak_gbps: float  # practical DRAM bandwidth the best kernels reach, GB/s
    l2_bytes: int
    launch_us: float  # per-kernel launch overhead seen by a stream of small kernels
    # Dense GEMM throughput, TFLOP/s, that tuned GEMMs reach: 16-bit operands on tensor cores, and
    # float32 as torch multiplies it by default (full precision, no TF32).
    gemm_tflops: float = 0.0
    gemm_tflops_fp32: float = 0.0

    def dram_us(self, nbytes: float) -> float:
        return nbytes / (self.peak_gbps * 1e3)

    def gemm_us(self, flop: int, dtype: str) -> float:
        tflops = self.gemm_tflops_fp32 if dtype == "float32" else self.gemm_tflops
        return flop / (tflops * 1e6) if tflops else 0.0


# Practical ceilings (what well-written streaming kernels and tuned GEMMs reach), not datasheet peaks.
DEVICES = {
    "h200": DeviceProfile("NVIDIA H200", 4300.0, 50 * 2**20, 2.5, 700.0, 50.0),
    "h100": DeviceProfile("NVIDIA H100 SXM", 3000.0, 50 * 2**20, 2.5, 700.0, 50.0),
    "a100": DeviceProfile("NVIDIA A100 80GB", 1800.0, 40 * 2**20, 3.0, 250.0, 18.0),
    "rtx4090": DeviceProfile("NVIDIA RTX 4090", 950.0, 72 * 2**20, 3.0, 150.0, 70.0),
}
DEFAULT_DEVICE = "h200"


def device_profile(
    name: str | None = None, peak_gbps: float | None = None, l2_mb: float | None = None
) -> DeviceProfile:
    key = (name or DEFAULT_DEVICE).lower().replace("-", "").replace(" ", "")
    if key not in DEVICES:
        raise ValueError(f"unknown device {name!r}; known: {', '.join(DEVICES)}")
    base = DEVICES[key]
    return DeviceProfile(
        base.name,
        peak_gbps or base.peak_gbps,
        int(l2_mb * 2**20) if l2_mb else base.l2_bytes,
        base.launch_us,
        base.gemm_tflops,
        base.gemm_tflops_fp32,
    )


def value_bytes(node: Node) -> int:
    if node.meta is not None:
        return node.meta.nbytes
    outs = node.params.get("outputs") or []
    return sum(_nbytes(o) for o in outs)


def _nbytes(meta) -> int:
    shape = meta.shape if hasattr(meta, "shape") else meta["shape"]
    dtype = meta.dtype if hasattr(meta, "dtype") else meta["dtype"]
    n = 1
    for d in shape:
        n *= d
    return n * DTYPE_BYTES.get(dtype, 4)


def op_bytes(graph: Graph, node: Node) -> int:
    """Bytes one op moves when it runs as its own kernel."""
    if node.cls.free or (node.cls is OpClass.SOURCE and node.op in ("input", "param", "buffer", "const")):
        return 0
    if node.op == "output":
        return 0
    if node.op in ("gather", "embedding"):  # reads its indices and what they pick (an element, a row)
        return value_bytes(graph[node.inputs[1]]) + 2 * value_bytes(node)
    if node.op == "one_hot":  # reads its indices, writes the one-hots
        return value_bytes(graph[node.inputs[0]]) + value_bytes(node)
    if node.op == "cross_entropy":  # eager: log_softmax writes the log-probabilities, nll_loss picks from them
        logits, targets = (value_bytes(graph[i]) for i in node.inputs[:2])
        return 2 * logits + targets + value_bytes(node)
    reads = sum(value_bytes(graph[i]) for i in node.inputs)
    return reads + value_bytes(node)


def model_bytes(graph: Graph) -> int:
    return sum(op_bytes(graph, n) for n in graph)


def cluster_bytes(graph: Graph, compute: list[int], inputs: list[int], outputs: list[int]) -> tuple[int, int]:
    """(unfused, fused) bytes for a cluster with the given external inputs and escaping outputs."""
    unfused = sum(op_bytes(graph, graph[i]) for i in compute)
    by_root: dict[int, list[int]] = {}
    for i in inputs:
        by_root.setdefault(graph.view_root(i), []).append(i)
    reads = 0
    for root, views in by_root.items():
        total = sum(value_bytes(graph[v]) for v in views)
        root_bytes = value_bytes(graph[root])
        reads += _least(total, root_bytes, _looked_up(graph, compute, views)) if root_bytes else total
    writes = sum(value_bytes(graph[o]) for o in outputs)
    return unfused, reads + writes


def _looked_up(graph: Graph, compute: list[int], views: list[int]) -> int:
    """Bytes of a table that the cluster reads only through embeddings: the rows they pick (at most);
    any other reader reads it whole."""
    readers = [graph[c] for c in compute if any(v in graph[c].inputs for v in views)]
    if readers and all(r.op == "embedding" and r.inputs[0] in views for r in readers):
        return sum(value_bytes(r) for r in readers)
    return sum(value_bytes(graph[v]) for v in views)


def _least(*sizes: Any) -> Any:
    """The smallest of byte counts: numbers, or expressions in dynamic sizes (`analysis/symbolic.py`)."""
    if all(isinstance(s, int) for s in sizes):
        return min(sizes)
    import sympy  # (only expressions reach here: a concrete analysis never imports it)

    return sympy.Min(*sizes)


def regime(graph: Graph, compute: list[int], fused: int, device: DeviceProfile) -> Regime:
    largest = max((op_bytes(graph, graph[i]) for i in compute), default=0)
    return regime_of(fused, largest, device, gemm_us(graph, compute, device))


def regime_of(fused: float, largest_op: float, device: DeviceProfile, multiply_us: float = 0.0) -> Regime:
    """The regime of a kernel that moves `fused` bytes in place of ops the largest of which moves
    `largest_op`, and multiplies for `multiply_us` at the device's GEMM throughput."""
    if max(device.dram_us(fused), multiply_us) < device.launch_us:
        return "launch-bound"
    if multiply_us > device.dram_us(fused):
        return "compute-bound"
    if largest_op <= device.l2_bytes:
        return "l2-resident"
    return "dram-bound"


def gemm_us(graph: Graph, compute: list[int], device: DeviceProfile) -> float:
    """The time the GEMMs among `compute` take at the device's GEMM throughput (0 without any)."""
    return sum((device.gemm_us(flop, dtype) for flop, dtype in gemm_work(graph, compute)), 0.0)


def gemm_work(graph: Graph, compute: list[int]) -> list[tuple[Any, str]]:
    """(FLOPs, dtype) of each GEMM among `compute`: numbers, or expressions in dynamic sizes."""
    work = []
    for i in compute:
        node = graph[i]
        form = gemm_form(graph, node) if node.op in GEMM_OPS and not node.cls.absorbable else None
        if form is not None and node.meta is not None:
            work.append((flops(graph, form), node.meta.dtype))
    return work


def expected_speedup(unfused: float, fused: float, launches: int, device: DeviceProfile) -> float | None:
    """Unfused over fused time, each the longer of its launches and its DRAM traffic: the traffic ratio
    where both are DRAM-bound, less where launches dominate."""
    unfused_us = max(launches * device.launch_us, device.dram_us(unfused))
    fused_us = max(device.launch_us, device.dram_us(fused))
    return round(unfused_us / fused_us, 2) if fused_us else None
