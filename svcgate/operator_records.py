"""What the operator control socket answers about what the daemon keeps: its status, its
database, the audit log and the vault's key ring (see :mod:`svcgate.operator_commands` for
the shared shape of a command, and :mod:`svcgate.operator_socket` for the protocol).

Error handling: bad input raises :class:`~svcgate.operator_commands.RequestError`; key
material never appears in a result, an error or a log line: the daemon shows fingerprints
(:func:`svcgate.vault.fingerprint`), and a new ring reaches it only as a passed descriptor.
"""

from __future__ import annotations

import collections
import os
import sqlite3
import stat
import time
from typing import TYPE_CHECKING, Any

import trio

from svcgate import __version__, audit
from svcgate.operator_commands import OPERATOR, OperatorContext, RequestError, age, integer
from svcgate.vault import KeyRing, VaultError, not_under, rewrap_batch

if TYPE_CHECKING:
    from svcgate.vault import Vault

MAX_AUDIT_ROWS = 1000
DEFAULT_AUDIT_ROWS = 20
OIDC_PROBE_TIMEOUT = 3.0
MAX_KEY_FILE_BYTES = 64 * 1024


# -- status ---------------------------------------------------------------------------------


async def _oidc_status(ctx: OperatorContext) -> dict[str, Any]:
    settings = ctx.settings
    if settings is None or settings.oidc is None:
        return {"configured": False, "issuer": None, "reachable": None, "error": None}
    issuer = settings.oidc.issuer
    out: dict[str, Any] = {"configured": True, "issuer": issuer, "reachable": False}
    if ctx.http is None:
        return {**out, "reachable": None, "error": "no HTTP client"}
    url = issuer.rstrip("/") + "/.well-known/openid-configuration"
    error: str | None = None
    with trio.move_on_after(OIDC_PROBE_TIMEOUT) as probe:
        try:
            response = await ctx.http.get(url)
        except Exception as exc:  # noqa: BLE001  # any failure means "unreachable", named
            error = type(exc).__name__
        else:
            if response.status_code != 200:
                error = f"discovery answered {response.status_code}"
            else:
                try:
                    doc = response.json()
                except ValueError:
                    doc = None
                named = doc.get("issuer") if isinstance(doc, dict) else None
                if not isinstance(named, str) or named.rstrip("/") != issuer.rstrip("/"):
                    error = "the discovery document does not name this issuer"
    if probe.cancelled_caught:
        error = f"no answer within {OIDC_PROBE_TIMEOUT:g} s"
    return {**out, "reachable": error is None, "error": error}


def _database_status(conn: sqlite3.Connection) -> dict[str, Any]:
    conn.execute("BEGIN")  # one snapshot for every count (the store rolls it back)

    def count(table: str) -> int:
        # Table names are this function's constants, never input.
        value: int = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        return value

    state = conn.execute("SELECT version, expires, accepted_at FROM registry_state").fetchone()
    return {
        "schema_version": int(conn.execute("PRAGMA user_version").fetchone()[0]),
        "profiles": count("profiles"),
        "servers": count("servers"),
        "installed_servers": count("installed_servers"),
        "users": count("users"),
        "credentials": count("credentials"),
        "registry_state": None if state is None else dict(state),
    }


async def status(ctx: OperatorContext, request: dict[str, Any], fds: list[int]) -> Any:
    now = time.time()
    store = ctx.need_store()
    settings = ctx.settings
    async with trio.open_nursery() as nursery:
        oidc: dict[str, Any] = {}

        async def probe() -> None:
            oidc.update(await _oidc_status(ctx))

        nursery.start_soon(probe)
        db = await store.read(_database_status)
        sandboxes = collections.Counter(i.state for i in await ctx.directory.list())
    registry = None if settings is None else settings.registry
    state = db["registry_state"]
    return {
        "version": __version__,
        "pid": os.getpid(),
        "started_at": ctx.started_at,
        "uptime_seconds": age(ctx.started_at, now),
        "schema_version": db["schema_version"],
        "database": str(store.path),
        "listeners": {
            "http": list(ctx.http_binds),
            "control_socket": None if settings is None else str(settings.control_socket),
            # The metrics listener's bound URLs (none when SVC_METRICS_LISTEN=off).
            "metrics": list(ctx.metrics_binds),
        },
        "oidc": oidc,
        "registry": {
            "configured": registry is not None,
            "index_url": None if registry is None else registry.index_url,
            "index_version": None if state is None else state["version"],
            "index_expires": None if state is None else state["expires"],
            "index_accepted_at": None if state is None else state["accepted_at"],
            "installed_servers": db["installed_servers"],
        },
        "counts": {
            "profiles": db["profiles"],
            "servers": db["servers"],
            "users": db["users"],
            "credentials": db["credentials"],
            **(ctx.runtimes.counts() if ctx.runtimes is not None else {}),
            "sandboxes": dict(sorted(sandboxes.items())),
        },
    }


# -- the database and the audit log ----------------------------------------------------------


async def db_info(ctx: OperatorContext, request: dict[str, Any], fds: list[int]) -> Any:
    store = ctx.need_store()
    version = await store.read(lambda conn: int(conn.execute("PRAGMA user_version").fetchone()[0]))
    return {"path": str(store.path), "schema_version": version}


_AUDIT_COLUMNS = "id, ts, kind, user_id, profile_id, server, host, decision, detail"


async def audit_tail(ctx: OperatorContext, request: dict[str, Any], fds: list[int]) -> Any:
    """The newest ``limit`` rows (oldest first), or with ``after`` the rows after that id.

    ``cursor`` is the id to pass as ``after`` next time: the highest id in the same snapshot
    (ids are assigned in commit order by the single writer, so none can appear below it).
    """
    limit = integer(request, "limit", 1, MAX_AUDIT_ROWS, DEFAULT_AUDIT_ROWS)
    after = integer(request, "after", 0, 2**63 - 1, None)
    kind = request.get("kind")
    if kind is not None and kind not in audit.KINDS:
        raise RequestError("bad_request", f"'kind' must be one of {', '.join(audit.KINDS)}")
    # The SQL below is built from constant clauses only; values are bound parameters.
    where, params = ("WHERE kind = ?", [kind]) if kind else ("", [])

    def read(conn: sqlite3.Connection) -> dict[str, Any]:
        conn.execute("BEGIN")  # the rows and the cursor from one snapshot
        top = int(conn.execute("SELECT coalesce(max(id), 0) FROM audit").fetchone()[0])
        if after is None:
            sql = f"SELECT {_AUDIT_COLUMNS} FROM audit {where} ORDER BY id DESC LIMIT ?"
            rows = conn.execute(sql, (*params, limit)).fetchall()[::-1]
            cursor = top
        else:
            clause = "WHERE id > ?" + (" AND kind = ?" if kind else "")
            sql = f"SELECT {_AUDIT_COLUMNS} FROM audit {clause} ORDER BY id LIMIT ?"
            rows = conn.execute(sql, (after, *params, limit)).fetchall()
            # A full page may have more behind it: continue from its last row.
            cursor = int(rows[-1]["id"]) if len(rows) == limit else max(top, after)
        return {"events": [dict(row) for row in rows], "cursor": cursor}

    return await ctx.need_store().read(read)


# -- the vault ---------------------------------------------------------------------------------


def _need_vault(ctx: OperatorContext) -> Vault:
    if ctx.vault is None:
        raise RequestError("unavailable", "this daemon holds no vault here")
    return ctx.vault


async def vault_status(ctx: OperatorContext, request: dict[str, Any], fds: list[int]) -> Any:
    vault = _need_vault(ctx)

    def by_version(conn: sqlite3.Connection) -> dict[str, int]:
        rows = conn.execute("SELECT kek_version, count(*) FROM credentials GROUP BY 1")
        return {str(row[0]): int(row[1]) for row in rows}

    return {
        "active": vault.active,
        "fingerprints": {str(v): fp for v, fp in vault.fingerprints().items()},
        "credentials": await ctx.need_store().read(by_version),
    }


def read_ring_fd(fd: int) -> KeyRing:
    """The key ring in the regular file open at ``fd`` (read from offset 0; blocking)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise RequestError("bad_request", "the passed key file is not a regular file")
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise RequestError("bad_request", "the passed key file is accessible by group or others")
    if info.st_size > MAX_KEY_FILE_BYTES:
        raise RequestError("bad_request", "the passed key file is too large")
    data = os.pread(fd, MAX_KEY_FILE_BYTES + 1, 0)
    try:
        return KeyRing.parse(data.decode("utf-8"))
    except (UnicodeDecodeError, VaultError) as exc:
        raise RequestError("bad_request", f"the passed key file: {exc}") from None


async def vault_rotate(ctx: OperatorContext, request: dict[str, Any], fds: list[int]) -> Any:
    """Adopt the ring in the passed key file, re-wrap every credential to its newest key,
    then forget the other keys (see :mod:`svcgate.vault`)."""
    vault = _need_vault(ctx)
    store = ctx.need_store()
    if len(fds) != 1:
        raise RequestError("bad_request", "pass the key file as exactly one descriptor")
    ring = await trio.to_thread.run_sync(read_ring_fd, fds[0])
    async with ctx.rotation:
        try:
            vault.adopt(ring)
        except VaultError as exc:
            raise RequestError("bad_request", f"refused: {exc}") from None
        target = ring.active
        rewrapped = 0
        retired = sorted(v for v in ring.keys if v != target)

        def finish(conn: sqlite3.Connection) -> int:
            left = not_under(conn, target)
            if left:
                return left  # written before the ring changed: another batch, then again
            vault.retire_except(target)
            audit.record(
                conn,
                kind="admin",
                decision="operator.vault.rotate",
                user_id=OPERATOR,
                detail=f"version={target} rewrapped={rewrapped}"
                f" retired={','.join(map(str, retired)) or '-'}",
            )
            return 0

        while True:
            while done := await store.write(lambda conn: rewrap_batch(conn, vault, target)):
                rewrapped += done
            if not await store.write(finish):
                break
    return {"version": target, "rewrapped": rewrapped, "retired": retired}
