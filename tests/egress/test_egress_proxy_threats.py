"""The egress proxy against THREATS.md section C, in process (C1-C9, C11, C13).

Each test runs a real :class:`~svcgate.egress.proxy.EgressProxy` on loopback listeners in
the test's trio loop (``proxy_support``), with a fake resolver, an in-memory audit sink and
threaded loopback upstreams (``upstream_support``). C10 and C12 need a real sandbox network
namespace and are covered elsewhere.
"""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proxy_support import (
    IDENTITY_1,
    IDENTITY_2,
    FakeDNS,
    Kit,
    Policies,
    Response,
    RunningProxy,
    StaticLookup,
    config,
    connect,
    encoding_upstream,
    exchange,
    full_backlog,
    http_get,
    listener_port,
    lookup,
    open_client,
    open_listener,
    read_response,
    read_until_closed,
    request_bytes,
    send_raw,
    tls_tunnel,
    trap,
    wait_until,
)
from upstream_support import Listener, Upstream, upstream_server

from svcgate.egress.redact import secret_forms

API = "api.example.test"  # plain HTTP upstream
SECURE = "secure.example.test"  # HTTPS upstream (its certificate names this host)
OTHER = "other.example.test"
ATTACKER = "attacker.test"
SECRET_1 = b"s3cr3t-one/K+y=Zq9!x"
SECRET_2 = b"s3cr3t-two/Qw+e=Rt7!z"


@dataclass
class Upstreams:
    plain: Upstream
    secure: Upstream


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstreams]:
    ca_dir = tmp_path_factory.mktemp("upstream-ca") / "ca"
    with upstream_server() as plain, upstream_server(tls_name=SECURE, ca_dir=ca_dir) as secure:
        yield Upstreams(plain, secure)


@pytest.fixture
def plain(upstreams: Upstreams) -> Upstream:
    upstreams.plain.clear()
    return upstreams.plain


@pytest.fixture
def secure(upstreams: Upstreams) -> Upstream:
    upstreams.secure.clear()
    return upstreams.secure


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory, upstreams: Upstreams) -> Kit:
    return Kit.create(tmp_path_factory.mktemp("gateway-ca") / "ca", upstreams.secure.ca_file)


@dataclass
class Target:
    """A counting loopback listener (shared by the module) and its count at test start."""

    listener: Listener
    baseline: int

    @property
    def port(self) -> int:
        return int(self.listener.port)

    async def untouched(self) -> bool:
        """No connection reached it during this test (its accept thread gets a moment)."""
        await trio.sleep(0.02)
        return self.listener.accepted == self.baseline and self.listener.received == b""


@pytest.fixture(scope="module")
def shared_listener() -> Iterator[Listener]:
    target = Listener()
    try:
        yield target
    finally:
        target.close()


@pytest.fixture
def listener(shared_listener: Listener) -> Target:
    """What a wrongly allowed dial would reach: every C1/C3/C4/C7 target points here."""
    return Target(shared_listener, shared_listener.accepted)


async def probe(mode: str, port: int, authority: str) -> Response:
    """One request for ``authority``: absolute-form GET ("http") or CONNECT ("connect")."""
    if mode == "http":
        return await http_get(port, f"http://{authority}/")
    response, stream = await connect(port, authority)
    await stream.aclose()
    return response


async def fetch(
    kit: Kit,
    port: int,
    scheme: str,
    authority: str,
    path: str,
    headers: tuple[tuple[str, str], ...] = (),
    connect_headers: tuple[tuple[str, str], ...] = (),
) -> Response:
    """GET ``path`` on ``authority`` via the proxy: plain absolute form, or CONNECT + TLS."""
    if scheme == "http":
        return await http_get(port, f"http://{authority}{path}", headers)
    host = authority.rsplit(":", 1)[0]
    context = kit.client_context()
    tls = await tls_tunnel(port, authority, context, sni=host, headers=connect_headers)
    async with tls:
        data = request_bytes("GET", path, [*headers, ("Connection", "close")], host=authority)
        return await exchange(tls, data)


def assert_no_secret(response: Response, secret: bytes) -> None:
    for form in secret_forms(secret):
        assert form not in response.body
        for name, value in response.headers:
            assert form not in value, name
        assert form not in response.reason


# -- C1: SSRF to internal destinations, decided after resolution ---------------------------

FORBIDDEN = [
    ("127.0.0.1", "loopback"),
    ("127.8.9.10", "loopback"),
    ("::1", "loopback"),
    ("10.0.0.1", "private"),
    ("172.16.0.1", "private"),
    ("192.168.1.1", "private"),
    ("fc00::1", "private"),
    ("169.254.169.254", "metadata"),
    ("fd00:ec2::254", "metadata"),
    ("169.254.1.1", "link_local"),
    ("fe80::1", "link_local"),
    ("100.64.0.1", "cgnat"),
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("224.0.0.1", "multicast"),
    ("ff02::1", "multicast"),
    ("255.255.255.255", "broadcast"),
    ("::ffff:127.0.0.1", "embedded_ipv4"),
    ("::ffff:169.254.169.254", "embedded_ipv4"),
    ("192.0.2.10", "reserved"),
    ("240.0.0.1", "reserved"),
]


@pytest.mark.parametrize("mode", ["http", "connect"])
@pytest.mark.parametrize(("address", "reason"), FORBIDDEN, ids=[a for a, _ in FORBIDDEN])
async def test_c1_allowed_name_resolving_to_internal_address_is_denied(
    kit: Kit, listener: Target, mode: str, address: str, reason: str
) -> None:
    dns = FakeDNS().answer(API, address)
    policies = Policies({IDENTITY_1: lookup([API])})
    async with kit.run(config(listener.port, carve_out=()), policies, dns) as running:
        response = await probe(mode, running.port(), f"{API}:{listener.port}")
    assert response.status == 403
    assert response.egress == "deny_address"
    assert [(e.host, e.decision, e.detail) for e in running.events] == [
        (API, "deny_address", f"reason={reason}")
    ]
    assert dns.lookups == [API]
    assert await listener.untouched()


@pytest.mark.parametrize(
    "address", ["169.254.169.254", "169.254.169.1", "169.254.170.2", "fd00:ec2::254"]
)
async def test_c1_metadata_stays_denied_with_a_carve_out_of_everything(
    kit: Kit, listener: Target, address: str
) -> None:
    dns = FakeDNS().answer(API, address)
    policies = Policies({IDENTITY_1: lookup([API])})
    cfg = config(listener.port, carve_out=("0.0.0.0/0", "::/0"))
    async with kit.run(cfg, policies, dns) as running:
        response = await probe("http", running.port(), f"{API}:{listener.port}")
    assert (response.status, response.egress) == (403, "deny_address")
    assert running.events[-1].detail == "reason=metadata"
    assert await listener.untouched()


async def test_c1_own_host_address_is_denied_even_inside_the_carve_out(
    kit: Kit, listener: Target
) -> None:
    dns = FakeDNS().answer(API, "10.9.9.9")
    policies = Policies({IDENTITY_1: lookup([API])})
    cfg = config(listener.port, carve_out=("10.0.0.0/8",), own_addresses=("10.9.9.9",))
    async with kit.run(cfg, policies, dns) as running:
        for mode in ("http", "connect"):
            response = await probe(mode, running.port(), f"{API}:{listener.port}")
            assert (response.status, response.egress) == (403, "deny_address")
    assert [e.detail for e in running.events] == ["reason=own_address"] * 2


async def test_c1_the_proxy_own_listener_is_denied_even_on_carved_out_loopback(
    kit: Kit,
) -> None:
    proxy_listener = await open_listener()
    port = listener_port(proxy_listener)
    dns = FakeDNS().answer(API, "127.0.0.1")
    policies = Policies({IDENTITY_1: lookup([API])})
    cfg = config(port, carve_out=("127.0.0.0/8",), self_ports=(port,))
    async with kit.run(cfg, policies, dns, listeners={IDENTITY_1: proxy_listener}) as running:
        for mode in ("http", "connect"):
            response = await probe(mode, port, f"{API}:{port}")
            assert (response.status, response.egress) == (403, "deny_address")
        # By literal too: named exactly and carved out, still the gateway itself.
        policies.by_identity[IDENTITY_1] = lookup([API, "127.0.0.1"])
        response = await probe("connect", port, f"127.0.0.1:{port}")
        assert (response.status, response.egress) == (403, "deny_address")
        # Only the test's own three connections ever reached the proxy's listener.
        assert running.states[IDENTITY_1].total_connections == 3
    assert [e.detail for e in running.events] == ["reason=gateway"] * 3


# -- C2: DNS rebinding: resolve once, dial what was checked ----------------------------------

REBIND = "rebind.example.test"


async def test_c2_each_request_resolves_once_and_dials_the_checked_address(
    kit: Kit, plain: Upstream
) -> None:
    # 127.0.0.1 (carved out, the real upstream) first, then 127.0.0.2 (not carved out),
    # where a trap listens on the same port: a second lookup at dial time would land there.
    with trap("127.0.0.2", plain.port) as rebound:
        dns = FakeDNS().alternate(REBIND, ["127.0.0.1"], ["127.0.0.2"])
        policies = Policies({IDENTITY_1: lookup([REBIND])})
        cfg = config(plain.port, carve_out=("127.0.0.1/32",))
        authority = f"{REBIND}:{plain.port}"
        async with kit.run(cfg, policies, dns) as running:
            port = running.port()
            first = await http_get(port, f"http://{authority}/first")
            assert (first.status, first.body) == (200, b"ok /first")
            assert dns.lookups == [REBIND]
            assert rebound.count() == 0

            second = await http_get(port, f"http://{authority}/second")
            assert (second.status, second.egress) == (403, "deny_address")
            assert dns.lookups == [REBIND] * 2

            response, tunnel = await connect(port, authority)
            assert response.status == 200
            async with tunnel:
                third = await exchange(tunnel, request_bytes("GET", "/third", host=authority))
            assert (third.status, third.body) == (200, b"ok /third")
            assert dns.lookups == [REBIND] * 3

            fourth, tunnel = await connect(port, authority)
            await tunnel.aclose()
            assert (fourth.status, fourth.egress) == (403, "deny_address")
            assert dns.lookups == [REBIND] * 4
        assert rebound.count() == 0
    assert [seen.path for seen in plain.seen] == ["/first", "/third"]
    assert running.sink.decisions() == ["allow", "deny_address", "allow", "deny_address"]


@pytest.mark.parametrize(
    "answer",
    [
        ("127.0.0.1", "10.0.0.1"),
        ("10.0.0.1", "127.0.0.1"),
        ("127.0.0.1", "169.254.169.254"),
        ("127.0.0.1", "::1"),
    ],
)
async def test_c2_an_answer_mixing_allowed_and_forbidden_addresses_is_refused_whole(
    kit: Kit, plain: Upstream, answer: tuple[str, ...]
) -> None:
    dns = FakeDNS().answer(REBIND, *answer)
    policies = Policies({IDENTITY_1: lookup([REBIND])})
    cfg = config(plain.port, carve_out=("127.0.0.1/32",))
    async with kit.run(cfg, policies, dns) as running:
        for mode in ("http", "connect"):
            response = await probe(mode, running.port(), f"{REBIND}:{plain.port}")
            assert (response.status, response.egress) == (403, "deny_address")
    assert dns.lookups == [REBIND] * 2
    assert plain.connections == 0


# -- C3: IP literals in every encoding -------------------------------------------------------

LITERALS = [
    "2130706433",
    "0x7f000001",
    "0177.0.0.1",
    "127.1",
    "0x7f.1",
    "017700000001",
    "0",
    "127.0.0.1",
    "[::1]",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[::127.0.0.1]",
    "[64:ff9b::7f00:1]",
    "[64:ff9b:1::7f00:1]",
    "[2002:7f00:1::1]",  # 6to4 of 127.0.0.1
    "[2001:0:4136:e378:8000:63bf:80ff:fffe]",  # Teredo
    "169.254.169.254",
    "[fd00:ec2::254]",
]


@pytest.mark.parametrize("mode", ["http", "connect"])
@pytest.mark.parametrize("literal", LITERALS)
async def test_c3_ip_literals_are_denied_unless_named_exactly(
    kit: Kit, listener: Target, mode: str, literal: str
) -> None:
    dns = FakeDNS(fallback="127.0.0.1")
    # Wildcards never cover a literal; the carve-out alone does not make one reachable.
    policies = Policies({IDENTITY_1: lookup([API, "*.example.test"])})
    async with kit.run(config(listener.port), policies, dns) as running:
        response = await probe(mode, running.port(), f"{literal}:{listener.port}")
    assert (response.status, response.egress) == (403, "deny_ip_literal")
    assert running.sink.decisions() == ["deny_ip_literal"]
    assert dns.lookups == []
    assert await listener.untouched()


async def test_c3_a_literal_named_exactly_is_allowed_and_dialled_as_parsed(
    kit: Kit, plain: Upstream, listener: Target
) -> None:
    dns = FakeDNS()
    policies = Policies({IDENTITY_1: lookup(["127.0.0.1", "0.0.0.0"])})
    async with kit.run(config(plain.port, listener.port), policies, dns) as running:
        port = running.port()
        exact = await http_get(port, f"http://127.0.0.1:{plain.port}/exact")
        assert (exact.status, exact.body) == (200, b"ok /exact")
        # Other encodings of the same address canonicalise to the named literal, and the
        # dialler uses those parsed bytes (no resolver is ever asked).
        hexed = await http_get(port, f"http://0x7f000001:{plain.port}/hex")
        assert (hexed.status, hexed.body) == (200, b"ok /hex")
        response, tunnel = await connect(port, f"2130706433:{plain.port}")
        assert response.status == 200
        async with tunnel:
            decimal = await exchange(tunnel, request_bytes("GET", "/decimal", host="x"))
        assert (decimal.status, decimal.body) == (200, b"ok /decimal")
        # Named, but the address itself is never dialled.
        zero = await probe("connect", port, f"0:{listener.port}")
        assert (zero.status, zero.egress) == (403, "deny_address")
        # Embedded IPv4 cannot be named (no pattern is an IPv6 literal) and stays denied.
        mapped = await probe("connect", port, f"[::ffff:127.0.0.1]:{listener.port}")
        assert (mapped.status, mapped.egress) == (403, "deny_ip_literal")
    assert dns.lookups == []
    assert [seen.path for seen in plain.seen] == ["/exact", "/hex", "/decimal"]
    assert running.events[-2].detail == "reason=unspecified"
    assert await listener.untouched()


async def test_c3_a_named_loopback_literal_still_needs_the_carve_out(
    kit: Kit, listener: Target
) -> None:
    policies = Policies({IDENTITY_1: lookup(["127.0.0.1"])})
    async with kit.run(config(listener.port, carve_out=()), policies, FakeDNS()) as running:
        response = await probe("connect", running.port(), f"127.0.0.1:{listener.port}")
    assert (response.status, response.egress) == (403, "deny_address")
    assert running.events[-1].detail == "reason=loopback"
    assert await listener.untouched()


MALFORMED = [
    "[::1%25lo]:443",
    "[fe80::1%eth0]:443",
    "::1:443",
    "[::1:443",
    "1.2.3.4.5:443",
    "api.example.123:443",
    "256.0.0.1:443",
    "0x100000000:443",
    "user@api.example.test:443",
    "api.example.test",
    "api.example.test:0",
    "api.example.test:65536",
    "api.example.test:+443",
    "api..example.test:443",
    "api.example.test/x:443",
]


@pytest.mark.parametrize("authority", MALFORMED)
async def test_c3_ambiguous_authorities_are_refused_not_left_to_a_resolver(
    kit: Kit, listener: Target, authority: str
) -> None:
    dns = FakeDNS(fallback="127.0.0.1")
    policies = Policies({IDENTITY_1: lookup([API, "*.example.test", "127.0.0.1"])})
    async with kit.run(config(listener.port), policies, dns) as running:
        response = await probe("connect", running.port(), authority)
    assert response.status == 400
    assert response.egress in (None, "deny_request")  # None: h11 refused the request line
    assert dns.lookups == []
    assert await listener.untouched()


# -- C4: wildcard semantics and canonicalisation ---------------------------------------------

HOMOGRAPH = "api.xn--exmple-4nf.com"  # api.exаmple.com with a Cyrillic "а", IDNA-encoded


@pytest.mark.parametrize(
    "host", ["api.example.com", "API.EXAMPLE.COM.", "a.b.example.com", "Api.Example.Com"]
)
async def test_c4_wildcard_covers_subdomains_in_any_case(
    kit: Kit, plain: Upstream, host: str
) -> None:
    dns = FakeDNS(fallback="127.0.0.1")
    policies = Policies({IDENTITY_1: lookup(["*.example.com"])})
    async with kit.run(config(plain.port), policies, dns) as running:
        response = await http_get(running.port(), f"http://{host}:{plain.port}/w")
    assert (response.status, response.body) == (200, b"ok /w")
    canonical = host.lower().rstrip(".")
    assert dns.lookups == [canonical]
    assert [e.host for e in running.events] == [canonical]


@pytest.mark.parametrize("mode", ["http", "connect"])
@pytest.mark.parametrize(
    "host",
    [
        "example.com",
        "example.com.",
        "evil-example.com",
        "notexample.com",
        "example.com.evil.net",
        "api.example.com.evil.net",
        "api.example.co",
        HOMOGRAPH,
        "xn--exmple-4nf.com",
    ],
)
async def test_c4_wildcard_slips_are_denied_by_name(
    kit: Kit, listener: Target, mode: str, host: str
) -> None:
    dns = FakeDNS(fallback="127.0.0.1")
    policies = Policies({IDENTITY_1: lookup(["*.example.com"])})
    async with kit.run(config(listener.port), policies, dns) as running:
        response = await probe(mode, running.port(), f"{host}:{listener.port}")
    assert (response.status, response.egress) == (403, "deny_host")
    assert running.sink.decisions() == ["deny_host"]
    assert dns.lookups == []
    assert await listener.untouched()


async def test_c4_raw_unicode_homograph_is_refused(kit: Kit, listener: Target) -> None:
    dns = FakeDNS(fallback="127.0.0.1")
    policies = Policies({IDENTITY_1: lookup(["*.example.com"])})
    async with kit.run(config(listener.port), policies, dns) as running:
        raw = f"GET http://api.exаmple.com:{listener.port}/ HTTP/1.1\r\n\r\n".encode()
        response = await send_raw(running.port(), raw)
    assert response.status in (400, 403)
    assert response.egress in ("deny_request", "deny_host")
    assert dns.lookups == []
    assert await listener.untouched()


async def test_c4_overly_broad_patterns_are_dropped_not_widened(kit: Kit, listener: Target) -> None:
    broad = ["*", "*.com", "*.co.uk", "*.test", "**.example.com", "*example.com", ".com"]
    dns = FakeDNS(fallback="127.0.0.1")
    policies = Policies({IDENTITY_1: lookup(broad, credential_hosts=broad, secret=SECRET_1)})
    async with kit.run(config(listener.port), policies, dns) as running:
        for host in ("example.com", "api.example.com", "bbc.co.uk", "x.test"):
            response = await probe("connect", running.port(), f"{host}:{listener.port}")
            assert (response.status, response.egress) == (403, "deny_host"), host
    assert dns.lookups == []
    assert await listener.untouched()


# -- C5: the credential is keyed on the CONNECT target only ----------------------------------


def secure_setup(secure: Upstream) -> tuple[Policies, FakeDNS, str]:
    dns = FakeDNS().answer(SECURE, "127.0.0.1").answer(OTHER, "127.0.0.1")
    policies = Policies({IDENTITY_1: lookup([OTHER], credential_hosts=[SECURE], secret=SECRET_1)})
    return policies, dns, f"{SECURE}:{secure.port}"


@dataclass
class SecureTunnel:
    running: RunningProxy
    policies: Policies
    authority: str
    tls: trio.SSLStream[trio.SocketStream]


@asynccontextmanager
async def secure_tunnel(
    kit: Kit, secure: Upstream, alpn: Sequence[str] | None = None
) -> AsyncIterator[SecureTunnel]:
    """The proxy with :func:`secure_setup`'s policy and a CONNECT + TLS tunnel (SNI
    ``SECURE``, the gateway CA trusted, ``alpn`` offered) to the ``secure`` upstream; the
    tunnel, then the proxy, are closed at the end."""
    policies, dns, authority = secure_setup(secure)
    async with kit.run(config(secure.port), policies, dns) as running:
        context = kit.client_context(alpn=alpn)
        tls = await tls_tunnel(running.port(), authority, context, sni=SECURE)
        async with tls:
            yield SecureTunnel(running, policies, authority, tls)


async def test_c5_intercepted_request_carries_the_credential(kit: Kit, secure: Upstream) -> None:
    policies, dns, authority = secure_setup(secure)
    async with kit.run(config(secure.port), policies, dns) as running:
        response = await fetch(kit, running.port(), "https", authority, "/headers")
    assert response.status == 200
    assert [seen.headers.get("authorization") for seen in secure.seen] == [
        f"Bearer {SECRET_1.decode()}"
    ]
    assert running.sink.decisions() == ["allow"]
    assert running.events[0].detail == f"mode=connect+inject port={secure.port}"
    assert_no_secret(response, SECRET_1)


async def test_c5_sni_naming_another_host_fails_the_handshake(kit: Kit, secure: Upstream) -> None:
    policies, dns, authority = secure_setup(secure)
    async with kit.run(config(secure.port), policies, dns) as running:
        with pytest.raises(trio.BrokenResourceError) as failure:
            await tls_tunnel(running.port(), authority, kit.client_context(), sni=OTHER)
        assert isinstance(failure.value.__cause__, ssl.SSLError)
        await wait_until(lambda: running.sink.of("deny_mismatch"))
    [event] = running.sink.of("deny_mismatch")
    assert event.host == SECURE
    assert secure.seen == []


@pytest.mark.parametrize(
    ("target", "host"),
    [
        ("/headers", "{other}"),
        ("/headers", OTHER),
        ("/headers", "{wrong_port}"),
        ("https://{other}/headers", "{secure}"),
        ("https://{secure}/headers", "{other}"),
        ("http://{secure}/headers", "{secure}"),  # inside TLS the scheme must be https
        ("https://user@{secure}/headers", "{secure}"),
        ("*", "{secure}"),
    ],
)
async def test_c5_inner_request_for_another_authority_is_421(
    kit: Kit, secure: Upstream, target: str, host: str
) -> None:
    names = {
        "secure": f"{SECURE}:{secure.port}",
        "other": f"{OTHER}:{secure.port}",
        "wrong_port": f"{SECURE}:{secure.port + 1}",
    }
    target, host = target.format(**names), host.format(**names)
    async with secure_tunnel(kit, secure) as tunnel:
        response = await exchange(tunnel.tls, request_bytes("GET", target, host=host))
    assert (response.status, response.egress) == (421, "deny_mismatch")
    assert tunnel.running.sink.decisions() == ["allow", "deny_mismatch"]
    assert secure.seen == []


async def test_c5_inner_absolute_form_for_the_tunnel_target_is_forwarded(
    kit: Kit, secure: Upstream
) -> None:
    async with secure_tunnel(kit, secure) as tunnel:
        authority = tunnel.authority
        data = request_bytes("GET", f"https://{authority}/abs?q=1", host=authority)
        response = await exchange(tunnel.tls, data)
    assert response.status == 200
    assert [seen.path for seen in secure.seen] == ["/abs?q=1"]


async def test_c5_only_http11_is_negotiated(kit: Kit, secure: Upstream) -> None:
    async with secure_tunnel(kit, secure, alpn=["h2", "http/1.1"]) as tunnel:
        assert tunnel.tls.selected_alpn_protocol() == "http/1.1"
        # HTTP/2 prior knowledge anyway: refused, nothing reaches the upstream.
        await tunnel.tls.send_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        response = await read_response(tunnel.tls)
    assert response.status in (0, 400, 421)  # refused one way or another
    assert secure.seen == []


async def test_c5_connect_host_header_does_not_select_the_credential(
    kit: Kit, secure: Upstream
) -> None:
    policies, dns, authority = secure_setup(secure)
    assert secure.ca_file is not None
    upstream_trust = ssl.create_default_context(cafile=str(secure.ca_file))
    async with kit.run(config(secure.port), policies, dns) as running:
        # CONNECT to a host without a credential, claiming the credential host in Host:
        # the tunnel is spliced, the client talks TLS to the upstream itself.
        response, tcp = await connect(running.port(), f"{OTHER}:{secure.port}", host=authority)
        assert response.status == 200
        tls = trio.SSLStream(tcp, upstream_trust, server_hostname=SECURE)
        async with tls:
            data = request_bytes("GET", "/headers", [("Connection", "close")], host=authority)
            reply = await exchange(tls, data)
    assert reply.status == 200
    [seen] = secure.seen
    assert "authorization" not in seen.headers
    assert all(SECRET_1.decode() not in v for _, v in seen.raw_headers)
    assert SECRET_1 not in reply.body
    assert [(e.host, e.decision, e.detail) for e in running.events] == [
        (OTHER, "allow", f"mode=connect port={secure.port}")
    ]


async def test_c5_a_second_authority_on_the_same_tunnel_is_refused(
    kit: Kit, secure: Upstream
) -> None:
    async with secure_tunnel(kit, secure) as tunnel:
        tls = tunnel.tls
        first = await exchange(tls, request_bytes("GET", "/one", host=tunnel.authority))
        second = await exchange(tls, request_bytes("GET", "/two", host=f"{OTHER}:{secure.port}"))
        assert await read_until_closed(tls) == b""
    assert first.status == 200
    assert (second.status, second.egress) == (421, "deny_mismatch")
    assert [seen.path for seen in secure.seen] == ["/one"]


async def test_c5_an_unverified_upstream_never_gets_the_credential(
    kit: Kit, secure: Upstream
) -> None:
    # OTHER takes the credential but is served by an upstream whose certificate names SECURE.
    dns = FakeDNS().answer(OTHER, "127.0.0.1")
    policies = Policies({IDENTITY_1: lookup(credential_hosts=[OTHER], secret=SECRET_1)})
    authority = f"{OTHER}:{secure.port}"
    async with kit.run(config(secure.port), policies, dns) as running:
        tls = await tls_tunnel(running.port(), authority, kit.client_context(), sni=OTHER)
        async with tls:
            response = await exchange(tls, request_bytes("GET", "/headers", host=authority))
    assert (response.status, response.egress) == (502, "upstream")
    assert secure.seen == []


# -- C6: attribution by listener, never by header ----------------------------------------


@pytest.mark.parametrize("scheme", ["https", "http"])
async def test_c6_each_sandbox_carries_only_its_owner_credential(
    kit: Kit, plain: Upstream, secure: Upstream, scheme: str
) -> None:
    upstream, host = (secure, SECURE) if scheme == "https" else (plain, API)
    authority = f"{host}:{upstream.port}"
    dns = FakeDNS().answer(host, "127.0.0.1")
    policies = Policies(
        {
            IDENTITY_1: lookup(credential_hosts=[host], secret=SECRET_1),
            IDENTITY_2: lookup(credential_hosts=[host], secret=SECRET_2),
        }
    )
    spoof = (
        ("X-Svcgate-User", "1"),
        ("X-Svcgate-Profile", "one"),
        ("Proxy-Authorization", "Basic dXNlcjE6cGFzcw=="),
    )
    identities = (IDENTITY_1, IDENTITY_2)
    async with (
        kit.run(config(upstream.port), policies, dns, identities) as running,
        trio.open_nursery() as nursery,
    ):
        for r in range(3):  # concurrently, both sandboxes at once
            one, two = running.port(IDENTITY_1), running.port(IDENTITY_2)
            nursery.start_soon(fetch, kit, one, scheme, authority, f"/headers?u=1&r={r}")
            nursery.start_soon(
                fetch, kit, two, scheme, authority, f"/headers?u=2&r={r}", spoof, spoof
            )
    assert len(upstream.seen) == 6
    for seen in upstream.seen:
        values = [v for _, v in seen.raw_headers]
        if "u=1" in seen.path:
            assert seen.headers["authorization"] == f"Bearer {SECRET_1.decode()}"
            assert all(SECRET_2.decode() not in v for v in values)
        else:
            assert seen.headers["authorization"] == f"Bearer {SECRET_2.decode()}"
            assert all(SECRET_1.decode() not in v for v in values)
            assert "proxy-authorization" not in seen.headers
            # An ordinary header, forwarded as such; it attributes nothing.
            assert seen.headers["x-svcgate-user"] == "1"
    by_user = {(e.user_id, e.profile_id) for e in running.events}
    assert by_user == {(1, 11), (2, 22)}
    assert running.sink.decisions() == ["allow"] * 6


# -- C7: redirects are passed back, never followed --------------------------------------------


@pytest.mark.parametrize("scheme", ["https", "http"])
async def test_c7_redirect_goes_back_to_the_sandbox_and_the_next_hop_is_judged_afresh(
    kit: Kit, plain: Upstream, secure: Upstream, listener: Target, scheme: str
) -> None:
    upstream, host = (secure, SECURE) if scheme == "https" else (plain, API)
    dns = FakeDNS().answer(host, "127.0.0.1").answer(ATTACKER, "127.0.0.1")
    policies = Policies({IDENTITY_1: lookup(credential_hosts=[host], secret=SECRET_1)})
    location = f"http://{ATTACKER}:{listener.port}/collect"
    async with kit.run(config(upstream.port, listener.port), policies, dns) as running:
        port = running.port()
        response = await fetch(
            kit, port, scheme, f"{host}:{upstream.port}", f"/redirect?to={location}"
        )
        assert response.status == 302
        assert response.header("location") == location.encode()
        assert await listener.untouched()
        follow = await http_get(port, location)
        assert (follow.status, follow.egress) == (403, "deny_host")
        tunnel = await probe("connect", port, f"{ATTACKER}:{listener.port}")
        assert (tunnel.status, tunnel.egress) == (403, "deny_host")
    assert await listener.untouched()
    assert ATTACKER not in dns.lookups
    assert running.sink.decisions(ATTACKER) == ["deny_host", "deny_host"]


async def test_c7_a_credential_never_travels_in_cleartext_to_a_public_address(
    kit: Kit, listener: Target
) -> None:
    # A redirect to the http:// form of a credential host: judged afresh, refused before
    # any dial because the address is not an operator carve-out.
    dns = FakeDNS().answer(SECURE, "1.1.1.1")
    policies = Policies({IDENTITY_1: lookup(credential_hosts=[SECURE], secret=SECRET_1)})
    cfg = config(listener.port, carve_out=("127.0.0.1/32",), connect_timeout=0.5)
    async with kit.run(cfg, policies, dns) as running:
        response = await http_get(running.port(), f"http://{SECURE}:{listener.port}/")
    assert (response.status, response.egress) == (403, "deny_cleartext")
    assert running.sink.decisions() == ["deny_cleartext"]


# -- C8: reflected secrets are redacted ----------------------------------------------------


async def test_c8_reflected_credential_is_redacted_in_headers_and_body(
    kit: Kit, secure: Upstream
) -> None:
    policies, dns, authority = secure_setup(secure)
    async with kit.run(config(secure.port), policies, dns) as running:
        response = await fetch(kit, running.port(), "https", authority, "/headers")
    assert response.status == 200
    stars = "*" * len(SECRET_1)
    assert response.header("x-echo-auth") == f"Bearer {stars}".encode()
    reflected = {k.lower(): v for k, v in json.loads(response.body)["headers"].items()}
    assert reflected["authorization"] == f"Bearer {stars}"
    assert response.header("content-length") == str(len(response.body)).encode()
    assert_no_secret(response, SECRET_1)
    assert secure.seen[0].headers["authorization"] == f"Bearer {SECRET_1.decode()}"


async def test_c8_encoded_reflections_are_redacted(kit: Kit) -> None:
    with encoding_upstream() as upstream:
        dns = FakeDNS().answer(API, "127.0.0.1")
        policies = Policies({IDENTITY_1: lookup(credential_hosts=[API], secret=SECRET_1)})
        async with kit.run(config(upstream.port), policies, dns) as running:
            response = await http_get(running.port(), f"http://{API}:{upstream.port}/enc")
    assert upstream.seen == [f"Bearer {SECRET_1.decode()}"]
    assert response.status == 200
    assert_no_secret(response, SECRET_1)
    values = json.loads(response.body)
    assert values["raw"] == "*" * len(SECRET_1)
    assert response.header("x-raw") == b"*" * len(SECRET_1)
    for key in ("basic", "basic_urlsafe", "quoted", "json"):
        assert "*" in values[key], key


async def test_c8_reflected_credential_in_the_reason_phrase_is_redacted(kit: Kit) -> None:
    with encoding_upstream() as upstream:
        dns = FakeDNS().answer(API, "127.0.0.1")
        policies = Policies({IDENTITY_1: lookup(credential_hosts=[API], secret=SECRET_1)})
        async with kit.run(config(upstream.port), policies, dns) as running:
            response = await http_get(running.port(), f"http://{API}:{upstream.port}/reason")
    assert response.status == 200
    assert response.reason == b"OK " + b"*" * len(SECRET_1)


# -- C9: header smuggling and framing ------------------------------------------------------


def plain_credential_setup(
    plain: Upstream, secret: bytes = SECRET_1, inject_header: str | None = None
) -> tuple[Policies, FakeDNS, str]:
    dns = FakeDNS().answer(API, "127.0.0.1")
    policies = Policies(
        {IDENTITY_1: lookup(credential_hosts=[API], secret=secret, inject_header=inject_header)}
    )
    return policies, dns, f"{API}:{plain.port}"


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_c9_client_authorization_is_overwritten_and_proxy_headers_stripped(
    kit: Kit, plain: Upstream, secure: Upstream, scheme: str
) -> None:
    upstream, host = (secure, SECURE) if scheme == "https" else (plain, API)
    dns = FakeDNS().answer(host, "127.0.0.1")
    policies = Policies({IDENTITY_1: lookup(credential_hosts=[host], secret=SECRET_1)})
    headers = (
        ("Authorization", "Bearer fake"),
        ("authorization", "Basic Zm9vOmJhcg=="),
        ("Proxy-Authorization", "Basic eDp5"),
        ("Proxy-Connection", "keep-alive"),
        ("Connection", "x-drop-me"),
        ("X-Drop-Me", "hop-by-hop"),
    )
    async with kit.run(config(upstream.port), policies, dns) as running:
        response = await fetch(
            kit, running.port(), scheme, f"{host}:{upstream.port}", "/headers", headers
        )
    assert response.status == 200
    [seen] = upstream.seen
    names = [k.lower() for k, _ in seen.raw_headers]
    assert [v for k, v in seen.raw_headers if k.lower() == "authorization"] == [
        f"Bearer {SECRET_1.decode()}"
    ]
    assert not [n for n in names if n.startswith("proxy-")]
    assert "x-drop-me" not in names


async def test_c9_custom_injection_header_is_overwritten(kit: Kit, plain: Upstream) -> None:
    policies, dns, authority = plain_credential_setup(plain, inject_header="X-Api-Key")
    headers = (("x-api-key", "fake"), ("X-API-KEY", "fake2"), ("Authorization", "Bearer mine"))
    async with kit.run(config(plain.port), policies, dns) as running:
        response = await http_get(running.port(), f"http://{authority}/headers", headers)
    assert response.status == 200
    [seen] = plain.seen
    assert [v for k, v in seen.raw_headers if k.lower() == "x-api-key"] == [SECRET_1.decode()]
    # Not the injection header: the client's own value travels untouched.
    assert seen.headers["authorization"] == "Bearer mine"


TE, CL, CHUNKED_END = "Transfer-Encoding", "Content-Length", b"0\r\n\r\n"
H = "Host: {a}|"  # "{a}": the authority of the request URI; "|" separates header lines
H2C = "Connection: Upgrade, HTTP2-Settings|Upgrade: h2c|HTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA"
# id: (method, header lines, body, status); status 400 is deny_request, 403 deny_mismatch.
# fmt: off
SMUGGLING: dict[str, tuple[str, str, bytes, int]] = {
    "duplicate-host": ("GET", H + "Host: {a}", b"", 400),
    "te-and-cl": ("POST", H + f"{TE}: chunked|{CL}: 4", CHUNKED_END, 400),
    "cl-and-te": ("POST", H + f"{CL}: 4|{TE}: chunked", CHUNKED_END, 400),
    "cr-in-value": ("GET", H + "X-A: a\rX-B: b", b"", 400),
    "nul-in-value": ("GET", H + "X-A: a\x00b", b"", 400),
    "line-without-colon": ("GET", H + "X-A: a|Injected", b"", 400),
    "space-before-colon": ("GET", "Host : {a}", b"", 400),
    "get-with-body": ("GET", H + f"{CL}: 5", b"hello", 400),
    "get-chunked": ("GET", H + f"{TE}: chunked", CHUNKED_END, 400),
    "head-with-body": ("HEAD", H + f"{CL}: 2", b"hi", 400),
    "te-gzip-chunked": ("POST", H + f"{TE}: gzip, chunked", CHUNKED_END, 400),
    "te-chunked-twice": ("POST", H + f"{TE}: chunked|{TE}: chunked", CHUNKED_END, 400),
    "te-obfuscated": ("POST", H + f"{TE}: xchunked", CHUNKED_END, 400),
    "cl-list": ("POST", H + f"{CL}: 2, 3", b"hi", 400),
    "upgrade": ("GET", H + "Connection: Upgrade|Upgrade: websocket", b"", 400),
    "h2c": ("GET", H + H2C, b"", 400),
    "host-differs": ("GET", f"Host: {OTHER}", b"", 403),
    "host-port-differs": ("GET", f"Host: {API}:1", b"", 403),
}
# fmt: on


def smuggle(start: str, authority: str, lines: str, body: bytes) -> bytes:
    head = [start.format(a=authority), *lines.format(a=authority).split("|")]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


@pytest.mark.parametrize(
    ("method", "lines", "body", "status"), list(SMUGGLING.values()), ids=list(SMUGGLING)
)
async def test_c9_ambiguous_or_smuggled_requests_are_refused(
    kit: Kit, plain: Upstream, method: str, lines: str, body: bytes, status: int
) -> None:
    decision = {400: "deny_request", 403: "deny_mismatch"}[status]
    policies, dns, authority = plain_credential_setup(plain)
    data = smuggle(f"{method} http://{{a}}/s HTTP/1.1", authority, lines, body)
    async with kit.run(config(plain.port), policies, dns) as running:
        response = await send_raw(running.port(), data, method=method.encode())
        # The proxy is still serving afterwards.
        after = await http_get(running.port(), f"http://{authority}/after")
    if method == "HEAD":
        assert response.status in (0, status)  # h11 sends no body to a HEAD: may just close
    else:
        assert (response.status, response.egress) == (status, decision)
    assert decision in running.sink.decisions()
    assert after.status == 200
    assert [seen.path for seen in plain.seen] == ["/after"]


TUNNEL_CASES = ["duplicate-host", "te-and-cl", "get-with-body", "te-gzip-chunked", "upgrade"]


@pytest.mark.parametrize(
    ("start", "lines", "body", "status"),
    [
        *((f"{SMUGGLING[c][0]} /s HTTP/1.1", *SMUGGLING[c][1:]) for c in TUNNEL_CASES),
        ("GET /s HTTP/1.1", f"Host: {OTHER}", b"", 421),
        ("GET /s HTTP/1.0", "X-No-Host: 1", b"", 421),  # HTTP/1.0 may omit Host; not here
    ],
    ids=[*TUNNEL_CASES, "host-differs", "no-host"],
)
async def test_c9_smuggling_inside_an_intercepted_tunnel_is_refused(
    kit: Kit, secure: Upstream, start: str, lines: str, body: bytes, status: int
) -> None:
    decision = {400: "deny_request", 421: "deny_mismatch"}[status]
    async with secure_tunnel(kit, secure) as tunnel:
        response = await exchange(tunnel.tls, smuggle(start, tunnel.authority, lines, body))
    assert (response.status, response.egress) == (status, decision)
    assert tunnel.running.sink.decisions() == ["allow", decision]
    assert secure.seen == []


async def test_c9_connect_with_a_body_gets_no_tunnel(kit: Kit, plain: Upstream) -> None:
    dns = FakeDNS().answer(API, "127.0.0.1")
    policies = Policies({IDENTITY_1: lookup([API])})
    authority = f"{API}:{plain.port}"
    inner = request_bytes("GET", "/smuggled", host=authority)
    data = request_bytes("CONNECT", authority, [("Content-Length", str(len(inner)))]) + inner
    async with kit.run(config(plain.port), policies, dns) as running:
        response = await send_raw(running.port(), data, method=b"CONNECT")
    assert (response.status, response.egress) == (400, "deny_request")
    assert running.sink.decisions() == ["deny_request"]
    assert plain.connections == 0


async def test_c9_a_secret_with_crlf_cannot_smuggle_a_header(kit: Kit, plain: Upstream) -> None:
    policies, dns, authority = plain_credential_setup(plain, secret=b"abc\r\nX-Evil: 1")
    async with kit.run(config(plain.port), policies, dns) as running:
        response = await http_get(running.port(), f"http://{authority}/headers")
    assert response.status == 502
    assert plain.seen == []


async def test_c9_placeholder_is_replaced_only_toward_the_credential_host(
    kit: Kit, plain: Upstream
) -> None:
    dns = FakeDNS().answer(API, "127.0.0.1").answer(OTHER, "127.0.0.1")
    policies = Policies(
        {
            IDENTITY_1: lookup(
                [OTHER], credential_hosts=[API], secret=SECRET_1, placeholder="PLACEHOLDER-1"
            )
        }
    )
    headers = (("X-Token", "PLACEHOLDER-1"), ("Authorization", "token PLACEHOLDER-1"))
    async with kit.run(config(plain.port), policies, dns) as running:
        port = running.port()
        to_api = await http_get(port, f"http://{API}:{plain.port}/a", headers)
        to_other = await http_get(port, f"http://{OTHER}:{plain.port}/b", headers)
    assert to_api.status == to_other.status == 200
    seen = {s.path: s.headers for s in plain.seen}
    assert seen["/a"]["x-token"] == SECRET_1.decode()
    assert seen["/a"]["authorization"] == f"token {SECRET_1.decode()}"
    assert seen["/b"]["x-token"] == "PLACEHOLDER-1"
    assert seen["/b"]["authorization"] == "token PLACEHOLDER-1"


# Fuzzing (Hypothesis; Atheris is not installed): mutated raw requests into a live proxy.

OK_HOST = "ok.example.test"
STATUS_LINE = re.compile(rb"HTTP/1\.1 [1-5][0-9]{2} [^\r\n]*\r\n")
TOKENS = [
    b"\r\n", b"\n", b"\r", b" ", b"\t", b":", b",", b"\x00", b"0", b"5", b"chunked",
    b"Transfer-Encoding: chunked\r\n", b"Content-Length: 5\r\n", b"Content-Length: 0\r\n",
    b"Host: evil.test\r\n", b"Upgrade: websocket\r\n", b"Expect: 100-continue\r\n",
    b"127.0.0.1", b"evil.test", b"[::1]", b"@", b"%", b"http://", b"https://", b"CONNECT ",
    b"GET ", b"HTTP/1.0", b"\xff", b"0x7f000001", b"Proxy-Authorization: x\r\n",
]  # fmt: skip


def fuzz_seeds(ok_port: int, trap_port: int) -> list[bytes]:
    ok, bad = f"{OK_HOST}:{ok_port}", f"evil.test:{trap_port}"
    return [
        request_bytes("GET", f"http://{ok}/headers"),
        request_bytes("POST", f"http://{ok}/p", [("Content-Length", "3")], b"abc"),
        request_bytes(
            "POST", f"http://{ok}/c", [("Transfer-Encoding", "chunked")], b"3\r\nabc\r\n0\r\n\r\n"
        ),
        request_bytes("CONNECT", ok, host=ok) + request_bytes("GET", "/in", host=ok),
        request_bytes("GET", f"http://{bad}/"),
        request_bytes("CONNECT", f"127.0.0.1:{trap_port}", host="x"),
        request_bytes("GET", f"http://{ok}/", host=bad),
        request_bytes(
            "GET", f"http://{ok}/", [("Content-Length", "4"), ("Transfer-Encoding", "chunked")]
        )
        + b"0\r\n\r\nGET http://"
        + bad.encode()
        + b"/ HTTP/1.1\r\n\r\n",
        request_bytes("GET", f"http://{ok}/a") + request_bytes("GET", f"http://{bad}/b"),
    ]


@st.composite
def raw_requests(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=300))
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["insert", "delete", "duplicate", "replace"]))
        at = draw(st.integers(0, len(data)))
        if op == "insert":
            data[at:at] = draw(st.sampled_from(TOKENS) | st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 16))]
        elif op == "duplicate":
            data[at:at] = data[at : at + draw(st.integers(1, 40))]
        elif at < len(data):
            data[at] = draw(st.integers(0, 255))
    return bytes(data)


async def test_c9_fuzzed_raw_requests_never_crash_escape_or_garble(
    kit: Kit, plain: Upstream
) -> None:
    with trap() as forbidden:
        dns = FakeDNS(fallback="127.0.0.1")
        policies = Policies({IDENTITY_1: lookup([OK_HOST])})
        cfg = config(plain.port, forbidden.port, idle_timeout=0.3, connect_timeout=1.0)
        seeds = fuzz_seeds(plain.port, forbidden.port)
        async with kit.run(cfg, policies, dns) as running:
            port = running.port()

            async def attempt(data: bytes) -> None:
                async with await open_client(port) as stream:
                    try:
                        await stream.send_all(data)
                        await stream.send_eof()
                    except trio.BrokenResourceError:
                        pass
                    out = await read_until_closed(stream)
                assert out == b"" or STATUS_LINE.match(out), out[:200]
                assert forbidden.count() == 0
                assert set(dns.lookups) <= {OK_HOST}
                alive = await http_get(port, f"http://{OK_HOST}:{plain.port}/alive")
                assert alive.status == 200

            @settings(
                max_examples=100,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(data=raw_requests(seeds))
            def fuzz(data: bytes) -> None:
                trio.from_thread.run(attempt, data)

            await trio.to_thread.run_sync(fuzz)
        assert forbidden.count() == 0
    assert {e.decision for e in running.events} <= {
        "allow", "deny_host", "deny_ip_literal", "deny_request", "deny_mismatch", "deny_port",
        "deny_resolve",
    }  # fmt: skip


# -- C11: fail closed ------------------------------------------------------------------------


async def test_c11_no_rules_and_no_credential_deny_everything(kit: Kit, listener: Target) -> None:
    dns = FakeDNS(fallback="127.0.0.1")
    async with kit.run(config(listener.port), Policies({}), dns) as running:
        port = running.port()
        for mode in ("http", "connect"):
            for host in (API, "example.com", "localhost"):
                response = await probe(mode, port, f"{host}:{listener.port}")
                assert (response.status, response.egress) == (403, "deny_host")
            literal = await probe(mode, port, f"127.0.0.1:{listener.port}")
            assert (literal.status, literal.egress) == (403, "deny_ip_literal")
    assert dns.lookups == []
    assert await listener.untouched()


async def test_c11_credential_with_no_allowed_hosts_allows_nothing(
    kit: Kit, listener: Target
) -> None:
    dns = FakeDNS(fallback="127.0.0.1")
    policies = Policies({IDENTITY_1: lookup(credential_hosts=[], secret=SECRET_1)})
    async with kit.run(config(listener.port), policies, dns) as running:
        for mode in ("http", "connect"):
            response = await probe(mode, running.port(), f"{API}:{listener.port}")
            assert (response.status, response.egress) == (403, "deny_host")
    assert dns.lookups == []
    assert await listener.untouched()


async def test_c11_failing_policy_source_denies_and_the_proxy_keeps_serving(
    kit: Kit, plain: Upstream
) -> None:
    dns = FakeDNS().answer(API, "127.0.0.1")
    policies = Policies({IDENTITY_1: RuntimeError("store unavailable"), IDENTITY_2: lookup([API])})
    url = f"http://{API}:{plain.port}/x"
    async with kit.run(config(plain.port), policies, dns, (IDENTITY_1, IDENTITY_2)) as running:
        for mode in ("http", "connect"):
            response = await probe(mode, running.port(), f"{API}:{plain.port}")
            assert (response.status, response.egress) == (403, "deny_host")
        assert (await http_get(running.port(IDENTITY_2), url)).status == 200
        # The policy is read per decision: once it is back, the same sandbox is served...
        policies.by_identity[IDENTITY_1] = lookup([API])
        assert (await http_get(running.port(), url)).status == 200
        # ...and a revoked rule applies to the very next request.
        policies.by_identity[IDENTITY_1] = StaticLookup()
        assert (await http_get(running.port(), url)).egress == "deny_host"
    assert [e.detail for e in running.events if e.user_id == 1][:2] == [
        "egress policy unavailable"
    ] * 2
    assert len(plain.seen) == 2


async def test_c11_vault_failure_denies_without_contacting_the_upstream(
    kit: Kit, plain: Upstream
) -> None:
    dns = FakeDNS().answer(API, "127.0.0.1")
    broken = StaticLookup(
        lookup(credential_hosts=[API]).rules,
        lookup(credential_hosts=[API]).credential,
        secret_error=ValueError("tampered"),
    )
    async with kit.run(config(plain.port), Policies({IDENTITY_1: broken}), dns) as running:
        response = await http_get(running.port(), f"http://{API}:{plain.port}/x")
    assert (response.status, response.egress) == (403, "credential_error")
    assert plain.connections == 0


async def test_c11_a_revoked_credential_applies_to_the_next_request_in_a_tunnel(
    kit: Kit, secure: Upstream
) -> None:
    async with secure_tunnel(kit, secure) as tunnel:
        tls, authority = tunnel.tls, tunnel.authority
        first = await exchange(tls, request_bytes("GET", "/before", host=authority))
        assert first.status == 200
        # The owner deletes the credential (and the server's rules allow nothing).
        tunnel.policies.by_identity[IDENTITY_1] = StaticLookup()
        second = await exchange(tls, request_bytes("GET", "/after", host=authority))
    injected = {s.path: s.headers.get("authorization") for s in secure.seen}
    assert injected["/before"] == f"Bearer {SECRET_1.decode()}"
    assert second.status != 200 or injected.get("/after") is None


# -- C13: limits and timeouts ----------------------------------------------------------------


async def test_c13_tunnel_limit_answers_429_and_spares_other_sandboxes(
    kit: Kit, plain: Upstream
) -> None:
    dns = FakeDNS().answer(API, "127.0.0.1")
    policies = Policies({IDENTITY_1: lookup([API]), IDENTITY_2: lookup([API])})
    cfg = config(plain.port, max_connections=5)
    authority = f"{API}:{plain.port}"
    async with kit.run(cfg, policies, dns, (IDENTITY_1, IDENTITY_2)) as running:
        state = running.states[IDENTITY_1]
        held: list[trio.SocketStream] = []
        try:
            for _ in range(3):  # idle spliced tunnels
                response, tunnel = await connect(running.port(), authority)
                assert response.status == 200
                held.append(tunnel)
            for _ in range(2):  # idle connections that never send a byte
                held.append(await open_client(running.port()))
            await wait_until(lambda: state.connections == 5)
            for _ in range(10):
                refused = await send_raw(
                    running.port(), request_bytes("GET", f"http://{authority}/")
                )
                assert (refused.status, refused.header("connection")) == (429, b"close")
            # Another sandbox's listener is unaffected, and answers promptly.
            with trio.fail_after(1.0):
                other = await http_get(running.port(IDENTITY_2), f"http://{authority}/other")
            assert other.status == 200
        finally:
            for stream in held:
                await stream.aclose()
        await wait_until(lambda: state.connections == 0)
        assert (await http_get(running.port(), f"http://{authority}/again")).status == 200
    limits = running.sink.of("deny_limit")
    assert 1 <= len(limits) <= 2  # coalesced: at most one audit event a second
    assert limits[0].detail.startswith("connections>5 refused=")
    assert {e.user_id for e in limits} == {1}


async def test_c13_request_rate_limit(kit: Kit, plain: Upstream) -> None:
    dns = FakeDNS().answer(API, "127.0.0.1")
    policies = Policies({IDENTITY_1: lookup([API]), IDENTITY_2: lookup([API])})
    cfg = config(plain.port, rate=5, burst=5)
    url = f"http://{API}:{plain.port}/r"
    async with kit.run(cfg, policies, dns, (IDENTITY_1, IDENTITY_2)) as running:
        statuses = [(await http_get(running.port(), url)).status for _ in range(5)]
        sixth = await http_get(running.port(), url)
        other = await http_get(running.port(IDENTITY_2), url)
    assert statuses == [200] * 5
    assert (sixth.status, sixth.egress) == (429, "deny_limit")
    assert other.status == 200
    [limit] = running.sink.of("deny_limit")
    assert (limit.user_id, limit.host) == (1, API)
    assert len(plain.seen) == 6


async def test_c13_idle_connections_are_closed(kit: Kit, plain: Upstream) -> None:
    dns = FakeDNS().answer(API, "127.0.0.1")
    policies = Policies({IDENTITY_1: lookup([API])})
    cfg = config(plain.port, idle_timeout=0.5)
    authority = f"{API}:{plain.port}"
    async with kit.run(cfg, policies, dns) as running:
        state = running.states[IDENTITY_1]

        async def closed_by_proxy(stream: trio.abc.Stream, sent: bytes = b"") -> float:
            start = trio.current_time()
            async with stream:
                if sent:
                    await stream.send_all(sent)
                out = await read_until_closed(stream, within=3.0)
            assert out == b""
            return trio.current_time() - start

        # Silent from the start; slowloris (half a request head); an idle spliced tunnel.
        assert 0.4 < await closed_by_proxy(await open_client(running.port())) < 2.0
        partial = f"GET http://{authority}/ HTTP/1.1\r\nHost: {authority}\r\nX-Slow: 1"
        assert (
            0.4 < await closed_by_proxy(await open_client(running.port()), partial.encode()) < 2.0
        )
        response, tunnel = await connect(running.port(), authority)
        assert response.status == 200
        assert 0.4 < await closed_by_proxy(tunnel) < 2.0
        await wait_until(lambda: state.connections == 0)


async def test_c13_total_duration_bounds_a_trickling_client(kit: Kit) -> None:
    """Slowloris that beats the idle timeout (a byte every 0.2 s) still meets max_duration."""
    cfg = config(idle_timeout=0.5, max_duration=1.0)
    async with kit.run(cfg, Policies({}), FakeDNS()) as running:
        stream = await open_client(running.port())
        start = trio.current_time()
        with trio.fail_after(4.0):
            try:
                for byte in b"GET http://" + b"a" * 200:
                    await stream.send_all(bytes([byte]))
                    await trio.sleep(0.2)
            except trio.BrokenResourceError:
                pass
        elapsed = trio.current_time() - start
        await stream.aclose()
        assert running.states[IDENTITY_1].connections == 0
    assert 0.9 < elapsed < 3.0


async def test_c13_connect_timeout_answers_504(kit: Kit) -> None:
    # In this environment 10.255.255.1 is reachable (connects), so a hang is made locally:
    # a loopback listener whose accept queue is full drops the SYN and the dial waits.
    with full_backlog() as port:
        dns = FakeDNS().answer(API, "127.0.0.1")
        policies = Policies({IDENTITY_1: lookup([API])})
        cfg = config(port, connect_timeout=0.5)
        async with kit.run(cfg, policies, dns) as running:
            start = trio.current_time()
            plain_response = await http_get(running.port(), f"http://{API}:{port}/")
            tunnel_response = await probe("connect", running.port(), f"{API}:{port}")
            elapsed = trio.current_time() - start
    assert (plain_response.status, tunnel_response.status) == (504, 504)
    assert 0.9 < elapsed < 3.0


async def test_c13_slow_upstream_is_cut_by_the_idle_timeout(kit: Kit) -> None:
    with trap() as silent:  # accepts (in the kernel) and never answers
        dns = FakeDNS().answer(API, "127.0.0.1")
        policies = Policies({IDENTITY_1: lookup([API])})
        cfg = config(silent.port, idle_timeout=0.5)
        async with kit.run(cfg, policies, dns) as running:
            start = trio.current_time()
            response = await http_get(running.port(), f"http://{API}:{silent.port}/")
            elapsed = trio.current_time() - start
        assert silent.count() == 1
    assert response.status == 502
    assert 0.4 < elapsed < 3.0


async def test_c13_stalled_tls_handshake_is_bounded(kit: Kit, secure: Upstream) -> None:
    policies, dns, authority = secure_setup(secure)
    cfg = config(secure.port, connect_timeout=0.5)
    async with kit.run(cfg, policies, dns) as running:
        response, tunnel = await connect(running.port(), authority)
        assert response.status == 200
        async with tunnel:  # never sends a ClientHello
            start = trio.current_time()
            assert await read_until_closed(tunnel, within=3.0) == b""
            assert trio.current_time() - start < 2.0
    assert secure.seen == []
