"""Go-style duration strings (``168h``, ``90m``, ``1h30m``, ``1.5h``, ``300ms``).

Pure: no I/O. Mirrors Go's ``time.ParseDuration`` for the units a session lifetime needs.
"""

from __future__ import annotations

import re

_UNITS: dict[str, float] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_MAX_LEN = 64


def parse_duration(text: str) -> float:
    """Return the duration in seconds; raise ValueError for anything Go would refuse.

    A sign is refused (a lifetime cannot be negative); ``0`` alone is accepted as Go does.
    """
    if not text or len(text) > _MAX_LEN:
        raise ValueError("empty or too long")
    if text == "0":
        return 0.0
    pos = 0
    total = 0.0
    while pos < len(text):
        match = _PART.match(text, pos)
        if match is None:
            raise ValueError(f"bad duration at offset {pos}")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    return total
