"""The egress proxy's per-request fast paths decide and forward exactly what the slow paths
did (docs/benchmarks.md, scenario 4).

- :class:`~svcgate.egress.proxy.HttpIO` queues a relayed message and writes it in one go,
  and never holds queued bytes while it waits for the other side;
- a recent lookup (the service's remembered credential row, no secret) decides only
  "allowed without a credential"; injecting and refusing are decided on a fresh lookup, so a
  deleted or replaced credential and a refusal apply to the very next request;
- :class:`~svcgate.egress.service.EgressService` remembers what a read found (never the
  secret) for :data:`~svcgate.egress.service.RECENT_TTL` seconds;
- memoised pure functions (authority parsing, address classification, the scrubbed forms
  of a secret) answer as the functions do, and stay bounded;
- headers nothing had to change are forwarded as h11 validated them.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import h11
import pytest
import trio
import trio.testing
from proxy_support import (
    IDENTITY_1,
    FakeDNS,
    Kit,
    Policies,
    RecordingSink,
    StaticLookup,
    config,
    exchange,
    http_get,
    lookup,
    request_bytes,
    tls_tunnel,
)
from upstream_support import Upstream, upstream_server

from svcgate import credentials
from svcgate.accounts import upsert_user
from svcgate.egress import addresses, proxy, service
from svcgate.egress.addresses import TargetError, classify, parse_authority
from svcgate.egress.audit_sink import EgressAuditSink
from svcgate.egress.ca import GatewayCA
from svcgate.egress.config import EgressSettings
from svcgate.egress.policy import ServerRules
from svcgate.egress.proxy import EgressIdentity, EgressProxy, HttpIO, Lookup, RecentPolicy
from svcgate.egress.redact import secret_forms
from svcgate.egress.service import EgressService
from svcgate.oidc import Identity
from svcgate.store import Store, open_store
from svcgate.vault import KeyRing, Vault

API = "api.example.test"
SECURE = "secure.example.test"
SECRET_1 = b"fast-path-secret-one/K+y=Zq9"
SECRET_2 = b"fast-path-secret-two/Qw+e=Rt7"


class NotForSecrets(StaticLookup):
    """A recent lookup: the proxy must never open a secret from it."""

    def open_secret(self) -> bytes:
        raise AssertionError("a secret was taken from a recent lookup")


def recent_source(value: Lookup | None) -> tuple[list[EgressIdentity], RecentPolicy]:
    calls: list[EgressIdentity] = []

    def recent(identity: EgressIdentity) -> Lookup | None:
        calls.append(identity)
        return value

    return calls, recent


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Upstream, Upstream]]:
    ca_dir = tmp_path_factory.mktemp("upstream-ca") / "ca"
    with upstream_server() as plain, upstream_server(tls_name=SECURE, ca_dir=ca_dir) as secure:
        yield plain, secure


@pytest.fixture
def plain(upstreams: tuple[Upstream, Upstream]) -> Upstream:
    upstreams[0].clear()
    return upstreams[0]


@pytest.fixture
def secure(upstreams: tuple[Upstream, Upstream]) -> Upstream:
    upstreams[1].clear()
    return upstreams[1]


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory, upstreams: tuple[Upstream, Upstream]) -> Kit:
    return Kit.create(tmp_path_factory.mktemp("gateway-ca") / "ca", upstreams[1].ca_file)


# -- HttpIO: one write per relayed message, nothing held while waiting ------------------------


class RecordingStream(trio.abc.Stream):
    """A stream that records every ``send_all``."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.writes: list[bytes] = []

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_queued_response_leaves_in_one_write_before_the_next_wait() -> None:
    near, far = trio.testing.memory_stream_pair()
    recording = RecordingStream(near)
    server = HttpIO(recording, h11.SERVER, idle=5.0)
    peer = h11.Connection(h11.CLIENT)
    await far.send_all(
        peer.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
        + peer.send(h11.EndOfMessage())
    )
    assert isinstance(await server.next_event(), h11.Request)
    assert isinstance(await server.next_event(), h11.EndOfMessage)

    server.queue(h11.Response(status_code=200, headers=[("Content-Length", "5")]))
    server.queue(h11.Data(data=b"hello"))
    server.queue(h11.EndOfMessage())
    assert recording.writes == []
    assert server.queued > 0

    # Another connection waiting for bytes flushes the queued ones first.
    up_near, up_far = trio.testing.memory_stream_pair()
    upstream = HttpIO(up_near, h11.CLIENT, idle=5.0)
    upstream.queue(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    upstream.queue(h11.EndOfMessage())
    await upstream.flush()
    async with trio.open_nursery() as nursery:
        got: list[object] = []

        async def wait() -> None:
            got.append(await upstream.next_event(before_wait=server))

        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        assert len(recording.writes) == 1  # head and body together, before blocking
        assert server.queued == 0
        await up_far.receive_some()
        await up_far.send_all(b"HTTP/1.1 204 No Content\r\n\r\n")
    assert isinstance(got[0], h11.Response)

    peer.receive_data(await far.receive_some())
    assert isinstance(peer.next_event(), h11.Response)
    assert peer.next_event() == h11.Data(data=b"hello")
    assert isinstance(peer.next_event(), h11.EndOfMessage)


async def test_the_idle_timeout_still_applies_to_every_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    near, _far = trio.testing.memory_stream_pair()
    io = HttpIO(near, h11.SERVER, idle=60.0)
    with pytest.raises(trio.TooSlowError):
        await io.next_event()


# -- a recent lookup decides only "allowed without a credential" -----------------------------


async def test_a_recent_allow_without_credential_needs_no_fresh_lookup(
    kit: Kit, plain: Upstream
) -> None:
    dns = FakeDNS().answer(API, "127.0.0.1")
    policies = Policies({IDENTITY_1: lookup([API])})
    calls, recent = recent_source(NotForSecrets(ServerRules.of([API])))
    url = f"http://{API}:{plain.port}/x"
    async with kit.run(config(plain.port), policies, dns, recent=recent) as running:
        for _ in range(3):
            assert (await http_get(running.port(), url)).status == 200
    assert policies.calls == []
    assert calls == [IDENTITY_1] * 3
    assert running.sink.decisions() == ["allow"] * 3  # still audited, every request
    assert len(plain.seen) == 3


async def test_a_recent_lookup_that_would_inject_is_decided_afresh(
    kit: Kit, plain: Upstream
) -> None:
    """The remembered row still names the host, the fresh one holds a replaced secret, then
    none: the request carries the new secret, then nothing."""
    dns = FakeDNS().answer(API, "127.0.0.1")
    stale = lookup([API], credential_hosts=[API], secret=b"never-sent-stale-secret")
    _, recent = recent_source(NotForSecrets(stale.rules, stale.credential))
    policies = Policies({IDENTITY_1: lookup([API], credential_hosts=[API], secret=SECRET_2)})
    url = f"http://{API}:{plain.port}/headers"
    async with kit.run(config(plain.port), policies, dns, recent=recent) as running:
        assert (await http_get(running.port(), url)).status == 200
        policies.by_identity[IDENTITY_1] = lookup([API])  # the credential was deleted
        assert (await http_get(running.port(), url)).status == 200
    assert policies.calls == [IDENTITY_1, IDENTITY_1]
    assert [s.headers.get("authorization") for s in plain.seen] == [
        f"Bearer {SECRET_2.decode()}",
        None,
    ]


async def test_a_recent_refusal_is_checked_afresh(kit: Kit, plain: Upstream) -> None:
    dns = FakeDNS().answer(API, "127.0.0.1")
    _, recent = recent_source(NotForSecrets())  # remembered: no rule at all
    policies = Policies({IDENTITY_1: lookup([API])})
    url = f"http://{API}:{plain.port}/x"
    async with kit.run(config(plain.port), policies, dns, recent=recent) as running:
        assert (await http_get(running.port(), url)).status == 200
        policies.by_identity[IDENTITY_1] = StaticLookup()
        assert (await http_get(running.port(), url)).egress == "deny_host"
    assert policies.calls == [IDENTITY_1, IDENTITY_1]


async def test_a_failing_recent_source_falls_back_to_the_fresh_lookup(
    kit: Kit, plain: Upstream
) -> None:
    def broken(identity: EgressIdentity) -> Lookup | None:
        raise RuntimeError("recent policy broken")

    dns = FakeDNS().answer(API, "127.0.0.1")
    policies = Policies({IDENTITY_1: StaticLookup()})
    url = f"http://{API}:{plain.port}/x"
    async with kit.run(config(plain.port), policies, dns, recent=broken) as running:
        assert (await http_get(running.port(), url)).egress == "deny_host"
    assert policies.calls == [IDENTITY_1]
    assert plain.seen == []


@asynccontextmanager
async def intercepted(
    kit: Kit, secure: Upstream, policies: Policies, recent: RecentPolicy
) -> AsyncIterator[tuple[trio.SSLStream[trio.SocketStream], str]]:
    dns = FakeDNS().answer(SECURE, "127.0.0.1")
    authority = f"{SECURE}:{secure.port}"
    async with kit.run(config(secure.port), policies, dns, recent=recent) as running:
        tls = await tls_tunnel(running.port(), authority, kit.client_context(), sni=SECURE)
        async with tls:
            yield tls, authority


async def test_every_request_in_an_intercepted_tunnel_reads_afresh_and_is_scrubbed(
    kit: Kit, secure: Upstream
) -> None:
    """A remembered lookup never serves an injecting request; the secret replaced mid-tunnel
    is injected at once and the new one is scrubbed from the reflected response."""
    fresh = lookup(credential_hosts=[SECURE], secret=SECRET_1)
    _, recent = recent_source(NotForSecrets(fresh.rules, fresh.credential))
    policies = Policies({IDENTITY_1: fresh})
    async with intercepted(kit, secure, policies, recent) as (tls, authority):
        first = await exchange(tls, request_bytes("GET", "/headers", host=authority))
        policies.by_identity[IDENTITY_1] = lookup(credential_hosts=[SECURE], secret=SECRET_2)
        second = await exchange(tls, request_bytes("GET", "/headers", host=authority))
    assert len(policies.calls) == 3  # the CONNECT and each inner request
    assert [s.headers["authorization"] for s in secure.seen] == [
        f"Bearer {SECRET_1.decode()}",
        f"Bearer {SECRET_2.decode()}",
    ]
    for response, secret in ((first, SECRET_1), (second, SECRET_2)):
        assert response.status == 200
        reflected = {k.lower(): v for k, v in json.loads(response.body)["headers"].items()}
        assert reflected["authorization"] == "Bearer " + "*" * len(secret)
        assert response.header("x-echo-auth") == b"Bearer " + b"*" * len(secret)
        for form in secret_forms(secret):
            assert form not in response.body


# -- headers nothing had to change -------------------------------------------------------------


async def test_a_request_with_nothing_to_change_keeps_its_header_names(
    kit: Kit, plain: Upstream
) -> None:
    dns = FakeDNS().answer(API, "127.0.0.1")
    policies = Policies({IDENTITY_1: lookup([API])})
    data = request_bytes("GET", f"http://{API}:{plain.port}/x", [("X-Mixed-Case", "1")])
    async with kit.run(config(plain.port), policies, dns) as running:
        stream = await trio.open_tcp_stream("127.0.0.1", running.port())
        async with stream:
            response = await exchange(stream, data)
    assert response.status == 200
    assert ("X-Mixed-Case", "1") in plain.seen[0].raw_headers
    assert response.body == b"ok /x"


async def test_hop_by_hop_and_proxy_headers_are_still_stripped(kit: Kit, plain: Upstream) -> None:
    dns = FakeDNS().answer(API, "127.0.0.1")
    policies = Policies({IDENTITY_1: lookup([API])})
    headers = [("X-Mixed-Case", "1"), ("Proxy-Authorization", "Basic eA=="), ("X-Drop", "1")]
    async with kit.run(config(plain.port), policies, dns) as running:
        response = await http_get(
            running.port(), f"http://{API}:{plain.port}/x", [*headers, ("Connection", "x-drop")]
        )
    assert response.status == 200
    seen = plain.seen[0].headers
    assert seen["x-mixed-case"] == "1"
    assert "proxy-authorization" not in seen and "x-drop" not in seen


# -- EgressService remembers what a read found, never the secret -----------------------------


@asynccontextmanager
async def egress_service(tmp_path: Path) -> AsyncIterator[tuple[EgressService, Store, int]]:
    async with open_store(tmp_path / "db" / "svcgate.db") as store:
        identity = Identity("https://idp.test", "bob", "bob@example.test", "Bob", {})
        user = await store.write(lambda conn: upsert_user(conn, identity, "user"))
        svc = EgressService(
            EgressSettings(),
            store=store,
            vault=Vault(KeyRing({1: b"k" * 32})),
            sink=EgressAuditSink(store),
            ca=GatewayCA.load_or_create(tmp_path / "ca"),
            server_rules=lambda name: ServerRules.of(["open.example.test"]),
        )
        yield svc, store, user.id


async def put(
    svc: EgressService, store: Store, user_id: int, secret: str, hosts: list[str]
) -> None:
    data = credentials.validate(secret, None, None, None, hosts)
    await store.write(lambda conn: credentials.upsert(conn, svc.vault, user_id, "srv", data))


async def test_the_service_remembers_a_read_without_its_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]

    class Clock:
        @staticmethod
        def monotonic() -> float:
            return now[0]

    monkeypatch.setattr(service, "time", Clock)
    monkeypatch.setattr(credentials, "_last_change", 0.0)  # on the real clock otherwise
    async with egress_service(tmp_path) as (svc, store, user_id):
        identity = EgressIdentity("srv", user_id, 7, "p")
        assert svc.recent(identity) is None  # nothing read yet
        await put(svc, store, user_id, "first-secret-123", ["api.example.test"])
        fresh = await svc.lookup(identity)
        assert fresh.open_secret() == b"first-secret-123"
        remembered = svc.recent(identity)
        assert remembered is not None
        assert remembered.credential == fresh.credential
        assert remembered.rules == ServerRules.of(["open.example.test"])
        with pytest.raises(LookupError):
            remembered.open_secret()
        # Deleted: the next fresh read (every refusal and every injection makes one) sees it
        # and replaces what is remembered.
        await store.write(lambda conn: credentials.delete(conn, user_id, "srv"))
        assert (await svc.lookup(identity)).credential is None
        remembered = svc.recent(identity)
        assert remembered is not None and remembered.credential is None
        # Remembered for RECENT_TTL seconds from the start of the read.
        now[0] += service.RECENT_TTL + 0.001
        assert svc.recent(identity) is None


async def test_a_credential_change_makes_every_earlier_read_untrusted(tmp_path: Path) -> None:
    # A credential created through the API applies to the very next request, even to a host
    # that a remembered read allowed without one a moment ago.
    async with egress_service(tmp_path) as (svc, store, user_id):
        identity = EgressIdentity("srv", user_id, 7, "p")
        assert (await svc.lookup(identity)).credential is None
        assert svc.recent(identity) is not None
        await put(svc, store, user_id, "new-secret-1234", ["open.example.test"])
        credentials.mark_changed()  # what the API does after the commit
        assert svc.recent(identity) is None
        fresh = await svc.lookup(identity)
        assert fresh.credential is not None
        assert svc.recent(identity) is not None  # a read after the change is trusted again


async def test_the_legacy_profile_has_no_credential_to_remember(tmp_path: Path) -> None:
    async with egress_service(tmp_path) as (svc, _store, _user_id):
        legacy = EgressIdentity("echo", 0, 0, "legacy")
        assert (await svc.lookup(legacy)).credential is None
        remembered = svc.recent(legacy)
        assert remembered is not None and remembered.credential is None


async def test_a_slower_older_read_does_not_replace_a_newer_one(tmp_path: Path) -> None:
    async with egress_service(tmp_path) as (svc, store, user_id):
        identity = EgressIdentity("srv", user_id, 7, "p")
        await put(svc, store, user_id, "a-secret-1234", ["api.example.test"])
        await svc.lookup(identity)
        newer = svc._recent[(user_id, "srv")]
        older = service._Policy(("stale.example.test",), None, None, None)
        svc._remember((user_id, "srv"), newer[0] - 1.0, older)
        assert svc._recent[(user_id, "srv")] == newer


async def test_what_the_service_remembers_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "RECENT_MAX", 2)
    async with egress_service(tmp_path) as (svc, _store, _user_id):
        for n in range(5):
            await svc.lookup(EgressIdentity(f"srv{n}", 0, 0, "legacy"))
            assert len(svc._recent) <= 2


# -- memoised pure functions -------------------------------------------------------------------


def test_parsed_authorities_are_memoised_and_refusals_are_not() -> None:
    first = parse_authority("API.Example.TEST.:8080", default_port=None)
    assert first.authority == "api.example.test:8080"
    assert parse_authority("API.Example.TEST.:8080", default_port=None) is first
    for _ in range(2):
        with pytest.raises(TargetError):
            parse_authority("user@api.example.test:80", default_port=None)
    with pytest.raises(ValueError, match="default port"):
        parse_authority("api.example.test", default_port=0)
    info = addresses._parse_authority.cache_info()
    assert info.maxsize == addresses.PARSE_CACHE_SIZE
    assert info.hits >= 1


def test_address_classification_is_memoised_per_proxy_and_bounded(
    kit: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(proxy, "CLASSIFY_CACHE_SIZE", 3)
    cfg = config(carve_out=("10.1.0.0/16",), own_addresses=("192.0.2.7",))
    resolver = FakeDNS().resolver()
    egress = EgressProxy(cfg, Policies({}), resolver, kit.ca, kit.upstream_context, RecordingSink())
    samples = ["10.1.2.3", "10.2.0.1", "192.0.2.7", "169.254.169.254", "8.8.8.8", "::1"]
    for text in samples * 2:
        ip = ipaddress.ip_address(text)
        expected = classify(ip, allowed=cfg.allowed_networks, own=cfg.own_addresses)
        assert egress.classify(ip) == expected
        assert len(egress._classified) <= 3
