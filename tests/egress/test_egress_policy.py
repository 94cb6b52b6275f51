"""The pure egress policy, header rewriting, host map and settings parsing, table-driven."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from svcgate.egress import policy
from svcgate.egress.addresses import Target, TargetError, parse_authority
from svcgate.egress.audit_sink import EgressEvent, open_audit_sink
from svcgate.egress.config import EgressConfigError, egress_settings_from_env
from svcgate.egress.inject import Injection, forward_request_headers, strip_hop_by_hop
from svcgate.egress.policy import CredentialRule, ServerRules, decide
from svcgate.egress.resolver import HostMapEntry, ResolveError, Resolver, parse_host_map
from svcgate.local_servers import LocalServersError, parse_local_servers
from svcgate.store import open_store

GITHUB = CredentialRule.of(["api.github.com", "*.githubusercontent.com"])
MANIFEST = ServerRules.of(hosts=["pypi.org", "*.pythonhosted.org"], credential_hosts=["api.x.io"])


def target(authority: str) -> Target:
    return parse_authority(authority, default_port=443)


@pytest.mark.parametrize(
    ("authority", "rules", "credential", "expected", "inject"),
    [
        # the credential's hosts: allowed and injected
        ("api.github.com:443", policy.NO_RULES, GITHUB, "allow", True),
        ("API.GitHub.com.:443", policy.NO_RULES, GITHUB, "allow", True),
        ("raw.githubusercontent.com:443", policy.NO_RULES, GITHUB, "allow", True),
        ("githubusercontent.com:443", policy.NO_RULES, GITHUB, "deny_host", False),
        ("evil-githubusercontent.com:443", policy.NO_RULES, GITHUB, "deny_host", False),
        ("api.github.com.evil.net:443", policy.NO_RULES, GITHUB, "deny_host", False),
        # a manifest's egress list: allowed, nothing injected
        ("pypi.org:443", MANIFEST, None, "allow", False),
        ("files.pythonhosted.org:443", MANIFEST, None, "allow", False),
        ("pythonhosted.org:443", MANIFEST, None, "deny_host", False),
        # the manifest's credential hosts need the owner's credential
        ("api.x.io:443", MANIFEST, None, "no_credential", False),
        ("api.x.io:443", MANIFEST, CredentialRule.of([]), "allow", True),
        # the credential does not widen the manifest's list for other hosts
        ("pypi.org:443", MANIFEST, GITHUB, "allow", False),
        # ports
        ("api.github.com:8443", policy.NO_RULES, GITHUB, "deny_port", False),
        ("api.github.com:22", MANIFEST, GITHUB, "deny_port", False),
        # fail closed: no rules at all, an empty credential
        ("example.com:443", policy.NO_RULES, None, "deny_host", False),
        ("example.com:443", policy.NO_RULES, CredentialRule.of([]), "deny_host", False),
        # IP literals: only when named exactly; wildcards never cover them
        ("127.0.0.1:443", policy.NO_RULES, GITHUB, "deny_ip_literal", False),
        ("2130706433:443", policy.NO_RULES, CredentialRule.of(["127.0.0.1"]), "allow", True),
        ("[::1]:443", policy.NO_RULES, GITHUB, "deny_ip_literal", False),
    ],
)
def test_decisions(
    authority: str,
    rules: ServerRules,
    credential: CredentialRule | None,
    expected: str,
    inject: bool,
) -> None:
    decision = decide(target(authority), rules, credential)
    assert (decision.decision, decision.inject) == (expected, inject)
    assert decision.decision in policy.DECISIONS


def test_broken_patterns_are_dropped_never_widened() -> None:
    rule = CredentialRule.of(["*", "*.com", "", "a..b", "*.co.uk", "ok.example"])  # type: ignore[list-item]
    assert rule.allowed_hosts == ("ok.example",)
    assert ServerRules.of(hosts=[None, 5, "x.example"]).hosts == ("x.example",)  # type: ignore[list-item]


@given(st.text(max_size=40), st.integers(1, 65535))
@settings(max_examples=200, deadline=None)
def test_no_rules_never_allow(host: str, port: int) -> None:
    try:
        t = parse_authority(f"{host}:{port}")
    except TargetError:
        return
    assert decide(t, policy.NO_RULES, None, ports=frozenset({port})).decision != "allow"


@pytest.mark.parametrize(
    ("rule", "header"),
    [
        (CredentialRule.of([]), ("Authorization", "Bearer {token}")),
        (CredentialRule.of([], inject_header="X-Api-Key"), ("X-Api-Key", "{token}")),
        (CredentialRule.of([], inject_header="authorization"), ("authorization", "Bearer {token}")),
        (CredentialRule.of([], "X-Api-Key", "Key {token}"), ("X-Api-Key", "Key {token}")),
        (CredentialRule.of([], placeholder="PLACEHOLDER1"), None),
        (CredentialRule.of([], "X-T", "t={token}", "PLACEHOLDER1"), ("X-T", "t={token}")),
    ],
)
def test_injection_header_defaults(rule: CredentialRule, header: tuple[str, str] | None) -> None:
    assert rule.injection_header() == header


def test_injection_overwrites_strips_and_substitutes() -> None:
    injection = Injection.build(b"s3cr3t", ("Authorization", "Bearer {token}"), "PH-12345678")
    headers = [
        (b"host", b"api.github.com"),
        (b"authorization", b"Bearer fake"),
        (b"authorization", b"Bearer second"),
        (b"proxy-authorization", b"Basic x"),
        (b"proxy-connection", b"keep-alive"),
        (b"connection", b"x-hop, keep-alive"),
        (b"x-hop", b"1"),
        (b"keep-alive", b"timeout=5"),
        (b"upgrade", b"h2c"),
        (b"x-token", b"token PH-12345678 and PH-12345678"),
        (b"accept-encoding", b"gzip"),
        (b"content-length", b"3"),
    ]
    out = forward_request_headers(headers, injection)
    assert out == [
        (b"host", b"api.github.com"),
        (b"x-token", b"token s3cr3t and s3cr3t"),
        (b"content-length", b"3"),
        (b"authorization", b"Bearer s3cr3t"),
        (b"accept-encoding", b"identity"),
    ]
    assert forward_request_headers(headers, None)[-2:] == [
        (b"accept-encoding", b"gzip"),
        (b"content-length", b"3"),
    ]
    assert strip_hop_by_hop([(b"te", b"trailers"), (b"a", b"b")]) == [(b"a", b"b")]
    assert "s3cr3t" not in repr(injection)


def test_host_map_parsing() -> None:
    parsed = parse_host_map(
        " api.github.com=127.0.0.1:8443, Internal.Example.=10.0.0.5 ,v6.example=[::1]:99,"
    )
    assert parsed == {
        "api.github.com": HostMapEntry(ipaddress.ip_address("127.0.0.1"), 8443),
        "internal.example": HostMapEntry(ipaddress.ip_address("10.0.0.5"), None),
        "v6.example": HostMapEntry(ipaddress.ip_address("::1"), 99),
    }
    for bad in (
        "x",
        "=1.2.3.4",
        "a.example=",
        "a.example=host",
        "1.2.3.4=5.6.7.8",
        "a.example=1.2.3.4:0",
        "a.example=1.2.3.4:99999",
        "a.example=[::1]x",
    ):
        with pytest.raises(ValueError, match="entry"):
            parse_host_map(bad)


async def test_resolver_uses_the_map_then_one_lookup() -> None:
    calls: list[str] = []

    async def lookup(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        calls.append(host)
        if host == "nx.example":
            raise ResolveError("nx.example does not resolve")
        return [ipaddress.ip_address("93.184.216.34")]

    resolver = Resolver(parse_host_map("mapped.example=10.0.0.1:81"), lookup=lookup)
    assert await resolver.resolve("mapped.example", 443) == [(ipaddress.ip_address("10.0.0.1"), 81)]
    assert await resolver.resolve("dns.example", 443) == [
        (ipaddress.ip_address("93.184.216.34"), 443)
    ]
    with pytest.raises(ResolveError):
        await resolver.resolve("nx.example", 443)
    assert calls == ["dns.example", "nx.example"]


def test_settings_defaults_and_errors() -> None:
    default = egress_settings_from_env({})
    assert default.ports == frozenset({80, 443})
    assert default.allow_networks == ()
    assert default.host_map == {}
    assert (default.max_connections, default.rate) == (64, 20.0)
    parsed = egress_settings_from_env(
        {
            "SVC_EGRESS_PORTS": "443, 8443",
            "SVC_EGRESS_ALLOW_CIDRS": "127.0.0.0/8,10.1.0.0/16",
            "SVC_EGRESS_HOSTS": "api.github.com=127.0.0.1:9443",
            "SVC_EGRESS_IDLE_TIMEOUT": "5s",
            "SVC_EGRESS_RATE": "100",
        }
    )
    assert parsed.ports == frozenset({443, 8443})
    assert [str(n) for n in parsed.allow_networks] == ["127.0.0.0/8", "10.1.0.0/16"]
    assert parsed.idle_timeout == 5.0
    for variable, value in [
        ("SVC_EGRESS_PORTS", "http"),
        ("SVC_EGRESS_PORTS", "0"),
        ("SVC_EGRESS_PORTS", ","),
        ("SVC_EGRESS_ALLOW_CIDRS", "10.0.0.0/33"),
        ("SVC_EGRESS_ALLOW_CIDRS", "not-a-net"),
        ("SVC_EGRESS_HOSTS", "nope"),
        ("SVC_EGRESS_UPSTREAM_CA_FILE", "/nonexistent/ca.pem"),
        ("SVC_EGRESS_MAX_CONNECTIONS", "0"),
        ("SVC_EGRESS_RATE", "-1"),
        ("SVC_EGRESS_IDLE_TIMEOUT", "soon"),
    ]:
        with pytest.raises(EgressConfigError) as info:
            egress_settings_from_env({variable: value})
        assert info.value.variable == variable


def test_servers_file_egress_fields() -> None:
    servers = parse_local_servers(
        b'{"servers": {"gh": {"command": ["/usr/bin/node"], "egress": ["Pypi.org."],'
        b' "credential_hosts": ["api.github.com"],'
        b' "credential_env": "GITHUB_PERSONAL_ACCESS_TOKEN"}}}'
    )
    gh = servers["gh"]
    assert gh.egress == ("pypi.org",)
    assert gh.credential_hosts == ("api.github.com",)
    assert gh.credential_env == "GITHUB_PERSONAL_ACCESS_TOKEN"
    for body in [
        '"egress": ["*.com"]',
        '"egress": "pypi.org"',
        '"credential_env": "1BAD"',
        '"credential_env": "HTTPS_PROXY"',
        '"env": {"SSL_CERT_FILE": "/x"}',
        '"env": {"NODE_USE_ENV_PROXY": "0"}',
        '"env": {"T": "x"}, "credential_env": "T"',
    ]:
        with pytest.raises(LocalServersError):
            parse_local_servers(
                f'{{"servers": {{"gh": {{"command": ["/usr/bin/node"], {body}}}}}}}'.encode()
            )


async def test_audit_sink_batches_and_loses_nothing_at_shutdown(tmp_path: Path) -> None:
    async with open_store(tmp_path / "db.sqlite") as store:
        async with open_audit_sink(store) as sink:
            for i in range(1234):
                sink.record(EgressEvent(1, 2, "echo", f"h{i}.example", "allow", "mode=http"))
            # The flusher may or may not have run: either way, nothing is lost.
            await trio.lowlevel.checkpoint()
        rows = await store.read(
            lambda conn: conn.execute(
                "SELECT kind, user_id, profile_id, server, host, decision FROM audit ORDER BY id"
            ).fetchall()
        )
    assert len(rows) == 1234
    assert tuple(rows[0]) == ("egress", 1, 2, "echo", "h0.example", "allow")
    assert [r[4] for r in rows] == [f"h{i}.example" for i in range(1234)]


def test_decision_names_are_documented() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "egress.md").read_text()
    for name in policy.DECISIONS:
        assert f"`{name}`" in doc
    assert len(set(policy.DECISIONS)) == len(policy.DECISIONS)
    assert policy.DECISIONS[0] == "allow"
