"""The data plane: ``/mcp/p/<slug>`` (per profile) and ``/mcp``, ``/`` (legacy).

Every request, whatever its method (POST, GET, DELETE: the route is method-agnostic), goes
through the same checks before the MCP transport sees it:

1. ``Origin``: when present it must be an allowed origin (the public origin, plus
   ``SVC_MCP_ALLOWED_ORIGINS``), else 403 (DNS-rebinding protection, THREATS A5). A missing
   ``Origin`` (CLI and SDK clients) is accepted. No CORS headers are ever sent.
2. Authentication:
   - legacy: ``Authorization: Bearer <SVC_BEARER_TOKEN>``, compared in constant time;
   - profile: the presented token is re-hashed and looked up as (slug, hash) on every
     request, with no cache, so a rotated or deleted token fails on the next request.
   Every failure is the same 401 with ``WWW-Authenticate: Bearer``, whether the slug exists
   or not (THREATS A1). Failures are rate-limited per source address
   (:mod:`svcgate.ratelimit`): an exhausted source gets 429 with ``Retry-After`` (A7).
   Tokens in the query string or in cookies are never read (A3). An ``Mcp-Session-Id``
   never authenticates: the token is checked first, and sessions live in their profile's
   runtime, so a session id is unknown on any other profile (A6).
3. The body of an authorised POST is read (at most :data:`MAX_BODY`, the SDK's own limit:
   a larger declared or streamed body gets 413 before the rest is read) and must be strict
   JSON (THREATS A9): UTF-8, no ``NaN``/``Infinity``, no lone surrogates, no byte-order
   mark, nesting bounded. Anything else gets 400 with a JSON-RPC parse error, before a
   runtime is started. The SDK parses the body again; this gate runs the parser of its
   handshake-era path (pydantic-core) with non-finite numbers refused, because the SDK's
   parsers accept ``NaN``, which would reach downstream servers as text that is not JSON.
4. The profile runtime (:mod:`svcgate.runtime`): warmed on the first authorised request,
   then the request is served by the runtime's MCP session manager (both protocol
   generations). A runtime that cannot start answers 503 with a JSON-RPC error body; a
   runtime torn down under a request (bundle edit, profile deletion) ends that request.

Every refusal (403, 401, 429) first reads and discards a request body of up to
:data:`DRAIN_LIMIT`, so the connection stays usable for the client's next request. A
refusal of a larger body (and a 413) is sent at once with ``Connection: close``, while the
rest of the body is read and discarded (never kept) until it ends or the connection closes.
"""

from __future__ import annotations

import hmac
import logging
import re
import sqlite3
from collections.abc import Iterable
from typing import Any

import pydantic_core
import trio
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE

from svcgate.asgi_io import Message, Receive, Scope, Send, header, respond_closing, send_json
from svcgate.errors import envelope
from svcgate.ratelimit import FailureLimiter, source_key
from svcgate.runtime import (
    LEGACY_TARGET,
    RuntimeClosed,
    RuntimeManager,
    RuntimeStartError,
    RuntimeTarget,
)
from svcgate.store import Store
from svcgate.tokens import sha256_hex

log = logging.getLogger(__name__)

_BEARER = re.compile(rb"^[Bb][Ee][Aa][Rr][Ee][Rr] +([\x21-\x7e]+) *$")
_UNAUTHORIZED = envelope("unauthenticated", "missing or invalid bearer token")
_FORBIDDEN_ORIGIN = envelope("forbidden", "this Origin may not call the MCP endpoint")
MAX_BODY = DEFAULT_MAX_REQUEST_BODY_SIZE
DRAIN_LIMIT = 64 * 1024
PARSE_ERROR = -32700
INVALID_REQUEST = -32600


def bearer_token(scope: Scope) -> str | None:
    value = header(scope, b"authorization")
    if value is None:
        return None
    match = _BEARER.match(value)
    return match.group(1).decode("ascii") if match else None


async def _drain(scope: Scope, receive: Receive, limit: int) -> bool | None:
    """Read and discard the request body up to ``limit`` bytes: True once it is all read,
    False if more is coming (or a larger one is declared), None if the client is gone."""
    declared = header(scope, b"content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        return False
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            return True
        if size > limit:
            return False


async def _refuse(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    body: object,
    headers: list[tuple[bytes, bytes]],
) -> None:
    """Send a refusal after the request body (see the module docstring)."""
    # A response that ends before the request body was received makes Hypercorn drop the
    # keep-alive connection without telling the client, whose next request then fails.
    drained = await _drain(scope, receive, DRAIN_LIMIT)
    if drained is None:
        return
    if drained:
        await send_json(send, status, body, headers)
        return
    closing = [*headers, (b"connection", b"close")]
    await respond_closing(receive, lambda: send_json(send, status, body, closing))


def _jsonrpc_error(message: str, code: int = -32603) -> dict[str, object]:
    return {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}


class _BodyTooLarge(Exception):
    pass


async def _read_body(scope: Scope, receive: Receive) -> bytes | None:
    """The whole request body, or None if the client went away; refuses (without
    buffering) a body over :data:`MAX_BODY`."""
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise _BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise _BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _parse_strict(body: bytes) -> tuple[Any, str | None]:
    """``body`` parsed, or why it is not strict JSON. pydantic-core refuses invalid UTF-8,
    lone surrogates, a byte-order mark and nesting deeper than its recursion limit;
    non-finite numbers are refused here too."""
    try:
        return pydantic_core.from_json(body, allow_inf_nan=False, cache_strings=False), None
    except ValueError as exc:
        return None, str(exc)


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` with the already-read body delivered first (then disconnects as usual)."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _send_jsonrpc_error(
    send: Send, status: int, code: int, message: str, extra: list[tuple[bytes, bytes]]
) -> None:
    await send_json(send, status, _jsonrpc_error(message, code), extra)


async def _session_not_found(send: Send) -> None:
    await send_json(send, 404, _jsonrpc_error("Session not found", INVALID_REQUEST))


async def _unavailable(send: Send, message: str) -> None:
    await send_json(send, 503, _jsonrpc_error(message), [(b"retry-after", b"1")])


class DataPlane:
    def __init__(
        self,
        legacy_token: str,
        store: Store,
        runtimes: RuntimeManager | None = None,
        allowed_origins: Iterable[str] = (),
        limiter: FailureLimiter | None = None,
    ) -> None:
        self._legacy_token = legacy_token.encode()
        self._store = store
        self._runtimes = runtimes
        self._origins = frozenset(o.encode() for o in allowed_origins)
        self._failures = limiter or FailureLimiter()

    @staticmethod
    def _source(scope: Scope) -> str:
        client = scope.get("client")
        return source_key(str(client[0])) if client else ""

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> bool:
        if not self._failures.blocked(self._source(scope), trio.current_time()):
            return False
        await _refuse(
            scope,
            receive,
            send,
            429,
            envelope("rate_limited", "too many failed authentications; slow down"),
            [(b"retry-after", b"1")],
        )
        return True

    async def _deny(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._failures.failed(self._source(scope), trio.current_time())
        await _refuse(scope, receive, send, 401, _UNAUTHORIZED, [(b"www-authenticate", b"Bearer")])

    async def _checked_origin(self, scope: Scope, receive: Receive, send: Send) -> bool:
        origin = header(scope, b"origin")
        if origin is None or origin in self._origins:
            return True
        await _refuse(scope, receive, send, 403, _FORBIDDEN_ORIGIN, [])
        return False

    def legacy_authorized(self, scope: Scope) -> bool:
        token = bearer_token(scope)
        # compare_digest on bytes of possibly different lengths is still constant-time in
        # the secret's content; only the length can leak, as for any comparison.
        return token is not None and hmac.compare_digest(token.encode(), self._legacy_token)

    async def profile_for(self, slug: str, token: str | None) -> RuntimeTarget | None:
        if token is None or not slug:
            return None
        token_hash = sha256_hex(token)

        def lookup(conn: sqlite3.Connection) -> RuntimeTarget | None:
            row = conn.execute(
                "SELECT id, slug, user_id FROM profiles WHERE slug = ? AND token_hash = ?",
                (slug, token_hash),
            ).fetchone()
            return RuntimeTarget(int(row[0]), str(row[1]), int(row[2])) if row else None

        return await self._store.read(lookup)

    async def legacy(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not await self._checked_origin(scope, receive, send):
            return
        if await self._limited(scope, receive, send):
            return
        if not self.legacy_authorized(scope):
            await self._deny(scope, receive, send)
            return
        await self._serve(LEGACY_TARGET, scope, receive, send)

    async def profile(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not await self._checked_origin(scope, receive, send):
            return
        if await self._limited(scope, receive, send):
            return
        slug = scope["path"][len("/mcp/p/") :]
        if slug.endswith("/"):
            slug = slug[:-1]
        target = None if "/" in slug else await self.profile_for(slug, bearer_token(scope))
        if target is None:
            await self._deny(scope, receive, send)
            return
        await self._serve(target, scope, receive, send)

    async def _serve(
        self, target: RuntimeTarget, scope: Scope, receive: Receive, send: Send
    ) -> None:
        message: Any = None
        if scope.get("method") == "POST":
            try:
                body = await _read_body(scope, receive)
            except _BodyTooLarge:
                message = f"request body larger than {MAX_BODY // (1024 * 1024)} MiB"
                await respond_closing(
                    receive,
                    lambda: _send_jsonrpc_error(
                        send, 413, INVALID_REQUEST, message, [(b"connection", b"close")]
                    ),
                )
                return
            if body is None:
                return  # the client went away
            message, problem = _parse_strict(body)
            if problem is not None:
                await _send_jsonrpc_error(send, 400, PARSE_ERROR, f"Parse error: {problem}", [])
                return
            receive = _replay(body, receive)
        if self._runtimes is None:
            await _unavailable(send, "the MCP data plane is not running")
            return
        if (
            header(scope, b"mcp-session-id") is not None
            and self._runtimes.warm(target.profile_id) is None
        ):
            # Sessions live and die with the runtime: a cold one has none. Answer like the
            # SDK does for an unknown session instead of starting sandboxes for nothing.
            await _session_not_found(send)
            return
        try:
            runtime = await self._runtimes.get(target)
        except RuntimeStartError as exc:
            log.warning("profile %s: %s", target.slug, exc)
            await _unavailable(send, f"the profile's servers could not be started: {exc}")
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await runtime.handle(scope, receive, tracking_send, message)
        except RuntimeClosed:
            if not started:
                await _unavailable(send, "the profile was reconfigured; reconnect")
