"""The sandbox's seccomp filter, built with libseccomp (through the ``pyseccomp`` binding).

bwrap installs the filter (``--seccomp FD``) right before it execs the command, after it has
finished its own privileged setup. The filter allows by default and makes a blocklist of
kernel attack surface fail with ``EPERM``, in the spirit of Flatpak's ``setup_seccomp``:

* namespaces and mounts: ``setns``, ``unshare``/``clone`` with ``CLONE_NEWUSER`` (also
  stopped by ``--disable-userns``), ``mount``, ``umount2``, ``pivot_root`` and the new
  mount API (``open_tree``, ``move_mount``, ``fsopen``, ``fsconfig``, ``fsmount``,
  ``fspick``, ``mount_setattr``);
* ``clone3`` gets ``ENOSYS``: its flags live in a struct seccomp cannot read, and
  ``ENOSYS`` makes glibc fall back to ``clone``, whose flags we can check;
* keyrings (``keyctl``, ``add_key``, ``request_key``), ``perf_event_open``, ``bpf``,
  ``userfaultfd``, ``io_uring_*``, ``ptrace``, ``process_vm_readv/writev``, kernel modules,
  ``kexec_*``, ``acct``, ``swapon/off``, ``reboot``;
* ``ioctl(fd, TIOCSTI|TIOCLINUX, ...)`` with a *masked 32-bit* compare: the kernel reads the
  command as a 32-bit int, so ``TIOCSTI | (1 << 32)`` must match too (CVE-2019-10063).

Non-native ABIs: the filter contains only the native architecture and its "bad arch" action
kills the process. So i386 (``int 0x80``) and x32 system calls, which use other syscall
numbers and would bypass a per-number blocklist, kill the sandboxed process instead of being
allowed. Tool servers are 64-bit; a 32-bit binary simply cannot run in the sandbox.

Resource handling:
    :func:`write_filter_fd` returns a sealed memfd owned by the caller, who passes it to the
    child (``pass_fds``) and closes it after the spawn. bwrap reads it to EOF.
    :func:`compile_bpf` exports through a temporary memfd it closes itself.

Error handling:
    libseccomp errors surface as ``OSError`` from the binding; a syscall name unknown to the
    installed libseccomp raises :class:`SeccompError` (never silently skipped).
"""

from __future__ import annotations

import errno
import os
import platform
from collections.abc import Iterable
from dataclasses import dataclass

import pyseccomp

from sandbox.memfd import sealed_memfd

# Flags from <linux/sched.h> and ioctls from <asm-generic/ioctls.h>.
CLONE_NEWUSER = 0x10000000
TIOCSTI = 0x5412
TIOCLINUX = 0x541C

BLOCKED_SYSCALLS: tuple[str, ...] = (
    # namespaces and mounts
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    # keyrings are not namespaced: they can leak between sandboxes and the host
    "keyctl",
    "add_key",
    "request_key",
    # large, often-exploited kernel interfaces
    "perf_event_open",
    "bpf",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    # reading or steering other processes
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    # host administration
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
)

ENOSYS_SYSCALLS: tuple[str, ...] = ("clone3",)

BLOCKED_IOCTLS: tuple[int, ...] = (TIOCSTI, TIOCLINUX)


class SeccompError(RuntimeError):
    """The filter could not be built as specified."""


@dataclass(frozen=True)
class FilterPolicy:
    """Which calls the filter blocks; the defaults are the sandbox policy."""

    blocked: tuple[str, ...] = BLOCKED_SYSCALLS
    enosys: tuple[str, ...] = ENOSYS_SYSCALLS
    blocked_ioctls: tuple[int, ...] = BLOCKED_IOCTLS
    block_new_user_ns: bool = True


def _resolve(name: str) -> int:
    number = int(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name))
    if number < 0:
        raise SeccompError(f"libseccomp does not know the syscall {name!r}")
    return number


def _add_rules(filt: pyseccomp.SyscallFilter, policy: FilterPolicy) -> None:
    eperm = pyseccomp.ERRNO(errno.EPERM)
    for name in policy.blocked:
        filt.add_rule(eperm, _resolve(name))
    for name in policy.enosys:
        filt.add_rule(pyseccomp.ERRNO(errno.ENOSYS), _resolve(name))
    for request in policy.blocked_ioctls:
        # MASKED_EQ with 0xFFFFFFFF compares only the low 32 bits, as the kernel does.
        filt.add_rule(
            eperm,
            _resolve("ioctl"),
            pyseccomp.Arg(1, pyseccomp.MASKED_EQ, 0xFFFFFFFF, request),
        )
    if policy.block_new_user_ns:
        for name, arg in (("unshare", 0), ("clone", _clone_flags_arg())):
            filt.add_rule(
                eperm,
                _resolve(name),
                pyseccomp.Arg(arg, pyseccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER),
            )


def _clone_flags_arg() -> int:
    # s390 swaps clone's first two arguments; everywhere else flags are argument 0.
    return 1 if platform.machine().startswith("s390") else 0


def build_filter(policy: FilterPolicy | None = None) -> pyseccomp.SyscallFilter:
    """A libseccomp filter object for ``policy`` (default: the sandbox policy)."""
    policy = policy or FilterPolicy()
    filt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    # Other ABIs would see a different syscall table: kill instead of allowing them.
    filt.set_attr(pyseccomp.Attr.ACT_BADARCH, pyseccomp.KILL_PROCESS)
    _add_rules(filt, policy)
    return filt


def compile_bpf(policy: FilterPolicy | None = None) -> bytes:
    """The filter as a classic BPF program, the format ``bwrap --seccomp`` reads."""
    return _export(build_filter(policy), pfc=False)


def describe(policy: FilterPolicy | None = None) -> str:
    """libseccomp's human-readable pseudo-code of the filter, for docs and debugging."""
    return _export(build_filter(policy), pfc=True).decode()


def _export(filt: pyseccomp.SyscallFilter, *, pfc: bool) -> bytes:
    fd = os.memfd_create("svcg-seccomp-export", os.MFD_CLOEXEC)
    try:
        with open(fd, "wb", closefd=False) as fh:
            (filt.export_pfc if pfc else filt.export_bpf)(fh)
        size = os.lseek(fd, 0, os.SEEK_END)
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


def write_filter_fd(program: bytes) -> int:
    """A sealed memfd holding ``program`` at offset 0 (see :func:`sandbox.memfd.sealed_memfd`)."""
    return sealed_memfd("svcg-seccomp", program)


def blocked_names(policy: FilterPolicy | None = None) -> Iterable[str]:
    """Every syscall name the policy mentions (for reports and tests)."""
    policy = policy or FilterPolicy()
    names = [*policy.blocked, *policy.enosys, "ioctl"]
    if policy.block_new_user_ns:
        names += ["unshare", "clone"]
    return names
