"""Apply: write the kernel module and replace each exactly-mapped cluster's lines, and each pattern's
lines that a source rewrite stands in for (`F.scaled_dot_product_attention` for hand-written attention).

Given validation options, the kernels are checked before anything is written, as `fuselens
validate` checks them (each kernel against the lines it stands in for, then each model patched as a
whole against the original: eval, a training step, other sizes), and what fails is not applied.
The edits are computed from the text that was analyzed; if the file changes on disk
before we write (an editor saved while we asked for confirmation, another `apply`), nothing is
written: the check and the writes happen under the lock every writer of the file takes.  The file
keeps its bytes but for the lines that change: its encoding, byte-order mark and line endings
(`codegen/source_file.py`).  Clusters that do not apply are never touched, a kernel module of the
same name that fuselens did not write is never overwritten, and no write follows a symbolic link
(`codegen/files.py`).  A cluster whose ops a rewrite applied with it computes is left out (the
rewrite replaces its lines), and a rewrite is written only over the lines it was made from.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from fuselens.codegen import edits as edits_mod
from fuselens.codegen import files
from fuselens.codegen import rewrites as rewrites_mod
from fuselens.codegen.module import module_for_report
from fuselens.codegen.source_file import SourceError, SourceFile, edited_bytes, read_source, split_lines
from fuselens.contracts.options import AnalyzeOptions, Progress, ValidateOptions, no_progress
from fuselens.contracts.report import Report
from fuselens.contracts.training import slower_in_training
from fuselens.contracts.validation import ModelCheck
from fuselens.validate import runner

from .analyze import AnalyzedFile, analyze
from .unanalyzed import no_such_clusters, unanalyzed_models
from .validate import validate_analyzed

NOT_CONFIRMED = "not confirmed"  # `ApplyResult.refused` when `confirm` said no


@dataclass
class ApplyResult:
    applied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "c3 (tanh → mul): why it cannot be applied"
    diff: str = ""
    module_path: str = ""
    refused: str = ""  # why nothing was written, when something should have been
    # "c1 (add → group_norm): trains through the original code: ...": the applied clusters whose kernels
    # the file's validations measured slower in training (`AnalyzeOptions.training`).
    original_in_training: list[str] = field(default_factory=list)


def apply_file(
    path: str,
    analyze_options: AnalyzeOptions,
    cluster_ids: list[str] | None,
    confirm: Callable[[ApplyResult], bool],
    check: ValidateOptions | None = None,
    progress: Progress = no_progress,
) -> ApplyResult:
    """Analyze `path`, (given `check`) validate what would be applied, show `confirm` the diff, then
    write the kernel module and the edits."""
    result = ApplyResult(module_path=edits_mod.kernel_module_path(path, analyze_options.out_dir))
    try:
        read = read_source(path)
    except (OSError, SourceError) as exc:
        result.refused = str(exc) if isinstance(exc, SourceError) else f"cannot read {path}: {exc.strerror or exc}"
        return result
    source = read.text
    analyzed = analyze(path, dataclasses.replace(analyze_options, source_text=source))  # the text written over
    report = analyzed.report
    if report.problems:
        result.refused = "; ".join(f"line {p.line}: {p.message}" for p in report.problems)
        return result
    result.skipped = unanalyzed_models(report)
    rewrites = rewrites_mod.chosen_rewrites(report, cluster_ids or None)
    replaced = rewrites_mod.replaced_clusters(report, rewrites)
    wanted = [c for _, c in report.clusters() if not cluster_ids or c.id in cluster_ids]
    result.skipped += [
        f"{c.id} ({c.op_chain}): {_replaced_by(report, replaced[c.id])}" for c in wanted if c.id in replaced
    ]
    wanted = [c for c in wanted if c.id not in replaced]
    exact = [c for c in wanted if c.edit is not None or c.patch is not None]
    result.skipped += [f"{c.id} ({c.op_chain}): {c.apply_detail}" for c in wanted if c not in exact]
    if not cluster_ids:
        result.skipped += _not_rewritten(report)
    if cluster_ids and set(cluster_ids) - {c.id for _, c in report.clusters()} - {r.id for r in rewrites}:
        result.refused = no_such_clusters(report, cluster_ids)
        return result
    if (exact or rewrites) and check is not None:
        ids = [c.id for c in exact] + [r.id for r in rewrites]
        failing = _failing_validation(path, analyzed, ids, check, progress)
        if failing is None:
            result.refused = "the kernels could not be validated here; pass --no-check to apply without validating"
            return result
        result.skipped += [f"{c.id} ({c.op_chain}): {failing[c.id]}" for c in exact if c.id in failing]
        result.skipped += [f"{r.id} ({r.call}): {failing[r.id]}" for r in rewrites if r.id in failing]
        exact = [c for c in exact if c.id not in failing]
        rewrites = [r for r in rewrites if r.id not in failing]
    if not exact and not rewrites:
        return result
    try:  # before asking: a hand-written file of the module's name, or a link, refuses the whole apply
        files.check_kernel_module(result.module_path)
        if os.path.islink(path):
            raise files.Refused(f"{os.path.basename(path)} is a symbolic link: fuselens does not write through links")
    except files.Refused as exc:
        result.refused = str(exc)
        return result
    ids = [c.id for c in exact] + [r.id for r in rewrites]
    try:
        new_source = edits_mod.apply_line_edits(source, edits_mod.fix_edits(source, report, ids))
    except rewrites_mod.Stale as exc:
        result.refused = str(exc)
        return result
    try:  # before asking: an encoding that cannot hold the edited lines
        new_bytes = edited_bytes(read, new_source)
    except SourceError as exc:
        result.refused = str(exc)
        return result
    result.diff = unified_diff(path, source, new_source)
    if not confirm(result):
        result.refused = NOT_CONFIRMED
        return result
    records = rewrites_mod.records(source, report, [r.id for r in rewrites])
    try:
        module = (
            result.module_path,
            lambda existing: module_for_report(report, existing, [c.id for c in exact], records),
        )
        write_edited(read, new_bytes, module)
    except files.Refused as exc:
        result.refused = str(exc)
        return result
    result.applied = ids
    for model in report.models:
        for c in model.clusters:
            slower = slower_in_training(analyze_options.training, model.name, c.id, c.op_chain)
            if c.id in result.applied and slower:
                result.original_in_training.append(f"{c.id} ({c.op_chain}): {slower}")
    return result


def _replaced_by(report: Report, rewrite_id: str) -> str:
    """Why a cluster is not applied beside the rewrite `rewrite_id`."""
    rewrite = next(r for _, _, r in report.rewrites() if r.id == rewrite_id)
    return f"the rewrite {rewrite_id} computes its ops ({rewrite.call})"


def _not_rewritten(report: Report) -> list[str]:
    """A line for each pattern of a kind that has a rewrite, where it has none, saying why."""
    out = []
    for model in report.models:
        for pattern in model.patterns:
            if pattern.refusal:
                span = (
                    f"line {pattern.lines[0]}"
                    if pattern.lines[0] == pattern.lines[1]
                    else f"lines {pattern.lines[0]}–{pattern.lines[1]}"
                )
                out.append(f"{pattern.name} ({model.name}, {span}): not rewritten: {pattern.refusal_detail}")
    return out


def unified_diff(path: str, before: str, after: str) -> str:
    """The diff from `before` to `after` (texts of the file at `path`), as `apply` and `restore` show it."""
    rel = os.path.relpath(path)
    return "".join(difflib.unified_diff(split_lines(before), split_lines(after), rel, rel))


def write_edited(
    read: SourceFile, new_bytes: bytes, module: tuple[str, Callable[[str | None], str]] | None = None
) -> None:
    """`new_bytes` as the file `read` came from, and first the kernel module (its path, and its text from
    the one there), under the file's lock, if the file still holds the bytes `read` found.  Refused with
    nothing of it written when it does not."""
    with files.locked(read.path) as current:
        if current != read.raw:
            rel = os.path.relpath(read.path)
            raise files.Refused(f"{rel} changed on disk since it was read (another apply?): nothing was written")
        if module is not None:
            module_path, module_text = module
            files.replace_text(module_path, module_text(files.check_kernel_module(module_path)))
        files.replace_bytes(read.path, new_bytes)


def _failing_validation(
    path: str, analyzed: AnalyzedFile, ids: list[str], options: ValidateOptions, progress: Progress
) -> dict[str, str] | None:
    """The clusters of `ids` the validation says not to apply, with why: a kernel (or its backward) that
    does not compute what its lines do, and every cluster of a model that, patched, does not compute
    what the original does.  None: the kernels cannot run here (no Triton, no GPU and no interpreter)."""
    options = dataclasses.replace(options, clusters=ids, benchmark=False)
    with runner.kernel_environment(options):
        started = runner.start(path, options)
        if started.problems:
            return None
        validated = validate_analyzed(started, analyzed, options, progress)
    failing: dict[str, str] = {}
    for model in validated.models:
        for check_ in model.clusters:
            if check_.status in ("mismatch", "error"):
                failing[check_.id] = f"its kernel does not compute what its lines do ({check_.message})"
            elif check_.backward is not None and check_.backward.status in ("mismatch", "error"):
                failing[check_.id] = f"its backward kernel does not compute the gradients ({check_.backward.message})"
        whole = model.model
        if whole is not None and whole.status in ("mismatch", "error"):
            why = _whole_model_failure(whole)
            for cid in whole.applied:
                failing.setdefault(
                    cid,
                    f"{model.name} with its kernels applied does not compute what it computes as written ({why}); "
                    "`fuselens validate` shows each kernel, `--cluster` applies some of them",
                )
    return failing


def _whole_model_failure(check_: ModelCheck) -> str:
    """Where the patched model differs: a training step, other sizes, or the forward at the validated inputs."""
    for where, part in (("in a training step", check_.training), ("at other sizes", check_.other_shapes)):
        if part is not None and part.status in ("mismatch", "error"):
            return f"{where}: {part.message}"
    return f"in eval mode: {check_.message}"
