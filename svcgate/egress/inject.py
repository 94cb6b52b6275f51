"""Request and response header rewriting for the egress proxy (pure).

Headers are h11's: a list of ``(name, value)`` byte pairs with lower-case names.

Forwarded requests lose the hop-by-hop headers (RFC 9110 7.6.1: ``Connection`` and every
header it names, ``Keep-Alive``, ``TE``, ``Trailer``, ``Upgrade``) and everything meant for
the proxy (``Proxy-*``); framing headers (``Content-Length``, ``Transfer-Encoding``) stay, h11
re-frames them. With an :class:`Injection`:

- every occurrence of the placeholder in any request header value is replaced by the secret;
- the injection header, when there is one, is **overwritten** (every existing header of that
  name is removed first, THREATS.md C9), set to the format with ``{token}`` replaced;
- ``Accept-Encoding`` becomes ``identity`` so the response can be scanned for the secret.

Secrets are validated when stored (no CR, LF or NUL), and h11 refuses to send a header value
that would break framing, so an injected value cannot smuggle a header.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

Headers = list[tuple[bytes, bytes]]

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"upgrade",
    }
)


@dataclass(frozen=True)
class Injection:
    secret: bytes = field(repr=False)
    header: bytes | None  # lower-case header name, or None: placeholder substitution only
    value: bytes = field(repr=False)  # the header value, secret included
    placeholder: bytes | None = field(repr=False)

    @classmethod
    def build(
        cls, secret: bytes, header: tuple[str, str] | None, placeholder: str | None
    ) -> Injection:
        name: bytes | None = None
        value = b""
        if header is not None:
            name = header[0].lower().encode("ascii")
            value = header[1].replace("{token}", "\x00").encode("utf-8").replace(b"\x00", secret)
        return cls(
            secret=secret,
            header=name,
            value=value,
            placeholder=None if not placeholder else placeholder.encode("utf-8"),
        )


def _connection_tokens(headers: Sequence[tuple[bytes, bytes]]) -> set[bytes]:
    tokens: set[bytes] = set()
    for name, value in headers:
        if name == b"connection":
            tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return tokens


def strip_hop_by_hop(headers: Sequence[tuple[bytes, bytes]]) -> Headers:
    """Headers without hop-by-hop and ``Proxy-*`` ones (request or response)."""
    named = _connection_tokens(headers)
    return [
        (name, value)
        for name, value in headers
        if name not in HOP_BY_HOP and name not in named and not name.startswith(b"proxy-")
    ]


def forward_request_headers(
    headers: Sequence[tuple[bytes, bytes]], injection: Injection | None
) -> Headers:
    """The headers to send upstream (see the module docstring)."""
    out = strip_hop_by_hop(headers)
    if injection is None:
        return out
    if injection.placeholder:
        needle, secret = injection.placeholder, injection.secret
        out = [(name, value.replace(needle, secret)) for name, value in out]
    if injection.header is not None:
        out = [(name, value) for name, value in out if name != injection.header]
        out.append((injection.header, injection.value))
    out = [(name, value) for name, value in out if name != b"accept-encoding"]
    out.append((b"accept-encoding", b"identity"))
    return out


def header_values(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    return [value for key, value in headers if key == name]
