"""A projection onto a vocabulary whose logits only a cross-entropy reads: "linear-cross-entropy".

`F.cross_entropy(self.lm_head(h).view(-1, V), targets)` writes a tokens × vocabulary logits tensor (and,
in training, its gradient, the log-probabilities the loss keeps, a float32 upcast if the code makes one)
only to reduce each row to one number.  A fused loss computes the logits a chunk of tokens at a time and
never writes them all.  Recognised forms, from the loss back to the projection:

- `F.cross_entropy(logits, t)`;
- `F.nll_loss(F.log_softmax(logits, -1), t)`;
- `-F.log_softmax(logits, -1).gather(-1, t[..., None])` (each token's loss, `.squeeze(-1)` or not);

with `logits = F.linear(x, W, b)` (an `nn.Linear`), then any of `view`, `reshape`, `flatten` that keep the
classes last, and a float32 upcast (`.float()`), in either order.  The classes must outnumber the
projection's input features (a vocabulary, not a classifier's few classes: only then are the logits
the larger tensor).

Where the fused loss cannot stand in for the code, the match says why: the logits
read elsewhere, a weight that is not a parameter as it is, soft-capping or another change of the
logits between the projection and the loss, class weights, probabilities as targets (codes of the
report's `REWRITE_REFUSALS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .graph import Graph, Node
from .ops import OpClass

Form = Literal["cross_entropy", "nll_loss", "gather"]

# The views between the projection and the loss that keep the classes as the last dim, merging the
# token dims (`logits.view(-1, V)`); identities that give their operand itself.
_FLATTENING = frozenset({"view", "reshape", "flatten"})
_THE_SAME = frozenset({"to_same", "contiguous", "alias"})
_STEPS_BACK = 12  # how far from the loss a projection is looked for


@dataclass
class LinearLoss:
    """One projection and the loss that is its logits' only reader."""

    form: Form
    linear: int  # the `linear` node
    loss: int  # the node whose value the fused loss computes (the loss, or a token's loss)
    chain: list[int]  # the nodes from the projection to `loss`, in graph order
    hidden: int  # the projection's input
    weight: int
    bias: int | None
    target: int
    log_softmax: int | None  # the nll_loss and gather forms' log-softmax
    upcast: int | None  # the float32 cast the code makes, if any
    tokens: int
    vocabulary: int
    features: int
    dtype: str  # the logits'
    loss_dtype: str  # the dtype the loss reads them in
    refused: tuple[str, str] | None = None  # (a REWRITE_REFUSALS code, the detail)
    squeezed: bool = False  # the gather form's pick is squeezed (one loss per token, no trailing 1)
    negated: bool = True  # the gather form's pick is negated (a loss, not a log-probability)
    notes: list[str] = field(default_factory=list)


def find_linear_losses(graph: Graph) -> list[LinearLoss]:
    found = []
    for node in graph:
        match = _from_loss(graph, node)
        if match is not None:
            found.append(match)
    return found


def _from_loss(graph: Graph, node: Node) -> LinearLoss | None:
    if node.op == "cross_entropy" and node.inputs:
        return _walk(graph, "cross_entropy", node, node.id, node.inputs[0], _operand(node, 1))
    if node.op == "nll_loss" and node.inputs:
        logp = graph[_through_views(graph, node.inputs[0])]
        if logp.op != "log_softmax" or not _over_last_dim(graph, logp):
            return None
        return _walk(graph, "nll_loss", node, node.id, node.inputs[0], _operand(node, 1))
    if node.op == "gather" and node.cls is OpClass.REDUCTION and node.inputs:
        logp = graph[_through_views(graph, node.inputs[0])]
        if logp.op != "log_softmax" or not _over_last_dim(graph, logp):
            return None
        tail, squeezed, negated = _pick_tail(graph, node)
        return _walk(graph, "gather", node, tail, node.inputs[0], _operand(node, 1), squeezed, negated)
    return None


def _operand(node: Node, k: int) -> int | None:
    refs = node.refs
    return refs[k].node if len(refs) > k else None


def _pick_tail(graph: Graph, gather: Node) -> tuple[int, bool, bool]:
    """The gather form's value: the pick, squeezed, negated (each only where it is the only reader)."""
    tail, squeezed, negated = gather.id, False, False
    readers = graph.users(tail)
    if len(readers) == 1 and graph[readers[0]].op == "squeeze":
        tail, squeezed = readers[0], True
        readers = graph.users(tail)
    if len(readers) == 1 and graph[readers[0]].op == "neg":
        tail, negated = readers[0], True
    return tail, squeezed, negated


def _upcast(node: Node) -> bool:
    """A cast to float32: `.float()`, `.to(torch.float32)` (one that finds float32 logits gives them as
    they are, and the code still asks for float32, whatever dtype the model runs in)."""
    if node.meta is None or node.meta.dtype != "float32":
        return False
    return node.op == "cast" or (node.op == "to_same" and node.call.rsplit(".", 1)[-1] in ("float", "to", "type"))


def _through_views(graph: Graph, node_id: int) -> int:
    node = graph[node_id]
    while node.inputs and (node.op in _FLATTENING or node.op in _THE_SAME):
        node = graph[node.inputs[0]]
    return node.id


def _over_last_dim(graph: Graph, node: Node) -> bool:
    meta = node.meta
    return meta is not None and node.params.get("dims") == [len(meta.shape) - 1]


def _walk(
    graph: Graph,
    form: Form,
    loss_node: Node,
    loss: int,
    logits_in: int,
    target: int | None,
    squeezed: bool = False,
    negated: bool = True,
) -> LinearLoss | None:
    """From the loss's input back to the projection: the ops between them, and what refuses the fusion."""
    chain = [loss_node.id] + ([] if loss == loss_node.id else _between(graph, loss_node.id, loss))
    log_softmax = upcast = None
    changed: list[Node] = []
    current = graph[logits_in]
    for _ in range(_STEPS_BACK):
        if current.op == "linear":
            break
        if not current.inputs or current.cls in (OpClass.SOURCE, OpClass.OPAQUE):
            return None
        chain.append(current.id)
        if current.op == "log_softmax" and form != "cross_entropy" and log_softmax is None:
            log_softmax = current.id
        elif upcast is None and _upcast(current):
            upcast = current.id
        elif not (current.op in _FLATTENING or current.op in _THE_SAME):
            changed.append(current)
        current = graph[current.inputs[0]]
    else:
        return None
    linear = current
    operands = [r.node for r in linear.refs]
    if len(operands) < 2 or linear.meta is None or target is None:
        return None
    vocabulary = linear.meta.shape[-1]
    weight = graph[operands[1]]
    features = weight.meta.shape[-1] if weight.meta and weight.meta.shape else 0
    if vocabulary <= features:
        return None  # a classifier's few classes: its logits are no larger than its input
    chain.append(linear.id)
    loss_input = graph[logits_in].meta
    match = LinearLoss(
        form=form,
        linear=linear.id,
        loss=loss,
        chain=sorted(set(chain)),
        hidden=operands[0],
        weight=operands[1],
        bias=operands[2] if len(operands) > 2 else None,
        target=target,
        log_softmax=log_softmax,
        upcast=upcast,
        tokens=linear.meta.numel // vocabulary,
        vocabulary=vocabulary,
        features=features,
        dtype=linear.meta.dtype,
        loss_dtype=loss_input.dtype if loss_input else linear.meta.dtype,
        squeezed=squeezed,
        negated=negated,
    )
    match.refused = _refusal(graph, match, loss_node, changed)
    return match


def _between(graph: Graph, start: int, end: int) -> list[int]:
    """The nodes from `start`'s reader to `end` (the gather form's squeeze and negation)."""
    out, current = [], start
    while current != end:
        current = graph.users(current)[0]
        out.append(current)
    return out


def _refusal(graph: Graph, match: LinearLoss, loss: Node, changed: list[Node]) -> tuple[str, str] | None:
    """Why the fused loss cannot stand in for these ops, or None."""
    softcap = [n for n in changed if n.op == "tanh"]
    if softcap:
        return "soft-capping", f"`tanh` ({_at(softcap[0])}) soft-caps the logits before the loss"
    if changed:
        ops = ", ".join(f"`{n.op}` ({_at(n)})" for n in reversed(changed))
        return "modified", f"{ops} change the logits between the projection and the loss"
    logits = graph[match.linear].meta
    last = graph[loss.inputs[0]].meta
    if logits is None or last is None or not last.shape or last.shape[-1] != match.vocabulary:
        return "shape", "the loss reads the logits with the classes moved from the last dim"
    if loss.op in ("cross_entropy", "nll_loss") and loss.cls is OpClass.OPAQUE:
        target = graph[match.target].meta
        if target is not None and target.dtype.startswith(("float", "bfloat")):
            return "soft-targets", f"the targets of `{loss.op}` ({_at(loss)}) are class probabilities"
        if len(loss.refs) > 2:
            return "class-weights", f"`{loss.op}` ({_at(loss)}) weights its classes"
        if len(last.shape) != 2:
            return "shape", f"`{loss.op}` ({_at(loss)}) reads the classes in dim 1 of {len(last.shape)}"
    escape = _escape(graph, match)
    if escape is not None:
        return "escapes", escape
    weight = graph[match.weight]
    if weight.op != "param":
        return "weight", f"the projection ({_at(graph[match.linear])}) takes {_made(graph, weight)} as its weight"
    if match.bias is not None and graph[match.bias].op != "param":
        bias = graph[match.bias]
        return "weight", f"the projection ({_at(graph[match.linear])}) takes {_made(graph, bias)} as its bias"
    return None


def _escape(graph: Graph, match: LinearLoss) -> str | None:
    """Where a value between the projection and the loss is read by something else: returned, kept,
    sampled from."""
    inside = set(match.chain)
    for node_id in match.chain:
        if node_id == match.loss:
            continue
        for reader in graph.users(node_id):
            if reader in inside:
                continue
            what = "the logits" if node_id == match.linear else f"the `{graph[node_id].op}` of the logits"
            other = graph[reader]
            if other.op == "output":
                return f"{what} ({_at(graph[node_id])}) are also returned"
            return f"{what} ({_at(graph[node_id])}) are also read by `{other.op}` ({_at(other)})"
    return None


def _made(graph: Graph, node: Node) -> str:
    if node.cls.free and node.inputs:
        root = graph[graph.view_root(node.id)]
        name = f" of `{root.name}`" if root.name else ""
        return f"a `{node.op}`{name}"
    if node.op == "input":
        return f"an input (`{node.name}`)" if node.name else "an input"
    return f"a value computed by `{node.op}` ({_at(node)})"


def _at(node: Node) -> str:
    return f"line {node.line}" if node.line else "the model"
