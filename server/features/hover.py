"""Hover: everything about the cluster(s) on a line, as markdown."""

from __future__ import annotations

import json
import os
import textwrap
import urllib.parse

from lsprotocol import types as lsp

from fuselens.contracts.inductor import InductorComparison
from fuselens.contracts.profile import Profile
from fuselens.contracts.report import PASS_THROUGH_BACKWARD, TORCH_BACKWARD, Cluster, Library, Model, Report
from fuselens.contracts.units import bytes_label, in_library, library_path

from .measured import cluster_time, measured_lines, time_label, where_measured
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


def describe(model: Model, c: Cluster, libraries: list[Library], uri: str = "", profile: Profile | None = None) -> str:
    """A cluster in a few lines: what it is and costs, its ops, whether the quick fix applies, whether
    its backward is a kernel, what torch.compile does with it, and a link that opens its kernel (the diagnostic already says why
    the ops next to it were left out)."""
    saved = ""
    if c.bytes_unfused and c.bytes_fused is not None:
        saved = f" (−{100 * (c.bytes_unfused - c.bytes_fused) / c.bytes_unfused:.0f}%)"
    cost = (
        f"**{bytes_label(c.bytes_unfused)} → {bytes_label(c.bytes_fused)}**{saved} DRAM traffic, "
        f"**{c.regime or 'unknown regime'}**"
    )
    if c.multiplicity > 1:
        where = ", ".join(i or "(root)" for i in c.instances[:4]) + (" …" if len(c.instances) > 4 else "")
        cost += (
            f"; ×{c.multiplicity} ({where}): {bytes_label(c.total_bytes_unfused)} → "
            f"{bytes_label(c.total_bytes_fused)} in all"
        )
    parts = [f"### ⚡ {c.id} · {c.kind} · `{c.kernel.name if c.kernel else '—'}` · {model.name}", cost]
    measured = cluster_time(profile, model.name, c.id) if profile is not None else None
    if profile is not None and measured is not None:
        parts.append(_measured_line(profile, measured))
    if c.branch:
        parts.append(f"_{c.branch}_")
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
    if model.inductor is not None:
        parts.append(_inductor_section(model.inductor, c))
    if c.kernel and uri:
        parts.append(f"[Open the kernel]({_command_link('fuselens.showKernel', uri, c.id)})")
    elif c.lowering != "ok":
        parts.append(f"no kernel: {c.lowering}")
    return "\n\n".join(parts)


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
        return f"applies as a **library patch**: {c.apply_detail}"
    return f"maps as **{c.mapping}**: {c.apply_detail or c.mapping_detail}"


def _training_line(c: Cluster) -> str:
    """Whether `loss.backward()` runs a fused backward kernel for the cluster, and for which inputs."""
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


def hover(report: Report, path: str, line: int, uri: str = "", profile: Profile | None = None) -> lsp.Hover | None:
    hits = clusters_at(report, path, line)
    parts = [describe(m, c, report.libraries, uri, profile) for m, c in hits]
    measure = measured_lines(profile, path).get(line) if profile is not None else None
    if profile is not None and measure is not None:
        ran = ", ".join(f"`{op}`" for op in measure.ops[:5])
        via = " in the library code it calls" if measure.through_library else ""
        parts.insert(
            0,
            f"◔ **line {line}: {time_label(measure.us)} per forward** ({measure.share:.1%}{via}; "
            f"{where_measured(profile)}): {ran}",
        )
    if not parts:
        return None
    text = "\n\n---\n\n".join(parts)
    return lsp.Hover(contents=lsp.MarkupContent(kind=lsp.MarkupKind.Markdown, value=text))


def _library_section(c: Cluster, libraries: list[Library]) -> str:
    """Where a cluster of a library's code is, and its lines as they read there."""
    span = f"line {c.lines[0]}" if c.lines[0] == c.lines[1] else f"lines {c.lines[0]}–{c.lines[1]}"
    function = f" (`{c.function}`)" if c.function else ""
    text = f"in **`{library_path(c.file, libraries)}`** {span}{function}"
    if c.code:
        text += "\n```python\n" + textwrap.dedent("\n".join(c.code)) + "\n```"
    return text


def _inductor_section(comparisons: InductorComparison, c: Cluster) -> str:
    comparison = next((x for x in comparisons.clusters if x.cluster == c.id), None)
    if comparison is None:
        return "**torch.compile**: no counterpart found"
    names = sorted({k.name for i in comparison.instances for k in i.kernels})
    kernels = ", ".join(f"`{n}`" for n in names[:4]) or "—"
    where = "Triton for CPU tensors, a proxy for the GPU" if comparisons.backend == "triton-cpu" else "CUDA"
    return f"**torch.compile** ({where}): **{comparison.status}** — {comparison.summary}\n\nkernels: {kernels}"
