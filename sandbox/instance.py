"""A running sandbox as the caller sees it, and the resources its owner task tracks.

Resource handling:
    A :class:`Sandbox` owns nothing itself: the launcher task that started it owns the
    process, pipes, cgroup, namespace and scratch dir (recorded in :class:`Resources`) and
    releases them. :meth:`Sandbox.stop` only asks that task to finish and waits for it.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import trio

from sandbox import process_tree
from sandbox.argv import Runtime
from sandbox.limits import Cgroup
from sandbox.spec import SandboxSpec
from sandbox.stderr_log import StderrLog


@dataclass
class Resources:
    """Everything one sandbox holds, recorded as soon as it exists (for cleanup)."""

    name: str
    record: bool = False
    owned_netns: str | None = None
    scratch: Path | None = None
    cgroup: Cgroup | None = None
    fds: list[int] = field(default_factory=list)
    popen: subprocess.Popen[bytes] | None = None
    pidfd: int | None = None
    child_pid: int | None = None
    child_pidfd: int | None = None
    pidns_inode: int | None = None
    unblocked: bool = False
    streams: list[trio.lowlevel.FdStream] = field(default_factory=list)
    # Bytes of bwrap's --info-fd JSON read so far (a cancelled read resumes from here).
    info: bytes = b""


@dataclass(frozen=True)
class SpawnFds:
    runtime: Runtime
    # Become the child's 0, 1, 2.
    child_stdio: tuple[int, int, int]
    # Inherited by bwrap under their own numbers (seccomp, info, block, data files).
    passed: tuple[int, ...]
    # Our ends: stdin writer, stdout reader, stderr reader, info reader.
    parent_streams: tuple[int, int, int, int]
    # Writing a byte here lets the blocked sandbox run.
    block_w: int


class Sandbox:
    """A running sandbox. Created by the launcher; stop it with :meth:`stop`."""

    def __init__(
        self,
        name: str,
        spec: SandboxSpec,
        res: Resources,
        log: StderrLog,
        stdin: trio.lowlevel.FdStream,
        stdout: trio.lowlevel.FdStream,
    ) -> None:
        assert res.popen is not None
        self.name = name
        self.spec = spec
        self.label = spec.label
        self.stdin: trio.abc.SendStream = stdin
        self.stdout: trio.abc.ReceiveStream = stdout
        self.pid = res.popen.pid
        self.child_pid = res.child_pid
        self.netns_name = spec.netns if spec.netns is not None else name
        self.cgroup = res.cgroup
        self.scratch_dir = res.scratch
        self._res = res
        self._log = log
        self._exited = trio.Event()
        self._finished = trio.Event()
        self._watch_scope: trio.CancelScope | None = None
        self._stop_requested = False
        self._stop_grace: float | None = None

    def __repr__(self) -> str:
        return f"<Sandbox {self.name} {self.label!r} pid={self.pid}>"

    @property
    def returncode(self) -> int | None:
        """bwrap's exit status once reaped (negative: killed by that signal)."""
        popen = self._res.popen
        return None if popen is None else popen.returncode

    def host_pids(self) -> list[int]:
        """Host pids of the sandbox's processes: bwrap's monitor and its pid namespace."""
        popen = self._res.popen
        pids = [] if popen is None or popen.returncode is not None else [popen.pid]
        if self._res.pidns_inode is not None:
            pids += process_tree.pids_in_pid_namespace(self._res.pidns_inode)
        return pids

    def stderr_tail(self, n: int | None = None) -> list[str]:
        """The last ``n`` stderr lines (all kept ones when None)."""
        return self._log.tail(n)

    async def wait(self) -> int | None:
        """Wait until the sandbox process has exited and been reaped."""
        await self._exited.wait()
        return self.returncode

    async def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM, ``grace`` seconds, SIGKILL, reap; then wait for all cleanup to finish."""
        if not self._stop_requested:
            self._stop_requested = True
            self._stop_grace = grace
        if self._watch_scope is not None:
            self._watch_scope.cancel()
        await self._finished.wait()
        return self.returncode
