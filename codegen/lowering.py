"""Per-op lowering: one canonical op -> one Triton expression, as a term (`terms.py`).

Values are computed in float32 (loads of fp16/bf16 convert right away: that is also what
makes the Triton interpreter exact), integers in their own type, predicates as int1.
Only functions that exist in Triton >= 3.0 *and* its CPU interpreter are used; the few
missing ones (tanh, pow) are small `@triton.jit` helpers emitted once per module.

`lower(op, operands, params, out_kind)` returns the expression; operands arrive as
`Operand(term, kind)`, already converted to the kind the op computes in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .terms import NONE, Lit, Name, Term, call, compare, literal, paren

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
    term: Term
    kind: str  # FLOAT | INT | BOOL
    is_scalar: bool = False  # a Python constant rather than a tensor value
    # A constant's value, where `term` is its literal (not the name of a number the kernel is passed).
    number: float | int | bool | None = None

    @property
    def left_out(self) -> bool:
        """An optional operand the call did not pass (a clamp's missing bound)."""
        return self.term == NONE


def tuple_display(items: list[str]) -> str:
    """A Python tuple display of `items`, with the trailing comma a single item needs."""
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def dtype_tuple(dtypes) -> str:
    """A tuple display of torch dtypes, such as "(torch.int64, torch.bfloat16)": what the module's
    `_kernel_runs` holds a call's tensors' dtypes to."""
    return tuple_display([f"torch.{d}" for d in dtypes])


def convert(operand: Operand, kind: str) -> Term:
    """`operand` as a value of `kind`."""
    if operand.kind == kind:
        return operand.term
    if operand.is_scalar:
        number = operand.number
        if kind == FLOAT and number is not None and not isinstance(number, float):
            return Lit(literal(float(number)))  # an integer (or flag) constant computed with as a float
        return operand.term
    if kind == FLOAT:
        return operand.term.to("tl.float32")
    if kind == BOOL:
        return paren(compare(operand.term, "!=", 0))
    return operand.term.to("tl.int64")


# Helpers a kernel module defines once when any kernel uses them.
HELPERS = {
    "_nearest_bfloat16": """@triton.jit
def _nearest_bfloat16(x):
    # x rounded to bfloat16, to nearest (ties to even), in float32: by its bits, which rounds alike on a GPU
    # and in the Triton interpreter (whose conversion to bfloat16 truncates); a NaN stays as it is.
    bits = x.to(tl.int32, bitcast=True)
    nearest = ((bits + 0x7FFF + ((bits >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
    return tl.where(x == x, nearest, x)
""",
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


# torch's relu, clamp, maximum, ... propagate NaN; tl.maximum/minimum drop it by default.
_PROPAGATE = Name("tl.PropagateNan.ALL")


def _max(a: Term | float, b: Term | float) -> Term:
    return call("tl.maximum", a, b, propagate_nan=_PROPAGATE)


def _min(a: Term | float, b: Term | float) -> Term:
    return call("tl.minimum", a, b, propagate_nan=_PROPAGATE)


def _where(condition: Term, a: Term | float, b: Term | float) -> Term:
    return call("tl.where", condition, a, b)


def _tl(function: str, *args: Term | float) -> Term:
    return call(f"tl.{function}", *args)


_INF, _NEG_INF = Lit("float('inf')"), Lit("float('-inf')")


def _trunc(a: Term) -> Term:
    return _where(compare(a, ">=", 0), _tl("floor", a), _tl("ceil", a))


UNARY_FLOAT = {
    "neg": lambda a: -a,
    "abs": lambda a: _tl("abs", a),
    "relu": lambda a: _max(a, 0.0),
    "sigmoid": lambda a: _tl("sigmoid", a),
    "silu": lambda a: a * _tl("sigmoid", a),
    "tanh": lambda a: call("_tanh", a),
    "exp": lambda a: _tl("exp", a),
    "exp2": lambda a: _tl("exp2", a),
    "log": lambda a: _tl("log", a),
    "log2": lambda a: _tl("log2", a),
    "log10": lambda a: _tl("log", a) * 0.4342944819032518,
    "log1p": lambda a: _tl("log", 1.0 + a),
    "expm1": lambda a: _tl("exp", a) - 1.0,
    "sqrt": lambda a: _tl("sqrt", a),
    "rsqrt": lambda a: _tl("rsqrt", a),
    "reciprocal": lambda a: 1.0 / a,
    "sin": lambda a: _tl("sin", a),
    "cos": lambda a: _tl("cos", a),
    "erf": lambda a: _tl("erf", a),
    "floor": lambda a: _tl("floor", a),
    "ceil": lambda a: _tl("ceil", a),
    "trunc": _trunc,
    "sign": lambda a: _where(compare(a, ">", 0), 1.0, _where(compare(a, "<", 0), -1.0, 0.0)),
    "square": lambda a: a * a,
    "hardsigmoid": lambda a: _min(_max(a / 6.0 + 0.5, 0.0), 1.0),
    "hardswish": lambda a: a * _tl("minimum", _tl("maximum", a + 3.0, 0.0), 6.0) / 6.0,
    "mish": lambda a: a * call("_tanh", _where(compare(a, ">", 20.0), a, _tl("log", 1.0 + _tl("exp", a)))),
    "logsigmoid": lambda a: _tl("minimum", a, 0.0) - _tl("log", 1.0 + _tl("exp", -_tl("abs", a))),
    "softsign": lambda a: a / paren(1.0 + _tl("abs", a)),
    "selu": lambda a: (
        1.0507009873554805 * _where(compare(a, ">", 0), a, 1.6732632423543772 * paren(_tl("exp", a) - 1.0))
    ),
    "copy": lambda a: a,
}

PREDICATES = {
    "isnan": lambda a: compare(a, "!=", a),
    "isinf": lambda a: compare(_tl("abs", a), "==", _INF),
    "isfinite": lambda a: paren(compare(a, "==", a)) & paren(compare(_tl("abs", a), "!=", _INF)),
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


def lower(op: str, operands: list[Operand], params: dict, out_kind: str, out_dtype: str) -> Term:
    a = operands[0].term if operands else NONE
    if op in UNARY_FLOAT:
        _need(out_kind == FLOAT or op in ("neg", "abs", "copy", "square"), op, "float")
        return UNARY_FLOAT[op](a)
    if op in PREDICATES:
        return PREDICATES[op](a)
    if op == "gelu":
        if params.get("approximate", "none") == "tanh":
            return 0.5 * a * paren(1.0 + call("_tanh", 0.7978845608028654 * paren(a + 0.044715 * a * a * a)))
        return 0.5 * a * paren(1.0 + _tl("erf", a * 0.7071067811865476))
    if op == "softplus":
        beta, threshold = float(params.get("beta", 1.0)), float(params.get("threshold", 20.0))
        scaled = paren(a * beta) if beta != 1.0 else a
        soft = _tl("log", 1.0 + _tl("exp", scaled))
        return _where(compare(scaled, ">", threshold), a, soft / beta if beta != 1.0 else soft)
    if op == "elu":
        alpha = float(params.get("alpha", 1.0))
        return _where(compare(a, ">", 0), a, alpha * paren(_tl("exp", a) - 1.0))
    if op == "celu":
        alpha = float(params.get("alpha", 1.0))
        return _where(compare(a, ">", 0), a, alpha * paren(_tl("exp", a / alpha) - 1.0))
    if op == "leaky_relu":
        return _where(compare(a, ">", 0), a, a * float(params.get("negative_slope", 0.01)))
    if op == "hardtanh":
        return _min(_max(a, float(params.get("min_val", -1.0))), float(params.get("max_val", 1.0)))
    if op == "clamp":
        out = a
        if params.get("min") is not None:
            out = _max(out, _scalar(params["min"], out_kind))
        if params.get("max") is not None:
            out = _min(out, _scalar(params["max"], out_kind))
        return out
    if op == "nan_to_num":
        big = FINFO_MAX.get(out_dtype, FINFO_MAX["float32"])
        nan = float(params.get("nan") or 0.0)
        pos = float(params["posinf"]) if params.get("posinf") is not None else big
        neg = float(params["neginf"]) if params.get("neginf") is not None else -big
        infinite = _where(compare(a, "==", _INF), pos, _where(compare(a, "==", _NEG_INF), neg, a))
        return _where(compare(a, "!=", a), nan, infinite)
    if op == "cast":
        return _cast(operands[0], out_dtype)
    if op == "logical_not":
        return ~a if operands[0].kind == BOOL else paren(compare(a, "==", 0))
    if op == "bitwise_not":
        _need(out_kind in (INT, BOOL), op, "integer or bool")
        return ~a
    if op == "round":
        raise LoweringError("round-half-to-even has no Triton function that also runs in the interpreter")
    if len(operands) >= 2:
        return _lower_multi(op, operands, params, out_kind)
    raise LoweringError(f"`{op}` has no Triton lowering")


def _floor_quotient(a: Term, b: Term) -> Term:
    """a // b rounded towards -inf for integers (Triton's // truncates)."""
    inexact = paren(compare(a % b, "!=", 0))
    signs_differ = paren(compare(paren(compare(a, "<", 0)), "!=", paren(compare(b, "<", 0))))
    return _where(inexact & signs_differ, a // b - 1, a // b)


def _lower_multi(op: str, operands: list[Operand], params: dict, out_kind: str) -> Term:
    a, b = operands[0].term, operands[1].term
    c = operands[2].term if len(operands) > 2 else NONE
    if op == "add":
        alpha = params.get("alpha", 1)
        return a + b if alpha == 1 else a + _scalar(alpha, out_kind) * b
    if op == "sub":
        alpha = params.get("alpha", 1)
        return a - b if alpha == 1 else a - _scalar(alpha, out_kind) * b
    if op == "mul":
        return a * b
    if op == "div":
        mode = params.get("rounding_mode")
        if out_kind == INT:
            _need(mode == "floor" or mode == "trunc", op, "integer division with a rounding mode")
            return paren(a // b) if mode == "trunc" else _floor_quotient(a, b)
        if mode == "floor":
            return _tl("floor", a / b)
        if mode == "trunc":
            return _trunc(paren(a / b))
        return a / b
    if op == "floor_divide":
        if out_kind == INT:
            return _floor_quotient(a, b)
        return _tl("floor", a / b)
    if op == "remainder":
        if out_kind == INT:
            inexact = paren(compare(a % b, "!=", 0))
            signs_differ = paren(compare(paren(compare(a % b, "<", 0)), "!=", paren(compare(b, "<", 0))))
            return _where(inexact & signs_differ, a % b + b, a % b)
        return a - b * _tl("floor", a / b)
    if op == "fmod":
        if out_kind == INT:
            return a % b
        return a - b * _trunc(paren(a / b))
    if op == "pow":
        return _pow(operands[0], operands[1], out_kind)
    if op == "maximum":
        return _max(a, b)
    if op == "minimum":
        return _min(a, b)
    if op in COMPARISONS:
        return compare(a, COMPARISONS[op], b)
    if op in ("logical_and", "bitwise_and"):
        return a & b
    if op in ("logical_or", "bitwise_or"):
        return a | b
    if op in ("logical_xor", "bitwise_xor"):
        return a ^ b
    if op == "copysign":
        return _where(compare(b, "<", 0), -_tl("abs", a), _tl("abs", a))
    if op == "hypot":
        return _tl("sqrt", a * a + b * b)
    if op == "where":
        return _where(a, b, c)
    if op == "masked_fill":
        return _where(b, c, a)
    if op == "lerp":
        return a + c * paren(b - a)
    if op == "addcmul":
        return a + _scalar(params.get("value", 1), out_kind) * b * c
    if op == "addcdiv":
        return a + _scalar(params.get("value", 1), out_kind) * b / c
    if op == "clamp_tensor":
        out = a
        if not operands[1].left_out:
            out = _max(out, b)
        if len(operands) > 2 and not operands[2].left_out:
            out = _min(out, c)
        return out
    raise LoweringError(f"`{op}` has no Triton lowering")


def batch_norm_scale(var: Term, weight: Term | None, eps: Term) -> Term:
    """Eval-mode batch norm's per-channel scale, alpha = weight / sqrt(running_var + eps)."""
    alpha = _tl("rsqrt", var + eps)
    return alpha * weight if weight is not None else alpha


def batch_norm_apply(x: Term, mean: Term, alpha: Term, bias: Term | None) -> Term:
    """Eval-mode batch norm as eager computes it: x * alpha + (bias - running_mean * alpha)."""
    return x * alpha + paren(bias - mean * alpha) if bias is not None else x * alpha - mean * alpha


def _finite(operand: Operand) -> float | None:
    """A constant operand's value, where it is a finite number."""
    n = operand.number
    return float(n) if n is not None and math.isfinite(n) else None


def _pow(base: Operand, exponent: Operand, out_kind: str) -> Term:
    a = base.term
    if exponent.is_scalar:
        e = _finite(exponent)
        if e is not None and e == int(e) and abs(e) <= 8:
            k = int(abs(e))
            if k == 0:
                return Lit("1.0" if out_kind == FLOAT else "1")
            product = a
            for _ in range(k - 1):
                product = product * a
            if k > 1:
                product = paren(product)
            return 1.0 / product if e < 0 else product
        if e == 0.5:
            return _tl("sqrt", a)
        if e == -0.5:
            return _tl("rsqrt", a)
        _need(out_kind == FLOAT, "pow", "float")
        # The helper needs both arguments as tensors: a bare constant fails in the interpreter.
        return call("_pow", a, _tl("zeros_like", a) + (e if e is not None else exponent.term))
    if base.is_scalar:
        value = _finite(base)
        _need(out_kind == FLOAT, "pow", "float")
        if value is not None and value > 0:
            return _tl("exp2", exponent.term * math.log2(value))
        constant = value if value is not None else base.term
        # zeros_like, not `0.0 * exponent`: that is NaN where the exponent is infinite.
        return call("_pow", _tl("zeros_like", exponent.term) + constant, exponent.term)
    _need(out_kind == FLOAT, "pow", "float")
    return call("_pow", a, exponent.term)


def _cast(operand: Operand, out_dtype: str) -> Term:
    target = kind_of(out_dtype)
    if target == BOOL:
        return paren(compare(operand.term, "!=", 0))
    if target == INT:
        return operand.term.to(TL_DTYPES[out_dtype])
    value = convert(operand, FLOAT)
    if out_dtype in ("float16", "bfloat16"):
        # Round to the narrower type exactly as eager does, then keep computing in fp32.
        return value.to(TL_DTYPES[out_dtype]).to("tl.float32")
    return value


def _scalar(value, kind: str) -> Term:
    if kind == FLOAT:
        return Lit(literal(float(value)))
    return Lit(literal(int(value)) if not isinstance(value, bool) else literal(value))


def _need(condition: bool, op: str, what: str) -> None:
    if not condition:
        raise LoweringError(f"`{op}` is lowered for {what} values only")
