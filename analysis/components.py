"""Connected components: the sets of items that links join, directly or through other items."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import TypeVar

Item = TypeVar("Item", bound=Hashable)


def components(items: Iterable[Item], links: Iterable[tuple[Item, Item]]) -> list[set[Item]]:
    """The items as the sets that `links` (pairs of items) join."""
    parent = {item: item for item in items}

    def root(item: Item) -> Item:
        while parent[item] != item:
            parent[item] = parent[parent[item]]
            item = parent[item]
        return item

    for a, b in links:
        parent[root(a)] = root(b)
    sets: dict[Item, set[Item]] = {}
    for item in parent:
        sets.setdefault(root(item), set()).add(item)
    return list(sets.values())
