"""Whether the installed Triton's interpreter can run the generated kernels in this process.

Triton reads TRITON_INTERPRET when it is imported: its own `@triton.jit` functions (`tl.sigmoid`,
`tl.softmax`) are made then, as interpreted functions or as compiled ones, and a compiled one called
from an interpreted kernel fails ("Cannot call @triton.jit'd outside of the scope of a kernel").  A
process that imported Triton before setting the variable (a model file that imports it) cannot
interpret the kernels; the validation says so rather than failing kernel by kernel.

Some kernels loop to a run-time bound: the looped row kernel over a wide row's column blocks
(`for col0 in range(0, C, BLOCK_C)`), a group norm's kernels over its blocks, a backward that sums a
weight's gradient walking the row blocks.  The interpreter holds every kernel argument, and every
value a kernel assigns, as a one-element numpy array, and Triton 3.6's interpreter turns one into a
loop's bound with `int(array)`, which NumPy 2.4 refuses ("only 0-dimensional arrays can be converted
to Python scalars"); Triton 3.8's takes the element first.  No kernel text avoids it on that
pair: a bound that is a plain argument, or a constant assigned to a name, fails the same way.  So the
validation asks once, by running a loop of that form, and says what to install instead of failing
kernel by kernel.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator


@contextlib.contextmanager
def interpreting(on: bool) -> Iterator[None]:
    """TRITON_INTERPRET=1 while the block runs, when `on`; afterwards the variable is as it was, so that
    what this process does after a validation (a GPU benchmark, a test of compiled kernels) is not
    sent to the interpreter by it.  (Triton itself, once imported under it, stays as it was made.)"""
    before = os.environ.get("TRITON_INTERPRET")
    if on:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before


def imported_problem() -> str | None:
    """Why Triton, already imported in this process, cannot interpret kernels (None when it can)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(tl.sigmoid, InterpretedFunction):
        return None
    return (
        "Triton was imported in this process before TRITON_INTERPRET=1 was set (by the model's file, or "
        "something it imports), so its kernels cannot run in the interpreter here: run with "
        "TRITON_INTERPRET=1 in the environment"
    )


@functools.cache
def loop_problem() -> str | None:
    """Why this interpreter cannot run a loop over a run-time bound, or None when it can.  Call it with
    TRITON_INTERPRET=1 set: its kernel is made on the first call, interpreted then."""
    import numpy
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _last_block(out_ptr, n, BLOCK: tl.constexpr):
        last = -1
        for start in range(0, n, BLOCK):
            last = start
        tl.store(out_ptr, last)

    out = torch.zeros(1, dtype=torch.int32)
    try:
        _last_block[(1,)](out, 5, BLOCK=2)
    except Exception as exc:  # the interpreter's own error, whatever its type
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (
            f"Triton {triton.__version__}'s interpreter cannot run a loop over a run-time bound with NumPy "
            f"{numpy.__version__} ({reason}), as the kernels of wide rows, group norms and weights' gradients do: "
            "`pip install 'numpy<2.4'`, or a later Triton (the cpu extra's)"
        )
    if out.item() != 4:
        return f"Triton {triton.__version__}'s interpreter ended a loop over range(0, 5, 2) at {out.item()}, not 4"
    return None
