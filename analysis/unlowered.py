"""Ops that reduce, select or order along dims, which no kernel here computes: why each stays out.

`torch.max(x, dim)` returns the values and the indices, `topk` and `sort` select and order, a
pooling reduces windows of an image, `cummax` scans: none is a fusable op (`OpClass`), and each
is opaque to detection.  Yet each is what a reader of the model would call a reduction, and a
fusing compiler may well fuse it, so none may be left out of a report without a word: each
becomes a rejection with the reason and, where an op that does fuse computes the same (`amax`
where only the values are read), the rewrite that lets it join its neighbours.
"""

from __future__ import annotations

from collections.abc import Callable

from .graph import Graph, Node
from .ops import OpClass

# Each op that reduces, selects or orders along dims, by what it does (its sentence's kind).
_REDUCES_TO_SEVERAL = {"max", "min", "aminmax", "var_mean", "std_mean"}
_SELECTS = {
    "topk",
    "sort",
    "argsort",
    "msort",
    "median",
    "nanmedian",
    "kthvalue",
    "mode",
    "quantile",
    "nanquantile",
}
_SCANS = {"cummax", "cummin", "logcumsumexp"}
_OTHER_REDUCTIONS = {"count_nonzero", "nansum", "nanmean", "linalg_vector_norm", "vector_norm"}
_POOLS = {
    f"{kind}_pool{n}d"
    for kind in ("avg", "max", "lp", "adaptive_avg", "adaptive_max", "fractional_max")
    for n in (1, 2, 3)
} | {f"max_pool{n}d_with_indices" for n in (1, 2, 3)}
REDUCTIVE = frozenset(_REDUCES_TO_SEVERAL | _SELECTS | _SCANS | _OTHER_REDUCTIONS | _POOLS)

# Where an op that fuses computes what one of these does, for one kernel to take it in.
_REWRITES = {
    "count_nonzero": "`(x != 0).float().sum(dim)` counts in a kernel, as floats",
    "nansum": "`torch.nan_to_num(x, nan=0.0).sum(dim)` is a sum a kernel fuses",
    "nanmean": "a mean over the values that are not NaN, as `nan_to_num` and `sum` divided by a count, fuses",
    "linalg_vector_norm": "`torch.norm(x, dim=...)` (the 2-norm) is a reduction a kernel fuses",
    "vector_norm": "`torch.norm(x, dim=...)` (the 2-norm) is a reduction a kernel fuses",
    "aminmax": "`torch.amin(x, dim)` and `torch.amax(x, dim)` apart are reductions a kernel fuses",
    "var_mean": "`torch.var(x, dim)` and `x.mean(dim)` apart are reductions a kernel fuses",
    "std_mean": "`torch.std(x, dim)` and `x.mean(dim)` apart are reductions a kernel fuses",
}


def reductive(node: Node) -> bool:
    """An op that reduces, selects or orders along dims and that no kernel here computes (opaque)."""
    return node.cls is OpClass.OPAQUE and node.op in REDUCTIVE


def why_unlowered(graph: Graph, node: Node, describe: Callable[[Node], str]) -> tuple[str, str]:
    """(reason code, sentence) for a `reductive` op: what it does that no kernel here computes, and the
    rewrite that fuses, where there is one.  `describe` names an op as detection's messages do."""
    what = describe(node)
    x = graph[node.inputs[0]] if node.inputs else None
    shape = f"[{', '.join(map(str, x.meta.shape))}]" if x is not None and x.meta is not None else ""
    of, tensor = (f" of a {shape} tensor", f"a {shape} tensor") if shape else ("", "its input")
    if node.op in _POOLS:
        sentence = (
            f"{what} reduces windows{of} over its spatial dims in a way no kernel here computes "
            "(windows that run past the edge with `ceil_mode`, or adaptive ones of more than one element)"
        )
        spatial = int(node.op[-2]) if node.op.endswith("d") and node.op[-2].isdigit() else 0
        if node.op.startswith("adaptive_avg_pool") and spatial and _one_value_a_channel(node, spatial):
            dims = ", ".join(str(-d) for d in range(spatial, 0, -1))
            sentence += f"; to one value a channel, `x.mean(({dims}), keepdim=True)` is a reduction a kernel fuses"
        return "reduction", sentence
    if node.op in ("max", "min"):
        sentence = f"{what} with a dim returns the values and the indices{of}; no kernel here writes both"
        if not _indices_read(graph, node):
            sentence += f"; only the values are read: `torch.a{node.op}(x, dim)` is a reduction a kernel fuses"
        return "no-lowering", sentence
    if node.op in _SELECTS:
        return "no-lowering", f"{what} selects or orders elements along a dim{of}; no kernel here computes it"
    if node.op in _SCANS:
        return "no-lowering", f"{what} is a scan along a dim{of} (each element from all before it), not a row reduction"
    sentence = f"{what} reduces {tensor} along dims in a way no kernel here computes"
    rewrite = _REWRITES.get(node.op)
    return "no-lowering", sentence + (f"; {rewrite}" if rewrite else "")


def _one_value_a_channel(node: Node, spatial: int) -> bool:
    """Whether a pooling's result is one value for each of its `spatial` dims (a global pooling)."""
    shape = node.meta.shape if node.meta is not None else None
    return shape is not None and len(shape) > spatial and all(d == 1 for d in shape[-spatial:])


def _indices_read(graph: Graph, node: Node) -> bool:
    """Whether anything reads the second tensor a values-and-indices op returned."""
    items = [graph[u] for u in graph.users(node.id) if graph[u].op == "item" and graph[u].params.get("index") == 1]
    return any(graph.users(item.id) for item in items)
