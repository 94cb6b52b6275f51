"""Resource limits: cgroups (memory, pids, cpu) for v1 and v2 hosts.

Which hierarchy is used is detected from ``/proc/self/mountinfo``: cgroup v2 when the
unified hierarchy has the ``memory`` and ``pids`` controllers (pure v2 hosts), otherwise the
v1 ``memory``/``pids``/``cpu`` hierarchies (legacy and hybrid hosts, where the unified mount
exists but holds no controllers).

* v2: one child cgroup under a delegated parent; ``memory.max``, ``memory.swap.max=0``,
  ``memory.oom.group=1`` (an OOM kills the whole sandbox, not a random process in it),
  ``pids.max``, ``cpu.max``; stopping writes ``cgroup.kill``.
* v1: one child per controller hierarchy; ``memory.limit_in_bytes`` (+ ``memsw`` when swap
  accounting exists), ``pids.max``, ``cpu.cfs_quota_us``/``cfs_period_us``; stopping sends
  SIGKILL to every task in ``cgroup.procs`` (v1 has no ``cgroup.kill``). v1 has no
  ``oom.group``: the OOM killer picks the largest task inside the cgroup.

The default parent is the cgroup the launcher itself is in, so sandboxes stay inside
whatever limits the service manager gave the gateway. On v2 that cgroup normally holds the
gateway's own processes, and the "no internal processes" rule forbids enabling controllers
for children there. When the gateway is the only process in it (systemd ``Delegate=yes``),
the manager moves the gateway into a leaf ``<own>/gateway`` and delegates from its old
cgroup; otherwise configure a delegated parent with no processes (see docs/sandbox.md).

RLIMITs are not set here: the spawned command starts with util-linux ``prlimit``, which
lowers its own limits and execs the rest (see :func:`sandbox.argv.rlimit_options`).

Resource handling:
    :meth:`Cgroup.remove` deletes the cgroup directories; it fails (returns False) while
    tasks remain, so callers kill first. Leftovers of a crashed run are found by name prefix
    (:meth:`CgroupManager.find`).

Error handling:
    Kernel refusals while creating or configuring a cgroup raise :class:`CgroupError` and the
    half-made cgroup is removed. Killing and removing tolerate tasks and directories that
    already vanished.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sandbox.spec import ResourceLimits

CgroupMode = Literal["v1", "v2", "none"]
V1_CONTROLLERS = ("memory", "pids", "cpu")
V2_CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
# v2: the leaf the gateway moves itself into when its own cgroup is the sandboxes' parent.
GATEWAY_LEAF = "gateway"


class CgroupError(RuntimeError):
    """A cgroup could not be created or configured."""


@dataclass(frozen=True)
class CgroupHost:
    """The host's cgroup layout: where each hierarchy is and where we are in it."""

    mode: CgroupMode
    # v2: the unified mount point and our own cgroup path in it.
    v2_mount: Path | None = None
    v2_own: str = "/"
    # v1: controller -> (mount point, our own cgroup path in that hierarchy).
    v1: tuple[tuple[str, Path, str], ...] = ()


def _parse_mountinfo(text: str) -> list[tuple[str, Path, str, set[str]]]:
    """(fstype, mount point, root within the fs, super options) for every cgroup mount."""
    mounts = []
    for line in text.splitlines():
        pre, _, post = line.partition(" - ")
        fields, tail = pre.split(), post.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        # Mount points escape spaces as \040.
        mount_point = Path(fields[4].replace("\\040", " "))
        mounts.append((tail[0], mount_point, fields[3], set(tail[2].split(","))))
    return mounts


def _relative(own: str, mount_root: str) -> str:
    # In a container the mount's root may be our own cgroup: paths are relative to it.
    if mount_root != "/" and (own == mount_root or own.startswith(mount_root + "/")):
        own = own[len(mount_root) :] or "/"
    return own


def detect_cgroups(proc: Path = Path("/proc")) -> CgroupHost:
    """Detect the cgroup layout from ``/proc/self/mountinfo`` and ``/proc/self/cgroup``."""
    mounts = _parse_mountinfo((proc / "self/mountinfo").read_text())
    own: dict[str, str] = {}
    for line in (proc / "self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0":
            own["<v2>"] = path
        for ctrl in controllers.split(","):
            if ctrl:
                own[ctrl] = path
    for fstype, mount_point, root, _opts in mounts:
        if fstype != "cgroup2":
            continue
        try:
            available = set((mount_point / "cgroup.controllers").read_text().split())
        except OSError:
            continue
        if {"memory", "pids"} <= available:
            return CgroupHost(
                "v2", v2_mount=mount_point, v2_own=_relative(own.get("<v2>", "/"), root)
            )
    v1 = []
    for ctrl in V1_CONTROLLERS:
        for fstype, mount_point, root, opts in mounts:
            if fstype == "cgroup" and ctrl in opts:
                v1.append((ctrl, mount_point, _relative(own.get(ctrl, "/"), root)))
                break
    if {c for c, _, _ in v1} >= {"memory", "pids"}:
        return CgroupHost("v1", v1=tuple(v1))
    return CgroupHost("none")


def _write(path: Path, value: str) -> None:
    with open(path, "w", encoding="ascii") as fh:
        fh.write(value)


def _read_pids(path: Path) -> set[int]:
    try:
        return {int(line) for line in path.read_text().split()}
    except FileNotFoundError:
        return set()


class Cgroup:
    """One sandbox's cgroup: a directory per v1 hierarchy, or one v2 directory."""

    def __init__(self, mode: CgroupMode, dirs: Iterable[tuple[str, Path]]) -> None:
        """``dirs``: (controller, directory) pairs; one ("unified", dir) pair on v2."""
        self.mode = mode
        self._by_controller = dict(dirs)
        self.dirs = tuple(self._by_controller.values())

    def __repr__(self) -> str:
        return f"Cgroup({self.mode}, {[str(d) for d in self.dirs]})"

    def _dir_for(self, controller: str) -> Path | None:
        if self.mode == "v2":
            return self.dirs[0]
        return self._by_controller.get(controller)

    def apply(self, limits: ResourceLimits) -> None:
        """Write the cgroup part of ``limits``."""
        if self.mode == "v2":
            self._apply_v2(limits)
        else:
            self._apply_v1(limits)

    def _apply_v2(self, limits: ResourceLimits) -> None:
        d = self.dirs[0]
        if limits.memory_bytes is not None:
            _write(d / "memory.max", str(limits.memory_bytes))
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0")
        _write(d / "memory.oom.group", "1")
        if limits.pids is not None:
            _write(d / "pids.max", str(limits.pids))
        if limits.cpus is not None:
            _write(d / "cpu.max", f"{round(limits.cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")

    def _apply_v1(self, limits: ResourceLimits) -> None:
        mem, pids, cpu = (self._dir_for(c) for c in V1_CONTROLLERS)
        if limits.memory_bytes is not None and mem is not None:
            _write(mem / "memory.limit_in_bytes", str(limits.memory_bytes))
            # With swap accounting, cap memory+swap too or the sandbox swaps past the limit.
            if (mem / "memory.memsw.limit_in_bytes").exists():
                _write(mem / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        if limits.pids is not None and pids is not None:
            _write(pids / "pids.max", str(limits.pids))
        if limits.cpus is not None and cpu is not None:
            _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", str(round(limits.cpus * CPU_PERIOD_US)))

    def attach(self, pid: int) -> None:
        """Move process ``pid`` (not its existing children) into the cgroup."""
        for d in self.dirs:
            _write(d / "cgroup.procs", str(pid))

    def pids(self) -> set[int]:
        """Every process currently in the cgroup."""
        found: set[int] = set()
        for d in self.dirs:
            found |= _read_pids(d / "cgroup.procs")
        return found

    def kill(self) -> None:
        """Send SIGKILL to everything in the cgroup (one round; forks may race it)."""
        if self.mode == "v2" and (self.dirs[0] / "cgroup.kill").exists():
            with contextlib.suppress(FileNotFoundError):
                _write(self.dirs[0] / "cgroup.kill", "1")
            return
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def oom_kills(self) -> int:
        """How many processes the OOM killer killed in this cgroup."""
        d = self._dir_for("memory")
        if d is None:
            return 0
        name = "memory.events" if self.mode == "v2" else "memory.oom_control"
        with contextlib.suppress(FileNotFoundError):
            for line in (d / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def remove(self) -> bool:
        """Delete the cgroup directories; False while processes remain (kill first)."""
        done = True
        for d in self.dirs:
            try:
                d.rmdir()
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                done = False
        return done

    def exists(self) -> bool:
        """True while any of the directories is still there."""
        return any(d.exists() for d in self.dirs)


class CgroupManager:
    """Creates and finds sandbox cgroups below a parent cgroup."""

    def __init__(self, host: CgroupHost, *, parent: str | None = None) -> None:
        """``parent``: cgroup path (as in /proc/self/cgroup) to create children under.

        None uses the cgroup the launcher runs in.
        """
        self.host = host
        self._explicit_parent = parent is not None
        if host.mode == "v2":
            assert host.v2_mount is not None
            rel = parent if parent is not None else host.v2_own
            self.parents: tuple[tuple[str, Path], ...] = (
                ("unified", host.v2_mount / rel.lstrip("/")),
            )
        else:
            self.parents = tuple(
                (ctrl, mount / (parent if parent is not None else own).lstrip("/"))
                for ctrl, mount, own in host.v1
            )

    @property
    def mode(self) -> CgroupMode:
        return self.host.mode

    def _enable_v2_controllers(self) -> None:
        parent = self.parents[0][1]
        available = set((parent / "cgroup.controllers").read_text().split())
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
        missing = [c for c in V2_CONTROLLERS if c in available and c not in enabled]
        if not missing:
            return
        for attempt in (1, 2):
            try:
                _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))
                return
            except OSError as exc:
                if attempt == 1 and exc.errno == errno.EBUSY and self._leave_own_cgroup():
                    continue  # we were the process in the way; now in <own>/gateway
                raise CgroupError(
                    f"cannot enable {missing} for children of {parent}: {exc}. The parent must"
                    " be a delegated cgroup with no processes of its own (see docs/sandbox.md)."
                ) from exc

    def _leave_own_cgroup(self) -> bool:
        """Move this process into a leaf ``<own>/gateway`` so its own cgroup may delegate.

        v2 refuses controllers for the children of a cgroup that holds processes. Under
        systemd (``Delegate=yes``) the service's cgroup holds only the gateway, which moves
        itself one level down (what systemd 254's ``DelegateSubgroup=`` does). Only when the
        parent is our own cgroup and we are its only process; True if the move happened.
        """
        if self._explicit_parent:
            return False
        parent = self.parents[0][1]
        if _read_pids(parent / "cgroup.procs") - {os.getpid()}:
            return False  # someone else's processes (a login shell): not ours to move
        leaf = parent / GATEWAY_LEAF
        try:
            with contextlib.suppress(FileExistsError):
                leaf.mkdir()
            _write(leaf / "cgroup.procs", str(os.getpid()))
        except OSError:
            return False
        return True

    def create(self, name: str, limits: ResourceLimits) -> Cgroup:
        """Make cgroup ``name`` with ``limits`` applied."""
        if self.mode == "none":
            raise CgroupError("no usable cgroup hierarchy (need memory and pids controllers)")
        if "/" in name or name in {"", ".", ".."}:
            raise CgroupError(f"invalid cgroup name {name!r}")
        if self.mode == "v2":
            self._enable_v2_controllers()
        cgroup = Cgroup(self.mode, ((c, p / name) for c, p in self.parents))
        try:
            for d in cgroup.dirs:
                d.mkdir()
            cgroup.apply(limits)
        except OSError as exc:
            cgroup.remove()
            raise CgroupError(f"creating cgroup {name!r} failed: {exc}") from exc
        return cgroup

    def open(self, name: str) -> Cgroup:
        """A handle for an existing (or vanished) cgroup ``name``."""
        return Cgroup(self.mode, ((c, p / name) for c, p in self.parents))

    def find(self, prefix: str) -> list[str]:
        """Names of child cgroups starting with ``prefix`` (for leftover cleanup)."""
        if not prefix or self.mode == "none":
            return []
        names: set[str] = set()
        for _ctrl, parent in self.parents:
            with contextlib.suppress(FileNotFoundError):
                names |= {
                    p.name for p in parent.iterdir() if p.is_dir() and p.name.startswith(prefix)
                }
        return sorted(names)
