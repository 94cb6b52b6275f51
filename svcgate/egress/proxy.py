"""The egress proxy: one trio listener per sandbox, HTTP/1.1 parsed with h11.

Hand-written: no maintained trio/anyio forward proxy exists and mitmproxy cannot be installed
beside this package set (DESIGN.md). h11 does all HTTP/1.1 parsing and framing; this module
adds the proxy semantics on top.

Attribution: :meth:`EgressProxy.serve` is given the sandbox's identity together with the
listener that was opened inside that sandbox's network namespace (the namespace holds only
``lo``, so nothing else can connect to it). Every connection accepted there is that sandbox;
nothing the sandbox sends (headers, SNI, URLs) can change who it is.

Request paths:

- ``CONNECT host:port``: the target is canonicalised, the policy decides by name
  (:mod:`svcgate.egress.policy`), the name is resolved once and every address checked
  (:func:`svcgate.egress.addresses.classify`), the checked address is dialled, and the
  decision is audited. Without a credential for the host the tunnel is spliced byte for
  byte. With one, TLS is terminated with a leaf from the gateway CA (only ``http/1.1`` is
  offered), the client's SNI must name the target, a verified TLS connection is opened
  upstream, and each inner request must carry ``Host`` equal to the tunnel target; the
  credential is injected and the response scanned for the secret.
- Absolute-form ``GET http://host/...`` (plain HTTP): the same checks per request, ``Host``
  must equal the URI's authority, the request is forwarded in origin form over a connection
  kept for that target. A credential travels over plain HTTP only to operator carve-out
  addresses (``deny_cleartext`` otherwise).

Framing is strict (THREATS.md C9): ``Transfer-Encoding`` with ``Content-Length``, a
transfer coding other than ``chunked``, a body on GET/HEAD/OPTIONS/DELETE/TRACE, an
``Upgrade`` request, and anything h11 refuses are answered 400 and audited ``deny_request``.
Redirects are passed back, never followed. Every denial closes the connection.

Limits per sandbox (:class:`SandboxState`): concurrent connections, a request-rate token
bucket (CONNECTs, plain requests and inner requests each take a token), and connect, idle
and total timeouts. Exceeding them answers 429 or closes that connection; other sandboxes'
listeners and tasks are unaffected.

Resource handling: ``serve`` owns a nursery with one task per connection; cancelling it
(the sandbox stopped) closes the listener and every connection. Each connection task closes
both of its streams in ``finally``.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

import h11
import trio

from svcgate.egress import policy
from svcgate.egress.addresses import IPAddress, Network, Target, TargetError, parse_authority
from svcgate.egress.addresses import classify as classify_address
from svcgate.egress.audit_sink import EgressAuditSink, EgressEvent
from svcgate.egress.ca import GatewayCA, sni_mismatched
from svcgate.egress.inject import (
    Injection,
    forward_request_headers,
    header_values,
    strip_hop_by_hop,
)
from svcgate.egress.policy import CredentialRule, Decision, ServerRules
from svcgate.egress.redact import StreamRedactor, redact, secret_forms
from svcgate.egress.resolver import ResolveError, Resolver

if TYPE_CHECKING:
    from h11._headers import Headers

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 32 * 1024
BUSY_RESPONSE = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 0\r\nconnection: close\r\n"
    b"x-svcgate-egress: deny_limit\r\n\r\n"
)
RECEIVE_SIZE = 64 * 1024
CLASSIFY_CACHE_SIZE = 4096
BODYLESS_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS", b"DELETE", b"TRACE"})
_STREAM_ERRORS = (
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    trio.TooSlowError,
    h11.ProtocolError,
    ssl.SSLError,
    OSError,
)


@dataclass(frozen=True)
class EgressIdentity:
    """Who a sandbox's traffic belongs to; fixed by the listener that accepted it."""

    server: str
    user_id: int
    profile_id: int
    profile_slug: str


@dataclass(frozen=True)
class ProxyConfig:
    ports: frozenset[int] = policy.DEFAULT_PORTS
    # The operator carve-out (SVC_EGRESS_ALLOW_CIDRS): internal ranges that may be dialled.
    allowed_networks: tuple[Network, ...] = ()
    own_addresses: frozenset[IPAddress] = frozenset()
    # The gateway's own listening ports: never dialled on a loopback or own address.
    self_ports: frozenset[int] = frozenset()
    max_connections: int = 64
    rate: float = 20.0
    burst: int = 40
    connect_timeout: float = 10.0
    idle_timeout: float = 60.0
    max_duration: float = 3600.0


class Lookup(Protocol):
    """What the policy needs about one sandbox's owner and server, read per decision."""

    @property
    def rules(self) -> ServerRules: ...

    @property
    def credential(self) -> CredentialRule | None: ...

    def open_secret(self) -> bytes:
        """The plaintext secret; raises on a vault failure."""
        ...


PolicySource = Callable[[EgressIdentity], Awaitable[Lookup]]
# A recent lookup, without I/O, or None. Trusted only for a decision that allows without a
# credential (see _Connection._decide); anything else is decided on a fresh lookup.
RecentPolicy = Callable[[EgressIdentity], Lookup | None]
# Called with fresh=False for the kept upstream connection (if any), fresh=True for a new
# one; returns (connection, whether it was kept).
UpstreamSource = Callable[[bool], Awaitable[tuple["HttpIO", bool]]]


class SandboxState:
    """Per-sandbox counters and limits."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.connections = 0
        self.total_connections = 0
        self._tokens = float(config.burst)
        self._refilled = time.monotonic()
        self._limit_noted = 0.0
        self.limited = 0

    def try_open(self) -> bool:
        if self.connections >= self.config.max_connections:
            return False
        self.connections += 1
        self.total_connections += 1
        return True

    def close(self) -> None:
        self.connections -= 1

    def take(self) -> bool:
        now = time.monotonic()
        rate, burst = self.config.rate, self.config.burst
        self._tokens = min(float(burst), self._tokens + (now - self._refilled) * rate)
        self._refilled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def note_limited(self) -> int:
        """Count a refusal; return how many to audit now (0: summarised later)."""
        self.limited += 1
        now = time.monotonic()
        if now - self._limit_noted < 1.0:
            return 0
        self._limit_noted = now
        count, self.limited = self.limited, 0
        return count


class _UpstreamGone(Exception):
    """The upstream failed before sending any response byte (maybe a stale kept connection)."""


class Denied(Exception):
    """A decision that ends the connection with an error response (already audited)."""

    def __init__(self, status: int, decision: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.decision = decision


@dataclass
class Authorized:
    target: Target
    addresses: list[tuple[IPAddress, int]]
    injection: Injection | None = field(repr=False)


class PrefixedStream(trio.abc.HalfCloseableStream):
    """A stream that first returns bytes already read past an HTTP message (CONNECT)."""

    def __init__(self, stream: trio.abc.HalfCloseableStream, prefix: bytes) -> None:
        self._stream = stream
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            data = self._prefix if max_bytes is None else self._prefix[:max_bytes]
            self._prefix = self._prefix[len(data) :]
            return data
        return bytes(await self._stream.receive_some(max_bytes))

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()


class HttpIO:
    """An h11 connection over a stream, with an idle timeout on every receive.

    Outgoing bytes can be queued (:meth:`queue`) and written together (:meth:`flush`): a
    relayed response's head and body leave in one write instead of one per h11 event, so
    the peer is woken once. Whatever is queued is flushed before this side waits for the
    other stream (``next_event(before_wait=...)``) and at the end of a message, so nothing
    is ever held back while the proxy waits.
    """

    def __init__(
        self, stream: trio.abc.Stream, role: type[h11.CLIENT] | type[h11.SERVER], idle: float
    ) -> None:
        self.stream = stream
        self.conn = h11.Connection(role, max_incomplete_event_size=MAX_HEADER_BYTES)
        self.idle = idle
        self._out: list[bytes] = []
        self._queued = 0

    async def next_event(self, before_wait: HttpIO | None = None) -> object:
        """The next h11 event; receives (idle timeout) only when h11 needs more bytes, after
        flushing ``before_wait``'s queued output."""
        conn = self.conn
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            if before_wait is not None:
                await before_wait.flush()
            # trio.fail_after without its generator context manager (a few microseconds on
            # every receive); same outcome: TooSlowError when nothing arrives in time.
            with trio.CancelScope(deadline=trio.current_time() + self.idle) as scope:
                data = await self.stream.receive_some(RECEIVE_SIZE)
            if scope.cancelled_caught:
                raise trio.TooSlowError
            conn.receive_data(bytes(data))

    def queue(self, event: h11.Event) -> None:
        """Serialise ``event`` (h11 checks it) without writing it yet."""
        data = self.conn.send(event)
        if data:
            self._out.append(data)
            self._queued += len(data)

    @property
    def queued(self) -> int:
        """Bytes queued and not written yet."""
        return self._queued

    async def flush(self) -> None:
        if not self._out:
            return
        data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out.clear()
        self._queued = 0
        await self.stream.send_all(data)

    async def send(self, event: h11.Event) -> None:
        self.queue(event)
        await self.flush()

    @property
    def reusable(self) -> bool:
        return self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE


async def close_all(*streams: trio.abc.AsyncResource | None) -> None:
    """Close every stream, even when the caller is being cancelled (a cancelled
    ``aclose_forcefully`` re-raises and would skip the ones after it)."""
    with trio.CancelScope(shield=True):
        for stream in streams:
            if stream is not None:
                await trio.aclose_forcefully(stream)


def _dial_family(ip: IPAddress) -> socket.AddressFamily:
    return socket.AF_INET6 if ip.version == 6 else socket.AF_INET


async def dial(ip: IPAddress, port: int, connect_timeout: float) -> trio.SocketStream:
    """Connect to exactly ``ip:port`` (no name lookup anywhere)."""
    sock = trio.socket.socket(_dial_family(ip), socket.SOCK_STREAM)
    try:
        with trio.fail_after(connect_timeout):
            await sock.connect((str(ip), port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


def mentions(data: bytes, forms: tuple[bytes, ...]) -> bool:
    """Whether any form occurs in ``data`` (if none does, :func:`redact` returns it as is)."""
    return any(form in data for form in forms)


def same_authority(value: bytes, target: Target, default_port: int) -> bool:
    """Whether a ``Host`` header names exactly ``target`` (canonicalised both sides)."""
    try:
        text = value.decode("ascii")
        other = parse_authority(text, default_port=default_port)
    except (UnicodeDecodeError, TargetError):
        return False
    return other.host == target.host and other.port == target.port


Fields = list[tuple[bytes, bytes]]


def fields_of(event: h11.Request | h11.Response) -> Fields:
    """An h11 event's headers as a plain list of (lower-case name, value), as iterating the
    event's ``Headers`` gives them. That iteration is slow (a Python-level ``__getitem__``
    per item): convert once per message with ``raw_items``, then scan the list."""
    return [(name.lower(), value) for name, value in event.headers.raw_items()]


def framing_problem(request: h11.Request, fields: Fields | None = None) -> str | None:
    """Why a request's framing is ambiguous (THREATS.md C9), or None. ``fields``: the
    request's headers from :func:`fields_of`, if the caller has them already."""
    te: list[bytes] = []
    cl: list[bytes] = []
    upgrade = False
    for name, value in fields_of(request) if fields is None else fields:
        if name == b"transfer-encoding":
            te.append(value)
        elif name == b"content-length":
            cl.append(value)
        elif name in (b"upgrade", b"http2-settings"):
            upgrade = True
    if te and cl:
        return "Transfer-Encoding together with Content-Length"
    if te and [v.strip().lower() for v in te] != [b"chunked"]:
        return "transfer coding other than chunked"
    if request.method in BODYLESS_METHODS and (te or any(v.strip() != b"0" for v in cl)):
        return f"{request.method.decode()} with a body"
    if upgrade:
        return "protocol upgrades are not supported"
    return None


class EgressProxy:
    def __init__(
        self,
        config: ProxyConfig,
        lookup: PolicySource,
        resolver: Resolver,
        ca: GatewayCA,
        upstream_context: ssl.SSLContext,
        sink: EgressAuditSink,
        recent: RecentPolicy | None = None,
    ) -> None:
        self.config = config
        self.lookup = lookup
        self.recent = recent
        self.resolver = resolver
        self.ca = ca
        self.upstream_context = upstream_context
        self.sink = sink
        # classify() is pure and the configuration is fixed: remember recent answers.
        self._classified: dict[IPAddress, str | None] = {}

    def classify(self, ip: IPAddress) -> str | None:
        """:func:`svcgate.egress.addresses.classify` under this proxy's carve-out and own
        addresses (memoised, at most :data:`CLASSIFY_CACHE_SIZE` addresses)."""
        try:
            return self._classified[ip]
        except KeyError:
            pass
        reason = classify_address(
            ip, allowed=self.config.allowed_networks, own=self.config.own_addresses
        )
        if len(self._classified) >= CLASSIFY_CACHE_SIZE:
            self._classified.clear()
        self._classified[ip] = reason
        return reason

    async def serve(
        self, listener: trio.SocketListener, identity: EgressIdentity, state: SandboxState
    ) -> None:
        """Accept connections of one sandbox until cancelled."""
        async with listener, trio.open_nursery() as nursery:
            while True:
                stream = await listener.accept()
                if not state.try_open():
                    nursery.start_soon(self._refuse_busy, stream, identity, state)
                    continue
                nursery.start_soon(self._connection, stream, identity, state)

    async def _refuse_busy(
        self, stream: trio.SocketStream, identity: EgressIdentity, state: SandboxState
    ) -> None:
        count = state.note_limited()
        if count:
            self.record(
                identity,
                "",
                policy.DENY_LIMIT,
                f"connections>{self.config.max_connections} refused={count}",
            )
        with trio.move_on_after(1.0), contextlib.suppress(*_STREAM_ERRORS):
            await stream.send_all(BUSY_RESPONSE)
        await trio.aclose_forcefully(stream)

    async def _connection(
        self, stream: trio.SocketStream, identity: EgressIdentity, state: SandboxState
    ) -> None:
        try:
            with trio.move_on_after(self.config.max_duration):
                await _Connection(self, stream, identity, state).run()
        except _STREAM_ERRORS as exc:
            log.debug("egress connection of %s ended: %r", identity.server, exc)
        except Exception:
            # A bug must cost this connection only, never the sandbox's listener.
            log.exception("egress connection of %s failed", identity.server)
        finally:
            state.close()
            await trio.aclose_forcefully(stream)

    def record(self, identity: EgressIdentity, host: str, decision: str, detail: str = "") -> None:
        self.sink.record(
            EgressEvent(
                user_id=identity.user_id,
                profile_id=identity.profile_id,
                server=identity.server,
                host=host,
                decision=decision,
                detail=detail,
            )
        )


class _Connection:
    """One accepted connection from a sandbox."""

    def __init__(
        self,
        proxy: EgressProxy,
        stream: trio.SocketStream,
        identity: EgressIdentity,
        state: SandboxState,
    ) -> None:
        self.proxy = proxy
        self.config = proxy.config
        self.identity = identity
        self.state = state
        self.client = HttpIO(stream, h11.SERVER, proxy.config.idle_timeout)
        self.stream = stream
        # Plain HTTP: the upstream connection kept for the last target.
        self._upstream: HttpIO | None = None
        self._upstream_key: tuple[str, int, str] | None = None
        # The scrubbed forms of the secret last injected on this connection (a tunnel's
        # requests carry the same secret until it is replaced).
        self._forms: tuple[bytes, tuple[bytes, ...]] | None = None

    async def run(self) -> None:
        try:
            while True:
                try:
                    event = await self.client.next_event()
                except h11.RemoteProtocolError as exc:
                    await self._bad_request(str(exc))
                    return
                if isinstance(event, h11.ConnectionClosed):
                    return
                if not isinstance(event, h11.Request):
                    return
                try:
                    if event.method == b"CONNECT":
                        await self._connect(event)
                        return
                    await self._plain(event)
                except Denied as denied:
                    await self._respond_error(denied.status, denied.decision, str(denied))
                    return
                if not self.client.reusable:
                    return
                self.client.conn.start_next_cycle()
        finally:
            if self._upstream is not None:
                await trio.aclose_forcefully(self._upstream.stream)

    # -- decisions -------------------------------------------------------------------------

    def deny(self, status: int, decision: str, host: str, message: str, detail: str = "") -> Denied:
        self.proxy.record(self.identity, host, decision, detail or message)
        return Denied(status, decision, message)

    def _take_token(self, host: str) -> None:
        if self.state.take():
            return
        count = self.state.note_limited()
        if count:
            self.proxy.record(
                self.identity, host, policy.DENY_LIMIT, f"rate>{self.config.rate}/s refused={count}"
            )
        raise Denied(429, policy.DENY_LIMIT, "request rate limit exceeded")

    async def _decide(self, target: Target) -> tuple[Decision, Lookup]:
        """The policy decision by name; a denial is audited and raised.

        A recent lookup (``EgressProxy.recent``) decides only when it allows *without* a
        credential: such a decision sends nothing secret, so a credential created or widened
        since then can at worst be missing from this request. Every other outcome (inject,
        deny) is decided on a fresh lookup, so a deleted, replaced or narrowed credential
        and a refusal apply to the very next request.
        """
        host = target.host
        recent: Lookup | None = None
        if self.proxy.recent is not None:
            try:
                recent = self.proxy.recent(self.identity)
            except Exception:  # the fresh lookup below decides (and fails closed)
                log.exception("egress: the recent policy of %s failed", self.identity.server)
        if recent is not None:
            decision: Decision = policy.decide(
                target, recent.rules, recent.credential, ports=self.config.ports
            )
            if decision.allowed and not decision.inject:
                return decision, recent
        try:
            lookup = await self.proxy.lookup(self.identity)
        except Exception as exc:  # a broken policy denies (fail closed)
            log.warning("egress policy for %s unavailable: %s", self.identity.server, exc)
            raise self.deny(403, policy.DENY_HOST, host, "egress policy unavailable") from exc
        decision = policy.decide(target, lookup.rules, lookup.credential, ports=self.config.ports)
        if not decision.allowed:
            raise self.deny(403, decision.decision, host, decision.reason, f"port={target.port}")
        return decision, lookup

    def _open_injection(self, lookup: Lookup, host: str) -> Injection:
        credential = lookup.credential
        assert credential is not None
        try:
            secret = lookup.open_secret()
        except Exception as exc:
            log.error(
                "credential of user %d for %s failed to open: %s",
                self.identity.user_id,
                self.identity.server,
                exc,
            )
            raise self.deny(403, policy.CREDENTIAL_ERROR, host, "credential unavailable") from exc
        return Injection.build(secret, credential.injection_header(), credential.placeholder)

    async def inner_injection(self, target: Target) -> Injection | None:
        """Each request in an intercepted tunnel is decided again: a revoked or replaced
        credential applies to the next request, not to the next tunnel."""
        decision, lookup = await self._decide(target)
        return self._open_injection(lookup, target.host) if decision.inject else None

    async def authorize(self, target: Target, mode: str) -> Authorized:
        """Policy by name, then resolve once and check every address; audit the outcome."""
        host = target.host
        decision, lookup = await self._decide(target)
        if target.ip is not None:
            addresses = [(target.ip, target.port)]
        else:
            try:
                addresses = await self.proxy.resolver.resolve(host, target.port)
            except ResolveError as exc:
                raise self.deny(502, policy.DENY_RESOLVE, host, str(exc)) from exc
        for ip, port in addresses:
            reason = self.proxy.classify(ip)
            if reason is None and port in self.config.self_ports and self._is_self(ip):
                reason = "gateway"
            if reason is not None:
                raise self.deny(
                    403,
                    policy.DENY_ADDRESS,
                    host,
                    f"address not allowed ({reason})",
                    f"reason={reason}",
                )
        injection: Injection | None = None
        if decision.inject:
            if mode == "http" and not all(self._carved_out(ip) for ip, _ in addresses):
                raise self.deny(
                    403,
                    policy.DENY_CLEARTEXT,
                    host,
                    "credentials are only sent over TLS (use https)",
                )
            injection = self._open_injection(lookup, host)
        self.proxy.record(
            self.identity,
            host,
            policy.ALLOW,
            f"mode={mode if injection is None else mode + '+inject'} port={target.port}",
        )
        return Authorized(target, addresses, injection)

    def _carved_out(self, ip: IPAddress) -> bool:
        return any(ip in net for net in self.config.allowed_networks)

    def _is_self(self, ip: IPAddress) -> bool:
        return ip.is_loopback or ip.is_unspecified or ip in self.config.own_addresses

    async def _dial(self, auth: Authorized) -> trio.SocketStream:
        last: BaseException | None = None
        for ip, port in auth.addresses:
            try:
                return await dial(ip, port, self.config.connect_timeout)
            except trio.TooSlowError as exc:
                last = exc
            except OSError as exc:
                last = exc
        log.info("egress %s -> %s failed: %r", self.identity.server, auth.target.authority, last)
        if isinstance(last, trio.TooSlowError):
            raise Denied(504, "upstream", "upstream connect timed out")
        raise Denied(502, "upstream", "upstream connection failed")

    # -- responses to the sandbox ----------------------------------------------------------

    async def _respond_error(
        self, status: int, decision: str, message: str, io: HttpIO | None = None
    ) -> None:
        io = io or self.client
        if io.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        body = f"svcgate egress: {decision}: {message}\n".encode()
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            (b"x-svcgate-egress", decision.encode()),
        ]
        try:
            await io.send(h11.Response(status_code=status, headers=headers))
            await io.send(h11.Data(data=body))
            await io.send(h11.EndOfMessage())
        except _STREAM_ERRORS:
            pass

    async def _bad_request(self, problem: str, io: HttpIO | None = None, host: str = "") -> None:
        self.proxy.record(self.identity, host, policy.DENY_REQUEST, problem[:200])
        await self._respond_error(400, policy.DENY_REQUEST, "malformed request", io)

    # -- plain HTTP ------------------------------------------------------------------------

    def _check_request(self, request: h11.Request, host: str, fields: Fields) -> None:
        problem = framing_problem(request, fields)
        if problem is not None:
            raise self.deny(400, policy.DENY_REQUEST, host, problem)

    async def _plain(self, request: h11.Request) -> None:
        try:
            url = request.target.decode("ascii")
            parts = urlsplit(url)
        except (UnicodeDecodeError, ValueError) as exc:
            raise self.deny(400, policy.DENY_REQUEST, "", "malformed request target") from exc
        if parts.scheme.lower() != "http" or not parts.netloc:
            raise self.deny(
                400,
                policy.DENY_REQUEST,
                "",
                "only absolute http:// URIs are proxied; use CONNECT for https",
            )
        if "@" in parts.netloc:
            raise self.deny(400, policy.DENY_REQUEST, "", "user info in the URI")
        try:
            target = parse_authority(parts.netloc, default_port=80)
        except TargetError as exc:
            raise self.deny(400, policy.DENY_REQUEST, "", str(exc)) from exc
        fields = fields_of(request)
        hosts = header_values(fields, b"host")
        if len(hosts) > 1 or (hosts and not same_authority(hosts[0], target, 80)):
            raise self.deny(
                403,
                policy.DENY_MISMATCH,
                target.host,
                "Host header differs from the URI",
            )
        self._check_request(request, target.host, fields)
        self._take_token(target.host)
        auth = await self.authorize(target, "http")
        path = parts.path or "/"
        if parts.query:
            path = f"{path}?{parts.query}"
        key = (target.host, target.port, str(auth.addresses[0][0]))

        async def upstreams(fresh: bool) -> tuple[HttpIO, bool]:
            kept = self._upstream
            if kept is not None and self._upstream_key == key and not fresh:
                return kept, True
            if kept is not None:
                await trio.aclose_forcefully(kept.stream)
                self._upstream = self._upstream_key = None
            upstream = HttpIO(await self._dial(auth), h11.CLIENT, self.config.idle_timeout)
            self._upstream, self._upstream_key = upstream, key
            return upstream, False

        headers = forward_request_headers(fields, auth.injection)
        if not hosts:
            headers.insert(0, (b"host", target.authority.encode()))
        await self._exchange(
            request, path.encode(), headers, upstreams, auth.injection, unchanged=fields
        )
        upstream = self._upstream
        if upstream is None:
            return
        if upstream.reusable:
            upstream.conn.start_next_cycle()
        else:
            await trio.aclose_forcefully(upstream.stream)
            self._upstream = self._upstream_key = None

    async def _exchange(
        self,
        request: h11.Request,
        path: bytes,
        headers: list[tuple[bytes, bytes]],
        upstreams: UpstreamSource,
        injection: Injection | None,
        client: HttpIO | None = None,
        *,
        unchanged: Fields | None = None,
    ) -> None:
        """Forward one request (body included) and relay its response.

        A kept upstream connection may have been closed by the upstream while idle (its
        keep-alive timeout): a request without a body that fails there before any response
        byte is sent again, once, on a fresh connection to the same checked address.

        ``unchanged``: the request's own header fields; when nothing was injected, stripped
        or added (``headers`` equals them), the request's already validated h11 headers are
        forwarded as they are instead of being validated again.
        """
        client = client or self.client
        headers = [(k, v) for k, v in headers if k != b"expect"]
        has_body = bool(
            header_values(headers, b"transfer-encoding")
            or any(v.strip() != b"0" for v in header_values(headers, b"content-length"))
        )
        wire: Headers | Fields = headers
        if injection is None and unchanged is not None and headers == unchanged:
            wire = request.headers
        upstream, reused = await upstreams(False)
        try:
            await self._send_request(request, path, wire, upstream, client)
            await self._relay_response(upstream, client, injection)
        except _UpstreamGone as gone:
            if not reused or has_body:
                raise Denied(502, "upstream", str(gone)) from gone
            log.debug("egress %s: kept upstream connection was stale", self.identity.server)
            upstream, _ = await upstreams(True)
            try:
                await self._send_request(request, path, wire, upstream, client)
                await self._relay_response(upstream, client, injection)
            except _UpstreamGone as again:
                raise Denied(502, "upstream", str(again)) from again

    async def _send_request(
        self,
        request: h11.Request,
        path: bytes,
        headers: Headers | Fields,
        upstream: HttpIO,
        client: HttpIO,
    ) -> None:
        # The head (and a bodyless request's end) leave in one write. A write that fails is
        # _UpstreamGone: retried once on a fresh connection for a bodyless request on a kept
        # one, a 502 otherwise (see _exchange).
        try:
            upstream.queue(h11.Request(method=request.method, target=path, headers=headers))
            if client.conn.they_are_waiting_for_100_continue:
                await upstream.flush()
        except (h11.LocalProtocolError, trio.BrokenResourceError, OSError) as exc:
            raise _UpstreamGone("upstream failed while sending the request") from exc
        if client.conn.they_are_waiting_for_100_continue:
            await client.send(h11.InformationalResponse(status_code=100, headers=[]))
        try:
            # On a retry the (empty) body was read already: the client is past SEND_BODY.
            while client.conn.their_state is h11.SEND_BODY:
                event = await client.next_event(before_wait=upstream)
                if isinstance(event, h11.Data):
                    upstream.queue(event)
                    if upstream.queued >= RECEIVE_SIZE:
                        await upstream.flush()
                elif not isinstance(event, h11.EndOfMessage):
                    raise h11.RemoteProtocolError("request body ended early")
            upstream.queue(h11.EndOfMessage())
            await upstream.flush()
        except (h11.LocalProtocolError, trio.BrokenResourceError, OSError) as exc:
            raise _UpstreamGone("upstream failed while sending the request") from exc

    def _secret_forms(self, secret: bytes) -> tuple[bytes, ...]:
        """:func:`secret_forms` of ``secret``, computed once per secret per connection."""
        known = self._forms
        if known is None or known[0] != secret:
            known = self._forms = (secret, secret_forms(secret))
        return known[1]

    async def _relay_response(
        self, upstream: HttpIO, client: HttpIO, injection: Injection | None
    ) -> None:
        forms = self._secret_forms(injection.secret) if injection is not None else ()
        redactor = StreamRedactor(forms) if forms else None
        started = False
        try:
            while True:
                # What is queued for the client is written before waiting for the upstream.
                event = await upstream.next_event(before_wait=client)
                if isinstance(event, h11.InformationalResponse):
                    if event.status_code == 101:
                        raise h11.RemoteProtocolError("upstream switched protocols")
                    continue  # 1xx from upstream are not relayed (100-continue is ours)
                if isinstance(event, h11.Response):
                    fields = fields_of(event)
                    headers = strip_hop_by_hop(fields)
                    reason = bytes(event.reason)
                    if forms:
                        # A compressed body cannot be scanned for the secret (C8).
                        codings = header_values(headers, b"content-encoding")
                        if any(c.strip().lower() not in (b"", b"identity") for c in codings):
                            raise Denied(
                                502, "upstream", "compressed response to a credential request"
                            )
                        headers = [
                            (k, redact(v, forms)[0] if mentions(v, forms) else v)
                            for k, v in headers
                        ]
                        if mentions(reason, forms):
                            reason = redact(reason, forms)[0]
                    if not forms and len(headers) == len(fields) and event.http_version == b"1.1":
                        # Nothing to strip or redact: relay the parsed (validated) response.
                        client.queue(event)
                    else:
                        client.queue(
                            h11.Response(
                                status_code=event.status_code, headers=headers, reason=reason
                            )
                        )
                    started = True
                elif isinstance(event, h11.Data):
                    data = (
                        bytes(event.data) if redactor is None else redactor.feed(bytes(event.data))
                    )
                    if data:
                        client.queue(event if redactor is None else h11.Data(data=data))
                        if client.queued >= RECEIVE_SIZE:
                            await client.flush()
                elif isinstance(event, h11.EndOfMessage):
                    if redactor is not None:
                        tail = redactor.finish()
                        if tail:
                            client.queue(h11.Data(data=tail))
                    client.queue(h11.EndOfMessage())
                    await client.flush()
                    return
                else:
                    raise h11.RemoteProtocolError("upstream closed before the response ended")
        except (
            h11.RemoteProtocolError,
            trio.TooSlowError,
            trio.BrokenResourceError,
            ssl.SSLError,
            OSError,
        ) as exc:
            if not started:
                raise _UpstreamGone("upstream response was malformed or cut") from exc
            log.info("egress %s: upstream response failed: %r", self.identity.server, exc)
            raise trio.BrokenResourceError("upstream response cut") from exc

    # -- CONNECT ---------------------------------------------------------------------------

    async def _connect(self, request: h11.Request) -> None:
        try:
            target = parse_authority(request.target.decode("ascii"), default_port=None)
        except (UnicodeDecodeError, TargetError) as exc:
            raise self.deny(400, policy.DENY_REQUEST, "", f"bad CONNECT target: {exc}") from exc
        self._take_token(target.host)
        auth = await self.authorize(target, "connect")
        upstream = await self._dial(auth)
        try:
            # The request's own EndOfMessage must be consumed before h11 switches.
            event = await self.client.next_event()
            if not isinstance(event, h11.EndOfMessage):
                raise h11.RemoteProtocolError("CONNECT with a body")
            await self.client.send(
                h11.Response(status_code=200, headers=[], reason=b"Connection established")
            )
            trailing, _closed = self.client.conn.trailing_data
            tunnel = PrefixedStream(self.stream, bytes(trailing))
            if auth.injection is None:
                await self._splice(tunnel, upstream)
            else:
                await self._intercept(tunnel, upstream, auth)
        finally:
            await trio.aclose_forcefully(upstream)

    async def _splice(
        self, a: trio.abc.HalfCloseableStream, b: trio.abc.HalfCloseableStream
    ) -> None:
        idle = self.config.idle_timeout
        async with trio.open_nursery() as nursery:
            scope = nursery.cancel_scope
            scope.deadline = trio.current_time() + idle

            async def pump(
                src: trio.abc.HalfCloseableStream, dst: trio.abc.HalfCloseableStream
            ) -> None:
                try:
                    while True:
                        data = await src.receive_some(RECEIVE_SIZE)
                        if not data:
                            try:
                                await dst.send_eof()
                            except _STREAM_ERRORS:
                                scope.cancel()
                            return
                        await dst.send_all(data)
                        scope.deadline = trio.current_time() + idle
                except _STREAM_ERRORS:
                    scope.cancel()

            nursery.start_soon(pump, a, b)
            nursery.start_soon(pump, b, a)

    async def _intercept(
        self, tunnel: trio.abc.Stream, upstream_tcp: trio.SocketStream | None, auth: Authorized
    ) -> None:
        target = auth.target
        server = trio.SSLStream(
            tunnel,
            self.proxy.ca.server_context(target.host, target.ip),
            server_side=True,
            https_compatible=True,
        )
        try:
            with trio.fail_after(self.config.connect_timeout):
                await server.do_handshake()
        except (trio.BrokenResourceError, trio.TooSlowError) as exc:
            if sni_mismatched(server._ssl_object):
                self.proxy.record(
                    self.identity,
                    target.host,
                    policy.DENY_MISMATCH,
                    "TLS SNI differs from the CONNECT target",
                )
            else:
                log.info("egress %s: TLS from the sandbox failed: %r", self.identity.server, exc)
            return
        hostname = target.host if target.ip is None else str(target.ip)
        client = HttpIO(server, h11.SERVER, self.config.idle_timeout)
        up: HttpIO | None = None

        async def handshake(tcp: trio.SocketStream) -> HttpIO:
            tls = trio.SSLStream(
                tcp, self.proxy.upstream_context, server_hostname=hostname, https_compatible=True
            )
            try:
                with trio.fail_after(self.config.connect_timeout):
                    await tls.do_handshake()
            except (trio.BrokenResourceError, trio.TooSlowError) as exc:
                log.warning(
                    "egress %s: upstream TLS to %s failed: %r",
                    self.identity.server,
                    target.authority,
                    exc.__cause__ or exc,
                )
                await trio.aclose_forcefully(tls)
                raise Denied(502, "upstream", "upstream TLS verification failed") from exc
            return HttpIO(tls, h11.CLIENT, self.config.idle_timeout)

        async def upstreams(fresh: bool) -> tuple[HttpIO, bool]:
            nonlocal up, upstream_tcp
            if up is not None and not fresh:
                return up, True
            if up is not None:
                await trio.aclose_forcefully(up.stream)
                up = None
            if upstream_tcp is None:
                upstream_tcp = await self._dial(auth)
            tcp, upstream_tcp = upstream_tcp, None
            up = await handshake(tcp)
            return up, False

        try:
            while True:
                try:
                    event = await client.next_event()
                except h11.RemoteProtocolError as exc:
                    await self._bad_request(str(exc), client, target.host)
                    return
                if not isinstance(event, h11.Request):
                    return
                try:
                    fields = fields_of(event)
                    path = self._inner_path(event, target, fields)
                    self._check_request(event, target.host, fields)
                    self._take_token(target.host)
                    injection = await self.inner_injection(target)
                    headers = forward_request_headers(fields, injection)
                    await self._exchange(
                        event, path, headers, upstreams, injection, client, unchanged=fields
                    )
                except Denied as denied:
                    await self._respond_error(denied.status, denied.decision, str(denied), client)
                    return
                if not client.reusable:
                    return
                client.conn.start_next_cycle()
                if up is not None and up.reusable:
                    up.conn.start_next_cycle()
                elif up is not None:
                    # The upstream closes after this response; the tunnel goes on with a new
                    # connection to the same checked address when the next request comes.
                    await trio.aclose_forcefully(up.stream)
                    up = None
        finally:
            await close_all(server, None if up is None else up.stream, upstream_tcp)

    def _inner_path(self, request: h11.Request, target: Target, fields: Fields) -> bytes:
        """The origin-form path of an inner request; refuse any other authority (C5)."""
        hosts = header_values(fields, b"host")
        raw = request.target
        path = raw
        if not raw.startswith(b"/"):
            try:
                parts = urlsplit(raw.decode("ascii"))
                same = parts.scheme.lower() == "https" and same_authority(
                    parts.netloc.encode(), target, 443
                )
            except (UnicodeDecodeError, ValueError):
                same = False
            if not same or "@" in parts.netloc:
                raise self.deny(
                    421,
                    policy.DENY_MISMATCH,
                    target.host,
                    "request target differs from the tunnel target",
                )
            path = ((parts.path or "/") + (f"?{parts.query}" if parts.query else "")).encode()
        if len(hosts) != 1 or not same_authority(hosts[0], target, 443):
            raise self.deny(
                421, policy.DENY_MISMATCH, target.host, "Host header differs from the tunnel target"
            )
        return path
