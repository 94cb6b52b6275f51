"""devidp speaks real OIDC over loopback HTTP: discovery, JWKS, code + PKCE, ID tokens, hooks."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest
from joserfc import jwt
from joserfc.errors import BadSignatureError, JoseError
from joserfc.jwk import KeySet, RSAKey

from devidp.provider import DevIdP
from devidp.tokens import MUTATIONS
from devidp.users import DEFAULT_ROLES_CLAIM, User, users_from_json

CLIENT_ID = "svcgate"
REDIRECT_URI = "http://127.0.0.1:8999/auth/callback"
TIMEOUT = 10.0


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def new_verifier() -> str:
    return b64url(os.urandom(32))  # 43 chars of the unreserved set


def challenge_of(verifier: str) -> str:
    return b64url(hashlib.sha256(verifier.encode()).digest())


class _FormParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.form: dict[str, str] = {}
        self.inputs: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form":
            self.form = a
        elif tag == "input":
            self.inputs[a["name"]] = a.get("value", "")


def parse_form(page: str) -> _FormParser:
    parser = _FormParser()
    parser.feed(page)
    return parser


@pytest.fixture
def idp() -> Iterator[DevIdP]:
    with DevIdP(test_hooks=True) as provider:
        yield provider


@pytest.fixture
def client() -> Iterator[httpx2.Client]:
    with httpx2.Client(timeout=TIMEOUT, follow_redirects=False, trust_env=False) as c:
        yield c


def authorize_params(**overrides: str | None) -> dict[str, str]:
    params: dict[str, str | None] = {
        "response_type": "code",
        "client_id": CLIENT_ID,
        "redirect_uri": REDIRECT_URI,
        "scope": "openid email profile",
        "state": "st/ate+ with spaces&=",
        "nonce": "n-0S6_WzA2Mj",
        "code_challenge": challenge_of(new_verifier()),
        "code_challenge_method": "S256",
    }
    params.update(overrides)
    return {k: v for k, v in params.items() if v is not None}


def login(
    client: httpx2.Client,
    issuer: str,
    verifier: str,
    *,
    username: str = "alice",
    password: str = "alice",
    **overrides: str | None,
) -> httpx2.Response:
    """GET /authorize, then submit the login form as a browser would; the POST's response."""
    params = authorize_params(code_challenge=challenge_of(verifier), **overrides)
    page = client.get(f"{issuer}/authorize", params=params)
    assert page.status_code == 200, page.text
    form = parse_form(page.text)
    assert form.form["method"].lower() == "post"
    assert form.form["action"] == "/authorize"
    assert {"username", "password"} <= form.inputs.keys()
    fields = {**form.inputs, "username": username, "password": password}
    return client.post(f"{issuer}{form.form['action']}", data=fields)


def code_from(response: httpx2.Response, redirect_uri: str = REDIRECT_URI) -> str:
    assert response.status_code == 302, response.text
    location = response.headers["location"]
    assert location.startswith(redirect_uri + "?")
    query = parse_qs(urlsplit(location).query, strict_parsing=True)
    assert query["state"] == [authorize_params()["state"]]
    return query["code"][0]


def exchange(
    client: httpx2.Client, issuer: str, code: str, verifier: str, **overrides: str | None
) -> httpx2.Response:
    form: dict[str, str | None] = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": REDIRECT_URI,
        "code_verifier": verifier,
        "client_id": CLIENT_ID,
    }
    form.update(overrides)
    return client.post(f"{issuer}/token", data={k: v for k, v in form.items() if v is not None})


def full_flow(client: httpx2.Client, issuer: str, **login_kw: Any) -> dict[str, Any]:
    verifier = new_verifier()
    code = code_from(login(client, issuer, verifier, **login_kw))
    response = exchange(client, issuer, code, verifier)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def keyset(client: httpx2.Client, issuer: str) -> KeySet:
    return KeySet.import_key_set(client.get(f"{issuer}/jwks").json())


def verified_claims(client: httpx2.Client, issuer: str, id_token: str) -> dict[str, Any]:
    token = jwt.decode(id_token, keyset(client, issuer), algorithms=["RS256"])
    return dict(token.claims)


def unverified(id_token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    head, payload, _ = id_token.split(".")

    def part(text: str) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        return value

    return part(head), part(payload)


def oauth_error(response: httpx2.Response, status: int, error: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["error"] == error
    assert isinstance(body["error_description"], str)


# -- discovery and keys -------------------------------------------------------------------------


def test_discovery_document(idp: DevIdP, client: httpx2.Client) -> None:
    assert urlsplit(idp.issuer).hostname == "127.0.0.1"
    assert not idp.issuer.endswith("/")
    doc = client.get(f"{idp.issuer}/.well-known/openid-configuration").json()
    assert doc["issuer"] == idp.issuer
    assert doc["authorization_endpoint"] == f"{idp.issuer}/authorize"
    assert doc["token_endpoint"] == f"{idp.issuer}/token"
    assert doc["userinfo_endpoint"] == f"{idp.issuer}/userinfo"
    assert doc["jwks_uri"] == f"{idp.issuer}/jwks"
    assert "end_session_endpoint" not in doc
    assert doc["response_types_supported"] == ["code"]
    assert doc["grant_types_supported"] == ["authorization_code"]
    assert doc["subject_types_supported"] == ["public"]
    assert doc["id_token_signing_alg_values_supported"] == ["RS256"]
    assert doc["code_challenge_methods_supported"] == ["S256"]
    assert doc["token_endpoint_auth_methods_supported"] == [
        "client_secret_basic",
        "client_secret_post",
        "none",
    ]
    assert doc["scopes_supported"] == ["openid", "email", "profile"]
    assert {"sub", "nonce", "email", DEFAULT_ROLES_CLAIM} <= set(doc["claims_supported"])


def test_jwks_is_one_public_rsa_signing_key(idp: DevIdP, client: httpx2.Client) -> None:
    jwks = client.get(f"{idp.issuer}/jwks").json()
    [key] = jwks["keys"]
    assert key["kty"] == "RSA"
    assert key["use"] == "sig"
    assert key["alg"] == "RS256"
    assert key["kid"]
    assert "d" not in key
    assert "p" not in key
    assert RSAKey.import_key(key).raw_value.key_size == 2048


def test_unknown_path_and_wrong_method(idp: DevIdP, client: httpx2.Client) -> None:
    assert client.get(f"{idp.issuer}/nope").status_code == 404
    assert client.get(f"{idp.issuer}/").status_code == 404
    response = client.get(f"{idp.issuer}/token")
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"


# -- the code + PKCE flow -------------------------------------------------------------------


def test_full_code_pkce_flow(idp: DevIdP, client: httpx2.Client) -> None:
    verifier = new_verifier()
    params = authorize_params(code_challenge=challenge_of(verifier))
    page = client.get(f"{idp.issuer}/authorize", params=params)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    form = parse_form(page.text)
    for name, value in params.items():  # every original parameter is carried by the form
        assert form.inputs[name] == value
    for demo in ("alice", "bob", "carol"):
        assert demo in page.text

    before = int(time.time())
    code = code_from(login(client, idp.issuer, verifier))
    response = exchange(client, idp.issuer, code, verifier)
    assert response.status_code == 200, response.text
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    assert body["token_type"] == "Bearer"
    assert body["expires_in"] == 600
    assert body["scope"] == "openid email profile"
    assert body["access_token"]

    header, _ = unverified(body["id_token"])
    assert header["alg"] == "RS256"
    assert header["kid"] == client.get(f"{idp.issuer}/jwks").json()["keys"][0]["kid"]
    claims = verified_claims(client, idp.issuer, body["id_token"])
    jwt.JWTClaimsRegistry(
        iss={"essential": True, "value": idp.issuer},
        aud={"essential": True, "value": CLIENT_ID},
        nonce={"essential": True, "value": params["nonce"]},
    ).validate(claims)
    assert claims["sub"] == "user-alice"
    assert claims["aud"] == CLIENT_ID
    assert claims["azp"] == CLIENT_ID
    assert claims["email"] == "alice@example.test"
    assert claims["email_verified"] is True
    assert claims["name"] == "Alice Admin"
    assert claims["preferred_username"] == "alice"
    assert claims[DEFAULT_ROLES_CLAIM] == {"svc-admin": {"270000000000000001": "devidp.localhost"}}
    assert before <= claims["iat"] <= claims["auth_time"] + 1
    assert claims["exp"] == claims["iat"] + 300


def test_user_without_roles_gets_empty_roles_object(idp: DevIdP, client: httpx2.Client) -> None:
    body = full_flow(client, idp.issuer, username="bob", password="bob")
    claims = verified_claims(client, idp.issuer, body["id_token"])
    assert claims["sub"] == "user-bob"
    assert claims[DEFAULT_ROLES_CLAIM] == {}


def test_wrong_password_shows_login_again(idp: DevIdP, client: httpx2.Client) -> None:
    verifier = new_verifier()
    response = login(client, idp.issuer, verifier, password="nope")
    assert response.status_code == 200
    assert "Invalid username or password" in response.text
    assert "location" not in response.headers
    again = parse_form(response.text)
    assert again.inputs["code_challenge"] == challenge_of(verifier)
    unknown = login(client, idp.issuer, verifier, username="mallory", password="x")
    assert unknown.status_code == 200
    assert "Invalid username or password" in unknown.text


def test_wrong_verifier_is_invalid_grant_and_burns_the_code(
    idp: DevIdP, client: httpx2.Client
) -> None:
    verifier = new_verifier()
    code = code_from(login(client, idp.issuer, verifier))
    oauth_error(exchange(client, idp.issuer, code, new_verifier()), 400, "invalid_grant")
    oauth_error(exchange(client, idp.issuer, code, verifier), 400, "invalid_grant")


def test_missing_or_malformed_verifier(idp: DevIdP, client: httpx2.Client) -> None:
    verifier = new_verifier()
    code = code_from(login(client, idp.issuer, verifier))
    oauth_error(
        exchange(client, idp.issuer, code, verifier, code_verifier=None), 400, "invalid_request"
    )
    # a 42-character verifier is outside RFC 7636's 43..128
    oauth_error(exchange(client, idp.issuer, code, verifier[:42]), 400, "invalid_grant")


def test_code_is_single_use(idp: DevIdP, client: httpx2.Client) -> None:
    verifier = new_verifier()
    code = code_from(login(client, idp.issuer, verifier))
    assert exchange(client, idp.issuer, code, verifier).status_code == 200
    oauth_error(exchange(client, idp.issuer, code, verifier), 400, "invalid_grant")


def test_token_redirect_uri_must_match(idp: DevIdP, client: httpx2.Client) -> None:
    verifier = new_verifier()
    code = code_from(login(client, idp.issuer, verifier))
    other = "http://127.0.0.1:8999/other"
    oauth_error(
        exchange(client, idp.issuer, code, verifier, redirect_uri=other), 400, "invalid_grant"
    )


def test_token_request_errors(idp: DevIdP, client: httpx2.Client) -> None:
    verifier = new_verifier()
    code = code_from(login(client, idp.issuer, verifier))
    iss = idp.issuer
    oauth_error(exchange(client, iss, code, verifier, client_id="evil"), 401, "invalid_client")
    oauth_error(exchange(client, iss, code, verifier, client_id=None), 401, "invalid_client")
    oauth_error(exchange(client, iss, code, verifier, client_secret="x"), 401, "invalid_client")
    unsupported = exchange(client, iss, code, verifier, grant_type="password")
    oauth_error(unsupported, 400, "unsupported_grant_type")
    oauth_error(exchange(client, iss, "bogus", verifier), 400, "invalid_grant")
    # none of the above consumed the real code
    assert exchange(client, iss, code, verifier).status_code == 200


def test_plain_or_missing_pkce_is_refused(idp: DevIdP, client: httpx2.Client) -> None:
    verifier = new_verifier()
    cases: list[dict[str, str | None]] = [
        {"code_challenge_method": "plain", "code_challenge": verifier},
        {"code_challenge_method": None},
        {"code_challenge": None},
        {"response_type": "token"},
        {"scope": "email profile"},
    ]
    for overrides in cases:
        params = authorize_params(**overrides)
        response = client.get(f"{idp.issuer}/authorize", params=params)
        assert response.status_code == 302, overrides
        location = response.headers["location"]
        assert location.startswith(REDIRECT_URI + "?")
        query = parse_qs(urlsplit(location).query)
        assert query["error"] == ["invalid_request"]
        assert query["error_description"][0]
        assert query["state"] == [params["state"]]
        assert "code" not in query


def test_bad_client_or_redirect_uri_is_a_400_page(idp: DevIdP, client: httpx2.Client) -> None:
    cases: list[dict[str, str | None]] = [
        {"redirect_uri": "https://evil.example.test/cb"},
        {"redirect_uri": "http://127.0.0.1.evil.example.test/cb"},
        {"redirect_uri": None},
        {"client_id": "someone-else"},
        {"client_id": None},
    ]
    for overrides in cases:
        response = client.get(f"{idp.issuer}/authorize", params=authorize_params(**overrides))
        assert response.status_code == 400, overrides
        assert "location" not in response.headers
        assert response.headers["content-type"].startswith("text/html")


def test_registered_redirect_uris_must_match_exactly(client: httpx2.Client) -> None:
    with DevIdP(redirect_uris=[REDIRECT_URI]) as idp:
        ok = client.get(f"{idp.issuer}/authorize", params=authorize_params())
        assert ok.status_code == 200
        for uri in (
            REDIRECT_URI + "/",
            REDIRECT_URI + "?x=1",
            "http://localhost:8999/auth/callback",
        ):
            bad = client.get(f"{idp.issuer}/authorize", params=authorize_params(redirect_uri=uri))
            assert bad.status_code == 400, uri


def test_loopback_redirect_uris_accepted_when_none_registered(
    idp: DevIdP, client: httpx2.Client
) -> None:
    for uri in ("http://localhost:1/cb", "http://[::1]:5/x", "http://127.0.0.1/"):
        response = client.get(f"{idp.issuer}/authorize", params=authorize_params(redirect_uri=uri))
        assert response.status_code == 200, uri


def test_confidential_client(client: httpx2.Client) -> None:
    with DevIdP(client_secret="s3cret") as idp:
        iss = idp.issuer
        for auth in ("basic", "post", "missing", "wrong"):
            verifier = new_verifier()
            code = code_from(login(client, iss, verifier))
            if auth == "basic":
                basic = "Basic " + base64.b64encode(f"{CLIENT_ID}:s3cret".encode()).decode()
                response = client.post(
                    f"{iss}/token",
                    headers={"Authorization": basic},
                    data={
                        "grant_type": "authorization_code",
                        "code": code,
                        "redirect_uri": REDIRECT_URI,
                        "code_verifier": verifier,
                    },
                )
                assert response.status_code == 200, response.text
            elif auth == "post":
                response = exchange(client, iss, code, verifier, client_secret="s3cret")
                assert response.status_code == 200, response.text
            else:
                secret = None if auth == "missing" else "wrong"
                response = exchange(client, iss, code, verifier, client_secret=secret)
                oauth_error(response, 401, "invalid_client")
                assert response.headers["www-authenticate"].startswith("Basic")


# -- userinfo -------------------------------------------------------------------------------


def test_userinfo(idp: DevIdP, client: httpx2.Client) -> None:
    body = full_flow(client, idp.issuer)
    good = client.get(
        f"{idp.issuer}/userinfo", headers={"Authorization": f"Bearer {body['access_token']}"}
    )
    assert good.status_code == 200
    assert good.json() == {
        "sub": "user-alice",
        "email": "alice@example.test",
        "email_verified": True,
        "name": "Alice Admin",
        "preferred_username": "alice",
        DEFAULT_ROLES_CLAIM: {"svc-admin": {"270000000000000001": "devidp.localhost"}},
    }
    bad = client.get(f"{idp.issuer}/userinfo", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401
    assert bad.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    missing = client.get(f"{idp.issuer}/userinfo")
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"].startswith("Bearer")


# -- test hooks -------------------------------------------------------------------------------


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_id_token_mutations(idp: DevIdP, client: httpx2.Client, mutation: str) -> None:
    hook = client.post(f"{idp.issuer}/_test/next_id_token", json={"mutation": mutation})
    assert hook.status_code == 200, hook.text
    nonce = "nonce-" + mutation
    token = full_flow(client, idp.issuer, nonce=nonce)["id_token"]
    header, claims = unverified(token)
    keys = keyset(client, idp.issuer)
    [jwk] = keys.keys
    now = time.time()

    if mutation in ("alg_none", "hs256_pubkey", "unknown_kid", "bad_signature"):
        with pytest.raises(JoseError):
            jwt.decode(token, keys, algorithms=["RS256"])
        assert claims["nonce"] == nonce
        assert claims["aud"] == CLIENT_ID
    else:  # claim mutations are validly signed
        assert verified_claims(client, idp.issuer, token) == claims

    if mutation == "wrong_nonce":
        assert claims["nonce"] != nonce
    elif mutation == "no_nonce":
        assert "nonce" not in claims
    elif mutation == "wrong_aud":
        assert claims["aud"] == "someone-else"
    elif mutation == "aud_array":
        assert claims["aud"] == [CLIENT_ID, "other"]
        assert claims["azp"] == CLIENT_ID
    elif mutation == "aud_array_bad_azp":
        assert claims["aud"] == [CLIENT_ID, "other"]
        assert claims["azp"] == "other"
    elif mutation == "wrong_iss":
        assert claims["iss"] != idp.issuer
    elif mutation == "expired":
        assert claims["exp"] < now - 3000
        assert claims["iat"] < now - 3500
    elif mutation == "alg_none":
        assert header["alg"] == "none"
        assert token.endswith(".")
    elif mutation == "hs256_pubkey":
        assert header["alg"] == "HS256"
        signing_input, _, signature = token.rpartition(".")
        pem = RSAKey.import_key(jwk.as_dict()).as_pem(private=False)
        expected = hmac.new(pem, signing_input.encode(), hashlib.sha256).digest()
        assert signature == b64url(expected)
    elif mutation == "unknown_kid":
        assert header["alg"] == "RS256"
        assert header["kid"] != jwk.kid
    elif mutation == "bad_signature":
        assert header["kid"] == jwk.kid
        with pytest.raises(BadSignatureError):
            jwt.decode(token, keys, algorithms=["RS256"])
    if mutation not in ("wrong_nonce", "no_nonce", "expired"):
        assert claims.get("nonce", nonce) == nonce

    # one-shot: the next token is normal again
    normal = full_flow(client, idp.issuer, nonce=nonce)["id_token"]
    claims = verified_claims(client, idp.issuer, normal)
    assert claims["nonce"] == nonce
    assert claims["aud"] == CLIENT_ID


def test_unknown_mutation_is_rejected(idp: DevIdP, client: httpx2.Client) -> None:
    response = client.post(f"{idp.issuer}/_test/next_id_token", json={"mutation": "nope"})
    assert response.status_code == 400


def test_roles_hook_changes_next_login(idp: DevIdP, client: httpx2.Client) -> None:
    response = client.post(
        f"{idp.issuer}/_test/users", json={"username": "bob", "roles": ["a", "b"]}
    )
    assert response.status_code == 200
    assert response.json()["roles"] == ["a", "b"]
    claims = verified_claims(
        client,
        idp.issuer,
        full_flow(client, idp.issuer, username="bob", password="bob")["id_token"],
    )
    assert set(claims[DEFAULT_ROLES_CLAIM]) == {"a", "b"}
    client.post(f"{idp.issuer}/_test/users", json={"username": "alice", "roles": []})
    claims = verified_claims(client, idp.issuer, full_flow(client, idp.issuer)["id_token"])
    assert claims[DEFAULT_ROLES_CLAIM] == {}
    missing = client.post(f"{idp.issuer}/_test/users", json={"username": "zed", "roles": []})
    assert missing.status_code == 404


def test_requests_hook_records_token_requests(idp: DevIdP, client: httpx2.Client) -> None:
    assert client.get(f"{idp.issuer}/_test/requests").json() == []
    full_flow(client, idp.issuer)
    [record] = client.get(f"{idp.issuer}/_test/requests").json()
    assert record["code_challenge_method"] == "S256"
    assert record["code_verifier_present"] is True
    assert record["grant_type"] == "authorization_code"
    assert record["client_auth_method"] == "none"
    assert record["status"] == 200
    assert "code_verifier" not in record
    assert "client_secret" not in record


def test_hooks_are_404_without_test_hooks(client: httpx2.Client) -> None:
    with DevIdP() as idp:
        iss = idp.issuer
        assert (
            client.post(f"{iss}/_test/next_id_token", json={"mutation": "alg_none"}).status_code
            == 404
        )
        assert (
            client.post(f"{iss}/_test/users", json={"username": "bob", "roles": []}).status_code
            == 404
        )
        assert client.get(f"{iss}/_test/requests").status_code == 404


def test_users_from_json() -> None:
    users = users_from_json(
        [
            {
                "username": "u",
                "password": "p",
                "sub": "s",
                "email": "e@x",
                "name": "N",
                "roles": ["r"],
            }
        ]
    )
    assert users == [User("u", "p", "s", "e@x", "N", ("r",))]
    with pytest.raises(ValueError, match="roles"):
        users_from_json(
            [
                {
                    "username": "u",
                    "password": "p",
                    "sub": "s",
                    "email": "e",
                    "name": "N",
                    "roles": "r",
                }
            ]
        )
    with pytest.raises(ValueError, match="password"):
        users_from_json([{"username": "u", "sub": "s", "email": "e", "name": "N"}])


# -- the command line -----------------------------------------------------------------------


def _start_cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "devidp", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _issuer_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=30):
            raise AssertionError("devidp printed nothing within 30 s")
    return proc.stdout.readline()


def _stop_cli(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT)


def test_cli_prints_issuer_and_exits_0_on_sigterm(client: httpx2.Client) -> None:
    with _start_cli() as proc:
        try:
            line = _issuer_line(proc)
            assert line.startswith("devidp: issuer http://127.0.0.1:")
            issuer = line.split()[-1]
            assert int(issuer.rsplit(":", 1)[1]) > 0
            doc = client.get(f"{issuer}/.well-known/openid-configuration").json()
            assert doc["issuer"] == issuer
            assert client.get(f"{issuer}/_test/requests").status_code == 404
            assert _stop_cli(proc) == 0
            assert proc.stdout is not None
            assert proc.stdout.read() == ""  # exactly one stdout line
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=TIMEOUT)


def test_cli_options(client: httpx2.Client, tmp_path: Path) -> None:
    users = tmp_path / "users.json"
    users.write_text(
        json.dumps(
            [
                {
                    "username": "dave",
                    "password": "pw",
                    "sub": "user-dave",
                    "email": "dave@example.test",
                    "name": "Dave",
                    "roles": ["ops"],
                }
            ]
        )
    )
    args = ["--users-file", str(users), "--client-id", "gw", "--client-secret", "sec"]
    args += ["--redirect-uri", REDIRECT_URI, "--test-hooks", "--roles-claim", "roles"]
    with _start_cli(*args) as proc:
        try:
            issuer = _issuer_line(proc).split()[-1]
            verifier = new_verifier()
            code = code_from(
                login(client, issuer, verifier, username="dave", password="pw", client_id="gw")
            )
            response = exchange(client, issuer, code, verifier, client_id="gw", client_secret="sec")
            assert response.status_code == 200, response.text
            claims = verified_claims(client, issuer, response.json()["id_token"])
            assert claims["sub"] == "user-dave"
            assert claims["aud"] == "gw"
            assert claims["roles"] == {"ops": {"270000000000000001": "devidp.localhost"}}
            [record] = client.get(f"{issuer}/_test/requests").json()
            assert record["client_auth_method"] == "client_secret_post"
            assert _stop_cli(proc) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=TIMEOUT)
