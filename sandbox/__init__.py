"""bubblewrap sandboxes: pure argv building, seccomp, limits and the process launcher.

Knows nothing of MCP, users or profiles, and never imports :mod:`svcgate`.

* :mod:`sandbox.spec` / :mod:`sandbox.argv`: what to run and the bwrap argv for it (pure);
* :mod:`sandbox.seccomp`: the syscall filter; :mod:`sandbox.limits`: cgroups;
* :mod:`sandbox.launcher`: :func:`open_launcher`, the trio API that owns sandbox processes.
"""

from sandbox.config import LauncherConfig
from sandbox.instance import Sandbox
from sandbox.launcher import Launcher, SandboxStartError, open_launcher
from sandbox.spec import Bind, InvalidSpec, ResourceLimits, SandboxSpec

__all__ = [
    "Bind",
    "InvalidSpec",
    "Launcher",
    "LauncherConfig",
    "ResourceLimits",
    "Sandbox",
    "SandboxSpec",
    "SandboxStartError",
    "open_launcher",
]
