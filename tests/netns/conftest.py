"""Fixtures for the netns tests: real network namespaces (root only)."""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyroute2 import netns as pr_netns

# tests/netns/ has no __init__.py and pytest (prepend mode) puts tests/ on sys.path, where
# this directory would shadow the real `netns` package as a namespace package. A regular
# package anywhere on sys.path wins over namespace portions, so make sure the repository
# root is there.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)
if "netns" in sys.modules and getattr(sys.modules["netns"], "__file__", None) is None:
    del sys.modules["netns"]  # a namespace package imported before the fix above

if os.geteuid() != 0:  # pragma: no cover - CI and dev machines run these as root
    pytest.skip("network namespace tests need root", allow_module_level=True)


@pytest.fixture
def prefix() -> str:
    # Unique per test, so cleanup-by-prefix can never touch another test's namespaces.
    return f"svcn{secrets.token_hex(3)}-"


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="svcg-netns-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_leftover_namespaces(prefix: str) -> Iterator[None]:
    yield
    leftover = sorted(p.name for p in Path("/var/run/netns").glob(f"{prefix}*"))
    for name in leftover:  # clean up so one failure does not cascade, then fail loudly
        pr_netns.remove(name)
    assert leftover == []
