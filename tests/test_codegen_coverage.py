"""Every lowering the code generator claims, run in the Triton interpreter against eager.

Each case is a small model file.  `validate_file` analyzes it, generates the kernel
module, runs every cluster's kernel on the real values recorded at the cluster's
boundary and compares with eager; exact clusters are also patched into the model and
the whole forward is compared.  A case passes only if

- the cluster it was written for exists (one cluster holds all the ops it lists),
- every cluster found is "verified" and the patched model matches eager,
- the ops it expects to be refused are refused with the expected reason.

Shapes are small (the interpreter costs ~1 ms per program) and deliberately ragged
(777 or 1000 columns, 3 or 33 rows) so masks and tails are exercised.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from fuselens.contracts.config import InputSpec
from fuselens.contracts.options import AnalyzeOptions, ValidateOptions
from fuselens.pipeline.analyze import analyze_file
from fuselens.pipeline.validate import validate_file

pytest.importorskip("triton")

# The interpreter runs kernels in numpy, which warns on log(0), 0 * inf, ... exactly where eager does.
pytestmark = [pytest.mark.interpreter, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

HEADER = "import math\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"


@pytest.fixture
def reads_across_at_any_size(monkeypatch):
    """Kernel modules that take the across kernels for a permuted input of any size: the small
    tensors these tests can afford would otherwise go to the plain tile kernels, which read them
    as well from L2 on a GPU."""
    import fuselens.validate.runner as runner

    load = runner.load_kernel_module

    def load_reading_across(*args, **kwargs):
        module = load(*args, **kwargs)
        module._ACROSS_MIN_BYTES = 0
        return module

    monkeypatch.setattr(runner, "load_kernel_module", load_reading_across)


def case(name, source, inputs, expect, *, rejects=(), shapes=None, marks=()):
    """`inputs`: [(shape, dtype)]; `expect`: op lists (a multiset) that must each lie in one cluster;
    `rejects`: (op, reason) pairs the analysis must report; `shapes`: validate at exactly these."""
    return pytest.param(source, inputs, expect, rejects, shapes, id=name, marks=marks)


def _contains(wanted: list[str], ops: list[str]) -> bool:
    return not Counter(wanted) - Counter(ops)


def check(path, inputs, expect, rejects=(), shapes=None):
    options = AnalyzeOptions(input_shapes=[s for s, _ in inputs], dtypes=[d for _, d in inputs])
    report = analyze_file(path, options)
    assert not report.problems, report.problems
    (model,) = report.models
    assert model.status == "analyzed", model.problem
    chains = [[op.target for op in c.ops] for c in model.clusters]
    for ops in expect:
        assert any(_contains(ops, chain) for chain in chains), (
            f"no cluster with {' → '.join(ops)}; clusters: {[' → '.join(c) for c in chains]}; "
            f"rejections: {[(r.ops[0].target, r.reason, r.detail) for r in model.rejections]}"
        )
    found = {(r.ops[0].target, r.reason) for r in model.rejections}
    for wanted in rejects:
        assert wanted in found, f"expected rejection {wanted}; got {sorted(found)}"
    unlowered = [
        (r.ops[0].target, r.detail)
        for r in model.rejections
        if r.reason == "no-lowering" and (r.ops[0].target, r.reason) not in rejects
    ]
    assert not unlowered, f"unexpected no-lowering rejections: {unlowered}"
    for c in model.clusters:
        assert c.kernel is not None, f"{c.id} ({c.op_chain}): {c.lowering}"

    specs = [InputSpec(list(s), d) for s, d in shapes] if shapes else None
    result = validate_file(path, options, ValidateOptions(interpret=True, shapes=specs))
    assert not result.problems, result.problems
    (checked,) = result.models
    assert len(checked.clusters) == len(model.clusters)
    chain_of = {c.id: c.op_chain for c in model.clusters}
    bad = [(c.id, chain_of[c.id], c.status, c.message, c.max_abs) for c in checked.clusters if c.status != "verified"]
    assert not bad, bad
    assert checked.model is not None and checked.model.status in ("matches", "skipped"), checked.model


# ---- elementwise ------------------------------------------------------------------------------

ELEMENTWISE = [
    case(
        "unary-activations",
        """
        class M(nn.Module):
            def forward(self, x):
                h = x * 1.5
                return (-h, torch.abs(h), torch.relu(h), F.gelu(h), F.gelu(h, approximate="tanh"), F.silu(h),
                        torch.sigmoid(h), torch.tanh(h), h.neg().abs() - 1)
        """,
        [("33,100", "float32")],
        [["mul", "neg", "abs", "relu", "gelu", "gelu", "silu", "sigmoid", "tanh", "neg", "abs", "sub"]],
    ),
    case(
        "unary-math",
        """
        class M(nn.Module):
            def forward(self, x):
                h = x * 2
                p = h.abs() + 0.1
                return (torch.exp(h), torch.log(p), torch.sqrt(p), torch.rsqrt(p), torch.reciprocal(p),
                        torch.sin(h), torch.cos(h), torch.erf(h), torch.floor(h), torch.ceil(h), torch.trunc(h),
                        torch.sign(h), torch.square(h), torch.log2(p), torch.log10(p), torch.log1p(p),
                        torch.expm1(h), torch.exp2(h), torch.sign(torch.trunc(h)))  # trunc: exact zeros
        """,
        [("33,100", "float32")],
        [
            [
                "mul",
                "exp",
                "abs",
                "add",
                "log",
                "sqrt",
                "rsqrt",
                "reciprocal",
                "sin",
                "cos",
                "erf",
                "floor",
                "ceil",
                "trunc",
                "sign",
                "square",
                "log2",
                "log10",
                "log1p",
                "expm1",
                "exp2",
                "trunc",
                "sign",
            ]
        ],
    ),
    case(
        "activations-with-params",
        """
        class M(nn.Module):
            def forward(self, x):
                h = x * 4
                return (F.softplus(h), F.softplus(h, beta=2.0, threshold=5.0), F.elu(h), F.elu(h, alpha=0.5),
                        F.leaky_relu(h), F.leaky_relu(h, 0.2), F.hardtanh(h, -0.5, 0.7), F.relu6(h),
                        F.hardsigmoid(h), F.hardswish(h), F.mish(h), F.softsign(h), F.selu(h),
                        F.celu(h, alpha=0.7))
        """,
        [("33,100", "float32")],
        [
            [
                "mul",
                "softplus",
                "softplus",
                "elu",
                "elu",
                "leaky_relu",
                "leaky_relu",
                "hardtanh",
                "hardtanh",
                "hardsigmoid",
                "hardswish",
                "mish",
                "softsign",
                "selu",
                "celu",
            ]
        ],
    ),
    case(
        "clamp-scalar-and-tensor",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.lo = nn.Parameter(torch.rand(777) - 1.0)
                self.hi = nn.Parameter(torch.rand(777))

            def forward(self, x):
                h = x * 1.5
                return (torch.clamp(h, -0.5, 0.5), h.clamp(min=0.1), h.clamp(max=-0.2), torch.clamp_min(h, 0.3),
                        torch.clamp_max(h, 0.3), torch.clamp(h, self.lo, self.hi), torch.clamp(h, min=self.lo),
                        torch.clamp(h, max=self.hi))
        """,
        [("33,777", "float32")],
        [["mul", "clamp", "clamp", "clamp", "clamp", "clamp", "clamp_tensor", "clamp_tensor", "clamp_tensor"]],
    ),
    case(
        "where-masked-fill-compare-logical",
        """
        class M(nn.Module):
            def forward(self, x, y):
                h = x * 2
                pos = h > 0
                a = torch.where(pos, h, -y)
                b = h.masked_fill(y < -1, 0.25)
                c = torch.where(h < y, h, 1.5)
                d = torch.where(y > 0.5, 2.0, h)
                inside = (h >= -0.5) & (h <= 0.5) | (y == 0) | (h != y)
                both = torch.logical_and(pos, y > 0)
                either = torch.logical_or(pos, torch.logical_not(y >= 0))
                odd = torch.logical_xor(both, either) ^ inside
                k = torch.floor(h)  # many exact ties with 0 and with each other
                ties = (k < 0, k <= 0, k > 0, k >= 0, k == torch.trunc(h), k != 0)
                return (a, b, c, d, pos, inside, odd, h.eq(1.0), h.ne(0)) + ties
        """,
        [("33,100", "float32"), ("33,100", "float32")],
        [
            [
                "mul",
                "gt",
                "neg",
                "where",
                "lt",
                "masked_fill",
                "lt",
                "where",
                "gt",
                "where",
                "ge",
                "le",
                "bitwise_and",
                "eq",
                "bitwise_or",
                "ne",
                "bitwise_or",
                "gt",
                "logical_and",
                "ge",
                "logical_not",
                "logical_or",
                "logical_xor",
                "bitwise_xor",
                "eq",
                "ne",
                "floor",
                "lt",
                "le",
                "gt",
                "ge",
                "trunc",
                "eq",
                "ne",
            ]
        ],
    ),
    case(
        "casts",
        """
        class M(nn.Module):
            def forward(self, x):
                h = x * 3
                # fp16: the round trip's rounding error, scaled past any tolerance; straight from the
                # input, so no multiply a GPU could contract into an FMA.  (Not for bf16: the
                # interpreter converts fp32 -> bf16 by truncation, a GPU rounds to nearest even.)
                fp16 = (x.half().float() - x) * 1e5
                wrapped = (h * 10).to(torch.int8) * 4 > 100  # int8 arithmetic wraps around
                return (h.to(torch.bfloat16).float(), fp16, h.long(), h.int(), h.bool(), torch.trunc(h).bool(),
                        (h * 4).to(torch.int32).float() * 0.5, h.to(torch.int16).to(torch.float32), wrapped)
        """,
        [("33,100", "float32")],
        [
            ["cast", "cast", "sub", "mul"],
            [
                "mul",
                "cast",
                "cast",
                "mul",
                "cast",
                "mul",
                "gt",
                "cast",
                "cast",
                "cast",
                "trunc",
                "cast",
                "mul",
                "cast",
                "cast",
                "mul",
                "cast",
                "cast",
            ],
        ],
    ),
    case(
        "int-arithmetic-to-float",
        """
        class M(nn.Module):
            def forward(self, ids, x):
                a = ids - 8
                b = ids % 5 + 1
                return (a // b, a % b, torch.div(a, b, rounding_mode="trunc"),
                        torch.div(a, b, rounding_mode="floor"), torch.fmod(a, b), torch.remainder(a, -b),
                        a // -b, a * 3 + b, a ** 2, torch.maximum(a, b), torch.abs(a), -a, a.float() * 0.5 + x,
                        a / b, a > b, a & 6, a | b, a ^ b, ~a)
        """,
        [("33,100", "int64"), ("33,100", "float32")],
        [
            [
                "sub",
                "remainder",
                "add",
                "floor_divide",
                "remainder",
                "div",
                "div",
                "fmod",
                "neg",
                "remainder",
                "neg",
                "floor_divide",
                "mul",
                "add",
                "pow",
                "maximum",
                "abs",
                "neg",
                "cast",
                "mul",
                "add",
                "div",
                "gt",
                "bitwise_and",
                "bitwise_or",
                "bitwise_xor",
                "bitwise_not",
            ]
        ],
    ),
    case(
        "pow",
        """
        class M(nn.Module):
            def forward(self, x, e):
                h = x * 1.5
                p = h.abs() + 0.5
                k = torch.floor(e * 3)
                return (
                    h.pow(2), h ** 3, torch.pow(h, 0), p ** -2, h ** -3,  # small integers: products
                    h ** 11, h ** 1.5, p ** 1.7, p ** -1.3,  # the _pow helper (h ** 1.5 is NaN below 0)
                    p ** 0.5, p ** -0.5,  # sqrt, rsqrt
                    torch.pow(p, e), torch.pow(h, e), torch.pow(h, k),  # tensor exponents
                    torch.pow(2.0, h), torch.pow(0.5, k), torch.pow(-2.0, k), torch.pow(0.0, k),  # scalar bases
                    torch.relu(h) ** 2.5, torch.relu(h) ** -1.5,  # zero bases
                    h ** float("inf"), torch.pow(-2.0, k / torch.relu(e)),  # infinite exponents
                )
        """,
        [("33,100", "float32"), ("33,100", "float32")],
        [
            [
                "mul",
                "pow",
                "pow",
                "pow",
                "abs",
                "add",
                "pow",
                "pow",
                "pow",
                "pow",
                "pow",
                "pow",
                "pow",
                "pow",
                "pow",
                "pow",
                "pow",
                "pow",
                "floor",
                "pow",
                "pow",
                "relu",
                "pow",
                "relu",
                "pow",
                "pow",
                "pow",
                "relu",
                "div",
                "pow",
            ]
        ],
    ),
    case(
        "scalar-operands",
        """
        class M(nn.Module):
            def forward(self, x, y):
                h = x * 2
                p = h.abs() + 0.5
                return (1 - h, 2 / p, 3 * h, h - 1, h / 3, 0.5 + h, h + 2, -h - 0.25, torch.add(h, y, alpha=2),
                        torch.sub(h, y, alpha=0.5), torch.rsub(h, 1.5), torch.mul(h, 2), torch.div(3.0, p),
                        7 - p, h * True)
        """,
        [("33,100", "float32"), ("33,100", "float32")],
        [
            [
                "mul",
                "sub",
                "abs",
                "add",
                "div",
                "mul",
                "sub",
                "div",
                "add",
                "add",
                "neg",
                "sub",
                "add",
                "sub",
                "sub",
                "mul",
                "div",
                "sub",
                "mul",
            ]
        ],
    ),
    case(
        "division-modes-remainder-fmod",
        """
        class M(nn.Module):
            def forward(self, x, y):
                h = x * 5
                d = torch.where(y >= 0, y + 0.3, y - 0.3)
                return (torch.div(h, d, rounding_mode="floor"), torch.div(h, d, rounding_mode="trunc"), h // d,
                        torch.remainder(h, d), h % 0.7, torch.fmod(h, d), torch.fmod(h, -0.7),
                        torch.floor_divide(h, -0.7), h / d)
        """,
        [("33,100", "float32"), ("33,100", "float32")],
        [
            [
                "mul",
                "ge",
                "add",
                "sub",
                "where",
                "div",
                "div",
                "floor_divide",
                "remainder",
                "remainder",
                "fmod",
                "fmod",
                "floor_divide",
                "div",
            ]
        ],
    ),
    case(
        "max-min-lerp-addcmul",
        """
        class M(nn.Module):
            def forward(self, x, y, w):
                h = x * 2
                return (torch.maximum(h, y), torch.minimum(h, y), torch.max(h, w), torch.min(y, h),
                        torch.lerp(h, y, 0.3), torch.lerp(h, y, 0.8), torch.lerp(h, y, torch.sigmoid(w)),
                        torch.addcmul(h, y, w, value=0.5), torch.addcmul(h, y, w),
                        torch.addcdiv(h, y, w.abs() + 0.5, value=-2), torch.copysign(h, y), torch.hypot(h, y))
        """,
        [("33,100", "float32")] * 3,
        [
            [
                "mul",
                "maximum",
                "minimum",
                "maximum",
                "minimum",
                "lerp",
                "lerp",
                "sigmoid",
                "lerp",
                "addcmul",
                "addcmul",
                "abs",
                "add",
                "addcdiv",
                "copysign",
                "hypot",
            ]
        ],
    ),
    case(
        "nan-propagation",
        """
        class M(nn.Module):  # eager's max, min, clamp, relu, ... keep NaN
            def forward(self, x, y):
                n = torch.log(x * 2)  # NaN below 0
                return (torch.maximum(n, y), torch.minimum(n, y), torch.clamp(n, -0.5, 0.5), torch.relu(n),
                        F.hardtanh(n), F.hardsigmoid(n), torch.clamp(n, min=y), torch.clamp(n, max=y))
        """,
        [("33,100", "float32")] * 2,
        [
            [
                "mul",
                "log",
                "maximum",
                "minimum",
                "clamp",
                "relu",
                "hardtanh",
                "hardsigmoid",
                "clamp_tensor",
                "clamp_tensor",
            ]
        ],
    ),
    case(
        "predicates-nan-to-num",
        """
        class M(nn.Module):
            def forward(self, x):
                y = torch.log(x) * 3
                inf = 1.0 / torch.relu(y)
                return (torch.nan_to_num(inf), torch.nan_to_num(-inf), torch.nan_to_num(inf, 1.0, 2.0, -2.0),
                        torch.nan_to_num(-inf, nan=1.0, posinf=2.0, neginf=-2.0),
                        torch.isnan(y), torch.isinf(inf), torch.isfinite(inf))
        """,
        [("33,100", "float32")],
        [
            [
                "log",
                "mul",
                "relu",
                "div",
                "nan_to_num",
                "neg",
                "nan_to_num",
                "nan_to_num",
                "neg",
                "nan_to_num",
                "isnan",
                "isinf",
                "isfinite",
            ]
        ],
    ),
    case(
        "ops-without-lowering-rejected",
        """
        class M(nn.Module):
            def forward(self, x, y):
                a = torch.sigmoid(x) * 2
                b = torch.atan2(a, y)
                c = torch.round(b)
                return torch.relu(c) + 1
        """,
        [("33,100", "float32")] * 2,
        [["sigmoid", "mul"], ["relu", "add"]],
        rejects=[("atan2", "no-lowering"), ("round", "no-lowering")],
    ),
    case(
        "rpow-scalar-base",
        """
        class M(nn.Module):
            def forward(self, x):
                h = x * 2
                return 2 ** h, 0.5 ** h
        """,
        [("33,100", "float32")],
        [["mul", "pow", "pow"]],
    ),
    case(
        "logsigmoid",
        """
        class M(nn.Module):
            def forward(self, x):
                return F.logsigmoid(x * 2) + 1
        """,
        [("33,100", "float32")],
        [["mul", "logsigmoid", "add"]],
    ),
]


# ---- broadcasting, strides, views, concat -----------------------------------------------------

LAYOUT = [
    case(
        "bias-row-broadcast",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.randn(777))
                self.b = nn.Parameter(torch.randn(777))

            def forward(self, x):
                h = F.dropout(x * self.w + self.b, 0.1, training=self.training)  # eval: an identity
                return F.gelu(h.clone().detach()) - 1
        """,
        [("33,777", "float32")],
        [["mul", "add", "gelu", "sub"]],
    ),
    case(
        "outer-broadcast",
        """
        class M(nn.Module):
            def forward(self, a, b):
                return torch.sigmoid(a + b) * b
        """,
        [("64,1", "float32"), ("1,64", "float32")],
        [["add", "sigmoid", "mul"]],
    ),
    case(
        "outer-broadcast-ragged",
        """
        class M(nn.Module):
            def forward(self, a, b):
                return torch.tanh(a - b) * 3
        """,
        [("3,33,1", "float32"), ("1,333", "float32")],
        [["sub", "tanh", "mul"]],
    ),
    case(
        "one-dim",
        """
        class M(nn.Module):
            def forward(self, x):
                return torch.relu(x * 2) + 1
        """,
        [("1000", "float32")],
        [["mul", "relu", "add"]],
    ),
    case(
        "channels-last-values-onto-a-channels-first-residual",  # a ConvNeXt block's layer scale
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.gamma = nn.Parameter(torch.rand(20))

            def forward(self, x, y):
                return x + (self.gamma * F.gelu(y)).permute(0, 3, 1, 2)
        """,
        [("3,20,5,9", "float32"), ("3,5,9,20", "float32")],
        [["gelu", "mul", "add"]],
    ),
    case(
        "transposed-patches-after-a-class-token",  # a ViT's embeddings
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.cls = nn.Parameter(torch.randn(1, 1, 40))
                self.pos = nn.Parameter(torch.randn(1, 10, 40))

            def forward(self, patches):
                tokens = patches.flatten(2).transpose(1, 2)
                return torch.cat((self.cls.expand(tokens.shape[0], -1, -1), tokens), dim=1) + self.pos
        """,
        [("2,40,3,3", "float32")],
        [["cat", "add"]],
    ),
    case(
        "frames-first-after-channels-first",  # a Whisper encoder's stem
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.pos = nn.Parameter(torch.randn(33, 40))

            def forward(self, x):
                return F.gelu(x).permute(0, 2, 1) + self.pos
        """,
        [("2,40,33", "float32")],
        [["gelu", "add"]],
    ),
    case(
        "layer-norm-over-the-channels-of-nchw",  # a ConvNeXt block's norm, written as in the paper
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(20, eps=1e-6)
                self.gamma = nn.Parameter(torch.rand(20))

            def forward(self, y):
                return self.gamma * self.norm(y.permute(0, 2, 3, 1))
        """,
        [("3,20,5,9", "float32")],
        [["layer_norm", "mul"]],
    ),
    case(
        "norm-over-nhwc-and-the-residual-square",  # height, width and channels alike: the permute decides
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(6)

            def forward(self, x, y):
                return x + F.gelu(self.norm(y.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        """,
        [("2,6,6,6", "float32"), ("2,6,6,6", "float32")],
        [["layer_norm", "gelu", "add"]],
    ),
    case(
        "residual-layer-norm-over-a-frames-first-view",  # a Whisper encoder's first layer
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(40)

            def forward(self, x, h):
                r = x.permute(0, 2, 1) + h
                return r, self.norm(r)
        """,
        [("2,40,33", "float32"), ("2,33,40", "float32")],
        [["add", "layer_norm"]],
    ),
    case(
        "conditioning-broadcast",
        """
        class M(nn.Module):
            def forward(self, h, t):
                return F.silu(h + t[:, :, None, None]) * 2
        """,
        [("2,8,5,7", "float32"), ("2,8", "float32")],
        [["add", "silu", "mul"]],
    ),
    case(
        "transposed-input",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.b = nn.Parameter(torch.randn(33))

            def forward(self, x):
                y = x.t()
                return torch.relu(y * 2 + self.b), torch.exp(y.contiguous()) * 2
        """,
        [("33,1000", "float32")],
        [["mul", "add", "relu"], ["copy", "exp", "mul"]],
    ),
    case(
        "sliced-input",
        """
        class M(nn.Module):
            def forward(self, x):
                y = x[:, 3:780]
                return torch.exp(y * 0.5) - y
        """,
        [("33,1000", "float32")],
        [["mul", "exp", "sub"]],
    ),
    case(
        "views-inside-cluster",
        """
        class M(nn.Module):
            def forward(self, x, s):
                h = torch.sigmoid(x)
                h = h.permute(0, 2, 1, 3)
                h = h * 2
                h = h.transpose(1, 3) + s.unsqueeze(-1)
                h = torch.tanh(h.unsqueeze(0).squeeze(0).movedim(1, 2))
                return h.permute(2, 0, 3, 1) - 1  # not its own inverse
        """,
        [("2,3,5,7", "float32"), ("2,7,3", "float32")],
        [["sigmoid", "mul", "add", "tanh", "sub"]],
    ),
    case(
        "slice-select-expand-inside-cluster",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.randn(4, 1))

            def forward(self, x):
                h = x * 3
                a = torch.relu(h[:, ::2] - h[:, 1::2])
                g = torch.sigmoid(x)
                b = torch.exp(g[:, 5:505]) + 1
                m = x * 0.5
                c = torch.tanh(m[:, 7]) - 1
                e = torch.cos(x)
                d = e.unsqueeze(1).expand(-1, 4, -1) * self.w
                f = torch.sin(x[:, :1] * 2).expand(-1, 1000) * x
                return a, b, c, d, f
        """,
        [("3,1000", "float32")],
        [
            ["mul", "sub", "relu"],
            ["sigmoid", "exp", "add"],
            ["mul", "tanh", "sub"],
            ["cos", "mul"],
            ["mul", "sin", "mul"],
        ],
    ),
    case(
        "rope-rotate-half",
        """
        def rotate_half(x):
            x1 = x[..., : x.shape[-1] // 2]
            x2 = x[..., x.shape[-1] // 2 :]
            return torch.cat((-x2, x1), dim=-1)


        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("cos", torch.randn(16, 32))
                self.register_buffer("sin", torch.randn(16, 32))

            def forward(self, q):
                return q * self.cos + rotate_half(q) * self.sin
        """,
        [("2,3,16,32", "float32")],
        [["mul", "neg", "cat", "mul", "add"]],
    ),
    case(
        "cat-uneven-pieces",
        """
        class M(nn.Module):
            def forward(self, x, y):
                a = torch.sigmoid(x)
                b = y * 2
                return torch.cat((a[:, :10], b, a[:, 20:]), dim=-1) + 1
        """,
        [("33,100", "float32"), ("33,7", "float32")],
        [["sigmoid", "mul", "cat", "add"]],
    ),
]


# ---- reductions -------------------------------------------------------------------------------

REDUCTIONS = [
    case(
        "softmax-plain-scaled",
        """
        class M(nn.Module):
            def forward(self, x):
                return F.softmax(x, dim=-1) + torch.softmax(x * 0.125, -1)
        """,
        [("33,777", "float32")],
        [["softmax"], ["mul", "softmax"]],
    ),
    case(
        "softmax-masked-fill",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("mask", torch.triu(torch.ones(40, 40, dtype=torch.bool), 1))

            def forward(self, s):
                s = s / math.sqrt(64)
                s = s.masked_fill(self.mask, float("-inf"))
                return F.softmax(s, dim=-1)
        """,
        [("2,3,40,40", "float32")],
        [["div", "masked_fill", "softmax"]],
    ),
    case(
        "softmax-additive-mask",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                mask = torch.full((40, 40), float("-inf")).triu(1)
                self.register_buffer("mask", mask)

            def forward(self, s):
                return torch.softmax(s * 0.5 + self.mask, dim=-1).float() * 2
        """,
        [("3,40,40", "float32")],
        [["mul", "add", "softmax", "mul"]],
    ),
    case(
        "log-softmax",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("mask", torch.triu(torch.ones(33, 33, dtype=torch.bool), 1))

            def forward(self, x, s):
                a = F.log_softmax(x, dim=-1) + 1
                b = torch.log_softmax(x * 3.0, dim=1)
                c = F.log_softmax(s.masked_fill(self.mask, float("-inf")), -1)
                return a, b, c
        """,
        [("33,1000", "float32"), ("2,33,33", "float32")],
        [["log_softmax", "add"], ["mul", "log_softmax"], ["masked_fill", "log_softmax"]],
    ),
    case(
        "row-stats-keepdim",
        """
        class M(nn.Module):
            def forward(self, x):
                h = x * 2 + 1
                a = h - h.mean(-1, keepdim=True) + h.sum(-1, keepdim=True) * 0.01
                b = h.amax(-1, keepdim=True) - h.amin(-1, keepdim=True)
                c = h.var(-1, keepdim=True) + h.std(-1, keepdim=True)
                return a * b + c
        """,
        [("33,777", "float32")],
        [["mul", "add", "mean", "sub", "sum", "mul", "add", "amax", "amin", "sub", "var", "std", "add", "mul", "add"]],
    ),
    case(
        "row-stats-no-keepdim",
        """
        class M(nn.Module):
            def forward(self, x):
                h = torch.tanh(x)
                centred = h - h.mean(-1).unsqueeze(-1) * h.amax(-1)[..., None]
                return (centred, h.sum(-1) * 2, h.mean(dim=-1) + 1, torch.amax(h, -1) - 0.5, h.amin(-1).abs(),
                        torch.var(h, -1, unbiased=False), torch.std(h, dim=-1, correction=0) * 3)
        """,
        [("3,2,1000", "float32")],
        [
            [
                "tanh",
                "mean",
                "amax",
                "mul",
                "sub",
                "sum",
                "mul",
                "mean",
                "add",
                "amax",
                "sub",
                "amin",
                "abs",
                "var",
                "std",
                "mul",
            ]
        ],
    ),
    case(
        "logsumexp-norm",
        """
        class M(nn.Module):
            def forward(self, x):
                h = x * 4
                a = torch.logsumexp(h, dim=-1) + h.norm(dim=-1) + torch.norm(h, p=1, dim=-1)
                b = torch.norm(h, p=float("inf"), dim=-1, keepdim=True)
                return a, h / b
        """,
        [("33,777", "float32")],
        [["mul", "logsumexp", "norm", "add", "norm", "add"]],
    ),
    case(
        "reduce-two-trailing-dims",
        """
        class M(nn.Module):
            def forward(self, x):
                h = torch.sigmoid(x)
                return h - h.mean(dim=(-2, -1), keepdim=True), h.sum(dim=(1, 2))
        """,
        [("3,16,33", "float32")],
        [["sigmoid", "mean", "sub"]],
    ),
    case(
        "rmsnorm-written-out",
        """
        class RMSNorm(nn.Module):
            def __init__(self, dim=777, eps=1e-6):
                super().__init__()
                self.eps = eps
                self.weight = nn.Parameter(torch.randn(dim))

            def forward(self, x):
                h = x.float()
                h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
                return h.type_as(x) * self.weight
        """,
        [("33,777", "float32")],
        [["pow", "mean", "add", "rsqrt", "mul", "mul"]],
    ),
    case(
        "rmsnorm-functional",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = nn.Parameter(torch.randn(1000))

            def forward(self, x):
                return F.rms_norm(x * 2, (1000,), self.weight, eps=1e-5), F.rms_norm(x, (1000,)) + 1
        """,
        [("3,1000", "float32")],
        [["mul", "rms_norm"], ["rms_norm", "add"]],
    ),
    case(
        "layer-norm-functional",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.randn(777))
                self.b = nn.Parameter(torch.randn(777))

            def forward(self, x):
                a = F.layer_norm(x * 2, (777,), self.w, self.b) + 1
                b = F.layer_norm(x + 1, (777,)) * 2
                c = F.layer_norm(x - 1, (777,), self.w, eps=1e-3) * 3
                return a, b, c
        """,
        [("33,777", "float32")],
        [["mul", "layer_norm", "add"], ["add", "layer_norm", "mul"], ["sub", "layer_norm", "mul"]],
    ),
    case(
        "layer-norm-module",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(1000)
                nn.init.normal_(self.norm.weight)
                nn.init.normal_(self.norm.bias)

            def forward(self, x):
                return F.gelu(self.norm(x * 0.5))
        """,
        [("2,3,1000", "float32")],
        [["mul", "layer_norm", "gelu"]],
    ),
    case(
        "group-norm-silu",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.GroupNorm(4, 8)
                nn.init.normal_(self.norm.weight)
                nn.init.normal_(self.norm.bias)

            def forward(self, x):
                return F.silu(self.norm(x))
        """,
        [("2,8,5,7", "float32")],
        [["group_norm", "silu"]],
    ),
    case(
        "group-norm-silu-into-a-convolution-whose-bias-joins-the-next-kernel",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.GroupNorm(4, 8)
                self.conv = nn.Conv2d(8, 8, 3, padding=1)
                nn.init.normal_(self.norm.weight)
                nn.init.normal_(self.conv.bias)

            def forward(self, x):
                h = self.conv(F.silu(self.norm(x)))
                return h * 0.5
        """,
        [("2,8,5,7", "float32")],
        [["group_norm", "silu"], ["add", "mul"]],
    ),
    case(
        "group-norm-of-a-channels-last-view",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.GroupNorm(4, 8)
                nn.init.normal_(self.norm.weight)

            def forward(self, x):
                return F.silu(self.norm(x.permute(0, 3, 1, 2))) + 1.0
        """,
        [("2,5,7,8", "float32")],
        [["group_norm", "silu", "add"]],
    ),
    case(
        "group-norm-of-a-channels-last-view-in-column-blocks",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.GroupNorm(4, 8)
                nn.init.normal_(self.norm.weight)

            def forward(self, x):
                return F.silu(self.norm(x.permute(0, 3, 1, 2)))
        """,
        [("2,40,130,8", "float32")],  # 10400-wide groups
        [["group_norm", "silu"]],
    ),
    case(
        "group-norm-of-a-channels-last-view-too-wide-to-split",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.GroupNorm(32, 16384)
                nn.init.normal_(self.norm.weight)

            def forward(self, x):
                return F.silu(self.norm(x.permute(0, 3, 1, 2)))
        """,
        [("1,2,3,16384", "float32")],  # 32 groups of 512 channels: one group a program, walked channels-last
        [["group_norm", "silu"]],
    ),
    case(
        "residual-layer-norm-multi-output",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(777)
                nn.init.normal_(self.norm.weight)
                nn.init.normal_(self.norm.bias)

            def forward(self, x, r):
                h = x + r
                return h, self.norm(h)
        """,
        [("33,777", "float32"), ("33,777", "float32")],
        [["add", "layer_norm"]],
    ),
    case(
        "wide-rows-looped",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(10000)
                nn.init.normal_(self.norm.weight)
                nn.init.normal_(self.norm.bias)
                self.g = nn.Parameter(torch.randn(10000))

            def forward(self, x):
                a = F.softmax(x * 2, dim=-1)
                b = self.norm(x + 1)
                c = F.rms_norm(x - 1, (10000,), self.g)
                d = (x.exp().sum(-1, keepdim=True), x.var(-1), torch.logsumexp(x * 0.5, -1))
                # Rows entirely below / above zero: a masked lane filled with 0 would win.
                e = ((-x.abs() - 1).amax(-1), (x.abs() + 1).amin(-1))
                return a, b, c, d, e
        """,
        [("3,10000", "float32")],
        [
            ["mul", "softmax"],
            ["add", "layer_norm"],
            ["sub", "rms_norm"],
            ["exp", "sum"],
            ["mul", "logsumexp"],
            ["abs", "neg", "sub", "amax"],
            ["abs", "add", "amin"],
        ],
    ),
    case(
        "wide-rows-far-from-zero",
        """
        class M(nn.Module):
            # A mean 300 times the spread: one-pass sum(x^2) - sum(x)^2 / n would be off by ~1% in the
            # variance here, while eager's Welford (and the kernel's shifted sums) stay within 1e-4.
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(10000)
                self.gn = nn.GroupNorm(2, 8)

            def forward(self, x, img):
                h = x + 300.0
                return self.norm(h), h.var(-1), h.std(-1, correction=0), self.gn(img + 300.0)
        """,
        [("3,10000", "float32"), ("2,8,40,64", "float32")],
        [["add", "layer_norm", "var", "std"], ["add", "group_norm"]],
    ),
    case(
        "narrow-rows",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(7)
                nn.init.normal_(self.norm.weight)
                nn.init.normal_(self.norm.bias)

            def forward(self, x):
                return F.softmax(x * 2, dim=-1), self.norm(x + 1), (x - 1).amax(-1)
        """,
        [("5000,7", "float32")],
        [["mul", "softmax"], ["add", "layer_norm"], ["sub", "amax"]],
    ),
    case(
        "reductions-without-lowering-rejected",
        """
        class M(nn.Module):
            def forward(self, x, ids):
                h = x * 2
                return (h.prod(-1) + 1, torch.cumsum(h, -1) * 2, torch.argmax(h * 3, -1) + 1, (ids * 2).sum(-1),
                        (h > 0).any(-1))
        """,
        [("33,100", "float32"), ("33,100", "int64")],
        [["mul", "mul", "gt"], ["argmax", "add"]],  # argmax has a lowering: the first index of the row's max
        rejects=[
            ("prod", "no-lowering"),
            ("add", "no-lowering"),
            ("cumsum", "no-lowering"),
            ("sum", "no-lowering"),
            ("mul", "no-lowering"),
            ("any", "no-lowering"),
        ],
    ),
]


# ---- one kernel, other shapes: sizes and strides are read at call time ---------------------------

OTHER_SHAPES = [
    case(
        "rows-analyzed-narrow-validated-wide",
        """
        class M(nn.Module):
            def forward(self, x):
                h = x * 2
                return F.softmax(h, dim=-1), h - h.amax(-1, keepdim=True), torch.logsumexp(h, -1)
        """,
        [("4,64", "float32")],
        [["mul", "softmax", "amax", "sub", "logsumexp"]],
        shapes=[([3, 9000], "float32")],
    ),
    case(
        "broadcast-validated-at-other-sizes",
        """
        class M(nn.Module):
            def forward(self, a, b, t):
                return torch.sigmoid(a + b) * t
        """,
        [("64,1", "float32"), ("1,64", "float32"), ("64", "float32")],
        [["add", "sigmoid", "mul"]],
        shapes=[([33, 1], "float32"), ([1, 777], "float32"), ([777], "float32")],
    ),
]


# ---- dtypes -----------------------------------------------------------------------------------

DTYPES = [
    case(
        "bf16-elementwise",
        """
        class M(nn.Module):
            def forward(self, x, y):
                return F.gelu(x) * torch.sigmoid(y) + 1, (x > y) & (x > 0)
        """,
        [("33,777", "bfloat16")] * 2,
        [["gelu", "sigmoid", "mul", "add"]],
    ),
    case(
        "fp16-elementwise",
        """
        class M(nn.Module):
            def forward(self, x):
                return F.silu(x) * 2 - x.float().exp().half()
        """,
        [("33,777", "float16")],
        [["silu", "mul", "cast", "exp", "cast", "sub"]],
    ),
    case(
        "fp16-softmax",
        """
        class M(nn.Module):
            def forward(self, x):
                return (F.softmax(x * 0.5, dim=-1), F.softmax(x.float(), dim=-1).type_as(x),
                        torch.softmax(x + 1, -1, dtype=torch.float32), (x * 2).sum(-1, dtype=torch.float32))
        """,
        [("3,40,40", "float16")],
        [["mul", "softmax"], ["cast", "softmax", "cast"], ["add", "softmax"], ["mul", "sum"]],
    ),
    case(
        "bf16-layer-norm",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(777)
                nn.init.normal_(self.norm.weight)
                nn.init.normal_(self.norm.bias)
                self.to(torch.bfloat16)

            def forward(self, x):
                return self.norm(x * 2) * 0.5
        """,
        [("33,777", "bfloat16")],
        [["mul", "layer_norm", "mul"]],
    ),
    case(
        "bf16-rmsnorm-llama",
        """
        class RMSNorm(nn.Module):
            def __init__(self, dim=1000, eps=1e-6):
                super().__init__()
                self.eps = eps
                self.weight = nn.Parameter(torch.randn(dim, dtype=torch.bfloat16))

            def forward(self, x):
                h = x.float()
                h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
                return h.type_as(x) * self.weight
        """,
        [("3,1000", "bfloat16")],
        [["cast", "pow", "mean", "add", "rsqrt", "mul", "cast", "mul"]],
    ),
    case(
        "int64-input-to-float",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.scale = nn.Parameter(torch.randn(100))

            def forward(self, ids):
                pos = ids.float() * 0.5 + 1
                return torch.sin(pos) * self.scale, torch.softmax(ids * 0.25, dim=-1)
        """,
        [("33,100", "int64")],
        [["cast", "mul", "add", "sin", "mul"], ["mul", "softmax"]],
    ),
    case(
        "log-softmax-gather-loss",
        """
        class M(nn.Module):
            def forward(self, logits, target):
                nll = -F.log_softmax(logits.float(), dim=-1).gather(-1, target[..., None])
                picked = torch.gather(torch.log_softmax(logits * 2.0, 1), 1, target.unsqueeze(1))
                return nll, picked.squeeze(-1) * 0.5
        """,
        [("33,777", "bfloat16"), ("33", "int64")],
        [["cast", "log_softmax", "gather", "neg"], ["mul", "log_softmax", "gather", "mul"]],
    ),
    case(
        "log-softmax-gather-wide-rows",
        """
        class M(nn.Module):
            def forward(self, logits, target):
                return -F.log_softmax(logits.float(), dim=-1).gather(-1, target[..., None])
        """,
        [("3,9001", "bfloat16"), ("3", "int64")],
        [["cast", "log_softmax", "gather", "neg"]],
    ),
    case(
        "layer-scale-residual-in-another-layout",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(96, eps=1e-6)
                self.gamma = nn.Parameter(torch.randn(96))

            def forward(self, x, y):
                return x + (self.gamma * self.norm(y.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        """,
        [("2,96,5,7", "float32"), ("2,96,5,7", "float32")],
        [["layer_norm", "mul", "add"]],  # the residual is NCHW, the norm's rows NHWC: one kernel all the same
    ),
    case(
        "embeddings-positions-and-norm",
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.word = nn.Embedding(100, 64)
                self.pos = nn.Embedding(40, 64)
                self.norm = nn.LayerNorm(64)

            def forward(self, ids):
                positions = torch.arange(ids.shape[1], device=ids.device)
                x = self.word(ids) + self.pos(positions)[None]
                return self.norm(x), F.embedding(ids.t(), self.word.weight) * 2.0
        """,
        [("3,33", "int64")],
        [["embedding", "embedding", "add", "layer_norm"], ["embedding", "mul"]],
    ),
    case(
        "cross-entropy-every-reduction",
        """
        class M(nn.Module):
            def forward(self, logits, target):
                x = logits.float() * 1.5
                return (
                    F.cross_entropy(x, target),
                    F.cross_entropy(x, target, reduction="sum", label_smoothing=0.1),
                    F.cross_entropy(x, target, reduction="none", ignore_index=3),
                )
        """,
        [("33,777", "bfloat16"), ("33", "int64")],
        [["cast", "mul", "cross_entropy", "cross_entropy", "cross_entropy"]],
    ),
    case(
        "cross-entropy-ignored-targets-and-wide-rows",
        """
        class M(nn.Module):
            def forward(self, logits, target):
                ignored = torch.where(target < 4, -100, target)  # (the targets are 0..15)
                loss = nn.CrossEntropyLoss(label_smoothing=0.05)(logits.float(), ignored)
                return loss, F.cross_entropy(logits.float() / 2, target, ignore_index=-100, reduction="none")
        """,
        [("5,9001", "bfloat16"), ("5", "int64")],
        [["cast", "cross_entropy"], ["cast", "div", "cross_entropy"]],
    ),
    case(
        "log-softmax-picks-of-transposed-logits",
        """
        class M(nn.Module):
            def forward(self, logits_t, target):
                logp = torch.log_softmax(logits_t.transpose(0, 1).float(), -1)  # a strided view of the logits
                nll = -torch.take_along_dim(logp, target[:, None], dim=-1)
                return nll, (logp.gather(1, target.view(-1, 1)) * 2).exp()
        """,
        [("777,33", "bfloat16"), ("33", "int64")],
        [["cast", "log_softmax", "gather", "neg", "gather", "mul", "exp"]],
    ),
]


# ---- eval-mode batch norm: a per-channel affine map, fused with its neighbours -------------------

# Running statistics, weight and bias away from their initial 0 / 1, so a kernel that reads a
# channel's values at the wrong place, or skips one of them, is caught.
BN_INIT = """
        def _randomize(bn):
            with torch.no_grad():
                bn.running_mean.uniform_(-1.0, 1.0)
                bn.running_var.uniform_(0.25, 4.0)
                if bn.affine:
                    nn.init.normal_(bn.weight)
                    nn.init.normal_(bn.bias)
            return bn
"""

BATCH_NORM = [
    case(
        "batch-norm-2d-relu",
        BN_INIT
        + """

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 8, 3, padding=1)
                self.bn = _randomize(nn.BatchNorm2d(8))

            def forward(self, x):
                return F.relu(self.bn(self.conv(x)))
        """,
        [("2,3,5,33", "float32")],
        [["batch_norm", "relu"]],
    ),
    case(
        "batch-norm-2d-residual-relu",
        BN_INIT
        + """

        class M(nn.Module):
            # A ResNet basic block as torchvision writes it: conv -> bn -> relu, conv -> bn -> += identity
            # -> relu, with in-place ReLUs and add.
            def __init__(self):
                super().__init__()
                self.conv1 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
                self.bn1 = _randomize(nn.BatchNorm2d(8))
                self.relu = nn.ReLU(inplace=True)
                self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
                self.bn2 = _randomize(nn.BatchNorm2d(8, eps=1e-3))

            def forward(self, x):
                identity = x
                out = self.conv1(x)
                out = self.bn1(out)
                out = self.relu(out)
                out = self.conv2(out)
                out = self.bn2(out)
                out += identity
                out = self.relu(out)
                return out
        """,
        [("2,8,7,9", "float32")],
        [["batch_norm", "relu"], ["batch_norm", "add", "relu"]],
    ),
    case(
        "batch-norm-1d",
        BN_INIT
        + """

        class M(nn.Module):
            # [N, C]: channels are the columns (also in a row kernel, before a softmax over them);
            # [N, C, L]: channels are rows; no affine part: no weight or bias.
            def __init__(self):
                super().__init__()
                self.bn = _randomize(nn.BatchNorm1d(100))
                self.seq = _randomize(nn.BatchNorm1d(16, affine=False))

            def forward(self, x, s):
                return F.gelu(self.bn(x * 2)), F.softmax(self.bn(x - 1), dim=-1), torch.sigmoid(self.seq(s)) - 1
        """,
        [("33,100", "float32"), ("3,16,50", "float32")],
        [["mul", "batch_norm", "gelu"], ["sub", "batch_norm", "softmax"], ["batch_norm", "sigmoid", "sub"]],
    ),
    case(
        "batch-norm-channels-last",
        BN_INIT
        + """

        class M(nn.Module):
            # A channels-last convolution's output, and an NHWC tensor seen as NCHW: the channel
            # is the fastest dim in memory.
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(4, 8, 3, padding=1).to(memory_format=torch.channels_last)
                self.bn = _randomize(nn.BatchNorm2d(8))
                self.bn2 = _randomize(nn.BatchNorm2d(8))

            def forward(self, x, nhwc):
                h = self.conv(x.to(memory_format=torch.channels_last))
                return F.relu(self.bn(h)), F.relu(self.bn2(nhwc.permute(0, 3, 1, 2)) + 1)
        """,
        [("2,4,5,7", "float32"), ("2,5,7,8", "float32")],
        [["batch_norm", "relu"], ["batch_norm", "add", "relu"]],
    ),
    case(
        "batch-norm-bf16",
        BN_INIT
        + """

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.bn = _randomize(nn.BatchNorm2d(8)).to(torch.bfloat16)

            def forward(self, x):
                return F.silu(self.bn(x)) * 2
        """,
        [("2,8,5,33", "bfloat16")],
        [["batch_norm", "silu", "mul"]],
    ),
    case(
        "batch-norm-batch-statistics",
        BN_INIT
        + """

        class M(nn.Module):
            # Without running statistics even eval mode normalises with the batch's own: a reduction
            # over batch and space per channel, each channel a row of the kernel.
            def __init__(self):
                super().__init__()
                self.bn = nn.BatchNorm2d(8, track_running_stats=False)
                self.seq = nn.BatchNorm1d(16, affine=False, track_running_stats=False)

            def forward(self, x, s):
                return F.relu(self.bn(x * 2 + 1)), self.seq(s - 1) * 2
        """,
        [("2,8,5,7", "float32"), ("5,16", "float32")],
        [["mul", "add", "batch_norm", "relu"], ["sub", "batch_norm", "mul"]],
    ),
]


@pytest.mark.parametrize(
    "source, inputs, expect, rejects, shapes",
    ELEMENTWISE + LAYOUT + REDUCTIONS + OTHER_SHAPES + DTYPES + BATCH_NORM,
)
def test_generated_kernels_match_eager(write_model, reads_across_at_any_size, source, inputs, expect, rejects, shapes):
    check(write_model(HEADER + textwrap.dedent(source).lstrip("\n")), inputs, expect, rejects, shapes)


# ---- output layout ------------------------------------------------------------------------------

ROPE = """
    class M(nn.Module):
        def forward(self, q, cos, sin):
            return q * cos + torch.cat((-q[..., 16:], q[..., :16]), dim=-1) * sin
    """


def _kernel_module(write_model, source, inputs):
    from fuselens.validate import runner

    path = write_model(HEADER + textwrap.dedent(source).lstrip("\n"))
    report = analyze_file(path, AnalyzeOptions(input_shapes=[s for s, _ in inputs], dtypes=[d for _, d in inputs]))
    (model,) = report.models
    (cluster,) = model.clusters
    module = runner.load_kernel_module(report, os.path.join(os.path.dirname(path), "kernels_for_layout.py"))
    return getattr(module, cluster.kernel.name)


def test_elementwise_output_keeps_a_permuted_inputs_layout(write_model):
    """q as attention produces it, a transposed view of a projection: the kernel walks it in
    memory order and returns the layout eager returns, so neither side of it transposes."""
    import torch

    fused = _kernel_module(write_model, ROPE, [("2,4,8,32", "float32"), ("8,32", "float32"), ("8,32", "float32")])
    proj = torch.randn(2, 8, 4, 32)
    q = proj.transpose(1, 2)  # [2, 4, 8, 32], last dim contiguous
    cos, sin = torch.randn(8, 32), torch.randn(8, 32)
    want = q * cos + torch.cat((-q[..., 16:], q[..., :16]), dim=-1) * sin
    got = fused(q, cos, q[..., 16:], q[..., :16], sin)
    assert got.stride() == want.stride() == q.stride()
    torch.testing.assert_close(got, want)
    # The halves as tensors of their own: they no longer share q's rows, so they are read by
    # their own strides.
    torch.testing.assert_close(fused(q, cos, q[..., 16:].contiguous(), q[..., :16].contiguous(), sin), want)
    # q split from a fused qkv projection (Phi-3): a slice, so not dense, but its rows still run
    # along memory; the kernel walks them in that order into a result laid out as eager's `q * cos`.
    q_fused = torch.randn(2, 8, 3 * 4 * 32)[..., : 4 * 32].view(2, 8, 4, 32).transpose(1, 2)
    got = fused(q_fused, cos, q_fused[..., 16:], q_fused[..., :16], sin)
    assert got.stride() == (q_fused * cos).stride() == (1024, 32, 128, 1)
    torch.testing.assert_close(got, q_fused * cos + torch.cat((-q_fused[..., 16:], q_fused[..., :16]), dim=-1) * sin)
    # The same kernel on q with its positions innermost (the last dim strided): it reads across the
    # positions and returns that layout, as eager does.
    q_odd = torch.randn(2, 4, 32, 8).transpose(2, 3)
    got = fused(q_odd, cos, q_odd[..., 16:], q_odd[..., :16], sin)
    assert got.stride() == (q_odd * cos).stride() == q_odd.stride()
    torch.testing.assert_close(got, q_odd * cos + torch.cat((-q_odd[..., 16:], q_odd[..., :16]), dim=-1) * sin)
    # An empty batch launches nothing and returns an empty result of the right shape.
    empty = torch.randn(0, 8, 4, 32).transpose(1, 2)
    assert fused(empty, cos, empty[..., 16:], empty[..., :16], sin).shape == (0, 4, 8, 32)


# A ConvNeXt block's layer scale: channels-last values added to a channels-first residual.
LAYER_SCALE = """
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.gamma = nn.Parameter(torch.rand(20))

        def forward(self, x, y):
            return x + (self.gamma * y).permute(0, 3, 1, 2)
    """


def test_an_input_laid_out_along_the_rows_is_read_across_and_written_in_the_outputs_layout(
    write_model, reads_across_at_any_size
):
    """Channels-last values added to a channels-first residual (a ConvNeXt block): the kernel
    numbers its rows channel-fastest, so the channels-last input is read along its memory, and
    writes each row where the output keeps it.  Right whatever the layouts seen at call time."""
    import torch

    fused = _kernel_module(write_model, LAYER_SCALE, [("3,20,5,9", "float32"), ("3,5,9,20", "float32")])
    module = __import__(fused.__module__)
    gamma = torch.rand(20)

    def want(x, y):
        return x + (gamma * y).permute(0, 3, 1, 2)

    x, y = torch.randn(3, 20, 5, 9), torch.randn(3, 5, 9, 20)
    # Small enough to stay in L2, the permuted input is read by the plain tile kernel ...
    module._ACROSS_MIN_BYTES = 3 << 20
    assert module._row_order((x,), tuple(x.shape), ((y, (0, 2, 3, 1)),))[4] == -1
    torch.testing.assert_close(fused(x, gamma, y), want(x, y))
    # ... and at any size it is read across.
    module._ACROSS_MIN_BYTES = 0
    pitches, out_strides, dense, like, fast = module._row_order((x,), tuple(x.shape), ((y, (0, 2, 3, 1)),))
    assert dense and like  # the output takes the contiguous residual's layout
    # The rows (batch, channel, height) of W: the across kernel runs down the channels, its other
    # positions counted height-fastest, and writes each row where the contiguous output keeps it.
    assert fast == 1 and out_strides == [900, 45, 9, 1] and pitches == [5, 1, 1]
    got = fused(x, gamma, y)
    assert got.stride() == want(x, y).stride()
    torch.testing.assert_close(got, want(x, y))
    # The residual channels-last too (a ConvNeXt stage's input, from a channels-first LayerNorm):
    # every tensor runs channel-fastest, so the output is written channels-last, as eager's is,
    # instead of turned channels-first (by the flat kernel: one layout for every tensor).
    x_cl = x.to(memory_format=torch.channels_last)
    assert module._row_order((x_cl,), tuple(x.shape), ((y, (0, 2, 3, 1)),))[3:] == (True, 1)
    got = fused(x_cl, gamma, y)
    assert got.stride() == want(x_cl, y).stride() == x_cl.stride()
    torch.testing.assert_close(got, want(x_cl, y))
    # ... and so when the values are small: the layout asks for it, not their size.
    module._ACROSS_MIN_BYTES = 3 << 20
    assert module._row_order((x_cl,), tuple(x.shape), ((y, (0, 2, 3, 1)),))[3:] == (True, 1)
    torch.testing.assert_close(fused(x_cl, gamma, y), want(x_cl, y))
    module._ACROSS_MIN_BYTES = 0
    # The values channels-first after all (a permuted view): nothing to read across, rows in order.
    y_cf = torch.randn(3, 20, 5, 9).permute(0, 2, 3, 1)
    assert module._row_order((x,), tuple(x.shape), ((y_cf, (0, 2, 3, 1)),))[4] == -1
    torch.testing.assert_close(fused(x, gamma, y_cf), want(x, y_cf))
    # Odd sizes and a strided slice of a wider tensor.
    x2, y2 = torch.randn(1, 20, 3, 1), torch.randn(1, 3, 1, 40)[..., ::2]
    torch.testing.assert_close(fused(x2, gamma, y2), want(x2, y2))


def test_a_layer_scale_whose_tensors_share_a_channels_last_layout_is_one_flat_pass(write_model):
    """A ConvNeXt stage's layer scale with its residual channels-last: every tensor lies channel
    fastest, so one flat offset addresses them all and gamma is read at `offset % channels`, as
    torch.compile's kernel does (no tiles of 64 channels over 96).  Where any layout differs (a
    channels-first residual, channels-first values) the tile kernels run instead.  Right in every
    case, at odd sizes, the result laid out as eager's."""
    import torch

    fused = _kernel_module(write_model, LAYER_SCALE, [("3,20,5,9", "float32"), ("3,5,9,20", "float32")])
    module = sys.modules[fused.__module__]
    gamma = torch.rand(20)

    def want(x, y):
        return x + (gamma * y).permute(0, 3, 1, 2)

    x_cl, y = torch.randn(3, 20, 5, 9).to(memory_format=torch.channels_last), torch.randn(3, 5, 9, 20)
    sizes = tuple(x_cl.shape)
    assert module._flat_over((x_cl,), sizes, ((y, (0, 2, 3, 1)),), 1)
    assert not module._flat_over((x_cl.contiguous(),), sizes, ((y, (0, 2, 3, 1)),), 1)
    y_cf = torch.randn(3, 20, 5, 9).permute(0, 2, 3, 1)
    assert not module._flat_over((x_cl,), sizes, ((y_cf, (0, 2, 3, 1)),), 1)

    launches = []
    flat = module._cluster0_kernel_flat

    class Counted:  # the flat kernel, counting its launches
        def __getitem__(self, grid):
            launches.append(grid)
            return flat[grid]

    module._cluster0_kernel_flat = Counted()
    try:
        for x, values, runs_flat in ((x_cl, y, True), (x_cl.contiguous(), y, False), (x_cl, y_cf, False)):
            before = len(launches)
            got = fused(x, gamma, values)
            assert (len(launches) > before) == runs_flat
            assert got.stride() == want(x, values).stride()
            torch.testing.assert_close(got, want(x, values))
        x3, y3 = torch.randn(2, 20, 1, 7).to(memory_format=torch.channels_last), torch.randn(2, 1, 7, 20)
        torch.testing.assert_close(fused(x3, gamma, y3), want(x3, y3))
    finally:
        module._cluster0_kernel_flat = flat
    path = write_model(HEADER + textwrap.dedent(LAYER_SCALE).lstrip("\n"))
    report = analyze_file(path, AnalyzeOptions(input_shapes=["3,20,5,9", "3,5,9,20"], dtypes=["float32"] * 2))
    assert report.models[0].clusters[0].kernel.strategy == "elementwise-flat/tile/across"


def test_short_rows_of_an_odd_width_run_as_one_row_where_every_layout_allows(write_model):
    """ConvNeXt's layer scale over 9-wide rows: where every tensor lays height and width out as one
    run of memory, the kernel runs on views that make them one 45-wide row, and the result has the
    shape and layout eager gives.  Where one does not (a gap along the width), it runs as it is."""
    import torch

    fused = _kernel_module(write_model, LAYER_SCALE, [("3,20,5,9", "float32"), ("3,5,9,20", "float32")])
    module = __import__(fused.__module__)
    gamma = torch.rand(20)
    layouts = ((0, (0, 1, 2, 3)), (1, (1,)), (2, (0, 2, 3, 1)))

    def want(x, y):
        return x + (gamma * y).permute(0, 3, 1, 2)

    x, y = torch.randn(3, 20, 5, 9), torch.randn(3, 5, 9, 20)
    views = module._merged_row_end((x, gamma, y), layouts, 4)
    assert [tuple(v.shape) for v in views] == [(3, 20, 1, 45), (20,), (3, 1, 45, 20)]
    got = fused(x, gamma, y)
    assert got.shape == want(x, y).shape and got.stride() == want(x, y).stride()
    torch.testing.assert_close(got, want(x, y))
    # Both channels-last: height and width are still one run in each.
    x_cl = x.to(memory_format=torch.channels_last)
    assert module._merged_row_end((x_cl, gamma, y), layouts, 4) is not None
    torch.testing.assert_close(fused(x_cl, gamma, y), want(x_cl, y))
    # The values a slice of a wider tensor: a gap after each row of width, so no merge.
    y_gap = torch.randn(3, 5, 12, 20)[:, :, :9]
    assert module._merged_row_end((x, gamma, y_gap), layouts, 4) is None
    torch.testing.assert_close(fused(x, gamma, y_gap), want(x, y_gap))
    # A scale that varies along the width only (broadcast along height) cannot follow a merge.
    assert (
        module._merged_row_end((x, torch.rand(1, 9), y), ((0, (0, 1, 2, 3)), (1, (2, 3)), (2, (0, 2, 3, 1))), 4) is None
    )
    # Under autograd and torch.compile the merged launch gives the same values and gradients.
    xg, yg = x.clone().requires_grad_(), y.clone().requires_grad_()
    out = torch.compile(fused, fullgraph=True)(xg, gamma, yg)
    upstream = torch.randn_like(out)
    out.backward(upstream)
    torch.testing.assert_close(out, want(x, y))
    torch.testing.assert_close(yg.grad, (upstream.permute(0, 2, 3, 1) * gamma))


def test_a_rotary_embedding_of_an_odd_head_width_keeps_its_rows(write_model):
    """RoPE over 24-wide heads reads its rows' halves by offset along the width: the rows stay as
    they are (merged with the positions they would mix the halves of neighbouring rows)."""
    import torch

    rope = ROPE.replace("16:", "12:").replace(":16", ":12")
    fused = _kernel_module(write_model, rope, [("2,4,8,24", "float32"), ("8,24", "float32"), ("8,24", "float32")])
    q, cos, sin = torch.randn(2, 4, 8, 24), torch.randn(8, 24), torch.randn(8, 24)
    want = q * cos + torch.cat((-q[..., 12:], q[..., :12]), dim=-1) * sin
    torch.testing.assert_close(fused(q, cos, q[..., 12:], q[..., :12], sin), want)


PARTIAL_ROPE = """
    def rotate_half(x):
        return torch.cat((-x[..., x.shape[-1] // 2 :], x[..., : x.shape[-1] // 2]), dim=-1)


    class M(nn.Module):
        def forward(self, q, cos, sin):
            rot, rest = q[..., :24], q[..., 24:]
            return torch.cat(((rot * cos) + (rotate_half(rot) * sin), rest), dim=-1)
    """


def _partial_rope(q, cos, sin):
    import torch

    rot, rest = q[..., :24], q[..., 24:]
    return torch.cat((rot * cos + torch.cat((-rot[..., 12:], rot[..., :12]), dim=-1) * sin, rest), dim=-1)


def test_heads_of_an_odd_width_from_a_fused_projection_are_read_as_one_row_each_position(write_model, monkeypatch):
    """Phi-3's RoPE: 24-wide heads (no power of two, so a tile of single rows leaves lanes idle) of
    q sliced from a fused qkv projection, where each position's heads lie one after another.  The
    wide kernel reads them as one row a position; the result is eager's, in eager's layout (a `cat`'s:
    contiguous).  A q whose heads do not lie so (one row a head, positions apart) runs the tile
    kernel, and gives eager's values too."""
    import torch

    fused = _kernel_module(
        write_model, PARTIAL_ROPE, [("2,4,8,24", "float32"), ("8,24", "float32"), ("8,24", "float32")]
    )
    module = sys.modules[fused.__module__]
    launched = []
    for kind in ("wide", "tile"):
        kernel = getattr(module, f"_cluster0_kernel_{kind}")

        class Recorded:
            def __getitem__(self, grid, kind=kind, kernel=kernel):
                launched.append(kind)
                return kernel[grid]

        monkeypatch.setattr(module, f"_cluster0_kernel_{kind}", Recorded())
    gen = torch.Generator().manual_seed(4)
    cos, sin = torch.randn(8, 24, generator=gen), torch.randn(8, 24, generator=gen)
    q = torch.randn(2, 8, 3 * 4 * 24, generator=gen)[..., : 4 * 24].view(2, 8, 4, 24).transpose(1, 2)
    got, want = fused(q, cos, sin), _partial_rope(q, cos, sin)
    assert launched == ["wide"] and got.stride() == want.stride() == (768, 192, 24, 1)
    torch.testing.assert_close(got, want)

    launched.clear()
    apart = torch.randn(2, 4, 24, 9, generator=gen)[..., :8].transpose(2, 3)  # each head's rows 9 apart
    torch.testing.assert_close(fused(apart, cos, sin), _partial_rope(apart, cos, sin))
    assert launched == ["tile"]


def test_a_call_wanting_no_gradient_launches_directly_and_torch_compile_still_sees_one_op(write_model):
    """With no gradient wanted, the public function runs the launcher itself, not through the
    dispatcher; a torch.compile of the same call (fullgraph: any break raises) still captures the
    kernel as its op, and both give eager's values."""
    import torch

    fused = _kernel_module(write_model, CONV_BIAS_GELU, [("2,8,30", "float32")])
    module = sys.modules[fused.__module__]
    x, bias = torch.randn(2, 8, 30), torch.rand(8)
    want = torch.nn.functional.gelu(x + bias[:, None])
    through_op = []
    op = module._cluster0_op

    def recording(*args):
        through_op.append(True)
        return op(*args)

    module._cluster0_call = module._kernel_call(recording, module._cluster0_launch)
    with torch.no_grad():
        torch.testing.assert_close(fused(x, bias[:, None]), want)
        assert through_op == []
        torch._dynamo.reset()
        compiled = torch.compile(fused, fullgraph=True)
        torch.testing.assert_close(compiled(x, bias[:, None]), want)
    assert through_op  # traced through the op
    torch._dynamo.reset()


POSITIONAL_LOOKUPS = """
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.words = nn.Embedding(50, 75)
            self.places = nn.Embedding(16, 75)

        def forward(self, ids):
            return self.words(ids) + self.places(torch.arange(ids.shape[1]))
    """


def test_lookups_of_an_odd_width_keep_their_rows(write_model):
    """Two embeddings added, 75 wide: each row of the result is a table row picked by a token id, so
    its positions and its width are never merged into one long row (a lookup follows the ids, which
    change from row to row), and the rows read are the ids' own."""
    import torch

    fused = _kernel_module(write_model, POSITIONAL_LOOKUPS, [("3,7", "int64")])
    assert "= _merged_row_end(" not in Path(sys.modules[fused.__module__].__file__).read_text(encoding="utf-8")
    words, places = torch.nn.Embedding(50, 75), torch.nn.Embedding(16, 75)
    ids = torch.randint(0, 50, (3, 7))
    with torch.no_grad():
        got = fused(ids, words.weight, torch.arange(7), places.weight)
    torch.testing.assert_close(got, words.weight[ids] + places.weight[torch.arange(7)])


def test_a_vocabulary_s_rows_stream_and_a_position_table_stays_in_cache(write_model):
    """A table read at token ids with more rows than the lookups (a vocabulary: each row read about
    once) is read plainly, where a table with fewer (positions, read again for every sequence) is
    kept in L2 (`evict_last`): holding the vocabulary's rows there only pushed out what streams past."""
    import re

    fused = _kernel_module(write_model, POSITIONAL_LOOKUPS, [("3,7", "int64")])
    text = Path(sys.modules[fused.__module__].__file__).read_text(encoding="utf-8")
    words, places = (re.findall(rf"tl\.load\(in{k}_ptr .*", text) for k in (1, 3))
    assert words and places
    assert not any("evict_last" in line for line in words)
    assert all("evict_last" in line for line in places)


_COMPILE_FOR_SM90 = """
import importlib.util, json, sys
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile

path, name, constants, asm = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
spec = importlib.util.spec_from_file_location("kernels", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
kernel = getattr(module, name)
names = kernel.arg_names
signature = {
    n: "constexpr" if n in constants else "*bf16" if n.endswith("_ptr") else "i64" if n[0] == "q" else "i32"
    for n in names
}
# Every tensor starts on a 16-byte boundary, as torch allocates them and as triton marks them.
aligned = {(names.index(n),): [["tt.divisibility", 16]] for n in names if n.endswith("_ptr")}
try:
    compiled = compile(
        ASTSource(kernel, signature, constexprs={(names.index(n),): v for n, v in constants.items()}, attrs=aligned),
        target=GPUTarget("cuda", 90, 32),
    )
except RuntimeError as exc:  # no ptxas for this machine
    print(exc, file=sys.stderr)
    sys.exit(3)
print(compiled.asm[asm])
"""


def _ttgir_for_sm90(path: str, kernel: str, **constants) -> str:
    """The TTGIR of `kernel` in the kernel module at `path`, compiled for sm_90 with `constants`."""
    return _compiled_for_sm90(path, kernel, "ttgir", constants)


def _compiled_for_sm90(path: str, kernel: str, asm: str, constants: dict) -> str:
    """The `asm` ("ttgir", "ptx") of `kernel` in the kernel module at `path`, compiled for sm_90."""
    # Compiled in a process of its own: under TRITON_INTERPRET (as the tests run) triton.jit makes
    # interpreter functions, which do not compile.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", _COMPILE_FOR_SM90, path, kernel, json.dumps(constants), asm],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if run.returncode == 3:
        pytest.skip(f"cannot compile for sm_90 here: {run.stderr.strip()[-300:]}")
    assert run.returncode == 0, run.stderr
    return run.stdout


def _layouts_of_memory_ops(ttgir: str) -> tuple[list[list[int]], list[list[int]]]:
    """The `order` of the blocked layout of each `tt.load` and `tt.store` in a kernel's TTGIR:
    [1, 0] puts a warp's threads along the columns, [0, 1] down the rows."""
    import re

    orders = {
        m[1]: [int(v) for v in m[2].split(",")] for m in re.finditer(r"^#(\w+) = .*order = \[([\d, ]+)\]", ttgir, re.M)
    }

    def of(op: str) -> list[list[int]]:
        return [orders[m[1]] for m in re.finditer(rf"{op} .*tensor<\d+x\d+x!tt\.ptr<\w+>, #(\w+)>", ttgir)]

    return of("tt.load"), of("tt.store")


GROUP_NORM_SILU = """
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.GroupNorm(4, 16)

        def forward(self, x):
            return F.silu(self.norm(x))
"""


def test_the_across_loop_kernel_reads_each_layout_along_its_memory(write_model):
    """Compiled for an H100/H200 (sm_90, no GPU needed): a GroupNorm backward's sums over each
    (sample, channel)'s pixels, with a channels-last gradient (a convolution's) beside a channels-first
    input, load the gradient with a warp's threads down the tile's rows (its channels) and the input
    with them along the columns (its pixels), both in runs of memory; the whole-row kernel reads the
    gradient along the row, one element a pixel, 16 channels apart."""
    pytest.importorskip("triton.backends.nvidia")
    fused = _kernel_module(write_model, GROUP_NORM_SILU, [("2,16,33,33", "float32")])
    path = sys.modules[fused.__module__].__file__
    # The gradient is the first input, channels-last (its channel stride 1); x the second, channels-first.
    tile = dict(BLOCK_R=32, BLOCK_C=64, INDEX_64=False, ALIGN=1, CONTIG=False, in0_s1=1, in1_s3=1)
    loads, _ = _layouts_of_memory_ops(_ttgir_for_sm90(path, "_cluster0_backward_sums_kernel_across_loop", **tile))
    assert [0, 1] in loads and [1, 0] in loads, loads
    whole = dict(tile, BLOCK_R=1, BLOCK_C=2048)
    loads, _ = _layouts_of_memory_ops(_ttgir_for_sm90(path, "_cluster0_backward_sums_kernel_block", **whole))
    assert [0, 1] not in loads, loads


def test_the_across_kernel_reads_a_row_laid_out_input_down_its_rows_and_writes_along_columns(write_model):
    """Compiled for an H100/H200 (sm_90, no GPU needed): in the across kernel a warp reads the
    channels-last input down the tile's rows, where it is contiguous, and reads the residual and
    writes the output along the columns; the tile kernel would read that input across its rows,
    one element per row."""
    pytest.importorskip("triton.backends.nvidia")
    fused = _kernel_module(write_model, LAYER_SCALE, [("3,20,5,9", "float32"), ("3,5,9,20", "float32")])
    path = sys.modules[fused.__module__].__file__

    # y is the third input: its channel stride, x's and the output's column stride are 1 at call time.
    tile = dict(BLOCK_R=64, BLOCK_C=64, INDEX_64=False, in0_s3=1, in2_s3=1)
    loads, stores = _layouts_of_memory_ops(_ttgir_for_sm90(path, "_cluster0_kernel_across", FAST=1, **tile))
    assert [0, 1] in loads and [1, 0] in loads and stores == [[1, 0]]
    loads, _ = _layouts_of_memory_ops(_ttgir_for_sm90(path, "_cluster0_kernel_tile", CONTIG=False, **tile))
    assert [0, 1] not in loads


CONV_BIAS_GELU = """
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = nn.Parameter(torch.rand(8))

        def forward(self, x):
            return F.gelu(x + self.bias[:, None])
    """


def test_rows_of_a_width_that_is_not_a_multiple_of_16_move_in_vectors(write_model):
    """Compiled for sm_90: a convolution's bias + GELU over [batch, channels, 3000] (Whisper's first
    layer) loads and stores each thread's eight bf16 elements as one 16-byte vector.  Its rows start on
    16-byte boundaries, which triton cannot see in a width of 3000 unless the kernel says so: told
    nothing (ALIGN 1), it moves them one element at a time."""
    pytest.importorskip("triton.backends.nvidia")
    fused = _kernel_module(write_model, CONV_BIAS_GELU, [("2,8,3000", "bfloat16")])
    path = sys.modules[fused.__module__].__file__

    tile = dict(BLOCK_R=1, BLOCK_C=1024, INDEX_64=False, CONTIG=True)
    told = Counter(
        re.findall(
            r"(?:ld|st)\.global\.\S+", _compiled_for_sm90(path, "_cluster0_kernel_tile", "ptx", tile | {"ALIGN": 8})
        )
    )
    assert told["ld.global.v4.b32"] == 1 and told["st.global.v4.b32"] == 1
    assert not told["ld.global.b16"] and not told["st.global.b16"]
    untold = _compiled_for_sm90(path, "_cluster0_kernel_tile", "ptx", tile | {"ALIGN": 1})
    assert "st.global.b16" in untold and "st.global.v4.b32" not in untold


def test_a_tile_that_reads_one_value_an_element_gives_each_thread_32_bytes(write_model):
    """A convolution's bias + GELU reads one value an element (the bias is one a row): at Whisper's
    [8, 768, 3000] in bf16 its tiles are 2 x 1024 over 4 warps, each thread moving two 16-byte
    vectors each way (compiled for sm_90).  A RoPE reads five (q, its two shifted halves, cos and
    sin) and keeps 8 x 128 tiles, 16 bytes a thread."""
    pytest.importorskip("triton.backends.nvidia")
    fused = _kernel_module(write_model, CONV_BIAS_GELU, [("2,8,3000", "bfloat16")])
    module = sys.modules[fused.__module__]
    assert re.search(r"_pointwise_tile\(R, C, \d, 1\)", Path(module.__file__).read_text(encoding="utf-8"))

    tile = dict(BLOCK_R=2, BLOCK_C=1024, INDEX_64=False, CONTIG=True, ALIGN=8)
    ptx = _compiled_for_sm90(module.__file__, "_cluster0_kernel_tile", "ptx", tile)
    moved = Counter(re.findall(r"(?:ld|st)\.global\.\S+", ptx))
    assert moved["ld.global.v4.b32"] == 2 and moved["st.global.v4.b32"] == 2

    rope = _kernel_module(write_model, ROPE, [("2,4,8,32", "bfloat16"), ("8,32", "bfloat16"), ("8,32", "bfloat16")])
    rope_module = sys.modules[rope.__module__]
    assert re.search(r"_pointwise_tile\(R, C, \d, 5\)", Path(rope_module.__file__).read_text(encoding="utf-8"))


EMBEDDINGS_NORM = """
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.words = nn.Embedding(50, 75)
            self.norm = nn.LayerNorm(75)

        def forward(self, ids):
            return self.norm(self.words(ids) + 1.0)
    """

SOFTMAX_ROWS = """
    class M(nn.Module):
        def forward(self, x):
            return torch.softmax(x * 0.5, dim=-1)
    """


def test_a_width_the_weights_fix_is_a_constant_of_the_kernel_and_a_sequences_is_not(write_model):
    """An embedding's LayerNorm is as wide as its weight, whatever the batch: its kernels take the
    width as a constant (compiled once, every size folded in, as torch.compile does), and, since
    each row starts with a lookup, run one warp a row.  A softmax over scores is as wide as the
    sequence, which changes from call to call: its kernels take the width as an argument and are
    not compiled again for each length.  Both match eager at odd widths."""
    import torch

    fused = _kernel_module(write_model, EMBEDDINGS_NORM, [("3,7", "int64")])
    module = sys.modules[fused.__module__]
    assert "WIDTH" in module._cluster0_kernel_block.arg_names
    assert re.search(r"_row_tile\(R, C, \d, gathers=True\)", Path(module.__file__).read_text(encoding="utf-8"))
    words, norm = torch.nn.Embedding(50, 75), torch.nn.LayerNorm(75)
    ids = torch.randint(0, 50, (3, 7))
    want = torch.nn.functional.layer_norm(words.weight[ids] + 1.0, (75,), norm.weight, norm.bias, norm.eps)
    with torch.no_grad():
        got = fused(ids, words.weight, norm.weight, norm.bias, norm.eps)
    torch.testing.assert_close(got[0] if isinstance(got, tuple) else got, want)

    fused = _kernel_module(write_model, SOFTMAX_ROWS, [("4,33", "float32")])
    module = sys.modules[fused.__module__]
    assert "WIDTH" not in module._cluster0_kernel_block.arg_names
    for width in (33, 50):
        x = torch.randn(4, width)
        torch.testing.assert_close(fused(x), torch.softmax(x * 0.5, dim=-1))


def test_the_across_kernel_writes_a_channels_last_result_down_its_rows(write_model):
    """Compiled for sm_90: with the residual channels-last too (its channel stride, the values' and the
    result's are 1 at call time, as triton specialises them), every load and the store run a warp's
    threads down the tile's rows, along memory: nothing moves between layouts on chip."""
    pytest.importorskip("triton.backends.nvidia")
    fused = _kernel_module(write_model, LAYER_SCALE, [("3,20,5,9", "float32"), ("3,5,9,20", "float32")])
    path = sys.modules[fused.__module__].__file__
    tile = dict(BLOCK_R=64, BLOCK_C=64, INDEX_64=False, in0_s1=1, in2_s3=1, o1=1)
    loads, stores = _layouts_of_memory_ops(_ttgir_for_sm90(path, "_cluster0_kernel_across", FAST=1, **tile))
    assert loads and all(order == [0, 1] for order in loads) and stores == [[0, 1]]


def test_the_across_row_kernel_reads_a_norms_permuted_input_down_its_rows(write_model, reads_across_at_any_size):
    """A LayerNorm over the channels of an NCHW tensor seen as NHWC: the across row kernel runs the
    width (where the input is contiguous) down its tiles' rows, so a warp reads the input in runs
    of memory; the block kernel's rows come from divisions and it reads one element a row.  Its
    numerics match eager on that layout, and on a contiguous input the block kernel still runs."""
    import torch
    import torch.nn.functional as F

    pytest.importorskip("triton.backends.nvidia")
    source = """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(20, eps=1e-6)

            def forward(self, y):
                return self.norm(y.permute(0, 2, 3, 1)) * 2
        """
    fused = _kernel_module(write_model, source, [("3,20,5,9", "float32")])
    module = sys.modules[fused.__module__]
    weight, bias = torch.randn(20), torch.randn(20)
    y = torch.randn(3, 20, 5, 9).permute(0, 2, 3, 1)
    assert module._down_rows(((y, (0, 1, 2, 3)),), tuple(y.shape), 3)
    torch.testing.assert_close(fused(y, weight, bias, 1e-6), F.layer_norm(y, (20,), weight, bias, 1e-6) * 2)
    y_nhwc = torch.randn(3, 5, 9, 20)
    assert not module._down_rows(((y_nhwc, (0, 1, 2, 3)),), tuple(y_nhwc.shape), 3)
    torch.testing.assert_close(fused(y_nhwc, weight, bias, 1e-6), F.layer_norm(y_nhwc, (20,), weight, bias, 1e-6) * 2)

    path = module.__file__
    constants = dict(BLOCK_R=64, BLOCK_C=32, INDEX_64=False, CONTIG=False, in0_s2=1)
    loads, stores = _layouts_of_memory_ops(_ttgir_for_sm90(path, "_cluster0_kernel_across", **constants))
    assert [0, 1] in loads and stores == [[1, 0]]
    loads, _ = _layouts_of_memory_ops(_ttgir_for_sm90(path, "_cluster0_kernel_block", **constants))
    assert [0, 1] not in loads


def test_a_norm_backward_reads_its_rows_before_it_reduces_them(write_model):
    """Compiled for an H100/H200 (sm_90, no GPU needed): the whole-row backward of a LayerNorm of a
    residual sum loads the gradient, both residual inputs, the weight and the row statistics the
    forward kept before its first row reduction.  A reduction across warps is a barrier that loads
    do not cross, so a load after it would wait for it: two trips to memory a block of rows."""
    import re

    pytest.importorskip("triton.backends.nvidia")
    source = """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(512)

            def forward(self, x, y):
                return self.norm(x + y)
        """
    fused = _kernel_module(write_model, source, [("4,512", "float32"), ("4,512", "float32")])
    path = sys.modules[fused.__module__].__file__
    constants = dict(BLOCK_R=4, BLOCK_C=512, INDEX_64=False, CONTIG=True)
    ttgir = _ttgir_for_sm90(path, "_cluster0_backward_kernel_block", **constants)
    loads = [m.start() for m in re.finditer(r"\btt\.load\b", ttgir)]
    reductions = [m.start() for m in re.finditer(r"\btt\.reduce\b", ttgir)]
    assert len(loads) == 6, len(loads)  # the gradient, x, y, the weight, the row mean and deviation
    assert reductions and max(loads) < min(reductions)


def test_batch_norm_kernel_follows_a_channels_last_input(write_model):
    """Eval-mode batch norm -> relu on a channels-last activation (a ResNet run in channels-last),
    where the channel is the fastest dim: the kernel reads each element's running statistics,
    weight and bias at its channel whatever the input's strides.  (The tile kernel keeps only
    layouts whose last dim is contiguous, so its channels-last result is a contiguous tensor.)"""
    import torch
    import torch.nn.functional as F

    source = """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.bn = nn.BatchNorm2d(8)

            def forward(self, x):
                return F.relu(self.bn(x))
        """
    fused = _kernel_module(write_model, source, [("2,8,5,7", "float32")])
    mean, var = torch.randn(8), torch.rand(8) + 0.25
    weight, bias = torch.randn(8), torch.randn(8)
    x = torch.randn(2, 8, 5, 7)
    want = F.relu(F.batch_norm(x, mean, var, weight, bias, training=False, eps=1e-5))
    torch.testing.assert_close(fused(x, mean, var, weight, bias), want)
    x_cl = x.to(memory_format=torch.channels_last)
    assert x_cl.stride() == (280, 1, 56, 8)
    torch.testing.assert_close(fused(x_cl, mean, var, weight, bias), want)
    # One image at other sizes: sizes and strides are read at call time.
    small = torch.randn(1, 8, 3, 4).to(memory_format=torch.channels_last)
    want = F.relu(F.batch_norm(small, mean, var, weight, bias, training=False, eps=1e-5))
    torch.testing.assert_close(fused(small, mean, var, weight, bias), want)


def test_rows_wider_than_a_tile_are_covered_by_several_column_blocks(write_model):
    """A broadcast operand needs the 2-D tile kernel; rows longer than one tile are split over
    several programs, each of which must find its own column block."""
    import torch

    fused = _kernel_module(
        write_model,
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.randn(2500))

            def forward(self, x):
                return torch.relu(x * self.w) + 1
        """,
        [("3,2500", "float32")],
    )
    x, w = torch.randn(3, 2500), torch.randn(2500)
    torch.testing.assert_close(fused(x, w), torch.relu(x * w) + 1)


LOOPED_ROWS = [
    pytest.param(
        """
        class M(nn.Module):
            def forward(self, x):
                return F.softmax(x * 2.0, dim=-1)
        """,
        lambda F, x, g: F.softmax(x * 2.0, dim=-1),
        id="softmax-of-a-width-read-at-call-time",
    ),
    pytest.param(
        """
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = nn.Parameter(torch.randn(WIDTH))

            def forward(self, x):
                h = x.float()
                return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        """,
        lambda F, x, g: x * (x.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * g,
        id="rmsnorm-of-a-width-its-weight-fixes",
    ),
]


def test_the_installed_interpreter_runs_a_loop_over_a_run_time_bound():
    """What `fuselens validate --interpret` asks before it runs a kernel: whether this Triton's
    interpreter runs a loop whose bound is a kernel argument, as the looped kernels' are (Triton 3.6's
    does with NumPy before 2.4 only); the reason, when it cannot, is the validation's problem."""
    from fuselens.validate.interpreter import loop_problem

    assert loop_problem() is None


class _Launches:
    """A kernel that records the grid of each launch."""

    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize("source, eager", LOOPED_ROWS)
def test_rows_wider_than_the_whole_row_kernel_run_in_the_looped_kernel(write_model, monkeypatch, source, eager):
    """A softmax and an RMSNorm over rows wider than the whole-row kernel holds run the looped kernel,
    in the interpreter of whichever Triton is installed (the README says how to run these tests under
    another): it walks each row in column blocks up to the row's width, the last block ragged, and
    gives eager's rows."""
    import torch
    import torch.nn.functional as F

    from fuselens.codegen.runtime.tiles import LOOP_BLOCK, MAX_BLOCK_ROW

    width = MAX_BLOCK_ROW + LOOP_BLOCK + 3  # three column blocks a pass
    source = source.replace("WIDTH", str(width))
    fused = _kernel_module(write_model, source, [(f"2,{width}", "float32")])
    module = sys.modules[fused.__module__]
    looped = _Launches(getattr(module, f"_{fused.__name__}_kernel_loop"))
    monkeypatch.setattr(module, f"_{fused.__name__}_kernel_loop", looped)
    gen = torch.Generator().manual_seed(0)
    x, g = torch.randn(2, width, generator=gen), torch.randn(width, generator=gen)
    torch.testing.assert_close(fused(x) if "weight" not in source else fused(x, g), eager(F, x, g))
    assert looped.grids == [(2,)]  # it ran, one program a row


def test_a_kernel_asks_for_64_bit_offsets_before_every_launch(write_model):
    """A 10-column slice of a 2**16 x 2**16 tensor has few elements but offsets past 2**31: the
    launcher asks `_needs_int64` (`tests/test_codegen_runtime.py`) before every launch and switches
    the kernel to 64-bit index arithmetic, or its loads would wrap around."""
    import torch

    fused = _kernel_module(
        write_model,
        """
        class M(nn.Module):
            def forward(self, x):
                return torch.relu(x * 2) + 1
        """,
        [("64,10", "float32")],
    )
    assert "index_64 = _needs_int64(x, out0)" in Path(sys.modules[fused.__module__].__file__).read_text(
        encoding="utf-8"
    )
    x = torch.randn(64, 10)
    torch.testing.assert_close(fused(x), torch.relu(x * 2) + 1)


def test_division_by_sizes_read_at_call_time_is_exact_for_every_32_bit_offset(tmp_path):
    """Coordinates divide offsets by sizes only known at call time; the kernels do it with a
    multiply-high by a magic number the launcher computes.  It must agree with // for every
    divisor and every offset below 2**31, the boundary cases above all."""
    import importlib.util

    import torch

    from fuselens.codegen.module import render_module, section

    probe = (
        "@triton.jit\n"
        "def _probe(n_ptr, out_ptr, d, q, N: tl.constexpr):\n"
        "    offs = tl.arange(0, N)\n"
        "    tl.store(out_ptr + offs, _div(tl.load(n_ptr + offs), d, q, False))\n"
    )
    path = tmp_path / "division_probe.py"
    path.write_text(render_module("probe.py", {"probe": section("probe", "division", probe)}))
    spec = importlib.util.spec_from_file_location("division_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    generator = torch.Generator().manual_seed(0)
    top = 2**31 - 1
    for d in [1, 2, 3, 7, 64, 100, 768, 1000, 4095, 2**16 + 1, 2**20 - 3, 2**30, 2**30 + 1, top - 1, top]:
        edges = [0, 1, d - 1, d, d + 1, 2 * d - 1, top // d * d - 1, top // d * d, top - 1, top]
        n = torch.tensor(
            [e for e in edges if 0 <= e <= top] + torch.randint(0, top, (64,), generator=generator).tolist(),
            dtype=torch.int32,
        )[:64]
        out = torch.empty_like(n)
        module._probe[(1,)](n, out, d, module._magic(d)[0], N=64)
        assert torch.equal(out, n // d), d
