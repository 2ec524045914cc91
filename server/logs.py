"""What the server logs, and where.

The editor gets the server's lines as window/logMessage (`EditorLog.line`) and its messages to the
user as window/showMessage (`EditorLog.tell`).  The editor also shows stderr: VS Code in the same
output channel (every line twice), Neovim as [ERROR] in lsp.log.  So stderr carries only warnings and
errors; the log file, when asked for, every line (`configure`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable

from lsprotocol import types as lsp

log = logging.getLogger("fuselens.server")


class EditorLog:
    """The server's lines, in its log and the editor's; its messages, in the editor's window."""

    def __init__(
        self,
        log_message: Callable[[lsp.LogMessageParams], None],
        show_message: Callable[[lsp.ShowMessageParams], None],
    ) -> None:
        self._log_message = log_message
        self._show_message = show_message

    def line(self, text: str) -> None:
        log.info(text)
        with contextlib.suppress(Exception):  # logging must never break the server
            self._log_message(lsp.LogMessageParams(lsp.MessageType.Log, text))

    def tell(self, text: str, kind: lsp.MessageType = lsp.MessageType.Info) -> None:
        self._show_message(lsp.ShowMessageParams(kind, text))


def configure(log_file: str | None) -> None:
    """Warnings and errors to stderr; every line to `log_file`, if given; pygls' own warnings once each."""
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setLevel(logging.WARNING)
    handlers: list[logging.Handler] = [stderr]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(level=logging.INFO, handlers=handlers, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("pygls").setLevel(logging.WARNING)
    brief = BriefOnce()
    for handler in handlers:
        handler.addFilter(brief)


class BriefOnce(logging.Filter):
    """pygls logs a traceback for every message it cannot read or handle: a client that sends
    thousands would bury the log.  Each kind of its warnings and errors (where, what, which
    exception) is logged once, on one line."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        decided = getattr(record, "fuselens_once", None)  # (each handler asks again)
        if decided is None:
            decided = self._first_of_its_kind(record)
            record.fuselens_once = decided
        return decided

    def _first_of_its_kind(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("pygls") or record.levelno < logging.WARNING:
            return True
        error = record.exc_info[1] if record.exc_info else None
        arg = record.args[0] if isinstance(record.args, tuple) and record.args else None
        if error is None and isinstance(arg, BaseException):
            error = arg  # (pygls' error reporter logs the exception as its argument)
        key = (record.name, str(record.msg), type(error).__name__)
        if key in self.seen:
            return False
        self.seen.add(key)
        text = record.getMessage().split("\n", 1)[0][:300]
        if error is not None:
            text += f" ({type(error).__name__}: {str(error)[:200]})"
        record.msg, record.args, record.exc_info, record.exc_text = text + "; logged once", None, None, None
        return True
