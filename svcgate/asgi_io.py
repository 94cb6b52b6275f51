"""Small ASGI helpers shared by the HTTP front and the data plane."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import trio

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DISCARD_GRACE = 10.0


def header(scope: Scope, name: bytes) -> bytes | None:
    """First value of a request header (``name`` lower-case), or None."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


async def send_json(
    send: Send,
    status: int,
    body: Any,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    payload = json.dumps(body, separators=(",", ":")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"cache-control", b"no-store"),
                (b"content-length", str(len(payload)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


async def _discard(receive: Receive) -> None:
    """Read and discard the rest of the request body, until it ends or the client is gone."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            return


async def respond_closing(receive: Receive, respond: Callable[[], Awaitable[None]]) -> None:
    """Send a response that closes the connection before the request body was read.

    The rest of the body is read and discarded (never kept) meanwhile: Hypercorn queues
    request body chunks for the app, and once that queue is full its connection task blocks
    for good, even on delivering the end of the response, so the connection would be
    neither answered in full nor closed, and would hold up graceful shutdown.
    """
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_discard, receive)
        await respond()
        # Hypercorn reports the disconnect once the response is out; do not wait forever.
        nursery.cancel_scope.deadline = trio.current_time() + DISCARD_GRACE


async def lifespan_noop(receive: Receive, send: Send) -> None:
    """Answer the ASGI lifespan protocol and do nothing: the daemon's root nursery owns
    start-up and shutdown."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
