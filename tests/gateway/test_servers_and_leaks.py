"""Server catalogue routes, the legacy echo server across restarts, and canary secrets."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from gateway_support import Gateway, api, login, start_gateway

from devidp.provider import DevIdP


def test_server_list_and_admin_only_install(gateway: Gateway) -> None:
    bob, alice = login(gateway, "bob"), login(gateway, "alice")
    with api(gateway, bob) as client:
        listed = client.get("/api/servers").json()
        assert [s["name"] for s in listed] == ["echo"]
        assert set(listed[0]) == {"id", "name"}
        for response in (
            client.post("/api/servers/install", json={"ref": "echo@1.0.0"}),
            client.delete("/api/servers/echo"),
        ):
            assert response.status_code == 403
            assert response.json()["error"]["code"] == "forbidden"
    with api(gateway, alice) as client:
        for response in (
            client.post("/api/servers/install", json={"ref": "github@1.0.0"}),
            client.delete("/api/servers/echo"),
        ):
            assert response.status_code == 501
            assert "registry" in response.json()["error"]["message"]
        assert [s["name"] for s in client.get("/api/servers").json()] == ["echo"]


def test_legacy_echo_server_appears_once_across_restarts(idp: DevIdP, tmp_path: Path) -> None:
    data = tmp_path / "data"
    for _ in range(2):
        gw = start_gateway(tmp_path, idp=idp, data_dir=data)
        try:
            with api(gw, login(gw, "bob")) as client:
                assert [s["name"] for s in client.get("/api/servers").json()] == ["echo"]
        finally:
            assert gw.stop() == 0
    gw = start_gateway(tmp_path, idp=idp, data_dir=data, extra_env={"SVC_ECHO_BIN": ""})
    try:
        with api(gw, login(gw, "bob")) as client:
            # unsetting the variable does not delete the row or its assignments
            assert [s["name"] for s in client.get("/api/servers").json()] == ["echo"]
    finally:
        assert gw.stop() == 0


def test_view_as_sees_the_targets_configuration_but_no_secrets(gateway: Gateway) -> None:
    bob = login(gateway, "bob")
    with api(gateway, bob) as client:
        bob_id = client.get("/api/me").json()["user"]["id"]
        client.put("/api/credentials/viewas", json={"secret": "viewas-canary-secret"})
        created = client.post("/api/profiles", json={"name": "b", "slug": "viewas-prof"}).json()
    with api(gateway, login(gateway, "alice")) as client:
        assert client.post("/api/admin/impersonate", json={"user_id": bob_id}).status_code == 204
        try:
            profiles = client.get("/api/profiles").json()
            assert {p["user_id"] for p in profiles} == {bob_id}
            assert created["id"] in [p["id"] for p in profiles]
            creds = client.get("/api/credentials").json()
            assert "viewas" in [c["server"] for c in creds]
            assert "viewas-canary-secret" not in str(creds)
            assert client.get("/api/audit").json()["events"][0]["user_id"] == bob_id
        finally:
            client.delete("/api/admin/impersonate")


@pytest.mark.parametrize("table_filter", ["all"])
def test_canary_secrets_appear_nowhere_but_ciphertext(gateway: Gateway, table_filter: str) -> None:
    session = login(gateway, "carol")
    canaries = [session, "cred-canary-5e1d0b9a77"]
    with api(gateway, session) as client:
        created = client.post("/api/profiles", json={"name": "c", "slug": "canary-prof"}).json()
        canaries.append(created["token"])
        canaries.append(client.post(f"/api/profiles/{created['id']}/token").json()["token"])
        client.put(
            "/api/credentials/canary", json={"secret": canaries[1], "placeholder": "PLACEHOLDER1"}
        )
        client.put("/api/credentials/canary", json={"secret": canaries[1] + "x"})
        bad = client.put("/api/credentials/canary", json={"secret": canaries[1] + "\n"})
        assert bad.status_code == 400
        assert canaries[1] not in bad.text
        audit_text = client.get("/api/audit", params={"limit": 200}).text
        listing = client.get("/api/profiles").text + client.get("/api/credentials").text
    db_dir = Path(gateway.env["SVC_DATA_DIR"])
    raw_db = b"".join(p.read_bytes() for p in db_dir.glob("svcgate.db*"))
    with sqlite3.connect(db_dir / "svcgate.db") as conn:
        texts = []
        for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            for row in conn.execute(f"SELECT * FROM {table}"):
                texts.extend(str(v) for v in row if isinstance(v, str))
    joined = "\n".join(texts)
    log = gateway.log_text()
    for canary in canaries:
        assert canary not in log
        assert canary not in audit_text
        assert canary not in listing
        assert canary not in joined
        assert canary.encode() not in raw_db
