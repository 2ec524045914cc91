"""One operand's sketch, folded call by call in one pass and in memory that does not grow with the calls.

What it keeps: counts (elements, zeros, 2:4 groups), sums of squares (the tensor's and its quantization
errors'), the running abs max of each channel and a histogram of log2|x|.  Everything stays on the
tensor's device until `summary()`, so folding a call waits on nothing.
"""

from __future__ import annotations

import torch

from fuselens.contracts.probe import HISTOGRAM_BINS, HISTOGRAM_LOW, HISTOGRAM_WIDTH, RoleSketch

from . import numerics

OUTLIER_FACTOR = 6.0  # a channel whose abs max is this many times the median channel's is an outlier
MAX_OUTLIERS = 32  # the outlier channels named, largest first
SCHEMES = ("int8", "int8_channel", "fp8", "fp8_channel")
MAX_SKETCHED = 1 << 16  # elements of a call's tensor its sums are taken over


def last(x: torch.Tensor, dim: int) -> torch.Tensor:
    """`x` with `dim` moved last, as float32."""
    return x.detach().float().movedim(dim, -1)


def quantized(x: torch.Tensor, scheme: str, channel_max: torch.Tensor | None = None) -> torch.Tensor:
    """`x` (channels last) through `scheme`, one of SCHEMES, scaled by `channel_max` (each channel's abs
    max; by default `x`'s own)."""
    if channel_max is None:
        channel_max = x.abs().reshape(-1, x.shape[-1]).amax(0)
    absmax = channel_max if scheme.endswith("_channel") else channel_max.max()
    return numerics.fp8(x, absmax) if scheme.startswith("fp8") else numerics.int8(x, absmax)


def spread_rows(rows: torch.Tensor) -> torch.Tensor:
    """At most `MAX_SKETCHED` elements of `rows` (2-D), as whole rows evenly spread through it (a view)."""
    keep = max(1, MAX_SKETCHED // max(rows.shape[1], 1))
    step = -(-rows.shape[0] // keep)
    return rows[::step] if step > 1 else rows


class RoleState:
    """The sketch of one role (input, weight or output) of a site."""

    def __init__(self, role: str, reduction_dim: int, channel_dim: int):
        self.role = role
        self.reduction_dim = reduction_dim
        self.channel_dim = channel_dim
        self.shape: list[int] = []
        self.elements = 0
        self.sketched = 0  # the elements the sums were taken over
        self.groups = 0
        self.folds = 0
        self._sums: torch.Tensor | None = None  # zeros, 2:4 groups, ‖x‖², then each scheme's ‖q(x) − x‖²
        self._channel_max: torch.Tensor | None = None
        self._histogram: torch.Tensor | None = None
        self.rank: int | None = None
        self.rank_of: int | None = None
        self.rank_low: int | None = None
        self.rank_high: int | None = None

    def fold(self, x: torch.Tensor) -> None:
        """Fold one call's tensor: channel maxima over all of it; the sums over rows spread evenly
        through it, at most `MAX_SKETCHED` elements (the scales a quantizer would use are the whole
        tensor's, from its channel maxima)."""
        if not self.shape:
            self.shape = list(x.shape)
        channels = x.detach().movedim(self.channel_dim, -1)
        channel_max = channels.abs().reshape(-1, channels.shape[-1]).amax(0).float()
        by_channel = spread_rows(channels.reshape(-1, channels.shape[-1])).float()
        if self.reduction_dim == self.channel_dim:
            by_reduction = by_channel
        else:
            reduced = x.detach().movedim(self.reduction_dim, -1)
            by_reduction = spread_rows(reduced.reshape(-1, reduced.shape[-1])).float()
        sparse, groups = numerics.sparse_24_groups(by_reduction)
        signal = by_channel.square().sum()
        errors = [(quantized(by_channel, s, channel_max) - by_channel).square().sum() for s in SCHEMES]
        zeros = (by_channel == 0).sum()
        sums = torch.stack([zeros.float(), sparse.float(), signal, *errors]).double()
        histogram = _log2_histogram(by_channel)
        if self._sums is None or self._channel_max is None or self._histogram is None:
            self._sums, self._channel_max, self._histogram = sums, channel_max, histogram
        else:
            self._sums += sums
            if channel_max.shape == self._channel_max.shape:  # (calls that differ in channels: the first's kept)
                self._channel_max = torch.maximum(self._channel_max, channel_max)
            self._histogram += histogram
        self.elements += x.numel()
        self.sketched += by_channel.numel()
        self.groups += groups
        self.folds += 1

    def channel_max(self) -> torch.Tensor | None:
        return self._channel_max

    def outliers(self) -> tuple[float, list[int]]:
        """The largest channel's abs max over the median channel's, and the outlier channels."""
        if self._channel_max is None:
            return 0.0, []
        maxima = self._channel_max.float().cpu()
        nonzero = maxima[maxima > 0]
        if nonzero.numel() == 0:
            return 0.0, []
        median = float(nonzero.median())
        ratio = float(maxima.max()) / median
        order = torch.argsort(maxima, descending=True)
        named = [int(i) for i in order[:MAX_OUTLIERS] if float(maxima[i]) > OUTLIER_FACTOR * median]
        return ratio, named

    def sparse_24_fraction(self) -> float:
        if self._sums is None or not self.groups:
            return 0.0
        return float(self._sums[1]) / self.groups

    def summary(self) -> RoleSketch:
        sums = self._sums.cpu().tolist() if self._sums is not None else [0.0] * (3 + len(SCHEMES))
        zeros, _, signal, *errors = sums
        relative = [(e / signal) ** 0.5 if signal > 0 else 0.0 for e in errors]
        ratio, named = self.outliers()
        histogram = self._histogram.cpu().tolist() if self._histogram is not None else [0] * HISTOGRAM_BINS
        channels = int(self._channel_max.numel()) if self._channel_max is not None else 0
        absmax = float(self._channel_max.max()) if self._channel_max is not None and channels else 0.0
        return RoleSketch(
            role=self.role,  # type: ignore[arg-type]
            shape=self.shape,
            elements=self.elements,
            zero_fraction=round(zeros / self.sketched, 6) if self.sketched else 0.0,
            sparse_24_fraction=round(self.sparse_24_fraction(), 6),
            channel_dim=self.channel_dim,
            channels=channels,
            absmax=absmax,
            channel_max_to_median=round(ratio, 3),
            outlier_channels=named,
            int8_error=round(relative[0], 6),
            int8_channel_error=round(relative[1], 6),
            fp8_error=round(relative[2], 6),
            fp8_channel_error=round(relative[3], 6),
            histogram=[int(c) for c in histogram],
            effective_rank=self.rank,
            rank_of=self.rank_of,
            rank_low=self.rank_low,
            rank_high=self.rank_high,
        )

    def state_bytes(self) -> int:
        """The memory the sketch holds, whatever the calls folded: what bounds it is the channel count."""
        tensors = [t for t in (self._sums, self._channel_max, self._histogram) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)


def _log2_histogram(x: torch.Tensor) -> torch.Tensor:
    magnitudes = x.abs().reshape(-1)
    logs = magnitudes[magnitudes > 0].log2()
    bins = ((logs - HISTOGRAM_LOW) / HISTOGRAM_WIDTH).floor().clamp(0, HISTOGRAM_BINS - 1).long()
    return torch.bincount(bins, minlength=HISTOGRAM_BINS)
