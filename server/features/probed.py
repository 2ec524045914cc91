"""What a probe (`fuselens probe`, the Probe lens) shows in the editor: a GEMM line's sketches and
opportunities in its hover, the count of opportunities in the model's lens."""

from __future__ import annotations

from fuselens.contracts.probe import MeasuredSpecialisation, Opportunity, ProbeReport, ProbeSite, RoleSketch

from .text import same_file


def probe_title(probe: ProbeReport | None, model: str) -> str:
    probed = next((m for m in probe.models if m.name == model), None) if probe is not None else None
    if probed is None or probed.problem:
        return "Probe"
    found = sum(len(site.opportunities) for site in probed.sites)
    return f"◇ {found} opportunit{'y' if found == 1 else 'ies'} in {len(probed.sites)} GEMM sites · Probe again"


def sites_at(probe: ProbeReport, path: str, line: int) -> list[ProbeSite]:
    return [s for m in probe.models for s in m.sites if s.line == line and same_file(s.file, path)]


def describe_site(site: ProbeSite) -> str:
    """The hover of a probed GEMM line: its calls, each role's sketch, its opportunities."""
    layers = f" over {site.layers} layers" if site.layers > 1 else ""
    sampled = f", {site.sampled} sketched" if site.sampled != site.calls else ""
    parts = [
        f"◇ **probe: `{site.op}`**, {site.calls} calls{layers}{sampled}; "
        f"{site.distinct_inputs} distinct inputs"
        + (f"; residual ratio {site.residual_ratio:.1%}" if site.residual_ratio is not None else "")
    ]
    parts += [f"- {_role(r)}" for r in site.roles]
    parts += [_opportunity(o) for o in site.opportunities] or ["no structure to exploit in these values"]
    parts += [_measured(m) for m in site.measured]
    return "\n".join(parts)


def _role(r: RoleSketch) -> str:
    text = (
        f"**{r.role}** {tuple(r.shape)}: zeros {r.zero_fraction:.1%}, 2:4 {r.sparse_24_fraction:.1%}, "
        f"max/median channel {r.channel_max_to_median:.1f}, int8 {r.int8_error:.2%} ({r.int8_channel_error:.2%} "
        f"per channel), fp8 {r.fp8_error:.2%} ({r.fp8_channel_error:.2%} per channel)"
    )
    if r.outlier_channels:
        text += f", outlier channels {r.outlier_channels[:8]}"
    if r.effective_rank is not None:
        text += f", rank {r.effective_rank} of {r.rank_of}"
    return text


def _opportunity(o: Opportunity) -> str:
    error = "exact" if o.error is None else f"output error {o.error:.2%}"
    return f"\n**{o.kind}**: {o.summary}. {o.evidence}; {error}."


def _measured(m: MeasuredSpecialisation) -> str:
    """One opportunity made with PyTorch's kernels: its error, its time against the dense GEMM's."""
    if m.status == "not-measured":
        return f"- measured **{m.kind}**: not measured: {m.note}"
    text = f"- measured **{m.kind}** ({m.implementation}): output error {m.error:.2%}"
    if m.per_tensor_error is not None:
        text += f" ({m.per_tensor_error:.2%} with per-tensor scales)"
    if m.dense_ms is not None and m.specialised_ms is not None:
        text += f"; {m.specialised_ms:.4f} ms against the dense {m.dense_ms:.4f} ms ({m.speedup or 0:.2f}×)"
    return text + (f"; {m.note}" if m.note else "")
