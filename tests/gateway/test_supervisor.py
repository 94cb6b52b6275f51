"""The sandbox supervisor with real bwrap and real namespaces: spawning, coalescing,
failures, stopping, and cancellation that leaves nothing behind (threat catalogue D5)."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from process_support import public_tmpdir, wait_all_gone
from supervisor_helpers import (
    StdioClient,
    copy_echo_server,
    ensure_echo,
    leftovers,
    owner_of,
    running_supervisor,
    unique_server,
)

import netns
from netns import namespace_path
from sandbox import SandboxSpec, state
from svcgate.legacy_spec import legacy_server_spec
from svcgate.supervisor import (
    SandboxHandle,
    SandboxKey,
    SandboxNotFound,
    SandboxSpawnError,
    SandboxSupervisor,
    SupervisorClosed,
    SupervisorConfig,
    SupervisorStartError,
    launcher_prefix,
)

if os.geteuid() != 0:  # pragma: no cover - CI and dev machines run these as root
    pytest.skip("sandbox supervisor tests need root (namespaces, cgroups)", allow_module_level=True)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = public_tmpdir("sup-state")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def echo_bin() -> Iterator[Path]:
    directory = public_tmpdir("sup-echo")
    yield copy_echo_server(directory)
    shutil.rmtree(directory)


async def test_echo_server_runs_in_a_sandbox_and_answers_mcp(
    state_dir: Path, echo_bin: Path
) -> None:
    server = unique_server()
    async with running_supervisor(state_dir) as supervisor:
        handle = await ensure_echo(supervisor, echo_bin, 1, server)
        client = StdioClient(handle)
        init = await client.initialize()
        assert init["result"]["serverInfo"]["name"] == "echo"
        assert init["result"]["protocolVersion"] == "2025-06-18"
        tools = await client.request("tools/list", {})
        assert {t["name"] for t in tools["result"]["tools"]} == {"echo", "add", "fetch"}
        assert await client.echo("hello from the sandbox") == "hello from the sandbox"

        [info] = await supervisor.list()
        assert (info.profile_id, info.profile_slug, info.server) == (1, "profile-1", server)
        assert (info.tenant, info.owner_user_id, info.state) == (1, 101, "running")
        assert info.pid == handle.pid and info.init_pid is not None
        assert info.namespace == handle.namespace and namespace_path(info.namespace).exists()
        assert info.egress_listener is None and info.egress_connections == 0
        assert info.started_at is not None and info.exit_code is None
        # The server runs as the unprivileged sandbox uid inside the sandbox's namespace.
        assert os.stat(f"/proc/{info.init_pid}").st_uid == 65534
        netns_inode = os.stat(f"/proc/{info.init_pid}/ns/net").st_ino
        assert netns_inode == namespace_path(info.namespace).stat().st_ino

        with trio.fail_after(15):
            assert await supervisor.stop(SandboxKey(1, server)) is True
        assert await supervisor.list() == []
        assert not namespace_path(info.namespace).exists()
        assert await supervisor.stop(SandboxKey(1, server)) is False
    assert leftovers(state_dir, (server,)) == {}


async def test_concurrent_ensure_for_one_key_spawns_exactly_one_sandbox(
    state_dir: Path, echo_bin: Path
) -> None:
    server = unique_server()
    key, owner = SandboxKey(7, server), owner_of(7)
    calls = 0

    async def factory() -> SandboxSpec:
        nonlocal calls
        calls += 1
        return legacy_server_spec(echo_bin, key, owner)

    handles: list[SandboxHandle] = []

    async def caller() -> None:
        handles.append(await supervisor.ensure(key, factory, owner=owner))

    async with running_supervisor(state_dir) as supervisor:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(caller)
        assert calls == 1
        assert len(handles) == 20 and all(h is handles[0] for h in handles)
        assert len(await supervisor.list()) == 1
        assert await StdioClient(handles[0]).echo("once") == "once"
        # bwrap's monitor, its init, the server: one sandbox's worth of processes.
        assert len(handles[0].host_pids()) == 3
        # A later call gets the same running sandbox without spawning.
        assert await supervisor.ensure(key, factory, owner=owner) is handles[0]
        assert calls == 1
    assert leftovers(state_dir, (server,)) == {}


async def test_a_failed_spawn_is_reported_to_every_waiter_and_not_cached(
    state_dir: Path, echo_bin: Path
) -> None:
    server = unique_server()
    key, owner = SandboxKey(3, server), owner_of(3)
    attempts = 0

    async def flaky_factory() -> SandboxSpec:
        nonlocal attempts
        attempts += 1
        spec = legacy_server_spec(echo_bin, key, owner)
        if attempts == 1:
            # A namespace that does not exist: the launcher refuses before spawning.
            return dataclasses.replace(spec, netns="svcg-test-no-such-namespace")
        return spec

    errors: list[BaseException] = []

    async def caller() -> None:
        try:
            await supervisor.ensure(key, flaky_factory, owner=owner)
        except SandboxSpawnError as exc:
            errors.append(exc)

    async with running_supervisor(state_dir) as supervisor:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(caller)
        assert attempts == 1 and len(errors) == 5
        assert "does not exist" in str(errors[0])
        assert await supervisor.list() == []

        handle = await ensure_echo(supervisor, echo_bin, 3, server)  # not cached: retried
        assert await StdioClient(handle).echo("second try") == "second try"

        async def broken_factory() -> SandboxSpec:
            raise LookupError("server has no manifest")

        other = SandboxKey(3, unique_server())
        with trio.fail_after(10), pytest.raises(SandboxSpawnError, match="no manifest"):
            await supervisor.ensure(other, broken_factory, owner=owner)
        assert [i.server for i in await supervisor.list()] == [server]
    assert leftovers(state_dir, (server,)) == {}


async def test_stop_profile_stops_only_that_profiles_sandboxes(
    state_dir: Path, echo_bin: Path
) -> None:
    a, b, c = unique_server(), unique_server(), unique_server()
    async with running_supervisor(state_dir) as supervisor:
        first = [await ensure_echo(supervisor, echo_bin, 1, s) for s in (a, b)]
        other = await ensure_echo(supervisor, echo_bin, 2, c)
        for handle in first:
            assert await StdioClient(handle).echo("up") == "up"
        pids = [pid for h in first for pid in h.host_pids()]
        assert len(pids) == 6
        namespaces = [h.namespace for h in first]

        with trio.fail_after(15):
            assert await supervisor.stop_profile(1) == 2
        await wait_all_gone(pids, within=5)
        assert not any(namespace_path(n).exists() for n in namespaces)
        assert [(i.profile_id, i.server, i.state) for i in await supervisor.list()] == [
            (2, c, "running")
        ]
        assert await StdioClient(other).echo("still here") == "still here"
        assert await supervisor.stop_profile(1) == 0
    assert leftovers(state_dir, (a, b, c)) == {}


async def test_an_exited_sandbox_stays_listed_with_its_logs_until_replaced(
    state_dir: Path, echo_bin: Path
) -> None:
    server = unique_server("crashy")
    key, owner = SandboxKey(5, server), owner_of(5)
    spawns = 0

    async def factory() -> SandboxSpec:
        nonlocal spawns
        spawns += 1
        code = f"import sys; print('boom', {spawns}, file=sys.stderr); sys.exit(3)"
        return SandboxSpec(command=("/usr/bin/python3", "-c", code, server), label=server)

    async with running_supervisor(state_dir) as supervisor:
        with trio.fail_after(15):
            handle = await supervisor.ensure(key, factory, owner=owner)
            assert await handle.wait() == 3
        [info] = await supervisor.list()
        assert (info.state, info.exit_code) == ("exited", 3)
        assert supervisor.find("profile-5", server) == key
        assert supervisor.find("5", server) == key
        assert await supervisor.logs(key) == ["boom 1"]

        with trio.fail_after(15):
            again = await supervisor.ensure(key, factory, owner=owner)
            assert again is not handle and spawns == 2
            await again.wait()
        assert await supervisor.logs(key) == ["boom 2"]

        assert await supervisor.stop(key) is True  # forgets an exited sandbox
        assert await supervisor.list() == []
        with pytest.raises(SandboxNotFound):
            supervisor.find("profile-5", server)
        with pytest.raises(SandboxNotFound):
            await supervisor.logs(key)
    assert leftovers(state_dir, (server,)) == {}


async def test_cancelling_the_supervisor_mid_run_leaves_nothing_behind(
    state_dir: Path, echo_bin: Path
) -> None:
    servers = [unique_server() for _ in range(3)]
    key, owner = SandboxKey(9, servers[2]), owner_of(9)

    async def with_scratch() -> SandboxSpec:
        spec = legacy_server_spec(echo_bin, key, owner)
        return dataclasses.replace(spec, scratch="/scratch")

    async with running_supervisor(state_dir) as supervisor:
        handles = [
            await ensure_echo(supervisor, echo_bin, p, s)
            for p, s in zip((8, 8), servers[:2], strict=True)
        ]
        with trio.fail_after(15):
            handles.append(await supervisor.ensure(key, with_scratch, owner=owner))
        for handle in handles:  # every server is up (not only released by bwrap)
            assert await StdioClient(handle).echo("busy") == "busy"
        pids = [pid for h in handles for pid in h.host_pids()]
        assert len(pids) == 9
        assert any((state_dir / "scratch").iterdir())
    # running_supervisor cancelled the supervisor's task, as the daemon's shutdown does.
    await wait_all_gone(pids, within=1)
    assert leftovers(state_dir, tuple(servers)) == {}
    assert all(h.returncode is not None for h in handles)
    with pytest.raises(SupervisorClosed):
        await supervisor.ensure(key, with_scratch, owner=owner)


async def test_cancelling_the_supervisor_mid_spawn_leaves_nothing_behind(
    state_dir: Path, echo_bin: Path
) -> None:
    # Give the supervisor a deadline that grows step by step after it is ready, so the
    # cancellation lands at every point of a spawn (factory, record, namespace, cgroup,
    # fork, info read, unblock) until one spawn completes first.
    server = unique_server()
    outcomes: list[str] = []
    for step in range(200):
        supervisor = SandboxSupervisor(SupervisorConfig(state_dir=state_dir, stop_grace=1.0))
        scopes: list[trio.CancelScope] = []
        outcome: list[str] = []

        async def run_supervisor(
            sup: SandboxSupervisor = supervisor,
            scopes: list[trio.CancelScope] = scopes,
            task_status: trio.TaskStatus[SandboxSupervisor] = trio.TASK_STATUS_IGNORED,
        ) -> None:
            with trio.CancelScope() as scope:
                scopes.append(scope)
                await sup.run(task_status=task_status)

        async def caller(sup: SandboxSupervisor = supervisor, out: list[str] = outcome) -> None:
            try:
                await ensure_echo(sup, echo_bin, 1, server)
                out.append("spawned")
            except SupervisorClosed:
                out.append("cancelled")

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(run_supervisor)
                nursery.start_soon(caller)
                scopes[0].deadline = trio.current_time() + step * 0.001
        outcomes += outcome
        assert leftovers(state_dir, (server,)) == {}, f"after cancel at step {step}"
        if outcome == ["spawned"]:
            break
    else:
        pytest.fail("no spawn completed within 200 ms")
    # Several cancellations landed before the one spawn that completed.
    assert outcomes.count("cancelled") == len(outcomes) - 1 >= 3


async def test_ensure_before_start_or_after_shutdown_is_refused(
    state_dir: Path, echo_bin: Path
) -> None:
    supervisor = SandboxSupervisor(SupervisorConfig(state_dir=state_dir))
    with pytest.raises(SupervisorClosed):
        await ensure_echo(supervisor, echo_bin, 1, unique_server())
    async with running_supervisor(state_dir) as running:
        with pytest.raises(RuntimeError, match="entered once"):
            await running.run()
    with pytest.raises(SupervisorClosed):
        await ensure_echo(running, echo_bin, 1, unique_server())


async def test_a_state_dir_the_sandbox_uid_cannot_reach_fails_start_with_a_clear_error(
    tmp_path: Path,
) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    supervisor = SandboxSupervisor(SupervisorConfig(state_dir=private / "sandboxes"))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            with pytest.raises(SupervisorStartError, match="not searchable by the sandbox"):
                await nursery.start(supervisor.run)


async def test_leftovers_of_a_crashed_gateway_are_removed_at_start(
    state_dir: Path, echo_bin: Path
) -> None:
    # Simulate a crash: a namespace and a record with our prefix whose owner is gone.
    name = f"{launcher_prefix(state_dir)}deadbeef"
    (state_dir / "sandboxes").mkdir(mode=0o700, exist_ok=True)
    state.write_record(
        state_dir,
        state.SandboxRecord(
            name=name,
            label="crashed",
            owner_pid=2**22 + 1,  # above pid_max's default: no such process
            owner_start_ticks=1,
            created_at=0.0,
            owned_netns=name,
            cgroup=False,
            scratch=None,
        ),
    )
    netns.create_namespace(name, state_dir=state.netns_state_dir(state_dir))
    assert namespace_path(name).exists()
    async with running_supervisor(state_dir):
        assert not namespace_path(name).exists()
    assert leftovers(state_dir) == {}
