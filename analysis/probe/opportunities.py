"""What a site's sketches allow: the opportunities, each with its saving from the shapes and the error
measured on the data.  A site with no structure in its values gets none: every dense GEMM can be
quantized somewhat, so quantization is named where the data decide the scheme (outlier channels).
"""

from __future__ import annotations

import linecache

from fuselens.contracts.probe import Opportunity, ProbeSite, RoleSketch

from .recorder import LOW_RANK_SHARE, SiteState

SPARSE_24 = 0.9  # an operand with this share of its groups of 4 already 2:4 is a 2:4 candidate
# The relative output error a quantized GEMM may make: int8 rounds to 1/127 of the scale; e4m3 keeps 3
# mantissa bits, a few percent on any data, so only a scale too large for its values makes it worse.
QUANT_ERROR = {"int8": 0.015, "fp8": 0.05}
REPEATED = 0.5  # a site whose distinct inputs are at most this share of its sampled calls repeats them
MIN_REPEAT_CALLS = 4  # sampled calls before a repeat is believed
NEAR_IDENTITY = 0.05  # ‖block output‖ / ‖residual‖ below which a residual branch is near the identity
SPARSE_METADATA = 1 / 16  # a 2:4 operand's index bits per element, against its 16-bit values


def site_summary(state: SiteState, batches: int) -> ProbeSite:
    roles = [state.roles[r].summary() for r in ("input", "weight", "output") if r in state.roles]
    residual = None
    if state.residual is not None:
        output, stream = state.residual.cpu().tolist()
        residual = round((output / stream) ** 0.5, 6) if stream > 0 else None
    site = ProbeSite(
        file=state.file,
        line=state.line,
        function=state.function,
        op=state.op,
        calls=state.calls,
        sampled=state.sampled,
        layers=max(len(state.weights), 1),
        flops_per_call=state.flops_per_call,
        bytes_per_call=state.bytes_per_call,
        distinct_inputs=min(state.distinct.estimate(), state.sampled),
        roles=roles,
        residual_ratio=residual,
        library=state.library,
        code=linecache.getline(state.file, state.line).strip(),
    )
    site.opportunities = opportunities(state, site, batches)
    return site


def opportunities(state: SiteState, site: ProbeSite, batches: int) -> list[Opportunity]:
    roles: dict[str, RoleSketch] = {r.role: r for r in site.roles}
    errors = {change: _relative(sums) for change, sums in state.errors.items()}
    per_forward = site.calls / max(batches, 1)
    found = [
        *_sparse(state, roles, errors, per_forward),
        *_quantize(state, roles, errors, per_forward),
        *_low_rank(state, roles, errors, per_forward),
        *_memoize(site, per_forward),
        *_near_identity(site, per_forward),
    ]
    return found


def _relative(sums) -> float:
    changed, reference = sums.cpu().tolist()
    return round((changed / reference) ** 0.5, 6) if reference > 0 else 0.0


def _operand_bytes(state: SiteState, role: str) -> int:
    shape = state.shapes.get(role, [])
    count = 1
    for size in shape:
        count *= size
    return count * state.element_bytes


def _sparse(state: SiteState, roles: dict[str, RoleSketch], errors: dict[str, float], per_forward: float):
    for role in ("input", "weight"):
        sketch = roles.get(role)
        if sketch is None or sketch.sparse_24_fraction < SPARSE_24 or sketch.zero_fraction >= 0.999:
            continue
        error = errors.get(f"prune_{role}")
        yield Opportunity(
            kind="sparse-2:4",
            summary=f"2:4 semi-structured sparse GEMM on the {role} (sparse tensor cores: half the multiplies)",
            evidence=(
                f"{sketch.sparse_24_fraction:.1%} of the {role}'s groups of 4 along the reduction dim are already "
                f"2:4; {sketch.zero_fraction:.1%} zeros"
            ),
            flops_saved=round(state.flops_per_call * per_forward / 2),
            bytes_saved=round(_operand_bytes(state, role) * (0.5 - SPARSE_METADATA) * per_forward),
            error=error,
            risk=_risk(error, f"pruning the {role}'s other groups to 2:4"),
            role=role,
        )


def _quantize(state: SiteState, roles: dict[str, RoleSketch], errors: dict[str, float], per_forward: float):
    """Where outlier channels decide the scheme: the cheapest scheme whose measured error is low enough."""
    outliers = [r for r in (roles.get("input"), roles.get("weight")) if r is not None and r.outlier_channels]
    if not outliers or not all(s in errors for s in ("fp8", "fp8_channel", "int8", "int8_channel")):
        return
    named = "; ".join(f"{r.role} channels {_indices(r.outlier_channels)} ({r.channel_max_to_median:.0f}× the median)"
                      for r in outliers)  # fmt: skip
    measured = (
        f"output error int8 {errors['int8']:.2%} per-tensor, {errors['int8_channel']:.2%} per-channel; "
        f"fp8 e4m3 {errors['fp8']:.2%} per-tensor, {errors['fp8_channel']:.2%} per-channel"
    )
    for scheme, label in (
        ("int8", "int8 GEMM with per-tensor scales"),
        ("int8_channel", "int8 GEMM with per-channel scales"),
        ("fp8", "fp8 (e4m3) GEMM with per-tensor scales"),
        ("fp8_channel", "fp8 (e4m3) GEMM with per-channel scales"),
    ):
        if errors[scheme] > QUANT_ERROR[scheme.removesuffix("_channel")]:
            continue
        why = ""
        if scheme.endswith("_channel"):
            fails = scheme.removesuffix("_channel")
            why = f"; per-tensor scales fail ({errors[fails]:.1%}) because of the outlier channels"
            why += " (an input's channel scales fold into the weight)"
        operands = _operand_bytes(state, "input") + _operand_bytes(state, "weight")
        yield Opportunity(
            kind="quantize",
            summary=label + why,
            evidence=f"outliers: {named}; {measured}",
            flops_saved=round(state.flops_per_call * per_forward / 2),  # (the 8-bit tensor-core rate is twice bf16's)
            bytes_saved=round(operands * (1 - 1 / max(state.element_bytes, 1)) * per_forward),
            error=errors[scheme],
            risk=_risk(errors[scheme], label.split(" GEMM")[0]),
            scheme=scheme,
        )
        return


def _low_rank(state: SiteState, roles: dict[str, RoleSketch], errors: dict[str, float], per_forward: float):
    weight = roles.get("weight")
    if weight is None or weight.effective_rank is None or not weight.rank_of or "low_rank" not in errors:
        return
    rank, smaller = weight.effective_rank, weight.rank_of
    if rank > LOW_RANK_SHARE * smaller:
        return
    rows = state.shapes["weight"][0]
    cols = _operand_bytes(state, "weight") // max(state.element_bytes * rows, 1)
    kept = rank * (rows + cols) / (rows * cols)
    yield Opportunity(
        kind="low-rank",
        summary=f"factorise the weight into {rows}×{rank} and {rank}×{cols} (two GEMMs of rank {rank})",
        evidence=f"99% of the weight's energy is in {rank} of {smaller} singular values"
        + (f" (the largest rank over {site_layers(state)} layers)" if site_layers(state) > 1 else ""),
        flops_saved=round(state.flops_per_call * (1 - kept) * per_forward),
        bytes_saved=round(_operand_bytes(state, "weight") * (1 - kept) * per_forward),
        error=errors["low_rank"],
        risk=_risk(errors["low_rank"], f"the rank-{rank} weight"),
    )


def site_layers(state: SiteState) -> int:
    return max(len(state.weights), 1)


def _memoize(site: ProbeSite, per_forward: float):
    if site.sampled < MIN_REPEAT_CALLS or site.distinct_inputs > REPEATED * site.sampled:
        return
    repeated = 1 - site.distinct_inputs / site.sampled
    yield Opportunity(
        kind="memoize",
        summary="memoise the output by its input (a hash and an exact check, then the stored output)",
        evidence=f"{site.distinct_inputs} distinct inputs in {site.sampled} sampled calls",
        flops_saved=round(site.flops_per_call * per_forward * repeated),
        bytes_saved=0,
        error=None,
        risk="none: a hit is checked to be the same input, so the output is the same",
    )


def _near_identity(site: ProbeSite, per_forward: float):
    if site.residual_ratio is None or site.residual_ratio > NEAR_IDENTITY:
        return
    yield Opportunity(
        kind="near-identity",
        summary="the residual branch ending here barely changes the stream: a candidate to skip",
        evidence=f"‖branch output‖ / ‖residual‖ = {site.residual_ratio:.2%} at the add that takes this output",
        flops_saved=round(site.flops_per_call * per_forward),  # at least this GEMM; the branch's other ops too
        bytes_saved=0,
        error=site.residual_ratio,
        risk=f"skipping the branch changes the residual stream by {site.residual_ratio:.2%} here",
    )


def _indices(indices: list[int]) -> str:
    return "[" + ", ".join(map(str, indices)) + "]"


def _risk(error: float | None, change: str) -> str:
    if error is None:
        return f"not measured: no sampled call ran with {change}"
    return f"{change} changes the output by {error:.2%} (relative, on the probed data)"
