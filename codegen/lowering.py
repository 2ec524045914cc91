"""Per-op lowering: one canonical op -> one Triton expression.

Values are computed in float32 (loads of fp16/bf16 convert right away: that is also what
makes the Triton interpreter exact), integers in their own type, predicates as int1.
Only functions that exist in Triton >= 3.0 *and* its CPU interpreter are used; the few
missing ones (tanh, pow) are small `@triton.jit` helpers emitted once per module.

`lower(op, operands, params, out_kind)` returns the expression text; operands arrive as
`Operand(text, kind)`, already converted to the kind the op computes in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FLOAT, INT, BOOL = "float", "int", "bool"

FLOAT_DTYPES = {"float32", "float16", "bfloat16", "float64"}
INT_DTYPES = {"int64", "int32", "int16", "int8", "uint8"}

TL_DTYPES = {
    "float32": "tl.float32",
    "float16": "tl.float16",
    "bfloat16": "tl.bfloat16",
    "float64": "tl.float64",
    "int64": "tl.int64",
    "int32": "tl.int32",
    "int16": "tl.int16",
    "int8": "tl.int8",
    "uint8": "tl.uint8",
    "bool": "tl.int1",
}

FINFO_MAX = {
    "float32": 3.4028234663852886e38,
    "float16": 65504.0,
    "bfloat16": 3.3895313892515355e38,
    "float64": 1.7976931348623157e308,
}


class LoweringError(Exception):
    """No lowering for this op/parameter combination; the message says which."""


def kind_of(dtype: str) -> str:
    if dtype in FLOAT_DTYPES:
        return FLOAT
    if dtype == "bool":
        return BOOL
    if dtype in INT_DTYPES:
        return INT
    raise LoweringError(f"dtype {dtype} has no Triton lowering here")


@dataclass(frozen=True)
class Operand:
    text: str
    kind: str  # FLOAT | INT | BOOL
    is_scalar: bool = False  # a Python constant rather than a tensor value


def tuple_display(items: list[str]) -> str:
    """A Python tuple display of `items`, with the trailing comma a single item needs."""
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def dtype_tuple(dtypes) -> str:
    """A tuple display of torch dtypes, such as "(torch.int64, torch.bfloat16)": what the module's
    `_kernel_runs` holds a call's tensors' dtypes to."""
    return tuple_display([f"torch.{d}" for d in dtypes])


def literal(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
        text = repr(value)
        return text if ("." in text or "e" in text) else text + ".0"
    raise LoweringError(f"constant {value!r} has no Triton literal")


def convert(operand: Operand, kind: str) -> str:
    """`operand` as a value of `kind`."""
    if operand.kind == kind:
        return operand.text
    if operand.is_scalar:
        if kind == FLOAT:
            return literal(float(operand.text)) if operand.text.lstrip("-").isdigit() else operand.text
        return operand.text
    if kind == FLOAT:
        return f"{operand.text}.to(tl.float32)"
    if kind == BOOL:
        return f"({operand.text} != 0)"
    return f"{operand.text}.to(tl.int64)"


# Helpers a kernel module defines once when any kernel uses them.
HELPERS = {
    "_tanh": """@triton.jit
def _tanh(x):
    # tl has no tanh that also runs in the interpreter; tanh(x) = 2*sigmoid(2x) - 1.
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0
""",
    "_pow": """@triton.jit
def _pow(base, exponent):
    # base ** exponent for float tensors; negative bases need an integral exponent.
    magnitude = tl.exp2(exponent * tl.log2(tl.abs(base)))
    integral = exponent == tl.floor(exponent)
    odd = integral & (tl.abs(exponent - 2.0 * tl.floor(exponent * 0.5)) == 1.0)
    signed = tl.where((base < 0) & odd, -magnitude, magnitude)
    return tl.where((base < 0) & (~integral), float("nan"), tl.where(base == 0, tl.where(exponent == 0, 1.0, tl.where(exponent > 0, 0.0, float("inf"))), signed))
""",
    "_div": """@triton.jit
def _div(n, d, q, WIDE: tl.constexpr):
    # n // d for n >= 0.  With 32-bit offsets, q (the launcher's _magic(d)) turns the division
    # into a multiply-high and a shift; 64-bit offsets (WIDE) divide.
    if WIDE:
        out = n // d
    else:
        m = (q >> 5).to(tl.uint32)
        shift = (q & 31).to(tl.uint32)
        out = (tl.umulhi(n.to(tl.uint32) << 1, m) >> shift).to(tl.int32)
    return out
""",
    "_mod": """@triton.jit
def _mod(n, d, q, WIDE: tl.constexpr):
    return n - _div(n, d, q, WIDE) * d
""",
}


def _max(a: str, b: str) -> str:
    # torch's relu, clamp, maximum, ... propagate NaN; tl.maximum/minimum drop it by default.
    return f"tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"


def _min(a: str, b: str) -> str:
    return f"tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"


UNARY_FLOAT = {
    "neg": "-{a}",
    "abs": "tl.abs({a})",
    "relu": _max("{a}", "0.0"),
    "sigmoid": "tl.sigmoid({a})",
    "silu": "{a} * tl.sigmoid({a})",
    "tanh": "_tanh({a})",
    "exp": "tl.exp({a})",
    "exp2": "tl.exp2({a})",
    "log": "tl.log({a})",
    "log2": "tl.log2({a})",
    "log10": "tl.log({a}) * 0.4342944819032518",
    "log1p": "tl.log(1.0 + {a})",
    "expm1": "tl.exp({a}) - 1.0",
    "sqrt": "tl.sqrt({a})",
    "rsqrt": "tl.rsqrt({a})",
    "reciprocal": "1.0 / {a}",
    "sin": "tl.sin({a})",
    "cos": "tl.cos({a})",
    "erf": "tl.erf({a})",
    "floor": "tl.floor({a})",
    "ceil": "tl.ceil({a})",
    "trunc": "tl.where({a} >= 0, tl.floor({a}), tl.ceil({a}))",
    "sign": "tl.where({a} > 0, 1.0, tl.where({a} < 0, -1.0, 0.0))",
    "square": "{a} * {a}",
    "hardsigmoid": _min(_max("{a} / 6.0 + 0.5", "0.0"), "1.0"),
    "hardswish": "{a} * tl.minimum(tl.maximum({a} + 3.0, 0.0), 6.0) / 6.0",
    "mish": "{a} * _tanh(tl.where({a} > 20.0, {a}, tl.log(1.0 + tl.exp({a}))))",
    "logsigmoid": "tl.minimum({a}, 0.0) - tl.log(1.0 + tl.exp(-tl.abs({a})))",
    "softsign": "{a} / (1.0 + tl.abs({a}))",
    "selu": "1.0507009873554805 * tl.where({a} > 0, {a}, 1.6732632423543772 * (tl.exp({a}) - 1.0))",
    "copy": "{a}",
}

PREDICATES = {
    "isnan": "{a} != {a}",
    "isinf": "tl.abs({a}) == float('inf')",
    "isfinite": "({a} == {a}) & (tl.abs({a}) != float('inf'))",
}

COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def helpers_used(text: str) -> list[str]:
    used = [name for name in HELPERS if f"{name}(" in text]
    for name in list(used):  # and the helpers those call
        body = HELPERS[name].split("\n", 2)[2]  # past the decorator and the def line
        used += [h for h in HELPERS if h not in used and f"{h}(" in body]
    return used


def operand_kind(op: str, operand_kinds: list[str], out_kind: str) -> str:
    """The kind an op computes in, given its operands and its output."""
    if op in COMPARISONS:
        kinds = set(operand_kinds)
        return FLOAT if FLOAT in kinds else INT if INT in kinds else BOOL
    if op in PREDICATES:
        return FLOAT
    if op in ("logical_and", "logical_or", "logical_xor", "logical_not"):
        return BOOL
    if op in ("where", "masked_fill"):
        return out_kind
    if op == "cast":
        return operand_kinds[0]
    return out_kind


def lower(op: str, operands: list[Operand], params: dict, out_kind: str, out_dtype: str) -> str:
    a = operands[0].text if operands else ""
    if op in UNARY_FLOAT:
        _need(out_kind == FLOAT or op in ("neg", "abs", "copy", "square"), op, "float")
        return UNARY_FLOAT[op].format(a=a)
    if op in PREDICATES:
        return PREDICATES[op].format(a=a)
    if op == "gelu":
        if params.get("approximate", "none") == "tanh":
            return f"0.5 * {a} * (1.0 + _tanh(0.7978845608028654 * ({a} + 0.044715 * {a} * {a} * {a})))"
        return f"0.5 * {a} * (1.0 + tl.erf({a} * 0.7071067811865476))"
    if op == "softplus":
        beta, threshold = float(params.get("beta", 1.0)), float(params.get("threshold", 20.0))
        scaled = f"({a} * {literal(beta)})" if beta != 1.0 else a
        soft = f"tl.log(1.0 + tl.exp({scaled}))" + (f" / {literal(beta)}" if beta != 1.0 else "")
        return f"tl.where({scaled} > {literal(threshold)}, {a}, {soft})"
    if op == "elu":
        alpha = literal(float(params.get("alpha", 1.0)))
        return f"tl.where({a} > 0, {a}, {alpha} * (tl.exp({a}) - 1.0))"
    if op == "celu":
        alpha = literal(float(params.get("alpha", 1.0)))
        return f"tl.where({a} > 0, {a}, {alpha} * (tl.exp({a} / {alpha}) - 1.0))"
    if op == "leaky_relu":
        return f"tl.where({a} > 0, {a}, {a} * {literal(float(params.get('negative_slope', 0.01)))})"
    if op == "hardtanh":
        lo, hi = literal(float(params.get("min_val", -1.0))), literal(float(params.get("max_val", 1.0)))
        return _min(_max(a, lo), hi)
    if op == "clamp":
        out = a
        if params.get("min") is not None:
            out = _max(out, _scalar(params["min"], out_kind))
        if params.get("max") is not None:
            out = _min(out, _scalar(params["max"], out_kind))
        return out
    if op == "nan_to_num":
        big = FINFO_MAX.get(out_dtype, FINFO_MAX["float32"])
        nan = literal(float(params.get("nan") or 0.0))
        pos = literal(float(params["posinf"])) if params.get("posinf") is not None else literal(big)
        neg = literal(float(params["neginf"])) if params.get("neginf") is not None else literal(-big)
        return (
            f"tl.where({a} != {a}, {nan}, tl.where({a} == float('inf'), {pos}, "
            f"tl.where({a} == float('-inf'), {neg}, {a})))"
        )
    if op == "cast":
        return _cast(operands[0], out_dtype)
    if op == "logical_not":
        return f"~{a}" if operands[0].kind == BOOL else f"({a} == 0)"
    if op == "bitwise_not":
        _need(out_kind in (INT, BOOL), op, "integer or bool")
        return f"~{a}"
    if op == "round":
        raise LoweringError("round-half-to-even has no Triton function that also runs in the interpreter")
    if len(operands) >= 2:
        return _lower_multi(op, operands, params, out_kind)
    raise LoweringError(f"`{op}` has no Triton lowering")


def _lower_multi(op: str, operands: list[Operand], params: dict, out_kind: str) -> str:
    a, b = operands[0].text, operands[1].text
    if op == "add":
        alpha = params.get("alpha", 1)
        return f"{a} + {b}" if alpha == 1 else f"{a} + {_scalar(alpha, out_kind)} * {b}"
    if op == "sub":
        alpha = params.get("alpha", 1)
        return f"{a} - {b}" if alpha == 1 else f"{a} - {_scalar(alpha, out_kind)} * {b}"
    if op == "mul":
        return f"{a} * {b}"
    if op == "div":
        mode = params.get("rounding_mode")
        if out_kind == INT:
            _need(mode == "floor" or mode == "trunc", op, "integer division with a rounding mode")
            q = (
                f"({a} // {b})"
                if mode == "trunc"
                else f"tl.where(({a} % {b} != 0) & (({a} < 0) != ({b} < 0)), {a} // {b} - 1, {a} // {b})"
            )
            return q
        if mode == "floor":
            return f"tl.floor({a} / {b})"
        if mode == "trunc":
            q = f"({a} / {b})"
            return f"tl.where({q} >= 0, tl.floor({q}), tl.ceil({q}))"
        return f"{a} / {b}"
    if op == "floor_divide":
        if out_kind == INT:
            return f"tl.where(({a} % {b} != 0) & (({a} < 0) != ({b} < 0)), {a} // {b} - 1, {a} // {b})"
        return f"tl.floor({a} / {b})"
    if op == "remainder":
        if out_kind == INT:
            return f"tl.where(({a} % {b} != 0) & (({a} % {b} < 0) != ({b} < 0)), {a} % {b} + {b}, {a} % {b})"
        return f"{a} - {b} * tl.floor({a} / {b})"
    if op == "fmod":
        if out_kind == INT:
            return f"{a} % {b}"
        q = f"({a} / {b})"
        return f"{a} - {b} * tl.where({q} >= 0, tl.floor({q}), tl.ceil({q}))"
    if op == "pow":
        return _pow(operands[0], operands[1], out_kind)
    if op == "maximum":
        return _max(a, b)
    if op == "minimum":
        return _min(a, b)
    if op in COMPARISONS:
        return f"{a} {COMPARISONS[op]} {b}"
    if op in ("logical_and", "bitwise_and"):
        return f"{a} & {b}"
    if op in ("logical_or", "bitwise_or"):
        return f"{a} | {b}"
    if op in ("logical_xor", "bitwise_xor"):
        return f"{a} ^ {b}"
    if op == "copysign":
        return f"tl.where({b} < 0, -tl.abs({a}), tl.abs({a}))"
    if op == "hypot":
        return f"tl.sqrt({a} * {a} + {b} * {b})"
    if op == "where":
        return f"tl.where({a}, {b}, {operands[2].text})"
    if op == "masked_fill":
        return f"tl.where({b}, {operands[2].text}, {a})"
    if op == "lerp":
        return f"{a} + {operands[2].text} * ({b} - {a})"
    if op == "addcmul":
        return f"{a} + {_scalar(params.get('value', 1), out_kind)} * {b} * {operands[2].text}"
    if op == "addcdiv":
        return f"{a} + {_scalar(params.get('value', 1), out_kind)} * {b} / {operands[2].text}"
    if op == "clamp_tensor":
        out = a
        if operands[1].text != "None":
            out = _max(out, b)
        if len(operands) > 2 and operands[2].text != "None":
            out = _min(out, operands[2].text)
        return out
    raise LoweringError(f"`{op}` has no Triton lowering")


def batch_norm_scale(var: str, weight: str | None, eps: str) -> str:
    """Eval-mode batch norm's per-channel scale, alpha = weight / sqrt(running_var + eps)."""
    alpha = f"tl.rsqrt({var} + {eps})"
    return f"{alpha} * {weight}" if weight is not None else alpha


def batch_norm_apply(x: str, mean: str, alpha: str, bias: str | None) -> str:
    """Eval-mode batch norm as eager computes it: x * alpha + (bias - running_mean * alpha)."""
    return f"{x} * {alpha} + ({bias} - {mean} * {alpha})" if bias is not None else f"{x} * {alpha} - {mean} * {alpha}"


def _pow(base: Operand, exponent: Operand, out_kind: str) -> str:
    a = base.text
    if exponent.is_scalar:
        e = float(exponent.text.replace("float('inf')", "inf")) if "float(" not in exponent.text else None
        if e is not None and e == int(e) and abs(e) <= 8:
            k = int(abs(e))
            if k == 0:
                return "1.0" if out_kind == FLOAT else "1"
            product = " * ".join([a] * k)
            product = f"({product})" if k > 1 else a
            return f"1.0 / {product}" if e < 0 else product
        if e == 0.5:
            return f"tl.sqrt({a})"
        if e == -0.5:
            return f"tl.rsqrt({a})"
        _need(out_kind == FLOAT, "pow", "float")
        # The helper needs both arguments as tensors: a bare constant fails in the interpreter.
        return f"_pow({a}, tl.zeros_like({a}) + {literal(e) if e is not None else exponent.text})"
    if base.is_scalar:
        value = float(base.text) if "float(" not in base.text else None
        _need(out_kind == FLOAT, "pow", "float")
        if value is not None and value > 0:
            return f"tl.exp2({exponent.text} * {literal(math.log2(value))})"
        constant = literal(value) if value is not None else base.text
        # zeros_like, not `0.0 * exponent`: that is NaN where the exponent is infinite.
        return f"_pow(tl.zeros_like({exponent.text}) + {constant}, {exponent.text})"
    _need(out_kind == FLOAT, "pow", "float")
    return f"_pow({a}, {exponent.text})"


def _cast(operand: Operand, out_dtype: str) -> str:
    target = kind_of(out_dtype)
    if target == BOOL:
        return f"({operand.text} != 0)"
    if target == INT:
        return f"{operand.text}.to({TL_DTYPES[out_dtype]})"
    value = convert(operand, FLOAT)
    if out_dtype in ("float16", "bfloat16"):
        # Round to the narrower type exactly as eager does, then keep computing in fp32.
        return f"{value}.to({TL_DTYPES[out_dtype]}).to(tl.float32)"
    return value


def _scalar(value, kind: str) -> str:
    if kind == FLOAT:
        return literal(float(value))
    return literal(int(value)) if not isinstance(value, bool) else literal(value)


def _need(condition: bool, op: str, what: str) -> None:
    if not condition:
        raise LoweringError(f"`{op}` is lowered for {what} values only")


# Reductions, as (combine, identity) for the primitive ones a kernel accumulates.
REDUCE = {
    "sum": ("tl.sum", "0.0"),
    "max": ("tl.max", "float('-inf')"),
    "min": ("tl.min", "float('inf')"),
    "prod": (None, "1.0"),
}
