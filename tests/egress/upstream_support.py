"""Loopback upstreams for egress tests: a header-reflecting HTTP(S) server that records requests.

The HTTPS variant presents a leaf for a chosen name signed by a throwaway CA (made with the
product's own :class:`svcgate.egress.ca.GatewayCA`, in a temp dir); the gateway trusts it
through ``SVC_EGRESS_UPSTREAM_CA_FILE``. Routes:

- ``/headers``: 200 with the request's headers as JSON (httpbin-style reflection, THREATS C8);
- ``/redirect?to=URL``: 302 to URL (C7);
- ``/big?n=N``: N bytes of ``x``;
- anything else: 200 ``ok <path>``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from svcgate.egress.ca import GatewayCA


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    raw_headers: list[tuple[str, str]]


@dataclass
class Upstream:
    port: int
    tls: bool
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    ca_file: Path | None = None

    def clear(self) -> None:
        self.seen.clear()
        self.connections = 0


def _handler(upstream: Upstream) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _record(self) -> None:
            upstream.seen.append(
                Seen(
                    method=self.command,
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    raw_headers=list(self.headers.items()),
                )
            )

        def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:
            self._record()
            parts = urlsplit(self.path)
            query = parse_qs(parts.query)
            if parts.path == "/headers":
                body = json.dumps({"headers": dict(self.headers.items())}).encode()
                self._send(
                    200,
                    body,
                    {
                        "Content-Type": "application/json",
                        "X-Echo-Auth": self.headers.get("Authorization", ""),
                    },
                )
            elif parts.path == "/redirect":
                self._send(302, b"", {"Location": query.get("to", ["/"])[0]})
            elif parts.path == "/big":
                self._send(200, b"x" * int(query.get("n", ["0"])[0]))
            else:
                self._send(200, f"ok {parts.path}".encode())

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            self._record()
            self._send(200, b"posted " + body)

        do_HEAD = do_GET

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: Upstream, context: ssl.SSLContext | None) -> None:
        self.upstream = upstream
        self.context = context
        super().__init__(("127.0.0.1", 0), _handler(upstream))

    def get_request(self) -> tuple[socket.socket, object]:
        sock, addr = super().get_request()
        self.upstream.connections += 1
        if self.context is not None:
            sock.settimeout(10)
            sock = self.context.wrap_socket(sock, server_side=True)
        return sock, addr

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # handshake failures of refused clients are expected in these tests


@contextmanager
def upstream_server(
    *, tls_name: str | None = None, ca_dir: Path | None = None
) -> Iterator[Upstream]:
    """A running upstream on 127.0.0.1 (HTTPS for ``tls_name`` when given)."""
    context: ssl.SSLContext | None = None
    ca_file: Path | None = None
    if tls_name is not None:
        assert ca_dir is not None
        ca = GatewayCA.load_or_create(ca_dir)
        context = ca.server_context(tls_name)
        ca_file = ca_dir / "ca.pem"
    server = _Server(Upstream(port=0, tls=context is not None, ca_file=ca_file), context)
    server.upstream.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.upstream
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class Listener:
    """A bare loopback TCP listener that counts connections (for 'nothing reached it')."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.received = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.settimeout(1)
            with contextlib.suppress(OSError):
                self.received += conn.recv(65536)
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
