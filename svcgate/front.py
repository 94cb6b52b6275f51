"""The HTTP front: one ASGI app that routes by path prefix, with SPEC's precedence.

``/healthz`` and ``/readyz`` (exact paths, :mod:`svcgate.health`) come first; then ``/mcp/p/``
(per-profile data plane) and ``/api/`` (control plane); ``/mcp`` and every other path (the
bare ``/`` catch-all) reach the legacy data-plane handler. Every request is counted and timed
by its surface (:meth:`svcgate.metrics.Metrics.observe_request`).

The control-plane body limit is enforced here, before the framework sees the request: a
declared ``Content-Length`` over the limit is refused at once, and a chunked body is counted
as it arrives and refused as soon as it passes the limit, so an oversized body is never
buffered whole (THREATS.md B9). Compressed request bodies are refused (415) rather than
inflated. The response to an oversized body closes the connection.
"""

from __future__ import annotations

from functools import partial

import trio

from svcgate import health
from svcgate.asgi_io import (
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    header,
    lifespan_noop,
    respond_closing,
    send_json,
)
from svcgate.data_plane import DataPlane
from svcgate.errors import envelope
from svcgate.health import HEALTH_PATHS, Readiness
from svcgate.logs import REQUEST_ID, REQUEST_ID_HEADER, echoing_request_id, request_id_from_header
from svcgate.metrics import Metrics
from svcgate.settings import OIDC_CORE_VARS

MAX_BODY = 64 * 1024

DISABLED_MESSAGE = (
    "the control plane is disabled because OpenID Connect is not configured: set "
    + ", ".join(OIDC_CORE_VARS)
    + " (and SVC_OIDC_CLIENT_SECRET or SVC_OIDC_CLIENT_SECRET_FILE for a confidential client)"
)


class BodyTooLarge(Exception):
    pass


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """Read the whole request body, refusing (without buffering) anything over ``limit``."""
    declared = header(scope, b"content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise BodyTooLarge
        except ValueError:
            pass  # the server's HTTP parser has already rejected malformed framing
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _shielded(send: Send) -> Send:
    """Protect each response message from cancellation.

    quart-trio cancels its per-request nursery as soon as the response is written; a send
    interrupted half-way leaves Hypercorn's connection state unfinished, so a keep-alive
    connection is neither reused cleanly nor closed, and holds up graceful shutdown.
    """

    async def send_shielded(message: Message) -> None:
        with trio.CancelScope(shield=True):
            await send(message)

    return send_shielded


class Front:
    def __init__(
        self,
        api: ASGIApp | None,
        data_plane: DataPlane,
        *,
        readiness: Readiness,
        metrics: Metrics,
    ) -> None:
        self._api = api
        self._data_plane = data_plane
        self._readiness = readiness
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await lifespan_noop(receive, send)
            return
        if kind != "http":
            # No websocket surface: refuse the handshake.
            await send({"type": "websocket.close", "code": 1008})
            return
        # One id per request, in every log record made while handling it and in the response
        # (svcgate.logs). Never reset: Hypercorn runs each request in a task of its own, whose
        # own error line for a failed request then carries the id as well.
        request_id = request_id_from_header(header(scope, REQUEST_ID_HEADER))
        REQUEST_ID.set(request_id)
        send = echoing_request_id(send, request_id)
        path: str = scope["path"]
        route: ASGIApp
        if path in HEALTH_PATHS:
            route, surface = partial(health.respond, self._readiness, path), "health"
        elif path.startswith("/mcp/p/"):
            route, surface = self._data_plane.profile, "mcp_profile"
        elif path == "/api" or path.startswith("/api/"):
            route, surface = self._control_plane, "api"
        else:
            route, surface = self._data_plane.legacy, "mcp_legacy"
        await self._metrics.observe_request(surface, route, scope, receive, send)

    async def _control_plane(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._api is None:
            await send_json(send, 404, envelope("control_plane_disabled", DISABLED_MESSAGE))
            return
        if header(scope, b"content-encoding") not in (None, b"identity"):
            await respond_closing(
                receive,
                lambda: send_json(
                    send,
                    415,
                    envelope("invalid", "compressed request bodies are not accepted"),
                    [(b"connection", b"close")],
                ),
            )
            return
        try:
            body = await read_body(scope, receive, MAX_BODY)
        except BodyTooLarge:
            # The rest of the body is discarded while the 413 goes out (see respond_closing).
            await respond_closing(
                receive,
                lambda: send_json(
                    send,
                    413,
                    envelope("invalid", f"request body larger than {MAX_BODY // 1024} KiB"),
                    [(b"connection", b"close")],
                ),
            )
            return
        await self._api(scope, _replay(body, receive), _shielded(send))
