"""On-disk records of live sandboxes, and cleanup of what a crashed launcher left behind.

Each sandbox gets ``STATE/sandboxes/NAME.json`` *before* any of its resources exist (owner
process, owned namespace, cgroup, scratch dir). If the gateway is killed, bwrap's
``--die-with-parent`` kills the processes, but the namespace mount, the cgroup directories
and the scratch directory stay; :func:`cleanup_leftovers` removes them on the next start.
A record whose owner process is still alive (another gateway instance, a concurrent test
run using the same state directory) is left alone.

Resource handling:
    Cleanup kills any process still in a leftover cgroup before removing it, waiting a
    bounded time for the kernel to finish the kills.

Error handling:
    Unreadable records are treated as leftovers of a crashed run. A failure to remove one
    item is logged and does not stop the others.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import netns
from netns.core import process_start_ticks
from sandbox.limits import CgroupManager

logger = logging.getLogger("sandbox.state")

# Removing a cgroup right after SIGKILL can race the tasks' exit; the kernel gives no
# cheap notification on v1, so poll for a bounded time.
_CGROUP_REMOVE_ATTEMPTS = 200
_CGROUP_REMOVE_PAUSE = 0.01


@dataclass(frozen=True)
class SandboxRecord:
    """What a launcher created for one sandbox."""

    name: str
    label: str
    owner_pid: int
    owner_start_ticks: int | None
    created_at: float
    owned_netns: str | None
    cgroup: bool
    scratch: str | None

    def owner_alive(self) -> bool:
        ticks = process_start_ticks(self.owner_pid)
        return ticks is not None and ticks == self.owner_start_ticks


def records_dir(state_dir: Path) -> Path:
    return state_dir / "sandboxes"


def netns_state_dir(state_dir: Path) -> Path:
    return state_dir / "netns"


def scratch_root(state_dir: Path) -> Path:
    return state_dir / "scratch"


def write_record(state_dir: Path, record: SandboxRecord) -> None:
    directory = records_dir(state_dir)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = directory / f"{record.name}.json.tmp"
    tmp.write_text(json.dumps(asdict(record), sort_keys=True), encoding="utf-8")
    os.replace(tmp, directory / f"{record.name}.json")


def remove_record(state_dir: Path, name: str) -> None:
    (records_dir(state_dir) / f"{name}.json").unlink(missing_ok=True)


def read_records(state_dir: Path, prefix: str) -> tuple[list[SandboxRecord], list[str]]:
    """(readable records, names of unreadable record files) for names with ``prefix``."""
    records, broken = [], []
    directory = records_dir(state_dir)
    if not directory.is_dir():
        return [], []
    for path in sorted(directory.glob(f"{prefix}*.json")):
        name = path.name[: -len(".json")]
        try:
            records.append(SandboxRecord(**json.loads(path.read_text("utf-8"))))
        except (OSError, ValueError, TypeError):
            broken.append(name)
    return records, broken


def kill_and_remove_cgroup(cgroups: CgroupManager, name: str) -> bool:
    """SIGKILL everything in cgroup ``name`` and delete it; False if it would not go."""
    cgroup = cgroups.open(name)
    for _ in range(_CGROUP_REMOVE_ATTEMPTS):
        cgroup.kill()
        if cgroup.remove():
            return True
        time.sleep(_CGROUP_REMOVE_PAUSE)
    return False


def cleanup_leftovers(state_dir: Path, prefix: str, cgroups: CgroupManager | None) -> list[str]:
    """Remove resources of sandboxes named ``prefix...`` whose launcher is gone.

    Returns the names of the sandboxes cleaned up.
    """
    records, broken = read_records(state_dir, prefix)
    live = {r.name for r in records if r.owner_alive()}
    cleaned: list[str] = []
    for record in records:
        if record.name in live:
            continue
        _remove_resources(state_dir, record.name, record.owned_netns, record.scratch, cgroups)
        cleaned.append(record.name)
    for name in broken:
        _remove_resources(state_dir, name, name, None, cgroups)
        cleaned.append(name)
    # Anything with our prefix but no record at all: records are written first, so these
    # can only come from a crashed run.
    if cgroups is not None:
        for name in cgroups.find(prefix):
            if name not in live and not kill_and_remove_cgroup(cgroups, name):
                logger.warning("leftover cgroup %s could not be removed", name)
    root = scratch_root(state_dir)
    if root.is_dir():
        for path in root.iterdir():
            if path.name.startswith(prefix) and path.name not in live:
                shutil.rmtree(path, ignore_errors=True)
    netns.cleanup_leftovers(prefix, netns_state_dir(state_dir))
    return cleaned


def _remove_resources(
    state_dir: Path,
    name: str,
    owned_netns: str | None,
    scratch: str | None,
    cgroups: CgroupManager | None,
) -> None:
    if cgroups is not None and not kill_and_remove_cgroup(cgroups, name):
        logger.warning("leftover cgroup %s could not be removed", name)
    if owned_netns is not None:
        try:
            netns.remove_namespace(owned_netns, state_dir=netns_state_dir(state_dir))
        except netns.NetnsError:
            logger.warning("leftover namespace %s could not be removed", owned_netns, exc_info=True)
    # Only ever delete inside our own scratch root, whatever a record file says.
    if scratch is not None and Path(scratch).parent == scratch_root(state_dir):
        shutil.rmtree(scratch, ignore_errors=True)
    remove_record(state_dir, name)
    logger.info("removed leftovers of sandbox %s", name)
