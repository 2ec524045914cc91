"""The batches a probe runs a model on: a function the user names (`pkg.mod:fn`, on the command line or
as `probe-data` in `[tool.fuselens]`), the file's own `probe_batches()`, or synthetic batches of the
model's declared input shapes.

A data function takes no arguments and returns (or yields) batches: a tensor, or a tuple or list of
tensors, passed as the forward's positional inputs.  It runs in the worker, as the model does; what
it names is imported, never evaluated.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType

import torch

from fuselens.contracts.config import InputSpec

DATA_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
FILE_FUNCTION = "probe_batches"


class DataError(Exception):
    """The batches could not be had: the message says what was named, and what went wrong."""


@dataclass
class BatchSource:
    description: str  # where the batches come from, in words
    batches: Callable[[], Iterator[tuple[torch.Tensor, ...]]]


def named_function(name: str, where: str, search: list[str]) -> BatchSource:
    """The data function `name` ("pkg.mod:fn") names, imported with `search` ahead on sys.path."""
    if not DATA_NAME.match(name):
        raise DataError(f"{where} {name!r} is not a function's name: give it as package.module:function")
    module_name, function_name = name.split(":")
    for folder in reversed([f for f in search if f]):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise DataError(f"{where} {name!r}: cannot import {module_name}: {exc}") from None
    except Exception as exc:
        raise DataError(f"{where} {name!r}: importing {module_name} failed: {type(exc).__name__}: {exc}") from None
    function = getattr(module, function_name, None)
    if function is None:
        raise DataError(f"{where} {name!r}: {module_name} has no {function_name}")
    if not callable(function):
        raise DataError(f"{where} {name!r}: {module_name}.{function_name} is not a function")
    return BatchSource(f"{name} ({where})", _checked(function, name))


def file_function(module: ModuleType, path: str) -> BatchSource | None:
    """The file's own `probe_batches()`, or None when it has none."""
    function = getattr(module, FILE_FUNCTION, None)
    if not callable(function):
        return None
    return BatchSource(f"{FILE_FUNCTION}() in {path}", _checked(function, f"{FILE_FUNCTION}()"))


def synthetic(specs: list[InputSpec], distribution: str, seed: int) -> BatchSource:
    """Fresh random batches of `specs`, one seed each: floats from `distribution`, integers (token ids)
    uniform in [0, high)."""
    shapes = ", ".join(spec.describe() for spec in specs)

    def batches() -> Iterator[tuple[torch.Tensor, ...]]:
        index = 0
        while True:
            gen = torch.Generator().manual_seed(seed + index)
            yield tuple(_drawn(spec, distribution, gen) for spec in specs)
            index += 1

    return BatchSource(f"synthetic {distribution} inputs of the declared shapes: {shapes}", batches)


def _drawn(spec: InputSpec, distribution: str, gen: torch.Generator) -> torch.Tensor:
    dtype = getattr(torch, spec.dtype)
    if not dtype.is_floating_point:
        if dtype == torch.bool:
            return torch.randint(0, 2, spec.shape, generator=gen).bool()
        return torch.randint(0, spec.high or 16, spec.shape, generator=gen).to(dtype)
    x = torch.randn(spec.shape, generator=gen)
    if distribution == "heavy":  # Student's t with 3 degrees of freedom: heavy tails, finite variance
        chi = torch.randn((3, *spec.shape), generator=gen).square().mean(0)
        x = x / chi.sqrt().clamp_min(1e-6)
    elif distribution == "sparse":  # 90% zeros, unstructured
        x = x * (torch.rand(spec.shape, generator=gen) < 0.1)
    return x.to(dtype)


def _checked(function: Callable, name: str) -> Callable[[], Iterator[tuple[torch.Tensor, ...]]]:
    """`function`'s batches, each as a tuple of tensors; DataError for anything else, or for an error
    the function raises (naming the function, the batch and the error)."""

    def batches() -> Iterator[tuple[torch.Tensor, ...]]:
        try:
            produced = function()
            iterator = iter(produced if not isinstance(produced, torch.Tensor) else [produced])
        except TypeError as exc:
            raise DataError(f"{name} must return or yield batches: {exc}") from None
        except Exception as exc:
            raise DataError(f"{name} raised {type(exc).__name__}: {exc}") from None
        index = 0
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                return
            except Exception as exc:
                raise DataError(f"{name} raised {type(exc).__name__} making batch {index}: {exc}") from None
            yield as_tensors(batch, name, index)
            index += 1

    return batches


def as_tensors(batch: object, name: str, index: int) -> tuple[torch.Tensor, ...]:
    if isinstance(batch, torch.Tensor):
        return (batch,)
    if isinstance(batch, (tuple, list)) and batch and all(isinstance(t, torch.Tensor) for t in batch):
        return tuple(batch)
    what = type(batch).__name__
    if isinstance(batch, (tuple, list)):
        kinds = sorted({type(t).__name__ for t in batch if not isinstance(t, torch.Tensor)})
        what = f"{what} holding {', '.join(kinds) or 'nothing'}"
    raise DataError(f"batch {index} from {name} is a {what}, not a tensor or a tuple of tensors")
