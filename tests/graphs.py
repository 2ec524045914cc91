"""Build small graphs by hand, to test passes without tracing a model."""

from __future__ import annotations

from fuselens.analysis.graph import Frame, Graph, Node, Ref, TensorMeta
from fuselens.analysis.ops import op_class


def contiguous(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


class Builder:
    """b = Builder(); x = b.input([4, 8]); y = b.op("relu", x); b.output(y)"""

    def __init__(self, file: str = "model.py"):
        self.graph = Graph()
        self.file = file
        self.line = 10

    def _add(self, op, cls, args, shape, dtype, params=None, name="", line=None) -> int:
        meta = TensorMeta(tuple(shape), contiguous(shape), dtype) if shape is not None else None
        if line is None and cls.value != "source":
            self.line += 1
            line = self.line
        frame = (Frame(self.file, line, "Net.forward", 0),) if line else ()
        node = Node(
            len(self.graph.nodes),
            op,
            cls,
            list(args),
            dict(params or {}),
            meta,
            source=frame[0] if frame else None,
            stack=frame,
            name=name,
        )
        self.graph.add(node)
        return node.id

    def input(self, shape, dtype="float32", name="x") -> int:
        return self._add("input", op_class("input"), [], shape, dtype, name=name)

    def param(self, shape, dtype="float32", name="w") -> int:
        return self._add("param", op_class("param"), [], shape, dtype, name=name)

    def op(self, op, *args, shape=None, dtype="float32", params=None, line=None) -> int:
        refs = [
            Ref(a)
            if isinstance(a, int) and not isinstance(a, bool) and a < len(self.graph.nodes) and not isinstance(a, float)
            else a
            for a in args
        ]
        if shape is None:
            first = next(a for a in refs if isinstance(a, Ref))
            shape = self.graph[first.node].meta.shape
        return self._add(op, op_class(op), refs, shape, dtype, params, line=line)

    def const(self, value: float):
        return float(value)  # scalars are plain values in args

    def output(self, *values) -> int:
        return self._add("output", op_class("output"), [Ref(v) for v in values], None, "float32", line=99)
