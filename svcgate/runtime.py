"""Profile runtimes: the warm state behind ``/mcp/p/<slug>`` (and the legacy ``/mcp``).

A runtime is one profile's aggregator: one sandbox per server of its bundle (owned by the
:class:`~svcgate.supervisor.SandboxSupervisor`, tenant = profile id), one
:class:`~svcgate.downstream.Downstream` JSON-RPC connection over each sandbox's stdio
(initialised in the legacy, handshake protocol: many real servers speak nothing newer), and
one MCP server of the official SDK (``mcp.server.Server`` + its streamable-HTTP session
manager) that serves both protocol generations to clients. Sessions live in the runtime's
own session manager, so a session id is bound to its profile: the same id presented on
another profile's URL is unknown there (THREATS A6); the bearer token is still checked on
every request by the data plane (a session is never authentication).

States (SPEC "Profile runtime"): cold (no entry) -> warm on the first authorised request.
:meth:`RuntimeManager.get` coalesces concurrent first requests into one start; a start that
fails (the bundle is not empty and no server came up) is not cached. Bundle edits, profile
deletion and server uninstall call :meth:`RuntimeManager.invalidate`, which cancels the
runtime: its session manager terminates every session (in-flight requests end without a
response, a transport error for the client) and its sandboxes are stopped. Token rotation
does nothing here. There is no idle reaping.

One bad server never takes a profile down: a server that fails to start, cannot be resolved
(no longer installed or configured) or dies later is left out of the lists, with a log line
and a per-server status (:meth:`RuntimeManager.status`); calls to its tools get a clear
JSON-RPC error. The others keep working.

List changes: a server's ``notifications/*/list_changed`` marks that list stale and re-lists
it in the background, one refresh per server and list at a time, repeated while the server
keeps announcing changes, before every handshake session that listed something is told. A
change announced while the server is being listed at start (read after the list request went
out) is re-listed once the server is ready, so it is never lost.

Forwarding (the hot path) rewrites only what it must: the tool or prompt name, and the
progress token (in :mod:`svcgate.downstream`). Results are passed through as the raw dicts
the server sent; no lock is held across a downstream call, nothing is written to the store.

Resource handling: the manager's nursery (in the daemon's root nursery, inside the sandbox
supervisor) owns one task per runtime; a runtime's nursery owns its downstream readers,
background list refreshes and the SDK session manager. Cancelling a runtime's task tears
all of that down and then stops its sandboxes under a shielded deadline.
"""

from __future__ import annotations

import enum
import json
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, get_args

import mcp_types as types
import trio
from mcp.server.caching import CacheableMethod, CacheHint
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from sandbox import SandboxSpec
from svcgate import audit, fastpath
from svcgate import servers as server_catalogue
from svcgate.asgi_io import Receive, Scope, Send
from svcgate.downstream import Downstream, DownstreamError, DownstreamGone
from svcgate.logs import detach_request
from svcgate.naming import NameMap, exposed_name, map_names, resolve_resources, split_exposed
from svcgate.registry.index import ToolPin
from svcgate.registry.toolpins import Withheld, check_tools
from svcgate.store import Store
from svcgate.supervisor import (
    SandboxKey,
    SandboxOwner,
    SandboxSupervisor,
    SupervisorError,
)

log = logging.getLogger(__name__)
# One INFO record per call relayed to a server (svcgate.logs adds the request id).
relay_log = logging.getLogger("svcgate.relay")

LEGACY_PROFILE_ID = 0
CLIENT_INFO = {"name": "svcgate", "version": "0.1.0"}
# What the gateway offers downstream servers; each request is forwarded to a client that
# declared the capability, or answered with an error (roots: an empty list).
CLIENT_CAPABILITIES: dict[str, Any] = {
    "sampling": {},
    "elicitation": {},
    "roots": {"listChanged": True},
}
INITIALIZE_TIMEOUT = 60.0
LIST_TIMEOUT = 30.0
TEARDOWN_DEADLINE = 15.0
ANNOUNCE_DEADLINE = 1.0
MAX_LISTENERS = 1024  # sessions per profile that get list_changed notifications
_X_MCP_HEADER = '"x-mcp-header"'
MAX_FAST_SESSIONS = 10_000  # handshake sessions remembered for the fast path (then SDK path)
MAX_LIST_PAGES = 100
INTERNAL_ERROR = types.INTERNAL_ERROR
INVALID_PARAMS = types.INVALID_PARAMS
RESOURCE_NOT_FOUND = -32002
_NO_CACHE: dict[CacheableMethod, CacheHint] = {
    method: CacheHint(ttl_ms=0, scope="private") for method in get_args(CacheableMethod)
}


@dataclass(frozen=True)
class RuntimeTarget:
    """Whose runtime: a profile (id, slug, owner) or the legacy bundle (id 0)."""

    profile_id: int
    slug: str
    user_id: int

    @property
    def legacy(self) -> bool:
        return self.profile_id == LEGACY_PROFILE_ID


LEGACY_TARGET = RuntimeTarget(LEGACY_PROFILE_ID, "legacy", 0)


@dataclass(frozen=True)
class ServerDefinition:
    """How to run one server: its sandbox and which of its tools are exposed."""

    name: str
    build_spec: Callable[[SandboxKey, SandboxOwner], SandboxSpec]
    # None: no manifest, every tool is exposed; else only these (default: true) tools.
    default_tools: frozenset[str] | None = None
    # Registry servers: each tool's pinned definition hash (THREATS F5). A tool without a
    # matching pin is withheld and audited; with pins, ``default_tools`` is not used.
    pins: Mapping[str, ToolPin] | None = None


class ServerResolver(Protocol):
    def resolve(self, name: str) -> ServerDefinition | None:
        """The definition of an installed server, or None if it cannot be run."""


class RuntimeStartError(Exception):
    """The runtime could not be started (not cached: the next request retries)."""


class RuntimeClosed(Exception):
    """The runtime was torn down while the request was using it."""


class ServerState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    EXITED = "exited"
    SKIPPED = "skipped"


@dataclass
class ServerRuntime:
    """One server inside a profile runtime."""

    name: str
    definition: ServerDefinition | None
    state: ServerState = ServerState.STARTING
    error: str | None = None
    downstream: Downstream | None = None
    capabilities: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_names: NameMap | None = None
    prompts: list[dict[str, Any]] = field(default_factory=list)
    prompt_names: NameMap | None = None
    resources: list[dict[str, Any]] = field(default_factory=list)
    templates: list[dict[str, Any]] = field(default_factory=list)
    # Lists ("tools", "prompts", "resources") announced changed since their last listing
    # began, and those being re-listed right now (at most one refresh per list).
    stale: set[str] = field(default_factory=set)
    refreshing: set[str] = field(default_factory=set)
    # (tool, hash) pairs already audited as withheld by this runtime.
    reported: set[tuple[str, str]] = field(default_factory=set)
    # The sandbox serving it (for the relay log).
    sandbox: str | None = None
    pid: int | None = None

    def listed_kinds(self) -> list[str]:
        """The lists the gateway keeps for this server: tools, and what it declares."""
        return ["tools", *(k for k in ("prompts", "resources") if k in self.capabilities)]

    def status(self, *, detail: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "state": self.state.value,
            "tools": len(self.tool_names.exposed_to_original) if self.tool_names else 0,
        }
        if detail:
            out["error"] = self.error
        return out


class _AggregateServer(Server[Any]):
    """The SDK server of one runtime; it announces list changes (we emit them)."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options
            or NotificationOptions(
                prompts_changed=True, resources_changed=True, tools_changed=True
            ),
            experimental_capabilities,
            extensions,
        )


class _SessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager with 128-bit session ids (THREATS A6).

    The SDK names sessions ``uuid4().hex``: 32 hex digits but only 122 random bits. The id is
    replaced right after admission, before the SDK reads it (``_admit_session`` is private in
    mcp 2.3; pinned, and covered by the A6 test).
    """

    def _admit_session(self, requestor: Any) -> Any:
        transport = super()._admit_session(requestor)
        if transport is not None and transport.mcp_session_id is not None:
            old, new = transport.mcp_session_id, secrets.token_hex(16)
            transport.mcp_session_id = new
            self._server_instances[new] = self._server_instances.pop(old)
            if old in self._session_owners:
                self._session_owners[new] = self._session_owners.pop(old)
        return transport


Ctx = ServerRequestContext[Any, Any]


def _session_id(ctx: Ctx) -> str | None:
    request = ctx.request
    headers = getattr(request, "headers", None)
    if headers is None:
        return None
    value = headers.get("mcp-session-id")
    return value if isinstance(value, str) else None


MODERN_META_PREFIX = "io.modelcontextprotocol/"


def legacy_params(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` without the 2026-07-28 envelope (``_meta`` keys under the reserved
    ``io.modelcontextprotocol/`` prefix): downstreams speak the handshake era, and an SDK
    server refuses a request that carries the envelope on such a connection."""
    meta = params.get("_meta")
    if not isinstance(meta, dict) or not any(k.startswith(MODERN_META_PREFIX) for k in meta):
        return params
    kept = {k: v for k, v in meta.items() if not k.startswith(MODERN_META_PREFIX)}
    out = {k: v for k, v in params.items() if k != "_meta"}
    if kept:
        out["_meta"] = kept
    return out


def _progress_token(params: Mapping[str, Any] | None) -> str | int | None:
    meta = params.get("_meta") if params else None
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    return token if isinstance(token, (str, int)) and not isinstance(token, bool) else None


class _ServerHooks:
    """Downstream hooks of one server: notifications and server-to-client requests."""

    def __init__(self, runtime: ProfileRuntime, server: ServerRuntime) -> None:
        self._runtime = runtime
        self._server = server

    async def on_notification(
        self, method: str, params: dict[str, Any] | None, contexts: list[Any]
    ) -> None:
        await self._runtime.downstream_notification(self._server, method, params, contexts)

    async def on_request(
        self, method: str, params: dict[str, Any] | None, contexts: list[Any]
    ) -> dict[str, Any]:
        return await self._runtime.downstream_request(self._server, method, params, contexts)


_CLIENT_REQUESTS: dict[str, tuple[Any, Any, str]] = {
    "sampling/createMessage": (types.CreateMessageRequest, types.CreateMessageResult, "sampling"),
    "elicitation/create": (types.ElicitRequest, types.ElicitResult, "elicitation"),
    "roots/list": (types.ListRootsRequest, types.ListRootsResult, "roots"),
}


class ProfileRuntime:
    """The warm runtime of one profile (or the legacy bundle). See the module docstring."""

    def __init__(
        self,
        target: RuntimeTarget,
        supervisor: SandboxSupervisor,
        resolver: ServerResolver,
        store: Store | None = None,
    ) -> None:
        self.target = target
        self._supervisor = supervisor
        self._resolver = resolver
        self._store = store
        self.servers: dict[str, ServerRuntime] = {}
        self.closed = False
        self.started_at = time.time()
        self._nursery: trio.Nursery | None = None
        self._http: StreamableHTTPSessionManager | None = None
        # Handshake sessions that listed something: where list_changed notifications go.
        # Bounded: a session that ended without a broadcast in between stays until evicted.
        self._listeners: OrderedDict[str, Any] = OrderedDict()
        # The aggregated catalogue, rebuilt when a server's lists change.
        self._tools: list[dict[str, Any]] = []
        self._prompts: list[dict[str, Any]] = []
        self._resources: list[dict[str, Any]] = []
        self._templates: list[dict[str, Any]] = []
        self._resource_owner: dict[str, str] = {}
        # The fast path (svcgate.fastpath): exposed tool -> (server, original name) for tools
        # it may serve; handshake sessions that qualify; its calls in flight, by session.
        self._fast_routes: dict[str, tuple[ServerRuntime, str]] = {}
        self._fast_sessions: OrderedDict[str, None] = OrderedDict()
        self._fast_inflight: dict[tuple[str, Any], trio.CancelScope] = {}

    # -- lifetime -------------------------------------------------------------------------

    async def run(self, bundle: list[str], *, task_status: trio.TaskStatus[ProfileRuntime]) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                async with trio.open_nursery() as starters:
                    for name in bundle:
                        self.servers[name] = ServerRuntime(name, self._resolver.resolve(name))
                        starters.start_soon(self._start_server, self.servers[name])
                if bundle and not any(s.state is ServerState.READY for s in self.servers.values()):
                    # Names and states only: error texts (host paths) stay in the log.
                    states = ", ".join(f"{s.name} {s.state.value}" for s in self.servers.values())
                    raise RuntimeStartError(f"no server of the bundle started ({states})")
                self._rebuild()
                self._http = _SessionManager(
                    app=self._build_server(),
                    security_settings=TransportSecuritySettings(
                        # The data plane checks Origin itself (403) before we get here.
                        enable_dns_rebinding_protection=False
                    ),
                )
                async with self._http.run():
                    log.info(
                        "profile %s warm: %d/%d server(s) ready, %d tool(s)",
                        self.target.slug,
                        sum(s.state is ServerState.READY for s in self.servers.values()),
                        len(bundle),
                        len(self._tools),
                    )
                    task_status.started(self)
                    await trio.sleep_forever()
        finally:
            self.closed = True
            self._listeners.clear()
            with trio.move_on_after(TEARDOWN_DEADLINE) as deadline:
                deadline.shield = True
                for server in self.servers.values():
                    if server.downstream is not None:
                        await server.downstream.close()
                await self._supervisor.stop_profile(self.target.profile_id)
            if deadline.cancelled_caught:
                log.error("profile %s: sandboxes did not stop in time", self.target.slug)

    async def handle(self, scope: Scope, receive: Receive, send: Send, message: Any = None) -> None:
        """Serve one HTTP request of the MCP streamable-HTTP transport; ``message`` is the
        POST body, already parsed (and checked to be strict JSON) by the data plane."""
        if self.closed or self._http is None:
            raise RuntimeClosed
        if message is not None:
            request = fastpath.classify(
                scope["headers"],
                message,
                fast_session=self._fast_session,
                plain_tool=self._fast_routable,
            )
            if request is not None:
                await self._relay(request, receive, send)
                return
            if isinstance(message, dict) and "id" not in message:
                if message.get("method") == "notifications/cancelled" and self._cancel_fast(
                    scope, message
                ):
                    await send({"type": "http.response.start", "status": 202, "headers": []})
                    await send({"type": "http.response.body", "body": b""})
                    return
            elif isinstance(message, dict) and message.get("method") == "initialize":
                send = self._noting_session(message, send)
        try:
            await self._http.handle_request(scope, receive, send)  # type: ignore[arg-type]
        except RuntimeError as exc:
            # The session manager stopped between our check and its use.
            raise RuntimeClosed from exc

    # -- the fast path (svcgate.fastpath) ---------------------------------------------------

    def _fast_session(self, session_id: str) -> bool:
        if session_id not in self._fast_sessions:
            return False
        http = self._http
        if http is None or session_id not in http._server_instances:
            del self._fast_sessions[session_id]  # ended (DELETE, idle expiry)
            return False
        return True

    def _fast_routable(self, tool: str) -> bool:
        route = self._fast_routes.get(tool)
        return (
            route is not None
            and route[0].state is ServerState.READY
            and route[0].downstream is not None
        )

    def _noting_session(self, message: dict[str, Any], send: Send) -> Send:
        """``send`` that remembers the session an ``initialize`` opens, when it qualifies."""
        params = message.get("params")
        capabilities = params.get("capabilities") if isinstance(params, dict) else None
        if not fastpath.qualifies_for_fast_path(capabilities):
            return send

        async def noting(reply: dict[str, Any]) -> None:
            if reply["type"] == "http.response.start":
                for key, value in reply.get("headers", ()):
                    if bytes(key).lower() == b"mcp-session-id":
                        self._fast_sessions[bytes(value).decode("latin-1")] = None
                        while len(self._fast_sessions) > MAX_FAST_SESSIONS:
                            self._fast_sessions.popitem(last=False)
            await send(reply)

        return noting

    def _cancel_fast(self, scope: Scope, message: dict[str, Any]) -> bool:
        """Honour a handshake client's ``notifications/cancelled`` for a fast-path call."""
        session = next((v for k, v in scope["headers"] if k == b"mcp-session-id"), None)
        params = message.get("params")
        if session is None or not isinstance(params, dict):
            return False
        key = (bytes(session).decode("latin-1"), params.get("requestId"))
        try:
            cancel = self._fast_inflight.get(key)
        except TypeError:  # an unhashable requestId
            return False
        if cancel is None:
            return False
        cancel.cancel()
        return True

    async def _relay(self, request: fastpath.FastRequest, receive: Receive, send: Send) -> None:
        """Serve a ``tools/call`` on the fast path (see :mod:`svcgate.fastpath`)."""
        server, original = self._fast_routes[request.tool]
        downstream = server.downstream
        assert downstream is not None
        params = {**legacy_params(request.params), "name": original}
        call = fastpath.FastCall(request.request_id)
        on_progress = call.progress if _progress_token(params) is not None else None
        outcome: dict[str, Any] = {}

        async def invoke() -> None:
            started, ended, code = time.perf_counter(), "cancelled", None
            try:
                result = await downstream.request(
                    "tools/call", params, context=call, on_progress=on_progress
                )
                outcome["result"] = _complete(result) if request.modern else result
                ended = "tool_error" if result.get("isError") is True else "ok"
            except DownstreamError as exc:
                outcome["error"] = exc.to_json()
                ended, code = "error", exc.code
            except DownstreamGone:
                outcome["error"] = {"code": INTERNAL_ERROR, "message": _gone(server)}
                ended = "gone"
            finally:
                call.finish()
                self._log_relay(server, "tools/call", original, ended, started, code)

        gone = False

        async def watch(cancel: trio.CancelScope) -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            cancel.cancel()

        key = None if request.session_id is None else (request.session_id, request.request_id)
        streaming = answered = False
        async with trio.open_nursery() as nursery:
            if key is not None:
                self._fast_inflight[key] = nursery.cancel_scope
            try:
                nursery.start_soon(invoke)
                nursery.start_soon(watch, nursery.cancel_scope)
                async for event in call.outbox:
                    if not streaming:
                        await fastpath.start_stream(send, request)
                        streaming = True
                    await send({"type": "http.response.body", "body": event, "more_body": True})
                reply = {"jsonrpc": "2.0", "id": request.request_id, **outcome}
                await fastpath.respond(send, request, reply, streaming=streaming)
                answered = True
                nursery.cancel_scope.cancel()
            finally:
                if key is not None:
                    self._fast_inflight.pop(key, None)
        if answered or gone:
            return
        # Cancelled by the client's notifications/cancelled: no answer is owed, but the
        # HTTP exchange must end.
        if not streaming:
            await fastpath.start_stream(send, request)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    # -- starting servers ------------------------------------------------------------------

    async def _start_server(self, server: ServerRuntime) -> None:
        definition = server.definition
        if definition is None:
            server.state = ServerState.SKIPPED
            server.error = "not installed or not runnable on this gateway"
            log.warning(
                "profile %s: server %r is in the bundle but not installed; skipped",
                self.target.slug,
                server.name,
            )
            return
        key = SandboxKey(self.target.profile_id, server.name)
        owner = SandboxOwner(self.target.slug, self.target.user_id)

        async def spec() -> SandboxSpec:
            return definition.build_spec(key, owner)

        try:
            handle = await self._supervisor.ensure(key, spec, owner=owner)
            downstream = Downstream(
                f"{self.target.slug}/{server.name}",
                handle.stdin,
                handle.stdout,
                _ServerHooks(self, server),
            )
            server.downstream = downstream
            server.sandbox, server.pid = handle.name, handle.pid
            handle.correlate_stderr(downstream.request_ids_in_flight)
            assert self._nursery is not None
            await self._nursery.start(self._serve_downstream, server, downstream)
            result = await downstream.initialize(
                client_info=CLIENT_INFO,
                capabilities=CLIENT_CAPABILITIES,
                timeout=INITIALIZE_TIMEOUT,
            )
            caps = result.get("capabilities")
            server.capabilities = caps if isinstance(caps, dict) else {}
            with trio.fail_after(LIST_TIMEOUT):
                for kind in server.listed_kinds():
                    await self._refresh(server, kind)
        except (SupervisorError, DownstreamGone, DownstreamError, trio.TooSlowError) as exc:
            message = str(exc) or type(exc).__name__
            if isinstance(exc, trio.TooSlowError):
                message = "timed out listing its tools"
            server.state = ServerState.FAILED
            server.error = message
            log.warning(
                "profile %s: server %r failed to start: %s", self.target.slug, server.name, message
            )
            if server.downstream is not None:
                await server.downstream.close()
            with trio.CancelScope(shield=True):
                await self._supervisor.stop(key)
            return
        if server.state is ServerState.STARTING:
            server.state = ServerState.READY
            # Changes announced after their listing above began: list those again.
            for kind in server.listed_kinds():
                if kind in server.stale:
                    self._schedule_refresh(server, kind)

    async def _serve_downstream(
        self,
        server: ServerRuntime,
        downstream: Downstream,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        await downstream.run(task_status=task_status)
        if self.closed:
            return
        was_ready = server.state is ServerState.READY
        if server.state in (ServerState.READY, ServerState.STARTING):
            server.state = ServerState.EXITED
            server.error = "the server exited"
        log.warning(
            "profile %s: server %r exited; its tools are left out", self.target.slug, server.name
        )
        if was_ready:
            self._rebuild()
            await self._broadcast("tools", "prompts", "resources")

    async def _list_all(self, server: ServerRuntime, method: str, key: str) -> list[dict[str, Any]]:
        assert server.downstream is not None
        items: list[dict[str, Any]] = []
        cursor: Any = None
        for _ in range(MAX_LIST_PAGES):
            params = {"cursor": cursor} if cursor is not None else None
            result = await server.downstream.request(method, params)
            page = result.get(key)
            if isinstance(page, list):
                items.extend(item for item in page if isinstance(item, dict))
            cursor = result.get("nextCursor")
            if not cursor:
                break
        return items

    async def _refresh(self, server: ServerRuntime, kind: str) -> None:
        """List ``kind`` of ``server`` again; a change announced from now on marks it stale."""
        server.stale.discard(kind)
        if kind == "tools":
            await self._refresh_tools(server)
        elif kind == "prompts":
            await self._refresh_prompts(server)
        else:
            await self._refresh_resources(server)

    async def _refresh_tools(self, server: ServerRuntime) -> None:
        tools = [t for t in await self._list_all(server, "tools/list", "tools") if _named(t)]
        definition = server.definition
        if definition is not None and definition.pins is not None:
            tools, withheld = check_tools(tools, definition.pins)
            await self._report_withheld(server, withheld)
        elif definition is not None and definition.default_tools is not None:
            tools = [t for t in tools if t["name"] in definition.default_tools]
        server.tool_names = map_names(server.name, [t["name"] for t in tools])
        for name in server.tool_names.dropped:
            log.warning(
                "server %r: tool %r cannot be given a valid name; hidden", server.name, name
            )
        server.tools = tools

    async def _report_withheld(self, server: ServerRuntime, withheld: list[Withheld]) -> None:
        """Log and audit tools that differ from their pins (once per tool and hash)."""
        fresh = [w for w in withheld if (w.name, w.sha256) not in server.reported]
        if not fresh:
            return
        for item in fresh:
            server.reported.add((item.name, item.sha256))
            log.warning(
                "profile %s: server %r offers %s tool %r (not as pinned at install); withheld",
                self.target.slug,
                server.name,
                item.reason,
                item.name[:128],
            )
        if self._store is None:
            return
        target = self.target

        def write(conn: Any) -> None:
            for item in fresh:
                audit.record(
                    conn,
                    kind="admin",
                    decision="tool_withheld",
                    user_id=target.user_id,
                    profile_id=target.profile_id,
                    server=server.name,
                    detail=f"{item.reason} tool {item.name[:128]!r} sha256={item.sha256}",
                )

        with trio.CancelScope(shield=True):
            await self._store.write(write)

    async def _refresh_prompts(self, server: ServerRuntime) -> None:
        prompts = [p for p in await self._list_all(server, "prompts/list", "prompts") if _named(p)]
        server.prompt_names = map_names(server.name, [p["name"] for p in prompts])
        server.prompts = prompts

    async def _refresh_resources(self, server: ServerRuntime) -> None:
        server.resources = [
            r
            for r in await self._list_all(server, "resources/list", "resources")
            if isinstance(r.get("uri"), str)
        ]
        try:
            server.templates = await self._list_all(
                server, "resources/templates/list", "resourceTemplates"
            )
        except DownstreamError:
            server.templates = []

    def _ready(self) -> list[ServerRuntime]:
        return [s for _, s in sorted(self.servers.items()) if s.state is ServerState.READY]

    def _rebuild(self) -> None:
        """Recompute the aggregated catalogue from the ready servers' cached lists."""
        tools: list[dict[str, Any]] = []
        prompts: list[dict[str, Any]] = []
        routes: dict[str, tuple[ServerRuntime, str]] = {}
        for server in self._ready():
            if server.tool_names is not None:
                for tool in server.tools:
                    suffix = server.tool_names.original_to_exposed.get(tool["name"])
                    if suffix is None:
                        continue
                    name = exposed_name(server.name, suffix)
                    tools.append({**tool, "name": name})
                    # A tool with x-mcp-header parameters has Mcp-Param-* headers for the
                    # SDK to check against its arguments: it takes the SDK path.
                    if _X_MCP_HEADER not in json.dumps(tool.get("inputSchema")):
                        routes[name] = (server, tool["name"])
            if server.prompt_names is not None:
                for prompt in server.prompts:
                    suffix = server.prompt_names.original_to_exposed.get(prompt["name"])
                    if suffix is not None:
                        prompts.append({**prompt, "name": exposed_name(server.name, suffix)})
        owners, hidden = resolve_resources(
            {s.name: [r["uri"] for r in s.resources] for s in self._ready()}
        )
        for server_name, uri in hidden:
            log.info("resource %r of server %r hidden: another server owns it", uri, server_name)
        resources = [
            r for s in self._ready() for r in s.resources if owners.get(r["uri"]) == s.name
        ]
        templates = [t for s in self._ready() for t in s.templates]
        self._tools, self._prompts, self._fast_routes = tools, prompts, routes
        self._resources, self._templates, self._resource_owner = resources, templates, owners

    # -- the SDK server's handlers ---------------------------------------------------------

    def _build_server(self) -> Server[Any]:
        server = _AggregateServer(
            "svcgate",
            version=CLIENT_INFO["version"],
            # 2026-07-28 list results carry freshness hints; ours change with the bundle
            # and the servers' own lists, so they are private and immediately stale.
            cache_hints=_NO_CACHE,
        )
        # Registered by method (not the typed on_* arguments): results are the raw dicts the
        # downstream servers sent, which the SDK serialises as they are.
        handlers: list[tuple[str, type[Any], Any]] = [
            ("tools/list", types.PaginatedRequestParams, self._list_tools),
            ("tools/call", types.CallToolRequestParams, self._call_tool),
            ("prompts/list", types.PaginatedRequestParams, self._list_prompts),
            ("prompts/get", types.GetPromptRequestParams, self._get_prompt),
            ("resources/list", types.PaginatedRequestParams, self._list_resources),
            ("resources/templates/list", types.PaginatedRequestParams, self._list_templates),
            ("resources/read", types.ReadResourceRequestParams, self._read_resource),
            ("logging/setLevel", types.SetLevelRequestParams, self._set_level),
        ]
        for method, params_type, handler in handlers:
            server.add_request_handler(method, params_type, handler)
        # No OpenTelemetry exporter is configured; skip its per-message middleware.
        server.middleware = []
        return server

    def _listen(self, ctx: Ctx) -> None:
        session_id = _session_id(ctx)
        if session_id is not None:
            self._listeners[session_id] = ctx.session
            self._listeners.move_to_end(session_id)
            while len(self._listeners) > MAX_LISTENERS:
                self._listeners.popitem(last=False)

    async def _list_tools(self, ctx: Ctx, params: Any) -> dict[str, Any]:
        self._listen(ctx)
        return _shaped(ctx, {"tools": self._tools})

    async def _list_prompts(self, ctx: Ctx, params: Any) -> dict[str, Any]:
        self._listen(ctx)
        return _shaped(ctx, {"prompts": self._prompts})

    async def _list_resources(self, ctx: Ctx, params: Any) -> dict[str, Any]:
        self._listen(ctx)
        return _shaped(ctx, {"resources": self._resources})

    async def _list_templates(self, ctx: Ctx, params: Any) -> dict[str, Any]:
        return _shaped(ctx, {"resourceTemplates": self._templates})

    def _route(self, exposed: str, kind: str) -> tuple[ServerRuntime, str]:
        split = split_exposed(exposed)
        server = self.servers.get(split[0]) if split else None
        names = None
        if server is not None:
            names = server.tool_names if kind == "tool" else server.prompt_names
        original = names.exposed_to_original.get(split[1]) if names and split else None
        if server is None or original is None:
            raise MCPError(INVALID_PARAMS, f"unknown {kind} {exposed!r}")
        if server.state is not ServerState.READY or server.downstream is None:
            raise MCPError(
                INTERNAL_ERROR,
                f"server {server.name!r} is not running ({server.error or server.state.value});"
                f" its {kind}s are unavailable",
            )
        return server, original

    async def _forward(
        self, ctx: Ctx, server: ServerRuntime, method: str, params: dict[str, Any]
    ) -> dict[str, Any]:
        assert server.downstream is not None
        params = legacy_params(params)
        token = _progress_token(params)
        on_progress = None
        if token is not None:
            related = ctx.request_id

            async def on_progress(progress: dict[str, Any]) -> None:
                try:
                    await ctx.session.send_notification(
                        types.ProgressNotification(
                            params=types.ProgressNotificationParams.model_validate(progress)
                        ),
                        related_request_id=related,
                    )
                except Exception as exc:  # noqa: BLE001  # a gone client must not fail the call
                    log.debug("progress not delivered: %s", exc)

        started, ended, code = time.perf_counter(), "cancelled", None
        try:
            result = await server.downstream.request(
                method, params, context=ctx, on_progress=on_progress
            )
            ended = "tool_error" if result.get("isError") is True else "ok"
            return _shaped(ctx, result)
        except DownstreamError as exc:
            ended, code = "error", exc.code
            raise MCPError(exc.code, exc.message, exc.data) from None
        except DownstreamGone:
            ended = "gone"
            raise MCPError(INTERNAL_ERROR, _gone(server)) from None
        finally:
            name = params.get("name") if method in _NAMED_CALLS else None
            self._log_relay(server, method, name, ended, started, code)

    def _log_relay(
        self,
        server: ServerRuntime,
        method: str,
        name: Any,
        ended: str,
        started: float,
        code: int | None,
    ) -> None:
        """The relay record of one call: where it went, how it ended (``ok``,
        ``tool_error``, ``error`` with ``error_code``, ``gone``, ``cancelled``) and how long
        the server took; never its arguments or its result."""
        if not relay_log.isEnabledFor(logging.INFO):
            return
        extra: dict[str, Any] = {
            "profile": self.target.slug,
            "server": server.name,
            "sandbox": server.sandbox,
            "pid": server.pid,
            "method": method,
            "outcome": ended,
            "duration_ms": round((time.perf_counter() - started) * 1000, 2),
        }
        if code is not None:
            extra["error_code"] = code
        if isinstance(name, str):
            extra[_NAMED_CALLS[method]] = name
            relay_log.info("%s %s: %s", method, name, ended, extra=extra)
        else:
            relay_log.info("%s: %s", method, ended, extra=extra)

    async def _call_tool(self, ctx: Ctx, params: Any) -> dict[str, Any]:
        raw = dict(ctx.params or {})
        server, original = self._route(str(raw.get("name")), "tool")
        raw["name"] = original
        return await self._forward(ctx, server, "tools/call", raw)

    async def _get_prompt(self, ctx: Ctx, params: Any) -> dict[str, Any]:
        raw = dict(ctx.params or {})
        server, original = self._route(str(raw.get("name")), "prompt")
        raw["name"] = original
        return await self._forward(ctx, server, "prompts/get", raw)

    async def _read_resource(self, ctx: Ctx, params: Any) -> dict[str, Any]:
        raw = dict(ctx.params or {})
        uri = str(raw.get("uri"))
        owner = self._resource_owner.get(uri)
        candidates = [self.servers[owner]] if owner else []
        if not candidates:
            # Not a listed resource: try servers whose templates could produce it.
            candidates = [
                s for s in self._ready() if any(_template_matches(t, uri) for t in s.templates)
            ]
        for server in candidates:
            if server.state is ServerState.READY:
                return await self._forward(ctx, server, "resources/read", raw)
        raise MCPError(RESOURCE_NOT_FOUND, f"resource {uri!r} not found")

    async def _set_level(self, ctx: Ctx, params: Any) -> dict[str, Any]:
        raw = dict(ctx.params or {})
        for server in self._ready():
            if "logging" in server.capabilities and server.downstream is not None:
                try:
                    await server.downstream.request("logging/setLevel", raw)
                except (DownstreamError, DownstreamGone) as exc:
                    log.info("server %r refused logging/setLevel: %s", server.name, exc)
        return {}

    # -- from downstream servers -------------------------------------------------------------

    async def downstream_notification(
        self, server: ServerRuntime, method: str, params: dict[str, Any] | None, contexts: list[Any]
    ) -> None:
        if method == "notifications/message":
            await self._forward_log(server, params or {}, contexts)
        elif method in _LIST_CHANGED:
            kind = _LIST_CHANGED[method]
            server.stale.add(kind)
            # While the server starts, _start_server re-lists what changed once it is ready.
            if server.state is ServerState.READY and kind in server.listed_kinds():
                self._schedule_refresh(server, kind)
        else:
            log.debug("server %r: notification %s not forwarded", server.name, method)

    def _schedule_refresh(self, server: ServerRuntime, kind: str) -> None:
        if kind in server.refreshing or self._nursery is None or self.closed:
            return  # the running refresh sees the list is stale again and repeats
        server.refreshing.add(kind)
        self._nursery.start_soon(self._list_changed, server, kind)

    async def _list_changed(self, server: ServerRuntime, kind: str) -> None:
        """Re-list ``kind`` while it is stale, then tell the sessions that listed."""
        try:
            while kind in server.stale and server.state is ServerState.READY:
                try:
                    with trio.fail_after(LIST_TIMEOUT):
                        await self._refresh(server, kind)
                except (DownstreamError, DownstreamGone, trio.TooSlowError) as exc:
                    log.warning("server %r: refreshing its %s failed: %s", server.name, kind, exc)
                    return
                if kind not in server.stale:  # else it changed again meanwhile: list again
                    self._rebuild()
                    await self._broadcast(kind)
        finally:
            server.refreshing.discard(kind)

    async def announce_teardown(self) -> None:
        """The bundle is going away: every list changes."""
        await self._broadcast("tools", "prompts", "resources")

    async def restart_server(self, name: str) -> ServerRuntime:
        """Stop the sandbox of ``name`` and start a fresh one (``svcgate sandbox kill``).

        The other servers keep running. The new start runs in the runtime's nursery, so a
        teardown meanwhile stops it with the rest; calls to the server's tools fail until it
        is ready again. Raises :class:`RuntimeClosed` if the runtime is gone. Callers
        serialise restarts of one server (the operator socket does).
        """
        nursery = self._nursery
        if self.closed or nursery is None:
            raise RuntimeClosed
        old = self.servers[name]
        fresh = ServerRuntime(name, self._resolver.resolve(name))
        self.servers[name] = fresh
        self._rebuild()  # the old server's tools leave the lists and the fast path
        if old.downstream is not None:
            await old.downstream.close()
        await self._supervisor.stop(SandboxKey(self.target.profile_id, name))
        if self.closed:
            raise RuntimeClosed  # torn down meanwhile: its sandboxes are going anyway
        started = trio.Event()

        async def start() -> None:
            try:
                await self._start_server(fresh)
            finally:
                started.set()

        nursery.start_soon(start)
        await started.wait()
        if not self.closed:
            self._rebuild()
            await self._broadcast("tools", "prompts", "resources")
        return fresh

    async def _broadcast(self, *kinds: str) -> None:
        """Tell every handshake session that listed something that these lists changed."""
        for session_id, session in list(self._listeners.items()):
            try:
                with trio.move_on_after(5):
                    for kind in kinds:
                        await session.send_notification(_LIST_CHANGED_NOTIFICATION[kind]())
            except Exception as exc:  # noqa: BLE001  # the session is gone: forget it
                log.debug("list_changed not delivered to a session: %s", exc)
                self._listeners.pop(session_id, None)

    async def _forward_log(
        self, server: ServerRuntime, params: dict[str, Any], contexts: list[Any]
    ) -> None:
        logger = params.get("logger")
        forwarded = {**params, "logger": f"{server.name}.{logger}" if logger else server.name}
        try:
            notification = types.LoggingMessageNotification(
                params=types.LoggingMessageNotificationParams.model_validate(forwarded)
            )
        except ValueError:
            log.debug("server %r sent a malformed log message", server.name)
            return
        targets: list[tuple[Any, Any]] = (
            [(contexts[0].session, contexts[0].request_id)]
            if (contexts)
            else [(s, None) for s in self._listeners.values()]
        )
        for session, related in targets:
            try:
                with trio.move_on_after(5):
                    await session.send_notification(notification, related_request_id=related)
            except Exception as exc:  # noqa: BLE001  # a gone client must not fail the server
                log.debug("log message not delivered: %s", exc)

    async def downstream_request(
        self, server: ServerRuntime, method: str, params: dict[str, Any] | None, contexts: list[Any]
    ) -> dict[str, Any]:
        entry = _CLIENT_REQUESTS.get(method)
        if entry is None:
            raise DownstreamError(-32601, f"method {method!r} is not supported by the gateway")
        request_type, result_type, capability = entry
        for ctx in contexts:
            caps = ctx.session.client_capabilities
            if caps is None or getattr(caps, capability, None) is None:
                continue
            if not ctx.session.can_send_request:
                continue
            try:
                request = request_type.model_validate(
                    {"method": method, **({"params": params} if params is not None else {})}
                )
            except ValueError as exc:
                raise DownstreamError(INVALID_PARAMS, f"invalid {method} request: {exc}") from None
            try:
                result = await ctx.session.send_request(
                    request,
                    result_type,
                    metadata=ServerMessageMetadata(related_request_id=ctx.request_id),
                )
            except MCPError as exc:
                raise DownstreamError(exc.code, exc.message, exc.data) from None
            dumped: dict[str, Any] = result.model_dump(
                by_alias=True, mode="json", exclude_none=True
            )
            return dumped
        if method == "roots/list":
            return {"roots": []}
        raise DownstreamError(
            INTERNAL_ERROR, f"no connected client can answer {method} for server {server.name!r}"
        )


# Relayed methods whose ``name`` parameter the relay log records, and under which field.
_NAMED_CALLS = {"tools/call": "tool", "prompts/get": "prompt"}
_LIST_CHANGED = {
    "notifications/tools/list_changed": "tools",
    "notifications/prompts/list_changed": "prompts",
    "notifications/resources/list_changed": "resources",
}
_LIST_CHANGED_NOTIFICATION: dict[str, Callable[[], Any]] = {
    "tools": types.ToolListChangedNotification,
    "prompts": types.PromptListChangedNotification,
    "resources": types.ResourceListChangedNotification,
}


def _shaped(ctx: Ctx, result: dict[str, Any]) -> dict[str, Any]:
    """Results on the 2026-07-28 wire need ``resultType``; downstreams speak older revisions."""
    return _complete(result) if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS else result


def _complete(result: dict[str, Any]) -> dict[str, Any]:
    return result if "resultType" in result else {**result, "resultType": "complete"}


def _gone(server: ServerRuntime) -> str:
    return f"server {server.name!r} stopped while handling the request"


def _named(item: dict[str, Any]) -> bool:
    return isinstance(item.get("name"), str)


def _template_matches(template: dict[str, Any], uri: str) -> bool:
    pattern = template.get("uriTemplate")
    if not isinstance(pattern, str):
        return False
    prefix = pattern.split("{", 1)[0]
    return bool(prefix) and uri.startswith(prefix)


@dataclass
class _Entry:
    target: RuntimeTarget
    ready: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    runtime: ProfileRuntime | None = None
    error: BaseException | None = None
    # Torn down by invalidate(): a request waiting on it starts a fresh runtime instead.
    invalidated: bool = False


class RuntimeManager:
    """The profile-runtime supervisor: owns every runtime's task; see the module docstring.

    Implements :class:`~svcgate.runtime_hooks.RuntimeInvalidator` for the control plane.
    """

    def __init__(
        self, store: Store, supervisor: SandboxSupervisor, resolver: ServerResolver
    ) -> None:
        self._store = store
        self._supervisor = supervisor
        self._resolver = resolver
        self._entries: dict[int, _Entry] = {}
        self._nursery: trio.Nursery | None = None

    async def run(
        self, *, task_status: trio.TaskStatus[RuntimeManager] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started(self)
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    async def get(self, target: RuntimeTarget) -> ProfileRuntime:
        """The warm runtime of ``target``, starting it if it is cold (coalesced)."""
        while True:
            entry = self._entries.get(target.profile_id)
            if entry is None:
                entry = self._start(target)
            await entry.ready.wait()
            if entry.runtime is not None and not entry.runtime.closed:
                return entry.runtime
            if entry.invalidated:
                # Invalidated while starting (an install, a bundle edit): start afresh.
                await entry.done.wait()
                continue
            if entry.error is not None:
                raise RuntimeStartError(str(entry.error)) from entry.error
            if self._entries.get(target.profile_id) is entry:
                await entry.done.wait()

    def warm(self, profile_id: int) -> ProfileRuntime | None:
        """The runtime of ``profile_id`` if it is warm (never starts one)."""
        entry = self._entries.get(profile_id)
        runtime = entry.runtime if entry is not None else None
        return runtime if runtime is not None and not runtime.closed else None

    def _start(self, target: RuntimeTarget) -> _Entry:
        if self._nursery is None:
            raise RuntimeStartError("the gateway is shutting down")
        entry = _Entry(target)
        self._entries[target.profile_id] = entry
        self._nursery.start_soon(self._own, entry, name=f"runtime {target.slug}")
        return entry

    async def _own(self, entry: _Entry) -> None:
        # Started by a request, the runtime (and its sandboxes) outlives it and serves others.
        detach_request()
        target = entry.target
        try:
            with entry.scope:
                bundle = await self._store.read(
                    server_catalogue.installed_names
                    if target.legacy
                    else lambda conn: server_catalogue.profile_bundle(conn, target.profile_id)
                )
                runtime = ProfileRuntime(target, self._supervisor, self._resolver, self._store)
                async with trio.open_nursery() as nursery:
                    entry.runtime = await nursery.start(runtime.run, bundle)
                    entry.ready.set()
            if entry.runtime is None and entry.error is None:
                entry.error = RuntimeStartError("invalidated while starting")
        except Exception as exc:  # noqa: BLE001  # any start failure goes to the waiters
            while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
                exc = exc.exceptions[0]
            entry.error = exc
            log.warning("profile %s failed to start: %s", target.slug, exc)
        finally:
            if self._entries.get(target.profile_id) is entry:
                del self._entries[target.profile_id]
            if entry.runtime is None and entry.error is None:
                entry.error = RuntimeStartError("the gateway is shutting down")
            entry.ready.set()
            entry.done.set()

    async def invalidate(
        self, profile_ids: Iterable[int], *, reason: str, restart: bool = True
    ) -> None:
        """Tear down the warm (or starting) runtimes of these profiles.

        With ``restart``, a request waiting for one of them to start starts it afresh (its
        bundle or servers changed); without (the profile is gone, the gateway stops), the
        waiting request fails.
        """
        entries = [self._entries[p] for p in sorted(set(profile_ids)) if p in self._entries]
        for entry in entries:
            log.info("profile %s: runtime invalidated (%s)", entry.target.slug, reason)
            entry.invalidated = restart
            del self._entries[entry.target.profile_id]
        # Tell open sessions their lists changed (best effort, bounded) before they end, so
        # a client listening on its GET stream re-lists after reconnecting.
        with trio.move_on_after(ANNOUNCE_DEADLINE):
            async with trio.open_nursery() as nursery:
                for entry in entries:
                    if entry.runtime is not None and not entry.runtime.closed:
                        nursery.start_soon(entry.runtime.announce_teardown)
        for entry in entries:
            entry.scope.cancel()
        for entry in entries:
            await entry.done.wait()

    async def invalidate_server(self, server: str, *, reason: str) -> None:
        """Invalidate every runtime whose bundle includes ``server`` (and the legacy one)."""
        ids = [
            pid
            for pid, entry in self._entries.items()
            if entry.runtime is None or server in entry.runtime.servers or entry.target.legacy
        ]
        await self.invalidate(ids, reason=reason)

    async def close(self) -> None:
        """Tear down every runtime (gateway shutdown, before the sandbox supervisor stops)."""
        await self.invalidate(list(self._entries), reason="gateway shutting down", restart=False)

    def counts(self) -> dict[str, int]:
        """How many runtimes are ``warm`` and ``starting`` (``svcgate status``)."""
        warm = sum(1 for pid in self._entries if self.warm(pid) is not None)
        return {"warm": warm, "starting": len(self._entries) - warm}

    async def restart_server(self, profile_id: int, server: str) -> dict[str, Any] | None:
        """Restart ``server`` in the warm runtime of ``profile_id`` (``sandbox kill``) and
        return its status; None when no warm runtime runs that server."""
        runtime = self.warm(profile_id)
        if runtime is None or server not in runtime.servers:
            return None
        return (await runtime.restart_server(server)).status(detail=True)

    def status(self, profile_id: int, *, detail: bool) -> dict[str, Any]:
        """``{"state": "cold"|"starting"|"warm", "servers": [...]}`` for the API."""
        entry = self._entries.get(profile_id)
        if entry is None:
            return {"state": "cold", "servers": []}
        runtime = entry.runtime
        if runtime is None or runtime.closed:
            return {"state": "starting", "servers": []}
        return {
            "state": "warm",
            "servers": [s.status(detail=detail) for _, s in sorted(runtime.servers.items())],
        }
