"""Opaque bearer values and their at-rest form (pure)."""

from __future__ import annotations

import hashlib
import secrets

SESSION_BYTES = 32
PROFILE_TOKEN_PREFIX = "svc_"  # noqa: S105 - a public prefix, not a secret
PROFILE_TOKEN_BYTES = 32


def sha256_hex(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


def new_session_token() -> str:
    return secrets.token_urlsafe(SESSION_BYTES)


def new_profile_token() -> str:
    return PROFILE_TOKEN_PREFIX + secrets.token_urlsafe(PROFILE_TOKEN_BYTES)
