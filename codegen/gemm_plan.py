"""Planning a cluster that starts with a GEMM: the product, then the elementwise ops after it.

The ops after the GEMM are planned as the elementwise cluster they would be on their own, reading
the GEMM's result as an input (`GemmPlan.epilogue`): that plan is the epilogue's own kernel, which
runs after the library's GEMM where the fused kernel does not (a gradient is wanted, or the library
is faster at the shape), and the statements the fused kernel applies to each tile of its
accumulator.  The fused kernel reads every other input of the epilogue at the tile's (batch, row,
column) through strides the launcher collapses the input's own into, so an input may only be read
at the domain's plain coordinates or broadcast along some (a bias, a layer scale's gamma, a residual
of the result's shape, a per-row scale), each one way; and no statement may compute with a
coordinate.

The cluster's plan (`plan_gemm_cluster`) takes the GEMM's operands as its first inputs (A, B, the
bias), then the epilogue's other inputs; its statements are the epilogue's (`GemmPlan.epilogue`), so
its own `stmts` are empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fuselens.analysis.gemms import GemmForm, gemm_forms
from fuselens.analysis.graph import Graph

from .plan import ZERO, InputSlot, KernelPlan, PlanError, plan_cluster
from .terms import Dim, dims


@dataclass
class GemmPlan:
    """The GEMM that starts a cluster, and the elementwise ops after it."""

    form: GemmForm
    epilogue: KernelPlan  # the ops after the GEMM, over its result: input `result` of this plan
    result: int
    # For each of the epilogue's inputs: its place among the cluster plan's inputs (None: the result).
    taken: list[int | None] = field(default_factory=list)
    # For each of the epilogue's other inputs: the domain dim each of its dims runs along (-1: broadcast).
    reads: dict[int, tuple[int, ...]] = field(default_factory=dict)
    operands: tuple[int, ...] = ()  # the cluster plan's inputs that are A, B (and the bias)

    def groups_read(self, k: int) -> set[str]:
        """Which of the GEMM's index groups ("batch", "rows", "cols") epilogue input `k` varies along."""
        along = {d for d in self.reads[k] if d >= 0}
        groups = {"batch": self.form.batch, "rows": self.form.rows, "cols": self.form.cols}
        return {name for name, dims_ in groups.items() if along & set(dims_)}


def plan_gemm_cluster(graph: Graph, members: set[int], backward: bool = False) -> KernelPlan:
    """The plan of a cluster whose members hold one GEMM (`analysis.gemms`): its epilogue's plan, wrapped."""
    forms = gemm_forms(graph, members)
    if len(forms) != 1 or backward:
        raise PlanError("no-lowering", "a kernel here computes one GEMM, with the elementwise ops after it")
    form = forms[0]
    rest = set(members) - {form.node}
    if not any(graph[m].cls.absorbable for m in rest):
        raise PlanError("no-lowering", f"`{graph[form.node].op}` has no elementwise op after it to take in")
    epilogue = plan_cluster(graph, rest)
    if epilogue.kind != "elementwise":
        raise PlanError(
            "reduction",
            f"the ops after `{graph[form.node].op}` reduce its rows: a GEMM's epilogue here is elementwise",
        )
    result = next((k for k, s in enumerate(epilogue.inputs) if s.node == form.node), None)
    if result is None:
        raise PlanError("no-lowering", f"no op of the cluster reads `{graph[form.node].op}`'s result")
    _check_epilogue(graph, form, epilogue, result)
    operand_nodes = [form.a, form.b] + ([form.bias] if form.bias is not None else [])
    inputs: list[InputSlot] = []
    index: dict[int, int] = {}
    for node in operand_nodes + [s.node for k, s in enumerate(epilogue.inputs) if k != result]:
        if node not in index:
            meta = graph[node].meta
            if meta is None:
                raise PlanError("no-lowering", f"`{graph[node].op}` does not produce a single tensor")
            index[node] = len(inputs)
            inputs.append(InputSlot(node, meta.shape, meta.dtype))
    gemm = GemmPlan(
        form,
        epilogue,
        result,
        [None if k == result else index[s.node] for k, s in enumerate(epilogue.inputs)],
        _reads(epilogue, result),
        tuple(index[n] for n in operand_nodes),
    )
    return KernelPlan(
        "gemm-epilogue",
        sorted(members),
        sorted([form.node, *epilogue.compute]),
        epilogue.domain,
        epilogue.row_dims,
        inputs,
        epilogue.outputs,
        [],
        scalars=epilogue.scalars,
        gemm=gemm,
    )


def _check_epilogue(graph: Graph, form: GemmForm, epilogue: KernelPlan, result: int) -> None:
    """What the fused kernel can apply to its accumulator's tiles: the result read at its own positions,
    every other input at the domain's plain coordinates or broadcast, one way each; no coordinate
    computed with, no output but the domain's own."""
    op = f"`{graph[form.node].op}`"
    n = len(epilogue.domain)
    if epilogue.inputs[result].shape != epilogue.domain:
        raise PlanError("shape", f"the ops after {op} run over {list(epilogue.domain)}, not over its result")
    if any(o.dims is not None for o in epilogue.outputs):
        raise PlanError("layout", f"the ops after {op} write a permuted value: a GEMM's tiles are stored as computed")
    own = tuple(Dim(i) for i in range(n))
    seen: dict[int, tuple] = {}
    for s in epilogue.stmts:
        if s.load_input is None:
            if dims(s.expr):
                raise PlanError("no-lowering", f"the ops after {op} compute with a position: no epilogue of a GEMM")
            continue
        plain = all(c == ZERO.index or isinstance(c, Dim) for c in s.load_coords)
        if s.load_guard is not None or not plain or (s.load_input == result and s.load_coords != own):
            raise PlanError(
                "no-lowering", f"the ops after {op} read a value at shifted or gathered positions: no GEMM epilogue"
            )
        if seen.setdefault(s.load_input, s.load_coords) != s.load_coords:
            raise PlanError("no-lowering", f"the ops after {op} read one value two ways: no GEMM epilogue")


def _reads(epilogue: KernelPlan, result: int) -> dict[int, tuple[int, ...]]:
    """For each epilogue input but the result: the domain dim each of its dims is read along, -1 for
    none (broadcast)."""
    reads: dict[int, tuple[int, ...]] = {}
    for s in epilogue.stmts:
        if s.load_input is not None and s.load_input != result:
            reads[s.load_input] = tuple(c.index if isinstance(c, Dim) else -1 for c in s.load_coords)
    for k in range(len(epilogue.inputs)):  # an input no statement loads (none here) reads nothing
        if k != result:
            reads.setdefault(k, tuple(-1 for _ in epilogue.inputs[k].shape))
    return reads


def result_dims(form: GemmForm, rank: int) -> list[tuple[int, int]]:
    """Where each dim of the GEMM's result (of `rank` dims) has its size: (0 for A or 1 for B, its dim)."""
    if form.image:  # A the weight [Cout, Cin, 1, 1], B the images [N, Cin, H, W]
        return [(1, 0), (0, 0), (1, 2), (1, 3)]
    if form.batch:  # [B, M, K] by [B, K, N]
        return [(0, 0), (0, 1), (1, 2)]
    return [(0, d) for d in range(rank - 1)] + [(1, 0 if form.transposed_b else 1)]


def operand_relations(form: GemmForm, a: str, b: str) -> list[str]:
    """The conditions A and B (named `a`, `b`) meet for the product to be the one the kernel computes."""
    if form.image:
        return [f"{a}.shape[1] == {b}.shape[1]", f"{a}.shape[2] == 1", f"{a}.shape[3] == 1"]
    if form.batch:
        return [f"{b}.shape[0] == {a}.shape[0]", f"{b}.shape[1] == {a}.shape[2]"]
    return [f"{b}.shape[{1 if form.transposed_b else 0}] == {a}.shape[-1]"]


def library_activation(graph: Graph, plan: KernelPlan) -> str | None:
    """ "gelu" or "relu" where the cluster is a GEMM with a bias over its columns and then that activation
    alone (GELU's tanh approximation), which cuBLASLt can apply in its own epilogue
    (`torch._addmm_activation`); None otherwise."""
    gemm = plan.gemm
    if gemm is None or gemm.form.op not in ("linear", "addmm") or len(gemm.operands) != 3:
        return None
    bias = plan.inputs[gemm.operands[2]]
    ops = [graph[c] for c in gemm.epilogue.compute]
    if bias.shape != plan.domain[-1:] or len(ops) != 1 or len(gemm.epilogue.inputs) != 1:
        return None
    (op,) = ops
    if op.op == "relu" or (op.op == "gelu" and op.params.get("approximate") == "tanh"):
        return op.op
    return None
