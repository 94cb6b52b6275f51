"""Process and directory helpers shared by the sandbox and supervisor tests.

Lives at the tests root (on sys.path through the root conftest) so both suites import one
copy.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import trio

from sandbox.process_tree import pidfd_open, wait_exit


def public_tmpdir(tag: str) -> Path:
    """A fresh directory the sandbox host uid can traverse.

    bwrap runs as the unprivileged sandbox host uid: bind sources and the state dir must be
    reachable by it, which pytest's 0700 tmp_path is not.
    """
    path = Path(tempfile.mkdtemp(prefix=f"svcg-{tag}-", dir="/tmp"))
    path.chmod(0o711)
    return path


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry))
    return found


async def wait_all_gone(pids: list[int], within: float) -> None:
    """Wait (bounded, through pidfds) until every process in ``pids`` has exited."""
    fds = [fd for fd in (pidfd_open(pid) for pid in pids) if fd is not None]
    try:
        with trio.fail_after(within):
            for fd in fds:
                await wait_exit(fd)
    finally:
        for fd in fds:
            trio.lowlevel.notify_closing(fd)
            os.close(fd)
