"""In-process harness for the egress proxy threat tests (THREATS.md C1-C13).

A real :class:`svcgate.egress.proxy.EgressProxy` runs inside the test's trio loop, one
loopback :class:`trio.SocketListener` per identity (no sandbox: attribution is simply which
listener a connection arrived on, as in production). The pieces a test chooses:

* :class:`StaticLookup` / :class:`Policies`: the proxy's ``Lookup`` and ``PolicySource``
  (per identity; a configured exception makes the source raise);
* :class:`FakeDNS`: the resolver's ``lookup=`` seam (fixed or rotating answers, every
  lookup recorded); :meth:`FakeDNS.resolver` builds the product's :class:`Resolver`;
* :class:`RecordingSink`: an :class:`EgressAuditSink` that only collects events;
* :class:`Kit`: the gateway CA and the upstream TLS context; :meth:`Kit.run` starts the
  proxy (optionally with a ``recent`` policy source, the service's remembered lookups) and
  yields a :class:`RunningProxy` (ports, per-sandbox state, audit events);
* client helpers speaking to the proxy: raw bytes (:func:`send_raw`), absolute-form
  requests (:func:`http_get`), ``CONNECT`` (:func:`connect`) and ``CONNECT`` + TLS with a
  chosen SNI (:func:`tls_tunnel`), one response at a time (:func:`exchange`);
* loopback targets: :class:`Trap` (a listener nobody accepts on; counts connections
  deterministically by draining its backlog), :func:`full_backlog` (a listener whose SYN
  queue is full, so a dial hangs: connect-timeout tests) and :func:`encoding_upstream`
  (reflects the ``Authorization`` value raw, base64- and URL-encoded: C8).

Upstream HTTP(S) servers and the counting :class:`upstream_support.Listener` come from
``upstream_support``.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread
from urllib.parse import quote, urlsplit

import h11
import trio

from svcgate.egress.addresses import IPAddress
from svcgate.egress.audit_sink import EgressAuditSink, EgressEvent
from svcgate.egress.ca import GatewayCA, upstream_context
from svcgate.egress.policy import NO_RULES, CredentialRule, ServerRules
from svcgate.egress.proxy import (
    EgressIdentity,
    EgressProxy,
    Lookup,
    ProxyConfig,
    RecentPolicy,
    SandboxState,
)
from svcgate.egress.resolver import ResolveError, Resolver

IDENTITY_1 = EgressIdentity(server="echo", user_id=1, profile_id=11, profile_slug="one")
IDENTITY_2 = EgressIdentity(server="echo", user_id=2, profile_id=22, profile_slug="two")
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
TIMEOUT = 5.0

# -- policy ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StaticLookup:
    """A fixed :class:`svcgate.egress.proxy.Lookup`."""

    rules: ServerRules = NO_RULES
    credential: CredentialRule | None = None
    secret: bytes = field(default=b"", repr=False)
    secret_error: Exception | None = None

    def open_secret(self) -> bytes:
        if self.secret_error is not None:
            raise self.secret_error
        return self.secret


def lookup(
    hosts: Sequence[str] = (),
    *,
    credential_hosts: Sequence[str] | None = None,
    secret: bytes = b"",
    inject_header: str | None = None,
    placeholder: str | None = None,
) -> StaticLookup:
    """Server egress list ``hosts``; a credential bound to ``credential_hosts`` when given."""
    credential = (
        None
        if credential_hosts is None
        else CredentialRule.of(credential_hosts, inject_header, None, placeholder)
    )
    return StaticLookup(ServerRules.of(hosts), credential, secret)


class Policies:
    """A ``PolicySource``: identity -> lookup (or raise the exception stored for it)."""

    def __init__(self, by_identity: Mapping[EgressIdentity, Lookup | Exception]) -> None:
        self.by_identity: dict[EgressIdentity, Lookup | Exception] = dict(by_identity)
        self.calls: list[EgressIdentity] = []

    async def __call__(self, identity: EgressIdentity) -> Lookup:
        self.calls.append(identity)
        value = self.by_identity.get(identity, StaticLookup())
        if isinstance(value, Exception):
            raise value
        return value


# -- resolution ----------------------------------------------------------------------------


class FakeDNS:
    """The :class:`Resolver` lookup seam. Each name has one or more answers, used in turn."""

    def __init__(self, fallback: str | None = None) -> None:
        self._answers: dict[str, list[list[IPAddress]]] = {}
        self._fallback = None if fallback is None else [ipaddress.ip_address(fallback)]
        self.lookups: list[str] = []

    def answer(self, name: str, *addresses: str) -> FakeDNS:
        """``name`` always resolves to ``addresses`` (one answer, all of them)."""
        return self.alternate(name, addresses)

    def alternate(self, name: str, *answers: Sequence[str]) -> FakeDNS:
        """``name`` gives ``answers[0]``, then ``answers[1]``, ... and round again."""
        self._answers[name] = [[ipaddress.ip_address(a) for a in answer] for answer in answers]
        return self

    async def lookup(self, host: str, port: int) -> list[IPAddress]:
        self.lookups.append(host)
        answers = self._answers.get(host)
        if not answers:
            if self._fallback is None:
                raise ResolveError(f"{host} does not resolve")
            return list(self._fallback)
        return list(answers[(self.lookups.count(host) - 1) % len(answers)])

    def resolver(self) -> Resolver:
        return Resolver(lookup=self.lookup)


# -- audit -------------------------------------------------------------------------------


class RecordingSink(EgressAuditSink):
    """Collects events in memory (no store, no flusher)."""

    def __init__(self) -> None:  # deliberately no store: record() is all the proxy calls
        self.events: list[EgressEvent] = []

    def record(self, event: EgressEvent) -> None:
        self.events.append(event)

    def decisions(self, host: str | None = None) -> list[str]:
        return [e.decision for e in self.events if host is None or e.host == host]

    def of(self, decision: str) -> list[EgressEvent]:
        return [e for e in self.events if e.decision == decision]


# -- the proxy ---------------------------------------------------------------------------


@dataclass
class RunningProxy:
    proxy: EgressProxy
    sink: RecordingSink
    ports: dict[EgressIdentity, int]
    states: dict[EgressIdentity, SandboxState]

    def port(self, identity: EgressIdentity = IDENTITY_1) -> int:
        return self.ports[identity]

    @property
    def events(self) -> list[EgressEvent]:
        return self.sink.events


async def open_listener() -> trio.SocketListener:
    """A loopback listener on an ephemeral port (what a sandbox's netns would hold)."""
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    return listener


def listener_port(listener: trio.SocketListener) -> int:
    return int(listener.socket.getsockname()[1])


def config(
    *ports: int,
    carve_out: Sequence[str] = ("127.0.0.0/8",),
    own_addresses: Sequence[str] = (),
    self_ports: Sequence[int] = (),
    max_connections: int = 64,
    rate: float = 1000.0,
    burst: int = 1000,
    connect_timeout: float = 2.0,
    idle_timeout: float = 5.0,
    max_duration: float = 60.0,
) -> ProxyConfig:
    """Ports 80, 443 and ``ports``; the ``carve_out``; generous limits, short timeouts."""
    return ProxyConfig(
        ports=frozenset({80, 443, *ports}),
        allowed_networks=tuple(ipaddress.ip_network(c) for c in carve_out),
        own_addresses=frozenset(ipaddress.ip_address(a) for a in own_addresses),
        self_ports=frozenset(self_ports),
        max_connections=max_connections,
        rate=rate,
        burst=burst,
        connect_timeout=connect_timeout,
        idle_timeout=idle_timeout,
        max_duration=max_duration,
    )


@dataclass
class Kit:
    """The CA pieces a proxy needs: the gateway CA and its client context toward upstreams."""

    ca: GatewayCA
    upstream_context: ssl.SSLContext

    @classmethod
    def create(cls, directory: Path, upstream_ca_file: Path | None) -> Kit:
        return cls(GatewayCA.load_or_create(directory), upstream_context(upstream_ca_file))

    def client_context(self, alpn: Sequence[str] | None = None) -> ssl.SSLContext:
        """What a sandbox uses: trusts the gateway CA only."""
        context = ssl.create_default_context(cadata=self.ca.cert_pem.decode())
        if alpn is not None:
            context.set_alpn_protocols(list(alpn))
        return context

    @asynccontextmanager
    async def run(
        self,
        config: ProxyConfig,
        policies: Policies,
        dns: FakeDNS,
        identities: Sequence[EgressIdentity] = (IDENTITY_1,),
        listeners: Mapping[EgressIdentity, trio.SocketListener] | None = None,
        recent: RecentPolicy | None = None,
    ) -> AsyncIterator[RunningProxy]:
        sink = RecordingSink()
        proxy = EgressProxy(
            config, policies, dns.resolver(), self.ca, self.upstream_context, sink, recent=recent
        )
        running = RunningProxy(proxy, sink, {}, {})
        async with trio.open_nursery() as nursery:
            for identity in identities:
                listener = (listeners or {}).get(identity) or await open_listener()
                state = SandboxState(config)
                running.ports[identity] = listener_port(listener)
                running.states[identity] = state
                nursery.start_soon(proxy.serve, listener, identity, state)
            try:
                yield running
            finally:
                nursery.cancel_scope.cancel()


# -- clients -----------------------------------------------------------------------------


@dataclass
class Response:
    status: int  # 0: the proxy closed the connection without answering
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    reason: bytes = b""

    def header(self, name: str) -> bytes | None:
        values = [v for k, v in self.headers if k == name.lower().encode()]
        return values[0] if values else None

    @property
    def egress(self) -> str | None:
        """The proxy's ``x-svcgate-egress`` decision header, if any."""
        value = self.header("x-svcgate-egress")
        return None if value is None else value.decode()


def request_bytes(
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]] = (),
    body: bytes = b"",
    *,
    host: str | None = None,
) -> bytes:
    """A raw HTTP/1.1 request. ``host`` defaults to the authority of an absolute target."""
    if host is None and "://" in target:
        host = urlsplit(target).netloc
    lines = [f"{method} {target} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def read_response(stream: trio.abc.Stream, *, method: bytes = b"GET") -> Response:
    """One response from ``stream`` (parsed by h11 as if we had sent ``method``)."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method=method, target=b"/", headers=[(b"host", b"proxy")]))
    conn.send(h11.EndOfMessage())
    response: Response | None = None
    with trio.fail_after(TIMEOUT):
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                try:
                    data = await stream.receive_some()
                except trio.BrokenResourceError:
                    data = b""
                conn.receive_data(bytes(data))
            elif isinstance(event, h11.Response):
                response = Response(event.status_code, list(event.headers), reason=event.reason)
            elif isinstance(event, h11.Data):
                assert response is not None
                response.body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                assert response is not None
                return response
            elif isinstance(event, h11.ConnectionClosed):
                assert response is None, "closed in the middle of a response"
                return Response(0)
            elif isinstance(event, h11.InformationalResponse):
                continue
            else:  # pragma: no cover - h11 has no other client-side events
                raise AssertionError(f"unexpected {event!r}")


async def open_client(port: int) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", port)


async def exchange(stream: trio.abc.Stream, data: bytes, *, method: bytes = b"GET") -> Response:
    """Send raw ``data`` on an open stream and read one response."""
    await stream.send_all(data)
    return await read_response(stream, method=method)


async def send_raw(port: int, data: bytes, *, method: bytes = b"GET") -> Response:
    """Raw ``data`` on a fresh connection to the proxy; one response; close."""
    async with await open_client(port) as stream:
        return await exchange(stream, data, method=method)


async def http_get(
    port: int, url: str, headers: Sequence[tuple[str, str]] = (), *, host: str | None = None
) -> Response:
    """``GET`` in absolute form through the proxy (``Connection: close``)."""
    data = request_bytes("GET", url, [*headers, ("Connection", "close")], host=host)
    return await send_raw(port, data)


async def read_until_closed(stream: trio.abc.Stream, within: float = TIMEOUT) -> bytes:
    """Everything the peer sends until it closes (fails after ``within`` seconds)."""
    out = b""
    with trio.fail_after(within):
        while True:
            try:
                data = await stream.receive_some()
            except trio.BrokenResourceError:
                return out
            if not data:
                return out
            out += data


async def connect(
    port: int, authority: str, headers: Sequence[tuple[str, str]] = (), *, host: str | None = None
) -> tuple[Response, trio.SocketStream]:
    """``CONNECT authority``; on 200 the returned stream is the tunnel (caller closes it)."""
    stream = await open_client(port)
    conn = h11.Connection(h11.CLIENT)
    request = h11.Request(
        method=b"CONNECT",
        target=authority.encode(),
        headers=[("Host", host or authority), *headers],
    )
    try:
        for message in (request, h11.EndOfMessage()):
            await stream.send_all(conn.send(message) or b"")
        with trio.fail_after(TIMEOUT):
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some())
                    continue
                if isinstance(event, h11.Response):
                    break
                if isinstance(event, h11.ConnectionClosed):
                    return Response(0), stream
                raise AssertionError(f"unexpected {event!r}")
        response = Response(event.status_code, list(event.headers), reason=event.reason)
        if event.status_code == 200:
            assert conn.trailing_data == (b"", False)
            return response, stream
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some())
            elif isinstance(event, h11.Data):
                response.body += bytes(event.data)
            else:
                return response, stream
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise


async def tls_tunnel(
    port: int,
    authority: str,
    context: ssl.SSLContext,
    *,
    sni: str | None,
    headers: Sequence[tuple[str, str]] = (),
) -> trio.SSLStream[trio.SocketStream]:
    """``CONNECT`` then a TLS handshake through the tunnel with ``sni`` (caller closes)."""
    response, stream = await connect(port, authority, headers)
    if response.status != 200:
        await stream.aclose()
        raise AssertionError(f"CONNECT {authority}: {response}")
    tls = trio.SSLStream(stream, context, server_hostname=sni)
    try:
        with trio.fail_after(TIMEOUT):
            await tls.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(tls)
        raise
    return tls


# -- loopback targets ----------------------------------------------------------------------


class Trap:
    """A listener nothing accepts on; :meth:`count` drains its queue (deterministic)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, backlog: int = 64) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind((host, port))
        self.sock.listen(backlog)
        self.sock.setblocking(False)
        self.port = int(self.sock.getsockname()[1])
        self._accepted = 0
        self._held: list[socket.socket] = []

    def count(self) -> int:
        """Connections that have reached this listener so far."""
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return self._accepted
            self._accepted += 1
            self._held.append(conn)

    def close(self) -> None:
        for conn in self._held:
            conn.close()
        self.sock.close()


@contextmanager
def trap(host: str = "127.0.0.1", port: int = 0, backlog: int = 64) -> Iterator[Trap]:
    t = Trap(host, port, backlog)
    try:
        yield t
    finally:
        t.close()


@contextmanager
def full_backlog() -> Iterator[int]:
    """A loopback port whose accept queue is full: a new connect hangs (SYNs are dropped)."""
    with trap(backlog=0) as target:
        filler = socket.create_connection(("127.0.0.1", target.port), timeout=2)
        try:
            yield target.port
        finally:
            filler.close()


@dataclass
class EncodingUpstream:
    port: int
    seen: list[str] = field(default_factory=list)


@contextmanager
def encoding_upstream() -> Iterator[EncodingUpstream]:
    """Plain HTTP upstream reflecting the bearer token raw, base64 (Basic) and URL-encoded.

    The JSON body is ``{"raw", "basic", "basic_urlsafe", "quoted", "json"}``; the same
    values come back in ``X-Raw``, ``X-Basic`` and ``X-Quoted`` response headers. On
    ``/reason`` the raw token is (also) the status line's reason phrase.
    """
    state = EncodingUpstream(port=0)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            auth = self.headers.get("Authorization", "")
            state.seen.append(auth)
            token = auth.removeprefix("Bearer ").encode()
            basic = base64.b64encode(b"user:" + token).decode()
            values = {
                "raw": token.decode(),
                "basic": basic,
                "basic_urlsafe": base64.urlsafe_b64encode(b"x" + token + b"!").decode(),
                "quoted": quote(token, safe=""),
                "json": json.dumps({"t": token.decode()}),
            }
            body = json.dumps(values).encode()
            reason = f"OK {values['raw']}" if self.path == "/reason" else None
            self.send_response(200, reason)
            self.send_header("X-Raw", values["raw"])
            self.send_header("X-Basic", f"Basic {basic}")
            self.send_header("X-Quoted", values["quoted"])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.port = int(server.server_address[1])
    thread = Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


async def wait_until(predicate: Callable[[], object], within: float = TIMEOUT) -> None:
    """Poll ``predicate`` until it is true (fails after ``within`` seconds)."""
    with trio.fail_after(within):
        while not predicate():  # noqa: ASYNC110 - polling state the proxy owns
            await trio.sleep(0.01)
