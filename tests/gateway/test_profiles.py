"""Profiles through HTTP with real sign-in: fields, ownership, bundles, tokens, audit."""

from __future__ import annotations

import httpx2
import pytest
from gateway_support import Gateway, api, login

LEGACY = "legacy-test-token-0123456789"


@pytest.fixture(scope="module")
def sessions(gateway: Gateway) -> dict[str, str]:
    return {name: login(gateway, name) for name in ("alice", "bob", "carol")}


def _create(client: httpx2.Client, slug: str, name: str = "My profile") -> dict:
    response = client.post("/api/profiles", json={"name": name, "slug": slug})
    assert response.status_code == 201, response.text
    body: dict = response.json()
    return body


def _mcp(gateway: Gateway, slug: str, token: str) -> int:
    with gateway.client() as client:
        return client.post(
            f"/mcp/p/{slug}", headers={"Authorization": f"Bearer {token}"}
        ).status_code


def test_create_returns_the_profile_with_its_token_once(
    gateway: Gateway, sessions: dict[str, str]
) -> None:
    with api(gateway, sessions["bob"]) as client:
        created = _create(client, "bob-main", "Bob's tools")
        me = client.get("/api/me").json()["user"]
        assert created["slug"] == "bob-main"
        assert created["name"] == "Bob's tools"
        assert created["user_id"] == me["id"]
        assert created["endpoint"] == "/mcp/p/bob-main"
        assert created["servers"] == []
        assert created["token"].startswith("svc_")
        assert len(created["token"]) >= 4 + 43
        detail = client.get(f"/api/profiles/{created['id']}").json()
        assert "token" not in detail
        assert all("token" not in p for p in client.get("/api/profiles").json())
        assert detail.pop("runtime") == {"state": "cold", "servers": []}
        assert detail == {k: v for k, v in created.items() if k != "token"}
    # the token authenticates on its own endpoint only
    assert _mcp(gateway, "bob-main", created["token"]) != 401
    assert _mcp(gateway, "bob-main", LEGACY) == 401


@pytest.mark.parametrize(
    "body",
    [
        {"name": "x", "slug": "a"},
        {"name": "x", "slug": "-ab"},
        {"name": "x", "slug": "Abc"},
        {"name": "x", "slug": "a_b"},
        {"name": "x", "slug": "a" * 64},
        {"name": "x", "slug": "ab/c"},
        {"name": "", "slug": "valid-slug"},
        {"name": "x" * 129, "slug": "valid-slug"},
        {"name": "x", "slug": 12},
        {"name": "x"},
        {"slug": "valid-slug"},
        {"name": "x", "slug": "valid-slug", "user_id": 1},
        {"name": "x", "slug": "valid-slug", "token": "svc_mine"},
    ],
)
def test_bad_profile_fields_are_400(gateway: Gateway, sessions: dict[str, str], body: dict) -> None:
    with api(gateway, sessions["bob"]) as client:
        response = client.post("/api/profiles", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid"


def test_slug_limits_are_inclusive(gateway: Gateway, sessions: dict[str, str]) -> None:
    with api(gateway, sessions["carol"]) as client:
        _create(client, "c" + "a" * 62, "n" * 128)
        _create(client, "c2", "x")


def test_a_taken_slug_is_409(gateway: Gateway, sessions: dict[str, str]) -> None:
    with api(gateway, sessions["bob"]) as client:
        _create(client, "taken-slug")
    with api(gateway, sessions["carol"]) as client:
        response = client.post("/api/profiles", json={"name": "x", "slug": "taken-slug"})
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "conflict"


def test_other_users_profiles_are_invisible_and_admins_see_all(
    gateway: Gateway, sessions: dict[str, str]
) -> None:
    with api(gateway, sessions["bob"]) as client:
        bobs = _create(client, "bob-private")
    with api(gateway, sessions["carol"]) as client:
        missing = client.get("/api/profiles/999999")
        hidden = client.get(f"/api/profiles/{bobs['id']}")
        assert hidden.status_code == missing.status_code == 404
        assert hidden.content == missing.content
        for method, suffix, body in [
            ("PATCH", "", {"name": "stolen"}),
            ("DELETE", "", None),
            ("PUT", "/servers", {"servers": []}),
            ("POST", "/token", None),
            ("HEAD", "", None),
        ]:
            response = client.request(method, f"/api/profiles/{bobs['id']}{suffix}", json=body)
            assert response.status_code == 404, (method, suffix)
        assert bobs["id"] not in [p["id"] for p in client.get("/api/profiles").json()]
    with api(gateway, sessions["alice"]) as client:
        assert bobs["id"] in [p["id"] for p in client.get("/api/profiles").json()]
        assert client.get(f"/api/profiles/{bobs['id']}").status_code == 200
        renamed = client.patch(f"/api/profiles/{bobs['id']}", json={"name": "by admin"})
        assert renamed.status_code == 200
        assert renamed.json()["name"] == "by admin"
        assert renamed.json()["user_id"] == bobs["user_id"]


def test_the_list_shows_each_profile_as_its_detail_does(
    gateway: Gateway, sessions: dict[str, str]
) -> None:
    with api(gateway, sessions["carol"]) as client:
        _create(client, "carol-one", "Carol’s “tools”")
        second = _create(client, "carol-two")
        client.put(f"/api/profiles/{second['id']}/servers", json={"servers": ["echo"]})
        listed = client.get("/api/profiles")
        assert listed.status_code == 200
        assert listed.headers["content-type"] == "application/json"
        assert listed.headers["cache-control"] == "no-store"
        details = []
        for item in listed.json():
            detail = client.get(f"/api/profiles/{item['id']}").json()
            detail.pop("runtime")
            details.append(detail)
        assert listed.json() == details
        assert [p["id"] for p in details] == sorted(p["id"] for p in details)
        mine = {p["slug"]: p for p in details}
        assert mine["carol-one"]["name"] == "Carol’s “tools”"
        assert mine["carol-two"]["servers"] == ["echo"]


def test_rename(gateway: Gateway, sessions: dict[str, str]) -> None:
    with api(gateway, sessions["bob"]) as client:
        created = _create(client, "rename-me")
        response = client.patch(f"/api/profiles/{created['id']}", json={"name": "New name"})
        assert response.status_code == 200
        assert response.json()["name"] == "New name"
        assert client.patch(f"/api/profiles/{created['id']}", json={"name": ""}).status_code == 400
        bad = client.patch(f"/api/profiles/{created['id']}", json={"name": "x", "slug": "y"})
        assert bad.status_code == 400


def test_bundle_is_replace_all_sorted_and_refuses_unknown_servers(
    gateway: Gateway, sessions: dict[str, str]
) -> None:
    with api(gateway, sessions["bob"]) as client:
        assert [s["name"] for s in client.get("/api/servers").json()] == ["echo"]
        created = _create(client, "bundle")
        url = f"/api/profiles/{created['id']}/servers"
        response = client.put(url, json={"servers": ["echo", "echo"]})
        assert response.status_code == 200
        assert response.json()["servers"] == ["echo"]
        refused = client.put(url, json={"servers": ["echo", "nope"]})
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "invalid"
        assert client.get(f"/api/profiles/{created['id']}").json()["servers"] == ["echo"]
        assert client.put(url, json={"servers": "echo"}).status_code == 400
        assert client.put(url, json={"servers": []}).json()["servers"] == []


def test_rotation_kills_the_old_token_on_the_next_request(
    gateway: Gateway, sessions: dict[str, str]
) -> None:
    with api(gateway, sessions["bob"]) as client:
        created = _create(client, "rotate-me")
        old = created["token"]
        assert _mcp(gateway, "rotate-me", old) != 401
        rotated = client.post(f"/api/profiles/{created['id']}/token")
        assert rotated.status_code == 200
        new = rotated.json()["token"]
        assert new != old
        assert new.startswith("svc_")
    assert _mcp(gateway, "rotate-me", old) == 401
    assert _mcp(gateway, "rotate-me", new) != 401
    assert _mcp(gateway, "bob-main", new) == 401  # another profile's endpoint


def test_delete_cascades_and_kills_the_token(gateway: Gateway, sessions: dict[str, str]) -> None:
    with api(gateway, sessions["bob"]) as client:
        created = _create(client, "delete-me")
        client.put(f"/api/profiles/{created['id']}/servers", json={"servers": ["echo"]})
        assert client.delete(f"/api/profiles/{created['id']}").status_code == 204
        assert client.get(f"/api/profiles/{created['id']}").status_code == 404
        assert client.delete(f"/api/profiles/{created['id']}").status_code == 404
    assert _mcp(gateway, "delete-me", created["token"]) == 401


def test_every_profile_mutation_is_audited(gateway: Gateway, sessions: dict[str, str]) -> None:
    with api(gateway, sessions["carol"]) as client:
        created = _create(client, "audited")
        pid = created["id"]
        client.patch(f"/api/profiles/{pid}", json={"name": "renamed"})
        client.put(f"/api/profiles/{pid}/servers", json={"servers": ["echo"]})
        client.post(f"/api/profiles/{pid}/token")
        client.delete(f"/api/profiles/{pid}")
        events = [
            e
            for e in client.get("/api/audit", params={"limit": 200}).json()["events"]
            if e["profile_id"] == pid
        ]
    assert [e["decision"] for e in events] == [
        "profile_delete",
        "profile_token_rotate",
        "profile_servers",
        "profile_rename",
        "profile_create",
    ]
    for event in events:
        assert event["kind"] == "admin"
        assert "slug=audited" in event["detail"]
        assert created["token"] not in event["detail"]
