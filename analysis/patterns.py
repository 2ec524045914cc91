"""Named compound patterns a kernel library would fuse, costed with an HBM roofline.

Clusters answer "which ops can share one generated kernel".  Patterns answer a
different question an engineer asks about a transformer: "is there an RMSNorm here, a
SwiGLU or GeGLU, a tanh-approximate or quick GELU, a residual-add + norm, a GEMM ->
residual -> RMSNorm -> GEMM block, and what would a fused kernel for it save?"  They are
recognised structurally, whether written as one op (`F.rms_norm`) or spelled out
(`x.pow(2).mean(-1) ... rsqrt ... * w`); an activation spelled out
(`0.5 * x * (1 + tanh(...))`) is recognised by what it computes, whatever the order of its ops.

Every estimate is bytes a kernel must move (each input read once, each escaping value
written once) against what eager moves; `speedup_bound` is their ratio, the best a
bandwidth-bound kernel can do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fuselens.contracts.report import ActivationMemory

from .attention import Attention, find_attention
from .cost import op_bytes, value_bytes
from .graph import DTYPE_BYTES, Graph, Node, Ref
from .linear_loss import LinearLoss, find_linear_losses
from .loss_memory import activation_memory
from .ops import GEMMS, OpClass


@dataclass
class Match:
    name: str
    nodes: list[int]  # the ops of the pattern (compute and opaque), in graph order
    bytes_before: int
    bytes_after: int
    dims: dict = field(default_factory=dict)
    summary: str = ""
    # The value the pattern produces: every pattern has one (the residual and GEMM-block patterns
    # start from a norm's), so it is required, by keyword as it follows fields with defaults.
    output: int = field(kw_only=True)
    # The one tensor an activation pattern computes from (GeGLU looks for a GEMM behind it).
    source: int | None = field(default=None, kw_only=True)
    # A training step's peak with and without what the pattern writes (the linear cross-entropy's logits).
    memory: ActivationMemory | None = field(default=None, kw_only=True)
    refused: tuple[str, str] | None = field(default=None, kw_only=True)  # why its fix cannot apply
    # What the builder of the pattern's source rewrite reads (`analysis/rewrites.py`): an attention's parts.
    parts: Any = field(default=None, kw_only=True)

    @property
    def speedup(self) -> float | None:
        return round(self.bytes_before / self.bytes_after, 2) if self.bytes_after else None


def _through_free(graph: Graph, node_id: int) -> int:
    node = graph[node_id]
    while node.cls.free and node.inputs:
        node = graph[node.inputs[0]]
    return node.id


def _consumers(graph: Graph, node_id: int) -> list[int]:
    """Users of a value, looking through views and identities."""
    out = []
    for u in graph.users(node_id):
        if graph[u].cls.free:
            out += _consumers(graph, u)
        else:
            out.append(u)
    return out


def _scalar_arg(node: Node):
    scalars = [a for a in node.args if not isinstance(a, Ref)]
    return scalars[0] if scalars else None


def _tensor_args(graph: Graph, node: Node) -> list[int]:
    return [_through_free(graph, r.node) for r in node.refs]


def find_patterns(graph: Graph) -> list[Match]:
    matches: list[Match] = []
    norms = _rmsnorms(graph) + _layernorms(graph)
    matches += norms
    matches += _swiglu(graph)
    activations = _gelu_tanh(graph) + _quick_gelu(graph)
    matches += activations
    matches += _geglu(graph, activations)
    matches += _rope(graph)
    attention = _attention(graph)
    matches += attention
    inside = {graph_id for m in attention for graph_id in m.nodes}
    matches += [m for m in _softmax(graph) if m.output not in inside]  # (an attention's softmax is the attention's)
    matches += _residual_norm(graph, norms)
    matches += _gemm_block(graph, norms)
    matches += [_linear_cross_entropy(graph, m) for m in find_linear_losses(graph)]
    matches.sort(key=lambda m: m.nodes[0])
    return matches


def _bytes(graph: Graph, ids) -> int:
    return sum(op_bytes(graph, graph[i]) for i in ids)


def _io_bytes(graph: Graph, reads: list[int], writes: list[int]) -> int:
    return sum(value_bytes(graph[i]) for i in set(reads)) + sum(value_bytes(graph[i]) for i in set(writes))


# ---- RMSNorm -------------------------------------------------------------------------------


def _rmsnorms(graph: Graph) -> list[Match]:
    out = []
    for node in graph:
        if node.op == "rms_norm":
            _x, *_rest = node.inputs
            out.append(
                Match(
                    "rmsnorm",
                    [node.id],
                    op_bytes(graph, node),
                    op_bytes(graph, node),
                    summary="RMSNorm as one op (already one kernel in eager)",
                    output=node.id,
                )
            )
            continue
        if node.op != "rsqrt":
            continue
        m = _decomposed_rmsnorm(graph, node)
        if m:
            out.append(m)
    return out


def _decomposed_rmsnorm(graph: Graph, rsqrt: Node) -> Match | None:
    add = graph[_through_free(graph, rsqrt.inputs[0])]
    if add.op != "add" or len(add.inputs) != 1:
        return None
    mean = graph[_through_free(graph, add.inputs[0])]
    if mean.op != "mean" or not mean.params.get("keepdim"):
        return None
    square = graph[_through_free(graph, mean.inputs[0])]
    if (square.op == "pow" and _scalar_arg(square) == 2) or (
        square.op == "mul" and len(set(_tensor_args(graph, square))) == 1 and len(square.refs) == 2
    ):
        x = _through_free(graph, square.inputs[0])
    else:
        return None
    scale = None
    for u in _consumers(graph, rsqrt.id):
        if graph[u].op == "mul" and x in _tensor_args(graph, graph[u]):
            scale = graph[u]
            break
    if scale is None:
        return None
    nodes = [square.id, mean.id, add.id, rsqrt.id, scale.id]
    tail = scale
    weight = None
    for _ in range(2):  # optional cast back (`type_as`), then `* weight`
        nxt = [graph[u] for u in _consumers(graph, tail.id)]
        if len(nxt) != 1:
            break
        n = nxt[0]
        if n.op == "cast":
            nodes.append(n.id)
            tail = n
        elif n.op == "mul" and len(n.inputs) == 2:
            other = [i for i in _tensor_args(graph, n) if i != tail.id]
            if other and graph[other[0]].op in ("param", "buffer"):
                weight = other[0]
                nodes.append(n.id)
                tail = n
            break
        else:
            break
    # the leading upcast of x (x.float()) belongs to the norm when only the norm reads it
    xnode = graph[x]
    if xnode.op == "cast" and all(u in nodes or graph[u].cls.free for u in _consumers(graph, x)):
        nodes.insert(0, x)
        x = _through_free(graph, xnode.inputs[0])
    before = _bytes(graph, nodes)
    after = _io_bytes(graph, [x] + ([weight] if weight is not None else []), [tail.id])
    return Match(
        "rmsnorm",
        sorted(nodes),
        before,
        after,
        output=tail.id,
        summary=f"RMSNorm spelled out as {len(nodes)} ops ({' → '.join(graph[i].op for i in sorted(nodes))})",
    )


def _layernorms(graph: Graph) -> list[Match]:
    return [
        Match(
            "layernorm",
            [n.id],
            op_bytes(graph, n),
            op_bytes(graph, n),
            output=n.id,
            summary="LayerNorm as one op (already one kernel in eager)",
        )
        for n in graph
        if n.op == "layer_norm"
    ]


# ---- SwiGLU --------------------------------------------------------------------------------


def _swiglu(graph: Graph) -> list[Match]:
    out = []
    for node in graph:
        if node.op != "mul" or len(node.refs) != 2:
            continue
        a, b = _tensor_args(graph, node)
        for gate_act, up in ((a, b), (b, a)):
            act = graph[gate_act]
            if act.op == "silu" and graph[up].op in GEMMS:
                gate = _through_free(graph, act.inputs[0])
                if graph[gate].op not in GEMMS:
                    continue
                before = _bytes(graph, [act.id, node.id])
                after = _io_bytes(graph, [gate, up], [node.id])
                g = graph[gate].meta
                dims = {"tokens": g.numel // g.shape[-1], "hidden": g.shape[-1], "dtype": g.dtype} if g else {}
                out.append(
                    Match(
                        "swiglu",
                        [act.id, node.id],
                        before,
                        after,
                        dims,
                        output=node.id,
                        summary="SwiGLU: silu(gate) * up; a GEMM epilogue could also skip writing gate/up",
                    )
                )
                break
    return out


# ---- GELU forms: tanh-approximate (gelu_new), quick GELU; GeGLU ---------------------------------

# An activation spelled out is recognised by its values: the pointwise ops between one tensor and a
# result, with constants only, are evaluated at these points and compared with the function.
_SAMPLES = (-2.5, -1.3, -0.4, 0.7, 1.9)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _gelu_tanh_of(x: float) -> float:
    return 0.5 * x * (1.0 + math.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))


def _quick_gelu_of(x: float) -> float:
    return x * _sigmoid(1.702 * x)


_EVAL_UNARY = {
    "neg": lambda a: -a,
    "abs": abs,
    "tanh": math.tanh,
    "sigmoid": _sigmoid,
    "exp": math.exp,
    "erf": math.erf,
    "sqrt": math.sqrt,
    "rsqrt": lambda a: 1.0 / math.sqrt(a),
    "reciprocal": lambda a: 1.0 / a,
    "square": lambda a: a * a,
}
_EVAL_BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "pow": lambda a, b: a**b,
}
_MAX_SPELLED_OPS = 16


def _evaluable(node: Node) -> bool:
    """A float op of one variable whose value the pattern finder can compute."""
    if node.meta is None or not node.meta.dtype.startswith(("float", "bfloat")):
        return False
    if node.cls is OpClass.IDENTITY:
        return True
    if node.op == "cast":
        return True  # between float types: the value, rounded
    if node.op in _EVAL_UNARY:
        return not node.inplace
    if node.op in _EVAL_BINARY:
        extra = {k for k in node.params if k != "alpha"}
        return not node.inplace and not extra and len(node.args) == 2
    return False


def _expression(graph: Graph, root: int) -> tuple[list[int], int] | None:
    """(the ops, the one tensor) when `root` is computed from a single tensor and constants by
    evaluable ops, none of whose intermediate values is used outside them."""
    ops: set[int] = set()
    leaves: set[int] = set()
    stack = [root]
    while stack:
        i = stack.pop()
        if i in ops or i in leaves:
            continue
        node = graph[i]
        if not _evaluable(node):
            leaves.add(i)
            continue
        ops.add(i)
        if len(ops) > _MAX_SPELLED_OPS:
            return None
        stack += [r.node for r in node.refs]
    if len(leaves) != 1 or root in leaves:
        return None
    if any(u not in ops for i in ops if i != root for u in graph.users(i)):
        return None
    return sorted(i for i in ops if graph[i].cls.absorbable), leaves.pop()


def _evaluate(graph: Graph, root: int, leaf: int, x: float) -> float | None:
    values: dict[int, float] = {leaf: x}

    def value(i: int) -> float:
        if i in values:
            return values[i]
        node = graph[i]
        args = [value(a.node) if isinstance(a, Ref) else a for a in node.args]
        if not all(isinstance(a, (int, float)) for a in args):
            raise ValueError(node.op)
        if node.cls is OpClass.IDENTITY or node.op == "cast":
            out = float(args[0])
        elif node.op in _EVAL_UNARY:
            out = float(_EVAL_UNARY[node.op](args[0]))
        else:
            a, b = args
            if node.op in ("add", "sub") and node.params.get("alpha", 1) != 1:
                b = b * node.params["alpha"]
            out = _EVAL_BINARY[node.op](a, b)
            if isinstance(out, complex):
                raise ValueError(node.op)
        values[i] = float(out)
        return values[i]

    try:
        return value(root)
    except (ValueError, ZeroDivisionError, OverflowError, TypeError):
        return None


def _computes(graph: Graph, root: int, leaf: int, reference) -> bool:
    for x in _SAMPLES:
        got = _evaluate(graph, root, leaf, x)
        want = reference(x)
        if got is None or abs(got - want) > 1e-9 + 1e-6 * abs(want):
            return False
    return True


def _spelled_activation(graph: Graph, anchor: Node, reference) -> tuple[list[int], int, int] | None:
    """The first value a few ops past `anchor` (the function's tanh or sigmoid) that is `reference`
    of one tensor, computed from it by constants and evaluable ops: (the ops, the tensor, the value)."""
    current = anchor
    for _ in range(4):
        users = graph.users(current.id)
        if len(users) != 1 or not _evaluable(graph[users[0]]):
            return None
        current = graph[users[0]]
        found = _expression(graph, current.id)
        if found and anchor.id in found[0] and _computes(graph, current.id, found[1], reference):
            return found[0], found[1], current.id
    return None


def _activation_match(graph: Graph, name: str, nodes: list[int], x: int, output: int, what: str) -> Match:
    meta = graph[x].meta
    dims = {"shape": list(meta.shape), "dtype": meta.dtype} if meta else {}
    if len(nodes) == 1:
        summary = f"{what} as one op (already one kernel in eager)"
    else:
        summary = f"{what} spelled out as {len(nodes)} ops ({' → '.join(graph[i].op for i in nodes)})"
    return Match(
        name,
        nodes,
        _bytes(graph, nodes),
        _io_bytes(graph, [x], [output]),
        dims,
        output=output,
        source=x,
        summary=summary,
    )


def _gelu_tanh(graph: Graph) -> list[Match]:
    out = []
    for node in graph:
        if node.op == "gelu" and node.params.get("approximate") == "tanh" and node.inputs:
            out.append(
                _activation_match(graph, "gelu-tanh", [node.id], node.inputs[0], node.id, "tanh-approximate GELU")
            )
        elif node.op == "tanh" and node.inputs:
            found = _spelled_activation(graph, node, _gelu_tanh_of)
            if found:
                ops, x, y = found
                out.append(_activation_match(graph, "gelu-tanh", ops, x, y, "tanh-approximate GELU (gelu_new)"))
    return out


def _quick_gelu(graph: Graph) -> list[Match]:
    out = []
    for node in graph:
        if node.op != "sigmoid" or not node.inputs:
            continue
        found = _spelled_activation(graph, node, _quick_gelu_of)
        if found:
            ops, x, y = found
            out.append(_activation_match(graph, "quick-gelu", ops, x, y, "quick GELU (x * sigmoid(1.702 * x))"))
    return out


def _geglu(graph: Graph, activations: list[Match]) -> list[Match]:
    """gelu(gate) * up with gate and up made by GEMMs (two projections, or the halves of one):
    the GELU as one op (exact or tanh) or one of the spelled-out forms found above."""
    acts: dict[int, tuple[str, list[int], int]] = {}  # output -> (which GELU, its ops, its input)
    for node in graph:
        if node.op == "gelu" and node.inputs:
            kind = "gelu-tanh" if node.params.get("approximate") == "tanh" else "gelu"
            acts[node.id] = (kind, [node.id], node.inputs[0])
    for m in activations:
        if m.source is not None:
            acts.setdefault(m.output, (m.name, list(m.nodes), m.source))
    written = {"gelu": "gelu", "gelu-tanh": "gelu_tanh", "quick-gelu": "quick_gelu"}
    out = []
    for node in graph:
        if node.op != "mul" or len(node.refs) != 2 or node.meta is None:
            continue
        a, b = _tensor_args(graph, node)
        for act_out, up in ((a, b), (b, a)):
            if act_out not in acts:
                continue
            kind, act_nodes, x = acts[act_out]
            gate = _through_free(graph, x)
            if graph[gate].op not in GEMMS or graph[up].op not in GEMMS:
                continue
            nodes = sorted({*act_nodes, node.id})
            meta = node.meta
            out.append(
                Match(
                    "geglu",
                    nodes,
                    _bytes(graph, nodes),
                    _io_bytes(graph, [gate, up], [node.id]),
                    {
                        "tokens": meta.numel // meta.shape[-1] if meta.shape else 1,
                        "hidden": meta.shape[-1] if meta.shape else 1,
                        "activation": kind,
                        "dtype": meta.dtype,
                    },
                    output=node.id,
                    summary=f"GeGLU: {written[kind]}(gate) * up; a GEMM epilogue could also skip writing gate/up",
                )
            )
            break
    return out


# ---- RoPE ----------------------------------------------------------------------------------


def _rope(graph: Graph) -> list[Match]:
    out = []
    for node in graph:
        if node.op != "add" or len(node.refs) != 2:
            continue
        terms = [graph[i] for i in _tensor_args(graph, node)]
        if not all(t.op == "mul" and len(t.refs) == 2 for t in terms):
            continue
        rotated = None
        for t in terms:
            for i in _tensor_args(graph, t):
                if graph[i].op == "cat" and _is_rotate_half(graph, graph[i]):
                    rotated = (t, graph[i])
        if rotated is None:
            continue
        mul_rot, cat = rotated
        other = terms[0] if terms[1] is mul_rot else terms[1]
        x = _rotated_source(graph, cat)
        if x is None or x not in _tensor_args(graph, other):
            continue
        neg = [
            graph[_through_free(graph, r.node)] for r in cat.args[0] if graph[_through_free(graph, r.node)].op == "neg"
        ]
        nodes = sorted({other.id, mul_rot.id, cat.id, node.id} | {n.id for n in neg})
        cos = [i for i in _tensor_args(graph, other) if i != x]
        sin = [i for i in _tensor_args(graph, mul_rot) if i != cat.id]
        before = _bytes(graph, nodes)
        after = _io_bytes(graph, [x, *cos, *sin], [node.id])
        meta = graph[x].meta
        dims = {"shape": list(meta.shape), "dtype": meta.dtype} if meta else {}
        out.append(
            Match(
                "rope",
                nodes,
                before,
                after,
                dims,
                output=node.id,
                summary="rotary embedding: x * cos + rotate_half(x) * sin",
            )
        )
    return out


def _is_rotate_half(graph: Graph, cat: Node) -> bool:
    pieces = [graph[r.node] for r in cat.args[0]] if cat.args and isinstance(cat.args[0], list) else []
    return len(pieces) == 2 and any(graph[_through_free(graph, p.id)].op == "neg" for p in pieces)


def _rotated_source(graph: Graph, cat: Node) -> int | None:
    roots = set()
    for r in cat.args[0]:
        node = graph[r.node]
        while node.cls.absorbable and node.op == "neg":
            node = graph[node.inputs[0]]
        roots.add(_through_free(graph, node.id))
    return roots.pop() if len(roots) == 1 else None


# ---- attention -----------------------------------------------------------------------------


def _attention(graph: Graph) -> list[Match]:
    out = []
    for parts, nodes, before, after in find_attention(graph):
        out.append(
            Match(
                "attention",
                nodes,
                before,
                after,
                _attention_dims(graph, parts),
                output=parts.pv,
                parts=parts,
                summary=_attention_summary(graph, parts),
            )
        )
    return out


def _attention_dims(graph: Graph, parts: Attention) -> dict:
    scores = graph[parts.qk].meta
    q = graph[parts.qk].refs[0].node
    q_meta = graph[q].meta
    v_meta = graph[parts.v].meta
    if scores is None or q_meta is None or v_meta is None:
        return {}
    dims: dict[str, Any] = {
        "scores": list(scores.shape),
        "head_dim": q_meta.shape[-1],
        "value_dim": v_meta.shape[-1],
        "dtype": q_meta.dtype,
        "scores_dtype": _dtype(graph[parts.softmax]) or scores.dtype,
        "mask": "boolean" if parts.fills else "additive" if parts.additive else "none",
    }
    if parts.dropout is not None:
        dims["dropout"] = True
    return dims


def _dtype(node: Node) -> str:
    return node.meta.dtype if node.meta is not None else ""


def _attention_summary(graph: Graph, parts: Attention) -> str:
    """`softmax(q·kᵀ·scale + mask) · v` as written, over the score matrix's shape."""
    scores = graph[parts.qk].meta
    steps = ["q·kᵀ"]
    if parts.scales or parts.q_scale is not None:
        steps.append("scale")
    if parts.score_mods:
        steps.append(" → ".join(graph[i].op for i in parts.score_mods))
    if parts.additive:
        steps.append("+ mask")
    if parts.fills:
        steps.append("masked_fill")
    softmax = _dtype(graph[parts.softmax])
    steps.append(f"softmax in {softmax}" if softmax and softmax != _dtype(graph[parts.pv]) else "softmax")
    if parts.dropout is not None:
        steps.append("dropout")
    steps.append("· v")
    shape = "×".join(map(str, scores.shape)) if scores is not None else "?"
    return f"attention written out ({', '.join(steps)}): the {shape} scores go through DRAM at every step"


# ---- softmax -------------------------------------------------------------------------------


def _softmax(graph: Graph) -> list[Match]:
    out = []
    for node in graph:
        if node.op not in ("softmax", "log_softmax", "cross_entropy"):
            continue
        nodes = [node.id]
        kinds = []
        current = graph[_through_free(graph, node.inputs[0])]
        while current.cls.absorbable and len(_consumers(graph, current.id)) == 1:
            if current.op in ("mul", "div") and len(current.refs) == 1:
                kinds.append("scaled")
            elif current.op in ("add", "masked_fill", "where"):
                kinds.append("masked")
            elif current.op != "cast":
                break
            nodes.insert(0, current.id)
            current = graph[_through_free(graph, current.inputs[0])]
        tail = node.id
        for u in _consumers(graph, node.id) if node.op != "cross_entropy" else []:
            if graph[u].op == "cast" and len(_consumers(graph, node.id)) == 1:
                nodes.append(u)
                tail = u
        pick = _target_pick(graph, node) if node.op == "log_softmax" else []
        nodes += pick
        tail = pick[-1] if pick else tail
        reads = [i for n in nodes for i in _tensor_args(graph, graph[n]) if i not in nodes]
        before = _bytes(graph, nodes)
        after = _io_bytes(graph, reads, [tail])
        label = " and ".join(sorted(set(kinds))) or "plain"
        summary = f"{label} {node.op} over {_which_dim(graph, node)}"
        if pick or node.op == "cross_entropy":
            summary = "cross-entropy: log-softmax and each row's target picked; no log-probabilities written"
        out.append(
            Match(
                "cross-entropy" if pick or node.op == "cross_entropy" else "softmax",
                nodes,
                before,
                after,
                {"variant": label},
                output=tail,
                summary=summary,
            )
        )
    return out


def _which_dim(graph: Graph, node: Node) -> str:
    """ "the last dim", or which one a softmax normalises over (`softmax(x, dim=1)` of NCHW: the channels)."""
    dims = node.params.get("dims", [])
    x = graph[node.inputs[0]].meta if node.inputs else None
    if x is None or len(dims) != 1 or dims[0] == len(x.shape) - 1:
        return "the last dim"
    return f"dim {dims[0]} of {len(x.shape)}"


def _target_pick(graph: Graph, log_softmax: Node) -> list[int]:
    """The gather of one element per row that is the log-softmax's only reader, and the negation
    after it: with the log-softmax, a cross-entropy loss per row."""
    readers = _consumers(graph, log_softmax.id)
    if len(readers) != 1 or graph[readers[0]].op != "gather":
        return []
    pick = [readers[0]]
    after = _consumers(graph, pick[0])
    if len(after) == 1 and graph[after[0]].op == "neg":
        pick.append(after[0])
    return pick


# ---- a projection onto a vocabulary and its cross-entropy ---------------------------------------


def _linear_cross_entropy(graph: Graph, found: LinearLoss) -> Match:
    """The logits are written, upcast, read by the loss (and, in training, their gradient written and
    read back); a fused loss reads the input, the weight and the targets and writes the loss."""
    reads = [found.hidden, found.weight, found.target] + ([found.bias] if found.bias is not None else [])
    memory = activation_memory(
        found.tokens, found.vocabulary, found.features, found.dtype, found.loss_dtype, found.bias is not None
    )
    upcast = ", upcast to float32" if found.upcast is not None else ""
    return Match(
        "linear-cross-entropy",
        found.chain,
        _bytes(graph, found.chain),
        _io_bytes(graph, reads, [found.loss]),
        {"tokens": found.tokens, "vocabulary": found.vocabulary, "hidden": found.features, "dtype": found.dtype},
        output=found.loss,
        memory=memory,
        refused=found.refused,
        summary=f"projection onto a {found.vocabulary}-word vocabulary whose logits only the loss reads "
        f"({found.tokens}×{found.vocabulary} {found.dtype}{upcast}); a fused loss never writes them",
    )


# ---- residual + norm, GEMM -> residual -> RMSNorm -> GEMM ------------------------------------


def _norm_input(graph: Graph, m: Match) -> int:
    first = graph[m.nodes[0]]
    return _through_free(graph, first.inputs[0])


def _residual_norm(graph: Graph, norms: list[Match]) -> list[Match]:
    out = []
    for norm in norms:
        add = graph[_norm_input(graph, norm)]
        if add.op != "add" or len(add.refs) != 2:
            continue
        escapes = [u for u in _consumers(graph, add.id) if u not in norm.nodes]
        nodes = sorted([add.id, *norm.nodes])
        before = _bytes(graph, nodes)
        reads = _tensor_args(graph, add) + [
            i for n in norm.nodes for i in _tensor_args(graph, graph[n]) if graph[i].op in ("param", "buffer")
        ]
        writes = [norm.output] + ([add.id] if escapes else [])
        after = _io_bytes(graph, reads, writes)
        out.append(
            Match(
                f"residual-{norm.name}",
                nodes,
                before,
                after,
                output=norm.output,
                summary="residual add feeding a norm" + (" (the sum is also kept)" if escapes else ""),
            )
        )
    return out


def _gemm_block(graph: Graph, norms: list[Match]) -> list[Match]:
    out = []
    for norm in norms:
        if norm.name != "rmsnorm":
            continue
        add = graph[_norm_input(graph, norm)]
        if add.op != "add" or len(add.refs) != 2:
            continue
        args = _tensor_args(graph, add)
        gemm1 = next((graph[a] for a in args if graph[a].op in GEMMS), None)
        if gemm1 is None:
            continue
        residual = next(a for a in args if a != gemm1.id)
        gemm2 = next((graph[u] for u in _consumers(graph, norm.output) if graph[u].op in GEMMS), None)
        if gemm2 is None or gemm1.meta is None or gemm2.meta is None:
            continue
        a1, w1 = _gemm_operands(graph, gemm1)
        _a2, w2 = _gemm_operands(graph, gemm2)
        if a1 is None:
            continue
        a_in = graph[_through_free(graph, a1.id)]  # the value it reads, as it is in memory
        n_dim = gemm1.meta.shape[-1]
        m_dim = gemm1.meta.numel // n_dim
        k0 = _contraction(gemm1, a1, w1)
        k1 = gemm2.meta.shape[-1]
        dtype = gemm1.meta.dtype
        size = DTYPE_BYTES.get(dtype, 4)
        nodes = sorted({gemm1.id, add.id, gemm2.id, *norm.nodes})
        before = _bytes(graph, nodes)
        escapes = [u for u in _consumers(graph, add.id) if u not in nodes]
        reads = [a_in.id, residual] + [w.id for w in (w1, w2) if w is not None]
        reads += [i for n in norm.nodes for i in _tensor_args(graph, graph[n]) if graph[i].op in ("param", "buffer")]
        writes = [gemm2.id] + ([add.id] if escapes else [])
        after = _io_bytes(graph, reads, writes)
        k0_text = k0 if k0 is not None else "K0"
        out.append(
            Match(
                "gemm-residual-rmsnorm-gemm",
                nodes,
                before,
                after,
                {"M": m_dim, "N": n_dim, "K0": k0, "K1": k1, "dtype": dtype, "bytes_per_element": size},
                output=gemm2.id,
                summary=f"GEMM [{m_dim}×{k0_text}]·[{k0_text}×{n_dim}] → + residual → RMSNorm → GEMM [{n_dim}×{k1}]; "
                "one kernel keeps each N-wide row on chip between the GEMMs",
            )
        )
    return out


def _gemm_operands(graph: Graph, gemm: Node) -> tuple[Node | None, Node | None]:
    """A GEMM's (activation, weight) operands as the GEMM itself reads them: after any view or
    reshape between them and their producers (`addmm`/`baddbmm` take the bias first)."""
    operands = [graph[r.node] for r in gemm.refs]
    if gemm.op in ("addmm", "baddbmm"):
        operands = operands[1:]
    a = operands[0] if operands else None
    b = operands[1] if len(operands) > 1 else None
    return a, b


def _contraction(gemm: Node, a: Node, b: Node | None) -> int | None:
    """The size a GEMM contracts over (K), from the operands it reads: `linear` reads a [.., K]
    input and an [N, K] weight, `matmul` and friends an [.., K] left operand.  None for `einsum`,
    whose contraction is in its equation."""
    if gemm.op == "linear" and b is not None and b.meta is not None and b.meta.shape:
        return b.meta.shape[-1]
    if gemm.op == "einsum" or a.meta is None or not a.meta.shape:
        return None
    return a.meta.shape[-1]
