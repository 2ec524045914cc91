"""Code actions: the quick fix that puts a generated kernel into the user's code, and the one that
rewrites a pattern's lines into a call torch has (`F.scaled_dot_product_attention`).

The edit is a versioned `TextDocumentEdit` of the model's document only: a client applies it
only to the version the report was computed from, so a fix offered before the user typed can
never overwrite what they typed.  A client that does not declare `documentChanges` support gets
the same text edits as plain `changes` too (the only form it promises to read).  The kernel
module is never part of the edit: a client leaves a file it edits as text modified and unsaved
(Neovim and Emacs do, once the module exists), and the fix would do nothing until the user saved
every buffer.  The server writes the module itself, on disk, with the `fuselens.writeKernelModule`
command that runs after the edit (`commands.py`, under the lock `fuselens apply` takes).

A client that resolves code actions (`codeAction.resolveSupport` with `edit`, and `dataSupport`) is
offered each fix as its title, the command and a few ids (`data`: the document, its version, the
clusters), and asks for the edit when the user picks the fix (`codeAction/resolve`): the server then
generates the kernels' code first (`generation.py`), so that the command after the edit only writes
the module, before a save of the edited file could analyze it without its kernels.  Any other
client gets the edit at once, and the command generates the code.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from lsprotocol import types as lsp

from fuselens.codegen import edits as edits_mod
from fuselens.codegen import rewrites as rewrites_mod
from fuselens.contracts import commands as command_ids
from fuselens.contracts.report import Cluster, Model, Report, Rewrite
from fuselens.contracts.training import MeasuredTraining, measured_slower, training_note

from .text import same_file, shown_at


def line_edits_to_lsp(edits: list[edits_mod.LineEdit]) -> list[lsp.TextEdit]:
    out = []
    for e in edits:
        start = lsp.Position(e.start - 1, 0)
        end = lsp.Position(e.end, 0) if e.end >= e.start else start
        out.append(lsp.TextEdit(range=lsp.Range(start, end), new_text=e.text))
    return out


def fuse_action(
    report: Report,
    uri: str,
    version: int,
    text: str,
    clusters: list[Cluster],
    title: str,
    kind: str = lsp.CodeActionKind.QuickFix,
    document_changes: bool = True,
    resolved: bool = True,
    rewrites: list[Rewrite] | None = None,
) -> lsp.CodeAction | None:
    """The action that applies `clusters` and `rewrites`: the edit of the document's lines (`resolved`;
    else what `codeAction/resolve` gives it, in `data`), then the command that writes the kernel module
    they need (a rewrite's record there is what restoring it reads)."""
    ids = [c.id for c in clusters if c.edit is not None or c.patch is not None] + [r.id for r in rewrites or []]
    if not ids:
        return None
    command = lsp.Command(
        title="Write the kernel module", command=command_ids.WRITE_KERNEL_MODULE, arguments=[uri, version, ids]
    )
    action = lsp.CodeAction(title=title, kind=kind, command=command, is_preferred=len(ids) == 1)
    if resolved:
        action.edit = fuse_edit(report, uri, version, text, ids, document_changes)
    else:
        action.data = {FUSE: ids, "uri": uri, "version": version}
    return action


FUSE = "fuse"  # the key of an unresolved fix's `data` that holds the ids of the clusters it applies


def fuse_edit(
    report: Report, uri: str, version: int, text: str, ids: list[str], document_changes: bool = True
) -> lsp.WorkspaceEdit:
    """The edit of the document's lines that applies the clusters and rewrites `ids` (`rewrites.Stale`
    when a rewrite's lines are not in `text` as it was made from them)."""
    doc_edits = line_edits_to_lsp(_changing(text, edits_mod.fix_edits(text, report, ids)))
    change = lsp.TextDocumentEdit(lsp.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version), doc_edits)
    edit = lsp.WorkspaceEdit(document_changes=[change])
    if not document_changes:  # the client reads only `changes`: give it those too
        edit.changes = {uri: doc_edits}
    return edit


def unresolved_fix(action: lsp.CodeAction) -> tuple[str, int, list[str]] | None:
    """(document, version, cluster ids) of a fix offered unresolved; None for any other action, or data
    that is not what the server put there."""
    data = action.data
    if not isinstance(data, dict):
        return None
    uri, version, ids = data.get("uri"), data.get("version"), data.get(FUSE)
    if not isinstance(uri, str) or not isinstance(version, int) or isinstance(version, bool):
        return None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        return None
    return uri, version, ids


def _changing(text: str, edits: list[edits_mod.LineEdit]) -> list[edits_mod.LineEdit]:
    """The edits that change the text: a second library patch rewrites the import of install() as it
    is, and an editor marks a buffer that such an edit touches as changed, to be saved for nothing."""
    lines = text.splitlines(keepends=True)
    return [e for e in edits if e.end < e.start or "".join(lines[e.start - 1 : e.end]) != e.text]


def _fixable(c: Cluster, model: Model, path: str) -> bool:
    """A cluster of the file at `path` that applies (an exact one of its own, or one in a library's code
    that shows in the file) and whose kernel module sits beside it, as `fuselens apply` puts it: the
    module's path comes from the report, and nothing is ever written elsewhere."""
    if c.kernel is None:
        return False
    if c.edit is not None:
        here = same_file(c.file, path)
    else:
        here = c.patch is not None and shown_at(c.file, c.lines, c.reached_from, model, path) is not None
    return here and os.path.dirname(os.path.realpath(c.kernel.path)) == os.path.dirname(os.path.realpath(path))


def _title(c: Cluster, model: Model, measured: Sequence[MeasuredTraining]) -> str:
    """What the fix does; where the file's validations measured the cluster's kernels slower in
    training, that it trains through the original code (`contracts/training.py`)."""
    name = c.kernel.name if c.kernel else c.id
    if c.patch is not None:
        where = c.patch.function.qualname
        title = f"Fuse {c.op_chain} in {where} (library code) into Triton kernel {name}, installed at run time"
    elif c.lines[0] == c.lines[1]:
        title = f"Fuse line {c.lines[0]} into Triton kernel {name}"
    else:
        title = f"Fuse lines {c.lines[0]}–{c.lines[1]} into Triton kernel {name}"
    slower = measured_slower(measured, model.name, c.id, c.op_chain)
    return f"{title} ({training_note(slower)})" if slower else title


def _rewritable(rewrite: Rewrite, report: Report, path: str) -> bool:
    """A rewrite of the file at `path` whose records would go into the kernel module beside it, as
    `fuselens apply` puts it (a cluster's kernel path says where that is, else beside the file)."""
    module = next((c.kernel.path for _, c in report.clusters() if c.kernel), edits_mod.kernel_module_path(path))
    beside = os.path.dirname(os.path.realpath(module)) == os.path.dirname(os.path.realpath(path))
    return same_file(rewrite.file, path) and beside


def code_actions(
    report: Report,
    path: str,
    uri: str,
    version: int,
    text: str,
    first: int,
    last: int,
    document_changes: bool = True,
    resolved: bool = True,
    measured: Sequence[MeasuredTraining] = (),
) -> list[lsp.CodeAction]:
    """Actions for lines first..last (1-based): one per applicable cluster and per pattern rewrite there,
    plus "fuse all" for its model (its rewrites, and the clusters they do not replace); each with its
    edit (`resolved`), or to be resolved.  `measured`: what the file's validations measured of its
    clusters' training, which a fix's title tells where it was slower."""
    actions = []
    models: list[Model] = []
    for model, c in report.clusters():
        shown = shown_at(c.file, c.lines, c.reached_from, model, path)
        if not _fixable(c, model, path) or shown is None:
            continue
        start, end = shown
        if start <= last and end >= first:
            title = _title(c, model, measured)
            action = _offered(
                report, uri, version, text, [c], [], title, lsp.CodeActionKind.QuickFix, document_changes, resolved
            )
            if action:
                actions.append(action)
            if model not in models:
                models.append(model)
    for model, _, rewrite in report.rewrites():
        if not _rewritable(rewrite, report, path) or not (rewrite.start_line <= last and rewrite.end_line >= first):
            continue
        action = _offered(
            report,
            uri,
            version,
            text,
            [],
            [rewrite],
            rewrite.title,
            lsp.CodeActionKind.QuickFix,
            document_changes,
            resolved,
        )
        if action:
            actions.append(action)
        if model not in models:
            models.append(model)
    for model in models:
        rewrites = [p.rewrite for p in model.patterns if p.rewrite is not None and _rewritable(p.rewrite, report, path)]
        replaced = rewrites_mod.replaced_clusters(report, rewrites)
        fixable = [c for c in model.clusters if _fixable(c, model, path) and c.id not in replaced]
        if len(fixable) + len(rewrites) > 1:
            title = _all_title(model, len(fixable), len(rewrites))
            action = _offered(
                report,
                uri,
                version,
                text,
                fixable,
                rewrites,
                title,
                lsp.CodeActionKind.RefactorRewrite,
                document_changes,
                resolved,
            )
            if action:
                actions.append(action)
    return actions


def _all_title(model: Model, clusters: int, rewrites: int) -> str:
    """ "Fuse all 3 applicable clusters in Net", naming the rewrites it applies too."""
    if not rewrites:
        return f"Fuse all {clusters} applicable clusters in {model.name}"
    rewritten = f"{rewrites} rewrite{'s' if rewrites > 1 else ''}"
    if not clusters:
        return f"Apply all {rewritten} in {model.name}"
    fused = f"all {clusters} applicable clusters" if clusters > 1 else "1 applicable cluster"
    return f"Fuse {fused} and apply {rewritten} in {model.name}"


def _offered(
    report: Report,
    uri: str,
    version: int,
    text: str,
    clusters: list[Cluster],
    rewrites: list[Rewrite],
    title: str,
    kind: str,
    document_changes: bool,
    resolved: bool,
) -> lsp.CodeAction | None:
    """`fuse_action`, or, where a rewrite's lines are not those it was made from, the action disabled
    with why (an edit is never offered over text it was not made for)."""
    try:
        return fuse_action(report, uri, version, text, clusters, title, kind, document_changes, resolved, rewrites)
    except rewrites_mod.Stale as exc:
        return lsp.CodeAction(title=title, kind=kind, disabled=lsp.CodeActionDisabled(reason=str(exc)))


def restore_actions(
    path: str, uri: str, version: int, text: str, first: int, last: int, module_path: str, module_text: str
) -> list[lsp.CodeAction]:
    """Actions that put back the code `apply` replaced (what the kernel module keeps): one for the
    kernel called on lines first..last, and one for every kernel (and the library patches) in the file."""
    everything = edits_mod.restore_edits(text, path, module_path, module_text)
    if not everything.restored:
        return []
    actions = []
    for name in everything.restored:
        if name == edits_mod.INSTALL:
            continue
        one = edits_mod.restore_edits(text, path, module_path, module_text, [name])
        call = one.edits[0] if one.edits else None
        if call is not None and call.start <= last and call.end >= first:
            title = _restore_title(name, one.restored, one.labels)
            actions.append(_restore_action(title, uri, version, one.edits))
    title = f"Restore the original code of every fused cluster in {os.path.basename(path)}"
    if edits_mod.INSTALL in everything.restored:
        title += " (and run the library's own code)"
    actions.append(_restore_action(title, uri, version, everything.edits))
    return actions


def _restore_title(name: str, restored: list[str], labels: dict[str, str]) -> str:
    """Name every kernel the action restores: restoring one whose code shares lines with others'
    (a convolution's call passed to the next kernel without its bias) restores those lines whole.  A
    rewrite is named by what it rewrote."""
    if name in labels:
        return f"Restore the original code of {labels[name]}"
    others = [k for k in restored if k != name]
    if not others:
        return f"Restore the original code of {name}"
    return f"Restore the original code of {name} (and of {', '.join(others)}, whose code shares its lines)"


def _restore_action(title: str, uri: str, version: int, edits: list[edits_mod.LineEdit]) -> lsp.CodeAction:
    text_edits = line_edits_to_lsp(edits)
    change = lsp.TextDocumentEdit(lsp.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version), text_edits)
    # `changes` too: a client that does not read documentChanges still gets the edits
    edit = lsp.WorkspaceEdit(document_changes=[change], changes={uri: text_edits})
    return lsp.CodeAction(title=title, kind=lsp.CodeActionKind.RefactorRewrite, edit=edit)
