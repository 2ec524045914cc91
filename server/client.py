"""What the client supports, read once from its `initialize` capabilities into one typed record.

lsprotocol's capabilities are a deep tree of optional objects; every question the server asks of them
is answered here, once, so that a handler reads `client.resolves_edits` instead of walking the tree.
"""

from __future__ import annotations

from dataclasses import dataclass

from lsprotocol import types as lsp


@dataclass(frozen=True)
class ClientFeatures:
    document_changes: bool = False  # it reads a workspace edit's `documentChanges` (versioned edits)
    resolves_edits: bool = False  # it asks for a code action's edit when the user picks it, sending its `data`
    configuration: bool = False  # it answers `workspace/configuration`
    watches_files: bool = False  # it registers file watchers the server asks for
    refreshes_code_lenses: bool = False  # it re-requests lenses on `workspace/codeLens/refresh`
    refreshes_inlay_hints: bool = False  # ... and inlay hints on `workspace/inlayHint/refresh`
    shows_documents: bool = False  # it opens a file the server asks it to (`window/showDocument`)
    asks_the_user: bool = False  # it shows a message with choices (`window/showMessageRequest`)
    work_done_progress: bool = False  # it shows progress the server creates


def client_features(caps: lsp.ClientCapabilities | None) -> ClientFeatures:
    """What a client with capabilities `caps` supports."""
    if caps is None:
        return ClientFeatures()
    workspace, window, text_document = caps.workspace, caps.window, caps.text_document
    edit = workspace.workspace_edit if workspace else None
    watched = workspace.did_change_watched_files if workspace else None
    action = text_document.code_action if text_document else None
    resolve = action.resolve_support if action else None
    return ClientFeatures(
        document_changes=bool(edit and edit.document_changes),
        resolves_edits=bool(action and action.data_support and resolve and "edit" in resolve.properties),
        configuration=bool(workspace and workspace.configuration),
        watches_files=bool(watched and watched.dynamic_registration),
        refreshes_code_lenses=_refreshes(workspace.code_lens if workspace else None),
        refreshes_inlay_hints=_refreshes(workspace.inlay_hint if workspace else None),
        shows_documents=bool(window and window.show_document and window.show_document.support),
        asks_the_user=bool(window and window.show_message),
        work_done_progress=bool(window and window.work_done_progress),
    )


def _refreshes(
    support: lsp.CodeLensWorkspaceClientCapabilities | lsp.InlayHintWorkspaceClientCapabilities | None,
) -> bool:
    return bool(support and support.refresh_support)
