"""What a caller asks for when it starts a sandbox (pure data, validated, no I/O).

:class:`SandboxSpec` is the caller's intent: the command, its environment, the root file
system (an image directory or the host's ``/usr``), extra binds, sizes and limits. Runtime
facts the caller cannot know (file descriptors, the host's directory layout, which bwrap
features exist) are added by the launcher and combined in :mod:`sandbox.argv`.

Validation happens at construction so a bad spec fails where it was written, not as an
obscure bwrap error at spawn time. Every string that reaches bwrap's argv is checked for NUL
bytes (argv cannot carry them) and every path must be absolute and normalised, so ``..``
cannot be used to bind or mount outside the intended place.
"""

from __future__ import annotations

import posixpath
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field

MIB = 1024 * 1024

# The nobody/nogroup ids: own no files on a normal host.
DEFAULT_UID = 65534
DEFAULT_GID = 65534

# Parts of the host's /etc a host-mode sandbox sees (bound only if they exist). TLS trust
# roots are needed by almost every tool server; ld.so.cache keeps library lookup working for
# libraries outside the default paths; alternatives resolves /usr/bin symlinks.
DEFAULT_HOST_ETC = ("/etc/ssl", "/etc/ca-certificates", "/etc/ld.so.cache", "/etc/alternatives")

# Mount points the sandbox layout owns; caller binds may not replace them.
RESERVED_DESTINATIONS = ("/", "/proc", "/dev")

# The sandbox's private /tmp: a fresh size-limited tmpfs inside the sandbox's own mount
# namespace, never the host's /tmp, so the shared-/tmp warning (S108) does not apply.
SANDBOX_TMP = "/tmp"  # noqa: S108

_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HOSTNAME_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_MAX_ID = 2**32 - 2  # (uid_t)-1 means "unchanged" to the kernel


class InvalidSpec(ValueError):
    """A sandbox spec that cannot be turned into a safe bwrap invocation."""


def check_text(value: str, what: str) -> str:
    """Reject strings that cannot be passed in argv."""
    if "\x00" in value:
        raise InvalidSpec(f"{what} contains a NUL byte")
    return value


def check_abs_path(value: str, what: str) -> str:
    """Require an absolute, normalised path (no ``..``, ``.``, ``//`` or trailing slash)."""
    check_text(value, what)
    if not value.startswith("/") or posixpath.normpath(value) != value or value.startswith("//"):
        raise InvalidSpec(f"{what} must be an absolute normalised path, got {value!r}")
    return value


def is_under(path: str, parent: str) -> bool:
    """True when ``path`` equals ``parent`` or lies below it (both normalised)."""
    return parent == "/" or path == parent or path.startswith(parent + "/")


@dataclass(frozen=True)
class Bind:
    """Bind ``source`` on the host to ``dest`` in the sandbox."""

    source: str
    dest: str
    writable: bool = False
    # Skip silently when the source does not exist (bwrap's --*bind-try).
    optional: bool = False

    def __post_init__(self) -> None:
        check_abs_path(self.source, "bind source")
        check_abs_path(self.dest, "bind destination")
        for reserved in RESERVED_DESTINATIONS:
            if self.dest == reserved or (reserved != "/" and is_under(self.dest, reserved)):
                raise InvalidSpec(f"bind destination {self.dest!r} is reserved")


@dataclass(frozen=True)
class ResourceLimits:
    """Limits applied through cgroups (memory, pids, cpu) and RLIMITs (the rest).

    ``None`` leaves a cgroup limit unset. RLIMIT_CORE is always 0: a core dump of a tool
    server could hold credentials the egress proxy injected.
    """

    memory_bytes: int | None = 512 * MIB
    pids: int | None = 256
    # CPU time as a number of CPUs (1.5 = one and a half cores' worth per period).
    cpus: float | None = 1.0
    nofile: int = 1024
    nproc: int | None = 1024
    fsize_bytes: int = 1024 * MIB

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "pids", "nproc"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise InvalidSpec(f"{name} must be positive")
        if self.cpus is not None and not 0.01 <= self.cpus <= 1024:
            raise InvalidSpec("cpus must be between 0.01 and 1024")
        if self.nofile < 16 or self.fsize_bytes <= 0:
            raise InvalidSpec("nofile must be >= 16 and fsize_bytes positive")


@dataclass(frozen=True)
class SandboxSpec:
    """A sandbox to start. See the module docstring."""

    command: tuple[str, ...]
    # Identity used in logs and in the stderr ring buffer; never interpreted.
    label: str = "sandbox"
    # Image root directory, or None for the host's /usr (+ /bin, /lib ... links) layout.
    rootfs: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    uid: int = DEFAULT_UID
    gid: int = DEFAULT_GID
    hostname: str = "sandbox"
    home: str = "/home/sandbox"
    home_size: int = 64 * MIB
    tmp_size: int = 64 * MIB
    # Working directory; None means the home directory.
    cwd: str | None = None
    binds: tuple[Bind, ...] = ()
    # Where a fresh per-instance writable directory appears, or None for no scratch dir.
    scratch: str | None = None
    # Existing namespace to join (the caller owns it), or None: the launcher makes one.
    netns: str | None = None
    host_etc: tuple[str, ...] = DEFAULT_HOST_ETC
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    # Read-only files whose content the caller supplies, as (destination, bytes): each is
    # passed through a sealed memfd (``--ro-bind-data``), so no host path is involved.
    files: tuple[tuple[str, bytes], ...] = ()

    def __post_init__(self) -> None:
        if not self.command:
            raise InvalidSpec("command must not be empty")
        for arg in self.command:
            check_text(arg, "command argument")
        # bwrap execs the command without a shell or PATH search we control.
        check_abs_path(self.command[0], "command path")
        check_text(self.label, "label")
        if self.rootfs is not None:
            check_abs_path(self.rootfs, "rootfs")
        # Copy into a read-only mapping: the spec is frozen, its environment must be too.
        env = types.MappingProxyType(dict(self.env))
        for key, value in env.items():
            if not _ENV_NAME_RE.fullmatch(key):
                raise InvalidSpec(f"invalid environment variable name {key!r}")
            check_text(value, f"environment value of {key}")
        object.__setattr__(self, "env", env)
        for name in ("uid", "gid"):
            if not 0 <= getattr(self, name) <= _MAX_ID:
                raise InvalidSpec(f"{name} out of range")
        if not _HOSTNAME_RE.fullmatch(self.hostname):
            raise InvalidSpec(f"invalid hostname {self.hostname!r}")
        check_abs_path(self.home, "home")
        if self.cwd is not None:
            check_abs_path(self.cwd, "cwd")
        if self.home_size <= 0 or self.tmp_size <= 0:
            raise InvalidSpec("tmpfs sizes must be positive")
        if self.scratch is not None:
            check_abs_path(self.scratch, "scratch")
        for path in (self.home, *((self.scratch,) if self.scratch else ())):
            if path in RESERVED_DESTINATIONS or is_under(path, "/proc") or is_under(path, "/dev"):
                raise InvalidSpec(f"{path!r} is reserved")
        for path in self.host_etc:
            check_abs_path(path, "host /etc entry")
            if not is_under(path, "/etc") or path == "/etc":
                raise InvalidSpec(f"host /etc entry {path!r} must be below /etc")
        if self.netns is not None:
            check_text(self.netns, "netns")
        if not isinstance(self.binds, tuple):
            raise InvalidSpec("binds must be a tuple of Bind")
        for dest, content in self.files:
            check_abs_path(dest, "file destination")
            if dest in RESERVED_DESTINATIONS or is_under(dest, "/proc") or is_under(dest, "/dev"):
                raise InvalidSpec(f"{dest!r} is reserved")
            if not isinstance(content, bytes):
                raise InvalidSpec(f"content of {dest!r} must be bytes")

    @property
    def workdir(self) -> str:
        """The directory the command starts in."""
        return self.cwd if self.cwd is not None else self.home
