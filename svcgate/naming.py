"""Names in a profile's aggregated catalogue (pure: no I/O, no logging).

The gateway exposes each downstream tool as ``<server>_<suffix>``. Server names match
``^[a-z0-9][a-z0-9-]{0,63}$`` and so never contain ``_``: a call is routed by splitting the
exposed name at its first ``_`` (the server) and looking the rest (the suffix) up in that
server's map. MCP tool names must match ``^[a-zA-Z0-9_-]{1,64}$`` (the whole string).

Tool names: rule for one server ``S`` whose tools are a set of original names. The room left
for a suffix is ``R = 64 - len(S) - 1``.

1. **Valid names keep their name.** A name that is non-empty, uses only ``A-Z a-z 0-9 _ -``
   and is at most ``R`` characters long (so ``S_<name>`` satisfies the MCP rule) is exposed
   unchanged: suffix = name. These names are placed first and always win.
2. **Other names** (empty, containing any other character, or too long once prefixed) are
   processed one by one in sorted order of the original string (Unicode code point order).
   The *sanitized name* is the original with every character outside ``A-Z a-z 0-9 _ -``
   (each code point, including non-ASCII letters and control characters) replaced by ``-``.
   The suffix is the sanitized name, unless it is empty, longer than ``R``, or already
   taken (by a rule-1 name or an earlier rule-2 name); then the suffix is the *hashed form*
   ``<first K characters of the sanitized name>-<H>``, where ``H`` is the first 8 lower-case
   hex characters of SHA-256 of the original name encoded as UTF-8 (a lone surrogate is
   encoded as Python's ``surrogatepass`` does), and ``K = min(len(sanitized), R - 9)``, the
   longest prefix that keeps ``S_<suffix>`` within 64 characters. When ``K`` is 0 or less
   (the name is empty, or only 8 or 9 characters are left) the suffix is ``H`` alone, with no
   leading ``-``.
3. **Dropped.** If the hashed form is also taken, or ``R < 8`` so that it cannot fit, the
   name gets no exposed name and is listed in ``dropped`` (sorted). This happens only when
   another name, or its sanitized form, equals the hashed form, when two hashed forms meet
   (a 2**-32 chance), or when the server name has 56 or more characters (then ``R < 8``).
4. **Duplicates.** An original name listed more than once counts once; the repeats are
   ignored, not listed as dropped.

The result depends only on the set of names, never on their order, and no two original
names share a suffix; since server names contain no ``_``, exposed names of different
servers never collide either. Every exposed name satisfies the MCP rule.

Resources: URIs are exposed unchanged. When several servers of a profile offer the same
URI, the server whose name sorts first owns it; the others' copies are hidden (reported as
``(server, uri)`` pairs). A server listing the same URI twice is not a collision.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from svcgate.servers import SERVER_NAME

# Always used with fullmatch: with match(), "$" would also accept a trailing newline.
NAME_RULE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_NAME_LENGTH = 64
HASH_LENGTH = 8
_OUTSIDE_ALPHABET = re.compile(r"[^A-Za-z0-9_-]")
_ALPHABET = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class NameMap:
    """One server's names in a profile's catalogue.

    ``exposed_to_original`` maps the suffix (the part after ``"<server>_"``) to the
    downstream tool name; ``original_to_exposed`` is its inverse. ``dropped`` lists the
    original names that could not be given any name, sorted.
    """

    exposed_to_original: Mapping[str, str]
    original_to_exposed: Mapping[str, str]
    dropped: tuple[str, ...]


def _check_server(server: str) -> None:
    if SERVER_NAME.fullmatch(server) is None:
        raise ValueError(f"server name {server[:80]!r} must match {SERVER_NAME.pattern}")


def exposed_name(server: str, suffix: str) -> str:
    """The catalogue name of ``suffix`` of ``server``; raises ValueError for a bad server."""
    _check_server(server)
    return f"{server}_{suffix}"


def split_exposed(exposed: str) -> tuple[str, str] | None:
    """``(server, suffix)`` of an exposed name; None without ``_`` or with a bad server part."""
    server, separator, suffix = exposed.partition("_")
    if not separator or SERVER_NAME.fullmatch(server) is None:
        return None
    return server, suffix


def _hashed_form(original: str, sanitized: str, room: int) -> str | None:
    if room < HASH_LENGTH:
        return None
    digest = hashlib.sha256(original.encode("utf-8", "surrogatepass")).hexdigest()
    tag = digest[:HASH_LENGTH]
    keep = min(len(sanitized), room - HASH_LENGTH - 1)
    return f"{sanitized[:keep]}-{tag}" if keep > 0 else tag


def map_names(server: str, names: Iterable[str]) -> NameMap:
    """Apply the module's rule to the tool ``names`` of ``server``.

    Error handling: raises ValueError for an invalid server name and TypeError when
    ``names`` is a single string (it would otherwise be read as one name per character).
    """
    _check_server(server)
    if isinstance(names, str):
        raise TypeError("names must be an iterable of names, not one string")
    room = MAX_NAME_LENGTH - len(server) - 1
    unique = set(names)
    kept = {name for name in unique if 0 < len(name) <= room and _ALPHABET.fullmatch(name)}
    to_original = {name: name for name in sorted(kept)}
    dropped: list[str] = []
    for original in sorted(unique - kept):
        sanitized = _OUTSIDE_ALPHABET.sub("-", original)
        suffix: str | None = sanitized
        if not sanitized or len(sanitized) > room or sanitized in to_original:
            suffix = _hashed_form(original, sanitized, room)
        if suffix is None or suffix in to_original:
            dropped.append(original)
            continue
        to_original[suffix] = original
    return NameMap(
        exposed_to_original=to_original,
        original_to_exposed={original: suffix for suffix, original in to_original.items()},
        dropped=tuple(dropped),
    )


def resolve_resources(
    per_server: Mapping[str, Sequence[str]],
) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Owner of each resource URI, and the ``(server, uri)`` copies hidden by an owner.

    The first server in name order that lists a URI owns it. The hidden pairs are sorted
    and listed once each. Error handling: TypeError when a server's URIs are one string.
    """
    owners: dict[str, str] = {}
    hidden: set[tuple[str, str]] = set()
    for server in sorted(per_server):
        uris = per_server[server]
        if isinstance(uris, str):
            raise TypeError(f"resource URIs of {server[:80]!r} must be a sequence, not a string")
        for uri in uris:
            owner = owners.setdefault(uri, server)
            if owner != server:
                hidden.add((server, uri))
    return owners, sorted(hidden)
