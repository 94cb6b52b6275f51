"""Time in the two forms the store uses: ISO 8601 UTC text for display, epoch seconds for expiry."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def now_iso() -> str:
    """Current time as ISO 8601 UTC in milliseconds, e.g. ``2026-11-21T13:55:54.123Z``."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def now_epoch() -> float:
    return time.time()
