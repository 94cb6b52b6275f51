"""Host facts and safety checks the launcher needs before it builds any argv.

* bwrap must not be setuid (or carry file capabilities): a privileged bwrap is a different
  security model (CVE-2016-8659 and friends) and it refuses some of our options anyway.
* ``--disable-userns`` support is probed from ``bwrap --help`` (bubblewrap >= 0.8).
* The read-only root layout is computed from the real directories: on usr-merged hosts
  ``/bin``, ``/lib``... are symlinks into ``/usr`` and must be recreated as symlinks, on
  others they are directories to bind. For an image rootfs, its top-level entries.
* The sandbox must never be real uid 0 on the host: when the launcher runs as root, bwrap
  is started as an unprivileged host uid (nsenter ``-S``/``-G``), and after the spawn the
  sandbox's first process is checked from the host side.

Error handling:
    Every refusal is a :class:`HostCheckError` with a message meant for the operator.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sandbox.argv import BwrapFeatures, RootLayout

HOST_ROOT_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64")
# Image entries the sandbox layout provides itself (fresh proc/dev/tmpfs) or must not see.
IMAGE_SKIPPED = frozenset({"proc", "dev", "sys", "tmp", "run", "home"})


class HostCheckError(RuntimeError):
    """The host or the configuration is unsafe or unusable for sandboxes."""


def find_executable(name: str, configured: str | None) -> str:
    """Absolute path of ``configured`` or of ``name`` on a fixed system PATH."""
    path = configured or shutil.which(name, path="/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
    if not path or not os.path.isabs(path) or not os.access(path, os.X_OK):
        raise HostCheckError(f"{name} not found (install bubblewrap / util-linux)")
    return path


def check_bwrap_unprivileged(path: str) -> None:
    """Refuse a setuid/setgid bwrap or one with file capabilities."""
    st = os.stat(path)
    if st.st_mode & (stat.S_ISUID | stat.S_ISGID):
        raise HostCheckError(f"{path} is setuid/setgid; refusing to use a privileged bwrap")
    try:
        os.getxattr(path, "security.capability")
    except OSError as exc:
        if exc.errno not in (errno.ENODATA, errno.ENOTSUP):
            raise
    else:
        raise HostCheckError(f"{path} has file capabilities; refusing a privileged bwrap")


def probe_bwrap(bwrap: str, nsenter: str, prlimit: str) -> BwrapFeatures:
    """Check bwrap and find out which optional features it has."""
    check_bwrap_unprivileged(bwrap)
    helptext = subprocess.run(
        [bwrap, "--help"], capture_output=True, text=True, check=False, timeout=10, env={}
    ).stdout
    if "--info-fd" not in helptext or "--block-fd" not in helptext:
        raise HostCheckError(f"{bwrap} is too old: it lacks --info-fd/--block-fd")
    return BwrapFeatures(
        bwrap_path=bwrap,
        nsenter_path=nsenter,
        prlimit_path=prlimit,
        disable_userns="--disable-userns" in helptext,
    )


def host_root_layout(dirs: tuple[str, ...] = HOST_ROOT_DIRS) -> RootLayout:
    """Bind the host's system directories read-only, recreating top-level symlinks."""
    binds, links = [], []
    for path in dirs:
        if os.path.islink(path):
            links.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            binds.append((path, path))
    if ("/usr", "/usr") not in binds:
        raise HostCheckError("the host has no /usr directory to bind")
    return RootLayout(binds=tuple(binds), symlinks=tuple(links), host=True)


def image_root_layout(rootfs: str) -> RootLayout:
    """Bind an image's top-level directories read-only and recreate its top-level links."""
    root = Path(rootfs)
    if not root.is_dir():
        raise HostCheckError(f"rootfs {rootfs!r} is not a directory")
    binds, links = [], []
    for entry in sorted(root.iterdir()):
        if entry.name in IMAGE_SKIPPED:
            continue
        if entry.is_symlink():
            links.append((f"/{entry.name}", os.readlink(entry)))
        elif entry.is_dir():
            binds.append((str(entry), f"/{entry.name}"))
    return RootLayout(binds=tuple(binds), symlinks=tuple(links), host=False)


@dataclass(frozen=True)
class HostIdentity:
    """The host uid/gid bwrap (and so the sandbox) runs as, when we must switch."""

    uid: int | None
    gid: int | None


def host_identity(host_uid: int, host_gid: int) -> HostIdentity:
    """Decide the host identity of sandboxes; refuse anything that would be uid/gid 0."""
    if os.geteuid() != 0:
        # Unprivileged launcher: bwrap runs as us and maps the sandbox uid to our uid.
        if os.getuid() == 0:
            raise HostCheckError("real uid 0 with a non-root effective uid is not supported")
        return HostIdentity(None, None)
    if host_uid == 0 or host_gid == 0:
        raise HostCheckError("sandboxes must not run as host uid/gid 0; set host_uid/host_gid")
    return HostIdentity(host_uid, host_gid)


def check_not_host_root(pid: int) -> None:
    """Refuse if any uid or gid of process ``pid`` is 0 as seen from the host."""
    status = Path(f"/proc/{pid}/status").read_text()
    for line in status.splitlines():
        key, _, values = line.partition(":")
        if key in ("Uid", "Gid") and "0" in values.split():
            raise HostCheckError(f"sandbox process {pid} maps to host {key.lower()} 0; refusing")


def check_traversable(path: Path, uid: int | None) -> None:
    """Require every ancestor of ``path`` to be searchable by host ``uid`` (others bit).

    bwrap resolves bind sources as the unprivileged host uid; an unreadable parent shows up
    only as a confusing "Can't find source path" at spawn time.
    """
    if uid is None:
        return
    for parent in [path, *path.parents]:
        st = parent.stat()
        if st.st_uid != uid and not st.st_mode & stat.S_IXOTH:
            raise HostCheckError(
                f"{parent} is not searchable by the sandbox host uid {uid} (mode "
                f"{stat.filemode(st.st_mode)}); choose a state directory it can reach"
            )
