"""Credentials through HTTP: validation, metadata-only listing, isolation, no secret leaks."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from gateway_support import Gateway, api, login

from svcgate.host_patterns import HostPatternError, matches, normalize_pattern
from svcgate.vault import Sealed, Vault, VaultError, load_key_file

CANARY = "canary-secret-7f3a9c2e1b"


@pytest.fixture(scope="module")
def sessions(gateway: Gateway) -> dict[str, str]:
    return {name: login(gateway, name) for name in ("alice", "bob", "carol")}


def test_put_list_delete(gateway: Gateway, sessions: dict[str, str]) -> None:
    body = {
        "secret": CANARY,
        "inject_header": "Authorization",
        "inject_format": "Bearer {token}",
        "placeholder": "PLACEHOLDER-TOKEN",
        "allowed_hosts": ["api.github.com", "*.githubusercontent.com", "api.example.com"],
    }
    with api(gateway, sessions["bob"]) as client:
        response = client.put("/api/credentials/github", json=body)
        assert response.status_code == 204
        assert (
            client.put("/api/credentials/not-installed-yet", json={"secret": "x"}).status_code
            == 204
        )
        listed = client.get("/api/credentials").json()
        assert CANARY not in str(listed)
        github = next(item for item in listed if item["server"] == "github")
        assert github["inject_header"] == "Authorization"
        assert github["inject_format"] == "Bearer {token}"
        assert github["placeholder"] == "PLACEHOLDER-TOKEN"
        assert github["allowed_hosts"] == [
            "api.github.com",
            "*.githubusercontent.com",
            "api.example.com",
        ]
        assert "secret" not in github
        assert client.delete("/api/credentials/github").status_code == 204
        assert client.delete("/api/credentials/github").status_code == 204  # idempotent
        assert "github" not in [c["server"] for c in client.get("/api/credentials").json()]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"secret": ""},
        {"secret": 5},
        {"secret": "a\r\nX-Evil: 1"},
        {"secret": "a\x00b"},
        {"secret": "s", "inject_header": "Bad Header"},
        {"secret": "s", "inject_header": "X" * 65},
        {"secret": "s", "inject_header": "X:Y"},
        {"secret": "s", "inject_format": "Bearer"},
        {"secret": "s", "inject_format": "{token}" + "x" * 250},
        {"secret": "s", "placeholder": "short"},
        {"secret": "s", "placeholder": "p" * 257},
        {"secret": "s", "allowed_hosts": ["*"]},
        {"secret": "s", "allowed_hosts": ["*.com"]},
        {"secret": "s", "allowed_hosts": ["*.co.uk"]},
        {"secret": "s", "allowed_hosts": ["a b.com"]},
        {"secret": "s", "allowed_hosts": ["a..b.com"]},
        {"secret": "s", "allowed_hosts": ["*.1.2.3.4"]},
        {"secret": "s", "allowed_hosts": ["x" * 254]},
        {"secret": "s", "allowed_hosts": [f"h{i}.example.com" for i in range(65)]},
        {"secret": "s", "allowed_hosts": "api.github.com"},
        {"secret": "s", "owner": 1},
        {"secret": "s", "allowed_hosts": ["API.example.com"]},
    ],
)
def test_bad_credentials_are_400_and_never_echo_the_secret(
    gateway: Gateway, sessions: dict[str, str], body: dict
) -> None:
    with api(gateway, sessions["bob"]) as client:
        response = client.put("/api/credentials/github", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid"
    if isinstance(body.get("secret"), str) and len(body["secret"]) > 3:
        assert body["secret"] not in response.text


@pytest.mark.parametrize("server", ["Github", "-x", "a" * 65, "a.b", "%2e%2e"])
def test_bad_server_names_are_400(gateway: Gateway, sessions: dict[str, str], server: str) -> None:
    with api(gateway, sessions["bob"]) as client:
        response = client.put(f"/api/credentials/{server}", json={"secret": "s"})
    assert response.status_code in (400, 404)
    if response.status_code == 400:
        assert response.json()["error"]["code"] == "invalid"


def test_credentials_are_per_user(gateway: Gateway, sessions: dict[str, str]) -> None:
    with api(gateway, sessions["bob"]) as client:
        client.put("/api/credentials/shared-name", json={"secret": "bob-secret"})
    with api(gateway, sessions["carol"]) as client:
        assert "shared-name" not in [c["server"] for c in client.get("/api/credentials").json()]
        assert client.delete("/api/credentials/shared-name").status_code == 204
    with api(gateway, sessions["bob"]) as client:
        assert "shared-name" in [c["server"] for c in client.get("/api/credentials").json()]


def test_secrets_exist_only_as_ciphertext(gateway: Gateway, sessions: dict[str, str]) -> None:
    with api(gateway, sessions["carol"]) as client:
        assert client.put("/api/credentials/leakcheck", json={"secret": CANARY}).status_code == 204
        events = client.get("/api/audit", params={"limit": 200}).json()["events"]
    assert any(e["decision"] == "credential_create" and e["server"] == "leakcheck" for e in events)
    assert CANARY not in str(events)
    assert CANARY not in gateway.log_text()
    db = Path(gateway.env["SVC_DATA_DIR"]) / "svcgate.db"
    raw = b"".join(p.read_bytes() for p in db.parent.glob("svcgate.db*"))
    assert CANARY.encode() not in raw


@pytest.mark.parametrize(
    ("pattern", "host", "expected"),
    [
        ("*.example.com", "api.example.com", True),
        ("*.example.com", "a.b.example.com", True),
        ("*.example.com", "example.com", False),
        ("*.example.com", "evil-example.com", False),
        ("*.example.com", "example.com.evil.net", False),
        ("example.com", "example.com", True),
        ("example.com", "api.example.com", False),
        ("*.example.com", "127.0.0.1", False),
        ("10.0.0.1", "10.0.0.1", True),
    ],
)
def test_host_matching(pattern: str, host: str, expected: bool) -> None:
    assert matches(normalize_pattern(pattern), host) is expected


@pytest.mark.parametrize(
    "bad", ["*", "*.com", "*.co.uk", "*.github.io", "-a.com", "a-.com", "*.*.com", "1.2.3"]
)
def test_over_broad_or_malformed_patterns_are_refused(bad: str) -> None:
    with pytest.raises(HostPatternError):
        normalize_pattern(bad)


def test_credential_rows_are_bound_to_their_owner(
    gateway: Gateway, sessions: dict[str, str]
) -> None:
    db = Path(gateway.env["SVC_DATA_DIR"]) / "svcgate.db"
    with api(gateway, sessions["bob"]) as client:
        client.put("/api/credentials/transplant", json={"secret": "bob-only"})
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT user_id, ciphertext, wrapped_dek, kek_version FROM credentials"
            " WHERE server = 'transplant'"
        ).fetchone()
    v = Vault(load_key_file(db.parent / "vault.key", create=False))
    assert v.open(row[0], "transplant", Sealed(row[1], row[2], row[3])) == b"bob-only"
    with pytest.raises(VaultError):
        v.open(row[0] + 1, "transplant", Sealed(row[1], row[2], row[3]))
