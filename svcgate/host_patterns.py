"""Host patterns of credentials' ``allowed_hosts`` (pure).

Rules (documented in docs/api.md):

- A pattern is a lower-case DNS name, optionally prefixed by ``*.``; input is lower-cased and
  a trailing dot is stripped before checking.
- ``*.example.com`` matches any name *below* ``example.com`` (``api.example.com``,
  ``a.b.example.com``) but **not** ``example.com`` itself: list the apex separately.
- Over-broad wildcards are refused: the part after ``*.`` needs at least two labels and must
  not be a well-known public suffix (``*.com``, ``*.co.uk``).
- Labels are 1-63 characters of ``a-z0-9-`` not starting or ending with ``-``; names are at
  most 253 characters. A wildcard never matches an IP literal, and an IP literal pattern
  matches only that exact literal.
"""

from __future__ import annotations

import ipaddress
import re

PATTERN_SYNTAX = re.compile(r"^(\*\.)?[a-z0-9.-]+$")
_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
MAX_LENGTH = 253
# Multi-label public suffixes refused as wildcard bases. Not the whole Public Suffix List:
# the two-label minimum already refuses every single-label suffix (*.com, *.io, ...).
PUBLIC_SUFFIXES = frozenset(
    {
        "co.uk", "org.uk", "ac.uk", "gov.uk", "me.uk", "ltd.uk", "plc.uk", "net.uk",
        "com.au", "net.au", "org.au", "edu.au", "gov.au",
        "co.jp", "ne.jp", "or.jp", "ac.jp", "go.jp",
        "co.nz", "org.nz", "net.nz", "co.za", "org.za",
        "com.br", "net.br", "org.br", "com.cn", "net.cn", "org.cn", "gov.cn",
        "co.in", "net.in", "org.in", "firm.in", "gen.in", "ind.in",
        "com.mx", "com.ar", "com.tr", "com.tw", "com.hk", "com.sg", "co.kr", "or.kr",
        "co.il", "org.il", "com.ua", "com.pl", "co.id", "or.id",
        "github.io", "herokuapp.com", "appspot.com", "cloudfront.net", "amazonaws.com",
        "azurewebsites.net", "vercel.app", "netlify.app", "pages.dev", "workers.dev",
    }
)  # fmt: skip


class HostPatternError(ValueError):
    """The pattern is refused; the message says why and is safe to show."""


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def normalize_pattern(raw: str) -> str:
    """Return the canonical form of ``raw`` or raise :class:`HostPatternError`."""
    pattern = raw.strip().lower()
    if pattern.endswith(".") and not pattern.endswith(".."):
        pattern = pattern[:-1]
    if not pattern or len(pattern) > MAX_LENGTH:
        raise HostPatternError(f"host pattern must be 1 to {MAX_LENGTH} characters")
    if PATTERN_SYNTAX.fullmatch(pattern) is None:
        raise HostPatternError(f"host pattern {raw[:64]!r} must match ^(\\*\\.)?[a-z0-9.-]+$")
    wildcard = pattern.startswith("*.")
    base = pattern[2:] if wildcard else pattern
    if _is_ip(base):
        if wildcard:
            raise HostPatternError("a wildcard cannot cover an IP address")
        return pattern
    labels = base.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        raise HostPatternError(f"host pattern {raw[:64]!r} has an empty or malformed label")
    if labels[-1].isdigit():
        raise HostPatternError(f"host pattern {raw[:64]!r} looks like a partial IP address")
    if wildcard and (len(labels) < 2 or base in PUBLIC_SUFFIXES):
        raise HostPatternError(f"wildcard {raw[:64]!r} is too broad")
    return pattern


def matches(pattern: str, host: str) -> bool:
    """Whether a canonical ``host`` (lower case, no trailing dot) is covered by ``pattern``."""
    if pattern.startswith("*."):
        if _is_ip(host):
            return False
        suffix = pattern[1:]  # ".example.com"
        return host.endswith(suffix) and len(host) > len(suffix)
    return host == pattern


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback IP literal (``127.0.0.0/8``, ``::1``; brackets allowed).

    Names below ``localhost`` are not included: outside systemd-resolved they go to DNS.
    """
    bare = host.strip("[]").lower()
    if bare == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False
