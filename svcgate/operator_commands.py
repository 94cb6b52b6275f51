"""What the operator control socket answers about sandboxes, namespaces and profiles, and
what every command shares (protocol table and dispatch in :mod:`svcgate.operator_socket`;
status, database, audit log and vault in :mod:`svcgate.operator_records`).

Each command takes the daemon's :class:`OperatorContext`, the parsed request and the file
descriptors that came with it, and returns the ``result`` (JSON-ready) or raises
:class:`RequestError`. Blocking work (SQLite, pyroute2 inside a namespace, ``/proc``, reading
a passed file) runs in worker threads (DESIGN rule 5); SQLite goes through the store, so
writes share its one writer and audit rows commit with what they record.

Operator actions are audited as kind ``admin`` with ``user_id`` 0 (the operator):
``operator.sandbox.kill``, ``operator.profile.warm``, ``operator.profile.cold``, written
before the action, so an action is never done unrecorded (and ``operator.vault.rotate``,
:mod:`svcgate.operator_records`).

Error handling: bad input raises :class:`RequestError` (``bad_request``, ``not_found``,
``unavailable`` when the daemon part a command needs is not there, ``start_failed``); key
material never appears in a result or an error.
"""

from __future__ import annotations

import builtins
import socket
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import trio
from pyroute2.iproute import IPRoute

import netns
from svcgate import audit
from svcgate.runtime import LEGACY_TARGET, RuntimeClosed, RuntimeStartError, RuntimeTarget
from svcgate.supervisor import SandboxHandle, SandboxInfo, SandboxKey, SandboxNotFound

if TYPE_CHECKING:
    import httpx2

    from svcgate.runtime import RuntimeManager
    from svcgate.settings import Settings
    from svcgate.store import Store
    from svcgate.vault import Vault

MAX_LOG_LINES = 10_000
OPERATOR = 0  # the audit user id of operator actions


class RequestError(Exception):
    """A request the socket refuses; ``code`` goes into the error response."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class SandboxDirectory(Protocol):
    """What the control socket asks of the sandbox supervisor."""

    async def list(self) -> builtins.list[SandboxInfo]: ...

    def find(self, profile: str, server: str) -> SandboxKey: ...

    async def logs(self, key: SandboxKey, n: int | None = None) -> builtins.list[str]: ...

    def handle(self, key: SandboxKey) -> SandboxHandle | None: ...

    async def stop(self, key: SandboxKey) -> bool: ...

    async def stop_profile(self, profile_id: int) -> int: ...


@dataclass
class OperatorContext:
    """The daemon parts the control socket serves. Only ``directory`` is required: a
    command whose part is missing answers ``unavailable``. ``http_binds`` is filled in once
    the HTTP server is listening (it starts after the control socket), ``metrics_binds``
    once the metrics listener is."""

    directory: SandboxDirectory
    settings: Settings | None = None
    store: Store | None = None
    runtimes: RuntimeManager | None = None
    vault: Vault | None = None
    http: httpx2.AsyncClient | None = None
    started_at: float = field(default_factory=time.time)
    http_binds: list[str] = field(default_factory=list)
    metrics_binds: list[str] = field(default_factory=list)
    # pyroute2 and /proc reads; each namespace read also runs in a thread of its own.
    limiter: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(2))
    rotation: trio.Lock = field(default_factory=trio.Lock)
    # One kill at a time: two restarts of one server must not race for its sandbox.
    kills: trio.Lock = field(default_factory=trio.Lock)

    def need_store(self) -> Store:
        if self.store is None:
            raise RequestError("unavailable", "this daemon serves no database here")
        return self.store

    def need_runtimes(self) -> RuntimeManager:
        if self.runtimes is None:
            raise RequestError("unavailable", "this daemon runs no profile runtimes here")
        return self.runtimes


Command = Callable[[OperatorContext, dict[str, Any], list[int]], Awaitable[Any]]


def string(request: dict[str, Any], name: str) -> str:
    value = request.get(name)
    if not isinstance(value, str) or not value:
        raise RequestError("bad_request", f"{name!r} must be a non-empty string")
    return value


def integer(
    request: dict[str, Any], name: str, low: int, high: int, default: int | None
) -> int | None:
    value = request.get(name, default)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise RequestError("bad_request", f"{name!r} must be an integer {low}-{high}")
    return value


def age(started_at: float | None, now: float) -> float | None:
    return None if started_at is None else round(max(0.0, now - started_at), 3)


# -- the first commands: sandboxes and namespaces ------------------------------------------


async def sandbox_ps(ctx: OperatorContext, request: dict[str, Any], fds: list[int]) -> Any:
    now = time.time()
    return [
        {**info.to_json(), "age_seconds": age(info.started_at, now)}
        for info in await ctx.directory.list()
    ]


async def netns_ls(ctx: OperatorContext, request: dict[str, Any], fds: list[int]) -> Any:
    now = time.time()
    return [
        {
            "namespace": info.namespace,
            "profile_id": info.profile_id,
            "profile_slug": info.profile_slug,
            "server": info.server,
            "owner_user_id": info.owner_user_id,
            "pid": info.pid,
            "state": info.state,
            "egress_listener": info.egress_listener,
            "egress_connections": info.egress_connections,
            "started_at": info.started_at,
            "age_seconds": age(info.started_at, now),
        }
        for info in await ctx.directory.list()
        if info.namespace is not None
    ]


async def sandbox_logs(ctx: OperatorContext, request: dict[str, Any], fds: list[int]) -> Any:
    profile, server = string(request, "profile"), string(request, "server")
    lines = integer(request, "lines", 1, MAX_LOG_LINES, None)
    try:
        key = ctx.directory.find(profile, server)
        tail = await ctx.directory.logs(key, lines)
    except SandboxNotFound as exc:
        raise RequestError("not_found", str(exc)) from exc
    return {"profile": profile, "server": server, "lines": tail}


_SCOPES = {0: "global", 200: "site", 253: "link", 254: "host", 255: "nowhere"}
_TABLES = {253: "default", 254: "main", 255: "local"}
_ROUTE_TYPES = dict(
    enumerate(
        ("unicast", "local", "broadcast", "anycast", "multicast", "blackhole", "unreachable"),
        start=1,
    )
)
_PROTOCOLS = {1: "redirect", 2: "kernel", 3: "boot", 4: "static"}


def read_namespace(name: str) -> dict[str, Any]:
    """Interfaces (state, addresses) and routes (every table) inside namespace ``name``.

    Blocking: the netlink reads run in a thread of their own that joins the namespace
    (:func:`netns.run_in_namespace`), never in a pooled one.
    """

    def read() -> dict[str, Any]:
        with IPRoute() as ipr:
            addresses: dict[int, list[str]] = {}
            for addr in ipr.get_addr():
                addresses.setdefault(int(addr["index"]), []).append(
                    f"{addr.get_attr('IFA_ADDRESS')}/{addr['prefixlen']}"
                )
            names: dict[int, str] = {}
            interfaces = []
            for link in ipr.get_links():
                index = int(link["index"])
                names[index] = str(link.get_attr("IFLA_IFNAME"))
                interfaces.append(
                    {
                        "name": names[index],
                        "index": index,
                        "up": bool(link["flags"] & 1),  # IFF_UP
                        "operstate": link.get_attr("IFLA_OPERSTATE"),
                        "mtu": link.get_attr("IFLA_MTU"),
                        "addresses": addresses.get(index, []),
                    }
                )
            routes = []
            for family in (socket.AF_INET, socket.AF_INET6):
                for route in ipr.get_routes(family=family):
                    dst = route.get_attr("RTA_DST")
                    oif = route.get_attr("RTA_OIF")
                    table = route.get_attr("RTA_TABLE") or route["table"]
                    routes.append(
                        {
                            "family": "inet" if family == socket.AF_INET else "inet6",
                            "destination": f"{dst}/{route['dst_len']}" if dst else "default",
                            "gateway": route.get_attr("RTA_GATEWAY"),
                            "device": names.get(oif) if oif is not None else None,
                            "source": route.get_attr("RTA_PREFSRC"),
                            "table": _TABLES.get(table, str(table)),
                            "type": _ROUTE_TYPES.get(route["type"], str(route["type"])),
                            "scope": _SCOPES.get(route["scope"], str(route["scope"])),
                            "protocol": _PROTOCOLS.get(route["proto"], str(route["proto"])),
                        }
                    )
            return {"interfaces": interfaces, "routes": routes}

    return netns.run_in_namespace(name, read)


async def netns_inspect(ctx: OperatorContext, request: dict[str, Any], fds: list[int]) -> Any:
    name = string(request, "name")
    if not netns.is_valid_name(name):
        raise RequestError("bad_request", f"{name!r} is not a valid namespace name")
    info = next((i for i in await ctx.directory.list() if i.namespace == name), None)
    if info is None:
        raise RequestError("not_found", f"no sandbox namespace named {name!r}")
    handle = ctx.directory.handle(SandboxKey(info.profile_id, info.server))
    pids = [] if handle is None else await trio.to_thread.run_sync(handle.host_pids)
    try:
        net = await trio.to_thread.run_sync(read_namespace, name, limiter=ctx.limiter)
    except netns.NamespaceNotFound as exc:
        raise RequestError("not_found", f"namespace {name!r} is gone") from exc
    except (netns.NetnsError, OSError) as exc:
        raise RequestError("internal", f"reading namespace {name!r} failed: {exc}") from exc
    sandbox = {
        key: value
        for key, value in info.to_json().items()
        if key not in ("egress_listener", "egress_connections", "namespace")
    }
    return {
        "namespace": name,
        "sandbox": {**sandbox, "pids": pids, "age_seconds": age(info.started_at, time.time())},
        **net,
        "egress": {"listener": info.egress_listener, "connections": info.egress_connections},
    }


# -- profiles and sandboxes: warm, cold, kill -----------------------------------------------


async def _target(ctx: OperatorContext, profile: str) -> RuntimeTarget:
    """The profile named by slug, else by id; ``legacy`` (or 0) is the legacy bundle."""

    def lookup(conn: sqlite3.Connection) -> RuntimeTarget | None:
        row = conn.execute(
            "SELECT id, slug, user_id FROM profiles WHERE slug = ?", (profile,)
        ).fetchone()
        if row is None and profile.isdigit() and profile.isascii():
            row = conn.execute(
                "SELECT id, slug, user_id FROM profiles WHERE id = ?", (int(profile),)
            ).fetchone()
        return None if row is None else RuntimeTarget(int(row[0]), str(row[1]), int(row[2]))

    target = await ctx.need_store().read(lookup)
    if target is None and profile in (LEGACY_TARGET.slug, str(LEGACY_TARGET.profile_id)):
        target = LEGACY_TARGET
    if target is None:
        raise RequestError("not_found", f"no profile {profile!r}")
    return target


def _profile_json(target: RuntimeTarget) -> dict[str, Any]:
    return {"id": target.profile_id, "slug": target.slug, "user_id": target.user_id}


async def _audit(ctx: OperatorContext, decision: str, target: RuntimeTarget, **fields: str) -> None:
    detail = " ".join(f"{k}={v}" for k, v in {"slug": target.slug, **fields}.items())
    await ctx.need_store().write(
        lambda conn: audit.record(
            conn,
            kind="admin",
            decision=decision,
            user_id=OPERATOR,
            profile_id=target.profile_id,
            server=fields.get("server", ""),
            detail=detail,
        )
    )


async def profile_warm(ctx: OperatorContext, request: dict[str, Any], fds: list[int]) -> Any:
    runtimes = ctx.need_runtimes()
    target = await _target(ctx, string(request, "profile"))
    await _audit(ctx, "operator.profile.warm", target)
    began = time.monotonic()
    try:
        await runtimes.get(target)
    except RuntimeStartError as exc:
        raise RequestError("start_failed", f"profile {target.slug!r} did not start: {exc}") from exc
    status = runtimes.status(target.profile_id, detail=True)
    return {
        "profile": _profile_json(target),
        "state": status["state"],
        "servers": status["servers"],
        "seconds": round(time.monotonic() - began, 3),
    }


async def profile_cold(ctx: OperatorContext, request: dict[str, Any], fds: list[int]) -> Any:
    runtimes = ctx.need_runtimes()
    target = await _target(ctx, string(request, "profile"))
    await _audit(ctx, "operator.profile.cold", target)
    was = runtimes.status(target.profile_id, detail=False)["state"]
    sandboxes = [i for i in await ctx.directory.list() if i.profile_id == target.profile_id]
    # A request waiting for the runtime to start starts it afresh, as after a bundle edit.
    await runtimes.invalidate([target.profile_id], reason="operator: profile cold")
    # Sandboxes left without a runtime (exited ones kept for their logs) go too.
    await ctx.directory.stop_profile(target.profile_id)
    return {
        "profile": _profile_json(target),
        "was": was,
        "state": runtimes.status(target.profile_id, detail=False)["state"],
        "stopped": sorted(i.server for i in sandboxes),
    }


async def sandbox_kill(ctx: OperatorContext, request: dict[str, Any], fds: list[int]) -> Any:
    runtimes = ctx.need_runtimes()
    target = await _target(ctx, string(request, "profile"))
    server = string(request, "server")
    key = SandboxKey(target.profile_id, server)
    infos = {i.server: i for i in await ctx.directory.list() if i.profile_id == key.profile_id}
    warm = runtimes.warm(target.profile_id)
    if server not in infos and (warm is None or server not in warm.servers):
        raise RequestError(
            "not_found", f"no sandbox for server {server!r} in profile {target.slug!r}"
        )
    old = infos.get(server)
    await _audit(
        ctx, "operator.sandbox.kill", target, server=server, pid=str(old.pid if old else "-")
    )
    # In a warm runtime the server starts again at once (its other servers keep running);
    # otherwise the sandbox is only stopped and the next request starts the profile.
    async with ctx.kills:
        try:
            status = await runtimes.restart_server(target.profile_id, server)
        except RuntimeClosed:
            status = None  # the runtime went away meanwhile (a bundle edit, a cold)
        if status is None:
            await ctx.directory.stop(key)
    now = {i.server: i for i in await ctx.directory.list() if i.profile_id == key.profile_id}
    new = now.get(server)
    return {
        "profile": _profile_json(target),
        "server": server,
        "killed_pid": None if old is None else old.pid,
        "restarted": status is not None,
        "state": None if status is None else status["state"],
        "error": None if status is None else status.get("error"),
        "pid": None if new is None else new.pid,
    }
