"""Pure bubblewrap argv builder: (spec, host facts, runtime fds) -> argv. No I/O.

The full command is::

    prlimit --nofile=N:N --core=0:0 --fsize=F:F [--nproc=P:P] -- \
        nsenter --net=/var/run/netns/NAME [-S UID -G GID] -- bwrap OPTIONS -- COMMAND...

``prlimit`` sets the RLIMITs on itself and execs the rest, so every process of the sandbox
inherits them without a ``preexec_fn`` (unsafe in a threaded parent) and without the
CAP_SYS_RESOURCE that ``prlimit(2)`` on another user's process would need.

``nsenter`` joins the sandbox's network namespace (made by :mod:`netns`) and, when the
launcher runs as root, drops to an unprivileged host uid/gid before bwrap starts, so bwrap
runs unprivileged and the sandbox's uid maps to that host uid, never to 0. It then execs
bwrap in the same process (``--net`` alone does not fork), which keeps bwrap a direct child
of the launcher's spawner thread for ``--die-with-parent`` (prlimit execs in place too).

Why not ``--unshare-all``: it includes ``--unshare-net``, which would put the sandbox in a
new, empty namespace instead of ours (where the egress proxy's listener lives). We list the
other namespaces explicitly. Without a netns path the builder does use ``--unshare-net``.

Ordering rules bwrap imposes, which this module guarantees (and the tests check):

* ``--size N`` applies to the *next* ``--tmpfs`` only, so it comes immediately before it;
* mounts happen in argv order, so every mount comes after its parent directories' mounts
  (a tmpfs before anything bound below it, see :func:`mount_operations`);
* ``--clearenv`` comes before every ``--setenv``;
* ``--remount-ro /`` comes after every mount, freezing the (tmpfs) root directory itself
  while leaving the tmpfs/scratch mounts below it writable;
* the command follows a single ``--``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandbox.spec import (
    SANDBOX_TMP,
    Bind,
    InvalidSpec,
    ResourceLimits,
    SandboxSpec,
    check_abs_path,
    check_text,
)


@dataclass(frozen=True)
class RootLayout:
    """The read-only root file system, as decided by the launcher from the real directories.

    ``binds`` are (source, dest) directory pairs bound read-only; ``symlinks`` are
    (path, target) pairs created in the sandbox (usr-merged ``/bin -> usr/bin``). For the
    host layout the launcher checks which of ``/bin``, ``/lib``... are links and which are
    directories; for an image it lists the image's top-level entries.
    """

    binds: tuple[tuple[str, str], ...]
    symlinks: tuple[tuple[str, str], ...] = ()
    # True for the host layout: a minimal /etc (passwd, group, TLS roots) is synthesised.
    host: bool = True

    def __post_init__(self) -> None:
        for source, dest in self.binds:
            check_abs_path(source, "root bind source")
            check_abs_path(dest, "root bind destination")
        for path, target in self.symlinks:
            check_abs_path(path, "root symlink path")
            check_text(target, "root symlink target")
            if not target:
                raise InvalidSpec("empty symlink target")


@dataclass(frozen=True)
class BwrapFeatures:
    """What the installed bwrap supports (probed by the launcher)."""

    bwrap_path: str = "/usr/bin/bwrap"
    nsenter_path: str = "/usr/bin/nsenter"
    prlimit_path: str = "/usr/bin/prlimit"
    # --disable-userns exists from bubblewrap 0.8.
    disable_userns: bool = True


@dataclass(frozen=True)
class Runtime:
    """Per-spawn values: file descriptors and host paths made by the launcher."""

    netns_path: str | None = None
    # Host identity bwrap runs as (nsenter -S/-G); None keeps the launcher's own.
    host_uid: int | None = None
    host_gid: int | None = None
    seccomp_fd: int | None = None
    # bwrap writes {"child-pid": ...} here once the namespaces exist.
    info_fd: int | None = None
    # bwrap waits for a byte here before running the command (cgroup/rlimit setup window).
    block_fd: int | None = None
    # (fd, dest) pairs for files whose content the launcher generated (/etc/passwd ...).
    data_files: tuple[tuple[int, str], ...] = ()
    # Host directory bound writable at spec.scratch.
    scratch_source: str | None = None

    def __post_init__(self) -> None:
        for fd in (self.seccomp_fd, self.info_fd, self.block_fd):
            if fd is not None and fd < 3:
                raise InvalidSpec("runtime fds must be >= 3 (0-2 are the sandbox's stdio)")
        for fd, dest in self.data_files:
            if fd < 3:
                raise InvalidSpec("runtime fds must be >= 3 (0-2 are the sandbox's stdio)")
            check_abs_path(dest, "data file destination")
        if self.netns_path is not None:
            check_abs_path(self.netns_path, "netns path")
        if self.scratch_source is not None:
            check_abs_path(self.scratch_source, "scratch source")
        if (self.host_uid is None) != (self.host_gid is None):
            raise InvalidSpec("host_uid and host_gid go together")


def passwd_line(uid: int, gid: int, home: str) -> str:
    """A passwd entry for the sandbox user; tools that look up $USER need one."""
    return f"sandbox:x:{uid}:{gid}:sandbox:{home}:/bin/sh\n"


def group_line(gid: int) -> str:
    """A group entry for the sandbox group."""
    return f"sandbox:x:{gid}:\n"


def _depth(dest: str) -> int:
    return 0 if dest == "/" else dest.count("/")


def _bind_args(bind: Bind) -> list[str]:
    if bind.writable:
        option = "--bind-try" if bind.optional else "--bind"
    else:
        option = "--ro-bind-try" if bind.optional else "--ro-bind"
    return [option, bind.source, bind.dest]


def mount_operations(
    spec: SandboxSpec, root: RootLayout, runtime: Runtime
) -> list[tuple[str, list[str]]]:
    """Every mount-like operation as (destination, bwrap args), in the order to apply them.

    Sorted (stably) by destination depth, so a mount always comes after the mounts of its
    parent directories: ``/tmp``'s tmpfs before a bind at ``/tmp/x``, the root ``/usr``
    before a bind at ``/usr/local/x``, a caller's bind at ``/etc`` before our
    ``/etc/passwd``. Among equal depths the order below holds, so a caller's bind at the
    same destination as one of ours is applied last and wins.
    """
    ops: list[tuple[str, list[str]]] = []
    # Root file system (bwrap's root is an empty tmpfs; everything is mounted onto it).
    for source, dest in sorted(root.binds, key=lambda b: b[1]):
        ops.append((dest, ["--ro-bind", source, dest]))
    for path, target in sorted(root.symlinks):
        ops.append((path, ["--symlink", target, path]))
    ops.append(("/proc", ["--proc", "/proc"]))
    ops.append(("/dev", ["--dev", "/dev"]))
    # --size applies to the next --tmpfs only: keep each pair together in one operation.
    ops.append((SANDBOX_TMP, ["--size", str(spec.tmp_size), "--tmpfs", SANDBOX_TMP]))
    ops.append((spec.home, ["--size", str(spec.home_size), "--tmpfs", spec.home]))
    if root.host:
        for path in sorted(spec.host_etc):
            ops.append((path, ["--ro-bind-try", path, path]))
    for fd, dest in sorted(runtime.data_files, key=lambda d: d[1]):
        ops.append((dest, ["--ro-bind-data", str(fd), dest]))
    binds = list(spec.binds)
    if spec.scratch is not None:
        if runtime.scratch_source is None:
            raise InvalidSpec("spec asks for a scratch dir but the runtime has no source")
        binds.append(Bind(runtime.scratch_source, spec.scratch, writable=True))
    ops.extend((bind.dest, _bind_args(bind)) for bind in binds)
    return sorted(ops, key=lambda op: _depth(op[0]))


def build_bwrap_argv(
    spec: SandboxSpec, root: RootLayout, features: BwrapFeatures, runtime: Runtime
) -> list[str]:
    """The bwrap invocation (starting with the bwrap path) for ``spec``."""
    argv = [features.bwrap_path]
    # Namespaces. --unshare-user first: bwrap needs it for --uid/--gid and --disable-userns.
    argv += ["--unshare-user"]
    if features.disable_userns:
        argv += ["--disable-userns"]
    argv += ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
    if runtime.netns_path is None:
        argv += ["--unshare-net"]
    argv += ["--hostname", spec.hostname]
    argv += ["--uid", str(spec.uid), "--gid", str(spec.gid)]
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if runtime.info_fd is not None:
        argv += ["--info-fd", str(runtime.info_fd)]
    if runtime.block_fd is not None:
        argv += ["--block-fd", str(runtime.block_fd)]

    argv += [arg for _dest, args in mount_operations(spec, root, runtime) for arg in args]
    argv += ["--remount-ro", "/"]

    if runtime.seccomp_fd is not None:
        argv += ["--seccomp", str(runtime.seccomp_fd)]
    argv += ["--clearenv"]
    for key in sorted(spec.env):
        argv += ["--setenv", key, spec.env[key]]
    argv += ["--chdir", spec.workdir]
    argv += ["--", *spec.command]
    return argv


def rlimit_options(limits: ResourceLimits) -> list[str]:
    """``prlimit`` options for ``limits`` (soft = hard, so the sandbox cannot raise them).

    RLIMIT_NPROC counts every process of the *host* uid, across user namespaces: all
    sandboxes sharing a host uid share this budget. The per-sandbox process cap is the
    cgroup's ``pids.max``; NPROC is a host-wide backstop.
    """
    options = [
        f"--nofile={limits.nofile}:{limits.nofile}",
        "--core=0:0",
        f"--fsize={limits.fsize_bytes}:{limits.fsize_bytes}",
    ]
    if limits.nproc is not None:
        options.append(f"--nproc={limits.nproc}:{limits.nproc}")
    return options


def build_command(
    spec: SandboxSpec, root: RootLayout, features: BwrapFeatures, runtime: Runtime
) -> list[str]:
    """The complete argv to spawn: prlimit, nsenter (if needed), then bwrap's argv."""
    argv = [features.prlimit_path, *rlimit_options(spec.limits), "--"]
    if runtime.netns_path is not None or runtime.host_uid is not None:
        argv.append(features.nsenter_path)
        if runtime.netns_path is not None:
            argv.append(f"--net={runtime.netns_path}")
        if runtime.host_uid is not None and runtime.host_gid is not None:
            # -G also drops supplementary groups (setgroups(0, NULL)).
            argv += ["-S", str(runtime.host_uid), "-G", str(runtime.host_gid)]
        argv.append("--")
    return argv + build_bwrap_argv(spec, root, features, runtime)
