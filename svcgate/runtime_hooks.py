"""The one interface the control plane uses to tear down warm profile runtimes.

Bundle edits, profile deletion and server removal call :meth:`RuntimeInvalidator.invalidate`
after their transaction commits. The data plane's profile-runtime supervisor
(:class:`svcgate.runtime.RuntimeManager`) implements it;
:class:`NoRuntimes` (tests of the control plane alone) does nothing: nothing is ever warm.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol

log = logging.getLogger(__name__)


class RuntimeInvalidator(Protocol):
    async def invalidate(self, profile_ids: Iterable[int], *, reason: str) -> None:
        """Tear down the warm runtimes of these profiles (a no-op for cold ones)."""

    def status(self, profile_id: int, *, detail: bool) -> dict[str, Any]:
        """The runtime state of a profile, for ``GET /api/profiles/{id}``."""


class NoRuntimes:
    """No data plane yet: no runtime is ever warm, so there is nothing to tear down."""

    async def invalidate(self, profile_ids: Iterable[int], *, reason: str) -> None:
        ids = sorted(profile_ids)
        if ids:
            log.info("invalidate runtimes of profiles %s (%s)", ids, reason)

    def status(self, profile_id: int, *, detail: bool) -> dict[str, Any]:
        return {"state": "cold", "servers": []}
