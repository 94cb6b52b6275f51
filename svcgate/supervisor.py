"""The sandbox supervisor: owns the lifetime of every sandbox the gateway runs.

A sandbox is identified by a :class:`SandboxKey` (profile id, server name); the tenant is the
profile id and the owning user is recorded beside it (:class:`SandboxOwner`). Request
handlers never own a sandbox: they call :meth:`SandboxSupervisor.ensure` and get a
:class:`SandboxHandle` whose stdio streams they may use, while the sandbox itself lives in a
task of the supervisor's nursery.

Usage (the daemon's root nursery)::

    supervisor = SandboxSupervisor(SupervisorConfig(state_dir=...))
    await nursery.start(supervisor.run)
    handle = await supervisor.ensure(key, spec_factory, owner=owner)

* ``ensure`` spawns when no sandbox runs for the key. Concurrent callers for one key wait
  for the same spawn. A failed spawn is not cached: the next call tries again. A sandbox
  that exited by itself stays listed (state ``exited``, with its stderr for ``sandbox
  logs``) until the next ``ensure`` replaces it or ``stop`` forgets it.
* ``stop(key)`` / ``stop_profile(profile_id)`` stop sandboxes (SIGTERM, grace, SIGKILL) and
  wait until everything they held is released.
* ``list()`` reports runtime information: pid, namespace, egress listener, start time,
  state, server, profile and owner.

Protocol readiness (the MCP handshake over the handle's streams) is the caller's job: the
supervisor only knows processes.

Resource handling:
    :meth:`SandboxSupervisor.run` opens the launcher (spawner thread, host checks), removes
    what a crashed run left behind (``Launcher.cleanup_leftovers``), then opens the nursery
    that holds one owner task per sandbox and reports readiness. Each owner task runs
    ``Launcher.run``, whose shielded ``finally`` releases the sandbox's process tree,
    cgroup, namespace, scratch dir and record. Cancelling ``run`` (daemon shutdown) cancels
    every owner task, waits for all of them, then closes the launcher: nothing is left.
    ``run`` may be entered once.

Error handling:
    A spawn failure (the spec factory raising, bwrap refusing, a host check) is logged and
    raised to every waiting ``ensure`` caller as :class:`SandboxSpawnError`; it never ends
    the supervisor. A sandbox's own failure after start ends only that sandbox. A host that
    cannot run sandboxes at all makes ``run`` raise :class:`SupervisorStartError` before it
    reports readiness. ``trio.Cancelled`` is never swallowed.
"""

from __future__ import annotations

import builtins
import enum
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import trio

from sandbox import LauncherConfig, SandboxSpec, open_launcher
from sandbox.instance import Sandbox
from sandbox.launcher import Launcher, Prepare
from sandbox.stderr_log import InFlight, StderrLog

log = logging.getLogger(__name__)

SpecFactory = Callable[[], Awaitable[SandboxSpec]]


class EgressAttachment(Protocol):
    """One sandbox's egress listener, as the supervisor sees it."""

    @property
    def listener(self) -> str: ...

    @property
    def connections(self) -> int: ...

    def apply(self, spec: SandboxSpec) -> SandboxSpec:
        """The spec with the proxy's environment and files added."""
        ...


class SandboxEgress(Protocol):
    """The egress proxy: serves one listener inside each sandbox's namespace."""

    async def serve(
        self,
        key: SandboxKey,
        owner: SandboxOwner,
        namespace: str,
        *,
        task_status: trio.TaskStatus[EgressAttachment] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Open the listener in ``namespace``, report it, serve until cancelled."""
        ...


class SupervisorError(Exception):
    """Base class of the supervisor's errors."""


class SupervisorStartError(SupervisorError):
    """The host cannot run sandboxes (missing bwrap, no cgroups, unusable state dir)."""


class SupervisorClosed(SupervisorError):
    """The supervisor is not running (not started yet, or shut down)."""


class SandboxSpawnError(SupervisorError):
    """Starting a sandbox failed; ``str()`` says why (bwrap's message included)."""


class SandboxNotFound(SupervisorError):
    """No sandbox is known for the requested profile and server."""


class SandboxState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    EXITED = "exited"


@dataclass(frozen=True, order=True)
class SandboxKey:
    """Identifies a sandbox: one per (profile, server). The tenant is the profile id."""

    profile_id: int
    server: str

    @property
    def tenant(self) -> int:
        return self.profile_id


@dataclass(frozen=True)
class SandboxOwner:
    """Who a sandbox belongs to, for listings and attribution."""

    profile_slug: str
    user_id: int


@dataclass(frozen=True)
class SandboxInfo:
    """Runtime information about one sandbox (what ``sandbox ps`` and ``netns ls`` show)."""

    profile_id: int
    profile_slug: str
    server: str
    owner_user_id: int
    state: str
    name: str | None
    namespace: str | None
    pid: int | None
    init_pid: int | None
    egress_listener: str | None
    egress_connections: int
    started_at: float | None
    exit_code: int | None

    @property
    def tenant(self) -> int:
        return self.profile_id

    def to_json(self) -> dict[str, Any]:
        return {
            "profile_id": self.profile_id,
            "profile_slug": self.profile_slug,
            "server": self.server,
            "tenant": self.tenant,
            "owner_user_id": self.owner_user_id,
            "state": self.state,
            "name": self.name,
            "namespace": self.namespace,
            "pid": self.pid,
            "init_pid": self.init_pid,
            "egress_listener": self.egress_listener,
            "egress_connections": self.egress_connections,
            "started_at": self.started_at,
            "exit_code": self.exit_code,
        }


class SandboxHandle:
    """A started sandbox as a caller sees it: its stdio streams and identity.

    Holding a handle does not keep the sandbox alive and the handle cannot stop it: the
    supervisor owns it (see :meth:`SandboxSupervisor.stop`).
    """

    def __init__(
        self,
        key: SandboxKey,
        owner: SandboxOwner,
        sandbox: Sandbox,
        started_at: float,
        released: trio.Event,
    ) -> None:
        self.key = key
        self.owner = owner
        self.started_at = started_at
        self._sandbox = sandbox
        self._released = released
        # Its stderr records name the profile and server (the sandbox's own name is there).
        self._stderr().annotate(profile=owner.profile_slug, server=key.server)

    def __repr__(self) -> str:
        return f"<SandboxHandle {self.key} {self._sandbox.name} pid={self._sandbox.pid}>"

    def _stderr(self) -> StderrLog:
        # Sandbox has no public accessor for its StderrLog; it is the launcher's object.
        return self._sandbox._log

    def correlate_stderr(self, in_flight: InFlight | None) -> None:
        """Tag each stderr line (log record and ring buffer) with the request ids
        ``in_flight()`` returns when the line arrives (see :mod:`sandbox.stderr_log`)."""
        self._stderr().correlate(in_flight)

    @property
    def name(self) -> str:
        return self._sandbox.name

    @property
    def namespace(self) -> str:
        return self._sandbox.netns_name

    @property
    def pid(self) -> int:
        return self._sandbox.pid

    @property
    def stdin(self) -> trio.abc.SendStream:
        return self._sandbox.stdin

    @property
    def stdout(self) -> trio.abc.ReceiveStream:
        return self._sandbox.stdout

    @property
    def returncode(self) -> int | None:
        return self._sandbox.returncode

    def host_pids(self) -> list[int]:
        return self._sandbox.host_pids()

    async def wait(self) -> int | None:
        """Wait until the sandbox has exited and everything it held is released.

        Returns bwrap's exit status (negative: killed by that signal).
        """
        await self._released.wait()
        return self._sandbox.returncode

    def stderr_tail(self, n: int | None = None) -> list[str]:
        return self._sandbox.stderr_tail(n)


@dataclass(eq=False)
class _Entry:
    """One key's sandbox, from the moment a spawn is requested until it is forgotten."""

    key: SandboxKey
    owner: SandboxOwner
    state: SandboxState = SandboxState.STARTING
    # Created here, entered by the owner task: cancelling before the task runs still works.
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    ready: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)
    handle: SandboxHandle | None = None
    sandbox: Sandbox | None = None
    error: BaseException | None = None
    stop_requested: bool = False
    egress: EgressAttachment | None = None

    def info(self) -> SandboxInfo:
        sb = self.sandbox
        return SandboxInfo(
            profile_id=self.key.profile_id,
            profile_slug=self.owner.profile_slug,
            server=self.key.server,
            owner_user_id=self.owner.user_id,
            state=self.state.value,
            name=None if sb is None else sb.name,
            namespace=None if sb is None else sb.netns_name,
            pid=None if sb is None else sb.pid,
            init_pid=None if sb is None else sb.child_pid,
            egress_listener=None if self.egress is None else self.egress.listener,
            egress_connections=0 if self.egress is None else self.egress.connections,
            started_at=None if self.handle is None else self.handle.started_at,
            exit_code=None if sb is None else sb.returncode,
        )


def launcher_prefix(state_dir: Path) -> str:
    """Name prefix of sandboxes, namespaces and cgroups made with ``state_dir``.

    Leftover cleanup removes every object with the prefix that has no live record in its
    state dir, so two gateways with different state dirs must never share a prefix. Gateways
    sharing a state dir share the prefix safely: records of live owners are kept.
    """
    digest = hashlib.sha256(str(state_dir).encode()).hexdigest()[:6]
    return f"svcg{digest}-"


@dataclass(frozen=True)
class SupervisorConfig:
    state_dir: Path
    # Seconds between SIGTERM and SIGKILL when a sandbox is stopped.
    stop_grace: float = 5.0
    stderr_lines: int = 200
    require_cgroups: bool = True

    def launcher_config(self) -> LauncherConfig:
        return LauncherConfig(
            state_dir=self.state_dir,
            prefix=launcher_prefix(self.state_dir),
            stop_grace=self.stop_grace,
            stderr_lines=self.stderr_lines,
            require_cgroups=self.require_cgroups,
        )


def _single(exc: BaseException | None) -> BaseException | None:
    """The one exception inside (nested) single-member groups, for messages."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


class SandboxSupervisor:
    """Owns every sandbox; see the module docstring."""

    def __init__(self, config: SupervisorConfig, *, egress: SandboxEgress | None = None) -> None:
        self.config = config
        # Without an egress proxy a sandbox has no way out at all (its namespace holds lo).
        self.egress = egress
        self._entries: dict[SandboxKey, _Entry] = {}
        self._nursery: trio.Nursery | None = None
        self._launcher: Launcher | None = None
        self.spawn_failures = 0  # sandboxes that never started (svcgate.metrics reads it)
        self._entered = False
        self._closed = False

    async def run(
        self, *, task_status: trio.TaskStatus[SandboxSupervisor] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until cancelled; report readiness once leftovers are cleaned up."""
        if self._entered:
            raise RuntimeError("SandboxSupervisor.run may be entered once")
        self._entered = True
        started = False
        try:
            async with open_launcher(self.config.launcher_config()) as launcher:
                cleaned = await launcher.cleanup_leftovers()
                if cleaned:
                    log.warning("removed leftovers of %d crashed sandbox(es)", len(cleaned))
                async with trio.open_nursery() as nursery:
                    self._nursery, self._launcher = nursery, launcher
                    started = True
                    log.info("sandbox supervisor ready (state in %s)", self.config.state_dir)
                    task_status.started(self)
                    try:
                        await trio.sleep_forever()
                    finally:
                        # From here on no new spawn may start; owner tasks see why they end.
                        self._closed = True
        except Exception as exc:
            if started:
                raise
            raise SupervisorStartError(str(_single(exc))) from exc
        finally:
            self._closed = True
            self._nursery = self._launcher = None

    async def ensure(
        self, key: SandboxKey, spec_factory: SpecFactory, *, owner: SandboxOwner
    ) -> SandboxHandle:
        """Return the running sandbox for ``key``, spawning it if there is none.

        Raises :class:`SandboxSpawnError` if the spawn fails (the failure is not cached)
        and :class:`SupervisorClosed` if the supervisor is not running. Cancelling the
        caller only stops its wait; the spawn goes on for other callers.
        """
        while True:
            entry = self._entries.get(key)
            if entry is not None and entry.state is SandboxState.STOPPING:
                await entry.done.wait()
                continue
            if entry is None or entry.state is SandboxState.EXITED:
                entry = self._spawn(key, spec_factory, owner)
            await entry.ready.wait()
            if entry.handle is not None:
                return entry.handle
            if isinstance(entry.error, SupervisorClosed):
                raise SupervisorClosed("the sandbox supervisor stopped") from entry.error
            raise SandboxSpawnError(
                f"sandbox {key.server!r} of profile {key.profile_id}: {_single(entry.error)}"
            ) from entry.error

    def _spawn(self, key: SandboxKey, spec_factory: SpecFactory, owner: SandboxOwner) -> _Entry:
        if self._closed or self._nursery is None:
            raise SupervisorClosed("the sandbox supervisor is not running")
        entry = _Entry(key=key, owner=owner)
        self._entries[key] = entry
        self._nursery.start_soon(self._own, entry, spec_factory, name=f"sandbox {key}")
        return entry

    async def _own(self, entry: _Entry, spec_factory: SpecFactory) -> None:
        """The owner task of one sandbox: spawn it, hold it until it exits or is stopped."""
        assert self._launcher is not None
        launcher = self._launcher
        try:
            with entry.scope:
                spec = await spec_factory()
                async with trio.open_nursery() as nursery:
                    prepare = self._egress_prepare(entry, nursery)

                    async def run_sandbox(
                        task_status: trio.TaskStatus[Sandbox] = trio.TASK_STATUS_IGNORED,
                    ) -> None:
                        try:
                            await launcher.run(spec, prepare=prepare, task_status=task_status)
                        finally:
                            # The sandbox is gone: its egress listener goes with it.
                            nursery.cancel_scope.cancel()

                    sandbox: Sandbox = await nursery.start(run_sandbox)
                    entry.sandbox = sandbox
                    entry.handle = SandboxHandle(
                        entry.key, entry.owner, sandbox, time.time(), entry.done
                    )
                    if not entry.stop_requested:
                        entry.state = SandboxState.RUNNING
                    entry.ready.set()
                    log.info(
                        "sandbox %s started for %s (profile %s): pid %d",
                        sandbox.name,
                        entry.key.server,
                        entry.owner.profile_slug,
                        sandbox.pid,
                    )
                # Launcher.run returned: the sandbox exited and everything it held is gone.
                log.info(
                    "sandbox %s (%s) exited with status %s",
                    sandbox.name,
                    entry.key.server,
                    sandbox.returncode,
                )
        # Any spawn failure goes to the waiters; it never ends the supervisor.
        except Exception as exc:
            entry.error = exc
            if entry.handle is None:
                self.spawn_failures += 1
                log.warning("sandbox %s of profile %s failed to start: %s", *_ident(entry), exc)
            else:
                log.error("sandbox %s of profile %s failed", *_ident(entry), exc_info=exc)
        finally:
            if entry.handle is None and entry.error is None:
                entry.error = (
                    SandboxSpawnError("stopped before it was ready")
                    if entry.stop_requested
                    # Cancelled without stop(): the supervisor is shutting down.
                    else SupervisorClosed("the sandbox supervisor stopped")
                )
            entry.state = SandboxState.EXITED
            forget = entry.handle is None or entry.stop_requested
            if forget and self._entries.get(entry.key) is entry:
                del self._entries[entry.key]
            entry.ready.set()
            entry.done.set()

    def _egress_prepare(self, entry: _Entry, nursery: trio.Nursery) -> Prepare | None:
        """The launcher hook that starts the sandbox's egress listener in its namespace."""
        egress = self.egress
        if egress is None:
            return None

        async def prepare(namespace: str, spec: SandboxSpec) -> SandboxSpec:
            attachment: EgressAttachment = await nursery.start(
                partial(egress.serve, entry.key, entry.owner, namespace)
            )
            entry.egress = attachment
            return attachment.apply(spec)

        return prepare

    async def stop(self, key: SandboxKey) -> bool:
        """Stop and forget the sandbox of ``key``; False if there was none."""
        entry = self._entries.get(key)
        if entry is None:
            return False
        await self._stop_entries([entry])
        return True

    async def stop_profile(self, profile_id: int) -> int:
        """Stop and forget every sandbox of ``profile_id``; return how many there were."""
        entries = [e for k, e in self._entries.items() if k.profile_id == profile_id]
        await self._stop_entries(entries)
        return len(entries)

    async def _stop_entries(self, entries: list[_Entry]) -> None:
        # Cancel all first, then wait: sandboxes of one profile are torn down in parallel.
        for entry in entries:
            entry.stop_requested = True
            if entry.done.is_set():
                if self._entries.get(entry.key) is entry:
                    del self._entries[entry.key]
                continue
            entry.state = SandboxState.STOPPING
            entry.scope.cancel()
        for entry in entries:
            await entry.done.wait()

    async def list(self) -> builtins.list[SandboxInfo]:
        """Runtime information of every known sandbox, ordered by profile and server."""
        return [self._entries[key].info() for key in sorted(self._entries)]

    def count_by_state(self) -> dict[str, int]:
        """How many known sandboxes are in each state (every state listed; for metrics)."""
        counts = dict.fromkeys((state.value for state in SandboxState), 0)
        for entry in self._entries.values():
            counts[entry.state.value] += 1
        return counts

    def find(self, profile: str, server: str) -> SandboxKey:
        """The key of the sandbox of ``server`` in the profile with this slug (or id)."""
        matches = [k for k, e in self._entries.items() if k.server == server]
        for key in matches:  # a slug wins over an id that happens to read the same
            if self._entries[key].owner.profile_slug == profile:
                return key
        for key in matches:
            if str(key.profile_id) == profile:
                return key
        raise SandboxNotFound(f"no sandbox for server {server!r} in profile {profile!r}")

    def handle(self, key: SandboxKey) -> SandboxHandle | None:
        """The handle of the sandbox of ``key`` once it started (None otherwise)."""
        entry = self._entries.get(key)
        return None if entry is None else entry.handle

    async def logs(self, key: SandboxKey, n: int | None = None) -> builtins.list[str]:
        """The last ``n`` lines of the sandbox's stderr ring buffer (all kept ones if None)."""
        entry = self._entries.get(key)
        if entry is None:
            raise SandboxNotFound(f"no sandbox for {key}")
        return [] if entry.handle is None else entry.handle.stderr_tail(n)


def _ident(entry: _Entry) -> tuple[str, str]:
    return entry.key.server, entry.owner.profile_slug
