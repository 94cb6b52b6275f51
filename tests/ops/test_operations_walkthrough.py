"""docs/operations.md, followed step by step as root in throw-away namespaces.

The walkthrough itself is ``walkthrough.py`` (its docstring says how the host is kept out of
it); this test prepares what the namespace cannot fetch, because it has no network:

- a wheelhouse of svcgate's dependencies, pinned to the versions of this repository's
  ``.venv`` (``pip wheel`` once, kept in pytest's cache directory);
- two release tarballs of the working tree: ``svcgate-<version>.tar.gz`` as it is, and
  ``svcgate-<next>.tar.gz`` with the version bumped and one extra schema migration, so the
  document's upgrade runs a real migration and its rollback meets a newer database.

Then it runs the walkthrough under ``unshare --mount --net --pid --fork --mount-proc`` and
checks its result: every step passed, and nothing is left, neither processes, network
namespaces nor cgroups (inside the run's own cgroup, which is removed afterwards).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from walkthrough import own_cgroup_dirs

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "operations.md"
WALKTHROUGH_TIMEOUT = 300.0
UPGRADE_TABLE = "ops_walkthrough_upgrade"


def current_version() -> str:
    match = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert match
    return match.group(1)


def next_version(version: str) -> str:
    major, minor, patch = (int(part) for part in version.split("."))
    return f"{major}.{minor}.{patch + 1}"


@pytest.fixture(scope="module")
def wheelhouse(pytestconfig: pytest.Config) -> Path:
    """svcgate's dependencies as wheels, at the versions installed in this ``.venv``."""
    freeze = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    pins = "".join(line + "\n" for line in freeze.splitlines() if "==" in line)
    extras = ("pip", "setuptools>=68", "wheel")
    key = hashlib.sha256(
        (pins + (REPO / "pyproject.toml").read_text() + " ".join(extras)).encode()
    ).hexdigest()
    cache = pytestconfig.cache
    assert cache is not None
    house = cache.mkdir("ops-wheelhouse") / key[:16]
    if (house / ".complete").exists():
        return house
    for stale in house.parent.iterdir():  # wheelhouses of earlier pins
        shutil.rmtree(stale, ignore_errors=True)
    house.mkdir()
    (house / "constraints.txt").write_text(pins)
    built = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(house)),
            *("--constraint", str(house / "constraints.txt"), str(REPO)),
            *extras,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, f"pip wheel failed:\n{built.stdout}\n{built.stderr}"
    for own in house.glob("svcgate-*.whl"):
        own.unlink()  # the document installs svcgate from its source tree
    (house / ".complete").touch()
    return house


def tree_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return sorted(name for name in listed.split("\0") if name and (REPO / name).is_file())


def make_release(directory: Path, version: str, replace: dict[str, str] | None = None) -> Path:
    """A tarball ``svcgate-VERSION.tar.gz`` of the working tree, one top-level directory."""
    top = f"svcgate-{version}"
    path = directory / f"{top}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name in tree_files():
            info = tar.gettarinfo(str(REPO / name), arcname=f"{top}/{name}")
            if replace and name in replace:
                data = replace[name].encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                with (REPO / name).open("rb") as fh:
                    tar.addfile(info, fh)
    return path


def upgraded_sources(old: str, new: str) -> dict[str, str]:
    """The files of the "next release": version bumped, one migration more."""
    pyproject = (
        (REPO / "pyproject.toml").read_text().replace(f'version = "{old}"', f'version = "{new}"', 1)
    )
    init = (
        (REPO / "svcgate/__init__.py")
        .read_text()
        .replace(f'__version__ = "{old}"', f'__version__ = "{new}"', 1)
    )
    migrations = (REPO / "svcgate/migrations.py").read_text() + (
        "\n# Added by the operations walkthrough's upgrade release.\n"
        f'MIGRATIONS = (*MIGRATIONS, "CREATE TABLE {UPGRADE_TABLE} (id INTEGER PRIMARY KEY);")\n'
    )
    assert new in pyproject and new in init
    return {
        "pyproject.toml": pyproject,
        "svcgate/__init__.py": init,
        "svcgate/migrations.py": migrations,
    }


@pytest.fixture
def run_cgroup() -> Iterator[str]:
    """The name of the walkthrough's own cgroup; removed (with anything left) afterwards."""
    name = f"svcgate-ops-walkthrough-{uuid.uuid4().hex[:8]}"
    yield name
    for directory in own_cgroup_dirs(name):
        if not directory.is_dir():
            continue
        for child in sorted(directory.iterdir()):
            if child.is_dir():
                _kill_and_remove(child)
        _kill_and_remove(directory)


def _kill_and_remove(directory: Path) -> None:
    """SIGKILL what is in a cgroup and remove it (a killed task leaves it within moments)."""
    for _ in range(50):
        procs = (directory / "cgroup.procs").read_text().split()
        for pid in procs:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                continue
        try:
            directory.rmdir()
            return
        except OSError:
            time.sleep(0.1)


def test_following_operations_md_installs_serves_restores_upgrades_and_uninstalls_cleanly(
    tmp_path: Path, wheelhouse: Path, run_cgroup: str
) -> None:
    old = current_version()
    new = next_version(old)
    releases = tmp_path / "releases"
    releases.mkdir()
    make_release(releases, old)
    make_release(releases, new, upgraded_sources(old, new))
    work = tmp_path / "work"
    work.mkdir()
    result_path = tmp_path / "result.json"
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "doc": str(DOC),
                "work": str(work),
                "wheelhouse": str(wheelhouse),
                "releases": str(releases),
                "old_version": old,
                "new_version": new,
                "upgrade_table": UPGRADE_TABLE,
                "cgroup_name": run_cgroup,
                "result": str(result_path),
            }
        )
    )
    command = [
        *("unshare", "--mount", "--net", "--pid", "--fork", "--mount-proc", "--kill-child"),
        *(sys.executable, str(Path(__file__).with_name("walkthrough.py")), str(config)),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=WALKTHROUGH_TIMEOUT)
    log = (work / "walkthrough.log").read_text() if (work / "walkthrough.log").exists() else ""
    assert result_path.exists(), f"no result ({proc.returncode}):\n{proc.stderr}\n{log[-20000:]}"
    result = json.loads(result_path.read_text())
    assert result["ok"], f"{result['error']}\n--- log:\n{log[-30000:]}"
    assert proc.returncode == 0, proc.stderr
    steps = [step["step"] for step in result["steps"]]
    assert steps[-1] == "uninstall", steps
    assert result["leftover_processes"] == []
    assert result["leftover_namespaces"] == []
    assert result["leftover_cgroups"] == []
    print("\n".join(f"{s['step']:<18} {s['seconds']:>6.1f}s" for s in result["steps"]))
