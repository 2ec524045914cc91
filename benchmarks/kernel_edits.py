"""A cluster's generated kernel against edits of its own module's text, and torch.compile.

    python benchmarks/kernel_edits.py [--case bert:c0 ...]

Each case is a held-out or tuning-suite cluster (as `pointwise_tiles.py` names them) with named
edits: each edit is a list of (text, replacement) applied to the generated module, which is then
loaded as a module of its own (its ops in a namespace of their own), checked against the generated
kernel's result (unless it is there to be timed only) and timed beside it by CUDA-graph replay, with
torch.compile in modes "default" and "max-autotune-no-cudagraphs", the replays sampled in turn.  The
edits put back what a change to the generator took out, so that one run measures both sides, or
leave out work to show what the kernel's time goes to.  Needs CUDA.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pointwise_tiles import compiled_replays, on_cuda, print_times, traced_cluster

# A table read at token ids, its rows kept in L2 (`evict_last`), as every such load was before a
# vocabulary's rows were read plainly.
EDITS: dict[str, dict[str, list[tuple[str, str]]]] = {
    f"{case}:c0": {
        "table rows evict_last": [
            (f"(v0 < {rows}), other=0)", f"(v0 < {rows}), other=0, eviction_policy='evict_last')")
        ]
    }
    for case, rows in (("bert", 30522), ("gpt.py", 50304), ("gemma", 32000))
}
# The Whisper encoder's bias + GELU with the error function left out: wrong values, timed only, to
# say how much of the kernel's time is arithmetic rather than memory.
TIMED_ONLY = "no erf (timed only)"
EDITS["whisper-encoder:c0"] = {TIMED_ONLY: [("tl.erf(v2 * 0.7071067811865476)", "(v2 * 0.7071067811865476)")]}


def edited_module(path: str, edits: list[tuple[str, str]], tag: str):
    """The kernel module at `path` with `edits` applied, loaded from a file beside it."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    for old, new in edits:
        if old not in text:
            raise SystemExit(f"{tag}: {old!r} is not in {path}")
        text = text.replace(old, new)
    name = f"edited_{len(tag)}_{abs(hash(tag))}"
    out = os.path.join(os.path.dirname(path), f"{name}.py")
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(text)
    spec = importlib.util.spec_from_file_location(name, out)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def first(result):
    return result[0] if isinstance(result, tuple | list) else result


def compare(case: str, cluster_id: str, peak: float) -> None:
    import torch

    from fuselens.validate.gpu import graph_replay, medians_in_turn

    traced = traced_cluster(case, cluster_id)
    name = traced.cluster.kernel.name
    with torch.no_grad():
        want = first(traced.fused(*traced.args))
        replays = compiled_replays(traced.eager, traced.args)
        replays["generated"] = graph_replay(functools.partial(traced.fused, *traced.args))
        for tag, edits in EDITS.get(f"{case}:{cluster_id}", {}).items():
            fn = getattr(edited_module(traced.kernels.__file__, edits, tag), name)
            if tag != TIMED_ONLY:
                torch.testing.assert_close(first(fn(*traced.args)).float(), want.float(), atol=0.05, rtol=0.02)
            replays[tag] = graph_replay(functools.partial(fn, *traced.args))
        times = medians_in_turn(replays, 15)
    print_times(f"{case} {cluster_id} ({traced.cluster.op_chain})", times, traced.moved, peak)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", help=f"model:cluster (default: {' '.join(EDITS)})")
    return on_cuda(parser.parse_args().case or list(EDITS), compare)


if __name__ == "__main__":
    raise SystemExit(main())
