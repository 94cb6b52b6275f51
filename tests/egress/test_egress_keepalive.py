"""Kept connections: an upstream that drops idle keep-alive connections, and one that closes
after each response, must not break a sandbox's kept proxy connection or tunnel.

The upstream here answers one request per connection with a keep-alive response (no
``Connection: close``) and then closes the connection (what a server with a short keep-alive
timeout does while the proxy holds the connection idle). A bodyless request that meets such
a stale connection is retried once on a fresh connection to the same checked address; a
request with a body is not (it may have been processed) and gets 502.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
from proxy_support import (
    IDENTITY_1,
    FakeDNS,
    Kit,
    Policies,
    config,
    exchange,
    lookup,
    open_client,
    request_bytes,
    tls_tunnel,
)

from svcgate.egress.ca import GatewayCA

API = "api.example.test"
SECRET = b"keepalive-secret-12345"


@dataclass
class OneShot:
    port: int
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)


@contextmanager
def one_shot_upstream(context: ssl.SSLContext | None = None) -> Iterator[OneShot]:
    """One request per connection, answered as if kept alive, then the socket is closed."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.2)
    state = OneShot(sock.getsockname()[1])
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            state.connections += 1
            try:
                conn.settimeout(5)
                if context is not None:
                    conn = context.wrap_socket(conn, server_side=True)
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                state.requests.append(data)
                body = b"hello %d" % state.connections
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            except OSError:
                pass
            finally:
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        stop.set()
        thread.join(5)
        sock.close()


@pytest.fixture
def upstream_ca(tmp_path: Path) -> GatewayCA:
    return GatewayCA.load_or_create(tmp_path / "upstream-ca")


@pytest.fixture
def kit(tmp_path: Path, upstream_ca: GatewayCA) -> Kit:
    return Kit.create(tmp_path / "gateway-ca", tmp_path / "upstream-ca" / "ca.pem")


async def test_plain_http_survives_a_stale_kept_upstream(kit: Kit) -> None:
    with one_shot_upstream() as upstream:
        dns = FakeDNS().answer(API, "127.0.0.1")
        policies = Policies({IDENTITY_1: lookup([API])})
        async with kit.run(config(upstream.port), policies, dns) as running:
            url = f"http://{API}:{upstream.port}/"
            async with await open_client(running.port(IDENTITY_1)) as stream:
                for expected in (b"hello 1", b"hello 2", b"hello 3"):
                    await trio.sleep(0.1)  # let the upstream close the kept connection
                    response = await exchange(stream, request_bytes("GET", url))
                    assert (response.status, response.body) == (200, expected)
                # A body may have been processed: no retry, a clear 502 instead.
                await trio.sleep(0.1)
                response = await exchange(
                    stream, request_bytes("POST", url, [("Content-Length", "2")], b"hi")
                )
                assert response.status == 502
    assert upstream.connections == 3  # the POST met the stale connection: not retried


async def test_an_intercepted_tunnel_reconnects_to_the_checked_address(
    kit: Kit, upstream_ca: GatewayCA
) -> None:
    with one_shot_upstream(upstream_ca.server_context(API)) as upstream:
        dns = FakeDNS().answer(API, "127.0.0.1")
        policies = Policies({IDENTITY_1: lookup(credential_hosts=[API], secret=SECRET)})
        async with kit.run(config(upstream.port), policies, dns) as running:
            authority = f"{API}:{upstream.port}"
            tls = await tls_tunnel(
                running.port(IDENTITY_1), authority, kit.client_context(), sni=API
            )
            async with tls:
                for expected in (b"hello 1", b"hello 2", b"hello 3"):
                    await trio.sleep(0.1)
                    response = await exchange(tls, request_bytes("GET", "/", host=authority))
                    assert (response.status, response.body) == (200, expected)
            assert len(dns.lookups) == 1  # reconnecting never resolves again
    assert upstream.connections == 3
    assert all(b"Bearer " + SECRET in request for request in upstream.requests)
