"""What one training step of a projection onto a vocabulary and its cross-entropy holds at its peak.

The step is followed moment by moment, with what is alive at each; the peak is the largest.  Only the
tensors the head and its loss make count (the parameters and the projection's input live anyway);
the gradients the step returns count from when they are made.

Eager, `F.cross_entropy(linear(x, W).float(), t)` over N tokens and V classes:

- forward: the logits (their dtype), the float32 upcast, and the log-probabilities the loss computes
  and keeps for its backward, all alive while the loss runs;
- the loss's backward: the kept log-probabilities, the gradient of them, and the gradient of its input;
- the upcast's backward: that gradient in float32 and in the logits' dtype;
- the projection's backward: the logits' gradient, the input's and the weight's.

Fused: one chunk's logits (the kernel writes their gradient over them), and the input's and weight's
gradients, made during the forward and scaled in the backward in place.
"""

from __future__ import annotations

from fuselens.contracts.report import ActivationMemory

from .graph import DTYPE_BYTES
from .loss_chunks import chunk_tokens


def activation_memory(
    tokens: int, vocabulary: int, hidden: int, dtype: str, loss_dtype: str, bias: bool
) -> ActivationMemory:
    """The peaks of one training step, eager and fused, for logits of `dtype` that the loss reads in
    `loss_dtype` (float32 where the code upcasts them)."""
    size, loss_size = DTYPE_BYTES.get(dtype, 4), DTYPE_BYTES.get(loss_dtype, 4)
    upcast = loss_dtype != dtype
    logits = tokens * vocabulary * size
    upcast_bytes = tokens * vocabulary * loss_size if upcast else 0
    saved = tokens * vocabulary * loss_size
    gradients = (tokens * hidden + vocabulary * hidden + (vocabulary if bias else 0)) * size
    eager_moments = [
        logits + upcast_bytes + saved,  # forward: logits, upcast, log-probabilities
        3 * saved,  # the loss's backward
        (upcast_bytes + logits) if upcast else 0,  # the upcast's backward
        logits + gradients,  # the projection's backward
    ]
    chunk = chunk_tokens(tokens, vocabulary, size)
    fused_peak = chunk * vocabulary * size + gradients + tokens * 4  # a chunk's logits; each row's loss
    return ActivationMemory(
        tokens=tokens,
        vocabulary=vocabulary,
        hidden=hidden,
        dtype=dtype,
        upcast=upcast,
        logits_bytes=logits,
        logits_grad_bytes=logits,
        upcast_bytes=upcast_bytes,
        saved_bytes=saved,
        chunk_tokens=chunk,
        peak_bytes_eager=max(eager_moments),
        peak_bytes_fused=fused_peak,
    )
