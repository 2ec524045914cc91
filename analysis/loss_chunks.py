"""How many tokens one chunk of the fused linear cross-entropy computes the logits of.

One function, shared by the analysis (the memory it reports) and the kernel module's runtime (which
carries its text): the chunk is the largest power of two of tokens whose logits fit in CHUNK_BYTES, so
that the gradient GEMMs stay large (a weight gradient accumulated over few chunks) while the logits of
a 128k vocabulary never take more than a gigabyte.
"""

from __future__ import annotations


def chunk_tokens(tokens: int, vocabulary: int, element_size: int, limit: int = 1 << 30) -> int:
    """The tokens of one chunk: a power of two whose `vocabulary`-wide rows of `element_size` bytes take
    at most `limit` bytes (at least one token, at most all of them)."""
    rows = max(1, limit // max(1, vocabulary * element_size))
    chunk = 1 << (rows.bit_length() - 1)
    return max(1, min(tokens, chunk))
