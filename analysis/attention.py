"""Hand-written attention on the captured graph: softmax(q @ kᵀ · scale + mask) @ v, as one pattern.

Eager runs each step as a kernel of its own, and every one writes or reads the B×H×L×S score matrix:
the scores, the scaled scores, the masked ones, an fp32 copy, the probabilities, a copy back to the
model's dtype, the dropped-out ones, read again by the product with v.  A fused attention
(`F.scaled_dot_product_attention`) reads q, k, v and the mask once and writes the output, keeping the
scores on chip.  The pattern is found from its two matmuls inward:

- the product with v, whose other operand is the probabilities: after the softmax (over the last dim)
  come only casts (`.type_as(q)`, `.to(q.dtype)`) and a dropout (recorded in training);
- before the softmax, from the scores' matmul (`q @ k.transpose(-2, -1)`, or a k already transposed):
  a scale (a multiply or divide by a number, on the scores or on q before), masks (an additive one,
  `scores + mask`, or a boolean one, `masked_fill(mask, -inf)`), casts (`.float()`, the softmax's
  `dtype=torch.float32`), and elementwise functions of the score alone (soft-capping with tanh), which
  only FlexAttention's `score_mod` computes;
- grouped key/value heads repeated for the query's (`repeat_interleave` over the heads, or `expand` of
  a new dim then `reshape`) are the repeat a fused call with `enable_gqa` does not need.

Every value between the two matmuls must be read by the next step alone: one also read elsewhere
(returned, kept by another op) cannot stay on chip, and the pattern says so (`Attention.refusal`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from .cost import op_bytes, value_bytes
from .graph import Graph, Node, Ref

# The ops between softmax and the product with v, and between the scores and the softmax, that only cast.
_CASTS = frozenset({"cast", "to_same"})
# Elementwise functions of the score alone that a `score_mod` computes (with numbers as their other operands).
SCORE_FUNCTIONS = frozenset({"tanh", "mul", "div", "add", "sub", "clamp", "neg", "sigmoid", "exp", "log", "abs"})
_MATMULS = frozenset({"matmul", "bmm"})


@dataclass
class Attention:
    """The parts of one hand-written attention: node ids of the graph it was found in."""

    qk: int  # the scores' matmul: q @ kᵀ
    pv: int  # the product of the probabilities and v
    q: int  # the value the scores' matmul reads as q (before a scale on it)
    k_t: int  # the value it reads as kᵀ
    v: int  # the value the product reads as v
    softmax: int
    chain: list[int]  # the ops from the scores to the probabilities, in order (scale, masks, casts, ...)
    q_scale: int | None = None  # a multiply or divide of q by a number, read by the scores' matmul alone
    scales: list[int] = field(default_factory=list)  # multiplies and divides of the scores by a number
    additive: list[int] = field(default_factory=list)  # `scores + mask`
    fills: list[int] = field(default_factory=list)  # `scores.masked_fill(mask, value)`
    score_mods: list[int] = field(default_factory=list)  # other functions of the score alone (soft-capping)
    dropout: int | None = None  # the dropout on the probabilities, where the trace recorded one (training)
    repeats: dict[str, list[int]] = field(default_factory=dict)  # "k"/"v" -> the ops repeating its heads
    refusal: tuple[str, str] | None = None  # (code, why) where no fused call can compute it as written
    # The call its rewrite writes, where it has one: how it passes the mask ("causal", "boolean",
    # "additive", "none") and whether it is FlexAttention's (a function of the score).
    written_mask: str = ""
    written_flex: bool = False


def find_attention(graph: Graph) -> list[tuple[Attention, list[int], int, int]]:
    """Each hand-written attention of `graph`: its parts, its ops (sorted), eager's bytes and a fused
    attention's."""
    found = []
    for node in graph:
        parts = _attention_at(graph, node)
        if parts is None:
            continue
        ops = sorted({parts.qk, parts.pv, *parts.chain, *([parts.q_scale] if parts.q_scale is not None else [])})
        before = sum(op_bytes(graph, graph[i]) for i in ops)
        repeated = [i for ids in parts.repeats.values() for i in ids]
        before += sum(op_bytes(graph, graph[i]) for i in repeated)
        found.append((parts, sorted({*ops, *repeated}), before, _fused_bytes(graph, parts)))
    return found


def _attention_at(graph: Graph, pv: Node) -> Attention | None:
    """The attention whose product with v is `pv`, or None when `pv` is not one."""
    if pv.op not in _MATMULS or len(pv.refs) != 2 or pv.meta is None or len(pv.meta.shape) < 2:
        return None
    probs, v = (r.node for r in pv.refs)
    after: list[int] = []  # between the softmax and the product, in order
    current = graph[_through(graph, probs, after)]
    dropout = None
    if current.op == "dropout":
        dropout = current.id
        after.insert(0, current.id)
        current = graph[_through(graph, current.inputs[0], after)]
    if current.op != "softmax" or not _over_last_dim(graph, current):
        return None
    softmax = current
    before: list[int] = []  # between the scores' matmul and the softmax, in order
    current = graph[_through(graph, softmax.inputs[0], before)]
    while current.op not in _MATMULS:
        step = _score_step(graph, current)
        if step is None:
            return None
        before.insert(0, current.id)
        current = graph[_through(graph, step, before)]
    qk = current
    if len(qk.refs) != 2 or qk.meta is None or not _scores_shape(graph, qk, pv):
        return None
    q, k_t = (r.node for r in qk.refs)
    parts = Attention(qk.id, pv.id, q, k_t, v, softmax.id, [*before, softmax.id, *after], dropout=dropout)
    _classify(graph, parts, before)
    _q_scale(graph, parts)
    parts.repeats = {"k": _head_repeat(graph, k_t), "v": _head_repeat(graph, v)}
    parts.refusal = parts.refusal or _escapes(graph, parts)
    return parts


def _through(graph: Graph, node_id: int, passed: list[int]) -> int:
    """Back from a value through casts and views (each cast, which moves data, noted in `passed`)."""
    node = graph[node_id]
    while (node.cls.free or node.op in _CASTS) and node.inputs:
        if not node.cls.free or node.op in _CASTS:
            passed.insert(0, node.id)
        node = graph[node.inputs[0]]
    return node.id


def _over_last_dim(graph: Graph, softmax: Node) -> bool:
    x = graph[softmax.inputs[0]].meta if softmax.inputs else None
    return x is not None and softmax.params.get("dims") == [len(x.shape) - 1]


def _score_step(graph: Graph, node: Node) -> int | None:
    """The score a step between the scores' matmul and the softmax reads (the chain goes back through
    it), or None where the node is none of the steps an attention takes: an elementwise op of the score
    and numbers, an add of a mask, a masked fill."""
    if not node.cls.absorbable or (node.inplace and node.op not in ("masked_fill", "add")):
        return None
    refs = [r.node for r in node.refs]
    if node.op == "masked_fill" and len(refs) == 2:
        return refs[0]
    if node.op == "add" and len(refs) == 2 and not node.params:
        # `scores + mask` or `mask + scores`: the score is the operand a matmul is behind.
        for score, mask in ((refs[0], refs[1]), (refs[1], refs[0])):
            if _reaches_a_matmul(graph, score) and not _reaches_a_matmul(graph, mask):
                return score
        return None
    if node.op in SCORE_FUNCTIONS and len(refs) == 1:
        return refs[0]
    return None


def _reaches_a_matmul(graph: Graph, node_id: int, budget: int = 64) -> bool:
    """Whether a matmul is among the ops a value is computed from (a short walk back)."""
    stack, seen = [node_id], set()
    while stack and budget > 0:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        budget -= 1
        if graph[i].op in _MATMULS:
            return True
        stack += graph[i].inputs
    return False


def _scores_shape(graph: Graph, qk: Node, pv: Node) -> bool:
    """q [..., L, E] @ kᵀ [..., E, S] -> [..., L, S], read by probabilities @ v [..., S, Ev]."""
    q, k_t = (graph[r.node].meta for r in qk.refs)
    v = graph[pv.refs[1].node].meta
    if q is None or k_t is None or v is None or qk.meta is None or min(len(q.shape), len(k_t.shape)) < 2:
        return False
    return q.shape[-1] == k_t.shape[-2] and k_t.shape[-1] == v.shape[-2] and qk.meta.shape[-1] == v.shape[-2]


def _classify(graph: Graph, parts: Attention, before: list[int]) -> None:
    """Sort the steps from the scores to the softmax into scales, masks and functions of the score, in
    the order a fused call applies them: the scale first, then the functions, then the masks."""
    stage = 0  # 0: scale, 1: functions of the score, 2: masks
    for i in before:
        node = graph[i]
        if node.op in _CASTS:
            continue
        if node.op == "masked_fill":
            parts.fills.append(i)
            stage = 2
        elif node.op == "add" and len(node.refs) == 2:
            parts.additive.append(i)
            stage = 2
        elif node.op in ("mul", "div") and _scalar(node) is not None and stage == 0:
            parts.scales.append(i)
        elif stage == 2:
            parts.refusal = parts.refusal or (
                "modified",
                f"`{node.op}` at line {node.line} changes the scores after their mask: a fused call "
                "applies a function of the score before the mask",
            )
        else:
            parts.score_mods.append(i)
            stage = 1
    if parts.score_mods and len(parts.scales) > 1:
        # One scale, then a function of the score: `cap * tanh(scores / cap)` after `* scaling` reads as the
        # code does, its divide part of the function (the same numbers, as a fused call applies them).
        parts.score_mods[:0] = parts.scales[1:]
        del parts.scales[1:]
    for i in parts.scales:
        if not isinstance(_scalar(graph[i]), (int, float)):
            parts.refusal = parts.refusal or ("scale", f"the scale at line {graph[i].line} is not a number")
    for i in parts.fills + parts.additive:
        mask = _mask_operand(graph, graph[i])
        if mask is not None and _reaches(graph, mask, parts.qk):
            parts.refusal = parts.refusal or (
                "mask",
                f"the mask at line {graph[i].line} is computed from the scores themselves: a fused call "
                "takes a mask made before them",
            )


def _scalar(node: Node):
    """The number a multiply or divide of one tensor by a number takes (the tensor's first operand)."""
    refs = [a for a in node.args if isinstance(a, Ref)]
    numbers = [a for a in node.args if not isinstance(a, Ref)]
    if len(refs) != 1 or len(numbers) != 1 or node.params:
        return None
    if node.op == "div" and not isinstance(node.args[0], Ref):
        return None  # `2 / scores` is no scale
    return numbers[0]


def _mask_operand(graph: Graph, node: Node) -> int | None:
    refs = [r.node for r in node.refs]
    if node.op == "masked_fill":
        return refs[1] if len(refs) == 2 else None
    return next((r for r in refs if not _reaches_a_matmul(graph, r)), None)


def _reaches(graph: Graph, node_id: int, target: int) -> bool:
    stack, seen = [node_id], set()
    while stack:
        i = stack.pop()
        if i == target:
            return True
        if i in seen or i < target:
            continue
        seen.add(i)
        stack += graph[i].inputs
    return False


def _q_scale(graph: Graph, parts: Attention) -> None:
    """q multiplied or divided by a number just for the scores (`(q * self.scale) @ k.transpose(-2, -1)`)."""
    node = graph[_through(graph, parts.q, [])]
    if node.op in ("mul", "div") and _scalar(node) is not None and isinstance(_scalar(node), (int, float)):
        readers = _readers(graph, node.id)
        if readers == [parts.qk]:
            parts.q_scale = node.id


def _readers(graph: Graph, node_id: int) -> list[int]:
    """The ops that read a value, through views and identities (never a cast: it moves data)."""
    out = []
    for u in graph.users(node_id):
        node = graph[u]
        if node.cls.free and node.op not in _CASTS:
            out += _readers(graph, u)
        else:
            out.append(u)
    return out


def _head_repeat(graph: Graph, node_id: int) -> list[int]:
    """The ops repeating a key's or value's heads for the query's, as `enable_gqa` repeats them:
    `repeat_interleave(n, dim=1)` (over the heads of [B, H, S, D]), or `x[:, :, None].expand(B, H, n, S, D)
    .reshape(B, H * n, S, D)`; [] where there is none."""
    node = graph[node_id]
    while node.op in ("transpose", "permute", "mT") and node.inputs:  # (kᵀ: through its transpose)
        node = graph[node.inputs[0]]
    if any(graph[r].op not in _MATMULS for r in _readers(graph, node.id)):
        return []  # the repeated heads are read elsewhere too: the repeat stays
    if node.op == "repeat_interleave" and node.meta is not None and len(node.meta.shape) == 4:
        source = graph[node.inputs[0]].meta if node.inputs else None
        if node.params.get("dim") in (1, -3) and source is not None and source.shape[1] != node.meta.shape[1]:
            return [node.id]
        return []
    if node.op == "reshape" and node.meta is not None and len(node.meta.shape) == 4 and node.inputs:
        expanded = graph[node.inputs[0]]
        if expanded.op == "expand" and expanded.meta is not None and len(expanded.meta.shape) == 5:
            b, h, n, s, d = expanded.meta.shape
            unsqueezed = graph[expanded.inputs[0]].meta if expanded.inputs else None
            if unsqueezed is not None and unsqueezed.shape[2] == 1 and tuple(node.meta.shape) == (b, h * n, s, d):
                return [node.id]
    return []


def _escapes(graph: Graph, parts: Attention) -> tuple[str, str] | None:
    """Why the scores or probabilities cannot stay on chip: a value between the two matmuls that
    another op reads too (or the forward returns)."""
    inside = set(parts.chain) | {parts.pv}
    for i in [parts.qk, *parts.chain]:
        for reader in _readers(graph, i):
            if reader in inside:
                continue
            node = graph[reader]
            what = "the probabilities" if i >= parts.softmax else "the scores"
            if node.op == "output":
                return "escapes", f"{what} are returned by the forward: a fused call never writes them"
            where = f" at line {node.line}" if node.line else ""
            return "escapes", f"{what} are also read by `{node.op}`{where}: a fused call never writes them"
    return None


def _fused_bytes(graph: Graph, parts: Attention) -> int:
    """What a fused attention moves: q, k and v read once (k and v before a repeat of their heads, which
    it does not need), each mask once, the output written once."""
    reads = {_through(graph, parts.q_scale if parts.q_scale is not None else parts.q, [])}
    if parts.q_scale is not None:
        reads = {next(r.node for r in graph[parts.q_scale].refs)}
    for name, value in (("k", parts.k_t), ("v", parts.v)):
        repeat = parts.repeats.get(name)
        reads.add(_unrepeated(graph, repeat[0]) if repeat else graph.view_root(value))
    for i in parts.fills + parts.additive:
        mask = _mask_operand(graph, graph[i])
        if mask is not None:
            reads.add(mask)
    return sum(value_bytes(graph[i]) for i in reads) + value_bytes(graph[parts.pv])


def _unrepeated(graph: Graph, repeat: int) -> int:
    node = graph[repeat]
    if node.op == "reshape":
        node = graph[graph[node.inputs[0]].inputs[0]]  # through the expand
    return graph.view_root(node.inputs[0])


# ---- causal masks --------------------------------------------------------------------------

_LARGEST_TRIANGLE = 1 << 26  # elements: a larger buffer is no mask worth checking


def triangles(values: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """The buffers of `values` whose last two dims are a square triangle of ones and zeros, the same
    for every leading index: "tril" (ones on and below the diagonal), "triu1" (ones above it)."""
    out = {}
    for name, tensor in values.items():
        if tensor.dim() < 2 or tensor.shape[-1] != tensor.shape[-2] or tensor.numel() > _LARGEST_TRIANGLE:
            continue
        if any(d != 1 for d in tensor.shape[:-2]) or tensor.is_complex():
            continue
        square = tensor.reshape(tensor.shape[-2:])
        if not bool(((square == 0) | (square == 1)).all()):
            continue
        ones = square != 0
        n = square.shape[-1]
        lower = torch.ones(n, n, dtype=torch.bool).tril()
        if torch.equal(ones, lower):
            out[name] = "tril"
        elif torch.equal(ones, ~lower):
            out[name] = "triu1"
    return out


# ---- which fused kernel runs it ---------------------------------------------------------------------

# The compute capability of each device profile's GPU (`cost.DEVICES`): FlashAttention and the
# memory-efficient kernel in torch need sm80 or newer.
_CAPABILITY = {"NVIDIA H200": (9, 0), "NVIDIA H100 SXM": (9, 0), "NVIDIA A100 80GB": (8, 0), "NVIDIA RTX 4090": (8, 9)}


@dataclass(frozen=True)
class Backend:
    name: str  # "flash", "efficient", "math", "flex"
    detail: str  # why that one, in a sentence


def sdpa_backend(dims: dict, mask: str, dropout: bool, flex: bool, device: str) -> Backend:
    """The kernel `F.scaled_dot_product_attention` picks on `device` for the call the rewrite writes, by
    torch's rules: FlashAttention for fp16/bf16 with a head dim of at most 256 (a multiple of 8, the same
    for q and v) and no mask but a causal one; the memory-efficient kernel for any float dtype with an
    aligned head dim, which takes an additive or boolean mask; else the math fallback (which writes the
    scores as eager does).  FlexAttention compiles a Triton kernel of its own."""
    if flex:
        return Backend("flex", "FlexAttention's own Triton kernel, once compiled (torch.compile)")
    capability = _CAPABILITY.get(device)
    if capability is None or capability < (8, 0):
        return Backend("math", f"{device} is not one of the GPUs torch's fused attention kernels run on here")
    dtype, head, value = dims.get("dtype", ""), dims.get("head_dim", 0), dims.get("value_dim", 0)
    half = dtype in ("float16", "bfloat16")
    flash_why = []
    if not half:
        flash_why.append(f"{dtype} (FlashAttention takes float16 or bfloat16)")
    if head != value or head > 256 or head % 8:
        flash_why.append(f"head dim {head} (FlashAttention takes at most 256, a multiple of 8, equal for q and v)")
    if mask in ("boolean", "additive"):
        flash_why.append(
            f"{'an' if mask == 'additive' else 'a'} {mask} mask (FlashAttention takes none but a causal one)"
        )
    if not flash_why:
        how = "causal" if mask == "causal" else "no mask"
        return Backend("flash", f"FlashAttention: {dtype}, head dim {head}, {how}" + (", dropout" if dropout else ""))
    alignment = 8 if half else 4
    if dtype in ("float32", "float16", "bfloat16") and head % alignment == 0 and value % alignment == 0:
        return Backend("efficient", f"the memory-efficient kernel, not FlashAttention: {'; '.join(flash_why)}")
    return Backend(
        "math",
        f"the math fallback, which writes the scores as eager does: {'; '.join(flash_why)}, "
        f"and the memory-efficient kernel needs a head dim that is a multiple of {alignment}",
    )
