"""Sketch every GEMM call of a model's forwards, by call site, under a `TorchFunctionMode`.

A site is the innermost frame of model code the call was made from (the user's code, or a model
library's: the provenance the analysis gives its nodes, `capture.UserCode`) with the op: the line
`self.fc(x)` of N repeated layers is one site called N times a forward.  Of one call in every
`sample_every` of a site, its input, weight and output are folded into the site's sketches; a weight
(a parameter) is folded once, however many calls read it, and its effective rank computed then.

Where the sketches so far make a change look possible (2:4 groups, outlier channels, a low rank),
the sampled call is run again with the change made to its operands, and the error that makes in its
output is kept: the risk each opportunity states is measured on the data, not guessed.

With `keep_calls`, the operands of a site's first sampled calls are kept in the form `x @ weight.T`
(a linear, or a matmul by a 2-D matrix), the input copied and the weight referenced: what measuring
a specialisation against the dense GEMM on the probe's own batches runs on.

A residual add that takes a site's output (`x = x + self.proj(h)`) keeps ‖output‖² and ‖residual‖²
at that site: a block whose output barely moves the residual stream is near the identity.
"""

from __future__ import annotations

import sys
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode

from fuselens.analysis.capture import UserCode

from . import numerics
from .distinct import EXACT, DistinctCounter, fingerprint
from .gemms import GemmCall, gemm_call, with_operands
from .sketch import OUTLIER_FACTOR, RoleState, last, quantized

# A larger weight's rank is not computed (its Gram matrix takes too long): on a CPU, a 2048 × 4096
# weight's; on a GPU, a 16384 × 16384 one's.
MAX_RANK_ELEMENTS = {"cpu": 1 << 23, "cuda": 1 << 28}
SPARSE_CANDIDATE = 0.8  # 2:4 fraction so far above which a pruned call is run to measure its error
LOW_RANK_SHARE = 0.25  # a weight of effective rank up to this share of its smaller dim is a low-rank candidate
QUANT_SCHEMES = ("fp8", "fp8_channel", "int8", "int8_channel")
_ADDS = frozenset({"add", "__add__", "__radd__", "__iadd__", "add_"})
_PASSES = frozenset({"dropout", "contiguous", "clone"})  # ops whose output stands for their input here


@dataclass
class SiteState:
    file: str
    line: int
    function: str
    op: str
    library: bool
    calls: int = 0
    sampled: int = 0
    flops_per_call: int = 0
    bytes_per_call: int = 0
    element_bytes: int = 4
    shapes: dict[str, list[int]] = field(default_factory=dict)  # "input", "weight", "output" of the first call
    roles: dict[str, RoleState] = field(default_factory=dict)
    weights: set[int] = field(default_factory=set)  # ids of the parameters seen as the weight
    distinct: DistinctCounter = field(default_factory=DistinctCounter)
    errors: dict[str, torch.Tensor] = field(default_factory=dict)  # change -> (‖Δout‖², ‖out‖²)
    residual: torch.Tensor | None = None  # (‖output‖², ‖residual‖²) where a residual add takes the output
    factors: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # low-rank weights
    kept: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (x, weight): x @ weight.T
    channel_max: torch.Tensor | None = None  # of the kept inputs' channels (K), over every kept call

    def state_bytes(self) -> int:
        """What the site holds besides the weights' low-rank factors: bounded by its channels, not its calls."""
        held = sum(r.state_bytes() for r in self.roles.values()) + len(self.distinct.registers) + 8 * EXACT
        held += sum(t.numel() * t.element_size() for t in self.errors.values())
        return held + 16 * len(self.weights)


class ProbeMode(TorchFunctionMode):
    def __init__(
        self, user_code: UserCode, sample_every: int = 1, stop_at: types.CodeType | None = None, keep_calls: int = 0
    ):
        super().__init__()
        self.user_code = user_code
        self.sample_every = max(1, sample_every)
        self.keep_calls = keep_calls
        self.stop_at = stop_at
        self.sites: dict[tuple[str, int, str], SiteState] = {}
        self._outputs: dict[int, tuple[weakref.ref, SiteState]] = {}

    def end_batch(self) -> None:
        self._outputs.clear()

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        out = func(*args, **kwargs)
        call = gemm_call(name, args, kwargs)
        if call is not None and isinstance(out, torch.Tensor):
            site = self._site(call.op)
            site.calls += 1
            if (site.calls - 1) % self.sample_every == 0:
                self._sketch(site, call, out, _again(func, name, args, kwargs))
            self._outputs[id(out)] = (weakref.ref(out), site)
        elif name in _ADDS:
            self._residual(args)
        elif name in _PASSES and args and isinstance(out, torch.Tensor):
            held = self._outputs.get(id(args[0]))
            if held is not None and held[0]() is args[0]:
                self._outputs[id(out)] = (weakref.ref(out), held[1])
        return out

    # ---- where a call is made --------------------------------------------------------------------
    def _site(self, op: str) -> SiteState:
        frame: types.FrameType | None = sys._getframe(2)
        while frame is not None and frame.f_code is not self.stop_at:
            if self.user_code.model_code(frame.f_code.co_filename):
                break
            frame = frame.f_back
        if frame is None or frame.f_code is self.stop_at:
            file, line, function, library = "<unknown>", 0, "", False
        else:
            code = frame.f_code
            file, line, function = code.co_filename, _line(frame), code.co_qualname
            library = not self.user_code(code.co_filename)
        key = (file, line, op)
        site = self.sites.get(key)
        if site is None:
            site = self.sites[key] = SiteState(file, line, function, op, library)
        return site

    # ---- what a call is folded into ---------------------------------------------------------------
    def _sketch(self, site: SiteState, call: GemmCall, out: torch.Tensor, again: Callable) -> None:
        site.sampled += 1
        if not site.roles:
            site.roles = {
                "input": RoleState("input", call.a_reduction, call.a_channel),
                "weight": RoleState("weight", call.b_reduction, call.b_channel),
                "output": RoleState("output", call.output_channel, call.output_channel),
            }
            site.flops_per_call = call.flops(out)
            site.element_bytes = call.a.element_size()
            site.bytes_per_call = sum(t.numel() * t.element_size() for t in (call.a, call.b, out))
            site.shapes = {"input": list(call.a.shape), "weight": list(call.b.shape), "output": list(out.shape)}
        site.roles["input"].fold(call.a)
        site.roles["output"].fold(out)
        parameter = isinstance(call.b, torch.nn.Parameter)
        if not parameter or id(call.b) not in site.weights:
            site.roles["weight"].fold(call.b)
            if parameter:
                site.weights.add(id(call.b))
                self._rank(site, call.b)
        # A repeat is the same input meeting the same weight: one input into two layers' weights is not one.
        weight_key = repr(("parameter", id(call.b))).encode() if parameter else fingerprint(call.b)
        site.distinct.add(fingerprint(call.a) + weight_key)
        self._measure_changes(site, call, out, again)
        if len(site.kept) < self.keep_calls:
            _keep(site, call)

    def _rank(self, site: SiteState, weight: torch.Tensor) -> None:
        if weight.dim() < 2 or weight.numel() > MAX_RANK_ELEMENTS.get(weight.device.type, MAX_RANK_ELEMENTS["cpu"]):
            return
        role = site.roles["weight"]
        smaller = min(weight.shape[0], weight[0].numel())
        found = numerics.effective_rank(weight, LOW_RANK_SHARE)
        role.rank_of = smaller  # (the largest over the layers lies within the largest of their bounds)
        role.rank = max(role.rank or 0, found.rank)
        role.rank_low = max(role.rank_low or 0, found.low)
        role.rank_high = max(role.rank_high or 0, found.high)
        if found.high <= LOW_RANK_SHARE * smaller:
            site.factors[id(weight)] = numerics.low_rank_factors(weight, found.high)

    def _measure_changes(self, site: SiteState, call: GemmCall, out: torch.Tensor, again: Callable) -> None:
        """The call run again with each change its sketches make a candidate, and the error kept."""
        a, b = call.a, call.b
        changes: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        inputs, weights = site.roles["input"], site.roles["weight"]
        if inputs.sparse_24_fraction() >= SPARSE_CANDIDATE:
            changes["prune_input"] = (_along(a, call.a_reduction, numerics.prune_24), b)
        if weights.sparse_24_fraction() >= SPARSE_CANDIDATE:
            changes["prune_weight"] = (a, _along(b, call.b_reduction, numerics.prune_24))
        if max(inputs.outliers()[0], weights.outliers()[0]) > OUTLIER_FACTOR:
            for scheme in QUANT_SCHEMES:
                through = _through(scheme)
                changes[scheme] = (_along(a, call.a_channel, through), _along(b, call.b_channel, through))
        factors = site.factors.get(id(b))
        if factors is not None:
            changes["low_rank"] = (a, (factors[0] @ factors[1]).reshape(b.shape).to(b.dtype))
        reference = out.detach().float()
        for change, (changed_a, changed_b) in changes.items():
            changed = again(changed_a, changed_b).detach().float()
            sums = torch.stack([(changed - reference).square().sum().double(), reference.square().sum().double()])
            site.errors[change] = site.errors[change] + sums if change in site.errors else sums

    def _residual(self, args: tuple) -> None:
        if len(args) < 2 or not all(isinstance(t, torch.Tensor) for t in args[:2]):
            return
        pair: list[tuple[torch.Tensor, torch.Tensor]] = [(args[0], args[1]), (args[1], args[0])]
        for mine, other in pair:
            held = self._outputs.get(id(mine))
            if held is None or held[0]() is not mine or other.shape != mine.shape:
                continue
            paired = self._outputs.get(id(other))
            if paired is not None and paired[0]() is other:  # the sum of two GEMMs' outputs, not a residual
                return
            site = held[1]
            sums = torch.stack(
                [mine.detach().float().square().sum().double(),
                 other.detach().float().square().sum().double()]
            )  # fmt: skip
            site.residual = sums if site.residual is None else site.residual + sums
            return


def _keep(site: SiteState, call: GemmCall) -> None:
    """Keep the call's operands as (x, weight) with the output x @ weight.T, where it is one."""
    if call.op == "linear" and call.b.dim() == 2:
        weight = call.b.detach()
    elif call.op in ("matmul", "mm", "addmm") and call.b.dim() == 2 and call.b_reduction in (0, -2):
        weight = call.b.detach().T
    else:
        return
    x = call.a.detach().clone()
    channel_max = x.abs().reshape(-1, x.shape[-1]).amax(0).float()
    site.channel_max = channel_max if site.channel_max is None else torch.maximum(site.channel_max, channel_max)
    site.kept.append((x, weight))


def _through(scheme: str) -> Callable[[torch.Tensor], torch.Tensor]:
    def change(x: torch.Tensor) -> torch.Tensor:
        return quantized(x, scheme)

    return change


def _again(func: Callable, name: str, args: tuple, kwargs: dict) -> Callable:
    """The call, made again with other operands."""

    def call(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        changed_args, changed_kwargs = with_operands(name, args, kwargs, a, b)
        return func(*changed_args, **changed_kwargs)

    return call


def _along(x: torch.Tensor, dim: int, change: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`change` applied to `x` with `dim` last, in `x`'s layout and dtype again."""
    return change(last(x, dim)).movedim(-1, dim).to(x.dtype)


_POSITIONS: dict[types.CodeType, list] = {}


def _line(frame: types.FrameType) -> int:
    """The first line of the expression `frame` is evaluating, as the analysis places an op."""
    positions = _POSITIONS.get(frame.f_code)
    if positions is None:
        positions = _POSITIONS[frame.f_code] = list(frame.f_code.co_positions())
    index = frame.f_lasti // 2
    if 0 <= index < len(positions) and positions[index][0] is not None:
        return int(positions[index][0])
    return frame.f_lineno
