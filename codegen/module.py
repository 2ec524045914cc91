"""The generated kernel module: header, shared helpers, then one section per cluster.

Generation is text only (neither torch nor triton is imported here, nor the planner and emitter),
so the language server can assemble a module from the kernel sources carried in a report; the
runtime the module carries is `runtime/`'s modules' text (`runtime_source.py`).  Each cluster's section
starts with a marker line, so re-applying merges into an existing module: sections the
user's code still calls are kept, sections regenerated are replaced.
"""

from __future__ import annotations

import itertools
import os
import re

from fuselens.contracts.report import Edit, Report

from . import patches as patches_mod
from . import rewrites as rewrites_mod
from .edits import natural_order
from .files import GENERATED
from .lowering import HELPERS, helpers_used
from .runtime_source import analysis_functions, runtime_source

MARKER = "# ---- fused kernel: "
# What a GEMM cluster's section calls, which only a module with one carries (`runtime/gemm.py`).
GEMM_RUNTIME_USE = "_gemm_problem("
_MARKER_RE = re.compile(r"^# ---- fused kernel: (\w+)", re.M)

# Generated, and rewritten on every apply: the user's linters and type checker leave it alone (its
# library patches name their module's globals, which only exist where `install()` runs them).
LINTERS = "# ruff: noqa\n# flake8: noqa\n# mypy: ignore-errors\n\n"


def module_header(source_name: str) -> str:
    return (
        f"{GENERATED} for {source_name}.\n\n"
        "Each `clusterN(...)` replaces a group of operators in the model's forward() with one kernel.\n"
        "The kernel runs on CUDA tensors of the dtypes it was generated for when no gradient is wanted;\n"
        "everywhere else (CPU, no Triton, autograd, other dtypes) `clusterN` runs `_clusterN_reference`,\n"
        "the same operators as the model wrote them, so the model runs wherever it ran before.\n"
        "Regenerate with `fuselens apply`; edits to this file are overwritten.\n"
        '"""\n\n' + LINTERS + _runtime()
    )


def _runtime() -> str:
    """What every kernel module runs its kernels with (`runtime/ops.py`), then what their `fits` ask
    (`runtime/fits.py`) with the analysis's own `module_settings` and `class_identity`."""
    settings = "from typing import Any\n\n\n" + analysis_functions("fuselens.analysis.settings")
    return runtime_source("ops") + "\n\n" + runtime_source("fits") + "\n" + settings


def section(name: str, summary: str, text: str) -> str:
    return f"{MARKER}{name}: {summary}\n\n{text.rstrip()}\n"


# Where a section starts: a kernel's, a library patch's, the patches' runtime, or a source rewrite's record.
_SECTION_RE = re.compile(r"^# ---- (?:fused kernel|library patch|source rewrite)", re.M)


def existing_sections(module_text: str) -> dict[str, str]:
    """kernel name -> section text of a module written by `render_module`."""
    return _sections(module_text, _MARKER_RE)


def existing_patches(module_text: str) -> dict[str, str]:
    """module.qualname -> the library patch's section text, of a module written by `render_module`."""
    return _sections(module_text, patches_mod.MARKER_RE)


def _sections(module_text: str, marker: re.Pattern[str]) -> dict[str, str]:
    """The sections whose first line `marker` matches, by its first group: each runs to the next section."""
    starts = [m.start() for m in _SECTION_RE.finditer(module_text)] + [len(module_text)]
    out = {}
    for start, end in itertools.pairwise(starts):
        m = marker.match(module_text, start)
        if m:
            out[m.group(1)] = module_text[start:end].rstrip() + "\n"
    return out


def render_module(
    source_name: str,
    sections: dict[str, str],
    patches: dict[str, str] | None = None,
    alias: str = "",
    rewrites: dict[str, str] | None = None,
) -> str:
    """A whole module from {name: section text}, sections in natural name order, then the library
    patches {"module.qualname": section text} and what installs them, then the records of the source
    rewrites applied {record name: section text} (what restoring them needs)."""
    ordered = [sections[k] for k in sorted(sections, key=natural_order)]
    helpers: list[str] = []
    for text in ordered:
        helpers += [h for h in helpers_used(text) if h not in helpers]
    parts = [module_header(source_name)]
    parts += [HELPERS[h] for h in helpers]
    parts.append(runtime_source("tiles", inline=("MAX_BLOCK_ROW", "LOOP_BLOCK")))
    if any(GEMM_RUNTIME_USE in text for text in ordered):  # a cluster that starts with a GEMM
        parts.append(runtime_source("gemm"))
    parts += ordered
    if patches:
        parts.append(patches_mod.runtime(alias))
        parts += [patches[k] for k in sorted(patches)]
    if rewrites:
        parts += [rewrites[k] for k in sorted(rewrites)]
    return "\n\n".join(p.rstrip("\n") + "\n" for p in parts)


def restore_record(name: str, edit: Edit) -> str:
    """What restoring `name` needs, kept in its section: the lines `apply` writes and those they replace."""
    return (
        f"\n\n\n# The lines `fuselens apply` writes for {name}, and the lines they replace (restoring puts them back).\n"
        f"_{name}_replaced = ({edit.text!r}, {edit.original!r})\n"
    )


def _kernel_functions(report: Report, rewritten: list[rewrites_mod.Record]) -> dict[str, str]:
    """The sections of the kernel module's functions that the rewrites applied call (the fused linear
    cross-entropy), by name."""
    from .loss_module import LOSS_SECTION, fused_loss_section  # (it builds its section with `section`)

    written = {r.written for r in rewritten}
    wanted = {name for _, _, rw in report.rewrites() if rw.text in written for name in rw.kernel_functions}
    return {LOSS_SECTION: fused_loss_section()} if LOSS_SECTION in wanted else {}


def module_for_report(
    report: Report,
    existing: str | None = None,
    patched: list[str] | None = None,
    rewritten: list[rewrites_mod.Record] | None = None,
) -> str:
    """The kernel module for `report`, keeping the sections of `existing` it does not replace, with
    library patches for the clusters `patched` added to those `existing` has, and the records of the
    source rewrites `rewritten` added to those it keeps.  (A file whose patches are installed is
    analyzed with them in place: their clusters are kernels in its report, and their sections are kept
    as they are.)"""
    sections = existing_sections(existing) if existing else {}
    clusters = [c for _, c in report.clusters()]
    for c in clusters:
        if c.kernel:
            where = f"{os.path.basename(c.file)} lines {c.lines[0]}–{c.lines[1]}"
            text = c.kernel.source + (restore_record(c.kernel.name, c.edit) if c.edit and c.edit.original else "")
            sections[c.kernel.name] = section(c.kernel.name, f"{c.op_chain} ({where})", text)
    patches = existing_patches(existing or "")
    patches.update(patches_mod.patch_sections([c for c in clusters if c.patch and c.id in (patched or [])]))
    records = rewrites_mod.existing_records(existing or "")
    records.update({r.name: rewrites_mod.record_section(r) for r in rewritten or []})
    sections.update(_kernel_functions(report, rewritten or []))
    module_path = next((c.kernel.path for c in clusters if c.kernel), report.file)
    alias = patches_mod.kernel_alias(module_path)
    return render_module(os.path.basename(report.file), sections, patches, alias, records)
