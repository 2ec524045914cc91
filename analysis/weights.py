"""Where a model's tensors live while it is analyzed, and how it gets real ones back.

A model is built under `weights_on_meta()`: its large tensors (the weights) are created on the meta
device and cost nothing, while small ones (rotary tables, position ids, norm weights, masks) are
computed for real, so that a buffer keeps the values its constructor gave it.  `to_meta(model)`
then moves everything to meta for tracing and returns those values; `materialise(model, values)`
gives the model real CPU tensors again: its own values where it had them, seeded random weights
elsewhere.  A model rebuilt from meta with `to_empty()` alone would index embeddings with garbage
position ids and rotate by garbage angles.

The small tensors a constructor initialises from torch's random generator (a router's weights, in a
small model) are values the analysis then relies on: past a data-dependent op it runs the model on
them, and which tokens reach which expert follows from them.  `reproducible()` seeds the generator
while a model is built, so the same file gives the same report every time.

A trace needs no values at all: built under `parameters_on_meta()` too, every parameter goes to meta
as its module registers it, and the constructor initialises nothing (a 12-layer GPT's 768 x 768
projections are each filled with random numbers and copied otherwise).  The values are then those of
a build without it, made again when they are asked for (`loader.Built.real_values`).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.modules.module import register_module_parameter_registration_hook
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

REAL_NUMEL = 1 << 20  # a tensor of this many elements or more is a weight: it stays on meta
REAL_BUDGET = 256 << 20  # bytes of real tensors in all; past this, everything goes to meta
BUILD_SEED = 0  # torch's CPU generator while a model is built


@contextlib.contextmanager
def reproducible(seed: int = BUILD_SEED) -> Iterator[None]:
    """torch's CPU random generator seeded for the duration and restored after, so that a model built
    inside takes the same initial values in every analysis and the caller's generator is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class weights_on_meta(TorchFunctionMode):
    """Factory calls without a device make meta tensors when large, real CPU tensors when small.

    A large tensor of ones, and a triangle taken of it (`torch.tril(torch.ones(n, n))`: a causal mask
    of a long context), keep what they are though their values are not computed (`triangles`)."""

    def __init__(self) -> None:
        super().__init__()
        self.spent = 0
        # id of a tensor -> (a weak reference to it, what it is): tensors compare by value, not identity.
        self.kinds: dict[int, tuple[weakref.ref, str]] = {}

    def kind(self, tensor: torch.Tensor) -> str | None:
        held = self.kinds.get(id(tensor))
        return held[1] if held is not None and held[0]() is tensor else None

    def _mark(self, tensor: torch.Tensor, kind: str) -> None:
        self.kinds[id(tensor)] = (weakref.ref(tensor), kind)

    def triangles(self, model: torch.nn.Module) -> dict[str, str]:
        """The buffers of `model` made as a triangle of ones ("tril": on and below the diagonal, "triu1":
        above it), by name."""
        return {
            name: kind
            for name, b in model.named_buffers()
            if (kind := self.kind(b)) in ("tril", "triu1") and b.dim() >= 2 and b.shape[-1] == b.shape[-2]
        }

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func not in _device_constructors() or kwargs.get("device") is not None:
            out = func(*args, **kwargs)
            self._follow(func, args, kwargs, out)
            return out
        probe = func(*args, **{**kwargs, "device": "meta"})
        if not isinstance(probe, torch.Tensor):
            return probe
        nbytes = probe.numel() * probe.element_size()
        if probe.numel() >= REAL_NUMEL or self.spent + nbytes > REAL_BUDGET:
            if func is torch.ones:
                self._mark(probe, "ones")
            return probe
        self.spent += nbytes
        return func(*args, **kwargs)

    def _follow(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """What a triangle of ones stays through: the triangle taken of ones, a view or cast of either
        that keeps its last two dims."""
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        kind = self.kind(source) if source is not None else None
        if kind is None or not isinstance(out, torch.Tensor) or out.dim() < 2 or source is None:
            return
        name = getattr(func, "__name__", "")
        if name in ("tril", "triu") and kind == "ones":
            diagonal = args[1] if len(args) > 1 else kwargs.get("diagonal", 0)
            if (name, diagonal) in (("tril", 0), ("triu", 1)):
                self._mark(out, "tril" if name == "tril" else "triu1")
        elif name in _SHAPE_KEEPING and out.shape[-2:] == source.shape[-2:]:
            self._mark(out, kind)


# Calls that leave a tensor's last two dims as they were, values and all (views, casts to a type that
# holds 0 and 1).
_SHAPE_KEEPING = frozenset(
    {"view", "reshape", "unsqueeze", "expand", "to", "float", "bool", "half", "bfloat16", "contiguous"}
)


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Each `nn.Parameter` a module registers with real values is registered as a meta parameter of
    the same shape, strides and dtype instead, so that initialising it computes nothing.  One
    parameter registered twice (tied weights) stays one."""
    # id -> (the parameter registered, while it lives; the one on meta)
    on_meta: dict[int, tuple[weakref.ref, torch.nn.Parameter]] = {}

    def registered(module: torch.nn.Module, name: str, param: Any) -> Any:  # (the parameter to register, or None)
        if type(param) is not torch.nn.Parameter or param.device.type == "meta":
            return None  # (a lazy module's uninitialised parameter is left to its own kind)
        known = on_meta.get(id(param))
        if known is None or known[0]() is not param:  # (a parameter that died may leave its id to a new one)
            known = on_meta[id(param)] = (
                weakref.ref(param),
                torch.nn.Parameter(param.data.to("meta"), param.requires_grad),
            )
        return known[1]

    handle = register_module_parameter_registration_hook(registered)
    try:
        yield
    finally:
        handle.remove()


def all_to_meta(model: torch.nn.Module) -> None:
    """Move every tensor of `model` to meta, keeping none of its values."""
    _replace(model, lambda _, tensor: tensor.to("meta"))


def to_meta(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Move every tensor of `model` (parameters, buffers, tensor attributes) to meta; return the real
    values it had, by name."""
    values: dict[str, torch.Tensor] = {}

    def moved(name: str, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type == "meta":
            return tensor
        values[name] = tensor.detach().clone()
        return tensor.to("meta")

    _replace(model, moved)
    return values


def materialise(
    model: torch.nn.Module, values: dict[str, torch.Tensor], seed: int = 0, device: str = "cpu"
) -> torch.nn.Module:
    """`model` with real tensors on `device`: `values` where it has them, seeded random weights where not
    (floats N(0, 0.02), integers and bools zero)."""
    generator = torch.Generator().manual_seed(seed)

    def real(name: str, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type != "meta":
            return tensor.to(device)
        known = values.get(name)
        if known is not None and tuple(known.shape) == tuple(tensor.shape):
            value = known.to(dtype=tensor.dtype)
        elif tensor.dtype.is_floating_point:
            value = torch.empty(tensor.shape, dtype=torch.float32).normal_(0.0, 0.02, generator=generator)
            value = value.to(tensor.dtype)
        else:
            value = torch.zeros(tensor.shape, dtype=tensor.dtype)
        return value.to(device)

    _replace(model, real)
    return model


def _replace(model: torch.nn.Module, new: Any) -> None:
    """Replace each tensor of `model` by `new(qualified name, tensor)`, once per tensor: tied weights
    (an embedding shared with the output projection) stay one tensor."""
    done: dict[int, torch.Tensor] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        owned = [(k, v) for k, v in module._parameters.items() if v is not None]
        owned += [(k, v) for k, v in module._buffers.items() if v is not None]
        owned += [(k, v) for k, v in vars(module).items() if isinstance(v, torch.Tensor) and not k.startswith("_")]
        for attr, tensor in owned:
            if id(tensor) not in done:
                value = new(f"{prefix}.{attr}" if prefix else attr, tensor.data)
                if isinstance(tensor, torch.nn.Parameter):
                    value = torch.nn.Parameter(value, requires_grad=tensor.requires_grad)
                done[id(tensor)] = value
            _set(module, attr, done[id(tensor)])


def _set(module: torch.nn.Module, attr: str, tensor: torch.Tensor) -> None:
    if attr in module._parameters:
        module._parameters[attr] = tensor  # type: ignore[assignment]
    elif attr in module._buffers:
        module._buffers[attr] = tensor
    else:
        object.__setattr__(module, attr, tensor)
