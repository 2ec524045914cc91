"""Code lenses: a summary over each analyzed model class, with its commands; with a profile, what
the forward measured."""

from __future__ import annotations

from lsprotocol import types as lsp

from fuselens.contracts import commands as command_ids
from fuselens.contracts.probe import ProbeReport
from fuselens.contracts.profile import Profile
from fuselens.contracts.report import Report, Totals
from fuselens.contracts.units import bytes_label

from .measured import model_profile, time_label
from .probed import probe_title
from .ranges import analyzed_at
from .text import lines_range, same_file


def code_lenses(
    report: Report,
    path: str,
    uri: str,
    lines: list[str],
    profile: Profile | None = None,
    probe: ProbeReport | None = None,
) -> list[lsp.CodeLens]:
    lenses = []
    for model in report.models:
        if not same_file(model.file, path) or model.status != "analyzed":
            continue
        rng = lines_range(lines, model.line, model.line)
        clusters = [c for c in model.clusters if not c.branch]
        traffic = sum((c.bytes_unfused or 0) * c.multiplicity for c in clusters)
        title = _summary(model.totals, len(model.clusters), traffic)
        if model.dynamic is not None:  # the traffic is the analysis binding's
            title += f" {analyzed_at(model.dynamic)}"
        exact = sum(1 for c in model.clusters if c.mapping == "exact")
        if exact:
            title += f" · {exact} applicable"
        if model.inductor is not None:
            agree = model.inductor.status_counts().get("agree", 0)
            title += f" · Inductor agrees on {agree}/{len(model.inductor.clusters)}"
        lenses.append(
            lsp.CodeLens(
                range=rng,
                command=lsp.Command(title=title, command=command_ids.SHOW_KERNEL, arguments=[uri, model.name]),
            )
        )
        if model.clusters:
            lenses.append(
                lsp.CodeLens(
                    range=rng,
                    command=lsp.Command(
                        title="Validate all", command=command_ids.VALIDATE_ALL, arguments=[uri, model.name]
                    ),
                )
            )
            lenses.append(
                lsp.CodeLens(
                    range=rng,
                    command=lsp.Command(
                        title="Show kernels", command=command_ids.SHOW_KERNEL, arguments=[uri, model.name]
                    ),
                )
            )
        measured = model_profile(profile, model.name) if profile is not None else None
        title = "Profile"
        if measured is not None:
            top = measured.clusters[0] if measured.clusters else None
            title = f"◔ {time_label(measured.forward_us)} per forward"
            if top is not None:
                title += f" · {top.id} {top.share:.0%}"
            title += " · Profile again"
        lenses.append(
            lsp.CodeLens(
                range=rng, command=lsp.Command(title=title, command=command_ids.PROFILE, arguments=[uri, model.name])
            )
        )
        lenses.append(
            lsp.CodeLens(
                range=rng,
                command=lsp.Command(
                    title=probe_title(probe, model.name), command=command_ids.PROBE, arguments=[uri, model.name]
                ),
            )
        )
    return lenses


def _summary(totals: Totals, clusters: int, traffic: int) -> str:
    if not clusters:  # (every cluster applied, say): what is left to know is what forward() moves
        moved = f" · forward() moves {bytes_label(totals.bytes_total)}" if totals.bytes_total else ""
        return "no fusable clusters" + moved
    return (
        f"{clusters} fusable cluster{'s' if clusters != 1 else ''} · "
        f"{bytes_label(totals.bytes_avoidable)} of {bytes_label(traffic)} avoidable"
    )
