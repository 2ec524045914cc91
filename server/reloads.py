"""Which open documents the editor reloaded from disk, to analyze them again.

Open and save analyze a document.  A file that changes on disk under an editor that shows it (a
`git checkout`, a formatter, `fuselens apply`) is reloaded by the editor when its buffer has no
changes of the user's: Neovim and Emacs close and reopen the document (`didClose`, `didOpen`), which
analyzes it, but VS Code changes its text (`didChange`), and nothing analyzed it: the diagnostics of
the old text stayed on the new one.

So when the file of an open document changes on disk, the document is analyzed again as soon as its
text is the disk's: at once if the editor reloaded it before the change was seen here, or at the
`didChange` that makes it so.  A buffer that differs from the disk (the user's unsaved edits, an
editor that has not reloaded it yet) is left as it is: the diagnostics stay those of the text shown.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from fuselens.codegen.source_file import SourceError, read_source


def disk_text(path: str) -> str | None:
    """The file's text as an editor shows it, lines ending in `\\n` (None when it cannot be read)."""
    try:
        return read_source(path).text
    except (OSError, SourceError):
        return None


def _digest(text: str) -> str:
    """A digest of `text` with its line endings as an editor may hold them (`\\r\\n`, `\\r`) made `\\n`."""
    return hashlib.sha256(text.replace("\r\n", "\n").replace("\r", "\n").encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class Reloads:
    # uri -> the version the editor opened or saved (its text is the disk's), or reloaded from disk
    synced: dict[str, int] = field(default_factory=dict)
    # uri -> the digest of the text its file has on disk, changed since, that the buffer does not hold yet
    awaited: dict[str, str] = field(default_factory=dict)
    # uri -> the version analyzed because it was reloaded (its save, if one follows, need not start another)
    reanalyzed: dict[str, int] = field(default_factory=dict)

    def opened(self, uri: str, version: int) -> None:
        self.synced[uri] = version
        self.awaited.pop(uri, None)

    def saved(self, uri: str, version: int, analyzed_version: int | None) -> bool:
        """The document was saved: whether to analyze it (not when its reload, the same text, is being
        analyzed now: a watcher can tell of a save before the editor does)."""
        self.awaited.pop(uri, None)
        self.synced[uri] = version
        reloaded = self.reanalyzed.pop(uri, None)
        return not (reloaded == version and analyzed_version != version)

    def closed(self, uri: str) -> None:
        for table in (self.synced, self.awaited, self.reanalyzed):
            table.pop(uri, None)

    def file_changed(self, uri: str, version: int, buffer: str, disk: str | None) -> bool:
        """The document's file changed on disk (now `disk`): whether to analyze it now."""
        if disk is None:  # deleted, or not text: the buffer is all there is
            self.awaited.pop(uri, None)
            return False
        if _digest(buffer) != _digest(disk):
            self.awaited[uri] = _digest(disk)  # the editor may reload it: see `changed`
            return False
        self.awaited.pop(uri, None)
        if self.synced.get(uri) == version:
            return False  # the text the editor opened or saved, analyzed then
        return self._reloaded(uri, version)

    def changed(self, uri: str, version: int, buffer: str) -> bool:
        """The document's text changed: whether to analyze it now (the editor reloaded it from disk)."""
        awaited = self.awaited.get(uri)
        if awaited is None or _digest(buffer) != awaited:
            return False
        del self.awaited[uri]
        return self._reloaded(uri, version)

    def _reloaded(self, uri: str, version: int) -> bool:
        self.synced[uri] = version
        self.reanalyzed[uri] = version
        return True
