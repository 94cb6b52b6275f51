"""The HTTP front: route precedence, envelopes, body limits, strict JSON, CSRF (B7-B9, B12)."""

from __future__ import annotations

import json
import socket

import httpx2
import pytest
from gateway_support import Gateway, api, login, start_gateway

LEGACY = "legacy-test-token-0123456789"


@pytest.fixture(scope="module")
def admin(gateway: Gateway) -> str:
    return login(gateway, "alice")


@pytest.fixture(scope="module")
def bob_id(gateway: Gateway) -> int:
    with api(gateway, login(gateway, "bob")) as client:
        user_id: int = client.get("/api/me").json()["user"]["id"]
        return user_id


def _is_envelope(response: httpx2.Response, code: str) -> None:
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


def test_unknown_api_route_is_a_404_envelope(gateway: Gateway, admin: str) -> None:
    with api(gateway, admin) as client:
        for path in ("/api/nope", "/api", "/api/auth/nope", "/api/me/extra"):
            response = client.get(path)
            assert response.status_code == 404, path
            _is_envelope(response, "not_found")
            assert response.headers["cache-control"] == "no-store"


def test_wrong_method_is_a_405_envelope(gateway: Gateway, admin: str) -> None:
    with api(gateway, admin) as client:
        for method, path in [
            ("PUT", "/api/me"),
            ("POST", "/api/audit"),
            ("GET", "/api/auth/logout"),
        ]:
            response = client.request(method, path)
            assert response.status_code == 405, (method, path)
            _is_envelope(response, "method_not_allowed")


def test_unauthenticated_unknown_route_is_still_404(gateway: Gateway) -> None:
    with api(gateway, None) as client:
        _is_envelope(client.get("/api/does-not-exist"), "not_found")


def test_control_plane_disabled_without_oidc(tmp_path) -> None:  # type: ignore[no-untyped-def]
    gw = start_gateway(tmp_path, idp=None)
    try:
        with gw.client() as client:
            for path in ("/api/me", "/api/auth/login", "/api/profiles", "/api/x/y"):
                response = client.get(path)
                assert response.status_code == 404
                _is_envelope(response, "control_plane_disabled")
                message = response.json()["error"]["message"]
                for variable in ("SVC_OIDC_ISSUER", "SVC_OIDC_CLIENT_ID", "SVC_OIDC_REDIRECT_URL"):
                    assert variable in message
            # the data plane keeps working
            assert client.get("/mcp").status_code == 401
            authorized = client.post("/mcp", headers={"Authorization": f"Bearer {LEGACY}"})
            assert authorized.status_code != 401
    finally:
        assert gw.stop() == 0


@pytest.mark.parametrize("path", ["/mcp", "/", "/anything/else", "/mcp/"])
def test_legacy_handler_checks_the_legacy_token(gateway: Gateway, path: str) -> None:
    with gateway.client() as client:
        missing = client.post(path)
        wrong = client.post(path, headers={"Authorization": "Bearer nope"})
        query = client.post(path, params={"access_token": LEGACY})
        right = client.post(path, headers={"Authorization": f"Bearer {LEGACY}"})
    for response in (missing, wrong, query):
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
    assert right.status_code != 401


def test_profile_endpoint_is_matched_before_the_legacy_handler(gateway: Gateway) -> None:
    with gateway.client() as client:
        # The legacy token means nothing on a profile endpoint.
        response = client.post("/mcp/p/some-slug", headers={"Authorization": f"Bearer {LEGACY}"})
    assert response.status_code == 401


def test_data_plane_401s_do_not_reveal_whether_a_profile_exists(gateway: Gateway) -> None:
    responses = []
    with gateway.client() as client:
        for path, token in [
            ("/mcp/p/unknown-slug", "svc_garbage"),
            ("/mcp/p/other", None),
            ("/mcp/p/", "svc_x"),
            ("/mcp/p/a/b", "svc_y"),
        ]:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            responses.append(client.post(path, headers=headers))
    first = responses[0]
    for response in responses:
        assert response.status_code == 401
        assert response.content == first.content
        assert response.headers["www-authenticate"] == "Bearer"


def test_api_is_never_served_by_the_legacy_handler(gateway: Gateway) -> None:
    with gateway.client() as client:
        response = client.get("/api/me", headers={"Authorization": f"Bearer {LEGACY}"})
    assert response.status_code == 401
    assert "www-authenticate" not in response.headers


def test_declared_oversized_body_gets_413(gateway: Gateway, admin: str) -> None:
    body = json.dumps({"user_id": 1, "pad": "x" * 70_000})
    with api(gateway, admin) as client:
        response = client.post(
            "/api/admin/impersonate", content=body, headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 413
    _is_envelope(response, "invalid")


def test_chunked_body_over_the_limit_is_refused_without_reading_it_all(
    gateway: Gateway, admin: str
) -> None:
    host, port = gateway.url.removeprefix("http://").split(":")
    head = (
        "POST /api/admin/impersonate HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\n"
        f"Cookie: svc_session={admin}\r\n"
        "Content-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    chunk = b"x" * 16384
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(head)
        response = b""
        try:
            # Up to 10 MiB; the gateway must answer long before that.
            while sent < 10 * 1024 * 1024:
                sock.sendall(framed)
                sent += len(chunk)
                sock.setblocking(False)
                try:
                    response = sock.recv(65536)
                except BlockingIOError:
                    response = b""
                finally:
                    sock.setblocking(True)
                if response:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        if not response:
            sock.settimeout(20)
            try:
                response = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                response = b""
    assert response.startswith(b"HTTP/1.1 413"), response[:200]
    # The server closed the connection long before 10 MiB arrived (what was "sent" includes
    # the kernel's socket buffers on both sides, several MiB on loopback).
    assert sent < 10 * 1024 * 1024


def test_compressed_bodies_are_refused(gateway: Gateway, admin: str) -> None:
    with api(gateway, admin) as client:
        response = client.post(
            "/api/admin/impersonate",
            content=b"\x1f\x8b\x08\x00",
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
    assert response.status_code == 415


@pytest.mark.parametrize(
    "body",
    [
        b'{"user_id": 1, "user_id": 2}',
        b'{"user_id": NaN}',
        b'{"user_id": Infinity}',
        b'{"user_id": 1, "ttl_minutes": "\\ud800"}',
        b'\xef\xbb\xbf{"user_id": 1}',
        b'{"user_id": ' + b"1" * 5000 + b"}",
        b'{"user_id": 1, "ttl_minutes": ' + b"[" * 100_00 + b"]" * 100_00 + b"}",
        b"[1, 2]",
        b'"user_id"',
        b"null",
        b"",
        b"{",
        b'{"user_id": "2"}',
        b'{"user_id": true}',
        b'{"user_id": 2.0}',
        b'{"user_id": 2, "role": "admin"}',
        b'{"user_id": 2, "is_admin": true}',
        b'{"ttl_minutes": 5}',
    ],
)
def test_lenient_or_mass_assigned_bodies_are_400(
    gateway: Gateway, admin: str, bob_id: int, body: bytes
) -> None:
    body = body.replace(b'"user_id": 2', f'"user_id": {bob_id}'.encode())
    with api(gateway, admin) as client:
        response = client.post(
            "/api/admin/impersonate", content=body, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 400, (body[:60], response.text)
        _is_envelope(response, "invalid")
        assert client.get("/api/me").json()["impersonating"] is False


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Content-Type": "text/plain"}, 415),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
        ({"Content-Type": "multipart/form-data; boundary=x"}, 415),
        ({"Content-Type": "application/json", "Origin": "http://evil.example"}, 403),
        ({"Content-Type": "application/json", "Origin": "null"}, 403),
        ({"Content-Type": "application/json", "Origin": "http://127.0.0.1:1"}, 403),
        ({"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, 403),
        ({"Content-Type": "application/json", "Sec-Fetch-Site": "same-site"}, 403),
    ],
)
def test_cross_site_writes_are_refused(
    gateway: Gateway, admin: str, bob_id: int, headers: dict[str, str], status: int
) -> None:
    body = json.dumps({"user_id": bob_id, "ttl_minutes": 5})
    with api(gateway, admin) as client:
        response = client.post("/api/admin/impersonate", content=body, headers=headers)
        assert response.status_code == status, response.text
        _is_envelope(response, "invalid" if status == 415 else "forbidden")
        assert client.get("/api/me").json()["impersonating"] is False


def test_same_origin_browser_write_is_accepted(gateway: Gateway, admin: str, bob_id: int) -> None:
    body = json.dumps({"user_id": bob_id, "ttl_minutes": 5})
    headers = {
        "Content-Type": "application/json; charset=utf-8",
        "Origin": gateway.origin,
        "Sec-Fetch-Site": "same-origin",
    }
    with api(gateway, admin) as client:
        assert (
            client.post("/api/admin/impersonate", content=body, headers=headers).status_code == 204
        )
        assert client.get("/api/me").json()["impersonating"] is True
        stop = client.delete("/api/admin/impersonate", headers={"Origin": gateway.origin})
        assert stop.status_code == 204


def test_cross_site_get_changes_nothing_and_is_answered(gateway: Gateway, admin: str) -> None:
    with api(gateway, admin) as client:
        response = client.get("/api/me", headers={"Origin": "http://evil.example"})
    assert response.status_code == 200
    assert "access-control-allow-origin" not in response.headers
