"""Liveness and readiness: ``GET /healthz`` and ``GET /readyz`` on the public listener.

Both are unauthenticated and say nothing but ``{"status": "ok"}`` (200) or
``{"status": "unavailable"}`` (503): which check failed, and why, goes to the log, never to
an anonymous client.

- ``/healthz``: the process serves HTTP. Nothing else is checked, so a slow database or
  identity provider never gets a live gateway restarted.
- ``/readyz``: the database answers a read, and (with OIDC configured) the identity
  provider still serves its discovery document.

The database check opens a fresh read-only connection in a worker thread and reads the
schema version. The store's pooled readers are not used on purpose: they answer from their
page caches, so a database file deleted, truncated or overwritten under a running gateway
would still look healthy through them.

Each check is single-flight and its result is cached (:data:`STORE_TTL`, :data:`IDP_TTL`),
so a flood of anonymous probes costs at most one database open per second and one request
to the identity provider per ten seconds. A request waits at most :data:`WAIT` seconds: a
check that is still running then counts as failed.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx2
import trio

from svcgate.asgi_io import Receive, Scope, Send, respond_closing, send_json
from svcgate.errors import envelope
from svcgate.migrations import MIGRATIONS
from svcgate.oidc import OidcClient, OidcError
from svcgate.settings import OidcSettings

log = logging.getLogger(__name__)

HEALTH_PATHS = frozenset({"/healthz", "/readyz"})
WAIT = 2.0
# Each probe gives up a little before the request does, so its failure is cached.
PROBE_TIMEOUT = 1.5
STORE_TTL = 1.0
IDP_TTL = 10.0
# A probe returns None when the dependency is fine, else why not (for the log only).
Probe = Callable[[], Awaitable[str | None]]


class _CachedCheck:
    """One check: at most one probe in flight, its result kept for ``ttl`` seconds."""

    def __init__(self, name: str, probe: Probe, ttl: float) -> None:
        self.name = name
        self._probe = probe
        self._ttl = ttl
        self._problem: str | None = "not checked yet"
        self._checked_at: float | None = None
        self._running: trio.Event | None = None

    def _fresh(self) -> bool:
        at = self._checked_at
        return at is not None and trio.current_time() - at < self._ttl

    async def ok(self) -> bool:
        while not self._fresh():
            if self._running is None:
                return await self._check()
            # Another request is probing; if it was cancelled, probe here instead.
            await self._running.wait()
        return self._problem is None

    async def _check(self) -> bool:
        self._running = done = trio.Event()
        try:
            problem: str | None = f"no answer within {PROBE_TIMEOUT:g}s"
            with trio.move_on_after(PROBE_TIMEOUT):
                problem = await self._probe()
            # Changes only: a failing dependency is not logged once per probe.
            if problem != self._problem or self._checked_at is None:
                if problem is None:
                    log.info("readiness: %s is ok", self.name)
                else:
                    log.warning("readiness: %s is unavailable: %s", self.name, problem)
            self._problem, self._checked_at = problem, trio.current_time()
            return problem is None
        finally:
            self._running = None
            done.set()


class Readiness:
    """The checks behind ``/readyz``; see the module docstring."""

    def __init__(self, database: Probe, identity_provider: Probe | None = None) -> None:
        self._checks = [_CachedCheck("the database", database, STORE_TTL)]
        if identity_provider is not None:
            self._checks.append(_CachedCheck("the identity provider", identity_provider, IDP_TTL))

    async def ready(self) -> bool:
        with trio.move_on_after(WAIT):
            for check in self._checks:
                if not await check.ok():
                    return False
            return True
        return False


def store_probe(database: Path) -> Probe:
    """A probe reading the schema version of ``database`` through a fresh connection."""
    # One thread at most: a probe stuck in the kernel (a dead disk) is abandoned, and the
    # next one waits for this limiter instead of piling up threads.
    limiter = trio.CapacityLimiter(1)

    async def probe() -> str | None:
        try:
            version = await trio.to_thread.run_sync(
                _schema_version, database, limiter=limiter, abandon_on_cancel=True
            )
        except sqlite3.Error as exc:
            return f"cannot read it ({exc})"
        if version != len(MIGRATIONS):
            return f"schema version {version}, expected {len(MIGRATIONS)}"
        return None

    return probe


def _schema_version(database: Path) -> int:
    # mode=ro: never create a missing file; a fresh connection reads page 1 from disk.
    conn = sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True, timeout=1.0)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def identity_provider_probe(settings: OidcSettings, http: httpx2.AsyncClient) -> Probe:
    """A probe fetching (and validating) the provider's discovery document again."""

    async def probe() -> str | None:
        try:
            await OidcClient.discover(settings, http, limit=PROBE_TIMEOUT)
        except OidcError as exc:
            return str(exc)
        return None

    return probe


async def respond(
    readiness: Readiness, path: str, scope: Scope, receive: Receive, send: Send
) -> None:
    """Answer ``/healthz`` or ``/readyz`` (``path``) without any detail."""
    if scope["method"] not in ("GET", "HEAD"):
        # The body, if any, is discarded while the answer goes out (see respond_closing).
        await respond_closing(
            receive,
            lambda: send_json(
                send,
                405,
                envelope("method_not_allowed", "use GET"),
                [(b"allow", b"GET, HEAD"), (b"connection", b"close")],
            ),
        )
        return
    ok = path == "/healthz" or await readiness.ready()
    await send_json(send, 200 if ok else 503, {"status": "ok" if ok else "unavailable"})
