"""OpenID Connect relying party: discovery, authorization code + PKCE S256, ID token checks.

Resource handling: :class:`OidcClient` borrows an ``httpx2.AsyncClient`` owned by the daemon's
root; it owns only the cached JWKS. :class:`FlowRegistry` keeps consumed flow ids in memory
until their cookie would have expired anyway.

Error handling: every failure on the provider side or in the ID token raises
:class:`OidcError` with a client-safe message (no token material). The ID token is checked
for signature (allow-listed asymmetric algorithms only: ``none`` and HMAC algorithms are
refused, so an HS256 token "signed" with the public key fails), exact issuer, audience
(string or array; ``azp`` must be our client when there are several audiences), expiry,
issued-at and nonce (THREATS.md B2). An unknown ``kid`` triggers at most one JWKS refresh per
:data:`JWKS_REFRESH_INTERVAL`.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx2
import trio
from joserfc import jws, jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from svcgate.flow_cookie import Flow
from svcgate.settings import OidcSettings

DISCOVERY_TIMEOUT = 10.0
REQUEST_TIMEOUT = 10.0
JWKS_REFRESH_INTERVAL = 30.0
CLOCK_LEEWAY = 60.0
ALLOWED_ALGORITHMS = (
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA",
)  # fmt: skip


class OidcError(Exception):
    """Sign-in failed. The message is safe to show and to log."""


@dataclass(frozen=True)
class ProviderMetadata:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    userinfo_endpoint: str | None
    token_auth_methods: tuple[str, ...]

    @classmethod
    def from_document(cls, doc: Mapping[str, Any], expected_issuer: str) -> ProviderMetadata:
        def url(name: str, *, required: bool = True) -> str | None:
            value = doc.get(name)
            if isinstance(value, str) and value.startswith(("https://", "http://")):
                return value
            if required:
                raise OidcError(f"discovery document lacks a valid {name}")
            return None

        issuer = doc.get("issuer")
        if not isinstance(issuer, str) or issuer.rstrip("/") != expected_issuer.rstrip("/"):
            raise OidcError("discovery document issuer does not match SVC_OIDC_ISSUER")
        methods = doc.get("token_endpoint_auth_methods_supported", ["client_secret_basic"])
        return cls(
            issuer=issuer,
            authorization_endpoint=url("authorization_endpoint") or "",
            token_endpoint=url("token_endpoint") or "",
            jwks_uri=url("jwks_uri") or "",
            userinfo_endpoint=url("userinfo_endpoint", required=False),
            token_auth_methods=tuple(m for m in methods if isinstance(m, str)),
        )


@dataclass(frozen=True)
class Identity:
    issuer: str
    subject: str
    email: str
    display_name: str
    claims: Mapping[str, Any]


async def _get_json(http: httpx2.AsyncClient, url: str, **kwargs: Any) -> Any:
    try:
        response = await http.get(url, **kwargs)
    except httpx2.HTTPError as exc:
        raise OidcError(f"identity provider unreachable ({type(exc).__name__})") from exc
    if response.status_code != 200:
        raise OidcError(f"identity provider answered {response.status_code} for {url}")
    try:
        return response.json()
    except ValueError as exc:
        raise OidcError(f"identity provider sent invalid JSON for {url}") from exc


def check_claims(
    claims: Mapping[str, Any], *, issuer: str, client_id: str, nonce: str, now: float
) -> None:
    """Validate ID token claims (pure). Raises :class:`OidcError`."""
    if claims.get("iss") != issuer:
        raise OidcError("ID token issuer mismatch")
    aud = claims.get("aud")
    audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if client_id not in audiences:
        raise OidcError("ID token audience does not include this client")
    azp = claims.get("azp")
    if len(audiences) > 1 and azp != client_id:
        raise OidcError("ID token has several audiences and azp is not this client")
    if azp is not None and azp != client_id:
        raise OidcError("ID token azp is not this client")
    exp = claims.get("exp")
    if not isinstance(exp, (int, float)) or isinstance(exp, bool) or exp + CLOCK_LEEWAY < now:
        raise OidcError("ID token expired")
    iat = claims.get("iat")
    if not isinstance(iat, (int, float)) or isinstance(iat, bool) or iat - CLOCK_LEEWAY > now:
        raise OidcError("ID token issued in the future")
    token_nonce = claims.get("nonce")
    if not isinstance(token_nonce, str) or not hmac.compare_digest(
        token_nonce.encode(), nonce.encode()
    ):
        raise OidcError("ID token nonce mismatch")
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub or len(sub) > 255:
        raise OidcError("ID token subject missing")


class OidcClient:
    def __init__(
        self, settings: OidcSettings, metadata: ProviderMetadata, http: httpx2.AsyncClient
    ) -> None:
        self.settings = settings
        self.metadata = metadata
        self._http = http
        self._keys: KeySet | None = None
        self._keys_fetched = 0.0
        self._keys_lock = trio.Lock()

    @classmethod
    async def discover(
        cls, settings: OidcSettings, http: httpx2.AsyncClient, limit: float = DISCOVERY_TIMEOUT
    ) -> OidcClient:
        url = settings.issuer.rstrip("/") + "/.well-known/openid-configuration"
        with trio.move_on_after(limit) as scope:
            doc = await _get_json(http, url)
        if scope.cancelled_caught:
            raise OidcError(f"OIDC discovery at {url} did not complete within {limit:g}s")
        if not isinstance(doc, dict):
            raise OidcError("discovery document is not a JSON object")
        return cls(settings, ProviderMetadata.from_document(doc, settings.issuer), http)

    def authorize_url(self, flow: Flow) -> str:
        query = urlencode(
            {
                "response_type": "code",
                "client_id": self.settings.client_id,
                "redirect_uri": self.settings.redirect_url,
                "scope": "openid email profile",
                "state": flow.state,
                "nonce": flow.nonce,
                "code_challenge": flow.challenge,
                "code_challenge_method": "S256",
            }
        )
        sep = "&" if "?" in self.metadata.authorization_endpoint else "?"
        return f"{self.metadata.authorization_endpoint}{sep}{query}"

    async def _exchange(self, code: str, flow: Flow) -> dict[str, Any]:
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": self.settings.redirect_url,
            "code_verifier": flow.verifier,
            "client_id": self.settings.client_id,
        }
        auth: tuple[str | bytes, str | bytes] | None = None
        secret = self.settings.client_secret
        if secret:
            if "client_secret_basic" in self.metadata.token_auth_methods:
                auth = (self.settings.client_id, secret)
            else:
                form["client_secret"] = secret
        try:
            with trio.fail_after(REQUEST_TIMEOUT):
                response = await self._http.post(
                    self.metadata.token_endpoint,
                    data=form,
                    auth=auth if auth is not None else httpx2.USE_CLIENT_DEFAULT,
                    headers={"Accept": "application/json"},
                )
        except (httpx2.HTTPError, trio.TooSlowError) as exc:
            raise OidcError(f"token endpoint unreachable ({type(exc).__name__})") from exc
        if response.status_code != 200:
            raise OidcError(
                f"token exchange refused by the identity provider ({response.status_code})"
            )
        try:
            body = response.json()
        except ValueError as exc:
            raise OidcError("token endpoint sent invalid JSON") from exc
        if not isinstance(body, dict) or not isinstance(body.get("id_token"), str):
            raise OidcError("token response has no id_token")
        return body

    async def _key_set(self, *, refresh: bool) -> KeySet:
        async with self._keys_lock:
            stale = time.monotonic() - self._keys_fetched >= JWKS_REFRESH_INTERVAL
            if self._keys is None or (refresh and stale):
                with trio.move_on_after(REQUEST_TIMEOUT):
                    doc = await _get_json(self._http, self.metadata.jwks_uri)
                    try:
                        self._keys = KeySet.import_key_set(doc)
                    except (JoseError, ValueError, TypeError, KeyError) as exc:
                        raise OidcError("identity provider JWKS is invalid") from exc
                    self._keys_fetched = time.monotonic()
            if self._keys is None:
                raise OidcError("identity provider JWKS unavailable")
            return self._keys

    async def verify_id_token(self, id_token: str, nonce: str) -> dict[str, Any]:
        try:
            header = jws.extract_compact(id_token.encode("ascii")).protected
        except (JoseError, ValueError, UnicodeEncodeError) as exc:
            raise OidcError("ID token is malformed") from exc
        if header.get("alg") not in ALLOWED_ALGORITHMS:
            raise OidcError("ID token algorithm is not allowed")
        kid = header.get("kid")
        keys = await self._key_set(refresh=False)
        key = _find_key(keys, kid)
        if key is None:
            keys = await self._key_set(refresh=True)
            key = _find_key(keys, kid)
            if key is None:
                raise OidcError("ID token signed by an unknown key")
        try:
            token = jwt.decode(id_token, key, algorithms=list(ALLOWED_ALGORITHMS))
        except (JoseError, ValueError) as exc:
            raise OidcError("ID token signature is invalid") from exc
        claims = dict(token.claims)
        check_claims(
            claims,
            issuer=self.metadata.issuer,
            client_id=self.settings.client_id,
            nonce=nonce,
            now=time.time(),
        )
        return claims

    async def _userinfo(self, access_token: str) -> dict[str, Any]:
        endpoint = self.metadata.userinfo_endpoint
        if endpoint is None:
            return {}
        with trio.move_on_after(REQUEST_TIMEOUT):
            doc = await _get_json(
                self._http, endpoint, headers={"Authorization": f"Bearer {access_token}"}
            )
            return doc if isinstance(doc, dict) else {}
        raise OidcError("userinfo endpoint timed out")

    async def complete(self, code: str, flow: Flow) -> Identity:
        """Exchange the code, verify the ID token and collect the identity claims."""
        tokens = await self._exchange(code, flow)
        claims = await self.verify_id_token(tokens["id_token"], flow.nonce)
        access_token = tokens.get("access_token")
        if isinstance(access_token, str) and access_token:
            extra = await self._userinfo(access_token)
            if extra:
                if extra.get("sub") != claims["sub"]:
                    raise OidcError("userinfo subject does not match the ID token")
                # The signed ID token wins where both carry a claim.
                claims = {**extra, **claims}
        email = claims.get("email")
        name = claims.get("name") or claims.get("preferred_username") or email or ""
        return Identity(
            issuer=self.metadata.issuer,
            subject=claims["sub"],
            email=email if isinstance(email, str) else "",
            display_name=name if isinstance(name, str) else "",
            claims=claims,
        )


def _find_key(keys: KeySet, kid: object) -> Any:
    try:
        if isinstance(kid, str):
            return keys.get_by_kid(kid)
        return keys.keys[0] if len(keys.keys) == 1 else None
    except (ValueError, KeyError, JoseError):
        return None


class FlowRegistry:
    """Consumed flow ids, so a callback cannot be replayed with the same cookie (B1)."""

    def __init__(self) -> None:
        self._used: dict[str, float] = {}

    def consume(self, flow: Flow, *, now: float) -> bool:
        """Mark ``flow`` used; return False if it was used before."""
        for flow_id in [k for k, exp in self._used.items() if exp <= now]:
            del self._used[flow_id]
        if flow.flow_id in self._used:
            return False
        self._used[flow.flow_id] = flow.expires_at
        return True
