"""The profile runtime state machine (SPEC "Profile runtime"), driven through real clients.

Every row of SPEC's table, coalescing of first requests, isolation of a slow spawn, one bad
server not taking the profile down, and the legacy endpoint. Servers are real processes in
real bubblewrap sandboxes (see ``tests/data_plane_support.py``).
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from data_plane_support import DataPlaneGateway, data_plane_gateway, mcp_client, text_of
from gateway_support import ACCEPT, INIT
from mcp.shared.exceptions import MCPError

from devidp.provider import DevIdP

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def dp(idp: DevIdP, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DataPlaneGateway]:
    with data_plane_gateway(tmp_path_factory.mktemp("dp"), idp) as gateway:
        yield gateway


def spawns(dp: DataPlaneGateway, server: str, slug: str) -> int:
    pattern = re.compile(
        rf"sandbox \S+ started for {re.escape(server)} \(profile {re.escape(slug)}\)"
    )
    return len(pattern.findall(dp.gateway.log_text()))


def sandboxes(dp: DataPlaneGateway) -> list[dict[str, Any]]:
    env = {**dp.gateway.env, "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "svcgate", "sandbox", "ps", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    listed: list[dict[str, Any]] = json.loads(result.stdout)
    return listed


def running(dp: DataPlaneGateway, slug: str) -> list[str]:
    return sorted(
        s["server"] for s in sandboxes(dp) if s["profile_slug"] == slug and s["state"] == "running"
    )


def raw_initialize(dp: DataPlaneGateway, slug: str, token: str) -> httpx2.Response:
    with httpx2.Client(timeout=90.0) as client:
        return client.post(
            dp.endpoint(slug),
            json=INIT,
            headers={"Authorization": f"Bearer {token}", "Accept": ACCEPT},
        )


async def test_cold_then_warm_then_reused(dp: DataPlaneGateway) -> None:
    profile = await trio.to_thread.run_sync(dp.create_profile, "warmup", ["probe"])
    assert dp.runtime(profile) == {"state": "cold", "servers": []}
    async with mcp_client(dp.endpoint("warmup"), profile["token"]) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"probe_echo", "probe_add", "probe_sleep"} <= names
        assert text_of(await client.call_tool("probe_echo", {"text": "hi"})) == "hi"
    runtime = await trio.to_thread.run_sync(dp.runtime, profile)
    assert runtime["state"] == "warm"
    assert [(s["name"], s["state"]) for s in runtime["servers"]] == [("probe", "ready")]
    async with mcp_client(dp.endpoint("warmup"), profile["token"]) as client:
        assert text_of(await client.call_tool("probe_add", {"a": 2, "b": 3})) == "5"
    # The cached runtime was reused: one sandbox, spawned once.
    assert spawns(dp, "probe", "warmup") == 1
    assert running(dp, "warmup") == ["probe"]


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28", "auto"])
async def test_both_protocol_generations(dp: DataPlaneGateway, mode: str) -> None:
    slug = f"gen-{mode.replace('-', '')}"
    profile = await trio.to_thread.run_sync(dp.create_profile, slug, ["probe", "probe2"])
    async with mcp_client(dp.endpoint(slug), profile["token"], mode=mode) as client:
        expected = "2025-11-25" if mode == "legacy" else "2026-07-28"
        assert client.protocol_version == expected
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"probe_echo", "probe2_echo"} <= names
        assert text_of(await client.call_tool("probe2_echo", {"text": mode})) == mode


async def test_spawn_failure_is_not_cached(dp: DataPlaneGateway) -> None:
    profile = await trio.to_thread.run_sync(dp.create_profile, "allbroken", ["broken"])
    first = await trio.to_thread.run_sync(raw_initialize, dp, "allbroken", profile["token"])
    assert first.status_code == 503
    assert first.json()["error"]["code"] == -32603
    assert "broken" in first.json()["error"]["message"]
    assert dp.runtime(profile)["state"] == "cold"
    second = await trio.to_thread.run_sync(raw_initialize, dp, "allbroken", profile["token"])
    assert second.status_code == 503
    # Each request tried again: two spawns, nothing cached, nothing left running.
    assert spawns(dp, "broken", "allbroken") == 2
    assert running(dp, "allbroken") == []


async def test_one_bad_server_never_takes_the_profile_down(dp: DataPlaneGateway) -> None:
    profile = await trio.to_thread.run_sync(dp.create_profile, "mixed", ["broken", "probe"])
    async with mcp_client(dp.endpoint("mixed"), profile["token"]) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert "probe_echo" in names
        assert not any(n.startswith("broken_") for n in names)
    admin_view = await trio.to_thread.run_sync(dp.runtime, profile)
    states = {s["name"]: s for s in admin_view["servers"]}
    assert states["probe"]["state"] == "ready"
    assert states["broken"]["state"] == "failed"
    assert states["broken"]["error"]
    # The owner sees the states but not the error text (it can name host paths).
    owner_view = await trio.to_thread.run_sync(lambda: dp.runtime(profile, admin=False))
    assert {s["name"]: s["state"] for s in owner_view["servers"]} == {
        "broken": "failed",
        "probe": "ready",
    }
    assert all("error" not in s for s in owner_view["servers"])
    assert "server 'broken' failed to start" in dp.gateway.log_text()


async def test_a_server_that_is_no_longer_installed_is_skipped(dp: DataPlaneGateway) -> None:
    # A catalogue row that this gateway cannot run (its configuration was removed).
    db = Path(dp.gateway.env["SVC_DATA_DIR"]) / "svcgate.db"
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO servers (name, created_at) VALUES ('ghost', '2026-01-01T00:00:00Z')"
            " ON CONFLICT (name) DO NOTHING"
        )
    profile = await trio.to_thread.run_sync(dp.create_profile, "haunted", ["ghost", "probe"])
    async with mcp_client(dp.endpoint("haunted"), profile["token"]) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert "probe_echo" in names
        assert not any(n.startswith("ghost_") for n in names)
    states = {s["name"]: s["state"] for s in dp.runtime(profile)["servers"]}
    assert states == {"ghost": "skipped", "probe": "ready"}
    assert "server 'ghost' is in the bundle but not installed; skipped" in dp.gateway.log_text()


async def test_fifty_concurrent_first_requests_spawn_each_server_once(dp: DataPlaneGateway) -> None:
    profile = await trio.to_thread.run_sync(dp.create_profile, "herd", ["probe", "probe2"])
    statuses: list[int] = []

    async def first_request() -> None:
        response = await trio.to_thread.run_sync(
            raw_initialize, dp, "herd", profile["token"], limiter=trio.CapacityLimiter(60)
        )
        statuses.append(response.status_code)

    async with trio.open_nursery() as nursery:
        for _ in range(50):
            nursery.start_soon(first_request)
    assert statuses == [200] * 50
    assert spawns(dp, "probe", "herd") == 1
    assert spawns(dp, "probe2", "herd") == 1


async def test_a_slow_spawn_does_not_block_another_profile(dp: DataPlaneGateway) -> None:
    dp.close_gate()
    fast = await trio.to_thread.run_sync(dp.create_profile, "fast", ["probe"])
    slow = await trio.to_thread.run_sync(dp.create_profile, "sluggish", ["slow"])
    async with mcp_client(dp.endpoint("fast"), fast["token"]) as fast_client:
        await fast_client.list_tools()  # warm
        slow_done = trio.Event()
        slow_tools: list[str] = []

        async def slow_first_request() -> None:
            async with mcp_client(dp.endpoint("sluggish"), slow["token"]) as client:
                slow_tools.extend(t.name for t in (await client.list_tools()).tools)
            slow_done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow_first_request)
            await trio.to_thread.run_sync(dp.wait_runtime, slow, lambda r: r["state"] == "starting")
            # The other profile is served while this one's spawn hangs.
            for i in range(5):
                result = await fast_client.call_tool("probe_echo", {"text": f"x{i}"})
                assert text_of(result) == f"x{i}"
            assert not slow_done.is_set()
            assert (await trio.to_thread.run_sync(dp.runtime, slow))["state"] == "starting"
            dp.open_gate()
        assert "slow_echo" in slow_tools


async def test_bundle_edit_tears_down_and_fails_in_flight_requests(dp: DataPlaneGateway) -> None:
    profile = await trio.to_thread.run_sync(dp.create_profile, "edited", ["probe"])
    in_flight = trio.Event()
    outcome: list[BaseException | str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        in_flight.set()

    async def long_call() -> None:
        try:
            async with mcp_client(dp.endpoint("edited"), profile["token"]) as client:
                result = await client.call_tool(
                    "probe_sleep", {"seconds": 60, "steps": 60}, progress_callback=on_progress
                )
                outcome.append(text_of(result))
        except Exception as exc:  # any transport failure is the expected outcome
            outcome.append(exc)
        in_flight.set()

    with trio.fail_after(45):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_call)
            await in_flight.wait()
            assert running(dp, "edited") == ["probe"]
            await trio.to_thread.run_sync(dp.set_servers, profile, ["probe", "probe2"])
    # The call did not complete: it failed with a transport-level error.
    assert len(outcome) == 1 and isinstance(outcome[0], BaseException), outcome
    assert dp.runtime(profile)["state"] == "cold"
    assert running(dp, "edited") == []
    # The next request warms the new bundle.
    async with mcp_client(dp.endpoint("edited"), profile["token"]) as client:
        names = {t.name for t in (await client.list_tools()).tools}
    assert {"probe_echo", "probe2_echo"} <= names
    assert running(dp, "edited") == ["probe", "probe2"]


async def test_profile_deletion_tears_down_its_sandboxes(dp: DataPlaneGateway) -> None:
    profile = await trio.to_thread.run_sync(dp.create_profile, "doomed", ["probe", "probe2"])
    async with mcp_client(dp.endpoint("doomed"), profile["token"]) as client:
        await client.list_tools()
    assert running(dp, "doomed") == ["probe", "probe2"]
    await trio.to_thread.run_sync(dp.delete, profile)
    assert running(dp, "doomed") == []
    response = await trio.to_thread.run_sync(raw_initialize, dp, "doomed", profile["token"])
    assert response.status_code == 401


async def test_token_rotation_keeps_the_runtime_and_open_streams(dp: DataPlaneGateway) -> None:
    profile = await trio.to_thread.run_sync(dp.create_profile, "rotated", ["probe"])
    old = profile["token"]
    started = trio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        started.set()

    async with mcp_client(dp.endpoint("rotated"), old) as client:
        # The SDK validates results against the listed tools: list them before rotating.
        await client.list_tools()
        results: list[str] = []

        async def call() -> None:
            result = await client.call_tool(
                "probe_sleep", {"seconds": 2, "steps": 4}, progress_callback=on_progress
            )
            results.append(text_of(result))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await started.wait()
            new = await trio.to_thread.run_sync(dp.rotate, profile)
            # The very next request with the old token fails...
            stale = await trio.to_thread.run_sync(raw_initialize, dp, "rotated", old)
            assert stale.status_code == 401
        # ...while the stream opened before the rotation completed normally.
        assert results and "slept" in results[0]
        # The same session with the old token is refused on its next request.
        with pytest.raises(Exception):  # noqa: B017, PT011  # the SDK surfaces the 401 as it sees fit
            await client.call_tool("probe_echo", {"text": "again"})
    async with mcp_client(dp.endpoint("rotated"), new) as client:
        assert text_of(await client.call_tool("probe_echo", {"text": "new"})) == "new"
    assert dp.runtime(profile)["state"] == "warm"
    assert spawns(dp, "probe", "rotated") == 1


async def test_a_server_that_dies_leaves_the_others_working(dp: DataPlaneGateway) -> None:
    profile = await trio.to_thread.run_sync(dp.create_profile, "crashy", ["probe", "probe2"])
    changed = trio.Event()

    async def on_message(message: Any) -> None:
        root = getattr(message, "root", message)
        if getattr(root, "method", None) == "notifications/tools/list_changed":
            changed.set()

    async with mcp_client(
        dp.endpoint("crashy"), profile["token"], message_handler=on_message
    ) as client:
        await client.list_tools()
        with pytest.raises(MCPError):
            await client.call_tool("probe_crash", {})
        await trio.to_thread.run_sync(
            dp.wait_runtime, profile, lambda r: r["servers"][0]["state"] == "exited"
        )
        names = {t.name for t in (await client.list_tools()).tools}
        assert "probe2_echo" in names
        assert not any(n.startswith("probe_") for n in names)
        with pytest.raises(MCPError, match="not running"):
            await client.call_tool("probe_echo", {"text": "x"})
        assert text_of(await client.call_tool("probe2_echo", {"text": "still"})) == "still"
    assert "server 'probe' exited" in dp.gateway.log_text()


async def test_legacy_endpoint_aggregates_every_installed_server(dp: DataPlaneGateway) -> None:
    dp.open_gate()
    token = dp.gateway.env["SVC_BEARER_TOKEN"]
    for path in ("/mcp", "/"):
        async with mcp_client(f"{dp.url}{path}", token) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"echo_echo", "probe_echo", "probe2_echo", "curated_echo", "slow_echo"} <= names
            assert not any(n.startswith("broken_") for n in names)
            assert text_of(await client.call_tool("echo_echo", {"text": "legacy"})) == "legacy"
    # The legacy bundle runs as profile 0 with no user: no credentials can apply.
    legacy = [s for s in sandboxes(dp) if s["profile_id"] == 0 and s["state"] == "running"]
    assert {s["server"] for s in legacy} >= {"echo", "probe", "probe2"}
    assert {s["owner_user_id"] for s in legacy} == {0}
    # A profile token means nothing on the legacy endpoint, and vice versa.
    profile = dp.profiles["warmup"]
    with httpx2.Client(timeout=30.0) as client:
        for url, wrong in ((f"{dp.url}/mcp", profile["token"]), (dp.endpoint("warmup"), token)):
            response = client.post(
                url, json=INIT, headers={"Authorization": f"Bearer {wrong}", "Accept": ACCEPT}
            )
            assert response.status_code == 401


async def test_a_bundle_change_announces_list_changed_before_the_teardown(
    dp: DataPlaneGateway,
) -> None:
    profile = await trio.to_thread.run_sync(dp.create_profile, "announced", ["probe"])
    changed = trio.Event()

    async def on_message(message: Any) -> None:
        root = getattr(message, "root", message)
        if getattr(root, "method", None) == "notifications/tools/list_changed":
            changed.set()

    with trio.fail_after(30):
        async with mcp_client(
            dp.endpoint("announced"), profile["token"], message_handler=on_message
        ) as client:
            await client.list_tools()
            await trio.to_thread.run_sync(dp.set_servers, profile, ["probe2"])
            await changed.wait()
    async with mcp_client(dp.endpoint("announced"), profile["token"]) as client:
        names = {t.name for t in (await client.list_tools()).tools}
    assert "probe2_echo" in names and not any(n.startswith("probe_") for n in names)
