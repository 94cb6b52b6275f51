"""The forwarding fast path: a ``tools/call`` relayed as raw JSON-RPC, past the SDK server.

The SDK's streamable-HTTP server validates every message into pydantic models, hands it
through memory streams to a session task, dispatches it to a handler in a task of its own
and serialises the answer onto an event stream: about a millisecond of CPU per call on this
machine, more than everything else the gateway does (docs/benchmarks.md). A ``tools/call``
that needs none of the SDK's session machinery is therefore answered here instead:
:func:`classify` decides, from the headers and the already-parsed body, whether the request
qualifies; the runtime then rewrites only the tool name (and, in :mod:`svcgate.downstream`,
the progress token), writes one line to the server's stdio pipe and answers with the
server's own result, as it came.

A request qualifies only when the SDK would have accepted it and answered it the same way;
everything else (another method, a malformed or batched body, any header the SDK would
refuse, an unknown session, a tool that is not routable) goes to the SDK server unchanged,
so every error keeps the SDK's exact shape:

- handshake generation (up to 2025-11-25): a ``Mcp-Session-Id`` of a session this runtime
  saw initialise *without* declaring sampling, elicitation or roots (a server-to-client
  request made during the call can then only be refused or answered with no roots, as the
  SDK path does for such a session, so no request to the client is ever needed), still
  alive in the SDK's session manager; no ``MCP-Protocol-Version`` header or a handshake
  version;
- 2026-07-28: the SDK's own validation ladder (:func:`classify_inbound_request`,
  :func:`find_duplicated_routing_header`) passes, there are no ``Mcp-Param-*`` headers and
  the tool declares none (so there is nothing to validate against its schema);
- both: ``Content-Type: application/json`` and an ``Accept`` naming both JSON and event
  streams, as the SDK requires.

The answer is ``application/json`` when the result comes before anything else; a progress
notification or log message for the call (which the SDK would send on the call's event
stream) commits ``text/event-stream`` first, as the SDK's 2026-07-28 path does. The client
closing its connection cancels the call downstream; a handshake client's
``notifications/cancelled`` for a call in flight here is honoured here.

Hand-written because no library relays JSON-RPC between MCP's HTTP and stdio transports
without decoding every message into models.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import trio
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    InboundModernRoute,
    classify_inbound_request,
    find_duplicated_routing_header,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from svcgate.asgi_io import Send

log = logging.getLogger(__name__)

SERVER_TO_CLIENT_CAPABILITIES = ("sampling", "elicitation", "roots")
_OUTBOX = 64  # events (progress, log lines) queued for a slow client before log lines drop
_JSON = b"application/json"
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"connection", b"keep-alive"),
    (b"x-accel-buffering", b"no"),
]
_HANDSHAKE = frozenset(v.encode() for v in HANDSHAKE_PROTOCOL_VERSIONS)
_MODERN = frozenset(v.encode() for v in MODERN_PROTOCOL_VERSIONS)
_ROUTING = (b"mcp-protocol-version", b"mcp-method", b"mcp-name")


@dataclass(frozen=True, slots=True)
class FastRequest:
    """A ``tools/call`` the fast path serves."""

    request_id: str | int
    tool: str  # the exposed name (``<server>_<tool>``)
    params: dict[str, Any]
    modern: bool
    session_id: str | None  # handshake generation only


def _accepts_both(accept: bytes) -> bool:
    types = {part.split(b";", 1)[0].strip().lower() for part in accept.split(b",")}
    if b"*/*" in types:
        return True
    return bool(types & {_JSON, b"application/*"}) and bool(
        types & {b"text/event-stream", b"text/*"}
    )


def classify(
    headers: list[tuple[bytes, bytes]],
    message: Any,
    *,
    fast_session: Callable[[str], bool],
    plain_tool: Callable[[str], bool],
) -> FastRequest | None:
    """The fast-path form of a POST, or None when the SDK must serve it (module docstring).

    ``fast_session(id)``: a live handshake session that qualifies; ``plain_tool(name)``: a
    routable tool whose schema declares no ``x-mcp-header`` parameters.
    """
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return None
    request_id = message.get("id")
    params = message.get("params")
    if message.get("jsonrpc") != "2.0" or not isinstance(params, dict):
        return None
    if not isinstance(request_id, (str, int)) or isinstance(request_id, bool):
        return None
    name = params.get("name")
    arguments = params.get("arguments")
    meta = params.get("_meta")
    if not isinstance(name, str) or not (arguments is None or isinstance(arguments, dict)):
        return None
    if not (meta is None or isinstance(meta, dict)):
        return None
    accept = content_type = session = version = None
    for key, value in headers:
        if key == b"accept":
            accept = value
        elif key == b"content-type":
            content_type = value
        elif key == b"mcp-session-id":
            session = value
        elif key == b"mcp-protocol-version":
            version = value
        elif key.startswith(b"mcp-param-"):
            return None
    if accept is None or not _accepts_both(accept):
        return None
    if content_type is None or not content_type.lower().startswith(_JSON):
        return None
    if version in _MODERN:
        if session is not None or not plain_tool(name):
            return None
        raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers if k in _ROUTING]
        if find_duplicated_routing_header(raw) is not None:
            return None
        verdict = classify_inbound_request(message, headers=dict(raw))
        if not isinstance(verdict, InboundModernRoute):
            return None
        return FastRequest(request_id, name, params, True, None)
    if version is not None and version not in _HANDSHAKE:
        return None
    if session is None:
        return None
    session_id = session.decode("latin-1")
    if not fast_session(session_id) or not plain_tool(name):
        return None
    return FastRequest(request_id, name, params, False, session_id)


def qualifies_for_fast_path(capabilities: Any) -> bool:
    """Whether a handshake session initialised with ``capabilities`` may use the fast path:
    it declared no capability that lets a server send it requests."""
    return isinstance(capabilities, Mapping) and not any(
        capabilities.get(key) is not None for key in SERVER_TO_CLIENT_CAPABILITIES
    )


def encode(message: Mapping[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()


def sse_event(message: Mapping[str, Any]) -> bytes:
    return b"event: message\r\ndata: " + encode(message) + b"\r\n\r\n"


class FastCall:
    """One call on the fast path, and the ``context`` the downstream hooks see for it.

    The hooks treat a context like the SDK's request context: ``ctx.session`` sends
    notifications (log lines for the call) and tells whether the client takes requests;
    ``ctx.request_id`` relates them to the call. Here they are queued for the HTTP response.
    """

    __slots__ = ("_inbox", "outbox", "request_id", "session")

    client_capabilities = None  # no server-to-client request is ever sent from here
    can_send_request = False

    def __init__(self, request_id: str | int) -> None:
        self.request_id = request_id
        self.session = self
        self._inbox, self.outbox = trio.open_memory_channel[bytes](_OUTBOX)

    async def progress(self, params: dict[str, Any]) -> None:
        """A progress notification for the call (the caller's token already restored)."""
        message = {"jsonrpc": "2.0", "method": "notifications/progress", "params": params}
        await self._inbox.send(sse_event(message))  # before finish(): never closed here

    async def send_notification(self, notification: Any, related_request_id: Any = None) -> None:
        """An SDK notification model (a log line) for the call; dropped when the client lags."""
        dumped = notification.model_dump(by_alias=True, mode="json", exclude_none=True)
        message = {"jsonrpc": "2.0", **dumped}
        try:
            self._inbox.send_nowait(sse_event(message))
        except (trio.WouldBlock, trio.ClosedResourceError):
            log.debug("a log line for a fast-path call was dropped: the client lags")

    def finish(self) -> None:
        self._inbox.close()


async def respond(
    send: Send,
    request: FastRequest,
    reply: dict[str, Any],
    *,
    streaming: bool,
) -> None:
    """The final answer: the last event of a committed stream, or one JSON body."""
    if streaming:
        await send({"type": "http.response.body", "body": sse_event(reply), "more_body": False})
        return
    status = 200
    if request.modern and "error" in reply:
        status = ERROR_CODE_HTTP_STATUS.get(reply["error"].get("code"), 200)
    body = encode(reply)
    headers = [(b"content-type", _JSON), (b"content-length", str(len(body)).encode())]
    if request.session_id is not None:
        headers.append((b"mcp-session-id", request.session_id.encode("latin-1")))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def start_stream(send: Send, request: FastRequest) -> None:
    headers = list(_SSE_HEADERS)
    if request.session_id is not None:
        headers.append((b"mcp-session-id", request.session_id.encode("latin-1")))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
