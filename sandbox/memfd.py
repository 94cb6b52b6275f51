"""Sealed in-memory files used to hand data to bwrap by file descriptor.

bwrap reads its seccomp program (``--seccomp FD``) and generated files such as the sandbox's
``/etc/passwd`` (``--ro-bind-data FD DEST``) from file descriptors. A memfd needs no
temporary file on disk (nothing to clean up after a crash, nothing another process could
swap), and sealing it means nothing holding the fd can change the content between here
and bwrap reading it.
"""

from __future__ import annotations

import fcntl
import os


def sealed_memfd(name: str, data: bytes) -> int:
    """A close-on-exec memfd holding ``data`` at offset 0, sealed; the caller closes it.

    Pass it to the child with ``pass_fds``, which clears close-on-exec in the child only.
    """
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.lseek(fd, 0, os.SEEK_SET)
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    except BaseException:
        os.close(fd)
        raise
    return fd
