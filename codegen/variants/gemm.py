"""The fused GEMM: a tiled product with its epilogue applied to each tile before the store.

Each program computes one (BLOCK_M, BLOCK_N) tile of one batch's product, walking K in BLOCK_K
steps and accumulating in float32 (`tl.dot`), with the row blocks in groups of GROUP_M so that the
tiles running together read the same columns of B from L2.  A and B are read through any strides (a
transposed weight, a transposed activation).  Rows and columns past the edges read the first ones
again and are never stored, so only the K steps are masked, and only where K is not a multiple of
BLOCK_K (EVEN_K).  (The Triton interpreter's `tl.dot` multiplies bfloat16 tiles as their raw bits,
NumPy having no bfloat16, and float32 ones in NumPy's loop without BLAS, a hundred times slower: there,
BY_ELEMENTS, the tiles are widened to float32, multiplied element by element and summed along K, the
same products, a product of two bfloat16 or float16 values being exact in float32, accumulated in
float32 as tensor cores do.)
Then the bias is added and the product rounded to the model's dtype, as the
library's GEMM writes it, and the epilogue's statements (`GemmPlan.epilogue`, the plan the ops after
the GEMM have on their own) run on the tile: every other input is read at the tile's (batch, row,
column) through the strides the launcher collapses its own into (`_gemm_operand`), and each output is
stored through the result's.  Rounding to bfloat16 (the product, and a bfloat16 output before its store)
is to nearest by the value's bits (`_nearest_bfloat16`), which the Triton interpreter does as a GPU does.
"""

from __future__ import annotations

from ..code_buffer import CodeBuffer
from ..gemm_plan import GemmPlan
from ..kernel_args import KernelArgs
from ..kernel_text import closure, stmt_line
from ..lowering import FLOAT
from ..plan import KernelPlan, Stmt
from .base import Context, Launch, Variant

# What each index group of the product is called in the kernel, and the suffix of its strides.
_GROUPS = (("batch", "batch", "sb"), ("rows", "rows", "sm"), ("cols", "cols", "sn"))


class GemmKernel(Variant):
    """The product of a GEMM cluster and its epilogue, in one kernel (`_gemm`)."""

    suffix = strategy = "gemm"

    @staticmethod
    def applies(plan: KernelPlan) -> bool:
        return plan.gemm is not None

    def arguments(self, context: Context) -> KernelArgs:
        return context.record(self.suffix, lambda args: _arguments(context, args), of_plan=False)

    def kernels(self, context: Context) -> str:
        gemm = _gemm(context.plan)
        code = CodeBuffer(self.arguments(context).signature(context.name(self.suffix)))
        with code.indent():
            code.write(*_product())
            code.write(*_epilogue(context, gemm))
        return code.text()

    def launch(self, context: Context, otherwise: Launch) -> Launch:
        """Launch with the tile `run` is given; the launcher runs it with the tile chosen for the shape."""
        call = self.arguments(context).call(
            context.name(self.suffix),
            "grid",
            {
                "BLOCK_M": "block_m",
                "BLOCK_N": "block_n",
                "BLOCK_K": "block_k",
                "GROUP_M": "group_m",
                "EVEN_K": "K % block_k == 0",
                "PRECISION": "precision",
                "BY_ELEMENTS": "_gemm_by_elements()",
                "INDEX_64": "index_64",
            },
            ("num_warps=warps", "num_stages=stages"),
        )
        code = CodeBuffer()
        with code.block("def run(tile):"):
            code.write("block_m, block_n, block_k, group_m, warps, stages = tile")
            code.write("grid = (((M + block_m - 1) // block_m) * ((N + block_n - 1) // block_n), batch)")
            code.write(*call)
            code.write("return " + ", ".join(f"out{k}" for k in range(len(context.plan.outputs))))
        return Launch(body=code.lines())


def _gemm(plan: KernelPlan) -> GemmPlan:
    if plan.gemm is None:
        raise ValueError("not a GEMM cluster's plan")
    return plan.gemm


def epilogue_inputs(plan: KernelPlan) -> list[int]:
    """The cluster's inputs the epilogue reads at each tile, the bias first (as the kernel takes them)."""
    gemm = _gemm(plan)
    bias = list(gemm.operands[2:])
    others = [j for j in gemm.taken if j is not None]
    return bias + [j for j in dict.fromkeys(others) if j not in bias]


def input_groups(plan: KernelPlan, j: int) -> list[str]:
    """The index groups ("batch", "rows", "cols") cluster input `j` varies along, as the epilogue reads it."""
    gemm = _gemm(plan)
    reads = input_reads(plan, j)
    along = {d for d in reads if d >= 0}
    groups = {"batch": gemm.form.batch, "rows": gemm.form.rows, "cols": gemm.form.cols}
    return [name for name, _, _ in _GROUPS if along & set(groups[name])]


def input_reads(plan: KernelPlan, j: int) -> tuple[int, ...]:
    """The result's dim each dim of cluster input `j` runs along (-1: broadcast): a bias's right-aligned."""
    gemm = _gemm(plan)
    slot = plan.inputs[j]
    if gemm.operands[2:] == (j,):
        lead = len(plan.domain) - len(slot.shape)
        return tuple(lead + d if n != 1 else -1 for d, n in enumerate(slot.shape))
    k = gemm.taken.index(j)
    return gemm.reads[k]


def _arguments(context: Context, args: KernelArgs) -> KernelArgs:
    plan = context.plan
    names = context.input_names
    args.add("a_ptr", "a").add("b_ptr", "b")
    for j in epilogue_inputs(plan):
        args.add(f"in{j}_ptr", names[j])
    for k in range(len(plan.outputs)):
        args.add(f"out{k}_ptr", f"out{k}")
    args.add_each(["M", "N", "K"])
    args.unpacked(["a_sb", "a_sm", "a_sk"], "sa").unpacked(["b_sb", "b_sk", "b_sn"], "sb")
    for j in epilogue_inputs(plan):
        read = input_groups(plan, j)
        for position, (group, _, suffix) in enumerate(_GROUPS):
            if group in read:
                args.add(f"in{j}_{suffix}", f"st{j}[{position}]")
    args.unpacked(["o_sb", "o_sm", "o_sn"], "so")
    args.add_each(slot.name for slot in plan.scalars if slot.runtime)
    return args.constexpr("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "EVEN_K", "PRECISION", "BY_ELEMENTS", "INDEX_64")


def _product() -> list[str]:
    """The kernel's program, its tile's rows and columns, and the K loop into `acc`."""
    head = CodeBuffer(
        [
            "pid = tl.program_id(0)",
            "batch = tl.program_id(1)",
            "# Row blocks in groups of GROUP_M, each group's programs along its columns: the tiles that run",
            "# together read the same columns of B (and rows of A) from L2.",
            "blocks_n = (N + BLOCK_N - 1) // BLOCK_N",
            "in_group = GROUP_M * blocks_n",
            "first_m = (pid // in_group) * GROUP_M",
            "size_m = tl.minimum((M + BLOCK_M - 1) // BLOCK_M - first_m, GROUP_M)",
            "pid_m = first_m + (pid % in_group) % size_m",
            "pid_n = (pid % in_group) // size_m",
            "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
            "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        ]
    )
    with head.block("if INDEX_64:"):
        head.write("batch = batch.to(tl.int64)", "rm = rm.to(tl.int64)", "rn = rn.to(tl.int64)")
    head.write(
        "rk = tl.arange(0, BLOCK_K)",
        "# Rows and columns past the edges read the first ones again (never stored): only K is masked.",
        "a_ptrs = a_ptr + batch * a_sb + (rm % M)[:, None] * a_sm + rk[None, :] * a_sk",
        "b_ptrs = b_ptr + batch * b_sb + rk[:, None] * b_sk + (rn % N)[None, :] * b_sn",
        "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
    )
    with head.block("for k in range(0, (K + BLOCK_K - 1) // BLOCK_K):"):
        head.branches(
            "EVEN_K",
            CodeBuffer(["a = tl.load(a_ptrs)", "b = tl.load(b_ptrs)"]),
            CodeBuffer(
                [
                    "a = tl.load(a_ptrs, mask=rk[None, :] < K - k * BLOCK_K, other=0.0)",
                    "b = tl.load(b_ptrs, mask=rk[:, None] < K - k * BLOCK_K, other=0.0)",
                ]
            ),
        )
        head.branches(
            "BY_ELEMENTS",
            CodeBuffer(["acc += tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)"]),
            CodeBuffer(["acc = tl.dot(a, b, acc, input_precision=PRECISION)"]),
            "the Triton interpreter: the same products in float32",
        )
        head.write("a_ptrs += BLOCK_K * a_sk", "b_ptrs += BLOCK_K * b_sk")
    head.write(
        "rows = rm[:, None]", "cols = rn[None, :]", "rmask = rows < M", "cmask = cols < N", "mask = rmask & cmask"
    )
    return head.lines()


def _epilogue(context: Context, gemm: GemmPlan) -> list[str]:
    """The bias, the product as the model's dtype holds it, the epilogue's statements and the stores."""
    plan, epilogue = context.plan, gemm.epilogue
    lines = []
    for j in gemm.operands[2:]:
        load = _load(plan, j)
        lines.append(f"acc += {load}.to(tl.float32)  # the bias, {context.input_names[j]}")
    stmts = closure(epilogue, [o.stmt for o in epilogue.outputs], lambda s: True)
    from_product: set[str] = set()
    for s in stmts:
        if s.load_input == gemm.result:
            lines += _rounded(s, epilogue.inputs[gemm.result].dtype)
            from_product.add(s.name)
        elif s.load_input is not None:
            taken = gemm.taken[s.load_input]
            assert taken is not None
            note = context.comments.get(s.name) or s.comment
            convert = ".to(tl.float32)" if s.kind == FLOAT else ""
            lines.append(f"{s.name} = {_load(plan, taken)}{convert}" + (f"  # {note}" if note else ""))
        else:
            lines.append(stmt_line(epilogue, s, context.comments))
            if set(s.deps) & from_product:
                from_product.add(s.name)
    by_name = {s.name: s for s in epilogue.stmts}
    for k, out in enumerate(epilogue.outputs):
        value = _tile_of(by_name[out.stmt], from_product)
        if out.dtype == "bfloat16" and by_name[out.stmt].kind == FLOAT:  # stored to nearest, as eager's last op
            value = f"_nearest_bfloat16({value})"
        offset = "batch * o_sb + rows * o_sm + cols * o_sn"
        lines.append(f"tl.store(out{k}_ptr + ({offset}), {value}.to(out{k}_ptr.dtype.element_ty), mask=mask)")
    return lines


def _load(plan: KernelPlan, j: int) -> str:
    """The load of cluster input `j` at the tile's positions along the groups it varies along."""
    read = input_groups(plan, j)
    offset = " + ".join(f"{index} * in{j}_{suffix}" for group, index, suffix in _GROUPS if group in read)
    mask = {frozenset({"rows", "cols"}): "mask", frozenset({"rows"}): "rmask", frozenset({"cols"}): "cmask"}.get(
        frozenset(set(read) - {"batch"})
    )
    masked = f", mask={mask}, other=0" if mask else ""
    return f"tl.load(in{j}_ptr{' + (' + offset + ')' if offset else ''}{masked})"


def _rounded(s: Stmt, dtype: str) -> list[str]:
    """The product as the statement that loaded the GEMM's result reads it: rounded to its dtype, to
    nearest, as the library's GEMM writes it."""
    if dtype == "float32":
        return [f"{s.name} = acc  # the product"]
    if dtype == "bfloat16":
        return [f"{s.name} = _nearest_bfloat16(acc)  # the product, as the GEMM writes it in bfloat16"]
    return [f"{s.name} = acc.to(tl.{dtype}).to(tl.float32)  # the product, as the GEMM writes it in {dtype}"]


def _tile_of(s: Stmt, from_product: set[str]) -> str:
    """A statement's value over the whole tile (one computed from the product already is)."""
    return s.name if s.name in from_product else f"tl.broadcast_to({s.name}, [BLOCK_M, BLOCK_N])"
