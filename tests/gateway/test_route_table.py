"""Checks driven by the route table, so routes added later are covered automatically (B11)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import cast

import pytest
from gateway_support import Gateway, api, login

from svcgate.api.app import create_api_app
from svcgate.api.context import Services

SAMPLES = {"int": "1", "default": "sample", "string": "sample", "path": "sample"}


def _routes() -> list[tuple[str, str]]:
    app = create_api_app(cast(Services, object()))
    found = []
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or not rule.rule.startswith("/api"):
            continue
        path = re.sub(
            r"<(?:(\w+)(?:\([^)]*\))?:)?(\w+)>",
            lambda m: SAMPLES.get(m.group(1) or "default", "x"),
            rule.rule,
        )
        for method in sorted(rule.methods or ()):
            found.append((method, path))
    return found


ROUTES = _routes()
UNSAFE = [(m, p) for m, p in ROUTES if m not in ("GET", "HEAD", "OPTIONS")]


def _snapshot(db: Path) -> list[tuple[str, list[tuple]]]:
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return [
            (t, sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr))
            for t in sorted(tables)
            if t not in ("audit", "sqlite_sequence")
        ]


def test_the_route_table_is_not_empty() -> None:
    assert ("GET", "/api/me") in ROUTES
    assert ("DELETE", "/api/admin/impersonate") in UNSAFE


@pytest.mark.parametrize(("method", "path"), UNSAFE)
def test_every_mutation_is_refused_during_view_as(gateway: Gateway, method: str, path: str) -> None:
    session = login(gateway, "alice")
    with api(gateway, login(gateway, "bob")) as client:
        bob_id = client.get("/api/me").json()["user"]["id"]
    db = Path(gateway.env["SVC_DATA_DIR"]) / "svcgate.db"
    with api(gateway, session) as client:
        started = client.post("/api/admin/impersonate", json={"user_id": bob_id, "ttl_minutes": 5})
        assert started.status_code == 204
        try:
            before = _snapshot(db)
            response = client.request(method, path, json={})
            if (method, path) == ("DELETE", "/api/admin/impersonate"):
                assert response.status_code == 204
                return
            assert response.status_code == 403, response.text
            assert response.json()["error"]["code"] == "impersonating"
            assert _snapshot(db) == before
        finally:
            client.delete("/api/admin/impersonate")


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_route_answers_with_the_envelope_or_json(
    gateway: Gateway, method: str, path: str
) -> None:
    with api(gateway, None) as client:
        response = client.request(method, path)
    assert response.status_code < 500
    assert response.headers["cache-control"] == "no-store"
    if response.status_code >= 400 and method != "HEAD":
        assert set(response.json()) == {"error"}


ID_ROUTES = [(m, p) for m, p in ROUTES if "/api/profiles/1" in p and m != "OPTIONS"]


def test_there_are_id_routes() -> None:
    assert len(ID_ROUTES) >= 5


@pytest.mark.parametrize(("method", "path"), ID_ROUTES)
def test_another_users_profile_is_indistinguishable_from_a_missing_one(
    gateway: Gateway, method: str, path: str
) -> None:
    with api(gateway, login(gateway, "bob")) as client:
        slug = f"idor-{method.lower()}-{abs(hash(path)) % 10_000}"
        owned = client.post("/api/profiles", json={"name": "b", "slug": slug}).json()
    body = {"name": "x"} if method == "PATCH" else {"servers": []} if method == "PUT" else None
    with api(gateway, login(gateway, "carol")) as client:
        other = client.request(method, path.replace("/1", f"/{owned['id']}", 1), json=body)
        missing = client.request(method, path.replace("/1", "/987654321", 1), json=body)
    assert other.status_code == missing.status_code == 404
    assert other.content == missing.content
    # Per-response values aside (each response has its own request id), identical headers.
    varying = ("date", "x-request-id")
    assert {k: v for k, v in other.headers.items() if k not in varying} == {
        k: v for k, v in missing.headers.items() if k not in varying
    }
