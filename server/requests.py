"""What the editor's requests about a document answer, each from the snapshot taken as it arrived
(`snapshot.py`): hover, inlay hints, code lenses, code actions and the resolve of a quick fix."""

from __future__ import annotations

import os

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcInvalidParams

from fuselens.codegen import edits as edits_mod
from fuselens.codegen import files
from fuselens.codegen import rewrites as rewrites_mod
from fuselens.contracts.report import Report

from .features import actions as actions_mod
from .features.hover import hover as hover_text
from .features.inlay import inlay_hints as hints
from .features.lenses import code_lenses as lenses
from .generation import NotTheSameAnalysis, has_code
from .scheduler import Analysis
from .services import Services
from .snapshot import Snapshot
from .workers import JobFailed

FUSE_TITLE = "Fuse into Triton kernels"


def hover(snapshot: Snapshot, position: lsp.Position) -> lsp.Hover | None:
    analysis = snapshot.analysis
    if analysis is None or snapshot.path is None:
        return None
    return hover_text(analysis.report, snapshot.path, position.line + 1, snapshot.uri, snapshot.profile, snapshot.probe)


def inlay_hints(snapshot: Snapshot, where: lsp.Range) -> list[lsp.InlayHint]:
    analysis = snapshot.analysis
    if analysis is None or snapshot.path is None or not snapshot.settings.inlay_hints:
        return []
    first, last = where.start.line + 1, where.end.line + 1
    return hints(analysis.report, snapshot.path, analysis.text.splitlines(), first, last, snapshot.profile)


def code_lenses(snapshot: Snapshot) -> list[lsp.CodeLens]:
    analysis = snapshot.analysis
    if analysis is None or snapshot.path is None or not snapshot.settings.code_lens:
        return []
    lines = analysis.text.splitlines()
    return lenses(analysis.report, snapshot.path, snapshot.uri, lines, snapshot.profile, snapshot.probe)


def code_actions(snapshot: Snapshot, where: lsp.Range, root: str | None) -> list[lsp.CodeAction]:
    """The quick fixes for the lines `where` (edits only for the exact text they were computed from),
    and the restore actions of the kernel module beside the file; none outside the workspace (`root`
    None), where the kernel module would be written."""
    analysis, path = snapshot.analysis, snapshot.path
    if analysis is None or path is None or root is None:
        return []
    module_path = next((c.kernel.path for _, c in analysis.report.clusters() if c.kernel), None)
    if module_path is None and any(analysis.report.rewrites()):  # (where a rewrite's record would go)
        module_path = edits_mod.kernel_module_path(path)
    try:
        if module_path:
            files.check_kernel_module(module_path)
    except files.Refused as exc:  # a file of the module's name that the user wrote is never replaced
        reason = lsp.CodeActionDisabled(reason=str(exc))
        return [lsp.CodeAction(title=FUSE_TITLE, kind=lsp.CodeActionKind.QuickFix, disabled=reason)]
    first, last = where.start.line + 1, where.end.line + 1
    fixes = actions_mod.code_actions(
        analysis.report,
        path,
        snapshot.uri,
        analysis.version,
        analysis.text,
        first,
        last,
        snapshot.client.document_changes,
        resolved=not snapshot.client.resolves_edits,
        measured=snapshot.measured,
    )
    return fixes + _restore_actions(path, snapshot.uri, analysis, first, last)


def _restore_actions(path: str, uri: str, analysis: Analysis, first: int, last: int) -> list[lsp.CodeAction]:
    """Restore actions from the kernel module beside the file (none where there is none, or it is not ours)."""
    module_path = edits_mod.kernel_module_path(path)
    try:
        module_text = files.check_kernel_module(module_path)
    except files.Refused:
        return []
    if module_text is None:
        return []
    return actions_mod.restore_actions(
        path, uri, analysis.version, analysis.text, first, last, module_path, module_text
    )


async def resolve_fix(
    snapshot: Snapshot, action: lsp.CodeAction, version: int, ids: list[str], services: Services
) -> lsp.CodeAction:
    """The fix the user picked, for the clusters `ids` of `version`, with its edit, once the kernels' code
    the command after it writes is generated."""
    analysis = snapshot.analysis
    if snapshot.path is None or analysis is None or analysis.version != version:
        raise _changed_since(version)
    report = await report_with_code(snapshot.uri, snapshot.path, analysis, services)
    doc = services.state.documents.get(snapshot.uri)
    if not snapshot.client.document_changes and (doc is None or (doc.version or 0) != version):
        # The client would apply an edit without a version to whatever its buffer holds now, which the
        # user changed while the code was generated: the lines it names are no longer those it was made for.
        raise _changed_since(version)
    try:
        action.edit = actions_mod.fuse_edit(
            report, snapshot.uri, version, analysis.text, ids, snapshot.client.document_changes
        )
    except rewrites_mod.Stale as exc:
        raise JsonRpcInvalidParams.of(ValueError(str(exc))) from None
    return action


def _changed_since(version: int) -> JsonRpcInvalidParams:
    why = f"the document changed since version {version}: the fix is offered again once it is analyzed"
    return JsonRpcInvalidParams.of(ValueError(why))


async def report_with_code(uri: str, path: str, analysis: Analysis, services: Services) -> Report:
    """`analysis`'s report with its kernels' code (`generation.py`); an error the client is told when
    it cannot be generated (generating runs the model's code: only where it may run)."""
    folders = services.state.folders
    if not folders.trusted(path) and not has_code(services.generation.joined(uri, analysis).report):
        raise JsonRpcInvalidParams.of(ValueError(folders.untrusted(path)))
    try:
        return await services.generation.with_code(uri, path, analysis)
    except (JobFailed, NotTheSameAnalysis) as exc:
        services.log.line(f"the kernels of {os.path.basename(path)} were not generated: {exc}")
        raise JsonRpcInvalidParams.of(ValueError(f"the kernels were not generated: {exc}")) from None
