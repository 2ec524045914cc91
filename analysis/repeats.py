"""Repeated structure: the same cluster in every layer is reported once, with a count.

Two findings are the same when they run the same ops from the same source lines on the
same shapes and dtypes; only the module instance differs (`blocks.0`, `blocks.1`, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

T = TypeVar("T")


def group_repeats(items: Iterable[T], signature: Callable[[T], Hashable]) -> list[list[T]]:
    """Items grouped by signature, groups in order of first appearance."""
    groups: dict[Hashable, list[T]] = {}
    for item in items:
        groups.setdefault(signature(item), []).append(item)
    return list(groups.values())
