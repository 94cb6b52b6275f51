"""Resource exhaustion inside one sandbox stays inside it (threat catalogue D4).

A fork bomb and a memory balloon run in one sandbox while a second sandbox keeps answering.
The cgroup limits the launcher wrote are checked against the kernel's files.
"""

from __future__ import annotations

import errno
from collections.abc import Callable

import trio
from sandbox_helpers import Probe

from sandbox.launcher import Launcher
from sandbox.spec import SANDBOX_TMP, ResourceLimits, SandboxSpec


async def test_cgroup_limits_are_written(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    limits = ResourceLimits(memory_bytes=96 << 20, pids=40, cpus=0.5)
    async with launcher.sandbox(probe_spec(limits=limits)) as sb:
        assert sb.cgroup is not None
        files = {}
        for d in sb.cgroup.dirs:
            for name in ("memory.max", "memory.limit_in_bytes", "pids.max", "cpu.max",
                         "cpu.cfs_quota_us", "cpu.cfs_period_us", "memory.oom.group"):  # fmt: skip
                if (d / name).exists():
                    files[name] = (await trio.Path(d / name).read_text()).strip()
        # Both bwrap processes were moved in before the command ran.
        assert {sb.pid, sb.child_pid} <= sb.cgroup.pids()
    if sb.cgroup.mode == "v2":
        assert files["memory.max"] == str(96 << 20)
        assert files["cpu.max"] == "50000 100000"
        assert files["memory.oom.group"] == "1"
    else:
        assert files["memory.limit_in_bytes"] == str(96 << 20)
        assert (files["cpu.cfs_quota_us"], files["cpu.cfs_period_us"]) == ("50000", "100000")
    assert files["pids.max"] == "40"


async def test_fork_bomb_is_contained_while_another_sandbox_answers(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    bomb_limits = ResourceLimits(memory_bytes=256 << 20, pids=48, cpus=0.5)
    async with (
        launcher.sandbox(probe_spec(limits=bomb_limits, label="bomb")) as bomb,
        launcher.sandbox(probe_spec(label="bystander")) as bystander,
    ):
        other = Probe(bystander)
        assert (await other.call("ping"))["ok"]
        reply = await Probe(bomb).call("forkbomb", within=30)
        assert reply["errno"] == errno.EAGAIN
        assert bomb.cgroup is not None
        assert len(bomb.cgroup.pids()) <= 48
        # The rest of the host still works while the bomb's processes sit at the limit.
        for _ in range(5):
            assert (await other.call("ping", within=5))["ok"]
        pids = bomb.host_pids()
        assert len(pids) > 10
        with trio.fail_after(10):
            await bomb.stop(grace=0.5)
        assert not bomb.cgroup.exists()
        assert (await other.call("ping", within=5))["ok"]


async def test_memory_balloon_is_contained_while_another_sandbox_answers(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    balloon_limits = ResourceLimits(memory_bytes=96 << 20, pids=16, cpus=1.0)
    async with (
        launcher.sandbox(probe_spec(limits=balloon_limits, label="balloon")) as balloon,
        launcher.sandbox(probe_spec(label="bystander")) as bystander,
    ):
        other = Probe(bystander)
        assert (await other.call("ping"))["ok"]
        assert balloon.cgroup is not None
        try:
            reply = await Probe(balloon).call("balloon", within=30, chunk_mb=8, max_mb=1024)
        except EOFError:
            # cgroup v2 with memory.oom.group=1 kills the whole sandbox at once.
            with trio.fail_after(10):
                await balloon.wait()
        else:
            # cgroup v1 has no oom.group: the kernel kills the largest task (the balloon).
            assert reply == {"ok": True, "signal": 9, "elapsed": reply["elapsed"]}
        assert balloon.cgroup.oom_kills() >= 1
        assert (await other.call("ping", within=5))["ok"]


async def test_tmpfs_size_and_open_files_are_bounded(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    spec = probe_spec(tmp_size=8 << 20, home_size=4 << 20)
    async with launcher.sandbox(spec) as sb:
        probe = Probe(sb)
        tmp = await probe.call("fill", path=f"{SANDBOX_TMP}/big", within=30)
        assert (tmp["errno"], tmp["written"]) == (errno.ENOSPC, 8 << 20)
        home = await probe.call("fill", path="/home/sandbox/big", within=30)
        assert (home["errno"], home["written"]) == (errno.ENOSPC, 4 << 20)
        files = await probe.call("open_files")
        assert files["errno"] == errno.EMFILE
        assert files["opened"] < spec.limits.nofile
