"""The egress proxy end to end: the repository's echo server's ``fetch`` tool in a real sandbox.

Two users (bob, carol) each store a credential for server ``echo`` bound to two loopback
upstreams reached through the static host map and the loopback carve-out: plain HTTP
(``api.example.test``) and HTTPS (``secure.example.test``, a leaf from a throwaway CA the
gateway trusts through ``SVC_EGRESS_UPSTREAM_CA_FILE``). The upstream must see each owner's
own secret; the sandbox (its environment and everything the tool returns) never sees either;
every decision is an ``egress`` audit row.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from data_plane_support import DataPlaneGateway, data_plane_gateway, mcp_client, text_of
from egress_support import sandbox_processes
from gateway_support import api, login
from upstream_support import Listener, Upstream, upstream_server

from devidp.provider import DevIdP
from svcgate.egress.redact import secret_forms

pytestmark = pytest.mark.root

SECRETS = {"bob": "bob-secret-5c1e7a09d3b2f4", "carol": "carol-secret-9a8b7c6d5e4f3a"}


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    ca_dir = tmp_path_factory.mktemp("upstream-ca") / "ca"
    attacker = Listener()
    with (
        upstream_server() as plain,
        upstream_server(tls_name="secure.example.test", ca_dir=ca_dir) as secure,
    ):
        yield {"plain": plain, "secure": secure, "attacker": attacker}
    attacker.close()


@pytest.fixture(scope="module")
def dp(
    idp: DevIdP, tmp_path_factory: pytest.TempPathFactory, upstreams: dict[str, Any]
) -> Iterator[DataPlaneGateway]:
    plain: Upstream = upstreams["plain"]
    secure: Upstream = upstreams["secure"]
    attacker: Listener = upstreams["attacker"]
    hosts = ",".join(
        [
            f"api.example.test=127.0.0.1:{plain.port}",
            f"secure.example.test=127.0.0.1:{secure.port}",
            f"attacker.test=127.0.0.1:{attacker.port}",
        ]
    )
    assert secure.ca_file is not None
    with data_plane_gateway(
        tmp_path_factory.mktemp("egress"),
        idp,
        SVC_EGRESS_ALLOW_CIDRS="127.0.0.0/8",
        SVC_EGRESS_HOSTS=hosts,
        SVC_EGRESS_UPSTREAM_CA_FILE=str(secure.ca_file),
    ) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def profiles(dp: DataPlaneGateway) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for user, secret in SECRETS.items():
        session = dp.user_session if user == "bob" else login(dp.gateway, user)
        with api(dp.gateway, session) as client:
            response = client.put(
                "/api/credentials/echo",
                json={
                    "secret": secret,
                    "allowed_hosts": ["api.example.test", "secure.example.test"],
                },
                headers={"Origin": dp.gateway.origin},
            )
            assert response.status_code == 204, response.text
        out[user] = dp.create_profile(f"egress-{user}", ["echo"], session=session)
    return out


async def fetch(dp: DataPlaneGateway, profile: dict[str, Any], url: str) -> tuple[bool, str]:
    async with mcp_client(dp.endpoint(profile["slug"]), profile["token"]) as client:
        result = await client.call_tool("echo_fetch", {"url": url})
        return bool(result.is_error), text_of(result)


def egress_events(
    dp: DataPlaneGateway,
    *expected: tuple[str, str],
    until: Callable[[list[dict[str, Any]]], bool] = lambda _: True,
    timeout: float = 10.0,
) -> list[dict[str, Any]]:
    """Egress audit events, polled until every expected (host, decision) pair is there.

    Egress decisions are written in batches (every 0.2 s), not with the request.
    """
    deadline = time.monotonic() + timeout
    while True:
        with api(dp.gateway, dp.admin_session) as client:
            response = client.get("/api/audit", params={"limit": 200})
            assert response.status_code == 200
            events = [e for e in response.json()["events"] if e["kind"] == "egress"]
        seen = {(e["host"], e["decision"]) for e in events}
        done = all(pair in seen for pair in expected) and until(events)
        if done or time.monotonic() > deadline:
            return events
        time.sleep(0.1)


def assert_no_secret(text: str) -> None:
    for secret in SECRETS.values():
        for form in secret_forms(secret.encode()):
            assert form.decode("latin-1") not in text


@pytest.mark.parametrize(
    ("scheme", "host", "upstream"),
    [
        ("http", "api.example.test", "plain"),
        ("https", "secure.example.test", "secure"),
    ],
)
async def test_each_owner_secret_reaches_the_upstream_and_never_the_sandbox(
    dp: DataPlaneGateway,
    profiles: dict[str, dict[str, Any]],
    upstreams: dict[str, Any],
    scheme: str,
    host: str,
    upstream: str,
) -> None:
    server: Upstream = upstreams[upstream]
    for user, secret in SECRETS.items():
        server.clear()
        error, text = await fetch(dp, profiles[user], f"{scheme}://{host}/headers")
        assert not error, text
        assert text.startswith("200\n")
        assert [seen.headers.get("authorization") for seen in server.seen] == [f"Bearer {secret}"]
        # The upstream reflected the header: the sandbox got it redacted, same length.
        reflected = {k.lower(): v for k, v in json.loads(text.split("\n", 1)[1])["headers"].items()}
        assert reflected["authorization"] == "Bearer " + "*" * len(secret)
        assert_no_secret(text)
    wanted = {p["id"] for p in profiles.values()}

    def both(events: list[dict[str, Any]]) -> bool:
        return wanted <= {e["profile_id"] for e in events if e["host"] == host}

    events = [e for e in egress_events(dp, until=both) if e["host"] == host]
    assert {e["decision"] for e in events} == {"allow"}
    assert {e["server"] for e in events} == {"echo"}
    assert {e["profile_id"] for e in events} >= {p["id"] for p in profiles.values()}


async def test_denied_hosts_and_addresses_are_refused_and_audited(
    dp: DataPlaneGateway, profiles: dict[str, dict[str, Any]], upstreams: dict[str, Any]
) -> None:
    attacker: Listener = upstreams["attacker"]
    bob = profiles["bob"]
    error, text = await fetch(dp, bob, "http://attacker.test/")
    assert error and "403" in text
    error, text = await fetch(dp, bob, "https://attacker.test/")
    assert error and "403" in text
    error, text = await fetch(dp, bob, f"http://127.0.0.1:{attacker.port}/")
    assert error
    error, text = await fetch(dp, bob, "http://169.254.169.254/latest/meta-data/")
    assert error and "403" in text
    assert attacker.accepted == 0
    decisions = {
        (e["host"], e["decision"])
        for e in egress_events(
            dp, ("attacker.test", "deny_host"), ("169.254.169.254", "deny_ip_literal")
        )
    }
    assert ("attacker.test", "deny_host") in decisions
    assert ("169.254.169.254", "deny_port") not in decisions
    assert any(d[1] == "deny_ip_literal" and d[0] == "169.254.169.254" for d in decisions)


async def test_the_sandbox_environment_has_the_proxy_not_the_secret(
    dp: DataPlaneGateway, profiles: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    """The probe server's env tool shows the sandbox's whole environment."""
    profile = dp.create_profile("egress-env", ["probe"])
    async with mcp_client(dp.endpoint(profile["slug"]), profile["token"]) as client:
        env = json.loads(text_of(await client.call_tool("probe_env", {})))["env"]
    assert env["HTTPS_PROXY"].startswith("http://127.0.0.1:")
    assert env["SSL_CERT_FILE"] == "/svcgate/tls/ca-bundle.pem"
    assert_no_secret(json.dumps(env))


async def test_a_transplanted_ciphertext_is_never_injected(
    dp: DataPlaneGateway, profiles: dict[str, dict[str, Any]], upstreams: dict[str, Any]
) -> None:
    """THREATS E1 end to end: carol's sealed secret copied into bob's row fails to open."""
    db = Path(dp.gateway.env["SVC_DATA_DIR"]) / "svcgate.db"
    server: Upstream = upstreams["plain"]

    def rows() -> dict[str, tuple[bytes, bytes, int]]:
        with sqlite3.connect(db) as conn:
            found = conn.execute(
                "SELECT u.email, c.ciphertext, c.wrapped_dek, c.kek_version FROM credentials c"
                " JOIN users u ON u.id = c.user_id WHERE c.server = 'echo'"
            ).fetchall()
        return {sub: (ct, dek, kek) for sub, ct, dek, kek in found}

    def put(sub: str, sealed: tuple[bytes, bytes, int]) -> None:
        with sqlite3.connect(db) as conn:
            conn.execute(
                "UPDATE credentials SET ciphertext = ?, wrapped_dek = ?, kek_version = ?"
                " WHERE server = 'echo' AND user_id = (SELECT id FROM users WHERE email = ?)",
                (*sealed, sub),
            )

    original = rows()
    assert len(original) == 2
    bob_sub, carol_sub = "bob@example.test", "carol@example.test"
    assert set(original) == {bob_sub, carol_sub}
    put(bob_sub, original[carol_sub])
    try:
        server.clear()
        error, text = await fetch(dp, profiles["bob"], "http://api.example.test/headers")
        assert error and "403" in text and "credential_error" in text
        assert server.seen == []
    finally:
        put(bob_sub, original[bob_sub])
    decisions = [
        (e["host"], e["decision"])
        for e in egress_events(dp, ("api.example.test", "credential_error"))
    ]
    assert ("api.example.test", "credential_error") in decisions
    error, text = await fetch(dp, profiles["bob"], "http://api.example.test/headers")
    assert not error, text


async def test_a_deleted_credential_applies_at_once_and_logs_hold_no_secret(
    dp: DataPlaneGateway, profiles: dict[str, dict[str, Any]]
) -> None:
    session = login(dp.gateway, "carol")
    with api(dp.gateway, session) as client:
        response = client.delete("/api/credentials/echo", headers={"Origin": dp.gateway.origin})
        assert response.status_code == 204
    error, text = await fetch(dp, profiles["carol"], "https://secure.example.test/headers")
    assert error and "403" in text
    assert ("secure.example.test", "deny_host") in {
        (e["host"], e["decision"]) for e in egress_events(dp, ("secure.example.test", "deny_host"))
    }
    assert_no_secret(dp.gateway.log_text())


async def test_a_new_placeholder_restarts_the_owners_sandboxes_a_new_secret_does_not(
    dp: DataPlaneGateway, profiles: dict[str, dict[str, Any]]
) -> None:
    """The legacy server gets its placeholder in SVC_CREDENTIAL (the documented convention)."""
    carol = profiles["carol"]
    session = login(dp.gateway, "carol")

    def put(secret: str, placeholder: str) -> None:
        with api(dp.gateway, session) as client:
            response = client.put(
                "/api/credentials/echo",
                json={"secret": secret, "placeholder": placeholder},
                headers={"Origin": dp.gateway.origin},
            )
            assert response.status_code == 204, response.text

    async def carol_sandboxes() -> dict[int, dict[str, str]]:
        async with mcp_client(dp.endpoint(carol["slug"]), carol["token"]) as client:
            assert text_of(await client.call_tool("echo_echo", {"text": "hi"})) == "hi"
        found = sandbox_processes("echo_server.py", under=dp.gateway.proc.pid)
        return {
            pid: env
            for pid, env in found.items()
            if env.get("SVC_CREDENTIAL", "").startswith("carol-placeholder")
        }

    put("carol-secret-one-7d6c5b4a", "carol-placeholder-1")
    first = await carol_sandboxes()
    assert [env["SVC_CREDENTIAL"] for env in first.values()] == ["carol-placeholder-1"]
    put("carol-secret-two-7d6c5b4a", "carol-placeholder-1")  # the secret alone: no restart
    assert (await carol_sandboxes()).keys() == first.keys()
    put("carol-secret-two-7d6c5b4a", "carol-placeholder-2")
    second = await carol_sandboxes()
    assert [env["SVC_CREDENTIAL"] for env in second.values()] == ["carol-placeholder-2"]
    assert second.keys().isdisjoint(first.keys())
    for env in (*first.values(), *second.values()):
        assert not any("secret" in value for value in env.values())


def test_the_carve_out_and_host_map_are_announced_at_start(dp: DataPlaneGateway) -> None:
    log = dp.gateway.log_text()
    assert "SVC_EGRESS_ALLOW_CIDRS is set" in log and "127.0.0.0/8" in log
    assert "SVC_EGRESS_HOSTS maps" in log and "api.example.test" in log
