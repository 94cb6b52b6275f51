"""Batched audit writes for egress decisions: off the data path, never lost.

:meth:`EgressAuditSink.record` is synchronous and only appends to a buffer, so a proxy task
never waits for SQLite. A flusher task writes the buffer in one transaction whenever it
holds events (at most :data:`BATCH` per transaction), at least every :data:`INTERVAL`
seconds while events arrive.

Resource handling: :func:`open_audit_sink` yields a running sink; on exit (the daemon's
shutdown, after every proxy task has ended) it writes whatever is still buffered, shielded,
before it returns. A failed write is retried (the batch stays in the buffer) and logged; it
never ends the flusher.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from svcgate import audit
from svcgate.metrics import Metrics
from svcgate.store import Store

log = logging.getLogger(__name__)

BATCH = 500
INTERVAL = 0.2
RETRY_DELAY = 1.0
CLOSE_DEADLINE = 30.0


@dataclass(frozen=True)
class EgressEvent:
    user_id: int
    profile_id: int
    server: str
    host: str
    decision: str
    detail: str = ""


class EgressAuditSink:
    def __init__(self, store: Store, metrics: Metrics | None = None) -> None:
        self._store = store
        self._metrics = metrics or Metrics()  # unexposed unless the daemon passes its own
        self._buffer: list[EgressEvent] = []
        self._wakeup = trio.Event()
        self.written = 0

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def record(self, event: EgressEvent) -> None:
        self._buffer.append(event)
        self._wakeup.set()
        self._metrics.egress_decision(event.decision)

    async def flush(self) -> None:
        """Write everything buffered so far (in batches)."""
        while self._buffer:
            batch = self._buffer[:BATCH]

            def write(conn: sqlite3.Connection, batch: list[EgressEvent] = batch) -> None:
                for event in batch:
                    audit.record(
                        conn,
                        kind="egress",
                        decision=event.decision,
                        user_id=event.user_id,
                        profile_id=event.profile_id,
                        server=event.server,
                        host=event.host,
                        detail=event.detail,
                    )

            with self._metrics.audit_write_seconds.time():
                await self._store.write(write)
            del self._buffer[: len(batch)]
            self.written += len(batch)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            try:
                await self.flush()
            except trio.Cancelled:
                raise
            except Exception:
                log.exception("writing %d egress audit event(s) failed; retrying", self.pending)
                await trio.sleep(RETRY_DELAY)
                self._wakeup.set()
                continue
            await trio.sleep(INTERVAL)


@asynccontextmanager
async def open_audit_sink(
    store: Store, metrics: Metrics | None = None
) -> AsyncIterator[EgressAuditSink]:
    sink = EgressAuditSink(store, metrics)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sink.run)
            try:
                yield sink
            finally:
                nursery.cancel_scope.cancel()
    finally:
        # The flusher is gone (its write, if any, finished): write what is left, once.
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + CLOSE_DEADLINE
            try:
                await sink.flush()
            except Exception:
                log.exception("lost %d egress audit event(s) at shutdown", sink.pending)
