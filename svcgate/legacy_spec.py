"""The sandbox spec of the legacy fallback: a server without a manifest runs ``SVC_ECHO_BIN``.

Pure (no I/O). The program runs in a host-mode sandbox (read-only host ``/usr`` and the
usr-merge links, no network but loopback) like any other server. ``SVC_ECHO_BIN`` normally
lives outside ``/usr`` (the repository's ``svcgate/examples/echo_server.py``), so the file
alone is bound read-only at ``/opt/server/<server>/<file name>``. A ``.py`` file is run with
Debian's ``/usr/bin/python3`` (the sandbox sees the host's ``/usr``, not the gateway's
virtualenv); anything else is executed directly.

The bind source is resolved by bwrap as the sandbox's unprivileged host uid: the file and
every directory above it must be readable/searchable by that uid, or the spawn fails with
bwrap's "Can't find source path".
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from sandbox import Bind, SandboxSpec
from svcgate.supervisor import SandboxKey, SandboxOwner, SpecFactory

SERVER_ROOT = "/opt/server"
SANDBOX_PYTHON = "/usr/bin/python3"
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/home/sandbox",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
}


def legacy_server_spec(echo_bin: Path, key: SandboxKey, owner: SandboxOwner) -> SandboxSpec:
    """The spec that runs ``echo_bin`` as server ``key.server`` of ``owner``'s profile."""
    source = posixpath.normpath(str(echo_bin))
    dest = f"{SERVER_ROOT}/{key.server}/{posixpath.basename(source)}"
    command = (SANDBOX_PYTHON, dest) if source.endswith(".py") else (dest,)
    return SandboxSpec(
        command=command,
        label=f"{owner.profile_slug}/{key.server}",
        env=SANDBOX_ENV,
        binds=(Bind(source, dest),),
    )


def legacy_spec_factory(echo_bin: Path, key: SandboxKey, owner: SandboxOwner) -> SpecFactory:
    """A :data:`~svcgate.supervisor.SpecFactory` for :meth:`SandboxSupervisor.ensure`."""

    async def factory() -> SandboxSpec:
        return legacy_server_spec(echo_bin, key, owner)

    return factory
