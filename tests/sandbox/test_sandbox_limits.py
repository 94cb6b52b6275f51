"""Cgroup detection and cgroup handling, on the real hierarchy and on v1/v2 layouts.

The machine CI runs on is a cgroup v1 (hybrid) host, so v2 is exercised two ways: the
detection and file writes against a directory laid out like cgroupfs (a fake with the same
file interface), and for real when the suite runs on a pure v2 host.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
from pathlib import Path

import pytest

from sandbox.limits import CgroupError, CgroupManager, detect_cgroups
from sandbox.spec import ResourceLimits

V1_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V1_CGROUP = "8:pids:/\n4:memory:/gw/abc\n1:cpu,cpuacct:/\n0::/\n"


def fake_proc(tmp_path: Path, mountinfo: str, cgroup: str) -> Path:
    (tmp_path / "self").mkdir(parents=True)
    (tmp_path / "self/mountinfo").write_text(mountinfo)
    (tmp_path / "self/cgroup").write_text(cgroup)
    return tmp_path


def test_hybrid_host_uses_v1_controllers(tmp_path: Path) -> None:
    host = detect_cgroups(fake_proc(tmp_path, V1_MOUNTINFO, V1_CGROUP))
    assert host.mode == "v1"
    assert {c: (str(m), own) for c, m, own in host.v1} == {
        "memory": ("/sys/fs/cgroup/memory", "/gw/abc"),
        "pids": ("/sys/fs/cgroup/pids", "/"),
        "cpu": ("/sys/fs/cgroup/cpu,cpuacct", "/"),
    }
    manager = CgroupManager(host)
    assert [str(p) for _, p in manager.parents] == [
        "/sys/fs/cgroup/memory/gw/abc",
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/cpu,cpuacct",
    ]


def test_pure_v2_host_with_controllers_uses_v2(tmp_path: Path) -> None:
    root = tmp_path / "cgroupfs"
    (root / "svc/gateway").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    mountinfo = f"40 23 0:38 / {root} rw - cgroup2 cgroup2 rw,nsdelegate\n"
    proc = fake_proc(tmp_path / "proc", mountinfo, "0::/svc/gateway\n")
    host = detect_cgroups(proc)
    assert (host.mode, host.v2_mount, host.v2_own) == ("v2", root, "/svc/gateway")


def test_container_mount_root_is_stripped(tmp_path: Path) -> None:
    root = tmp_path / "cgroupfs"
    root.mkdir()
    (root / "cgroup.controllers").write_text("memory pids\n")
    mountinfo = f"40 23 0:38 /docker/abc {root} rw - cgroup2 cgroup2 rw\n"
    host = detect_cgroups(fake_proc(tmp_path / "proc", mountinfo, "0::/docker/abc/app\n"))
    assert host.v2_own == "/app"


def test_no_controllers_means_no_cgroups(tmp_path: Path) -> None:
    mountinfo = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    host = detect_cgroups(fake_proc(tmp_path, mountinfo, "0::/\n"))
    assert host.mode == "none"
    with pytest.raises(CgroupError):
        CgroupManager(host).create("svcg-x", ResourceLimits())


def test_v2_writes_limits_enables_controllers_and_kills(tmp_path: Path) -> None:
    # A directory laid out like cgroupfs: the manager only reads and writes files.
    root = tmp_path / "cgroupfs"
    parent = root / "svcgate/sandboxes"
    parent.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    (parent / "cgroup.controllers").write_text("cpu io memory pids\n")
    (parent / "cgroup.subtree_control").write_text("memory\n")
    mountinfo = f"40 23 0:38 / {root} rw - cgroup2 cgroup2 rw\n"
    host = detect_cgroups(fake_proc(tmp_path / "proc", mountinfo, "0::/svcgate/gateway\n"))
    manager = CgroupManager(host, parent="/svcgate/sandboxes")
    cgroup = manager.create("svcg-1", ResourceLimits(memory_bytes=1 << 26, pids=10, cpus=0.25))
    d = parent / "svcg-1"
    assert (parent / "cgroup.subtree_control").read_text() == "+pids +cpu"
    assert (d / "memory.max").read_text() == str(1 << 26)
    assert (d / "memory.oom.group").read_text() == "1"
    assert (d / "pids.max").read_text() == "10"
    assert (d / "cpu.max").read_text() == "25000 100000"
    cgroup.attach(1234)
    assert (d / "cgroup.procs").read_text() == "1234"
    (d / "cgroup.kill").write_text("")
    cgroup.kill()
    assert (d / "cgroup.kill").read_text() == "1"
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert cgroup.oom_kills() == 1
    assert manager.find("svcg-") == ["svcg-1"]
    assert manager.find("") == []


def test_v2_refusal_to_enable_controllers_is_explained(tmp_path: Path) -> None:
    root = tmp_path / "cgroupfs"
    root.mkdir()
    (root / "cgroup.controllers").write_text("memory pids\n")
    # Readable, but writing fails (EIO) like an EBUSY from the kernel would.
    (root / "cgroup.subtree_control").symlink_to("/proc/version")
    mountinfo = f"40 23 0:38 / {root} rw - cgroup2 cgroup2 rw\n"
    manager = CgroupManager(detect_cgroups(fake_proc(tmp_path / "proc", mountinfo, "0::/\n")))
    with pytest.raises(CgroupError, match="delegated cgroup"):
        manager.create("svcg-1", ResourceLimits())


@pytest.mark.skipif(os.geteuid() != 0, reason="creating cgroups needs root")
def test_real_cgroup_holds_processes_until_killed_and_is_removed() -> None:
    host = detect_cgroups()
    if host.mode == "none":  # pragma: no cover - CI hosts have v1 or v2 controllers
        pytest.skip("host has no usable cgroup hierarchy")
    manager = CgroupManager(host)
    name = f"svct{secrets.token_hex(3)}-real"
    cgroup = manager.create(name, ResourceLimits(memory_bytes=64 << 20, pids=5, cpus=0.5))
    proc = subprocess.Popen(["/bin/sleep", "300"])
    try:
        cgroup.attach(proc.pid)
        assert cgroup.pids() == {proc.pid}
        assert manager.find(name) == [name]
        assert not cgroup.remove()  # busy while a process is inside
        cgroup.kill()
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert cgroup.remove()
        assert not cgroup.exists()
        assert manager.find(name) == []
    finally:
        proc.kill()
        proc.wait()
        cgroup.kill()
        cgroup.remove()
