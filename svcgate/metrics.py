"""Prometheus metrics: one private registry per daemon, served on a listener of its own.

What is measured, and where (docs/observability.md lists every metric):

- Events are counted as they happen, through the :class:`Metrics` object the daemon passes
  down: every HTTP request in the front (:meth:`Metrics.observe_request`), every egress
  decision and every batch write of the egress audit sink.
- State is read at scrape time by :class:`_StateCollector` from the objects that own it: the
  warm profile runtimes (``RuntimeManager``), the sandboxes by state and the spawn-failure
  count (``SandboxSupervisor``). Reading is a walk over in-memory dicts: no I/O, no lock.

Labels are bounded by construction: the surface is one of :data:`SURFACES`, the method one
of :data:`METHODS` or ``other``, the code the status our own handlers sent, the decision one
of the egress policy's names or ``other``. No slug, token, path or user ever becomes a label.

The registry is a private :class:`prometheus_client.CollectorRegistry`, never the library's
global one: nothing registers itself by importing a module, and the process collectors of the
global registry stay out of the exposition.

Resource handling: :func:`serve_metrics` is a small Hypercorn server (``GET /metrics``; any
other path is 404), started by the daemon with ``nursery.start`` and stopped by the same
shutdown trigger as the public HTTP server. It serves the exposition from memory, on the
event loop (a few microseconds per metric family).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Protocol

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from svcgate.asgi_io import ASGIApp, Message, Receive, Scope, Send, lifespan_noop, send_json
from svcgate.egress.policy import DECISIONS
from svcgate.errors import envelope

log = logging.getLogger(__name__)

SURFACES = ("mcp_profile", "mcp_legacy", "api", "health")
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Requests run from sub-millisecond (health) to minutes (a tool call, an SSE stream).
HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# One SQLite transaction with a durable commit (synchronous=FULL): about a millisecond.
AUDIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
METRICS_PATH = "/metrics"
SHUTDOWN_GRACE = 2.0


class RuntimeCounts(Protocol):
    def counts(self) -> Mapping[str, int]: ...


class SandboxCounts(Protocol):
    spawn_failures: int

    def count_by_state(self) -> Mapping[str, int]: ...


class Metrics:
    """The registry and the metric objects of one daemon."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.http_requests = Counter(
            "svcgate_http_requests",
            "HTTP requests on the public listener, counted when the response starts.",
            ["surface", "method", "code"],
            registry=self.registry,
        )
        self.http_duration = Histogram(
            "svcgate_http_request_duration_seconds",
            "Time from a request's arrival until its response completed (streams included).",
            ["surface"],
            buckets=HTTP_BUCKETS,
            registry=self.registry,
        )
        self.egress_decisions = Counter(
            "svcgate_egress_decisions",
            "Decisions of the egress proxy, as written to the audit log.",
            ["decision"],
            registry=self.registry,
        )
        self.audit_write_seconds = Histogram(
            "svcgate_audit_write_seconds",
            "Latency of audit writes: one batch transaction of the egress audit sink.",
            buckets=AUDIT_BUCKETS,
            registry=self.registry,
        )
        # Present from the first scrape, so rate() and absent-series alerts work at once.
        for decision in DECISIONS:
            self.egress_decisions.labels(decision)

    def watch(self, runtimes: RuntimeCounts, sandboxes: SandboxCounts) -> None:
        """Read the warm runtimes and the sandboxes at every scrape (call once)."""
        self.registry.register(_StateCollector(runtimes, sandboxes))

    def egress_decision(self, decision: str) -> None:
        self.egress_decisions.labels(decision if decision in DECISIONS else "other").inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    async def observe_request(
        self, surface: str, app: ASGIApp, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Run ``app`` for one HTTP request, counting it and timing it until it completes."""
        method = scope["method"] if scope["method"] in METHODS else "other"
        started = time.perf_counter()
        responded = completed = False

        def respond(status: int) -> None:
            nonlocal responded
            responded = True
            self.http_requests.labels(surface, method, str(status)).inc()

        def complete() -> None:
            nonlocal completed
            if responded and not completed:
                completed = True
                self.http_duration.labels(surface).observe(time.perf_counter() - started)

        async def measured(message: Message) -> None:
            if message["type"] == "http.response.start" and not responded:
                respond(int(message["status"]))
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                complete()

        try:
            await app(scope, receive, measured)
        except Exception:
            if not responded:
                respond(500)  # what Hypercorn answers for an app that raised
            raise
        finally:
            # A stream that ended without its last body message (the client went away).
            complete()


class _StateCollector:
    """Gauges and counters read from the runtime manager and the supervisor at scrape time."""

    def __init__(self, runtimes: RuntimeCounts, sandboxes: SandboxCounts) -> None:
        self._runtimes = runtimes
        self._sandboxes = sandboxes

    def collect(self) -> Iterable[Metric]:
        warm = GaugeMetricFamily(
            "svcgate_warm_runtimes",
            "Profile runtimes warm now (the legacy /mcp runtime included).",
            value=self._runtimes.counts()["warm"],
        )
        sandboxes = GaugeMetricFamily(
            "svcgate_sandboxes",
            "Sandboxes known to the supervisor, by state.",
            labels=["state"],
        )
        for state, count in sorted(self._sandboxes.count_by_state().items()):
            sandboxes.add_metric([state], count)
        failures = CounterMetricFamily(
            "svcgate_sandbox_spawn_failures",
            "Sandboxes that failed to start (the spawn, not the server's handshake).",
            value=self._sandboxes.spawn_failures,
        )
        return [warm, sandboxes, failures]


def metrics_app(metrics: Metrics) -> ASGIApp:
    """The ASGI app of the metrics listener: ``GET /metrics``, nothing else."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan_noop(receive, send)
            return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["path"] != METRICS_PATH:
            await send_json(send, 404, envelope("not_found", "only /metrics is served here"))
            return
        if scope["method"] not in ("GET", "HEAD"):
            await send_json(
                send,
                405,
                envelope("method_not_allowed", "use GET"),
                [(b"allow", b"GET, HEAD")],
            )
            return
        body = metrics.exposition()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", CONTENT_TYPE_LATEST.encode()),
                    (b"cache-control", b"no-store"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


def _config(listen: tuple[str, int]) -> Config:
    host, port = listen
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.graceful_timeout = SHUTDOWN_GRACE
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.h11_max_incomplete_size = 16 * 1024
    config.include_server_header = False
    return config


async def serve_metrics(
    listen: tuple[str, int],
    metrics: Metrics,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``GET /metrics`` on ``listen`` until ``shutdown_trigger`` returns.

    Resource handling: reports the bound URLs through ``task_status`` once listening; the
    listener closes when ``shutdown_trigger`` returns or the task is cancelled.

    Error handling: a bind failure (address in use, no such address) raises ``OSError``
    before readiness is reported.
    """
    await serve(
        metrics_app(metrics),  # type: ignore[arg-type]  # hypercorn's ASGI typing is narrower
        _config(listen),
        shutdown_trigger=shutdown_trigger,
        task_status=task_status,
    )
