"""Which group a trace's detection found is which cluster of a report.

A report names each cluster's instances by their place among the groups detection finds in a trace
of the cluster's path (`Cluster.positions`); a later trace of the same model on real tensors finds
the same groups in the same order.  A group is taken for the cluster only when its ops are the
cluster's (same ops, same lines), so a same-looking group elsewhere never stands in for it.
"""

from __future__ import annotations

import os

from fuselens.contracts.report import Cluster

from .detect import Group
from .graph import Graph

Signature = tuple[tuple[str, str, int | None], ...]


def signature_of_ops(graph: Graph, compute: list[int]) -> Signature:
    return tuple((graph[i].op, os.path.abspath(graph[i].file) if graph[i].file else "", graph[i].line) for i in compute)


def signature_of_cluster(cluster: Cluster) -> Signature:
    return tuple((op.target, os.path.abspath(op.file) if op.file else "", op.line) for op in cluster.ops)


def groups_of(cluster: Cluster, graph: Graph, groups: list[Group]) -> list[Group]:
    """The groups of `groups` (detected in `graph`, a trace of the cluster's path) that are its instances
    (the cluster's part of each, where it is a part)."""
    wanted = signature_of_cluster(cluster)
    found = []
    for k, p in enumerate(cluster.positions):
        part = cluster.parts[k] if k < len(cluster.parts) else []
        group = part_of(part, groups[p]) if p < len(groups) else None
        if group is not None and signature_of_ops(graph, group.compute(graph)) == wanted:
            found.append(group)
    return found


def part_of(part: list[int], group: Group) -> Group | None:
    """A part of a detected group (`Cluster.parts`: the places of its members among the group's); the
    whole group for no part, None where the group has no such part."""
    if not part:
        return group
    members = sorted(group.members)
    if max(part) >= len(members):
        return None
    return Group({members[i] for i in part}, group.splits)
