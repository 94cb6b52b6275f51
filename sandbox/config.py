"""Launcher configuration and the host facts computed once when a launcher opens."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from sandbox import host as hostmod
from sandbox import seccomp, state
from sandbox.argv import BwrapFeatures, RootLayout
from sandbox.limits import CgroupManager, detect_cgroups


@dataclass(frozen=True)
class LauncherConfig:
    """Launcher settings; parsed once by the gateway and passed down."""

    state_dir: Path
    prefix: str = "svcg-"
    bwrap: str | None = None
    nsenter: str | None = None
    prlimit: str | None = None
    # Host identity of sandboxes when the launcher runs as root (never 0).
    host_uid: int = 65534
    host_gid: int = 65534
    # Parent cgroup path (as in /proc/self/cgroup); None = the launcher's own cgroup.
    cgroup_parent: str | None = None
    require_cgroups: bool = True
    stderr_lines: int = 200
    stop_grace: float = 5.0
    start_timeout: float = 10.0
    cleanup_timeout: float = 20.0
    netns_concurrency: int = 4


@dataclass(frozen=True)
class HostSetup:
    """Host facts computed once when the launcher opens."""

    features: BwrapFeatures
    host_root: RootLayout
    identity: hostmod.HostIdentity
    cgroups: CgroupManager | None
    seccomp_program: bytes


def probe_host(config: LauncherConfig) -> HostSetup:
    """Check the host and compute everything spawns need (blocking; run in a thread)."""
    features = hostmod.probe_bwrap(
        hostmod.find_executable("bwrap", config.bwrap),
        hostmod.find_executable("nsenter", config.nsenter),
        hostmod.find_executable("prlimit", config.prlimit),
    )
    identity = hostmod.host_identity(config.host_uid, config.host_gid)
    cg_host = detect_cgroups()
    if cg_host.mode == "none" and config.require_cgroups:
        raise hostmod.HostCheckError("no usable cgroup hierarchy (memory and pids controllers)")
    cgroups = (
        None if cg_host.mode == "none" else CgroupManager(cg_host, parent=config.cgroup_parent)
    )
    _make_dirs(config.state_dir)
    scratch = state.scratch_root(config.state_dir)
    _make_dirs(scratch)
    hostmod.check_traversable(scratch, identity.uid)
    return HostSetup(
        features=features,
        host_root=hostmod.host_root_layout(),
        identity=identity,
        cgroups=cgroups,
        seccomp_program=seccomp.compile_bpf(),
    )


def _make_dirs(path: Path) -> None:
    """``mkdir -p`` giving every directory it creates mode 0711 whatever the umask (systemd's
    ``UMask=0077`` would make them 0700): bwrap opens bind sources below as the sandbox uid.
    Existing directories keep the mode their owner gave them."""
    missing: list[Path] = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o711)
        os.chmod(directory, 0o711)  # noqa: S103 - searchable, not listable: see above
