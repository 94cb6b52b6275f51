"""The gateway's client side of one MCP stdio server: a JSON-RPC 2.0 multiplexer.

One :class:`Downstream` owns the protocol state of one connection to a sandboxed MCP server
(newline-delimited JSON-RPC 2.0 over the server's stdin/stdout, as MCP's stdio transport
defines it). Many gateway sessions share it: each :meth:`Downstream.request` gets a fresh
integer id, writes one line, and waits for the reply routed back by id, so requests from
different clients interleave on the one pipe and may be answered in any order.

It is hand-written on purpose rather than built on the SDK's ``ClientSession``: the session
validates every result into pydantic models, while the forwarding hot path must hand results
through raw, without re-validation and re-serialisation. Results are plain dicts here, and a
request costs one dict, one ``json.dumps`` and one write.

Usage (a profile runtime's nursery)::

    downstream = Downstream("github", process.stdin, process.stdout, hooks)
    await nursery.start(downstream.run)
    await downstream.initialize(client_info=..., capabilities=...)
    result = await downstream.request("tools/call", params, context=session)

* Progress: with ``on_progress``, the caller's ``_meta.progressToken`` is replaced by the
  request id (unique for the connection's life) and each ``notifications/progress`` for it is
  delivered, with the caller's token restored, to ``on_progress`` *in the caller's task*, in
  order and before the result: a slow consumer slows only its own request, never the reader.
* Server-to-client requests (sampling, elicitation, roots) run :meth:`Hooks.on_request` in a
  task of their own, so a slow hook never blocks the reader; ``ping`` is answered here. A
  ``notifications/cancelled`` from the server cancels the matching hook task, and no
  response is sent for it (as the spec requires).
* Other notifications are passed to :meth:`Hooks.on_notification` *inline*, from the reader,
  which keeps them in order (a ``list_changed`` after the log lines before it). The hook must
  therefore not block: hand the notification off (``send_nowait``, a bounded buffer) and
  return.
* ``contexts`` given to hooks are the ``context`` objects of the requests in flight at that
  moment, oldest first; requests made without a context are left out.

Resource handling:
    :meth:`Downstream.run` owns a nursery holding the reader and one task per server-to-client
    request; it may be entered once. The streams belong to the caller (normally the sandbox
    handle) and are never closed here: ending the process is the sandbox owner's job. Writes
    are serialised by a lock held only for the write itself, never while waiting for a reply.
    A write that has started is shielded from the caller's cancellation, because a line cut
    in half would corrupt the pipe for every other session; :meth:`close` and the end of
    :meth:`run` abort it instead. Incoming lines are bounded by ``max_line``.

Error handling:
    A JSON-RPC error answer raises :class:`DownstreamError` in the caller. EOF, a broken or
    closed stream, a line over ``max_line``, a cancelled or failed ``run`` and :meth:`close`
    all end the connection: every pending request and every later one raises
    :class:`DownstreamGone`, ``closed`` is set, and ``run`` returns (it raises only when
    cancelled from outside). Lines that are not JSON and answers with unknown ids are logged
    and ignored. A hook that raises anything but :class:`DownstreamError` is logged and
    answered with ``-32603 internal error``. ``trio.Cancelled`` is never swallowed.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeAlias

import trio

from svcgate.logs import REQUEST_ID

log = logging.getLogger(__name__)

#: Opaque per-request object supplied by the caller (a gateway session, say) and handed
#: back to the hooks in ``contexts``.
Context: TypeAlias = Any

ProgressCallback = Callable[[dict[str, Any]], Awaitable[None]]

ACCEPTED_PROTOCOL_VERSIONS = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"})

METHOD_NOT_FOUND = -32601
INTERNAL_ERROR = -32603
INVALID_REQUEST = -32600

_READ_CHUNK = 65536
_LOG_EXCERPT = 200
# Progress notifications queued for a caller that is slower than the server; beyond this
# the oldest are dropped (progress is a best-effort signal, the result is not).
_PROGRESS_BACKLOG = 1024
_CANCEL_NOTICE_TIMEOUT = 1.0


class DownstreamError(Exception):
    """The server answered with a JSON-RPC error (or a hook wants to answer with one)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data

    @classmethod
    def method_not_found(cls, method: str) -> DownstreamError:
        """The error a hook raises for a server-to-client method it does not handle."""
        return cls(METHOD_NOT_FOUND, f"method not found: {method}")

    def to_json(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class DownstreamGone(Exception):
    """The connection ended: process exited, stream closed, broken protocol, or closed."""


class Hooks(Protocol):
    """What the owner of a :class:`Downstream` does with traffic the server starts."""

    async def on_notification(
        self, method: str, params: dict[str, Any] | None, contexts: list[Any]
    ) -> None:
        """A server notification; called inline from the reader, so it must not block."""

    async def on_request(
        self, method: str, params: dict[str, Any] | None, contexts: list[Any]
    ) -> dict[str, Any]:
        """A server-to-client request; return the raw result or raise DownstreamError."""
        ...


class _Pending:
    """One request in flight: what the reader delivers and how it wakes the caller."""

    __slots__ = ("context", "error", "original_token", "progress", "request_id", "result", "wakeup")

    def __init__(self, context: Context, request_id: str | None) -> None:
        self.context = context
        self.request_id = request_id  # the gateway request's id, for log correlation
        self.wakeup = trio.Event()
        self.result: dict[str, Any] | None = None
        self.error: Exception | None = None
        # Set only when the caller asked for progress and had a token to restore.
        self.original_token: Any = None
        self.progress: deque[dict[str, Any]] | None = None


def _encode(message: dict[str, Any]) -> bytes:
    try:
        return (json.dumps(message, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
    except UnicodeEncodeError:
        # A lone surrogate (JSON allows "\ud800" escapes) cannot be UTF-8: send it escaped,
        # exactly as the client wrote it.
        return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def _excerpt(line: bytes | bytearray) -> str:
    return line[:_LOG_EXCERPT].decode("utf-8", "replace")


class Downstream:
    """The JSON-RPC client side of one MCP server's stdio streams (see the module docs)."""

    def __init__(
        self,
        name: str,
        send: trio.abc.SendStream,
        receive: trio.abc.ReceiveStream,
        hooks: Hooks,
        *,
        max_line: int = 32 * 1024 * 1024,
    ) -> None:
        self.name = name
        self.closed = trio.Event()
        self.initialize_result: dict[str, Any] | None = None
        self._send = send
        self._receive = receive
        self._hooks = hooks
        self._max_line = max_line
        self._next_id = 1
        self._pending: dict[int, _Pending] = {}
        self._incoming: dict[Any, trio.CancelScope] = {}
        self._write_lock = trio.Lock()
        self._write_scope: trio.CancelScope | None = None
        # Created here so close() can cancel a run() that has not started yet.
        self._run_scope = trio.CancelScope()
        self._run_entered = False
        self._nursery: trio.Nursery | None = None
        self._gone: str | None = None

    @property
    def alive(self) -> bool:
        """True until the connection ends (EOF, broken stream or protocol, close())."""
        return self._gone is None

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read and dispatch the server's messages until the connection ends.

        Reports readiness at once. Returns when the stream ends, the protocol breaks or
        :meth:`close` is called; raises only when cancelled from outside. Either way every
        pending request fails with :class:`DownstreamGone` and ``closed`` is set.
        """
        if self._run_entered:
            raise RuntimeError("Downstream.run() may be entered once")
        self._run_entered = True
        reason = "connection closed"
        try:
            with self._run_scope:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    task_status.started()
                    reason = await self._read_loop()
                    # Nobody can receive the hook tasks' answers any more.
                    nursery.cancel_scope.cancel()
        finally:
            self._nursery = None
            self._terminate(reason)

    async def close(self) -> None:
        """Fail pending requests with DownstreamGone, refuse new ones, and stop run()."""
        self._terminate("closed by the gateway")
        await trio.lowlevel.checkpoint()

    def _terminate(self, reason: str) -> None:
        if self._gone is not None:
            return
        self._gone = reason
        log.debug("downstream %s: connection ended: %s", self.name, reason)
        pending, self._pending = self._pending, {}
        for entry in pending.values():
            entry.error = DownstreamGone(f"downstream {self.name}: {reason}")
            entry.wakeup.set()
        self._run_scope.cancel()
        if self._write_scope is not None:
            self._write_scope.cancel()
        self.closed.set()

    def request_ids_in_flight(self) -> list[str]:
        """The ids of the gateway requests (:data:`svcgate.logs.REQUEST_ID`) whose calls
        wait for an answer right now, oldest first, each once."""
        ids: list[str] = []
        for entry in self._pending.values():
            if entry.request_id is not None and entry.request_id not in ids:
                ids.append(entry.request_id)
        return ids

    def _gone_error(self) -> DownstreamGone:
        return DownstreamGone(f"downstream {self.name}: {self._gone}")

    # -- client to server ------------------------------------------------------------------

    async def initialize(
        self,
        *,
        client_info: dict[str, Any],
        capabilities: dict[str, Any],
        protocol_version: str = "2025-11-25",
        timeout: float = 30.0,  # noqa: ASYNC109 - the handshake deadline is part of the contract
    ) -> dict[str, Any]:
        """Run the MCP handshake and return the server's raw InitializeResult.

        Any failure (no answer within ``timeout``, an error answer, a protocol revision the
        gateway does not speak) closes the connection and raises :class:`DownstreamGone`:
        an uninitialised server is of no use.
        """
        params = {
            "protocolVersion": protocol_version,
            "capabilities": capabilities,
            "clientInfo": client_info,
        }
        try:
            # The spec forbids cancelling initialize, so a timeout sends no notice.
            with trio.fail_after(timeout):
                result = await self._call("initialize", params, None, None, announce=False)
        except trio.TooSlowError:
            reason = f"no answer to initialize within {timeout:g} s"
            self._terminate(reason)
            raise self._gone_error() from None
        except DownstreamError as exc:
            self._terminate(f"initialize failed: {exc}")
            raise self._gone_error() from exc
        version = result.get("protocolVersion")
        if version not in ACCEPTED_PROTOCOL_VERSIONS:
            accepted = ", ".join(sorted(ACCEPTED_PROTOCOL_VERSIONS))
            self._terminate(f"server speaks protocol version {version!r}; accepted: {accepted}")
            raise self._gone_error()
        await self.notify("notifications/initialized", None)
        self.initialize_result = result
        return result

    async def request(
        self,
        method: str,
        params: dict[str, Any] | None,
        *,
        context: Context = None,
        on_progress: ProgressCallback | None = None,
    ) -> dict[str, Any]:
        """Send a request and return the raw ``result`` of its answer.

        Raises :class:`DownstreamError` for an error answer and :class:`DownstreamGone` when
        the connection ends first. When the caller is cancelled after the request went out,
        ``notifications/cancelled`` is sent (best effort, one second at most).
        """
        return await self._call(method, params, context, on_progress, announce=True)

    async def _call(
        self,
        method: str,
        params: dict[str, Any] | None,
        context: Context,
        on_progress: ProgressCallback | None,
        *,
        announce: bool,
    ) -> dict[str, Any]:
        if self._gone is not None:
            raise self._gone_error()
        request_id = self._next_id
        self._next_id += 1
        entry = _Pending(context, REQUEST_ID.get())
        if on_progress is not None and params is not None:
            meta = params.get("_meta")
            if isinstance(meta, dict) and meta.get("progressToken") is not None:
                entry.original_token = meta["progressToken"]
                entry.progress = deque(maxlen=_PROGRESS_BACKLOG)
                params = {**params, "_meta": {**meta, "progressToken": request_id}}
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        line = _encode(message)
        self._pending[request_id] = entry
        sent = False
        try:
            await self._write(line)
            sent = True
            if entry.progress is None:
                await entry.wakeup.wait()
            else:
                assert on_progress is not None
                await self._deliver_progress(entry, on_progress)
        except trio.Cancelled:
            if sent and announce and self._gone is None:
                with trio.move_on_after(_CANCEL_NOTICE_TIMEOUT, shield=True):
                    await self._announce_cancel(request_id)
            raise
        finally:
            self._pending.pop(request_id, None)
        if entry.result is not None:
            return entry.result
        assert entry.error is not None
        raise entry.error

    async def _deliver_progress(self, entry: _Pending, on_progress: ProgressCallback) -> None:
        progress = entry.progress
        assert progress is not None
        while True:
            while progress:
                await on_progress(progress.popleft())
            if entry.result is not None or entry.error is not None:
                return
            entry.wakeup = trio.Event()
            await entry.wakeup.wait()

    async def _announce_cancel(self, request_id: int) -> None:
        notice = {"requestId": request_id, "reason": "cancelled by the client"}
        with contextlib.suppress(DownstreamGone):  # nobody left to tell
            await self.notify("notifications/cancelled", notice)

    async def notify(self, method: str, params: dict[str, Any] | None) -> None:
        """Send a notification (no answer expected)."""
        if self._gone is not None:
            raise self._gone_error()
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self._write(_encode(message))

    async def _write(self, line: bytes) -> None:
        async with self._write_lock:
            if self._gone is not None:
                raise self._gone_error()
            # Shielded from the caller: half a line would corrupt the pipe for everyone.
            # _terminate() cancels this scope, and then the pipe is dead anyway.
            with trio.CancelScope(shield=True) as scope:
                self._write_scope = scope
                try:
                    await self._send.send_all(line)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    self._terminate(f"write failed: {exc!r}")
                finally:
                    self._write_scope = None
            if scope.cancelled_caught or self._gone is not None:
                raise self._gone_error()

    # -- server to client ------------------------------------------------------------------

    async def _read_loop(self) -> str:
        """Read lines until the connection ends; return why it ended."""
        buffer = bytearray()
        max_line = self._max_line
        while True:
            try:
                data = await self._receive.receive_some(_READ_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                return f"read failed: {exc!r}"
            if not data:
                return "the server closed its output"
            if b"\n" not in data:
                buffer += data
                if len(buffer) > max_line:
                    return self._overlong()
                continue
            buffer += data
            *lines, rest = buffer.split(b"\n")
            buffer = rest
            if len(buffer) > max_line:
                return self._overlong()
            for line in lines:
                if len(line) > max_line:
                    return self._overlong()
                await self._handle_line(line)

    def _overlong(self) -> str:
        reason = f"the server sent a line longer than {self._max_line} bytes"
        log.warning("downstream %s: %s", self.name, reason)
        return reason

    async def _handle_line(self, line: bytes | bytearray) -> None:
        line = line.strip()
        if not line:
            return
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            log.warning("downstream %s: ignoring a non-JSON line: %r", self.name, _excerpt(line))
            return
        if isinstance(message, dict):
            await self._dispatch(message)
        elif isinstance(message, list):  # a JSON-RPC batch (protocol 2025-03-26)
            for item in message:
                if isinstance(item, dict):
                    await self._dispatch(item)
        else:
            log.warning("downstream %s: ignoring a non-object message: %r", self.name, message)

    async def _dispatch(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        if method is None:
            self._deliver_response(message)
        elif not isinstance(method, str):
            log.warning("downstream %s: ignoring a message with method %r", self.name, method)
        elif "id" in message:
            self._start_incoming(message["id"], method, message.get("params"))
        else:
            await self._on_notification(method, message.get("params"))

    def _deliver_response(self, message: dict[str, Any]) -> None:
        request_id = message.get("id")
        entry = self._pending.get(request_id) if type(request_id) is int else None
        if entry is None:
            log.debug("downstream %s: ignoring an answer with unknown id %r", self.name, request_id)
            return
        result = message.get("result")
        if isinstance(result, dict):
            entry.result = result
        elif "error" in message:
            entry.error = _error_from(message["error"])
        else:
            entry.error = DownstreamError(INTERNAL_ERROR, "malformed response from downstream")
        entry.wakeup.set()

    async def _on_notification(self, method: str, params: Any) -> None:
        if not isinstance(params, dict):
            params = None
        if method == "notifications/progress" and params is not None:
            token = params.get("progressToken")
            entry = self._pending.get(token) if type(token) is int else None
            if entry is not None and entry.progress is not None:
                params["progressToken"] = entry.original_token  # the dict is ours: just parsed
                entry.progress.append(params)
                entry.wakeup.set()
                return
        elif method == "notifications/cancelled" and params is not None:
            target = params.get("requestId")
            scope = self._incoming.get(target) if _valid_id(target) else None
            if scope is not None:
                scope.cancel()
            return
        try:
            await self._hooks.on_notification(method, params, self._contexts())
        except Exception:  # a hook's bug must not end the connection; logged
            log.exception("downstream %s: notification hook failed for %s", self.name, method)

    def _contexts(self) -> list[Any]:
        return [entry.context for entry in self._pending.values() if entry.context is not None]

    def _start_incoming(self, request_id: Any, method: str, params: Any) -> None:
        if not isinstance(params, dict):
            params = None
        nursery = self._nursery
        assert nursery is not None  # only the reader, inside run()'s nursery, gets here
        if not _valid_id(request_id):
            error = DownstreamError(INVALID_REQUEST, "request id must be a string or a number")
            nursery.start_soon(self._answer, None, None, error)
            return
        if request_id in self._incoming:
            error = DownstreamError(INVALID_REQUEST, "duplicate request id")
            nursery.start_soon(self._answer, request_id, None, error)
            return
        scope = trio.CancelScope()
        self._incoming[request_id] = scope
        nursery.start_soon(self._serve_incoming, scope, request_id, method, params)

    async def _serve_incoming(
        self, scope: trio.CancelScope, request_id: Any, method: str, params: dict[str, Any] | None
    ) -> None:
        result: dict[str, Any] | None = None
        error: DownstreamError | None = None
        try:
            with scope:
                if method == "ping":
                    result = {}
                else:
                    try:
                        result = await self._hooks.on_request(method, params, self._contexts())
                        if not isinstance(result, dict):
                            raise TypeError(f"on_request returned {type(result).__name__}")
                    except DownstreamError as exc:
                        error = exc
                    except Exception:  # answered as internal error, logged
                        log.exception(
                            "downstream %s: request hook failed for %s", self.name, method
                        )
                        error = DownstreamError(INTERNAL_ERROR, "internal error")
        finally:
            self._incoming.pop(request_id, None)
        if scope.cancelled_caught:
            return  # cancelled by the server: the spec says send no response
        await self._answer(request_id, result, error)

    async def _answer(
        self, request_id: Any, result: dict[str, Any] | None, error: DownstreamError | None
    ) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
        if error is not None:
            message["error"] = error.to_json()
        else:
            message["result"] = result
        try:
            line = _encode(message)
        except (TypeError, ValueError):  # a hook's result or error data that is not JSON
            log.exception("downstream %s: cannot encode the answer to %r", self.name, request_id)
            internal = DownstreamError(INTERNAL_ERROR, "internal error").to_json()
            line = _encode({"jsonrpc": "2.0", "id": request_id, "error": internal})
        # If the connection ended while the hook ran, the answer has nowhere to go.
        with contextlib.suppress(DownstreamGone):
            await self._write(line)


def _valid_id(value: Any) -> bool:
    """A JSON-RPC id we can key on: a string or a number (not a bool, list or object)."""
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def _error_from(error: Any) -> DownstreamError:
    if not isinstance(error, dict):
        return DownstreamError(INTERNAL_ERROR, f"malformed error from downstream: {error!r}")
    code = error.get("code")
    message = error.get("message")
    return DownstreamError(
        code if type(code) is int else INTERNAL_ERROR,
        message if isinstance(message, str) else "error without a message",
        error.get("data"),
    )
