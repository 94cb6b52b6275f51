"""Pure naming rules for network namespaces (no I/O).

A namespace name becomes a file name under ``/var/run/netns`` and under the caller's state
directory, so it must never contain a path separator, be ``.``/``..``, or start with a dash
(it is also passed on command lines such as ``ip netns exec``).
"""

from __future__ import annotations

import re

# Same alphabet iproute2 users rely on; 64 keeps names readable in `ip netns list` and far
# below NAME_MAX once ".json" is appended for the metadata file.
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
MAX_NAME_LENGTH = 64


class InvalidNamespaceName(ValueError):
    """The name cannot safely be used as a namespace file name."""


def validate_name(name: str) -> str:
    """Return ``name`` unchanged if it is a safe namespace name, else raise."""
    if not _NAME_RE.fullmatch(name) or name in {".", ".."}:
        raise InvalidNamespaceName(f"invalid network namespace name: {name!r}")
    return name


def is_valid_name(name: str) -> bool:
    """True when :func:`validate_name` would accept ``name``."""
    try:
        validate_name(name)
    except InvalidNamespaceName:
        return False
    return True


def has_prefix(name: str, prefix: str) -> bool:
    """True when ``name`` belongs to the owner of ``prefix``.

    An empty prefix would match every namespace on the host, including ones other software
    owns; callers that clean up by prefix must never do that, so it matches nothing.
    """
    return bool(prefix) and name.startswith(prefix) and len(name) > len(prefix)
