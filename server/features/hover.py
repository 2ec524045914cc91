"""Hover: the cluster under the cursor, as markdown; then, briefly, the others on its line.

It opens with what a user decides on: the cluster (the one whose own line it is, else the one that
saves the most), a one-line summary of what fusing it saves, and the link that opens its kernel.
Its details follow; each other cluster on the line gets one line with its own link.  The whole
hover is bounded (`MAX_LINES`): a line that reaches a library's model (`model = LlamaForCausalLM(...)`)
reaches every cluster of it, and what is left out is named.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
import urllib.parse

from lsprotocol import types as lsp

from fuselens.contracts.inductor import InductorComparison
from fuselens.contracts.probe import ProbeReport
from fuselens.contracts.profile import Profile
from fuselens.contracts.report import PASS_THROUGH_BACKWARD, TORCH_BACKWARD, Cluster, Library, Model, Pattern, Report
from fuselens.contracts.units import bytes_label, in_library, library_path
from fuselens.contracts.validation import ORIGINAL_CODE

from .measured import cluster_time, measured_lines, time_label, where_measured
from .probed import describe_reached, describe_site, reached_sites, sites_at
from .ranges import dynamic_entry, hover_section
from .text import same_file, shown_at


def clusters_at(report: Report, path: str, line: int) -> list[tuple[Model, Cluster]]:
    """Clusters shown on `line` (1-based: their own lines, or the user's line reaching a library's
    code) or that have an op on it."""
    hits = []
    for model, c in report.clusters():
        shown = shown_at(c.file, c.lines, c.reached_from, model, path)
        if (shown and shown[0] <= line <= shown[1]) or any(
            op.line == line and same_file(op.file, path) for op in c.ops
        ):
            hits.append((model, c))
    return hits


def _shape(shape) -> str:
    return "×".join(map(str, shape)) if shape else "scalar"


HARD_BREAK = "  \n"  # a line break inside a paragraph: the heading, then the summary on a line of its own
MAX_LINES = 40  # the most lines a hover takes (its details first, then the other clusters)
CODE_LINES = 6  # the most lines of a library's code shown for a cluster


def describe(model: Model, c: Cluster, libraries: list[Library], uri: str = "", profile: Profile | None = None) -> str:
    """A cluster in a few lines: a heading and a one-line summary with the link that opens its kernel,
    then what it costs in all, its ops, whether the quick fix applies, whether its backward is a
    kernel and what torch.compile does with it (the diagnostic already says why the ops next to it
    were left out)."""
    parts = [f"{_heading(model, c, libraries)}{HARD_BREAK}{_summary(c, uri)}"]
    if c.multiplicity > 1:
        where = ", ".join(i or "(root)" for i in c.instances[:4]) + (" …" if len(c.instances) > 4 else "")
        parts.append(
            f"×{c.multiplicity} ({escaped(where)}): {bytes_label(c.total_bytes_unfused)} → "
            f"{bytes_label(c.total_bytes_fused)} in all"
        )
    measured = cluster_time(profile, model.name, c.id) if profile is not None else None
    if profile is not None and measured is not None:
        parts.append(_measured_line(profile, measured))
    if c.branch:
        parts.append(f"_{escaped(c.branch)}_")
    if in_library(c.file, libraries):
        parts.append(_library_section(c, libraries))
    parts.append(_ops_line(c))
    ins = ", ".join(f"`{i.name or '?'}` {_shape(i.shape)} {i.dtype}" for i in c.inputs)
    outs = ", ".join(f"{_shape(o.shape)} {o.dtype}" for o in c.outputs)
    parts.append(f"reads {ins}; writes {outs}")
    parts.append(_applies_line(c))
    if c.kernel is not None:
        parts.append(_training_line(c))
    patterns = [p for p in model.patterns if c.id in p.clusters]
    if patterns:
        parts.append(
            "**patterns**: "
            + "; ".join(
                f"{p.name} (bound {p.estimate.speedup_bound:.2f}×)" if p.estimate.speedup_bound else p.name
                for p in patterns
            )
        )
    ranged = dynamic_entry(model, c.id)
    if ranged is not None:
        parts.append(hover_section(*ranged))
    if model.inductor is not None:
        parts.append(_inductor_section(model.inductor, c))
    return "\n\n".join(parts)


def _heading(model: Model, c: Cluster, libraries: list[Library]) -> str:
    """`**⚡ c1 · reduction · `cluster1` · Net**`, and the function its code is in when that is not here.

    A bold line rather than a markdown heading: editors that show the hover's markdown as text (Neovim)
    leave a heading's `###` in it."""
    function = f" · `{c.function}`" if _elsewhere(c, libraries) else ""
    return f"**⚡ {c.id} · {c.kind} · `{c.kernel.name if c.kernel else '—'}` · {escaped(model.name)}{function}**"


def _summary(c: Cluster, uri: str) -> str:
    """One line: the DRAM traffic fusing saves, the regime, and the link that opens the kernel (or why
    there is none)."""
    saved = ""
    if c.bytes_unfused and c.bytes_fused is not None:
        saved = f" (−{100 * (c.bytes_unfused - c.bytes_fused) / c.bytes_unfused:.0f}%)"
    text = (
        f"**{bytes_label(c.bytes_unfused)} → {bytes_label(c.bytes_fused)}**{saved} DRAM traffic, "
        f"**{c.regime or 'unknown regime'}**"
    )
    if c.kernel and uri:
        return f"{text} · [Open the kernel]({_command_link('fuselens.showKernel', uri, c.id)})"
    if c.lowering != "ok":
        return f"{text} · no kernel: {escaped(c.lowering)}"
    return text


def _brief(c: Cluster, libraries: list[Library], uri: str) -> str:
    """Another cluster of the line, in one line: where, what it saves in all, its kernel's link."""
    where = f" · `{c.function}`" if _elsewhere(c, libraries) else f" · lines {c.lines[0]}–{c.lines[1]}"
    moved = f"{bytes_label(c.total_bytes_unfused)} → {bytes_label(c.total_bytes_fused)}"
    if c.total_bytes_unfused:
        moved += f" (−{100 * saved_in_all(c) / c.total_bytes_unfused:.0f}%)"
    times = f" in all, ×{c.multiplicity}" if c.multiplicity > 1 else ""
    link = f" · [Open the kernel]({_command_link('fuselens.showKernel', uri, c.id)})" if c.kernel and uri else ""
    return f"- **{c.id}** · {c.kind}{where} · {moved}{times}{link}"


def _elsewhere(c: Cluster, libraries: list[Library]) -> bool:
    """Whether the cluster's code is not where the hover is: a library's, or another file's."""
    return bool(c.function) and (c.reached_from is not None or in_library(c.file, libraries))


def saved_in_all(c: Cluster) -> int:
    """The DRAM traffic fusing every instance of the cluster saves."""
    if c.total_bytes_unfused is None or c.total_bytes_fused is None:
        return 0
    return c.total_bytes_unfused - c.total_bytes_fused


def _ops_line(c: Cluster) -> str:
    """`mul` 19 → `relu` 19 → `add` 20, over the shape and dtype they share (or each its own)."""
    shared = {(tuple(op.shape or ()), op.dtype) for op in c.ops}
    steps = []
    for op in c.ops:
        where = str(op.line) if same_file(op.file, c.file) else f"{os.path.basename(op.file)}:{op.line}"
        own = "" if len(shared) == 1 else f" {_shape(op.shape)} {op.dtype}"
        steps.append(f"`{op.target}` {where}{own}")
    over = f" · {_shape(c.ops[0].shape)} {c.ops[0].dtype}" if len(shared) == 1 and c.ops else ""
    return " → ".join(steps) + over


def _applies_line(c: Cluster) -> str:
    if c.mapping == "exact":
        call = c.edit.call if c.edit else c.kernel.name if c.kernel else ""
        return f"maps **exactly** to lines {c.lines[0]}–{c.lines[1]}: the quick fix replaces them with `{call}`"
    if c.applies == "patch":
        return f"applies as a **library patch**: {escaped(c.apply_detail)}"
    return f"maps as **{c.mapping}**: {escaped(c.apply_detail or c.mapping_detail)}"


_CODE_SPAN = re.compile(r"(`[^`]*`)")


def escaped(text: str) -> str:
    """Text for markdown, its angle brackets kept: a name such as `and_masks.<locals>.and_mask` outside
    a code span would read as an HTML tag, which the editor drops."""
    return "".join(
        part if part.startswith("`") else part.replace("<", "\\<").replace(">", "\\>")
        for part in _CODE_SPAN.split(text)
    )


def _training_line(c: Cluster) -> str:
    """Whether `loss.backward()` runs a fused backward kernel for the cluster, and for which inputs; or,
    before the kernel's code is generated (a save's analysis leaves it out), when that is known."""
    if c.kernel is not None and not c.kernel.has_code:
        return "**training**: whether its backward is a kernel is worked out with the kernel's code (open the kernel)"
    if c.backward == PASS_THROUGH_BACKWARD:
        return f"**training**: no backward kernel is needed: the {c.backward_detail}"
    if c.backward == TORCH_BACKWARD:
        return f"**training**: the forward kernel trains; the {c.backward_detail}"
    if c.backward:
        line = f"**training**: a backward kernel computes the {c.backward_detail}"
        if c.backward_bytes_unfused is not None and c.backward_bytes_fused is not None:
            moved = f"{bytes_label(c.backward_bytes_unfused)} → {bytes_label(c.backward_bytes_fused)}"
            line += f" (**{moved}** of DRAM traffic)"
        if c.saved_bytes_fused is not None and c.saved_bytes_eager is not None:
            line += (
                f"; the forward keeps {bytes_label(c.saved_bytes_fused)} for it "
                f"(eager autograd: {bytes_label(c.saved_bytes_eager)})"
            )
        return line
    if c.backward_detail.startswith(ORIGINAL_CODE):  # its kernels measured slower in training by a validation
        return f"**training**: {c.backward_detail}"
    return f"**training**: the backward runs the cluster's own ops ({c.backward_detail})"


def _command_link(command: str, *arguments: str) -> str:
    """A markdown link target that runs the server's `command` (VS Code runs it; other editors show the text)."""
    return f"command:{command}?{urllib.parse.quote(json.dumps(list(arguments)))}"


def _measured_line(profile: Profile, c) -> str:
    """A cluster's measured time, and what fusing it would give by the cost model."""
    return (
        f"**measured**: {time_label(c.us)} per forward ({c.share:.1%}; {where_measured(profile)}), "
        f"{c.calls} ops; fused, about {time_label(c.predicted_fused_us)}: the forward "
        f"{c.amdahl_speedup:.2f}× faster · rank {c.rank_by_time} by time, {c.rank_by_bytes} by bytes saved"
    )


def patterns_at(report: Report, path: str, line: int) -> list[tuple[Model, Pattern]]:
    """The rewritable patterns (an attention) of the file at `path` whose lines hold `line`."""
    return [
        (model, p)
        for model in report.models
        for p in model.patterns
        if (p.rewrite is not None or p.refusal) and same_file(p.file, path) and p.lines[0] <= line <= p.lines[1]
    ]


def describe_pattern(model: Model, p: Pattern, device: str) -> str:
    """A rewritable pattern in a few lines: what eager moves against the fused call, what stays on chip,
    the kernel the fused call runs on the profiled device, and the rewrite the quick fix writes (or why
    there is none)."""
    est = p.estimate
    saved = ""
    if est.bytes_before and est.bytes_after is not None:
        saved = f" (−{100 * (est.bytes_before - est.bytes_after) / est.bytes_before:.0f}%)"
    regime = p.dims.get("regime") or "unknown regime"
    bound = f" · bound {est.speedup_bound:.1f}×" if est.speedup_bound else ""
    rid = f" · `{p.rewrite.id}`" if p.rewrite is not None else ""
    parts = [
        f"**⚡ {p.name}{rid} · {escaped(model.name)}**{HARD_BREAK}"
        f"**{bytes_label(est.bytes_before)} → {bytes_label(est.bytes_after)}**{saved} DRAM traffic, **{regime}**{bound}"
    ]
    if p.multiplicity > 1:
        parts.append(f"×{p.multiplicity} in the model")
    parts.append(escaped(p.summary))
    scores = p.dims.get("scores")
    if scores:
        dtype = p.dims.get("scores_dtype") or p.dims.get("dtype", "")
        parts.append(
            f"eager writes and reads the {_shape(scores)} {dtype} scores at every step; a fused call reads q, k, v"
            f"{' and the mask' if p.dims.get('mask', 'none') != 'none' else ''} once and writes the output"
        )
    if p.dims.get("backend_detail"):
        parts.append(f"**on {escaped(device or 'the profiled device')}**: {escaped(p.dims['backend_detail'])}")
    if p.rewrite is not None:
        r = p.rewrite
        span = f"line {r.start_line}" if r.start_line == r.end_line else f"lines {r.start_line}–{r.end_line}"
        needs = f" (torch ≥ {r.torch_version})" if r.torch_version else ""
        fix = f"the quick fix rewrites {span} as{needs}\n```python\n{r.call}\n```"
        if r.replaces:
            fix += f"\nin place of cluster{'s' if len(r.replaces) > 1 else ''} {', '.join(r.replaces)}"
        parts.append(fix)
        if r.note:
            parts.append(f"_{escaped(r.note)}_")
    elif p.refusal:
        parts.append(f"**no rewrite** ({p.refusal}): {escaped(p.refusal_detail)}")
    return "\n\n".join(parts)


def hover(
    report: Report,
    path: str,
    line: int,
    uri: str = "",
    profile: Profile | None = None,
    probe: ProbeReport | None = None,
) -> lsp.Hover | None:
    hits = ranked(clusters_at(report, path, line), path, line, profile)
    parts = []
    device = report.device.name if report.device is not None else ""
    parts += [describe_pattern(model, p, device) for model, p in patterns_at(report, path, line)[:1]]
    if hits:
        model, first = hits[0]
        parts.append(describe(model, first, report.libraries, uri, profile))
    measure = measured_lines(profile, path).get(line) if profile is not None else None
    if profile is not None and measure is not None:
        ran = ", ".join(f"`{op}`" for op in measure.ops[:5])
        via = " in the library code it calls" if measure.through_library else ""
        parts.append(
            f"◔ **line {line}: {time_label(measure.us)} per forward** ({measure.share:.1%}{via}; "
            f"{where_measured(profile)}): {ran}"
        )
    if probe is not None:
        parts += [describe_site(site) for site in sites_at(probe, path, line)]
        parts += [describe_reached(m, sites, report.libraries) for m, sites in reached_sites(probe, report, path, line)]
    if not parts:
        return None
    text = _bounded("\n\n---\n\n".join(parts), [c for _, c in hits[1:]], report.libraries, uri)
    return lsp.Hover(contents=lsp.MarkupContent(kind=lsp.MarkupKind.Markdown, value=text))


def ranked(
    hits: list[tuple[Model, Cluster]], path: str, line: int, profile: Profile | None = None
) -> list[tuple[Model, Cluster]]:
    """The clusters of a line, the one under the cursor first: one with an op on this very line, then
    one whose own lines hold it, then (a line reaching a library's code) the one the profile measured
    slowest, else the one that saves the most traffic in all."""

    def key(hit: tuple[Model, Cluster]) -> tuple[bool, bool, float, int]:
        model, c = hit
        on_line = any(op.line == line and same_file(op.file, path) for op in c.ops)
        measured = cluster_time(profile, model.name, c.id) if profile is not None else None
        return (not on_line, c.reached_from is not None, -(measured.us if measured else 0.0), -saved_in_all(c))

    return sorted(hits, key=key)


def _bounded(first: str, others: list[Cluster], libraries: list[Library], uri: str) -> str:
    """The hover within MAX_LINES: the first cluster's details (their end cut, saying so, where they
    must be), then a line for each other cluster that fits, and the ids of those left out."""
    lines = first.split("\n")
    room = MAX_LINES - (6 if others else 0) - 3  # (the others' rule, heading and first line; the cut's note)
    if len(lines) > room:
        cut = len(lines) - room
        lines = [*_closed(lines[:room]), "", f"_… {cut} more lines about it left out_"]
    if not others:
        return "\n".join(lines)
    fits = MAX_LINES - len(lines) - 5  # (a rule between blank lines, the heading and a blank line)
    shown = others if len(others) <= fits else others[: max(fits - 1, 1)]
    listed = [_brief(c, libraries, uri) for c in shown]
    if len(shown) < len(others):
        left_out = ", ".join(c.id for c in others[len(shown) :])
        listed.append(f"_… and {left_out}, left out here: their diagnostics have them_")
    heading = f"**{len(others)} more cluster{'s' if len(others) > 1 else ''} on this line**"
    return "\n".join([*lines, "", "---", "", heading, "", *listed])


def _closed(lines: list[str]) -> list[str]:
    """`lines` with a code block cut open closed again."""
    return [*lines, "```"] if sum(line.startswith("```") for line in lines) % 2 else lines


def _library_section(c: Cluster, libraries: list[Library]) -> str:
    """Where a cluster of a library's code is, and its lines as they read there (the first CODE_LINES)."""
    span = f"line {c.lines[0]}" if c.lines[0] == c.lines[1] else f"lines {c.lines[0]}–{c.lines[1]}"
    function = f" (`{c.function}`)" if c.function else ""
    text = f"in **`{library_path(c.file, libraries)}`** {span}{function}"
    if c.code:
        code = textwrap.dedent("\n".join(c.code)).split("\n")
        more = f"\n_… {len(code) - CODE_LINES} more lines_" if len(code) > CODE_LINES else ""
        text += "\n```python\n" + "\n".join(code[:CODE_LINES]) + "\n```" + more
    return text


def _inductor_section(comparisons: InductorComparison, c: Cluster) -> str:
    comparison = next((x for x in comparisons.clusters if x.cluster == c.id), None)
    if comparison is None:
        return "**torch.compile**: no counterpart found"
    names = sorted({k.name for i in comparison.instances for k in i.kernels})
    kernels = ", ".join(f"`{n}`" for n in names[:4]) or "—"
    where = "Triton for CPU tensors, a proxy for the GPU" if comparisons.backend == "triton-cpu" else "CUDA"
    return f"**torch.compile** ({where}): **{comparison.status}** — {escaped(comparison.summary)}\n\nkernels: {kernels}"
