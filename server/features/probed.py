"""What a probe (`fuselens probe`, the Probe lens) shows in the editor: a GEMM line's sketches and
opportunities in its hover, the count of opportunities in the model's lens."""

from __future__ import annotations

from fuselens.contracts.probe import MeasuredSpecialisation, Opportunity, ProbeReport, ProbeSite, RoleSketch, rank_text
from fuselens.contracts.report import Library, Report
from fuselens.contracts.units import library_path

from .text import same_file


def probe_title(probe: ProbeReport | None, model: str) -> str:
    probed = next((m for m in probe.models if m.name == model), None) if probe is not None else None
    if probed is None or probed.problem:
        return "Probe"
    found = sum(len(site.opportunities) for site in probed.sites)
    return f"◇ {found} opportunit{'y' if found == 1 else 'ies'} in {len(probed.sites)} GEMM sites · Probe again"


def sites_at(probe: ProbeReport, path: str, line: int) -> list[ProbeSite]:
    return [s for m in probe.models for s in m.sites if s.line == line and same_file(s.file, path)]


MAX_REACHED = 8  # the sites of code elsewhere listed in the hover of the line that reaches them


def reached_sites(probe: ProbeReport, report: Report, path: str, line: int) -> list[tuple[str, list[ProbeSite]]]:
    """For each model defined at `line` (`model = LlamaForCausalLM(config)`), its probed sites in code
    other than this file (a library's), which no line of this file can show: (the model, its sites)."""
    found = []
    for model in report.models:
        if model.line != line or not same_file(model.file, path):
            continue
        probed = next((m for m in probe.models if m.name == model.name and not m.problem), None)
        elsewhere = [s for s in probed.sites if not same_file(s.file, path)] if probed is not None else []
        if elsewhere:
            found.append((model.name, elsewhere))
    return found


def describe_reached(model: str, sites: list[ProbeSite], libraries: list[Library]) -> str:
    """The hover of a line whose model runs library code: each GEMM site there, its line as it reads,
    its sketches in brief and its opportunities; the sites with opportunities first, then the most called."""
    found = sum(len(s.opportunities) for s in sites)
    files = sorted({library_path(s.file, libraries) for s in sites})
    shown = sorted(sites, key=lambda s: (not s.opportunities, -s.calls))[:MAX_REACHED]
    parts = [
        f"◇ **probe of `{model}`**: {len(sites)} GEMM sites in the code it runs ({', '.join(f'`{f}`' for f in files)}), "
        f"{found} opportunit{'y' if found == 1 else 'ies'}"
    ]
    for site in shown:
        where = f"`{library_path(site.file, libraries).rsplit('/', 1)[-1]}:{site.line}`"
        layers = f" over {site.layers} layers" if site.layers > 1 else ""
        kinds = ", ".join(f"**{o.kind}**" for o in site.opportunities) or "no structure to exploit"
        parts.append(f"- {where} `{site.code or site.op}`: {site.calls} calls{layers}; {_brief(site)}; {kinds}")
    if len(sites) > len(shown):
        parts.append(f"- _… {len(sites) - len(shown)} more sites (fuselens probe lists them all)_")
    return "\n".join(parts)


def _brief(site: ProbeSite) -> str:
    """A site's sketches in a few figures: the input's 2:4 share and channel spread, the weight's rank."""
    roles = {r.role: r for r in site.roles}
    text = []
    if (inputs := roles.get("input")) is not None:
        text.append(
            f"input 2:4 {inputs.sparse_24_fraction:.0%}, max/median channel {inputs.channel_max_to_median:.1f}, "
            f"fp8 {inputs.fp8_error:.1%}"
        )
    weight = roles.get("weight")
    if weight is not None and weight.effective_rank is not None:
        text.append(f"weight rank {rank_text(weight)} of {weight.rank_of}")
    return ", ".join(text) or site.op


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
        text += f", rank {rank_text(r)} of {r.rank_of}"
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
        if m.kernel_speedup is not None:
            text += f", the kernel alone {m.kernel_ms:.4f} ms ({m.kernel_speedup:.2f}×) on an input quantized ahead"
    return text + (f"; {m.note}" if m.note else "")
