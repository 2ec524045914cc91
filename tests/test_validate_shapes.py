"""The smaller input shapes validation runs a model at: halved while the model keeps its clusters."""

from __future__ import annotations

from fuselens.contracts.config import InputSpec
from fuselens.validate.shapes import scaled_specs


def _residual_of_two_inputs(specs: list[InputSpec]):
    """What a meta trace of `x + gamma * fc2(h)` says at `specs`: None where x's and h's batch and
    sequence disagree (the add cannot broadcast them), else one cluster of the size of x."""
    x, h = (s.shape for s in specs)
    if x[:2] != h[:2] or x[2] != 768 or h[2] != 3072:
        return None
    return ("the residual's cluster",), x[0] * x[1] * x[2]


def test_a_batch_and_sequence_two_inputs_share_are_halved_in_both():
    specs = [InputSpec([4, 4096, 768], "bfloat16"), InputSpec([4, 4096, 3072], "bfloat16")]
    shapes = [s.shape for s in scaled_specs(specs, _residual_of_two_inputs)]
    assert shapes[0][:2] == shapes[1][:2] and shapes[0][0] * shapes[0][1] * 768 <= 1 << 17, shapes
    assert [s[2] for s in shapes] == [768, 3072]  # the widths the weights fix stay
