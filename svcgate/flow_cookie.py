"""The signed login-flow cookie (pure).

It carries the OIDC ``state``, ``nonce``, PKCE verifier, post-login path and an expiry,
signed with HMAC-SHA256 under a per-process random key: a restart invalidates in-flight
logins (SPEC), and a forged or edited cookie fails verification. Single use is enforced by
the caller (:class:`svcgate.oidc.FlowRegistry`), keyed by the flow id.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import asdict, dataclass

FLOW_COOKIE = "svc_flow"
FLOW_TTL = 600.0


class FlowCookieError(Exception):
    """The cookie is missing, forged, malformed or expired. Message is client-safe."""


@dataclass(frozen=True)
class Flow:
    flow_id: str
    state: str
    nonce: str
    verifier: str
    next_path: str
    expires_at: float

    @classmethod
    def new(cls, *, next_path: str, now: float) -> Flow:
        return cls(
            flow_id=secrets.token_urlsafe(16),
            state=secrets.token_urlsafe(32),
            nonce=secrets.token_urlsafe(32),
            # RFC 7636: 43..128 characters from the unreserved set; token_urlsafe(48) gives 64.
            verifier=secrets.token_urlsafe(48),
            next_path=next_path,
            expires_at=now + FLOW_TTL,
        )

    @property
    def challenge(self) -> str:
        digest = hashlib.sha256(self.verifier.encode("ascii")).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(flow: Flow, key: bytes) -> str:
    payload = _b64(json.dumps(asdict(flow), separators=(",", ":")).encode())
    mac = hmac.new(key, payload.encode("ascii"), hashlib.sha256).digest()
    return f"{payload}.{_b64(mac)}"


def verify(value: str | None, key: bytes, *, now: float) -> Flow:
    if not value:
        raise FlowCookieError("no login flow in progress (flow cookie missing)")
    if len(value) > 4096 or value.count(".") != 1:
        raise FlowCookieError("malformed flow cookie")
    payload, mac_text = value.split(".")
    expected = hmac.new(key, payload.encode("ascii", "replace"), hashlib.sha256).digest()
    try:
        given = _unb64(mac_text)
    except ValueError as exc:
        raise FlowCookieError("malformed flow cookie") from exc
    if not hmac.compare_digest(expected, given):
        raise FlowCookieError("flow cookie signature is invalid")
    try:
        data = json.loads(_unb64(payload))
        flow = Flow(**data)
    except (ValueError, TypeError) as exc:
        raise FlowCookieError("malformed flow cookie") from exc
    if not isinstance(flow.expires_at, (int, float)) or flow.expires_at <= now:
        raise FlowCookieError("login flow expired; start again")
    return flow
