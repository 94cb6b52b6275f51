"""Sign-in through the real identity provider: login, callback, session cookie, logout."""

from __future__ import annotations

from http.cookies import SimpleCookie
from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest
from gateway_support import (
    Gateway,
    api,
    authorize,
    begin_login,
    finish_login,
    login,
    start_gateway,
)

from devidp.provider import DevIdP


def _set_cookie(response: httpx2.Response, name: str) -> SimpleCookie | None:
    for value in response.headers.get_list("set-cookie"):
        cookie: SimpleCookie = SimpleCookie()
        cookie.load(value)
        if name in cookie:
            return cookie
    return None


def test_login_redirects_to_the_provider_with_pkce_s256(gateway: Gateway, idp: DevIdP) -> None:
    with gateway.client() as client:
        response = client.get("/api/auth/login")
    assert response.status_code == 302
    location = urlsplit(response.headers["location"])
    assert f"{location.scheme}://{location.netloc}" == idp.issuer
    query = parse_qs(location.query)
    assert query["code_challenge_method"] == ["S256"]
    assert query["response_type"] == ["code"]
    assert "openid" in query["scope"][0].split()
    for name in ("state", "nonce", "code_challenge"):
        assert len(query[name][0]) >= 43
    cookie = _set_cookie(response, "svc_flow")
    assert cookie is not None
    morsel = cookie["svc_flow"]
    assert morsel["httponly"]
    assert morsel["samesite"].lower() == "lax"
    assert int(morsel["max-age"]) == 600
    assert response.headers["cache-control"] == "no-store"


def test_full_sign_in_sets_a_session_and_me_reports_the_user(gateway: Gateway) -> None:
    flow, url = begin_login(gateway)
    result = finish_login(gateway, authorize(url, "bob"), flow)
    assert result.response.status_code == 302
    assert result.response.headers["location"] == "/"
    cookie = _set_cookie(result.response, "svc_session")
    assert cookie is not None
    morsel = cookie["svc_session"]
    assert morsel["httponly"]
    assert morsel["samesite"].lower() == "lax"
    assert morsel["path"] == "/"
    assert not morsel["secure"]  # the public URL is http:// in this test
    assert not morsel["domain"]
    assert int(morsel["max-age"]) == 168 * 3600
    # the flow cookie is cleared
    flow_cookie = _set_cookie(result.response, "svc_flow")
    assert flow_cookie is not None and flow_cookie["svc_flow"].value == ""
    with api(gateway, morsel.value) as client:
        me = client.get("/api/me")
    assert me.status_code == 200
    body = me.json()
    assert body["impersonating"] is False
    assert "real_user" not in body
    assert body["user"]["email"] == "bob@example.test"
    assert body["user"]["display_name"] == "Bob User"
    assert body["user"]["role"] == "user"
    assert set(body["user"]) == {"id", "email", "display_name", "role"}


def test_admin_role_comes_from_the_provider(gateway: Gateway) -> None:
    with api(gateway, login(gateway, "alice")) as client:
        assert client.get("/api/me").json()["user"]["role"] == "admin"


def test_roles_are_refreshed_at_every_login(gateway: Gateway, idp: DevIdP) -> None:
    with api(gateway, login(gateway, "carol")) as client:
        first = client.get("/api/me").json()["user"]
    assert first["role"] == "user"
    httpx2.post(f"{idp.issuer}/_test/users", json={"username": "carol", "roles": ["svc-admin"]})
    try:
        with api(gateway, login(gateway, "carol")) as client:
            second = client.get("/api/me").json()["user"]
        assert second["role"] == "admin"
        assert second["id"] == first["id"]  # same (issuer, subject) -> same user
    finally:
        httpx2.post(f"{idp.issuer}/_test/users", json={"username": "carol", "roles": []})


def test_post_login_redirect_honours_only_local_paths(gateway: Gateway) -> None:
    for candidate, expected in [("/api/me", "/api/me"), ("//evil.example", "/"), ("/\\evil", "/")]:
        flow, url = begin_login(gateway, candidate)
        result = finish_login(gateway, authorize(url, "bob"), flow)
        assert result.response.headers["location"] == expected


def test_logout_deletes_the_session(gateway: Gateway) -> None:
    session = login(gateway, "bob")
    with api(gateway, session) as client:
        response = client.post("/api/auth/logout")
        assert response.status_code == 204
        cleared = _set_cookie(response, "svc_session")
        assert cleared is not None and cleared["svc_session"].value == ""
        # the captured cookie is dead (B6)
        again = client.get("/api/me")
    assert again.status_code == 401
    assert again.json()["error"]["code"] == "unauthenticated"


def test_session_fixation_a_planted_cookie_is_replaced_and_invalidated(gateway: Gateway) -> None:
    planted = login(gateway, "bob")
    flow, url = begin_login(gateway)
    result = finish_login(
        gateway, authorize(url, "bob"), flow, Cookie=f"svc_flow={flow}; svc_session={planted}"
    )
    assert result.response.status_code == 302
    assert result.session and result.session != planted
    with api(gateway, planted) as client:
        assert client.get("/api/me").status_code == 401
    with api(gateway, result.session) as client:
        assert client.get("/api/me").status_code == 200


def test_sessions_expire_after_the_configured_ttl(idp: DevIdP, tmp_path) -> None:  # type: ignore[no-untyped-def]
    gw = start_gateway(tmp_path, idp=idp, extra_env={"SVC_SESSION_TTL": "1m"})
    try:
        flow, url = begin_login(gw)
        result = finish_login(gw, authorize(url, "bob"), flow)
        cookie = _set_cookie(result.response, "svc_session")
        assert cookie is not None and int(cookie["svc_session"]["max-age"]) == 60
    finally:
        assert gw.stop() == 0


def test_https_public_url_sets_secure_cookies(idp: DevIdP, tmp_path) -> None:  # type: ignore[no-untyped-def]
    gw = start_gateway(tmp_path, idp=idp, extra_env={"SVC_PUBLIC_URL": "https://gw.example"})
    try:
        with gw.client() as client:
            response = client.get("/api/auth/login")
        cookie = _set_cookie(response, "svc_flow")
        assert cookie is not None and cookie["svc_flow"]["secure"]
    finally:
        assert gw.stop() == 0


@pytest.mark.parametrize("path", ["/api/me", "/api/users", "/api/audit"])
def test_routes_need_a_session(gateway: Gateway, path: str) -> None:
    with api(gateway, None) as client:
        response = client.get(path)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"
    with api(gateway, "forged-session-value") as client:
        assert client.get(path).status_code == 401
