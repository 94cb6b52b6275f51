"""Scenario 5: the control plane at scale.

Two real gateways run side by side: the *subject* holds 1,000,000 audit events and 10,000
profiles of bob, the *baseline* 5,000 audit events and one profile of bob. Both are filled
the same way: started once (schema, the sign-ins of alice and bob), stopped, filled directly
with sqlite3 in one transaction, and started again on the same data directory. Requests go
to both in the same loop, request by request (the order of the two flips every round), so
drift of the machine hits both alike.

Measured, over HTTP with a keep-alive client (the client's own cost is in every number):

- ``GET /api/audit`` as alice (admin): the first page; a page 900,000 events deep, walked
  on from there with the ``next_before`` cursor each response returns; the same two for
  ``user_id=<bob>`` (the query a non-admin's own view runs); and a 200-event page (the
  maximum) deep down. The baseline holds enough events for full pages at the same relative
  depths, so both sides serialise the same amount: the ratio is the cost of table size.
- ``GET /api/profiles`` as bob: every profile of his (the API has no paging for profiles,
  SPEC "Profiles": a list of all own profiles), against one profile.
- The token check of ``/mcp/p/<slug>``: a request with a valid token and an
  ``Mcp-Session-Id`` on a cold profile is authenticated (hash, then the (slug, hash) lookup)
  and then answered 404 "Session not found" without starting anything, so it is a data-plane
  request whose only server-side work beyond HTTP is the token check. The same request with
  a foreign ``Origin`` is refused (403) before any token is looked at: the floor. Their
  difference is the check. A wrong token (401) is measured in the same loop, but only on
  one turn in n, a few dozen times per gateway in all: failures are rate-limited per
  source (burst of 100, then 10 per second; svcgate/ratelimit.py, not configurable), and a
  429 would measure the limiter instead.
- ``DataPlane.profile_for`` in process against each gateway's database (the lookup the data
  plane runs per request: the SHA-256 and one read on the store's reader pool in a worker
  thread), without HTTP, and the lookup's SQL alone.

Quick mode (the test suite's smoke run): 2,000 and 1,000 events, 50 profiles, a handful
of requests; seconds beyond the gateways' starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import env
from bench.common import Goal, Row, emit, latency, median, progress

SCENARIO = "5 control plane"
AUDIT_GOAL = Goal("value", "<=", 10)
BOB = 2  # alice signs in first (1, admin), then bob (2, user)
USERS = 10  # audit events are spread over this many user ids; bob holds a tenth of them
DEPTH = 0.9  # the deep page starts this far into the table (900,000 of 1,000,000)
SLUG = "bench-{:05d}"


@dataclass
class Size:
    audit_rows: int
    baseline_audit_rows: int
    profiles: int
    rounds: int
    audit_requests: int  # per case, gateway and round
    profile_requests: int  # per gateway and round
    token_requests: int  # per case, gateway and round
    denied_requests: int  # wrong tokens per gateway, in all (the limiter allows 100 at once)
    micro_calls: int  # in-process profile_for calls per gateway and round


FULL = Size(
    audit_rows=1_000_000,
    baseline_audit_rows=5_000,
    profiles=10_000,
    rounds=5,
    audit_requests=200,
    profile_requests=20,
    token_requests=300,
    denied_requests=60,
    micro_calls=2_000,
)
QUICK = Size(
    audit_rows=2_000,
    baseline_audit_rows=1_000,
    profiles=50,
    rounds=1,
    audit_requests=5,
    profile_requests=3,
    token_requests=5,
    denied_requests=3,
    micro_calls=20,
)


def token_of(index: int) -> str:
    """The profile token of ``bench-<index>``: deterministic, shaped like a real one."""
    return "svc_" + hashlib.sha256(f"bench-{index}".encode()).hexdigest()[:43]


# One audit event per ``i``, computed by SQLite itself (a recursive counter): 1,000,000
# rows in a few seconds, where building them in Python costs several times more. Most are
# egress decisions, spread over USERS user ids and the bench's profiles, 20 a second.
_EVENTS = """
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < :rows - 1)
INSERT INTO audit (ts, kind, user_id, profile_id, server, host, decision, detail)
SELECT
  strftime('%Y-%m-%dT%H:%M:%S', 1767225600 + i / 20, 'unixepoch') || printf('.%03dZ', i % 1000),
  CASE WHEN i % 10 < 8 THEN 'egress' WHEN i % 10 = 8 THEN 'auth' ELSE 'admin' END,
  1 + i % :users,
  1 + i % :profiles,
  CASE WHEN i % 10 < 8 THEN 'probe' ELSE '' END,
  CASE WHEN i % 10 < 8 THEN 'api.example.com' ELSE '' END,
  CASE WHEN i % 10 >= 8 THEN (CASE WHEN i % 10 = 8 THEN 'login' ELSE 'profile_servers' END)
       WHEN i % 4 = 3 THEN 'deny_host' ELSE 'allow' END,
  printf('slug=bench-%05d method=POST path=/v1/items/%d', 1 + i % :profiles, i)
FROM n
"""


def fill(db: Path, audit_rows: int, profiles: int) -> float:
    """Append ``audit_rows`` audit events and ``profiles`` profiles of bob (each with the
    server ``probe``) to a stopped gateway's database in one transaction; the seconds it
    took. The audit table's indexes are dropped for the insert and rebuilt from their own
    definitions (sorting once is much cheaper than a million index inserts)."""
    start = time.perf_counter()
    now = "2026-01-01T00:00:00.000Z"
    created = [
        (
            SLUG.format(i),
            SLUG.format(i),
            BOB,
            hashlib.sha256(token_of(i).encode()).hexdigest(),
            now,
            now,
        )
        for i in range(1, profiles + 1)
    ]
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous = OFF")  # a bench fixture: durability is not needed
        conn.execute("BEGIN IMMEDIATE")
        indexes = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'audit'"
            " AND sql IS NOT NULL"
        ).fetchall()
        for name, _ in indexes:
            conn.execute(f'DROP INDEX "{name}"')
        conn.execute(_EVENTS, {"rows": audit_rows, "users": USERS, "profiles": max(1, profiles)})
        for _, sql in indexes:
            conn.execute(sql)
        first = conn.execute("SELECT coalesce(max(id), 0) FROM profiles").fetchone()[0]
        conn.executemany(
            "INSERT INTO profiles (slug, name, user_id, token_hash, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            created,
        )
        conn.execute(
            "INSERT INTO profile_servers (profile_id, server_id)"
            " SELECT p.id, s.id FROM profiles p, servers s WHERE p.id > ? AND s.name = 'probe'",
            (first,),
        )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return time.perf_counter() - start


@dataclass
class Side:
    """One gateway and what the requests need to know about its contents."""

    name: str
    gw: env.BenchGateway
    audit_rows: int  # events in the table (the bench's plus the sign-ins)
    profiles: int
    clients: dict[str, Any] = field(default_factory=dict)
    listing_bytes: int = 0
    # The deep walks (all events; bob's): where they start (a ``before`` DEPTH into the
    # events), the lowest ``before`` that still has a full page under it, the current one.
    deep: int = 0
    deep_below: int = 0  # events under ``deep``
    floor: int = 0
    cursor: int = 0
    user_deep: int = 0
    user_floor: int = 0
    user_cursor: int = 0

    @property
    def slug(self) -> str:
        return SLUG.format(self.profiles // 2 + 1)

    @property
    def token(self) -> str:
        return token_of(self.profiles // 2 + 1)


Request = Callable[[Side], Any]


def _get(side: Side, who: str, path: str, status: int = 200, **kw: Any) -> Any:
    response = side.clients[who].get(path, **kw)
    if response.status_code != status:
        raise RuntimeError(
            f"{side.name}: GET {path} gave {response.status_code}: {response.text[:300]}"
        )
    return response


def _audit(side: Side, params: dict[str, Any], expect: int) -> dict[str, Any]:
    body: dict[str, Any] = _get(side, "admin", "/api/audit", params=params).json()
    if len(body["events"]) != expect:
        raise RuntimeError(f"{side.name}: {params} gave {len(body['events'])} events, not {expect}")
    return body


def first_page(side: Side) -> None:
    _audit(side, {}, 50)


def deep_page(side: Side) -> None:
    """The next page of the deep walk: from DEPTH down, following ``next_before`` (back to
    the start before a page would be short)."""
    body = _audit(side, {"before": side.cursor}, 50)
    side.cursor = body["next_before"]
    if side.cursor < side.floor:
        side.cursor = side.deep


def deep_page_200(side: Side) -> None:
    _audit(side, {"before": side.deep, "limit": 200}, min(200, side.deep_below))


def user_first_page(side: Side) -> None:
    _audit(side, {"user_id": BOB}, 50)


def user_deep_page(side: Side) -> None:
    body = _audit(side, {"user_id": BOB, "before": side.user_cursor}, 50)
    side.user_cursor = body["next_before"]
    if side.user_cursor < side.user_floor:
        side.user_cursor = side.user_deep


def listed_bytes(side: Side) -> int:
    """The size of bob's listing, checked once: every profile is in it."""
    found = _get(side, "user", "/api/profiles").json()
    if len(found) != side.profiles or {p["slug"] for p in found} != {
        SLUG.format(i) for i in range(1, side.profiles + 1)
    }:
        raise RuntimeError(f"{side.name}: {len(found)} profiles listed, not {side.profiles}")
    return len(_get(side, "user", "/api/profiles").content)


def profiles_list(side: Side) -> None:
    # Timed without the client's parse of the body (tens of ms for 1 MB of JSON), which is
    # not the gateway's cost: its size must match the checked listing's.
    size = len(_get(side, "user", "/api/profiles").content)
    if size != side.listing_bytes:
        raise RuntimeError(f"{side.name}: a listing of {size} bytes, not {side.listing_bytes}")


def _mcp(side: Side, status: int, token: str, **headers: str) -> None:
    _get(
        side,
        "mcp",
        f"/mcp/p/{side.slug}",
        status,
        headers={"Authorization": f"Bearer {token}", "Mcp-Session-Id": "0" * 32, **headers},
    )


def token_valid(side: Side) -> None:
    _mcp(side, 404, side.token)  # authenticated, then "Session not found": the profile is cold


def token_floor(side: Side) -> None:
    _mcp(side, 403, side.token, Origin="https://elsewhere.example")  # refused before the check


def token_wrong(side: Side) -> None:
    _mcp(side, 401, side.token[:-4] + "XXXX")


def measure(
    sides: list[Side],
    cases: Mapping[str, Request],
    count: int,
    rounds: int,
    label: str,
    every: dict[str, int] | None = None,
) -> dict[str, dict[str, dict[str, list[float]]]]:
    """``count`` turns per round; in each, one request per case and side, interleaved case
    by case and side by side (a case in ``every`` only on every n-th turn); per round, the
    p50 and p99 (ms) of each: ``result[case][side]["p50"|"p99"]``."""
    every = every or {}
    out: dict[str, dict[str, dict[str, list[float]]]] = {
        case: {s.name: {"p50": [], "p99": []} for s in sides} for case in cases
    }
    for index in range(rounds):
        progress(f"{SCENARIO}: {label} round {index + 1}/{rounds}")
        order = sides if index % 2 == 0 else list(reversed(sides))
        samples: dict[str, dict[str, list[float]]] = {c: {s.name: [] for s in sides} for c in cases}
        for call in cases.values():  # warm-up: connections, statements, page cache
            for side in order:
                call(side)
        for turn in range(count):
            for case, call in cases.items():
                if turn % every.get(case, 1):
                    continue
                for side in order:
                    start = time.perf_counter()
                    call(side)
                    samples[case][side.name].append(time.perf_counter() - start)
        for case in cases:
            for side in sides:
                stats = latency(samples[case][side.name])
                out[case][side.name]["p50"].append(stats.p50)
                out[case][side.name]["p99"].append(stats.p99)
    return out


def rows_of(
    results: dict[str, dict[str, dict[str, list[float]]]],
    subject: Side,
    baseline: Side,
    cases: dict[str, str],
    rounds: int,
    count: int,
    goal: Goal | None = None,
    unit: str = "ms",
    extra: dict[str, Any] | None = None,
) -> list[Row]:
    rows = []
    for case, title in cases.items():
        for metric in ("p50", "p99"):
            row = Row(
                SCENARIO,
                title,
                metric,
                unit,
                median(results[case][subject.name][metric]),
                baseline=baseline.name,
                baseline_value=median(results[case][baseline.name][metric]),
                goal=goal if metric == "p50" else None,
                rounds=rounds,
                extra={"requests_per_round": count, **(extra or {}).get(case, {})},
            )
            emit(row)
            rows.append(row)
    return rows


async def _profile_for_round(db: Path, slug: str, token: str, calls: int) -> tuple[float, float]:
    """p50 of ``DataPlane.profile_for`` (µs) on a store opened on ``db``, and of the lookup's
    SQL alone on one connection in this thread."""
    from svcgate.data_plane import DataPlane
    from svcgate.store import open_store

    async with open_store(db) as store:
        plane = DataPlane("unused-legacy-token", store)
        samples = []
        for _ in range(calls + 10):
            start = time.perf_counter()
            target = await plane.profile_for(slug, token)
            samples.append(time.perf_counter() - start)
            if target is None:
                raise RuntimeError(f"profile_for({slug!r}) found nothing in {db}")
    digest = hashlib.sha256(token.encode()).hexdigest()
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        sql = []
        for _ in range(calls + 10):
            start = time.perf_counter()
            conn.execute(
                "SELECT id, slug, user_id FROM profiles WHERE slug = ? AND token_hash = ?",
                (slug, digest),
            ).fetchone()
            sql.append(time.perf_counter() - start)
    finally:
        conn.close()
    return latency(samples[10:]).p50 * 1e3, latency(sql[10:]).p50 * 1e3


def micro(sides: list[Side], size: Size) -> Row:
    import trio

    found: dict[str, list[float]] = {s.name: [] for s in sides}
    sql: dict[str, list[float]] = {s.name: [] for s in sides}
    for index in range(size.rounds):
        progress(f"{SCENARIO}: profile_for in process, round {index + 1}/{size.rounds}")
        for side in sides if index % 2 == 0 else list(reversed(sides)):
            a, b = trio.run(
                _profile_for_round, side.gw.database, side.slug, side.token, size.micro_calls
            )
            found[side.name].append(a)
            sql[side.name].append(b)
    subject, baseline = sides
    row = Row(
        SCENARIO,
        f"profile_for in process ({subject.profiles:,} profiles)",
        "p50",
        "µs",
        median(found[subject.name]),
        baseline=baseline.name,
        baseline_value=median(found[baseline.name]),
        rounds=size.rounds,
        extra={
            "calls_per_round": size.micro_calls,
            "what": "DataPlane.profile_for(slug, token) on a Store opened on the gateway's "
            "database: SHA-256 + one (slug, token_hash) lookup on a reader in a "
            "worker thread; the thread hop dominates",
            "sql_only_us": round(median(sql[subject.name]), 2),
            "sql_only_baseline_us": round(median(sql[baseline.name]), 2),
        },
    )
    emit(row)
    return row


def _prepare(side: Side, size_audit: int, size_profiles: int) -> None:
    from gateway_support import api

    with api(side.gw.dp.gateway, side.gw.dp.user_session) as client:
        me = client.get("/api/me").json()["user"]["id"]
    if me != BOB:
        raise RuntimeError(f"bob is user {me}, not {BOB}: the sign-in order changed")
    took: dict[str, float] = {}

    def between(db: Path) -> None:
        took["fill"] = fill(db, size_audit, size_profiles)

    took["restart"] = side.gw.restart(between)
    progress(
        f"{SCENARIO}: {side.name}: {size_audit:,} audit events and {size_profiles:,} "
        f"profile(s) written in {took['fill']:.1f} s; restarted in {took['restart']:.1f} s"
    )
    conn = sqlite3.connect(f"file:{side.gw.database}?mode=ro", uri=True)
    try:
        side.audit_rows = conn.execute("SELECT count(*) FROM audit").fetchone()[0]
        side.deep, side.floor = _walk(conn, "", ())
        side.deep_below = conn.execute(
            "SELECT count(*) FROM audit WHERE id < ?", (side.deep,)
        ).fetchone()[0]
        side.user_deep, side.user_floor = _walk(conn, "WHERE user_id = ?", (BOB,))
    finally:
        conn.close()
    side.cursor, side.user_cursor = side.deep, side.user_deep


def _walk(conn: sqlite3.Connection, where: str, params: tuple[Any, ...]) -> tuple[int, int]:
    """A deep walk's start (DEPTH into the matching events, leaving at least a full page
    under it) and floor (the lowest ``before`` with a full page of 50 under it)."""
    count = conn.execute(f"SELECT count(*) FROM audit {where}", params).fetchone()[0]
    if count <= 50:
        raise RuntimeError(f"too few audit events ({count}) {where} for a deep page")
    skip = min(int(DEPTH * count), count - 51)
    sql = f"SELECT id FROM audit {where} ORDER BY id {{}} LIMIT 1 OFFSET ?"
    start = conn.execute(sql.format("DESC"), (*params, skip)).fetchone()[0]
    floor = conn.execute(sql.format("ASC"), (*params, 50)).fetchone()[0]
    return int(start), int(floor)


def run(quick: bool) -> list[Row]:
    from gateway_support import api

    size = QUICK if quick else FULL
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        progress(f"{SCENARIO}: starting two gateways")
        subject = Side(
            f"{size.audit_rows:,} events / {size.profiles:,} profiles",
            stack.enter_context(env.gateway({})),
            size.audit_rows,
            size.profiles,
        )
        baseline = Side(
            f"{size.baseline_audit_rows:,} events / 1 profile",
            stack.enter_context(env.gateway({})),
            size.baseline_audit_rows,
            1,
        )
        sides = [subject, baseline]
        for side in sides:
            _prepare(side, side.audit_rows, side.profiles)
        for side in sides:
            dp = side.gw.dp
            side.clients = {
                "admin": stack.enter_context(api(dp.gateway, dp.admin_session)),
                "user": stack.enter_context(api(dp.gateway, dp.user_session)),
                "mcp": stack.enter_context(dp.gateway.client()),
            }

        audit_cases = {
            "first": first_page,
            "deep": deep_page,
            "user_first": user_first_page,
            "user_deep": user_deep_page,
            "deep200": deep_page_200,
        }
        deep_label = f"{int(DEPTH * size.audit_rows):,} deep"
        titles = {
            "first": f"GET /api/audit first page of {size.audit_rows:,} (limit 50)",
            "deep": f"GET /api/audit page {deep_label} via next_before (limit 50)",
            "user_first": "GET /api/audit?user_id first page (limit 50)",
            "user_deep": f"GET /api/audit?user_id page {DEPTH:.0%} into the user's via next_before",
            "deep200": f"GET /api/audit page {deep_label} (limit 200)",
        }
        results = measure(sides, audit_cases, size.audit_requests, size.rounds, "GET /api/audit")
        notes = {
            "user_first": {
                "note": f"admin filter on bob, who holds 1/{USERS} of the events; "
                "the same query as a non-admin's own view"
            },
            "user_deep": {
                "note": f"before starts {DEPTH:.0%} into bob's events, then follows next_before"
            },
        }
        rows += rows_of(
            results,
            subject,
            baseline,
            titles,
            size.rounds,
            size.audit_requests,
            AUDIT_GOAL,
            extra=notes,
        )

        for side in sides:
            side.listing_bytes = listed_bytes(side)
        results = measure(
            sides, {"list": profiles_list}, size.profile_requests, size.rounds, "GET /api/profiles"
        )
        rows += rows_of(
            results,
            subject,
            baseline,
            {"list": f"GET /api/profiles ({size.profiles:,} own profiles, unpaged)"},
            size.rounds,
            size.profile_requests,
            extra={
                "list": {
                    "response_bytes": subject.listing_bytes,
                    "note": "SPEC: the list is every own profile, no paging; timed until the "
                    "body is received (not parsed)",
                }
            },
        )

        # A wrong token only every n-th turn: at most about size.denied_requests failures
        # per gateway in all (warm-ups included), inside the limiter's burst of 100.
        spread = -(-size.rounds * (size.token_requests + 1) // size.denied_requests)
        results = measure(
            sides,
            {"valid": token_valid, "floor": token_floor, "wrong": token_wrong},
            size.token_requests,
            size.rounds,
            "/mcp/p/<slug> token check",
            every={"wrong": spread},
        )
        check = {
            name: median(results["valid"][name]["p50"]) - median(results["floor"][name]["p50"])
            for name in (subject.name, baseline.name)
        }
        rows += rows_of(
            results,
            subject,
            baseline,
            {
                "valid": f"/mcp/p/<slug> valid token, {size.profiles:,} profiles (auth + 404)",
                "wrong": f"/mcp/p/<slug> wrong token, {size.profiles:,} profiles (401)",
                "floor": "/mcp/p/<slug> refused before the token check (403 Origin)",
            },
            size.rounds,
            size.token_requests,
            extra={
                "valid": {
                    "what": "GET with a valid token and an Mcp-Session-Id on a cold profile: "
                    "authenticated, then 404 Session not found; nothing is started",
                    "token_check_ms": round(check[subject.name], 4),
                    "token_check_baseline_ms": round(check[baseline.name], 4),
                },
                "wrong": {
                    "requests_per_round": -(-size.token_requests // spread),
                    "note": f"one turn in {spread}: failed authentications are rate-limited "
                    "per source (burst of 100, then 10/s; not configurable), so few samples "
                    "and p99 is about their maximum",
                },
                "floor": {
                    "what": "the same request with a foreign Origin: 403 before the "
                    "token is read; HTTP + routing floor"
                },
            },
        )
        rows.append(micro(sides, size))
    return rows


if __name__ == "__main__":
    import sys

    from bench.common import table

    print(table(run(quick="--quick" in sys.argv)))
