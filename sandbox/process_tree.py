"""Signalling and waiting for a sandbox's processes without pid-reuse races.

A sandbox is three layers of processes: the outer bwrap (our child, which keeps running as
a monitor), bwrap's init (pid 1 of the sandbox's pid namespace) and the command with its
descendants. Facts this module relies on:

* SIGKILL to a pid namespace's init makes the kernel kill every process in that namespace,
  however it forked or double-forked, and init's exit completes only once they are gone. So
  killing the init (and then reaping the outer bwrap, which waits for it) removes the whole
  tree; the cgroup kill is a second line of defence.
* The init ignores signals it has no handler for (bwrap's has none for SIGTERM), so a
  graceful stop sends SIGTERM to the namespace's other processes directly.
* Processes are addressed through pidfds: a pidfd refers to one process forever, so a
  signal can never hit an unrelated process that reused the pid.
"""

from __future__ import annotations

import contextlib
import os
import signal

import trio


def pidfd_open(pid: int) -> int | None:
    """A pidfd for ``pid``, or None if the process is already gone."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


def send_signal(pidfd: int, sig: int) -> bool:
    """Signal the process behind ``pidfd``; False if it has already exited."""
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        return False
    return True


def pids_in_pid_namespace(inode: int) -> list[int]:
    """Host pids of the processes whose pid namespace has inode ``inode``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, PermissionError):
            if os.stat(f"/proc/{entry.name}/ns/pid").st_ino == inode:
                found.append(int(entry.name))
    return found


def signal_pid_namespace(inode: int, sig: int, *, exclude: frozenset[int] = frozenset()) -> int:
    """Send ``sig`` to every process in pid namespace ``inode`` except ``exclude``.

    Each pid is re-checked through a pidfd opened *before* the check, so a process that
    exited and whose pid was reused by a process outside the sandbox is never signalled.
    Returns how many processes were signalled.
    """
    count = 0
    for pid in pids_in_pid_namespace(inode):
        if pid in exclude:
            continue
        fd = pidfd_open(pid)
        if fd is None:
            continue
        try:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                if os.stat(f"/proc/{pid}/ns/pid").st_ino == inode and send_signal(fd, sig):
                    count += 1
        finally:
            os.close(fd)
    return count


async def wait_exit(pidfd: int) -> None:
    """Return once the process behind ``pidfd`` has exited (it becomes readable)."""
    await trio.lowlevel.wait_readable(pidfd)


def close_pidfd(pidfd: int | None) -> None:
    """Close a pidfd that a trio task may be waiting on."""
    if pidfd is None:
        return
    trio.lowlevel.notify_closing(pidfd)
    os.close(pidfd)
