"""What the server knows, in one place: the open documents, the last analysis of each, the settings,
what the client supports, the workspace's folders and its trust, and the last profile of each file.

Notifications (open, change, save, close, a settings change) and the jobs that finish change it.
Requests read a document, its analysis and the settings only through a snapshot taken as each
arrives (`snapshot.py`); the folders and their trust are set by `initialize` and never change.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from urllib.parse import unquote

from lsprotocol import types as lsp
from pygls.workspace import TextDocument

from fuselens.contracts.probe import ProbeReport
from fuselens.contracts.profile import Profile
from fuselens.contracts.training import MeasuredTraining

from .client import ClientFeatures
from .configuration import Configuration
from .features.text import uri_to_path
from .scheduler import Analysis
from .snapshot import Snapshot
from .trust import Trust

Joined = Callable[[str, Analysis], Analysis]  # (uri, an analysis) -> it with its kernels' code, where generated


class OpenDocuments:
    """The documents the editor has open, as the client last sent them."""

    def __init__(self, text_documents: Callable[[], Mapping[str, TextDocument]]) -> None:
        self._text_documents = text_documents

    def get(self, uri: str) -> TextDocument | None:
        """The open document at `uri`, or None (pygls' get_text_document would read any file from disk)."""
        return self._text_documents().get(unquote(uri))

    def all(self) -> list[TextDocument]:
        return list(self._text_documents().values())


class Analyses:
    """The last analysis of each open document, of whichever version it was made: one the user typed
    past is kept, for the command a quick fix runs after its edit changed the document."""

    def __init__(self) -> None:
        self._by_uri: dict[str, Analysis] = {}

    def get(self, uri: str) -> Analysis | None:
        return self._by_uri.get(uri)

    def __contains__(self, uri: str) -> bool:
        return uri in self._by_uri

    def keep(self, uri: str, analysis: Analysis) -> None:
        self._by_uri[uri] = analysis

    def replace(self, uri: str, old: Analysis, new: Analysis) -> bool:
        """Keep `new` in `old`'s place, if `old` is still the one kept; whether it was."""
        if self._by_uri.get(uri) is not old:
            return False
        self._by_uri[uri] = new
        return True

    def forget(self, uri: str) -> None:
        self._by_uri.pop(uri, None)


class Profiles:
    """The last profile of each file, with the digest of the text it measured: shown while it lines up."""

    def __init__(self) -> None:
        self._by_path: dict[str, tuple[str, Profile]] = {}

    def keep(self, path: str, source_sha256: str, profile: Profile) -> None:
        self._by_path[path] = (source_sha256, profile)

    def of(self, path: str, analysis: Analysis) -> Profile | None:
        """The last profile of `path`, when it measured the text `analysis` is of."""
        kept = self._by_path.get(path)
        return kept[1] if kept is not None and kept[0] == analysis.report.source_sha256 else None


class Probes:
    """The last probe of each file, with the digest of the text it ran: shown while it lines up."""

    def __init__(self) -> None:
        self._by_path: dict[str, tuple[str, ProbeReport]] = {}

    def keep(self, path: str, source_sha256: str, probe: ProbeReport) -> None:
        self._by_path[path] = (source_sha256, probe)

    def of(self, path: str, analysis: Analysis) -> ProbeReport | None:
        kept = self._by_path.get(path)
        return kept[1] if kept is not None and kept[0] == analysis.report.source_sha256 else None


class Folders:
    """The workspace folders, their trust, and the editor's name (messages speak its words): set by
    `initialize`, never changed after."""

    def __init__(self, tell: Callable[[str, lsp.MessageType], None]) -> None:
        self.roots: list[str] = []
        self.trust = Trust(None, [])
        self.editor = ""
        self._tell = tell
        self._untrusted_told = False

    def open(self, roots: list[str], trust: Trust, editor: str) -> None:
        self.roots, self.trust, self.editor = roots, trust, editor

    def trusted(self, path: str) -> bool:
        return self.trust.trusted(path)

    def trusts_a_folder(self) -> bool:
        """Whether the models of a workspace folder may run: then the worker host is kept warm."""
        return any(self.trusted(os.path.join(r, "x.py")) for r in self.roots)

    def root_of(self, path: str) -> str | None:
        """The workspace folder that holds `path` (with none open, the file's own folder); None
        outside them all.  Files are generated only inside the workspace."""
        if not self.roots:
            return os.path.dirname(path)
        real = os.path.realpath(path)
        return next((r for r in self.roots if real.startswith(os.path.realpath(r) + os.sep)), None)

    def untrusted(self, path: str) -> str:
        """Why nothing runs for `path`, in the editor's words. The user is told once per server, by
        window/showMessage, whatever asked first (an open, a save, a command): every later open or
        command in the folder has the same answer, and a second notification would only stack on
        the first. Commands return the text as well, for a client that answers them itself."""
        if self.trust.not_a_model(path):  # asked by a command: the answer says why, and nothing else is told
            return self.trust.not_analyzed(path)
        explanation = Trust.explanation(path, self.editor)
        if not self._untrusted_told:
            self._untrusted_told = True
            self._tell(explanation, lsp.MessageType.Warning)
        return explanation


class ServerState:
    def __init__(
        self,
        documents: OpenDocuments,
        configuration: Configuration,
        folders: Folders,
        joined: Joined,
        measured: Callable[[str], list[MeasuredTraining]] = lambda path: [],
    ) -> None:
        self.documents = documents
        self.analyses = Analyses()
        self.configuration = configuration
        self.client = ClientFeatures()  # (set by `initialize`)
        self.folders = folders
        self.profiles = Profiles()
        self.probes = Probes()
        self.always_interpret = False  # the user chose, once, to validate in the interpreter where there is no GPU
        self._joined = joined
        self._measured = measured  # a file -> what its validation history measured of its training

    def snapshot(self, uri: str) -> Snapshot:
        """The state of the document `uri` now, for a request that arrived now."""
        doc = self.documents.get(uri)
        path = uri_to_path(uri)
        latest = self.analyses.get(uri)
        if latest is not None:
            latest = self._joined(uri, latest)
        snapshot = Snapshot(
            uri=uri,
            path=path,
            version=(doc.version or 0) if doc is not None else None,
            text=doc.source if doc is not None else None,
            latest=latest,
            settings=self.configuration.current,
            client=self.client,
            profile=None,
        )
        analysis = snapshot.analysis
        if path is None or analysis is None:
            return snapshot
        measured = tuple(self._measured(path))
        return dataclasses.replace(
            snapshot, profile=self.profiles.of(path, analysis), measured=measured, probe=self.probes.of(path, analysis)
        )
