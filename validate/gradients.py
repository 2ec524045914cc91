"""Checking a cluster's backward kernel: its gradients against eager autograd on the same values.

The cluster's recorded inputs (from a real trace of the model) are the test data.  The eager side
replays the cluster's own calls (`replay.cluster_function`) under autograd; the fused side calls the
kernel module's public function, whose op has the backward kernel as its autograd formula.  Both get
the same upstream gradients, drawn from a seeded generator (never `out.sum()`, whose gradient of
ones hides transposed or mis-broadcast results), and every gradient the backward computes is
compared with per-dtype tolerances, NaNs and infinities where eager has them; where it is outside
them, it passes only if its norm-wise error against the float64 gradient is at most twice eager's
(plus one ulp).  The backward runs twice: the same inputs must give the same bits.
"""

from __future__ import annotations

from typing import Any

import torch

from fuselens.analysis.graph import Ref, plain
from fuselens.contracts.report import Cluster, Kernel
from fuselens.contracts.validation import COMPILE_MODE, BackwardCheck, TrainingTiming

from .numerics import compare, narrowest
from .replay import cluster_function


def check_gradients(cluster: Cluster, kernel: Kernel, instances: list, kernels, seed: int) -> BackwardCheck | None:
    """The backward check of `cluster` over its recorded `instances`; None when it has no backward kernel."""
    trains = getattr(kernels, f"_{kernel.name}_trains", None)
    folded = getattr(kernels, f"_{kernel.name}_folded", {})
    if not cluster.backward or trains is None or not instances:
        return None
    precision = narrowest(
        [getattr(torch, op.dtype) for op in cluster.ops if op.dtype] + [getattr(torch, i.dtype) for i in cluster.inputs]
    )
    result = BackwardCheck("verified", [cluster.inputs[k].name or f"input{k}" for k in trains])
    worst = None
    for graph, plan, values in instances:
        args = [values[s.node] for s in plan.inputs]
        written = _written_in_place(graph, plan)
        eager = _copying(cluster_function(graph, plan, values), written)
        public = _copying(getattr(kernels, kernel.name), written)  # its torch fallback writes as the model does
        views = {k: (base, _view_of(graph, plan.inputs[k].node)) for k, base in folded.items()}
        try:
            want = _gradients(eager, args, trains, seed, views)
            got = _gradients(public, args, trains, seed, views)
            again = _gradients(public, args, trains, seed, views)
            exact = _gradients(eager, [_wide(a) for a in args], trains, seed, views)
        except Exception as exc:  # a failing backward is a finding, not a crash
            return BackwardCheck("error", result.inputs, message=f"{type(exc).__name__}: {exc}")
        for name, g, w, x in zip(result.inputs, got, want, exact, strict=True):
            cmp = compare(g, w, precision)
            if not cmp.ok and _as_close_as_eager(g, w, x):
                cmp.ok, cmp.message = True, ""
            result.per_input[name] = max(result.per_input.get(name, 0.0), cmp.max_abs)
            if worst is None or (worst.ok and (not cmp.ok or cmp.max_abs > worst.max_abs)):
                worst, result.worst_input = cmp, name
        if not all(torch.equal(a, b) for a, b in zip(got, again, strict=True)):
            result.status, result.message = "nondeterministic", "two backward runs on the same inputs differ"
    if worst is None:
        return BackwardCheck("error", result.inputs, message="no gradient to compare")
    result.max_abs, result.max_rel, result.atol, result.rtol = worst.max_abs, worst.max_rel, worst.atol, worst.rtol
    if not worst.ok:
        result.status, result.message = "mismatch", f"the gradient of {result.worst_input}: {worst.message}"
    return result


def time_training(kernel: Kernel, instance, kernels, seed: int) -> TrainingTiming | None:
    """On a CUDA device: one training step of the cluster (its forward under autograd, then the
    gradients of the inputs its backward kernel covers) in eager, torch.compile and the kernels,
    each step and each forward alone, sampled in turn in one run.  None without a backward kernel."""
    from .gpu import compiled, time_graphs_us

    trains = getattr(kernels, f"_{kernel.name}_trains", None)
    if trains is None:
        return None
    folded = getattr(kernels, f"_{kernel.name}_folded", {})
    graph, plan, values = instance
    args = [values[s.node] for s in plan.inputs]
    views = {k: (base, _view_of(graph, plan.inputs[k].node)) for k, base in folded.items()}
    written = _written_in_place(graph, plan)
    # Each side copies the inputs the cluster writes into, inside what it times: torch.compile then sees
    # the in-place op on a value of its own graph, as it does in the model (an input it mutates would be
    # saved for the backward at a version the write moves on), and may fuse the copy away; eager and the
    # kernels pay it, which the model's eager, writing into a fresh result, does not.
    eager = _copying(cluster_function(graph, plan, values), written)
    functions = {
        "eager": eager,
        "compiled": compiled(eager, COMPILE_MODE),
        "fused": _copying(getattr(kernels, kernel.name), written),
    }
    calls: dict[str, Any] = {}
    with torch.enable_grad():
        for name, fn in functions.items():
            forward, step = _training_step(fn, args, trains, seed, views)
            step()  # torch.compile compiles its forward and backward here, outside the timed region
            calls |= {f"{name}_forward_us": forward, f"{name}_step_us": step}
        times = {key: round(us, 2) for key, us in time_graphs_us(calls).items()}
    timing = TrainingTiming(**times)
    timing.step_vs_eager = round(times["eager_step_us"] / times["fused_step_us"], 3)
    timing.step_vs_compiled = round(times["compiled_step_us"] / times["fused_step_us"], 3)
    return timing


def _training_step(fn, args: list[torch.Tensor], trains: tuple[int, ...], seed: int, views: dict):
    """(the forward of `fn` under autograd, the forward and its gradients) on fixed leaves and
    seeded upstream gradients, as calls a CUDA graph can capture."""
    leaves = _leaves(args, trains)

    def outputs() -> list[torch.Tensor]:
        return _differentiable(fn(*_with_views(leaves, views)))

    upstream = _upstream(outputs(), seed)
    wrt = [leaves[k] for k in trains]

    def step():
        return torch.autograd.grad(outputs(), wrt, upstream, allow_unused=True)

    return outputs, step


def _written_in_place(graph, plan) -> frozenset[int]:
    """The positions of the cluster's inputs that one of its ops writes into in place (`x.mul_(s)`,
    `x += y`)."""
    targets = {graph[m].params.get("mutates") for m in plan.members if graph[m].inplace}
    return frozenset(k for k, slot in enumerate(plan.inputs) if slot.node in targets)


def _copying(fn, written: frozenset[int]):
    """`fn` called on a copy of each input in `written`.  In the model, what an in-place op of the
    cluster writes into is the result of an earlier op, which autograd lets it overwrite; here each
    input is a leaf the gradients are taken of (or a view of one), which autograd refuses to see
    overwritten.  A copy is such a result again, and its gradient reaches the leaf."""
    if not written:
        return fn

    def run(*args):
        return fn(*[a.clone() if k in written else a for k, a in enumerate(args)])

    return run


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.is_floating_point() else t


def _as_close_as_eager(got: torch.Tensor, want: torch.Tensor, exact: torch.Tensor) -> bool:
    """Whether the fused gradient is about as close to the float64 one as eager's is, norm-wise: at
    most twice eager's relative error, plus one ulp of the dtype.  Where eager rounds each op to
    bf16 and the kernel rounds once, or a weight's gradient sums many rounded rows, the two can differ
    elementwise by more than eager's tolerance while being equally accurate."""
    exact = exact.to(got.device, torch.float64)
    scale = exact.norm().clamp_min(torch.finfo(torch.float64).tiny)
    fused_error = ((got.double() - exact).norm() / scale).item()
    eager_error = ((want.double() - exact).norm() / scale).item()
    return fused_error <= 2 * eager_error + torch.finfo(got.dtype).eps


def _view_of(graph, node_id: int):
    """The recorded view call that made input `node_id` from its base: f(base) -> the view."""
    func, args, kwargs, index = plain(graph[node_id].replay)

    def view(base):
        bound = [base if isinstance(a, Ref) else a for a in args]
        out = func(*bound, **kwargs)
        return out[index] if index is not None else out

    return view


def _gradients(fn, args: list[torch.Tensor], trains: tuple[int, ...], seed: int, views: dict) -> list[torch.Tensor]:
    """The gradients of `fn`'s outputs, weighted by seeded random upstream gradients, with respect to
    the inputs `trains`; the inputs in `views` (position -> (base position, view)) are views of their
    base's leaf, as they are in the model, so their gradients reach the base."""
    leaves = _leaves(args, trains)
    with torch.enable_grad():
        outs = _differentiable(fn(*_with_views(leaves, views)))
    wrt = [leaves[k] for k in trains]
    grads = torch.autograd.grad(outs, wrt, _upstream(outs, seed), allow_unused=True)
    return [g if g is not None else torch.zeros_like(x) for g, x in zip(grads, wrt, strict=True)]


def _leaves(args: list[torch.Tensor], trains: tuple[int, ...]) -> list[torch.Tensor]:
    """Copies of the cluster's inputs, those in `trains` wanting gradients."""
    return [a.detach().clone().requires_grad_(k in trains) for k, a in enumerate(args)]


def _with_views(leaves: list[torch.Tensor], views: dict) -> list[torch.Tensor]:
    """The inputs as the cluster takes them: those in `views` made from their base's leaf."""
    made = list(leaves)
    for k, (base, view) in views.items():
        made[k] = view(leaves[base])
    return made


def _differentiable(out) -> list[torch.Tensor]:
    """The outputs of a call that carry gradients."""
    return [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if o.requires_grad]


def _upstream(outs: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """Seeded random upstream gradients, one per output (never ones, which hide transposed results),
    each laid out as its output is, as the op that reads the output gives it back in the model: a
    convolution after a GroupNorm written channels-last returns a channels-last gradient, which the
    norm's backward kernels must read along its memory (timed channels-first, they looked fast)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    grads = []
    for o in outs:
        values = torch.randn(o.shape, generator=generator).to(o.device, o.dtype)
        grads.append(torch.empty_like(o).copy_(values))  # (the same values; the output's strides where dense)
    return grads
