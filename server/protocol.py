"""The JSON-RPC side of the language server: pygls' protocol, fed the JSON values `framing.py` reads,
keeping to the LSP lifecycle and answering every request it is sent.

`initialize` once, every request answered (an error for one pygls would drop), InvalidRequest after
`shutdown`, a client's late answer to a request the server gave up on dropped without a word, and each
kind of malformed message logged once.  A handler marked `on_arrival` is called as its request is
read, and returns the coroutine that answers it, run as a task of its own that `$/cancelRequest`
cancels.  What the server does with a message is `handlers.py`'s and `commands.py`'s.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import attrs
from cattrs import transform_error
from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams, JsonRpcInvalidRequest, JsonRpcServerNotInitialized
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method

log = logging.getLogger("fuselens.server")

_ANSWERED = object()  # a request already answered with an error while it was being read
GIVEN_UP_KEPT = 1024  # how many ids of requests the server gave up on it remembers (see `given_up`)

T = TypeVar("T")
Arrival = TypeVar("Arrival", bound=Callable[..., Coroutine[Any, Any, Any]])
_ON_ARRIVAL = "fuselens_on_arrival"


def on_arrival(handler: Arrival) -> Arrival:
    """Mark a request's handler to be called as the request is read (pygls would start a coroutine
    handler later, once the messages read with it have been handled): what it takes then, its snapshot,
    is the server's state as the request arrived.  It returns the coroutine that answers the request,
    which runs as a task of its own."""
    setattr(handler, _ON_ARRIVAL, True)
    return handler


class FuselensProtocol(LanguageServerProtocol):
    """pygls' protocol, fed JSON values by `framing.py`, and answering every request it is sent.

    pygls drops a request whose params cannot be read (a negative line, a missing URI), one that
    is not JSON-RPC 2.0, one sent after `shutdown`, and a notification's method sent with an id,
    so the client would wait for an answer for ever; here each gets an error.  Each kind of
    malformed message is logged once, on one line.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initialize_seen = self.initialized_seen = False
        self.answering: dict[Any, asyncio.Task[Any]] = {}  # request id -> the task answering it (`answered_by`)
        self.complaints: Counter[str] = Counter()
        # The ids of the server's own requests it stopped waiting for (timed out, cancelled), the latest
        # GIVEN_UP_KEPT of them: a client's late answer to one is dropped without a word.
        self.given_up: dict[Any, None] = {}

    def receive(self, value: Any) -> None:
        """Handle one message, as the stream gave it (any JSON value)."""
        problem = _not_a_message(value)
        if problem is not None:
            if isinstance(value, dict) and "method" in value and _is_id(value.get("id")):
                self._refuse(value["id"], JsonRpcInvalidRequest(f"not a valid request: {problem}"))
            self.complain("message", problem)
            return
        method = value.get("method")
        if method is not None and "id" in value:
            refusal = self._lifecycle(method)
            if refusal is not None:
                self._refuse(value["id"], refusal)
                return
        elif method is not None and self._out_of_order(method):
            return
        try:
            message = self.structure_message(value)
        except JsonRpcException as exc:  # a notification, or the client's answer to a request of ours
            what = f"a {method} notification" if method is not None else "an answer"
            self.complain("unreadable", f"{what} that cannot be read ({type(exc.__cause__).__name__})")
            if method is None:
                self._unanswerable(value["id"], exc)
            return
        if message is _ANSWERED:
            return
        if method is None and self._answer_too_late(value["id"]):
            return
        if method == lsp.INITIALIZE:
            self.initialize_seen = True
        try:
            self.handle_message(message)
        except Exception as exc:  # (pygls answers a request whose handler fails; this is anything else)
            self.complain("not handled", f"{type(exc).__name__}: {exc}")

    def complain(self, kind: str, detail: str) -> None:
        """Log a malformed message: the first of each kind, briefly; the others are only counted."""
        self.complaints[kind] += 1
        if self.complaints[kind] == 1:
            log.warning("ignored a malformed message (%s): %s; more of this kind are not logged", kind, detail[:300])

    def structure_message(self, data: dict[str, Any]):
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            if "method" not in data or "id" not in data:
                raise
            cause = exc.__cause__
            if isinstance(exc, JsonRpcInvalidParams) and cause is not None:
                detail = "; ".join(transform_error(cause))
            else:
                detail = f"{type(cause).__name__}: {cause}" if cause is not None else "unreadable"
            self._refuse(data["id"], JsonRpcInvalidParams(f"invalid params for {data['method']}: {detail[:2000]}"))
            return _ANSWERED

    def handle_message(self, message) -> None:
        super().handle_message(message)
        if getattr(message, "method", None) == lsp.CANCEL_REQUEST:
            # pygls cancels the request's future, not the task answering it (a command's, which would run on)
            task = self.answering.get(getattr(message.params, "id", None))
            if task is not None:
                task.cancel()

    def _lifecycle(self, method: str) -> JsonRpcException | None:
        """Why a request for `method` is refused at this point of the lifecycle, if it is."""
        if method == lsp.INITIALIZE:
            return JsonRpcInvalidRequest("the server is already initialized") if self.initialize_seen else None
        if not self.initialize_seen:
            return JsonRpcServerNotInitialized(f"{method} before initialize")
        if self._shutdown:
            return JsonRpcInvalidRequest(f"{method} after shutdown: the server is shutting down")
        return None

    def _out_of_order(self, method: str) -> bool:
        """A notification the lifecycle drops: any but `exit` before initialize, a second `initialized`."""
        if not self.initialize_seen and method != lsp.EXIT:
            self.complain("before initialize", f"the notification {method} came before initialize")
            return True
        if method == lsp.INITIALIZED:
            if self.initialized_seen:
                self.complain("initialized again", "a second initialized notification")
                return True
            self.initialized_seen = True
        return False

    def _answer_too_late(self, msg_id: Any) -> bool:
        """An answer to a request of ours that was cancelled meanwhile (`shutdown` cancels them all, a
        timeout one)."""
        if msg_id in self.given_up:
            del self.given_up[msg_id]
            return True
        future = self._request_futures.get(msg_id)
        if future is None or not future.done():
            return False
        del self._request_futures[msg_id]
        return True

    # ---- what is kept of each request ----------------------------------------------------------
    # pygls keeps the future of every handler that does not finish at once (a coroutine, a generator)
    # in `_request_futures`, under the request's id, and removes it only when it answers a request of
    # that id.  A command's handler runs under an id of its own (the generator that answers
    # `workspace/executeCommand` calls it), and so does every notification's: their futures, with the
    # result or the exception and its traceback, were kept for good (150 KB for a "Show kernel").
    # The server's own requests stayed there too when no answer came, and each that was answered with
    # an error left its result type in `_result_types`.

    def _execute_handler(self, msg_id: Any, handler: Any, callback: Any, args: Any = None, kwargs: Any = None):
        """pygls' handler call, its future released once it is done (then `callback` runs as before); a
        handler marked `on_arrival` is called now, and its coroutine handed to pygls in its place."""
        if getattr(handler, _ON_ARRIVAL, False):
            try:
                handler, args, kwargs = self._answer, (handler(*(args or ()), **(kwargs or {})),), None
            except Exception as exc:  # (its arguments, checked as it arrived) answered as pygls answers any
                handler, args, kwargs = _raise, (exc,), None

        def release_then_callback(future: Any) -> None:
            if self._request_futures.get(msg_id) is future:
                del self._request_futures[msg_id]
            if not future.cancelled():
                # Seen here: pygls does not look at a command's exception once its request is cancelled,
                # and asyncio logs an exception nobody looked at, with its traceback, as the task is freed.
                future.exception()
            callback(future)

        super()._execute_handler(msg_id, handler, release_then_callback, args, kwargs)

    async def _answer(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work`, a task `$/cancelRequest` for the request cancels (pygls would cancel only a request's
        future, and a command's work, a remote runner say, would run on)."""
        msg_id, task = self.msg_id, asyncio.current_task()  # (the request's id: the task copied its context)
        if msg_id is not None and task is not None:
            self.answering[msg_id] = task
        try:
            return await work
        finally:
            self.answering.pop(msg_id, None)

    def send_request(self, method: str, params: Any = None, callback: Any = None, msg_id: Any = None):
        """pygls' request to the client, all that is kept of it released once it is answered or given up on."""
        msg_id = str(uuid.uuid4()) if msg_id is None else msg_id
        future = super().send_request(method, params, callback, msg_id)
        future.add_done_callback(functools.partial(self._request_ended, msg_id))
        return future

    def _request_ended(self, msg_id: Any, future: Any) -> None:
        self._result_types.pop(msg_id, None)
        if self._request_futures.get(msg_id) is future:  # no answer came: it timed out, or was cancelled
            del self._request_futures[msg_id]
            remember(self.given_up, msg_id, None, GIVEN_UP_KEPT)

    def _unanswerable(self, msg_id: Any, error: JsonRpcException) -> None:
        """Our request `msg_id` failed: the client's answer cannot be read.  (pygls would leave it
        waiting for ever, and the command that asked with it.)"""
        future = self._request_futures.pop(msg_id, None)
        if future is not None and not future.done():
            future.set_exception(JsonRpcException(f"the client's answer cannot be read: {error.__cause__ or error}"))

    def _refuse(self, msg_id: Any, error: JsonRpcException) -> None:
        self._send_response(msg_id, error=error.to_response_error())

    @lsp_method(lsp.SHUTDOWN)
    def lsp_shutdown(self, *args):
        """pygls' shutdown, except that the requests in flight are cancelled first (each answered as
        cancelled, and a command's work, a remote runner say, stopped before the server's own), and
        over a copy of their table: cancelling one removes it from the table."""
        current = self.msg_id
        for msg_id, future in list(self._request_futures.items()):
            if msg_id != current and not future.done():
                future.cancel()
        if (user_handler := self.fm.features.get(lsp.SHUTDOWN)) is not None:
            yield user_handler, args, None
        self._shutdown = True


def _not_a_message(value: Any) -> str | None:
    """Why `value` is not a JSON-RPC 2.0 request, notification or response (None if it is one)."""
    if not isinstance(value, dict):
        return f"a JSON {type(value).__name__}, not an object"
    if value.get("jsonrpc") != "2.0":
        return 'not JSON-RPC 2.0 (no "jsonrpc": "2.0")'
    if "method" in value:
        method = value["method"]
        if not isinstance(method, str):
            return "a method that is not a string"
        if "id" in value and not _is_id(value["id"]):
            return "an id that is neither an integer nor a string"
        if "id" in value and _is_notification(method):
            return f"{method} is a notification, sent with an id"
        return None
    if not _is_id(value.get("id")) or not ("result" in value or "error" in value):
        return "neither a request, a notification nor a response"
    return None


def _raise(error: Exception) -> None:
    raise error


def remember(table: dict[Any, Any], key: Any, value: Any, limit: int) -> None:
    """`table[key] = value`, the oldest entries dropped past `limit`: what the server remembers of
    what a client sends (ids, paths, settings) must not grow with every message."""
    table[key] = value
    while len(table) > limit:
        del table[next(iter(table))]


def _is_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


@functools.lru_cache(maxsize=256)
def _is_notification(method: str) -> bool:
    """An LSP method whose messages carry no id."""
    types = lsp.METHOD_TO_TYPES.get(method)
    return types is not None and attrs.has(types[0]) and "id" not in attrs.fields_dict(types[0])
