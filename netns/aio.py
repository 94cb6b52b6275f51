"""Trio-friendly API over :mod:`netns.core`.

Every call runs the blocking core function in a trio worker thread bounded by an explicit
:class:`trio.CapacityLimiter`. The worker thread itself never changes namespace: the core
does that in a short-lived thread of its own, so a worker returned to trio's pool is always
in the host's namespace.

Resource handling:
    Worker calls are not abandoned on cancellation (trio's default): a namespace that is
    half-created when the caller is cancelled is finished and returned to the core's own
    error handling, and the cancellation is delivered after it. A caller that was cancelled
    during :meth:`Netns.create` therefore may or may not own a namespace; it should remove it
    by name in its ``finally`` (``remove`` is idempotent), which is what the sandbox launcher
    does.

Error handling:
    Errors are the core's :class:`netns.core.NetnsError` family, raised unchanged.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path

import trio

from netns import core


class Netns:
    """Namespace operations for one state directory, safe to call from trio tasks."""

    def __init__(self, state_dir: Path, *, limiter: trio.CapacityLimiter | None = None) -> None:
        self.state_dir = state_dir
        # Namespace setup is cheap (~10 ms) but takes the mount-table lock; a handful in
        # parallel is plenty and keeps a burst of starts from filling trio's thread pool.
        self.limiter = limiter if limiter is not None else trio.CapacityLimiter(4)

    async def create(
        self, name: str, *, labels: Mapping[str, str] | None = None
    ) -> core.NamespaceInfo:
        """Create ``name`` with ``lo`` up; see :func:`netns.core.create_namespace`."""
        return await trio.to_thread.run_sync(
            lambda: core.create_namespace(name, state_dir=self.state_dir, labels=labels),
            limiter=self.limiter,
        )

    async def remove(self, name: str) -> bool:
        """Remove ``name`` and its metadata; True if it was mounted."""
        return await trio.to_thread.run_sync(
            lambda: core.remove_namespace(name, state_dir=self.state_dir),
            limiter=self.limiter,
        )

    async def list_namespaces(self, *, prefix: str = "") -> list[core.NamespaceInfo]:
        """Mounted or recorded namespaces, optionally filtered by name prefix."""
        return await trio.to_thread.run_sync(
            lambda: core.list_namespaces(state_dir=self.state_dir, prefix=prefix),
            limiter=self.limiter,
        )

    async def open_listener(
        self, name: str, *, host: str = "127.0.0.1", port: int = 0, backlog: int = 128
    ) -> socket.socket:
        """A plain listening socket inside ``name`` (for ``trio.socket.from_stdlib_socket``)."""
        return await trio.to_thread.run_sync(
            lambda: core.open_listener(name, host=host, port=port, backlog=backlog),
            limiter=self.limiter,
        )

    async def open_trio_listener(
        self, name: str, *, host: str = "127.0.0.1", port: int = 0, backlog: int = 128
    ) -> trio.SocketListener:
        """Like :meth:`open_listener`, already wrapped as a :class:`trio.SocketListener`."""
        sock = await self.open_listener(name, host=host, port=port, backlog=backlog)
        return trio.SocketListener(trio.socket.from_stdlib_socket(sock))

    async def inspect(self, name: str) -> list[core.InterfaceInfo]:
        """The links inside ``name``."""
        return await trio.to_thread.run_sync(
            lambda: core.inspect_namespace(name), limiter=self.limiter
        )

    async def cleanup_leftovers(self, prefix: str) -> list[str]:
        """Remove ``prefix`` namespaces whose owner process is gone; return their names."""
        return await trio.to_thread.run_sync(
            lambda: core.cleanup_leftovers(prefix, self.state_dir), limiter=self.limiter
        )
