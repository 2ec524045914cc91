"""The operator vocabulary: canonical op names and what class of op each is.

Capture maps every torch callable a model uses (`torch.mul`, `Tensor.__rmul__`,
`F.gelu`, `x.float()`, ...) to one canonical name here.  The class decides how the
passes treat it:

- pointwise ops (unary / binary / ternary / concat, and per-channel ones such as eval-mode
  batch norm, whose per-channel operands broadcast along dim 1) and reductions can be
  absorbed into a fused kernel;
- views and identities move no data: they cost nothing and never inflate savings;
- opaque ops (GEMMs, convolutions, attention, gathers, ...) are barriers;
- sources are model inputs, parameters, buffers and tensors made by factories.

No torch import here.
"""

from __future__ import annotations

from enum import StrEnum


class OpClass(StrEnum):
    UNARY = "pointwise-unary"
    BINARY = "pointwise-binary"
    TERNARY = "pointwise-ternary"
    CONCAT = "pointwise-concat"
    CHANNEL = "pointwise-channel"  # x with per-channel [C] operands read at x's dim 1
    LOOKUP = "pointwise-lookup"  # rows of a table read at indices (an embedding)
    REDUCTION = "reduction"
    VIEW = "view"
    IDENTITY = "identity"
    OPAQUE = "opaque"
    SOURCE = "source"

    @property
    def absorbable(self) -> bool:
        return self in ABSORBABLE

    @property
    def free(self) -> bool:
        """Moves no data of its own."""
        return self in (OpClass.VIEW, OpClass.IDENTITY)


ABSORBABLE = frozenset(
    {
        OpClass.UNARY,
        OpClass.BINARY,
        OpClass.TERNARY,
        OpClass.CONCAT,
        OpClass.CHANNEL,
        OpClass.LOOKUP,
        OpClass.REDUCTION,
    }
)

UNARY = frozenset(
    {
        "neg",
        "abs",
        "relu",
        "relu6",
        "gelu",
        "silu",
        "sigmoid",
        "tanh",
        "exp",
        "exp2",
        "log",
        "log2",
        "log10",
        "log1p",
        "expm1",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "sin",
        "cos",
        "erf",
        "floor",
        "ceil",
        "round",
        "trunc",
        "sign",
        "square",
        "logical_not",
        "bitwise_not",
        "isnan",
        "isinf",
        "isfinite",
        "softplus",
        "elu",
        "selu",
        "celu",
        "leaky_relu",
        "hardtanh",
        "hardsigmoid",
        "hardswish",
        "mish",
        "logsigmoid",
        "softsign",
        "nan_to_num",
        "clamp",
        "cast",
        "copy",
    }
)

BINARY = frozenset(
    {
        "add",
        "sub",
        "mul",
        "div",
        "floor_divide",
        "remainder",
        "fmod",
        "pow",
        "maximum",
        "minimum",
        "atan2",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "logical_and",
        "logical_or",
        "logical_xor",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "copysign",
        "hypot",
    }
)

TERNARY = frozenset({"where", "masked_fill", "lerp", "addcmul", "addcdiv", "clamp_tensor"})

# Pointwise in x, with per-channel operands: `batch_norm` with running statistics (eval mode) is
# (x - running_mean) / sqrt(running_var + eps) * weight + bias, each [C] operand read at x's dim 1.
# With batch statistics (training) it is recorded as a reduction over every dim but the channel.
CHANNEL = frozenset({"batch_norm"})

# Elementwise over the result, each element one of a table's rows read at an index: `embedding(ids, W)`
# is W[ids[...], :] (out[..., d] = W[ids[...], d]).
LOOKUP = frozenset({"embedding", "one_hot"})

# Pooling: a reduction over each window of the last one to three dims (`max_pool2d(x, 2)`), or over
# the whole of them (`adaptive_avg_pool2d(x, 1)`).
POOLS = frozenset(f"{kind}_pool{n}d" for kind in ("max", "avg", "adaptive_max", "adaptive_avg") for n in (1, 2, 3))

REDUCTION = frozenset(
    {
        "sum",
        "mean",
        "amax",
        "amin",
        "prod",
        "var",
        "std",
        "softmax",
        "log_softmax",
        "logsumexp",
        "layer_norm",
        "rms_norm",
        "group_norm",
        "norm",
        "argmax",
        "argmin",
        "all",
        "any",
        "cumsum",
        "cumprod",
        "instance_norm",
        # `torch.max(x, dim)` / `torch.min(x, dim)` record their values under these names (their
        # indices as `argmax` / `argmin`): the values' gradient goes to the first index of the extreme,
        # not shared among ties as `amax`'s is.
        "max",
        "min",
        *POOLS,
    }
)

VIEW = frozenset(
    {
        "view",
        "reshape",
        "flatten",
        "unflatten",
        "squeeze",
        "unsqueeze",
        "transpose",
        "permute",
        "t",
        "expand",
        "narrow",
        "select",
        "slice",
        "getitem",
        "movedim",
    }
)

IDENTITY = frozenset({"dropout", "detach", "alias", "clone", "contiguous", "to_same"})

SOURCE = frozenset({"input", "param", "buffer", "const", "factory"})

# Torch callable names (func.__name__, or the property name for `x.T`) that differ from
# the canonical name.  A tuple value means (canonical, operands swapped).
ALIASES: dict[str, str | tuple[str, bool]] = {
    "__add__": "add",
    "__iadd__": "add_",
    "__radd__": ("add", True),
    "__sub__": "sub",
    "subtract": "sub",
    "__isub__": "sub_",
    "__rsub__": ("sub", True),
    "rsub": ("sub", True),
    "__mul__": "mul",
    "multiply": "mul",
    "__imul__": "mul_",
    "__rmul__": ("mul", True),
    "__truediv__": "div",
    "divide": "div",
    "true_divide": "div",
    "__itruediv__": "div_",
    "__rtruediv__": ("div", True),
    "__div__": "div",
    "__rdiv__": ("div", True),
    "__floordiv__": "floor_divide",
    "__rfloordiv__": ("floor_divide", True),
    "__mod__": "remainder",
    "__rmod__": ("remainder", True),
    "__pow__": "pow",
    "__ipow__": "pow_",
    "__rpow__": ("pow", True),
    "float_power": "pow",
    "__neg__": "neg",
    "negative": "neg",
    "__abs__": "abs",
    "absolute": "abs",
    "__invert__": "bitwise_not",
    "__eq__": "eq",
    "__ne__": "ne",
    "__lt__": "lt",
    "__le__": "le",
    "__gt__": "gt",
    "__ge__": "ge",
    "less": "lt",
    "less_equal": "le",
    "greater": "gt",
    "greater_equal": "ge",
    "not_equal": "ne",
    "__and__": "bitwise_and",
    "__rand__": ("bitwise_and", True),
    "__or__": "bitwise_or",
    "__ror__": ("bitwise_or", True),
    "__xor__": "bitwise_xor",
    "__rxor__": ("bitwise_xor", True),
    "arctan2": "atan2",
    "sgn": "sign",
    "clip": "clamp",
    "log_sigmoid": "logsigmoid",
    "__matmul__": "matmul",
    "__rmatmul__": ("matmul", True),
    "__getitem__": "getitem",
    "__setitem__": "setitem_",
    "swapaxes": "transpose",
    "swapdims": "transpose",
    "moveaxis": "movedim",
    "concat": "cat",
    "concatenate": "cat",
    "T": "t",
    "mT": "mT",
    "mH": "mT",
    "H": "t",
    "dropout1d": "dropout",
    "dropout2d": "dropout",
    "dropout3d": "dropout",
    "alpha_dropout": "dropout",
    "feature_alpha_dropout": "dropout",
    "view_as": "view",
    "reshape_as": "reshape",
    "expand_as": "expand",
}

# Calls that read tensor *metadata* only; capture passes them through unrecorded.
METADATA = frozenset(
    {
        "size",
        "dim",
        "ndim",
        "shape",
        "dtype",
        "device",
        "numel",
        "stride",
        "is_contiguous",
        "storage_offset",
        "element_size",
        "nelement",
        "ndimension",
        "data_ptr",
        "is_floating_point",
        "is_complex",
        "requires_grad",
        "requires_grad_",
        "grad",
        "is_cuda",
        "is_meta",
        "layout",
        "_is_view",
        "__len__",
        "__hash__",
        "__format__",
        "__repr__",
        "__str__",
        "get_device",
        "is_leaf",
        "names",
        "untyped_storage",
        "_base",
        "is_sparse",
        "is_quantized",
        "__reduce_ex__",
        "__deepcopy__",
        "retain_grad",
        "__contains__",
        "__iter__",
        "itemsize",
        "nbytes",
        "name",
        "_set_grad_enabled",
        "is_inference",
        "is_nested",
        "__dlpack__",
        "register_hook",
        "_version",
        "is_set_to",
        "has_names",
        "__setstate__",
        "__array__",
        "dim_order",
    }
)

# Calls that need a tensor's *values*; on meta tensors they have none.
# Calls that hand a tensor's value to Python: torch.compile breaks the graph at each.
VALUE_READS = frozenset(
    {
        "__bool__",
        "item",
        "tolist",
        "__int__",
        "__float__",
        "__index__",
        "__complex__",
        "numpy",
        "equal",
        "allclose",
        "is_nonzero",
    }
)

# Ops whose output's size depends on the input's values (`torch.where` with one argument too):
# torch.compile breaks the graph at each, unless told to trace their sizes as unknowns.  (`histc`
# is not one: its size is its bin count.)
DYNAMIC_SHAPES = frozenset(
    {"nonzero", "nonzero_static_dd", "unique", "unique_consecutive", "masked_select", "bincount", "argwhere"}
)

FACTORIES = frozenset(
    {
        "arange",
        "ones",
        "zeros",
        "full",
        "empty",
        "rand",
        "randn",
        "randint",
        "tensor",
        "ones_like",
        "zeros_like",
        "full_like",
        "empty_like",
        "rand_like",
        "randn_like",
        "linspace",
        "logspace",
        "eye",
        "as_tensor",
        "from_numpy",
        "scalar_tensor",
        "new_ones",
        "new_zeros",
        "new_full",
        "new_empty",
        "new_tensor",
        "randperm",
        "tril_indices",
        "triu_indices",
        "empty_strided",
        "polar",
        "complex",
    }
)

CASTS = {
    "float": "float32",
    "half": "float16",
    "bfloat16": "bfloat16",
    "double": "float64",
    "int": "int32",
    "long": "int64",
    "bool": "bool",
    "short": "int16",
    "char": "int8",
    "byte": "uint8",
}


def op_class(op: str) -> OpClass:
    """The class of a canonical op name (in-place forms take their functional class)."""
    base = op[:-1] if op.endswith("_") and op[:-1] in _ALL_FUNCTIONAL else op
    if base in UNARY:
        return OpClass.UNARY
    if base in BINARY:
        return OpClass.BINARY
    if base in TERNARY:
        return OpClass.TERNARY
    if base in CHANNEL:
        return OpClass.CHANNEL
    if base in LOOKUP:
        return OpClass.LOOKUP
    if base == "cat":
        return OpClass.CONCAT
    if base in REDUCTION:
        return OpClass.REDUCTION
    if base in VIEW or base == "mT":
        return OpClass.VIEW
    if base in IDENTITY:
        return OpClass.IDENTITY
    if base in SOURCE or base in FACTORIES:
        return OpClass.SOURCE
    return OpClass.OPAQUE


_ALL_FUNCTIONAL = UNARY | BINARY | TERNARY | REDUCTION | {"cat"}

# Ops that are GEMM-like, for the pattern library.
GEMMS = frozenset({"linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum"})

# Ops whose output shape equals the broadcast of their operands (pure elementwise).
POINTWISE = ABSORBABLE - {OpClass.REDUCTION}
