"""The syntax tree of a source text, parsed once for every pass that reads it.

Finding the models, mapping clusters to their lines, spelling the numbers an op takes and naming the
kernels already imported all read the analyzed file's tree: in a worker job, which starts afresh for
each save, parsing it for each was a tenth of a small model's analysis.  The trees are shared, so
nothing may change one (a pass that edits a tree edits a copy: `copy.deepcopy`).
"""

from __future__ import annotations

import ast
import functools


@functools.lru_cache(maxsize=32)
def parse(text: str) -> ast.Module:
    """`ast.parse(text)`, the same tree for the same text; a SyntaxError as `ast.parse` raises it."""
    return ast.parse(text)
