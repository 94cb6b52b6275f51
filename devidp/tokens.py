"""Signing keys, ID-token minting, deliberate ID-token mutations and the PKCE check.

The mutations exist so the gateway's tests can push every kind of bad ID token
through the real authorization-code flow. Well-formed tokens are signed with
joserfc. The attack tokens (``alg: none`` and HS256 keyed with the RSA public key)
are built by hand here, because joserfc rightly refuses to make them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
from typing import Any

from joserfc import jwt
from joserfc.jwk import RSAKey

MUTATIONS = frozenset(
    {
        "wrong_nonce",
        "wrong_aud",
        "aud_array",
        "aud_array_bad_azp",
        "wrong_iss",
        "expired",
        "alg_none",
        "hs256_pubkey",
        "unknown_kid",
        "bad_signature",
        "no_nonce",
    }
)

#: RFC 7636 section 4.1: code_verifier = 43*128unreserved
_VERIFIER_RE = re.compile(r"[A-Za-z0-9\-._~]{43,128}")
#: BASE64URL-ENCODE(SHA256(verifier)) is always 43 characters with no padding.
_S256_CHALLENGE_RE = re.compile(r"[A-Za-z0-9\-_]{43}")


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def is_valid_verifier(verifier: str) -> bool:
    return _VERIFIER_RE.fullmatch(verifier) is not None


def is_valid_s256_challenge(challenge: str) -> bool:
    return _S256_CHALLENGE_RE.fullmatch(challenge) is not None


def s256_challenge(verifier: str) -> str:
    return b64url(hashlib.sha256(verifier.encode("ascii")).digest())


def pkce_s256_matches(verifier: str, challenge: str) -> bool:
    if not is_valid_verifier(verifier):
        return False
    return hmac.compare_digest(s256_challenge(verifier), challenge)


def generate_signing_key(kid: str | None = None) -> RSAKey:
    """A fresh 2048-bit RSA key for RS256 signatures, with ``kid``, ``use`` and ``alg`` set."""
    kid = kid or "devidp-" + secrets.token_hex(8)
    return RSAKey.generate_key(2048, parameters={"kid": kid, "use": "sig", "alg": "RS256"})


def public_jwks(key: RSAKey) -> dict[str, Any]:
    return {"keys": [dict(key.as_dict(private=False))]}


def sign_rs256(claims: dict[str, Any], key: RSAKey) -> str:
    header = {"alg": "RS256", "kid": key.kid}
    return jwt.encode(header, claims, key, algorithms=["RS256"])


def _compact(header: dict[str, Any], claims: dict[str, Any]) -> str:
    def part(obj: dict[str, Any]) -> str:
        return b64url(json.dumps(obj, separators=(",", ":")).encode("utf-8"))

    return part(header) + "." + part(claims)


def mint_id_token(
    claims: dict[str, Any], key: RSAKey, client_id: str, mutation: str | None = None
) -> str:
    """Sign ``claims`` as an RS256 ID token, first applying the named ``mutation`` if any."""
    if mutation is None:
        return sign_rs256(claims, key)
    if mutation not in MUTATIONS:
        raise ValueError(f"unknown mutation {mutation!r}")
    claims = dict(claims)
    if mutation == "wrong_nonce":
        claims["nonce"] = "wrong-" + secrets.token_urlsafe(12)
    elif mutation == "no_nonce":
        claims.pop("nonce", None)
    elif mutation == "wrong_aud":
        claims["aud"] = "someone-else"
    elif mutation == "aud_array":
        claims["aud"] = [client_id, "other"]
        claims["azp"] = client_id
    elif mutation == "aud_array_bad_azp":
        claims["aud"] = [client_id, "other"]
        claims["azp"] = "other"
    elif mutation == "wrong_iss":
        claims["iss"] = "https://evil.example.test"
    elif mutation == "expired":
        for name in ("iat", "exp", "auth_time"):
            claims[name] = int(claims[name]) - 3600
    elif mutation == "alg_none":
        return _compact({"alg": "none", "typ": "JWT"}, claims) + "."
    elif mutation == "hs256_pubkey":
        signing_input = _compact({"alg": "HS256", "typ": "JWT", "kid": key.kid}, claims)
        secret = key.as_pem(private=False)
        mac = hmac.new(secret, signing_input.encode("ascii"), hashlib.sha256).digest()
        return signing_input + "." + b64url(mac)
    elif mutation == "unknown_kid":
        return sign_rs256(claims, generate_signing_key("unknown-" + secrets.token_hex(8)))
    elif mutation == "bad_signature":
        head, payload, signature = sign_rs256(claims, key).split(".")
        raw = bytearray(b64url_decode(signature))
        raw[-1] ^= 0x01
        return f"{head}.{payload}.{b64url(bytes(raw))}"
    return sign_rs256(claims, key)
