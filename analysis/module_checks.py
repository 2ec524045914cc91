"""What a kernel call must find of the modules the code it replaces calls.

The code a kernel replaces may call submodules (`self.act_fn(gate) * up`, `self.norm(x + h)`), and
the kernel computes what those calls computed in the analyzed model.  The same lines run for every
instance of the class, and for instances set up otherwise (another activation, another momentum),
so the call checks, for each module the replaced code ran ops in (and each `nn.Identity` it skips),
that it holds a module of the same class with the same settings (`settings.module_settings`).
Where the computation depends on the mode (a batch norm's batch statistics, a dropout), the call also
checks the module is in the mode it was analyzed in: in the other mode the original code runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .graph import Frame, Graph, Node


class Unreachable(Exception):
    """A module the check needs cannot be reached from the code; the message says why, for the user."""


@dataclass(frozen=True)
class ModuleCheck:
    """One module the call checks: reached from the frame's `self` by `path` ("" for `self` itself)."""

    path: str
    type_name: str  # its class, as `settings.class_identity` names it; "" for `self` (the code is its own method)
    settings: dict[str, Any]  # what `module_settings` gives it, less the numbers the kernel takes
    mode: bool | None  # the `training` it must have, where its computation depends on the mode
    taken: tuple[str, ...] = ()  # its settings the kernel takes as numbers from the call: any value fits


# Ops whose result depends on the module's mode: in training a batch norm normalises with the batch's
# statistics and updates its running ones, a dropout drops; their eval-mode form is what was fused.
MODE_DEPENDENT = frozenset({"batch_norm", "instance_norm", "dropout", "alpha_dropout", "feature_alpha_dropout"})


Span = tuple[int, int, int, int]


def module_checks(
    graph: Graph,
    invocation: int,
    owner: str,
    code: Iterable[Span],
    arguments: Iterable[Span],
    has_self: bool,
    skipped: Iterable[str] = (),
    number_texts: Iterable[str] = (),
    skipped_in_eval: Iterable[str] = (),
) -> list[ModuleCheck]:
    """The checks for the code at spans `code` (less the `arguments` inside it, which the call still
    evaluates) in call `invocation` of a function whose `self` is the module at `owner` (`has_self`:
    the function has a `self`); `skipped`: modules the replaced code calls whose call the kernel leaves
    out (an `nn.Identity`); `number_texts`: the numbers the kernel takes from the caller, as the caller
    spells them (`self.norm.eps`), which need no check; `skipped_in_eval`: those it leaves out because in
    eval mode they return their input (a dropout; "" for `self`, whose `training` a functional dropout
    reads)."""
    paths: set[str] = set(skipped) | {p for p in skipped_in_eval if p}
    moded: set[str] = set(skipped_in_eval)
    if "" in moded and not has_self:
        raise Unreachable("it drops in training, and nothing its function holds says which mode the model is in")
    code, arguments = list(code), list(arguments)
    placed = [
        (node, depth) for node, depth in graph.in_call(invocation) if _evaluating(node.stack[depth], code, arguments)
    ]
    # The module whose code was running when the function was called: its `self`, or for a function of
    # no module (`apply_rotary_pos_emb`) its caller's, which the ops made in the function itself show.
    base = owner if has_self else next((n.module for n, depth in placed if depth == 0), owner)
    for node, depth in placed:
        inner = {f.owner for f in node.stack[:depth] if f.owner} | ({node.module} if node.module else set())
        for path in inner:
            paths |= _between(base, path)
        if node.op in MODE_DEPENDENT:
            moded.add(_reached(base, node.module, node, has_self))
    taken = {_attribute(text) for text in number_texts}
    checks = []
    for path in sorted(paths | moded):
        full = f"{base}.{path}" if base and path else (path or base)
        if path and not has_self:
            raise Unreachable(f"it runs `{full}`, which its function reaches through no `self`")
        mode = graph.module_training.get(full) if path in moded else None
        if not path:
            checks.append(ModuleCheck("", "", {}, mode))
            continue
        recorded = graph.module_settings.get(full, {})
        settings = {k: v for k, v in recorded.items() if (path, k) not in taken}
        passed = tuple(sorted(k for k in recorded if (path, k) in taken))
        checks.append(ModuleCheck(path, graph.module_classes.get(full, ""), settings, mode, passed))
    return checks


def _evaluating(frame: Frame, code: list[Span], arguments: list[Span]) -> bool:
    """Whether `frame` was evaluating the replaced `code` (and not one of its `arguments`)."""
    inside = any(_contains(span, frame.span) for span in code)
    return inside and not any(_contains(span, frame.span) for span in arguments)


def _contains(outer: Span, inner: Span) -> bool:
    return (outer[0], outer[1]) <= (inner[0], inner[1]) and (inner[2], inner[3]) <= (outer[2], outer[3])


def _between(owner: str, path: str) -> set[str]:
    """The modules from just under `owner` down to `path`, relative to `owner` (none when `path` is not
    under it: an op of a module the code was handed, which its own checks cannot see)."""
    if path == owner:
        return set()
    prefix = f"{owner}." if owner else ""
    if not path.startswith(prefix):
        return set()
    parts = path[len(prefix) :].split(".")
    return {".".join(parts[: k + 1]) for k in range(len(parts))}


def _reached(owner: str, module: str, node: Node, has_self: bool) -> str:
    """The path, from the frame's `self`, of the module whose mode decides what `node` computes."""
    prefix = f"{owner}." if owner else ""
    if has_self and module == owner:
        return ""
    if has_self and module.startswith(prefix):
        return module[len(prefix) :]
    line = node.source.line if node.source else 0
    raise Unreachable(
        f"its `{node.op}` (line {line}) computes otherwise in training, and nothing its function holds says "
        "which mode the model is in"
    )


def _attribute(text: str) -> tuple[str, str]:
    """(module path from `self`, attribute) for a number spelled `self.<path>.<attribute>`
    (`self.layers[0].norm.eps` is ("layers.0.norm", "eps"))."""
    parts = text.replace("[", ".").replace("]", "").split(".")
    if len(parts) < 2 or parts[0] != "self":
        return ("\0", text)
    return (".".join(parts[1:-1]), parts[-1])
