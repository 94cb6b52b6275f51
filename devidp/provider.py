"""devidp: a tiny but real OpenID Connect provider for svcgate's demo and tests.

It is hand-written on purpose. It is a small test and demo provider, and authlib's
server pieces would need a web framework and a storage layer around them; this is
a few hundred lines of stdlib ``http.server`` plus joserfc for the keys and JWTs. It
speaks real OIDC over HTTP: discovery, JWKS, the authorization code flow with PKCE
S256 only, RS256-signed ID tokens and userinfo. So the gateway's OIDC client is
tested for real on loopback. With ``test_hooks`` it can also hand out deliberately
broken ID tokens (see :mod:`devidp.tokens`).

The gateway never imports this package. It is not meant for production: users,
codes and tokens live in memory, and the signing key is regenerated at every start.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from joserfc.jwk import RSAKey

from devidp.handler import IdPServer
from devidp.oauth import (
    OAuthError,
    PageError,
    Params,
    RedirectError,
    one,
    parse_basic,
    with_query,
)
from devidp.tokens import (
    MUTATIONS,
    generate_signing_key,
    is_valid_s256_challenge,
    mint_id_token,
    pkce_s256_matches,
    public_jwks,
)
from devidp.users import DEFAULT_ROLES_CLAIM, DEFAULT_USERS, User, check_unique

__all__ = ["DEFAULT_ROLES_CLAIM", "DEFAULT_USERS", "DevIdP", "User"]

CODE_TTL = 60
ACCESS_TOKEN_TTL = 600
ID_TOKEN_TTL = 300
SCOPES = ("openid", "email", "profile")
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


@dataclass(frozen=True)
class _AuthRequest:
    params: dict[str, str]  # every original parameter, carried by the login form
    redirect_uri: str
    scope: str
    state: str | None
    nonce: str | None
    code_challenge: str
    code_challenge_method: str


@dataclass(frozen=True)
class _CodeGrant:
    request: _AuthRequest
    client_id: str
    username: str
    auth_time: int
    expires_at: float


@dataclass(frozen=True)
class _AccessGrant:
    username: str
    scope: str
    expires_at: float


class DevIdP:
    """The provider. ``start()`` binds and serves in a daemon thread; ``stop()`` ends it."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        client_id: str = "svcgate",
        client_secret: str = "",
        redirect_uris: Iterable[str] = (),
        users: Iterable[User] = DEFAULT_USERS,
        test_hooks: bool = False,
        roles_claim: str = DEFAULT_ROLES_CLAIM,
        log_requests: bool = False,
    ) -> None:
        self.host, self.port = host, port
        self.client_id, self.client_secret = client_id, client_secret
        self.redirect_uris = tuple(redirect_uris)
        self.test_hooks, self.roles_claim, self.log_requests = test_hooks, roles_claim, log_requests
        users = list(users)
        check_unique(users)
        self._users = {u.username: u for u in users}
        self._lock = threading.Lock()
        self._codes: dict[str, _CodeGrant] = {}
        self._access: dict[str, _AccessGrant] = {}
        self._next_mutation: str | None = None
        self._token_requests: list[dict[str, Any]] = []
        self._key: RSAKey | None = None
        self._server: IdPServer | None = None
        self._thread: threading.Thread | None = None
        self._issuer: str | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> str:
        if self._server is not None:
            raise RuntimeError("DevIdP already started")
        self._key = generate_signing_key()
        server = IdPServer((self.host, self.port), self)
        port = int(server.server_address[1])
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._issuer = f"http://{host}:{port}"
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="devidp", daemon=True
        )
        self._thread.start()
        return self._issuer

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=10)

    @property
    def issuer(self) -> str:
        if self._issuer is None:
            raise RuntimeError("DevIdP not started")
        return self._issuer

    def __enter__(self) -> DevIdP:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- test hooks (also callable in-process) -----------------------------------------------

    def set_next_id_token_mutation(self, mutation: str) -> None:
        if mutation not in MUTATIONS:
            raise ValueError(f"unknown mutation {mutation!r}; known: {sorted(MUTATIONS)}")
        with self._lock:
            self._next_mutation = mutation

    def set_user_roles(self, username: str, roles: Iterable[str]) -> User:
        with self._lock:
            user = replace(self._users[username], roles=tuple(roles))
            self._users[username] = user
            return user

    def token_requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self._token_requests]

    # -- protocol ----------------------------------------------------------------------------

    def _signing_key(self) -> RSAKey:
        if self._key is None:
            raise RuntimeError("DevIdP not started")
        return self._key

    def discovery(self) -> dict[str, Any]:
        iss = self.issuer
        return {
            "issuer": iss,
            "authorization_endpoint": f"{iss}/authorize",
            "token_endpoint": f"{iss}/token",
            "userinfo_endpoint": f"{iss}/userinfo",
            "jwks_uri": f"{iss}/jwks",
            "response_types_supported": ["code"],
            "response_modes_supported": ["query"],
            "grant_types_supported": ["authorization_code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": [
                "client_secret_basic",
                "client_secret_post",
                "none",
            ],
            "scopes_supported": list(SCOPES),
            "claims_supported": [
                *("iss", "sub", "aud", "azp", "exp", "iat", "auth_time", "nonce"),
                *("email", "email_verified", "name", "preferred_username", self.roles_claim),
            ],
        }

    def jwks(self) -> dict[str, Any]:
        return public_jwks(self._signing_key())

    def redirect_uri_allowed(self, uri: str) -> bool:
        if self.redirect_uris:
            return uri in self.redirect_uris
        try:
            parts = urlsplit(uri)
        except ValueError:
            return False
        return (
            parts.scheme in ("http", "https")
            and parts.hostname in LOOPBACK_HOSTS
            and not parts.fragment
            and "#" not in uri
        )

    def validate_authorize(self, params: Params) -> _AuthRequest:
        try:
            client_id = one(params, "client_id")
            redirect_uri = one(params, "redirect_uri")
        except ValueError as exc:
            raise PageError(str(exc)) from None
        if client_id is None:
            raise PageError("client_id is missing")
        if client_id != self.client_id:
            raise PageError(f"unknown client_id {client_id!r}")
        if redirect_uri is None:
            raise PageError("redirect_uri is missing")
        if not self.redirect_uri_allowed(redirect_uri):
            raise PageError(f"redirect_uri {redirect_uri!r} is not registered for this client")
        states = params.get("state")
        state = states[0] if states else None

        def fail(description: str) -> RedirectError:
            return RedirectError(redirect_uri, state, description)

        repeated = sorted(k for k, v in params.items() if len(v) > 1)
        if repeated:
            raise fail(f"parameters must not be repeated: {', '.join(repeated)}")
        single = {k: v[0] for k, v in params.items()}
        if single.get("response_type") != "code":
            raise fail("response_type must be 'code'")
        scope = single.get("scope", "")
        if "openid" not in scope.split():
            raise fail("scope must include 'openid'")
        challenge = single.get("code_challenge")
        if not challenge:
            raise fail("code_challenge is required (PKCE)")
        if single.get("code_challenge_method") != "S256":
            raise fail("code_challenge_method must be 'S256'")
        if not is_valid_s256_challenge(challenge):
            raise fail("code_challenge is not a valid S256 challenge")
        return _AuthRequest(
            params=single,
            redirect_uri=redirect_uri,
            scope=scope,
            state=state,
            nonce=single.get("nonce"),
            code_challenge=challenge,
            code_challenge_method="S256",
        )

    def login(self, request: _AuthRequest, username: str, password: str) -> str | None:
        """Check the credentials; on success, the redirect carrying a fresh code."""
        with self._lock:
            user = self._users.get(username)
        if user is None or not hmac.compare_digest(user.password.encode(), password.encode()):
            return None
        now = time.time()
        code = secrets.token_urlsafe(32)
        grant = _CodeGrant(request, self.client_id, user.username, int(now), now + CODE_TTL)
        with self._lock:
            self._codes = {c: g for c, g in self._codes.items() if g.expires_at > now}
            self._codes[code] = grant
        fields = {"code": code}
        if request.state is not None:
            fields["state"] = request.state
        return with_query(request.redirect_uri, fields)

    def token(self, params: Params, authorization: str | None) -> dict[str, Any]:
        record: dict[str, Any] = {"client_auth_method": None, "code_challenge_method": None}
        try:
            response = self._token(params, authorization, record)
        except OAuthError as exc:
            record.update(status=exc.status, error=exc.error)
            raise
        else:
            record.update(status=200, error=None)
            return response
        finally:
            if self.test_hooks:
                with self._lock:
                    self._token_requests.append(record)

    def _token(
        self, params: Params, authorization: str | None, record: dict[str, Any]
    ) -> dict[str, Any]:
        try:
            form = {k: one(params, k) for k in params}
        except ValueError as exc:
            raise OAuthError("invalid_request", str(exc)) from None
        verifier = form.get("code_verifier")
        record.update(
            grant_type=form.get("grant_type"),
            client_id=form.get("client_id"),
            redirect_uri=form.get("redirect_uri"),
            code_present=bool(form.get("code")),
            code_verifier_present=verifier is not None,
            code_verifier_length=len(verifier) if verifier is not None else None,
            client_secret_in_form="client_secret" in form,
            authorization_header=authorization.partition(" ")[0] if authorization else None,
        )
        client_id = self._authenticate_client(form, authorization, record)
        grant_type = form.get("grant_type")
        if not grant_type:
            raise OAuthError("invalid_request", "grant_type is missing")
        if grant_type != "authorization_code":
            raise OAuthError("unsupported_grant_type", f"grant_type {grant_type!r} not supported")
        code, redirect_uri = form.get("code"), form.get("redirect_uri")
        if not code:
            raise OAuthError("invalid_request", "code is missing")
        if not redirect_uri:
            raise OAuthError("invalid_request", "redirect_uri is missing")
        if not verifier:
            raise OAuthError("invalid_request", "code_verifier is missing (PKCE)")
        now = time.time()
        with self._lock:
            grant = self._codes.pop(code, None)  # single use, even if the checks below fail
        if grant is not None:
            record["code_challenge_method"] = grant.request.code_challenge_method
        if grant is None or grant.expires_at <= now:
            raise OAuthError("invalid_grant", "code is invalid, expired or already used")
        if grant.client_id != client_id:
            raise OAuthError("invalid_grant", "code was issued to another client")
        if grant.request.redirect_uri != redirect_uri:
            raise OAuthError("invalid_grant", "redirect_uri does not match the authorize request")
        if not pkce_s256_matches(verifier, grant.request.code_challenge):
            raise OAuthError("invalid_grant", "PKCE verification failed")
        with self._lock:
            user = self._users.get(grant.username)
            mutation, self._next_mutation = self._next_mutation, None
        if user is None:
            raise OAuthError("invalid_grant", "user no longer exists")
        scope = " ".join(s for s in grant.request.scope.split() if s in SCOPES)
        access_token = secrets.token_urlsafe(32)
        with self._lock:
            self._access = {t: g for t, g in self._access.items() if g.expires_at > now}
            self._access[access_token] = _AccessGrant(user.username, scope, now + ACCESS_TOKEN_TTL)
        claims = self._id_token_claims(user, grant, int(now))
        return {
            "access_token": access_token,
            "token_type": "Bearer",
            "expires_in": ACCESS_TOKEN_TTL,
            "id_token": mint_id_token(claims, self._signing_key(), self.client_id, mutation),
            "scope": scope,
        }

    def _authenticate_client(
        self, form: dict[str, str | None], authorization: str | None, record: dict[str, Any]
    ) -> str:
        form_id, form_secret = form.get("client_id"), form.get("client_secret")
        client_id: str | None
        secret: str | None
        if authorization:
            client_id, secret = parse_basic(authorization)
            record.update(client_auth_method="client_secret_basic", client_id=client_id)
            if form_secret is not None:
                raise OAuthError("invalid_request", "use one client authentication method only")
            if form_id is not None and form_id != client_id:
                raise OAuthError("invalid_request", "client_id differs from the Basic credentials")
        else:
            client_id, secret = form_id, form_secret
            record["client_auth_method"] = "none" if secret is None else "client_secret_post"
        if not client_id:
            raise OAuthError("invalid_client", "client_id is missing", 401)
        if client_id != self.client_id:
            raise OAuthError("invalid_client", "unknown client", 401)
        if self.client_secret:
            if secret is None:
                raise OAuthError("invalid_client", "client authentication is required", 401)
            if not hmac.compare_digest(secret.encode(), self.client_secret.encode()):
                raise OAuthError("invalid_client", "client authentication failed", 401)
        elif secret:
            raise OAuthError("invalid_client", "this client is public and has no secret", 401)
        return client_id

    def _id_token_claims(self, user: User, grant: _CodeGrant, now: int) -> dict[str, Any]:
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": user.sub,
            "aud": self.client_id,
            "azp": self.client_id,
            "exp": now + ID_TOKEN_TTL,
            "iat": now,
            "auth_time": grant.auth_time,
            **self._user_claims(user),
        }
        if grant.request.nonce is not None:
            claims["nonce"] = grant.request.nonce
        return claims

    def _user_claims(self, user: User) -> dict[str, Any]:
        return {
            "sub": user.sub,
            "email": user.email,
            "email_verified": True,
            "name": user.name,
            "preferred_username": user.username,
            self.roles_claim: user.roles_claim_value(),
        }

    def userinfo(self, authorization: str | None) -> dict[str, Any] | None:
        """The claims for a valid bearer token, or None."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        now = time.time()
        with self._lock:
            grant = self._access.get(token.strip())
            user = self._users.get(grant.username) if grant else None
        if grant is None or grant.expires_at <= now or user is None:
            return None
        return self._user_claims(user)

    def demo_users(self) -> list[User]:
        with self._lock:
            return list(self._users.values())
