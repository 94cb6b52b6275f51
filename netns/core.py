"""Synchronous core: create, list, inspect and remove named network namespaces.

Namespaces are created the way ``ip netns add`` does it (via pyroute2): a thread unshares
its network namespace and the namespace is bind-mounted on ``/var/run/netns/NAME`` so it
outlives the thread. Each namespace we create has a small JSON metadata file in a state
directory the caller chooses (owner process, creation time, labels) so an operator can see
who made it and a restarted gateway can remove what a crashed one left behind.

Resource handling:
    ``setns``/``unshare`` change only the *calling thread's* namespace. Every operation that
    needs to be inside a namespace runs in a dedicated, short-lived ``threading.Thread`` of
    our own that switches back and exits when the operation ends (:func:`run_in_namespace`).
    We never switch a pooled thread (trio's worker threads, an executor's): it could be
    handed back to the pool still inside the namespace and run someone else's code there.
    Sockets created in such a thread stay bound to the namespace they were created in, which
    is how :func:`open_listener` returns a host-side socket that listens *inside* a
    namespace.

    The metadata file is written *before* the namespace is mounted, so a crash between the
    two steps leaves a record; :func:`cleanup_leftovers` removes namespaces with our prefix
    whose owning process is gone.

Error handling:
    OS and netlink failures are translated into :class:`NetnsError` subclasses at this edge
    (``raise ... from exc``). A failed :func:`create_namespace` removes whatever it created.
    :func:`remove_namespace` is idempotent.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import outcome
from pyroute2 import netns as pr_netns
from pyroute2.iproute import IPRoute

from netns.names import has_prefix, validate_name

T = TypeVar("T")

NETNS_RUN_DIR = Path("/var/run/netns")
_CLONE_NEWNET = 0x40000000
_METADATA_VERSION = 1

# pyroute2 (like iproute2) makes /var/run/netns a shared bind mount of itself the first time
# a namespace is created; two threads doing that at once could stack two mounts. The lock
# guards the process-wide mount table, not Python state.
_MOUNT_LOCK = threading.Lock()

_libc = ctypes.CDLL(None, use_errno=True)


class NetnsError(Exception):
    """A network namespace operation failed."""


class NamespaceExists(NetnsError):
    """A namespace with this name already exists."""


class NamespaceNotFound(NetnsError):
    """No namespace with this name is mounted."""


@dataclass(frozen=True)
class NamespaceMetadata:
    """What we record about a namespace we created."""

    name: str
    created_at: float
    owner_pid: int
    owner_start_ticks: int | None
    labels: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": _METADATA_VERSION,
                "name": self.name,
                "created_at": self.created_at,
                "owner_pid": self.owner_pid,
                "owner_start_ticks": self.owner_start_ticks,
                "labels": dict(self.labels),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> NamespaceMetadata:
        raw = json.loads(text)
        if not isinstance(raw, dict) or raw.get("version") != _METADATA_VERSION:
            raise ValueError("unsupported namespace metadata")
        labels = raw.get("labels") or {}
        ticks = raw.get("owner_start_ticks")
        return cls(
            name=str(raw["name"]),
            created_at=float(raw["created_at"]),
            owner_pid=int(raw["owner_pid"]),
            owner_start_ticks=None if ticks is None else int(ticks),
            labels={str(k): str(v) for k, v in dict(labels).items()},
        )


@dataclass(frozen=True)
class NamespaceInfo:
    """A namespace as seen on the host, joined with our metadata when we have some."""

    name: str
    path: Path
    mounted: bool
    metadata: NamespaceMetadata | None
    owner_alive: bool


@dataclass(frozen=True)
class InterfaceInfo:
    """One link inside a namespace."""

    name: str
    up: bool
    addresses: tuple[str, ...]


def namespace_path(name: str) -> Path:
    """Where the named namespace is (or would be) mounted."""
    return NETNS_RUN_DIR / validate_name(name)


def run_in_own_thread(fn: Callable[[], T], *, thread_name: str) -> T:
    """Run ``fn`` in a fresh thread that ends with it, and return its result or raise.

    Used for anything that changes per-thread kernel state (namespaces) so the change dies
    with the thread instead of leaking into a reused one.
    """
    result: list[outcome.Outcome[T]] = []

    def target() -> None:
        result.append(outcome.capture(fn))

    thread = threading.Thread(target=target, name=thread_name, daemon=True)
    thread.start()
    thread.join()
    return result[0].unwrap()


def _setns_current_thread(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise NamespaceNotFound(f"network namespace {path.name!r} does not exist") from exc
    try:
        if _libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsError(f"setns({path}) failed: {os.strerror(err)}")
    finally:
        os.close(fd)


@contextlib.contextmanager
def _back_to_original_namespace() -> Iterator[None]:
    """Return the calling thread to the namespace it was in when the block started.

    Belt and braces: our namespace threads end right after their work anyway, but a thread
    that is still winding down after ``join()`` would otherwise sit in the other namespace
    for a moment (and show up so in ``/proc/self/task``).
    """
    original = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        yield
    finally:
        try:
            if _libc.setns(original, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise NetnsError(f"returning to the original namespace failed: {os.strerror(err)}")
        finally:
            os.close(original)


def run_in_namespace(name: str, fn: Callable[[], T]) -> T:
    """Call ``fn`` in a dedicated thread that has joined namespace ``name``.

    The thread returns to the host namespace and exits right after ``fn`` returns, so
    nothing else ever runs inside the namespace by accident. Sockets ``fn`` creates keep
    belonging to the namespace.
    """
    path = namespace_path(name)

    def inside() -> T:
        with _back_to_original_namespace():
            _setns_current_thread(path)
            return fn()

    return run_in_own_thread(inside, thread_name=f"netns:{name}")


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if it does not exist.

    Together with the pid this identifies a process across pid reuse.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def _owner_alive(meta: NamespaceMetadata) -> bool:
    ticks = process_start_ticks(meta.owner_pid)
    return ticks is not None and ticks == meta.owner_start_ticks


def _metadata_path(state_dir: Path, name: str) -> Path:
    return state_dir / f"{name}.json"


def _write_metadata(state_dir: Path, meta: NamespaceMetadata) -> None:
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    final = _metadata_path(state_dir, meta.name)
    tmp = final.with_suffix(".json.tmp")
    # Write-then-rename so a reader (operator CLI, cleanup) never sees a half-written file.
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(meta.to_json())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)


def read_metadata(state_dir: Path, name: str) -> NamespaceMetadata | None:
    """Our metadata for ``name``, or None if absent or unreadable."""
    try:
        return NamespaceMetadata.from_json(_metadata_path(state_dir, name).read_text("utf-8"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _create_in_this_thread(name: str) -> None:
    with _back_to_original_namespace():
        with _MOUNT_LOCK:
            if _libc.unshare(_CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise NetnsError(f"unshare(CLONE_NEWNET) failed: {os.strerror(err)}")
            # "thread-self" makes pyroute2 bind /proc/thread-self/ns/net: this thread's
            # namespace, not the process's (which is still the host's).
            pr_netns.attach(name, "thread-self")
        # A fresh namespace starts with lo down; without it even 127.0.0.1 is unreachable.
        _set_link_up("lo")


_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ_FLAGS = struct.Struct("16sh22x")  # struct ifreq: name, then ifr_flags (40 bytes)


def _set_link_up(ifname: str) -> None:
    """Set ``ifname`` up in the calling thread's namespace (``ip link set ... up``).

    Two ioctls on a socket made in that namespace: a pyroute2 ``IPRoute`` does the same
    over netlink but costs ~5-10 ms wall and ~3 ms of CPU (GIL) per call, paid by every
    sandbox start.
    """
    name = ifname.encode()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        current = fcntl.ioctl(sock, _SIOCGIFFLAGS, _IFREQ_FLAGS.pack(name, 0))
        flags = _IFREQ_FLAGS.unpack(current)[1]
        if not flags & _IFF_UP:
            fcntl.ioctl(sock, _SIOCSIFFLAGS, _IFREQ_FLAGS.pack(name, flags | _IFF_UP))


def create_namespace(
    name: str, *, state_dir: Path, labels: Mapping[str, str] | None = None
) -> NamespaceInfo:
    """Create namespace ``name`` with ``lo`` up and record its metadata in ``state_dir``."""
    validate_name(name)
    path = namespace_path(name)
    if os.path.lexists(path):
        raise NamespaceExists(f"network namespace {name!r} already exists")
    meta = NamespaceMetadata(
        name=name,
        created_at=time.time(),
        owner_pid=os.getpid(),
        owner_start_ticks=process_start_ticks(os.getpid()),
        labels=dict(labels or {}),
    )
    try:
        _write_metadata(state_dir, meta)
        run_in_own_thread(lambda: _create_in_this_thread(name), thread_name=f"netns+{name}")
    except FileExistsError as exc:
        # Lost a race with another creator: the namespace is theirs, only drop our record.
        _metadata_path(state_dir, name).unlink(missing_ok=True)
        raise NamespaceExists(f"network namespace {name!r} already exists") from exc
    except BaseException as exc:
        remove_namespace(name, state_dir=state_dir)
        if isinstance(exc, OSError):
            raise NetnsError(f"creating network namespace {name!r} failed: {exc}") from exc
        raise
    return NamespaceInfo(name=name, path=path, mounted=True, metadata=meta, owner_alive=True)


def remove_namespace(name: str, *, state_dir: Path) -> bool:
    """Unmount and delete namespace ``name`` and its metadata. True if it was mounted.

    Processes still inside the namespace keep it alive until they exit; it just loses its
    name.
    """
    validate_name(name)
    existed = os.path.lexists(namespace_path(name))
    if existed:
        try:
            pr_netns.remove(name)
        except FileNotFoundError:
            existed = False
        except OSError as exc:
            raise NetnsError(f"removing network namespace {name!r} failed: {exc}") from exc
    _metadata_path(state_dir, name).unlink(missing_ok=True)
    return existed


def list_namespaces(*, state_dir: Path, prefix: str = "") -> list[NamespaceInfo]:
    """Namespaces that are mounted or that we have metadata for, sorted by name.

    With a ``prefix``, only names that start with it. Metadata without a mounted namespace
    shows up with ``mounted=False`` (a crash between the two steps, or a removal by hand).
    """
    mounted: set[str] = set()
    with contextlib.suppress(FileNotFoundError):
        mounted = {p.name for p in NETNS_RUN_DIR.iterdir()}
    recorded: set[str] = set()
    with contextlib.suppress(FileNotFoundError):
        recorded = {p.name[: -len(".json")] for p in state_dir.glob("*.json")}
    result = []
    for name in sorted(mounted | recorded):
        if prefix and not name.startswith(prefix):
            continue
        meta = read_metadata(state_dir, name) if name in recorded else None
        result.append(
            NamespaceInfo(
                name=name,
                path=NETNS_RUN_DIR / name,
                mounted=name in mounted,
                metadata=meta,
                owner_alive=meta is not None and _owner_alive(meta),
            )
        )
    return result


def cleanup_leftovers(prefix: str, state_dir: Path) -> list[str]:
    """Remove namespaces named ``prefix...`` whose owner process is gone; return their names.

    A namespace with our prefix but no metadata is also removed: we write metadata before
    creating, so it can only come from a run that crashed mid-way (or from a bug).
    Namespaces of a live owner (another running gateway, a concurrent test run) are kept.
    """
    removed = []
    for info in list_namespaces(state_dir=state_dir, prefix=prefix):
        if not has_prefix(info.name, prefix) or info.owner_alive:
            continue
        remove_namespace(info.name, state_dir=state_dir)
        removed.append(info.name)
    return removed


def open_listener(
    name: str, *, host: str = "127.0.0.1", port: int = 0, backlog: int = 128
) -> socket.socket:
    """A listening TCP socket bound to ``host:port`` *inside* namespace ``name``.

    The returned plain socket works from any thread of the host process (a socket belongs to
    the namespace it was created in); wrap it with ``trio.socket.from_stdlib_socket``.
    """

    def bind_inside() -> socket.socket:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(backlog)
        except BaseException:
            sock.close()
            raise
        return sock

    try:
        return run_in_namespace(name, bind_inside)
    except OSError as exc:
        raise NetnsError(f"listening in namespace {name!r} failed: {exc}") from exc


def inspect_namespace(name: str) -> list[InterfaceInfo]:
    """The links inside namespace ``name`` with their state and addresses."""

    def read_links() -> list[InterfaceInfo]:
        with IPRoute() as ipr:
            addresses: dict[int, list[str]] = {}
            for addr in ipr.get_addr():
                addresses.setdefault(int(addr["index"]), []).append(
                    f"{addr.get_attr('IFA_ADDRESS')}/{addr['prefixlen']}"
                )
            links: list[Any] = list(ipr.get_links())
            return [
                InterfaceInfo(
                    name=str(link.get_attr("IFLA_IFNAME")),
                    # IFF_UP is bit 0 of the link flags.
                    up=bool(link["flags"] & 1),
                    addresses=tuple(addresses.get(int(link["index"]), ())),
                )
                for link in links
            ]

    try:
        return run_in_namespace(name, read_links)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise NamespaceNotFound(f"network namespace {name!r} does not exist") from exc
        raise NetnsError(f"inspecting namespace {name!r} failed: {exc}") from exc
