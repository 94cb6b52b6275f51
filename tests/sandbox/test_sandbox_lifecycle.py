"""Sandbox lifetime: stop, exit, failures, cancellation, idling and the parent's death.

Threat catalogue D5 (orphans and leaks). Process disappearance is awaited through pidfds
(readable when the process exits), never by sleeping and polling.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from process_support import wait_all_gone
from sandbox_helpers import Probe, leftovers

from netns import namespace_path
from sandbox import LauncherConfig, SandboxSpec, open_launcher
from sandbox.launcher import Launcher, SandboxStartError
from sandbox.process_tree import pidfd_open, wait_exit
from sandbox.spec import Bind

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


async def test_stop_leaves_no_process_namespace_cgroup_or_scratch(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    sb = await launcher.start(probe_spec(scratch="/scratch"))
    probe = Probe(sb)
    daemon = await probe.call("daemon")  # a double-forked, setsid'd grandchild
    assert daemon["ok"]
    pids = sb.host_pids()
    assert len(pids) >= 4  # bwrap monitor, bwrap init, probe, daemon
    cgroup_dirs = list(sb.cgroup.dirs) if sb.cgroup else []
    assert cgroup_dirs and all(d.is_dir() for d in cgroup_dirs)
    assert sb.scratch_dir is not None and sb.scratch_dir.is_dir()
    assert namespace_path(sb.netns_name).exists()

    with trio.fail_after(10):
        await sb.stop(grace=1.0)
    await wait_all_gone(pids, within=1)
    assert not any(d.exists() for d in cgroup_dirs)
    assert not sb.scratch_dir.exists()
    assert not namespace_path(sb.netns_name).exists()
    assert launcher.sandboxes == []


async def test_stop_is_graceful_first(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    sb = await launcher.start(probe_spec())
    assert (await Probe(sb).call("trap_term"))["ok"]
    with trio.fail_after(10):
        assert await sb.stop(grace=5.0) == 0
    assert "probe: got SIGTERM, exiting cleanly" in sb.stderr_tail()


async def test_stop_kills_after_the_grace_period(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    sb = await launcher.start(probe_spec())
    assert (await Probe(sb).call("ignore_term"))["ok"]
    pids = sb.host_pids()
    with trio.fail_after(10):
        returncode = await sb.stop(grace=0.2)
    assert returncode != 0
    await wait_all_gone(pids, within=1)


async def test_sandbox_that_exits_reports_status_and_is_cleaned_up(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec], state_dir: Path, prefix: str
) -> None:
    spec = probe_spec(
        command=("/usr/bin/python3", "-c", "import sys; print('bye', file=sys.stderr); exit(3)")
    )
    sb = await launcher.start(spec)
    with trio.fail_after(10):
        assert await sb.wait() == 3
        await sb.stop()
    assert sb.stderr_tail() == ["bye"]
    assert leftovers(state_dir, prefix) == {}


async def test_bwrap_setup_failure_is_reported_with_its_stderr(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    spec = probe_spec(binds=(Bind("/nonexistent/svcg-missing", "/data"),))
    # bwrap builds the mount tree before it blocks, so the failure is normally seen during
    # start(); if bwrap was slower than our setup, the sandbox exits right after start.
    # Both outcomes must carry bwrap's message.
    try:
        with trio.fail_after(10):
            sb = await launcher.start(spec)
            assert await sb.wait() != 0
            await sb.stop()
        stderr = sb.stderr_tail()
    except SandboxStartError as exc:
        stderr = exc.stderr
    assert any("Can't find source path" in line for line in stderr), stderr


async def test_caller_owned_namespace_is_joined_and_kept(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec], prefix: str
) -> None:
    name = f"{prefix}caller"
    await launcher.netns.create(name)
    try:
        async with launcher.sandbox(probe_spec(netns=name)) as sb:
            assert sb.netns_name == name
            assert (
                os.stat(f"/proc/{sb.child_pid}/ns/net").st_ino == namespace_path(name).stat().st_ino
            )
        assert namespace_path(name).exists()
    finally:
        await launcher.netns.remove(name)


async def test_run_in_the_callers_nursery(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    async with trio.open_nursery() as nursery:
        sb = await nursery.start(launcher.run, probe_spec())
        assert (await Probe(sb).call("ping"))["ok"]
        nursery.cancel_scope.cancel()  # cancelling the owner task stops the sandbox
    assert sb.returncode is not None


async def test_cancel_mid_spawn_leaves_nothing_behind(
    launcher: Launcher,
    probe_spec: Callable[..., SandboxSpec],
    state_dir: Path,
    prefix: str,
    marker: str,
) -> None:
    # Cancel start() after growing delays, so cancellation lands at every await of the
    # start sequence (record, netns, scratch, spawn, info read) until one start completes.
    spec = probe_spec(scratch="/scratch")
    cancelled = 0
    for step in range(200):
        with trio.move_on_after(step * 0.001) as scope:
            sb = await launcher.start(spec)
        if not scope.cancelled_caught:
            await sb.stop()
            break
        cancelled += 1
        assert leftovers(state_dir, prefix, marker) == {}, f"after cancel at {step} ms"
    else:
        pytest.fail("start never completed within 200 ms")
    assert cancelled > 0


async def test_cancel_mid_run_leaves_nothing_behind(
    launcher: Launcher,
    probe_spec: Callable[..., SandboxSpec],
    state_dir: Path,
    prefix: str,
    marker: str,
) -> None:
    with trio.CancelScope() as scope:
        async with launcher.sandbox(probe_spec(scratch="/scratch")) as sb:
            assert (await Probe(sb).call("daemon"))["ok"]
            pids = sb.host_pids()
            scope.cancel()
            await trio.sleep_forever()
    await wait_all_gone(pids, within=1)
    assert leftovers(state_dir, prefix, marker) == {}


async def test_closing_the_launcher_stops_every_sandbox(
    probe_spec: Callable[..., SandboxSpec], state_dir: Path, prefix: str, marker: str
) -> None:
    async with open_launcher(LauncherConfig(state_dir=state_dir, prefix=prefix)) as launcher:
        sandboxes = [await launcher.start(probe_spec(scratch="/scratch")) for _ in range(3)]
        pids = [pid for sb in sandboxes for pid in sb.host_pids()]
    await wait_all_gone(pids, within=1)
    assert leftovers(state_dir, prefix, marker) == {}


@pytest.mark.slow
async def test_sandbox_survives_35_seconds_idle(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    # trio's worker threads retire after ~10 s idle; a sandbox forked from one would die
    # then (PDEATHSIG). The idle time is the point of the test, not synchronisation.
    async with launcher.sandbox(probe_spec()) as sb:
        probe = Probe(sb)
        assert (await probe.call("ping"))["ok"]
        await trio.sleep(35)
        assert (await probe.call("ping"))["ok"]
        assert sb.returncode is None


async def test_sandbox_dies_with_its_parent_and_leftovers_are_cleaned(
    probe_dir: Path, state_dir: Path, prefix: str, marker: str
) -> None:
    helper = await trio.lowlevel.open_process(
        [sys.executable, str(HERE / "sandbox_parent_helper.py"), str(state_dir), prefix,
         str(probe_dir), marker],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        assert helper.stdout is not None
        line = b""
        with trio.fail_after(20):
            while not line.endswith(b"\n"):
                chunk = await helper.stdout.receive_some(65536)
                assert chunk, "helper exited before reporting"
                line += chunk
        report = json.loads(line)
        assert len(report["pids"]) >= 4
        pidfds = [fd for fd in (pidfd_open(p) for p in report["pids"]) if fd is not None]
        helper.send_signal(signal.SIGKILL)
        try:
            with trio.fail_after(5):
                for fd in pidfds:
                    await wait_exit(fd)
        finally:
            for fd in pidfds:
                trio.lowlevel.notify_closing(fd)
                os.close(fd)
    finally:
        helper.kill()
        with trio.CancelScope(shield=True):
            await helper.wait()
        if helper.stdout is not None:
            await helper.stdout.aclose()
    # The processes died with the parent; its namespace, cgroup and scratch dir remain
    # until a launcher with the same prefix cleans up after the crash.
    assert namespace_path(report["netns"]).exists()
    assert await trio.Path(report["scratch"]).exists()
    async with open_launcher(LauncherConfig(state_dir=state_dir, prefix=prefix)) as launcher:
        assert await launcher.cleanup_leftovers() == [report["name"]]
    assert leftovers(state_dir, prefix, marker) == {}
