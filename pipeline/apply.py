"""Apply: write the kernel module and replace each exactly-mapped cluster's lines.

The edits are computed from the text that was analyzed; if the file changes on disk
before we write (an editor saved while we asked for confirmation, say), nothing is
written.  Clusters that do not apply are never touched, a kernel module of the same name that
fuselens did not write is never overwritten, and no write follows a symbolic link (`codegen/files.py`).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from fuselens.codegen import edits as edits_mod
from fuselens.codegen import files
from fuselens.codegen.module import module_for_report
from fuselens.contracts.options import AnalyzeOptions

from .analyze import analyze_file


@dataclass
class ApplyResult:
    applied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "c3 (tanh → mul): why it cannot be applied"
    diff: str = ""
    module_path: str = ""
    refused: str = ""  # why nothing was written, when something should have been


def apply_file(
    path: str, analyze_options: AnalyzeOptions, cluster_ids: list[str] | None, confirm: Callable[[ApplyResult], bool]
) -> ApplyResult:
    """Analyze `path`, show `confirm` the diff, then write the kernel module and the edits."""
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    report = analyze_file(path, dataclasses.replace(analyze_options, source_text=source))  # the text written over
    result = ApplyResult(module_path=edits_mod.kernel_module_path(path, analyze_options.out_dir))
    if report.problems:
        result.refused = "; ".join(f"line {p.line}: {p.message}" for p in report.problems)
        return result
    wanted = [c for _, c in report.clusters() if not cluster_ids or c.id in cluster_ids]
    exact = [c for c in wanted if c.edit is not None or c.patch is not None]
    result.skipped = [f"{c.id} ({c.op_chain}): {c.apply_detail}" for c in wanted if c not in exact]
    if cluster_ids and set(cluster_ids) - {c.id for c in wanted}:
        result.refused = f"no cluster {', '.join(sorted(set(cluster_ids) - {c.id for c in wanted}))} in {path}"
        return result
    if not exact:
        return result
    try:  # before asking: a hand-written file of the module's name, or a link, refuses the whole apply
        files.check_kernel_module(result.module_path)
        if os.path.islink(path):
            raise files.Refused(f"{os.path.basename(path)} is a symbolic link: fuselens does not write through links")
    except files.Refused as exc:
        result.refused = str(exc)
        return result
    new_source = edits_mod.apply_line_edits(source, edits_mod.cluster_edits(source, report, [c.id for c in exact]))
    rel = os.path.relpath(path)
    result.diff = "".join(difflib.unified_diff(source.splitlines(True), new_source.splitlines(True), rel, rel))
    if not confirm(result):
        result.refused = "not confirmed"
        return result
    with open(path, encoding="utf-8") as fh:
        if fh.read() != source:
            result.refused = f"{rel} changed on disk since it was analyzed; nothing was written"
            return result
    try:
        existing = files.check_kernel_module(result.module_path)
        files.replace_text(result.module_path, module_for_report(report, existing, [c.id for c in exact]))
        files.replace_text(path, new_source)
    except files.Refused as exc:
        result.refused = str(exc)
        return result
    result.applied = [c.id for c in exact]
    return result
