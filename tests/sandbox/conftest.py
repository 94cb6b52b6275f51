"""Fixtures for the sandbox tests: real bwrap, real namespaces and cgroups (root only).

Every launcher fixture checks on teardown that nothing with the test's prefix is left: no
namespace, cgroup, scratch dir, state record or sandbox process.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
# tests/sandbox/ has no __init__.py and pytest (prepend mode) puts tests/ on sys.path, where
# this directory would shadow the real `sandbox` package as a namespace package. A regular
# package anywhere on sys.path wins over namespace portions, so make sure the repository
# root is there; and make our helper module importable under --import-mode=importlib too.
for _path in (str(HERE.parents[1]), str(HERE)):
    if _path not in sys.path:
        sys.path.append(_path)
if "sandbox" in sys.modules and getattr(sys.modules["sandbox"], "__file__", None) is None:
    del sys.modules["sandbox"]  # a namespace package imported before the fix above

from process_support import public_tmpdir  # noqa: E402
from sandbox_helpers import PROBE_PYTHON, leftovers  # noqa: E402

from sandbox import Bind, LauncherConfig, SandboxSpec, open_launcher  # noqa: E402
from sandbox.launcher import Launcher  # noqa: E402
from sandbox.spec import ResourceLimits  # noqa: E402

if os.geteuid() != 0:  # pragma: no cover - CI and dev machines run these as root
    pytest.skip("sandbox tests need root (namespaces, cgroups)", allow_module_level=True)


@pytest.fixture(scope="session")
def probe_dir() -> Iterator[Path]:
    path = public_tmpdir("probe")
    shutil.copy(HERE / "sandbox_probe.py", path / "probe.py")
    (path / "probe.py").chmod(0o644)
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = public_tmpdir("state")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def prefix() -> str:
    # Unique per test: leftover checks and cleanup never touch another test's objects.
    return f"svct{secrets.token_hex(3)}-"


@pytest.fixture
def marker() -> str:
    """A string placed in the probe's argv to find its processes from the host."""
    return f"svcg-marker-{secrets.token_hex(4)}"


@pytest.fixture
async def launcher(state_dir: Path, prefix: str, marker: str) -> AsyncIterator[Launcher]:
    async with open_launcher(LauncherConfig(state_dir=state_dir, prefix=prefix)) as launcher:
        yield launcher
    assert leftovers(state_dir, prefix, marker) == {}


@pytest.fixture
def probe_spec(probe_dir: Path, marker: str) -> Callable[..., SandboxSpec]:
    def make(**overrides: Any) -> SandboxSpec:
        fields: dict[str, Any] = {
            "command": (PROBE_PYTHON, "/probe/probe.py", marker),
            "label": "probe",
            "binds": (Bind(str(probe_dir), "/probe"),),
            "limits": ResourceLimits(memory_bytes=256 << 20, pids=64, cpus=1.0),
        }
        fields.update(overrides)
        return SandboxSpec(**fields)

    return make
