"""Detection: group absorbable ops into fusable clusters, and say why the rest were not.

The pass walks the graph in execution order and grows clusters greedily, the way a
fusing compiler does: each absorbable op tries to join the clusters that produce its
operands (through any views between them); the join happens if the grown group is
still legal.  Legality, in the order it is checked:

- `aliasing`    an in-place write whose buffer other views can observe, or a norm that also
  updates its running statistics in place (a batch norm in training);
- `no-lowering` a scan (cumsum), which no row kernel computes;
- `reduction`   a reduction of a whole tensor to one value;
- `graph-break` members would sit on both sides of a data-dependent break;
- `layer-boundary` members would run in two layers of a module list (`blocks.3`, `blocks.4`), or in
  one and outside it: the layers would no longer run the same code, and no edit of one layer's code
  (or patch of its class) could apply the kernel; or a copy (a concatenation of one piece, as a
  key cache makes) would join the code that computes its piece from another function;
- `convexity`   a dependency path leaves the group and re-enters it;
- `fan-out` / `shape` / `reduction` / `no-lowering` from the kernel planner (injected
  by the caller, so analysis knows what codegen can express without importing it):
  an escaping value one kernel cannot write, two iteration spaces, two row spaces (reductions over
  different dims, or windows, of one tensor), an op or pooling the kernels do not lower.

No silent drops: every absorbable op ends in exactly one cluster (of two or more
compute ops) or in exactly one rejection with a reason code and a sentence, and so does
every op that reduces, selects or orders along dims but that no kernel here computes
(`torch.max(x, dim)`, `topk`, pooling: `unlowered.py`).  An op left alone next to a
fusable one it meets through a view a kernel does not follow (a reshape) says so (`view`).
A failed join never discards work: the op starts its own cluster, and every legal
sub-group survives.  Once the groups are grown, a GEMM whose result only one group's elementwise
ops read starts that group, as the product whose epilogue they are (`_start_with_gemms`).  Views
and identities (eval dropout, `contiguous` on a contiguous tensor, same-dtype casts) move no data:
they join clusters as glue but never count as ops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .gemms import GEMM_OPS, gemm_form
from .graph import Graph, Node
from .ops import OpClass
from .places import common_place
from .unlowered import reductive, why_unlowered

# A planner answers: can one kernel compute `members` of `graph`?  (ok, reason, detail)
Planner = Callable[[Graph, frozenset[int]], tuple[bool, str, str]]

# View steps a kernel can follow with index arithmetic.  A reshape's coordinates divide by the sizes
# it splits or merges, which the kernel takes as the analyzed ones (the launcher holds the inputs to them).
KERNEL_VIEW_STEPS = {"permute", "unsqueeze", "squeeze", "expand", "slice", "select", "reshape"}


@dataclass
class Split:
    """A join that was refused: `node` stayed out of `cluster` for `reason`."""

    node: int
    reason: str
    detail: str


@dataclass
class Group:
    members: set[int]  # compute ops and the views/identities between them
    splits: list[Split] = field(default_factory=list)
    # A GEMM the group starts with (`analysis.gemms`), which computes its result with the group's ops
    # as its epilogue; and, when those ops are one op, why that op alone would not be a cluster.
    gemm: int | None = None
    alone: tuple[str, str] | None = None

    def compute(self, graph: Graph) -> list[int]:
        """The ops that compute (not the views and identities between them), the GEMM it starts with too."""
        return sorted(m for m in self.members if graph[m].cls.absorbable or m == self.gemm)


@dataclass
class Rejected:
    node: int
    reason: str
    detail: str


@dataclass
class Detection:
    clusters: list[Group]
    rejected: list[Rejected]
    functionalised: list[int]  # in-place ops proven safe to treat as out-of-place


def describe(node: Node) -> str:
    where = f" (line {node.line})" if node.line else ""
    return f"`{node.op}`{where}"


def shape_text(node: Node) -> str:
    return "[" + ", ".join(map(str, node.meta.shape)) + "]" if node.meta else "[?]"


class _Reach:
    """Ancestor/descendant sets as bit masks, for convexity checks."""

    def __init__(self, graph: Graph):
        n = len(graph)
        self.anc = [0] * n
        for node in graph:
            mask = 0
            for i in node.inputs:
                mask |= self.anc[i] | (1 << i)
            self.anc[node.id] = mask
        self.desc = [0] * n
        for node in reversed(graph.nodes):
            for i in node.inputs:
                self.desc[i] |= self.desc[node.id] | (1 << node.id)

    def escapee(self, members: set[int]) -> int | None:
        """A non-member on a path from the group back into it, if any."""
        mask = 0
        for m in members:
            mask |= 1 << m
        down = up = 0
        for m in members:
            down |= self.desc[m]
            up |= self.anc[m]
        bad = down & up & ~mask
        if not bad:
            return None
        return (bad & -bad).bit_length() - 1


def detect(graph: Graph, planner: Planner) -> Detection:
    reach = _Reach(graph)
    functionalised = _functionalise_inplace(graph)
    cluster_of: dict[int, int] = {}
    groups: list[Group | None] = []
    rejected: list[Rejected] = []
    failed_join: dict[int, tuple[str, str]] = {}

    for node in graph:
        if reductive(node):
            rejected.append(Rejected(node.id, *why_unlowered(graph, node, describe)))
            continue
        if not node.cls.absorbable:
            continue
        if node.meta is None:
            rejected.append(Rejected(node.id, *_several_results(node)))
            continue
        blocker = _intrinsic_blocker(graph, node, functionalised)
        if blocker:
            rejected.append(Rejected(node.id, *blocker))
            continue
        glue, producers = _producer_clusters(graph, node, cluster_of)
        joined = _try_join(graph, reach, planner, node, glue, producers, groups, cluster_of, failed_join)
        if not joined:
            cluster_of[node.id] = len(groups)
            groups.append(Group({node.id}))

    _start_with_gemms(graph, reach, planner, groups, failed_join)
    clusters: list[Group] = []
    for group in groups:
        if group is None:
            continue
        compute = group.compute(graph)
        if len(compute) >= 2:
            _take_views_inside(graph, planner, group)
            clusters.append(group)
            continue
        rejected.append(Rejected(compute[0], *_why_apart(graph, group, failed_join)))
    rejected.sort(key=lambda r: r.node)
    return Detection(clusters, rejected, functionalised)


def _why_apart(graph: Graph, group: Group, failed_join: dict[int, tuple[str, str]]) -> tuple[str, str]:
    """Why a group of one op stayed alone: a neighbour's refused join into it, its own refused join, or
    no neighbour."""
    only = group.compute(graph)[0]
    if group.splits:
        reason, detail = group.splits[0].reason, group.splits[0].detail
    else:
        reason, detail = failed_join.get(only, ("", ""))
    if not reason:
        reason, detail = _why_alone(graph, only)
    return reason, detail


def _start_with_gemms(
    graph: Graph,
    reach: _Reach,
    planner: Planner,
    groups: list[Group | None],
    failed_join: dict[int, tuple[str, str]],
) -> None:
    """Each GEMM whose result only one group's elementwise ops read (through identities: an eval-mode
    dropout) starts that group, where the planner takes the two as one kernel: the product with those
    ops as its epilogue, whose result no longer goes to memory and back.  Ops that only run after a
    GEMM, which grouped with no other op (`gelu` between two projections), form a cluster with it."""
    taken: set[int] = set()
    for group in groups:
        if group is None:
            continue
        for gemm, glue in _gemms_read_by(graph, group.members):
            if gemm in taken:
                continue
            if layer_of(graph[gemm].module) not in _layers(graph, group.members):
                continue  # a layer's last projection, read by the code around the layers
            members = group.members | glue | {gemm}
            if _legal(graph, reach, planner, members) is not None:
                continue
            if len(group.compute(graph)) == 1:
                group.alone = _why_apart(graph, group, failed_join)
            group.members, group.gemm = members, gemm
            taken.add(gemm)
            break


def _gemms_read_by(graph: Graph, members: set[int]) -> list[tuple[int, set[int]]]:
    """The GEMMs (in execution order) whose result only `members` read, directly or through identities
    (each with those identities)."""
    found = []
    for operand in sorted({i for m in members for i in graph[m].inputs} - members):
        glue: set[int] = set()
        node = graph[operand]
        while node.cls is OpClass.IDENTITY and node.inputs and node.id not in members:
            glue.add(node.id)
            node = graph[node.inputs[0]]
        if node.op not in GEMM_OPS or gemm_form(graph, node) is None:
            continue
        readers, todo = set(), list(graph.users(node.id))
        while todo:
            user = todo.pop()
            readers.add(user)
            if graph[user].cls is OpClass.IDENTITY and user not in members:
                todo += graph.users(user)
        if readers - glue <= members and all(set(graph.users(g)) <= members | glue for g in glue):
            found.append((node.id, glue))
    return sorted(found, key=lambda f: f[0])


def _take_views_inside(graph: Graph, planner: Planner, group: Group) -> None:
    """Views of the cluster's inputs taken inside the calls the cluster makes (the slices in
    `rotate_half(q)`), and used by nothing else, join it when one kernel can still compute it: its
    kernel then reads the viewed tensor, which the call site can name, and reads it once."""
    inner = _views_inside(graph, group.compute(graph), group.members)
    if inner and planner(graph, frozenset(group.members | inner))[0]:
        group.members |= inner


def _views_inside(graph: Graph, compute: list[int], members: set[int]) -> set[int]:
    place = common_place(graph, compute)
    if place is None:
        return set()
    spans = {f.span for i in compute for f in graph[i].stack if f.invocation == place.invocation}
    taken: set[int] = set()
    grew = True
    while grew:  # a view joins once every user of it has: repeat until none joins
        grew = False
        for operand in sorted({o for m in members | taken for o in graph[m].inputs} - members - taken):
            node = graph[operand]
            if node.cls is not OpClass.VIEW or not followable(node) or not node.inputs or _regroups(node):
                continue
            frame = next((f for f in node.stack if f.invocation == place.invocation), None)
            if frame is None or frame.span not in spans:
                continue
            if all(u in members or u in taken for u in graph.users(node.id)):
                taken.add(node.id)
                grew = True
    return taken


def _functionalise_inplace(graph: Graph) -> list[int]:
    """In-place ops on private, unaliased intermediates are safe to treat as out-of-place."""
    safe = []
    for node in graph:
        if not node.inplace or not node.cls.absorbable:
            continue
        target = node.params.get("mutates")
        if target is None:
            continue
        victim = graph[target]
        aliased = victim.cls in (OpClass.SOURCE, OpClass.VIEW) or any(
            graph[u].cls in (OpClass.VIEW, OpClass.IDENTITY) for u in graph.users(target) if u != node.id
        )
        if not aliased:
            safe.append(node.id)
    return safe


def _intrinsic_blocker(graph: Graph, node: Node, functionalised: list[int]) -> tuple[str, str] | None:
    if node.inplace and node.id not in functionalised:
        victim = graph[node.params["mutates"]] if node.params.get("mutates") is not None else None
        what = f"{victim.cls.value} `{victim.name or victim.op}`" if victim else "its input"
        return (
            "aliasing",
            f"{describe(node)} writes in place into {what}, which other views or the caller "
            "can observe; a fused kernel would change what they see",
        )
    copy = _copy_made_elsewhere(graph, node)
    if copy is not None:
        return copy
    if node.cls is OpClass.REDUCTION:
        if node.params.get("scan"):
            return "no-lowering", f"{describe(node)} is a scan (prefix op), not a reduction a row kernel computes"
        if node.params.get("updates"):
            whose = "each sample's" if node.op == "instance_norm" else "the batch's"
            return (
                "aliasing",
                f"{describe(node)} normalises with {whose} statistics and also updates the running mean and "
                "variance in place, which a kernel that returns values would leave stale; it fuses in eval mode "
                "(a scale and shift per channel) or built with track_running_stats=False",
            )
        x = graph[node.inputs[0]] if node.inputs else None
        dims = node.params.get("dims", [])
        if x is not None and x.meta is not None and node.op != "group_norm" and not node.params.get("window"):
            ndim = len(x.meta.shape)
            if ndim and len(dims) == ndim and x.meta.numel > 1:
                return (
                    "reduction",
                    f"{describe(node)} reduces all of {shape_text(x)} to one value, which a row-per-program "
                    "kernel would compute in a single program; a reduction over some of its dims (`dim=...`) fuses",
                )
    return None


def _copy_made_elsewhere(graph: Graph, node: Node) -> tuple[str, str] | None:
    """A concatenation of one piece is a copy; made in another function than its piece (a key cache's
    `torch.cat([keys, key_states])` with the cache still empty), it belongs to neither: a kernel
    that wrote it could be applied to no one block of code, so the copy stays out of the cluster."""
    if node.op != "cat" or len(node.refs) != 1:
        return None
    piece = graph[graph.view_root(node.refs[0].node)]
    if node.source is None or piece.source is None:
        return None
    made, computed = node.source, piece.source
    if (made.file, made.function) == (computed.file, computed.function):
        return None
    return (
        "layer-boundary",
        f"{describe(node)} only copies `{piece.op}`, in {made.function}, away from the code that "
        f"computes it ({computed.function}): a kernel that also wrote the copy could be applied to neither",
    )


def _producer_clusters(graph: Graph, node: Node, cluster_of: dict[int, int]) -> tuple[set[int], list[int]]:
    """Clusters that produce `node`'s operands through kernel-followable views, and those views."""
    glue: set[int] = set()
    producers: list[int] = []
    for operand in node.inputs:
        chain = []
        current = graph[operand]
        while current.cls.free and current.inputs and followable(current):
            chain.append(current.id)
            current = graph[current.inputs[0]]
        cid = cluster_of.get(current.id)
        if cid is None:
            continue
        glue.update(chain)
        if cid not in producers:
            producers.append(cid)
    return glue, producers


def _regroups(node: Node) -> bool:
    """A view that reshapes: read through it, an input would be held to the analyzed sizes of the dims
    it regroups (`q_proj(x).view(b, t, heads, dim)`), where read as the view it takes any."""
    return any(step[0] == "reshape" for step in node.params.get("steps", []))


def followable(node: Node) -> bool:
    """A view or identity a kernel can see through with index arithmetic."""
    if node.cls is OpClass.IDENTITY:
        return node.op != "item"
    return all(step[0] in KERNEL_VIEW_STEPS for step in node.params.get("steps", [("opaque",)]))


def _try_join(graph, reach, planner, node, glue, producers, groups, cluster_of, failed_join) -> bool:
    if not producers:
        return False
    # Everything at once first, then each producer cluster alone, largest first.
    attempts = [list(producers)]
    if len(producers) > 1:
        attempts += [[p] for p in sorted(producers, key=lambda p: -len(groups[p].members))]
    failures: list[tuple[str, str, int]] = []  # (reason, detail, cluster) of each refused attempt
    for attempt in attempts:
        members = {node.id} | {m for p in attempt for m in groups[p].members}
        members |= {g for g in glue if any(_reaches_group(graph, g, groups[p].members) for p in attempt)}
        verdict = _legal(graph, reach, planner, members)
        if verdict is None:
            target = attempt[0]
            group = groups[target]
            for other in attempt[1:]:
                group.splits += groups[other].splits
                groups[other] = None
            group.members = members
            for m in members:
                cluster_of[m] = target
            return True
        failures.append((*verdict, attempt[0]))
    reason, detail, cid = failures[0]  # every attempt was refused, and there is at least one
    failed_join[node.id] = (reason, detail)
    groups[cid].splits.append(Split(node.id, reason, detail))
    return False


def _reaches_group(graph: Graph, view_id: int, members: set[int]) -> bool:
    current = graph[view_id]
    while current.cls.free and current.inputs:
        current = graph[current.inputs[0]]
    return current.id in members


def _legal(graph: Graph, reach: _Reach, planner: Planner, members: set[int]) -> tuple[str, str] | None:
    pieces = {graph[m].piece for m in members}
    if len(pieces) > 1:
        brk = graph.breaks[min(pieces)] if graph.breaks and min(pieces) < len(graph.breaks) else None
        where = f" at line {brk.line}" if brk else ""
        return "graph-break", f"the ops sit on both sides of the graph break{where}"
    layers = _layers(graph, members)
    if len(layers) > 1:
        (a, where_a), (b, where_b) = sorted(layers.items())[:2]
        return (
            "layer-boundary",
            f"{describe(graph[where_a])} ({a or 'outside the layers'}) and {describe(graph[where_b])} "
            f"({b or 'outside the layers'}) would share a kernel across a layer's boundary: the layers "
            "would no longer run the same code, so no edit or patch of one layer's code can apply it",
        )
    outsider = reach.escapee(members)
    if outsider is not None:
        return (
            "convexity",
            f"{describe(graph[outsider])} depends on the group and feeds it; "
            "fusing around it would need its result before it can run",
        )
    ok, reason, detail = planner(graph, frozenset(members))
    return None if ok else (reason, detail)


def layer_of(module: str) -> str:
    """The repeated layer a module path lies in: its path up to the last index of a module list
    ("blocks.3" for "blocks.3.attn", "model.layers.0" for "model.layers.0.mlp"); "" outside them."""
    parts = module.split(".") if module else []
    last = max((i for i, part in enumerate(parts) if part.isdigit()), default=-1)
    return ".".join(parts[: last + 1])


def _layers(graph: Graph, members: set[int]) -> dict[str, int]:
    """The layers the group's ops run in, each with one of its ops."""
    found: dict[str, int] = {}
    for m in sorted(members):
        if graph[m].cls.absorbable:
            found.setdefault(layer_of(graph[m].module), m)
    return found


def _several_results(node: Node) -> tuple[str, str]:
    """Why an op that returns several tensors stays out: a kernel here computes one value per op."""
    count = len(node.params.get("outputs", [])) or "several"
    return (
        "no-lowering",
        f"{describe(node)} returns {count} tensors; a kernel here computes one value per op: "
        "an op for each result would fuse",
    )


def _why_alone(graph: Graph, node_id: int) -> tuple[str, str]:
    node = graph[node_id]
    across = _across_a_view(graph, node)
    if across is not None:
        return across
    neighbours = [graph[graph.view_root(i)] for i in node.inputs] + [
        graph[u] for u in _users_through_free(graph, node_id)
    ]
    barriers = [n for n in neighbours if n.cls is OpClass.OPAQUE and n.op != "output"]
    if barriers:
        names = ", ".join(sorted({describe(n) for n in barriers}))
        return (
            "no-neighbour",
            f"{describe(node)} sits between ops that cannot be fused ({names}); nothing to fuse it with",
        )
    return "no-neighbour", f"{describe(node)} has no adjacent fusable op"


def _across_a_view(graph: Graph, node: Node) -> tuple[str, str] | None:
    """A fusable neighbour that `node` reads, or that reads it, through a view a kernel does not
    follow (a `view` or `reshape` that regroups dims, whose sizes on both sides only the run knows):
    that view, not the lack of a neighbour, is what kept them apart."""
    for operand in node.inputs:
        chain, current = [], graph[operand]
        while current.cls.free and current.inputs:
            chain.append(current)
            current = graph[current.inputs[0]]
        blocking = next((v for v in chain if not followable(v)), None)
        if blocking is not None and current.cls.absorbable:
            return _view_between(graph, current, blocking, node)
    for user, blocking in _users_across_views(graph, node.id, None):
        if blocking is not None:
            return _view_between(graph, node, blocking, user)
    return None


def _users_across_views(graph: Graph, node_id: int, blocking: Node | None) -> list[tuple[Node, Node | None]]:
    """The fusable ops that read `node_id` through views and identities, each with the first view on
    the way that a kernel does not follow (None: none)."""
    out = []
    for u in graph.users(node_id):
        user = graph[u]
        if user.cls.free:
            out += _users_across_views(graph, u, blocking or (None if followable(user) else user))
        elif user.cls.absorbable:
            out.append((user, blocking))
    return out


def _view_between(graph: Graph, producer: Node, view: Node, reader: Node) -> tuple[str, str]:
    return (
        "view",
        f"{describe(reader)} reads {describe(producer)} through {describe(view)} to {shape_text(view)}, "
        "a regrouping of dims that a kernel does not follow (it follows permutes, slices, (un)squeezes "
        "and expands); taking the view before the first op or after the last lets them fuse",
    )


def _users_through_free(graph: Graph, node_id: int) -> list[int]:
    out = []
    for u in graph.users(node_id):
        out += _users_through_free(graph, u) if graph[u].cls.free else [u]
    return out
