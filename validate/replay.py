"""Re-running a cluster's recorded calls eagerly: the reference it is timed and compiled against.

A real-tensor trace records, for every node, the torch callable and its arguments (tensors
as references to other nodes).  Replaying a cluster's members in order, on any tensors of
the right shapes, computes exactly what the user's code computes for those ops, so
`torch.compile` of the replay is Inductor's best at the same fusion.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fuselens.analysis.graph import Graph, Ref, plain
from fuselens.codegen.plan import KernelPlan, returned_outputs


def _substitute(value: Any, env: dict[int, torch.Tensor]) -> Any:
    if isinstance(value, Ref):
        return env[value.node]
    if isinstance(value, list):
        return [_substitute(v, env) for v in value]
    if isinstance(value, tuple):
        return tuple(_substitute(v, env) for v in value)
    if isinstance(value, dict):
        return {k: _substitute(v, env) for k, v in value.items()}
    return value


def cluster_function(graph: Graph, plan: KernelPlan, values: dict[int, torch.Tensor]) -> Callable[..., Any]:
    """f(*inputs) -> output(s) of the cluster, by replaying its members' recorded calls.

    A call may reference a tensor that is not a data input (`h.type_as(x)` only reads x's
    dtype); those come from the trace's recorded `values`.
    """
    members = sorted(plan.members)
    missing = [graph[m].op for m in members if graph[m].replay is None]
    if missing:
        raise ValueError(f"no recorded call to replay for {', '.join(missing)}")
    inputs = [s.node for s in plan.inputs]
    outputs = [o.node for o in returned_outputs(plan)]

    members_set = set(members)
    extra = {
        r.node: values[r.node]
        for m in members
        for r in _refs(graph[m].replay[:3])
        if r.node not in members_set and r.node not in inputs
    }

    # The calls with plain numbers: torch.compile, which times the same calls, sees constants, not the
    # capture's named numbers (an object of its own class would break its graph).
    calls = {m: plain(graph[m].replay) for m in members}

    def run(*args):
        env = dict(extra)
        env.update(zip(inputs, args, strict=True))
        for m in members:
            func, args, kwargs, index = calls[m]
            out = func(*_substitute(args, env), **_substitute(kwargs, env))
            env[m] = out[index] if index is not None else out
        result = [env[o] for o in outputs]
        return result[0] if len(result) == 1 else tuple(result)

    return run


def _refs(value: Any) -> list[Ref]:
    if isinstance(value, Ref):
        return [value]
    if isinstance(value, (list, tuple)):
        return [r for v in value for r in _refs(v)]
    if isinstance(value, dict):
        return [r for v in value.values() for r in _refs(v)]
    return []
