"""Repeated structure: the same cluster in every layer is reported once, with a count.

Two findings are the same when they run the same ops from the same source lines on the
same shapes and dtypes; only the module instance differs (`blocks.0`, `blocks.1`, ...).
"""

from __future__ import annotations

from typing import Callable, Hashable, Iterable, TypeVar

T = TypeVar("T")


def group_repeats(items: Iterable[T], signature: Callable[[T], Hashable]) -> list[list[T]]:
    """Items grouped by signature, groups in order of first appearance."""
    groups: dict[Hashable, list[T]] = {}
    for item in items:
        groups.setdefault(signature(item), []).append(item)
    return list(groups.values())


def instance_label(paths: list[str]) -> str:
    """`blocks.0 … blocks.11` style summary of where the repeats live."""
    paths = [p or "(root)" for p in paths]
    if len(paths) <= 2:
        return ", ".join(paths)
    return f"{paths[0]} … {paths[-1]}"
