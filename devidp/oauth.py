"""OAuth 2.0 plumbing shared by the provider and its HTTP handler."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from urllib.parse import unquote, urlencode

Params = dict[str, list[str]]


class OAuthError(Exception):
    """An RFC 6749 section 5.2 error answer of the token endpoint."""

    def __init__(self, error: str, description: str, status: int = 400) -> None:
        super().__init__(description)
        self.error, self.description, self.status = error, description, status


class PageError(Exception):
    """An /authorize error to show as a page (redirect_uri not trusted yet)."""


class RedirectError(Exception):
    """An /authorize error to send back to the (validated) redirect_uri."""

    def __init__(self, redirect_uri: str, state: str | None, description: str) -> None:
        super().__init__(description)
        self.redirect_uri, self.state, self.description = redirect_uri, state, description


def parse_params(pairs: Iterable[tuple[str, str]]) -> Params:
    out: Params = {}
    for key, value in pairs:
        out.setdefault(key, []).append(value)
    return out


def one(params: Params, name: str) -> str | None:
    """The single value of ``name``; ValueError if it is repeated (RFC 6749 section 3.1)."""
    values = params.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise ValueError(f"{name} must not be repeated")
    return values[0]


def with_query(url: str, fields: Mapping[str, str]) -> str:
    return url + ("&" if "?" in url else "?") + urlencode(fields)


def parse_basic(header: str) -> tuple[str, str]:
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        raise OAuthError("invalid_client", "unsupported Authorization scheme", 401)
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise OAuthError("invalid_client", "malformed Basic credentials", 401) from None
    user, sep, password = decoded.partition(":")
    if not sep:
        raise OAuthError("invalid_client", "malformed Basic credentials", 401)
    # RFC 6749 section 2.3.1: both parts are form-urlencoded before Basic encoding.
    return unquote(user.replace("+", " ")), unquote(password.replace("+", " "))
