"""The sandbox launcher: owns every sandbox process from spawn to reap (trio).

Usage::

    async with open_launcher(LauncherConfig(state_dir=...)) as launcher:
        async with launcher.sandbox(spec) as sb:      # or: sb = await launcher.start(spec)
            await sb.stdin.send_all(b"...")
            data = await sb.stdout.receive_some()
        # or a supervisor's own nursery:  sb = await nursery.start(launcher.run, spec)

Start sequence (:meth:`Launcher.run`): write a state record; create the sandbox's network
namespace (unless the spec names one the caller owns); create the scratch dir and cgroup;
spawn ``prlimit ... -- nsenter --net=... -S uid -G gid -- bwrap ... --block-fd ...`` from the
dedicated spawner thread (see :mod:`sandbox.spawner` for why); read bwrap's child pid from
the info fd while bwrap holds the sandbox blocked; check the sandbox is not host uid 0; move
both bwrap processes into the cgroup; unblock. Nothing in the sandbox runs before it is
inside its cgroup (RLIMITs are already set by the ``prlimit`` prefix, see
:mod:`sandbox.argv`).

Resource handling:
    Every sandbox is owned by one task in the launcher's nursery (or the caller's, with
    ``nursery.start(launcher.run, spec)``). Each resource is recorded the moment it exists,
    and the task's ``finally`` releases all of them under a shielded cancel scope with a
    deadline: terminate the process tree (SIGTERM to the sandbox's processes, the grace
    period, SIGKILL to the pid namespace's init and the cgroup, reap), close the pipes,
    remove the cgroup, the owned namespace, the scratch dir and the record. This runs on a
    normal exit, on :meth:`Sandbox.stop`, on cancellation (including mid-spawn) and when the
    launcher closes. The spawner thread is closed last, after every sandbox is gone.

Error handling:
    A failure before the sandbox is started (bad spec, bwrap refusing, unsafe uid) raises
    :class:`SandboxStartError` (or the specific error) from ``start``/``nursery.start`` after
    cleanup. After start, a sandbox's own errors are logged with its identity and end only
    that sandbox; they never tear down the launcher or other sandboxes. Cleanup steps are
    best-effort individually: one failing step is logged and the others still run.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

import netns
from netns.core import process_start_ticks
from sandbox import host as hostmod
from sandbox import process_tree, seccomp, state
from sandbox.argv import RootLayout, Runtime, build_command, group_line, passwd_line
from sandbox.config import HostSetup, LauncherConfig, probe_host
from sandbox.instance import Resources, Sandbox, SpawnFds
from sandbox.limits import Cgroup
from sandbox.memfd import sealed_memfd
from sandbox.spawner import SpawnerThread
from sandbox.spec import SandboxSpec
from sandbox.stderr_log import StderrLog

logger = logging.getLogger("sandbox.launcher")

# Called with (namespace name, spec) before the spawn; returns the spec to start.
Prepare = Callable[[str, SandboxSpec], Awaitable[SandboxSpec]]


class SandboxStartError(RuntimeError):
    """The sandbox could not be started; ``stderr`` holds bwrap's last lines if any."""

    def __init__(self, message: str, stderr: list[str] | None = None) -> None:
        super().__init__(message if not stderr else f"{message}: {' | '.join(stderr[-5:])}")
        self.stderr = stderr or []


class Launcher:
    """Starts sandboxes; obtain one with :func:`open_launcher`."""

    def __init__(
        self,
        config: LauncherConfig,
        setup: HostSetup,
        spawner: SpawnerThread,
        nursery: trio.Nursery,
    ) -> None:
        self.config = config
        self.setup = setup
        self.netns = netns.Netns(
            state.netns_state_dir(config.state_dir),
            limiter=trio.CapacityLimiter(config.netns_concurrency),
        )
        self._spawner = spawner
        self._nursery = nursery
        self._live: dict[str, Sandbox] = {}
        self._io_limiter = trio.CapacityLimiter(4)
        # Cgroup setup in worker threads (see _setup); its own limiter, so a slow teardown
        # holding the I/O limiter (a big scratch dir) never delays a start.
        self._cgroup_limiter = trio.CapacityLimiter(4)

    @property
    def sandboxes(self) -> list[Sandbox]:
        """Sandboxes that are started and not yet cleaned up."""
        return list(self._live.values())

    async def start(self, spec: SandboxSpec) -> Sandbox:
        """Start ``spec`` in the launcher's own nursery; see :meth:`run`."""
        sandbox: Sandbox = await self._nursery.start(self.run, spec)
        return sandbox

    @asynccontextmanager
    async def sandbox(self, spec: SandboxSpec) -> AsyncIterator[Sandbox]:
        """Start ``spec`` and stop it (with cleanup) when the block exits."""
        sb = await self.start(spec)
        try:
            yield sb
        finally:
            with trio.CancelScope(shield=True):
                await sb.stop()

    async def cleanup_leftovers(self) -> list[str]:
        """Remove resources of sandboxes from crashed launchers with our prefix."""
        return await trio.to_thread.run_sync(
            functools.partial(
                state.cleanup_leftovers,
                self.config.state_dir,
                self.config.prefix,
                self.setup.cgroups,
            ),
            limiter=self._io_limiter,
        )

    async def run(
        self,
        spec: SandboxSpec,
        *,
        prepare: Prepare | None = None,
        task_status: trio.TaskStatus[Sandbox] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Own one sandbox: start it, report it via ``task_status``, clean up at the end.

        ``prepare``, when given, is awaited once the sandbox's network namespace exists and
        before anything is spawned, with the namespace's name and the spec; the spec it
        returns is the one started (the egress proxy opens its listener inside the namespace
        there and adds the proxy's environment). Its failure fails the start.

        Returns when the sandbox has exited (by itself or through :meth:`Sandbox.stop`) and
        everything it held is released. Cancelling this task stops the sandbox.
        """
        res = Resources(name=f"{self.config.prefix}{secrets.token_hex(4)}")
        log = StderrLog(spec.label, res.name, max_lines=self.config.stderr_lines)
        sandbox: Sandbox | None = None
        try:
            sandbox = await self._setup(spec, res, log, prepare)
            self._live[res.name] = sandbox
            try:
                await self._supervise(sandbox, res, log, task_status)
            except Exception:
                logger.exception("sandbox %s (%s) failed", res.name, spec.label)
        finally:
            # Nothing ran yet if bwrap is still blocked: no point in a graceful stop.
            grace = self.config.stop_grace if res.unblocked else 0.0
            if sandbox is not None and sandbox._stop_grace is not None:
                grace = sandbox._stop_grace
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + self.config.cleanup_timeout
                await self._teardown(res, log, grace)
            self._live.pop(res.name, None)
            if sandbox is not None:
                sandbox._exited.set()
                sandbox._finished.set()

    async def _supervise(
        self,
        sandbox: Sandbox,
        res: Resources,
        log: StderrLog,
        task_status: trio.TaskStatus[Sandbox],
    ) -> None:
        assert res.pidfd is not None
        stderr = res.streams[2]
        pump_done = trio.Event()

        async def pump() -> None:
            try:
                await log.pump(stderr)
            finally:
                pump_done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump)
            task_status.started(sandbox)
            with trio.CancelScope() as watch:
                sandbox._watch_scope = watch
                if sandbox._stop_requested:
                    watch.cancel()
                await process_tree.wait_exit(res.pidfd)
            grace = sandbox._stop_grace
            await self._terminate(res, self.config.stop_grace if grace is None else grace)
            sandbox._exited.set()
            # All writers of the pipe are dead now; the bound only guards against bugs.
            with trio.move_on_after(1.0):
                await pump_done.wait()
            nursery.cancel_scope.cancel()

    async def _setup(
        self, spec: SandboxSpec, res: Resources, log: StderrLog, prepare: Prepare | None
    ) -> Sandbox:
        cfg, setup = self.config, self.setup
        root = setup.host_root
        if spec.rootfs is not None:
            root = await trio.to_thread.run_sync(hostmod.image_root_layout, spec.rootfs)
        scratch = state.scratch_root(cfg.state_dir) / res.name if spec.scratch else None
        record = state.SandboxRecord(
            name=res.name,
            label=spec.label,
            owner_pid=os.getpid(),
            owner_start_ticks=process_start_ticks(os.getpid()),
            created_at=time.time(),
            owned_netns=res.name if spec.netns is None else None,
            cgroup=setup.cgroups is not None,
            scratch=None if scratch is None else str(scratch),
        )
        res.record = True
        await trio.to_thread.run_sync(
            state.write_record, cfg.state_dir, record, limiter=self._io_limiter
        )

        if spec.netns is None:
            res.owned_netns = res.name  # before the await: a cancelled create is still removed
            await self.netns.create(res.name, labels={"sandbox": res.name, "label": spec.label})
        elif not netns.namespace_path(spec.netns).exists():
            raise SandboxStartError(f"network namespace {spec.netns!r} does not exist")
        netns_path = str(netns.namespace_path(spec.netns or res.name))
        if prepare is not None:
            spec = await prepare(spec.netns or res.name, spec)

        if scratch is not None:
            res.scratch = scratch
            await trio.to_thread.run_sync(self._make_scratch, scratch, limiter=self._io_limiter)
        if setup.cgroups is not None:
            # In a worker thread: on cgroup v1 a mkdir or a write to cgroup.procs can wait
            # for an RCU grace period (10-25 ms measured), which must not stall the event
            # loop (every other sandbox's start and every warm request wait on it). The
            # thread records the handle itself the moment the cgroup exists, so a
            # cancellation that arrives meanwhile still finds it in ``res`` for cleanup.
            cgroups, limits = setup.cgroups, spec.limits

            def make_cgroup() -> None:
                res.cgroup = cgroups.create(res.name, limits)

            await trio.to_thread.run_sync(make_cgroup, limiter=self._cgroup_limiter)

        fds = self._make_fds(spec, res, root, netns_path)
        argv = build_command(spec, root, setup.features, fds.runtime)
        logger.debug("spawning sandbox %s: %s", res.name, argv)
        res.popen = await self._spawner.run(
            functools.partial(_popen, argv, fds.child_stdio, fds.passed)
        )
        res.pidfd = os.pidfd_open(res.popen.pid)
        # The child has its copies now; ours of the child's ends must go, or EOF never comes.
        for fd in (*fds.child_stdio, *fds.passed):
            res.fds.remove(fd)
            os.close(fd)
        # FdStream takes ownership of (and sets O_NONBLOCK on) the parent ends.
        for fd in fds.parent_streams:
            res.fds.remove(fd)
            res.streams.append(trio.lowlevel.FdStream(fd))
        stdin, stdout = res.streams[0], res.streams[1]

        with trio.fail_after(cfg.start_timeout):
            known = await _learn_child(res)
        if not known:
            raise await self._start_failed(res, log)
        assert res.child_pid is not None
        try:
            if res.child_pidfd is None:
                raise ProcessLookupError(res.child_pid)
            hostmod.check_not_host_root(res.popen.pid)
            hostmod.check_not_host_root(res.child_pid)
            if res.cgroup is not None:
                # A worker thread, for the reason given where the cgroup is made. bwrap is
                # still blocked meanwhile: nothing in the sandbox runs outside the cgroup.
                await trio.to_thread.run_sync(
                    _attach,
                    res.cgroup,
                    (res.popen.pid, res.child_pid),
                    limiter=self._cgroup_limiter,
                )
        except (ProcessLookupError, FileNotFoundError):
            # bwrap builds the mount tree before it blocks on --block-fd, so a spec it
            # cannot set up (missing bind source ...) usually makes it exit right here.
            raise await self._start_failed(res, log) from None
        os.write(fds.block_w, b"1")
        res.fds.remove(fds.block_w)
        os.close(fds.block_w)
        res.unblocked = True
        return Sandbox(res.name, spec, res, log, stdin, stdout)

    def _make_scratch(self, path: Path) -> None:
        path.mkdir(mode=0o700)
        ident = self.setup.identity
        if ident.uid is not None and ident.gid is not None:
            os.chown(path, ident.uid, ident.gid)

    def _make_fds(
        self, spec: SandboxSpec, res: Resources, root: RootLayout, netns_path: str
    ) -> SpawnFds:
        """Create every fd the spawn needs; each is registered in ``res.fds`` at once."""

        def track(fd: int) -> int:
            res.fds.append(fd)
            return fd

        seccomp_fd = track(seccomp.write_filter_fd(self.setup.seccomp_program))
        data_files: list[tuple[int, str]] = []
        if root.host:
            for dest, text in (
                ("/etc/passwd", passwd_line(spec.uid, spec.gid, spec.home)),
                ("/etc/group", group_line(spec.gid)),
            ):
                data_files.append((track(sealed_memfd("svcg-etc", text.encode())), dest))
        for dest, content in spec.files:
            data_files.append((track(sealed_memfd("svcg-file", content)), dest))
        info_r, info_w = (track(fd) for fd in os.pipe())
        block_r, block_w = (track(fd) for fd in os.pipe())
        stdin_r, stdin_w = (track(fd) for fd in os.pipe())
        stdout_r, stdout_w = (track(fd) for fd in os.pipe())
        stderr_r, stderr_w = (track(fd) for fd in os.pipe())
        ident = self.setup.identity
        runtime = Runtime(
            netns_path=netns_path,
            host_uid=ident.uid,
            host_gid=ident.gid,
            seccomp_fd=seccomp_fd,
            info_fd=info_w,
            block_fd=block_r,
            data_files=tuple(data_files),
            scratch_source=None if res.scratch is None else str(res.scratch),
        )
        return SpawnFds(
            runtime=runtime,
            child_stdio=(stdin_r, stdout_w, stderr_w),
            passed=(seccomp_fd, info_w, block_r, *(fd for fd, _ in data_files)),
            parent_streams=(stdin_w, stdout_r, stderr_r, info_r),
            block_w=block_w,
        )

    async def _start_failed(self, res: Resources, log: StderrLog) -> SandboxStartError:
        """Wait (bounded) for bwrap to exit and describe the failure with its stderr."""
        assert res.pidfd is not None
        with trio.move_on_after(self.config.start_timeout):
            await process_tree.wait_exit(res.pidfd)
        await self._drain(res.streams[2], log)
        return SandboxStartError(f"bwrap failed to start sandbox {res.name}", log.tail())

    async def _drain(self, stream: trio.lowlevel.FdStream, log: StderrLog) -> None:
        with trio.move_on_after(1.0):
            await log.pump(stream)

    async def _terminate(self, res: Resources, grace: float) -> None:
        """Stop the whole process tree, reap bwrap and wait for its init to be gone.

        Idempotent. The sandbox's processes are only known to be gone once bwrap's init
        (pid 1 of the namespace) has exited: the kernel finishes killing a pid namespace
        before its init's exit completes. So if a cancellation interrupted the start before
        the init's pid was read, read it now (bwrap writes it right after cloning), and kill
        the init before bwrap itself: an init orphaned while still blocked would otherwise
        read EOF on --block-fd and run the command unsupervised.
        """
        popen, pidfd = res.popen, res.pidfd
        if popen is None or pidfd is None:
            return
        if res.child_pid is None and len(res.streams) == 4 and popen.poll() is None:
            with trio.move_on_after(self.config.start_timeout):
                await _learn_child(res)
        if popen.poll() is None and grace > 0 and res.pidns_inode is not None:
            exclude = frozenset({res.child_pid or 0})
            signalled = process_tree.signal_pid_namespace(
                res.pidns_inode, signal.SIGTERM, exclude=exclude
            )
            # Nobody to wait for if the command has not been forked yet (a stop right after
            # start): only bwrap's init exists, and it ignores SIGTERM.
            if signalled:
                with trio.move_on_after(grace):
                    await process_tree.wait_exit(pidfd)
        if res.child_pidfd is not None:
            process_tree.send_signal(res.child_pidfd, signal.SIGKILL)
        if res.cgroup is not None:
            res.cgroup.kill()
        if popen.poll() is None:
            process_tree.send_signal(pidfd, signal.SIGKILL)
            await process_tree.wait_exit(pidfd)
        popen.wait()
        if res.child_pidfd is not None:
            await process_tree.wait_exit(res.child_pidfd)

    async def _teardown(self, res: Resources, log: StderrLog, grace: float) -> None:
        with _best_effort(res.name, "terminate"):
            await self._terminate(res, grace)
        if len(res.streams) == 4:
            with _best_effort(res.name, "drain stderr"):
                await self._drain(res.streams[2], log)
        for stream in res.streams:
            with _best_effort(res.name, "close pipe"):
                await stream.aclose()
        for fd in res.fds:
            with _best_effort(res.name, "close fd"):
                os.close(fd)
        res.fds.clear()
        for pidfd in (res.pidfd, res.child_pidfd):
            with _best_effort(res.name, "close pidfd"):
                process_tree.close_pidfd(pidfd)
        res.pidfd = res.child_pidfd = None
        if res.cgroup is not None:
            with _best_effort(res.name, "remove cgroup"):
                await _remove_cgroup(res.cgroup)
        if res.owned_netns is not None:
            with _best_effort(res.name, "remove netns"):
                await self.netns.remove(res.owned_netns)
        if res.scratch is not None:
            with _best_effort(res.name, "remove scratch"):
                await trio.to_thread.run_sync(
                    functools.partial(shutil.rmtree, res.scratch, ignore_errors=True),
                    limiter=self._io_limiter,
                )
        if res.record:
            with _best_effort(res.name, "remove record"):
                state.remove_record(self.config.state_dir, res.name)


def _popen(
    argv: list[str], stdio: tuple[int, int, int], pass_fds: tuple[int, ...]
) -> subprocess.Popen[bytes]:
    # Runs in the spawner thread: that thread is bwrap's parent for --die-with-parent.
    return subprocess.Popen(
        argv,
        stdin=stdio[0],
        stdout=stdio[1],
        stderr=stdio[2],
        pass_fds=pass_fds,
        close_fds=True,
        env={},
        # Own session: a terminal's Ctrl-C to the gateway's process group must not reach
        # sandboxes directly; the gateway stops them in order.
        start_new_session=True,
    )


def _attach(cgroup: Cgroup, pids: tuple[int, ...]) -> None:
    for pid in pids:
        cgroup.attach(pid)


async def _learn_child(res: Resources) -> bool:
    """Read bwrap's --info-fd JSON into ``res`` (child pid, pid namespace, pidfd).

    Returns False if bwrap exited without writing it. Resumable: bytes already read are
    kept in ``res.info``, so a read cancelled mid-way loses nothing.
    """
    info = res.streams[3]
    while res.child_pid is None:
        with contextlib.suppress(ValueError):
            parsed = json.loads(res.info)
            if isinstance(parsed, dict) and "child-pid" in parsed:
                # Open the pidfd first: the pid cannot be reused while bwrap is blocked
                # on --block-fd, and from then on the pidfd pins the exact process.
                res.child_pidfd = process_tree.pidfd_open(int(parsed["child-pid"]))
                res.child_pid = int(parsed["child-pid"])
                res.pidns_inode = int(parsed.get("pid-namespace", 0)) or None
                break
        chunk = await info.receive_some(4096)
        if not chunk:
            return False
        res.info += chunk
    return True


async def _remove_cgroup(cgroup: Cgroup) -> None:
    # The tree is reaped before this runs, but v1 can report EBUSY for a moment while the
    # kernel finishes tearing tasks down, and it offers no cheap notification: poll briefly.
    for _ in range(200):
        cgroup.kill()
        if cgroup.remove():
            return
        await trio.sleep(0.01)
    raise RuntimeError(f"{cgroup} still busy")


@contextlib.contextmanager
def _best_effort(name: str, step: str) -> Iterator[None]:
    try:
        yield
    except Exception:  # one failed cleanup step must not skip the others
        logger.exception("sandbox %s: cleanup step %r failed", name, step)


@asynccontextmanager
async def open_launcher(config: LauncherConfig) -> AsyncIterator[Launcher]:
    """Check the host, start the spawner thread and yield a :class:`Launcher`.

    On exit every sandbox still running is stopped and cleaned up (its owner task is
    cancelled and runs its shielded cleanup), then the spawner thread ends.
    """
    setup = await trio.to_thread.run_sync(probe_host, config)
    spawner = SpawnerThread()
    spawner.start()
    try:
        async with trio.open_nursery() as nursery:
            launcher = Launcher(config, setup, spawner, nursery)
            try:
                yield launcher
            finally:
                nursery.cancel_scope.cancel()
    finally:
        spawner.close()
