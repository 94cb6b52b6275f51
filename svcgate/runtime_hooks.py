"""The one interface the control plane uses to tear down warm profile runtimes.

Bundle edits, profile deletion and server removal call :meth:`RuntimeInvalidator.invalidate`
after their transaction commits. The data plane's profile-runtime supervisor
(:class:`svcgate.runtime.RuntimeManager`) implements it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol


class RuntimeInvalidator(Protocol):
    async def invalidate(
        self, profile_ids: Iterable[int], *, reason: str, restart: bool = True
    ) -> None:
        """Tear down the warm runtimes of these profiles (a no-op for cold ones); with
        ``restart`` a request waiting for one to start starts it again."""

    async def invalidate_server(self, server: str, *, reason: str) -> None:
        """Tear down every runtime that runs ``server`` (install, upgrade, uninstall)."""

    def status(self, profile_id: int, *, detail: bool) -> dict[str, Any]:
        """The runtime state of a profile, for ``GET /api/profiles/{id}``."""
