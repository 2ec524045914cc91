"""GEMMs that can start a cluster: which calls they are, and how each reads its operands.

A GEMM's result is written to memory and read back by the elementwise ops after it (`gelu` after
`fc1(x)`, `x + gamma * ...` after `fc2(h)`).  A kernel that computes the product tile by tile can
apply those ops to each tile before storing it, as its epilogue, and the result never makes the
round trip.  Every form here computes, for each batch `b` and position (m, n) of its result,

    out[b, m, n] = sum_k A[b, m, k] * B[b, k, n]   (+ bias, broadcast over the result)

and says which dims of the result are the batch, the rows (M) and the columns (N):

- `linear(x, w, b)`: x [..., K] by w [N, K] read transposed, b [N]; the rows are x's leading dims;
- `matmul(x, w)` / `mm` with a 2-D right operand [K, N] (a transposed weight `w.t()` is a view it
  reads through its strides): as `linear`, no bias; `matmul` of two 3-D operands and `bmm`: batched;
- `addmm(b, x, w)` (beta = alpha = 1): `mm` plus b, broadcast over [M, N];
- a 1x1 `conv2d` (stride 1, no padding or dilation, one group) of x [N, Cin, H, W] by w
  [Cout, Cin, 1, 1]: per image, w [Cout, Cin] by x [Cin, H * W]; the batch is N, the rows the output
  channels, the columns the pixels (its bias is an add of its own after it: `capture`).

Plain data, no torch: the detector and the kernel planner both ask.
"""

from __future__ import annotations

from dataclasses import dataclass

from .graph import Graph, Node, Ref

# The dtypes a GEMM kernel here multiplies (tensor cores take them; float32 as TF32 or IEEE as torch's
# setting asks).
GEMM_DTYPES = frozenset({"float32", "float16", "bfloat16"})


@dataclass(frozen=True)
class GemmForm:
    """How one GEMM call reads its operands (node ids) and lays out its result's dims."""

    node: int
    op: str  # linear | matmul | mm | addmm | bmm | conv2d
    a: int  # the rows' operand: x (a 1x1 convolution's weight)
    b: int  # the columns' operand: the weight (read transposed by `linear`; a 1x1 convolution's input)
    bias: int | None  # linear's [N] or addmm's broadcast operand
    batch: tuple[int, ...]  # the result's dims that are the batch (one GEMM each)
    rows: tuple[int, ...]  # the result's dims that make up M
    cols: tuple[int, ...]  # the result's dims that make up N

    @property
    def transposed_b(self) -> bool:
        """Whether B is the weight as stored, [N, K], read transposed (`linear`)."""
        return self.op == "linear"

    @property
    def image(self) -> bool:
        """A 1x1 convolution: A is its weight, B the image's pixels."""
        return self.op == "conv2d"


def gemm_form(graph: Graph, node: Node) -> GemmForm | None:
    """The GEMM `node` computes, when it is one a kernel here computes with its epilogue; else None."""
    if node.meta is None or node.inplace or node.meta.dtype not in GEMM_DTYPES:
        return None
    refs = [a for a in node.args if isinstance(a, Ref)]
    metas = [graph[r.node].meta for r in refs]
    if any(m is None or m.dtype != node.meta.dtype for m in metas):
        return None
    shapes = [m.shape for m in metas if m is not None]
    rank = len(node.meta.shape)
    if node.op == "linear" and len(refs) in (2, 3) and node.args[: len(refs)] == refs:
        x, w = shapes[0], shapes[1]
        bias = refs[2].node if len(refs) == 3 else None
        if len(w) != 2 or len(x) < 2 or (bias is not None and shapes[2] != (w[0],)):
            return None
        return GemmForm(node.id, "linear", refs[0].node, refs[1].node, bias, (), tuple(range(rank - 1)), (rank - 1,))
    if node.op in ("matmul", "mm", "bmm") and len(refs) == 2 and len(node.args) == 2:
        return _product(node, refs, shapes, rank)
    if node.op == "addmm" and len(refs) == 3 and len(node.args) == 3 and not _scaled(node):
        if len(shapes[1]) != 2 or len(shapes[2]) != 2 or len(shapes[0]) > 2:
            return None
        return GemmForm(node.id, "addmm", refs[1].node, refs[2].node, refs[0].node, (), (0,), (1,))
    if node.op == "conv2d" and len(refs) == 2 and _pointwise_convolution(node, shapes):
        return GemmForm(node.id, "conv2d", refs[1].node, refs[0].node, None, (0,), (1,), (2, 3))
    return None


def _product(node: Node, refs: list[Ref], shapes: list[tuple[int, ...]], rank: int) -> GemmForm | None:
    """`x @ w` with w [K, N] (x of any rank from 2), or a batch of products of two 3-D operands."""
    x, w = shapes
    if len(w) == 2 and len(x) >= 2 and node.op != "bmm":
        return GemmForm(node.id, node.op, refs[0].node, refs[1].node, None, (), tuple(range(rank - 1)), (rank - 1,))
    if len(x) == 3 and len(w) == 3 and x[0] == w[0] and node.op != "mm":
        return GemmForm(node.id, node.op, refs[0].node, refs[1].node, None, (0,), (1,), (2,))
    return None


def _scaled(node: Node) -> bool:
    """An addmm with beta or alpha other than 1."""
    kwargs = node.replay[2] if node.replay is not None else {}
    return any(kwargs.get(k, 1) != 1 for k in ("beta", "alpha"))


def _pointwise_convolution(node: Node, shapes: list[tuple[int, ...]]) -> bool:
    """A 2-D convolution by a 1x1 kernel that is a GEMM per image: stride 1, no padding, no dilation,
    one group, no bias in the call (capture records a bias as an add after it)."""
    x, w = shapes
    if len(x) != 4 or len(w) != 4 or w[2:] != (1, 1) or node.replay is None:
        return False
    _, args, kwargs, _ = node.replay
    names = ["input", "weight", "bias", "stride", "padding", "dilation", "groups"]
    bound = dict(zip(names, args, strict=False)) | dict(kwargs)
    ones = (1, (1, 1), [1, 1])
    return (
        bound.get("bias") is None
        and bound.get("stride", 1) in ones
        and bound.get("padding", 0) in (0, (0, 0), [0, 0], "valid", "same")
        and bound.get("dilation", 1) in ones
        and bound.get("groups", 1) == 1
    )


def gemm_forms(graph: Graph, members: set[int] | frozenset[int]) -> list[GemmForm]:
    """The GEMMs among `members` that a kernel computes with an epilogue."""
    found = [gemm_form(graph, graph[m]) for m in sorted(members) if graph[m].op in GEMM_OPS]
    return [f for f in found if f is not None]


GEMM_OPS = frozenset({"linear", "matmul", "mm", "addmm", "bmm", "conv2d"})


def flops(graph: Graph, form: GemmForm) -> int:
    """The multiply-adds' floating-point operations: 2 * batch * M * N * K."""
    out = graph[form.node].meta
    a = graph[form.a].meta
    if out is None or a is None:
        return 0
    k = a.shape[1] if form.image else a.shape[-1]
    numel = 1
    for d in out.shape:
        numel *= d
    return 2 * numel * k
