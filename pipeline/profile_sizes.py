"""The sizes a profile sees: for each model with declared dynamic sizes, the value of each size at every
call of a module of its class while the profiled forwards run (the model itself, and wherever another
profiled model calls it: a block called on the whole sequence and on a slice of it sees both).  What
is seen can be written as the sizes' corpus (`fuselens profile --save-corpus`)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import torch

from fuselens.contracts.report import Model

_DIM = re.compile(r"^(?P<input>.+)\[(?P<dim>\d+)\]$")

Seen = dict[str, dict[str, set[int]]]  # model name -> size name -> the values seen


@contextlib.contextmanager
def recording_sizes(root: torch.nn.Module, models: dict[type, Model], seen: Seen) -> Iterator[None]:
    """While the block runs, add to `seen` the declared sizes of every call of a module under `root` whose
    class is one of `models` (each a model with a dynamic section)."""
    handles = []
    for module in root.modules():
        model = models.get(type(module))
        if model is not None:
            handles.append(module.register_forward_pre_hook(_recorder(model, seen), with_kwargs=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _recorder(model: Model, seen: Seen):
    names = [i.name or f"input{k}" for k, i in enumerate(model.inputs)]
    places = _places(model, names)

    def record(_module, args, kwargs) -> None:
        for size, (k, dim) in places:
            value = args[k] if k < len(args) else kwargs.get(names[k])
            if isinstance(value, torch.Tensor) and dim < value.dim():
                seen.setdefault(model.name, {}).setdefault(size, set()).add(int(value.shape[dim]))

    return record


def _places(model: Model, names: list[str]) -> list[tuple[str, tuple[int, int]]]:
    """(size name, (input index, dim)) for the first input dim each declared size is."""
    out = []
    for size in model.dynamic.sizes if model.dynamic else []:
        for place in size.used_by:
            match = _DIM.match(place)
            if match is not None and match["input"] in names:
                out.append((size.name, (names.index(match["input"]), int(match["dim"]))))
                break
    return out
