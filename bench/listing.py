"""Scenario 2: ``tools/list`` on a profile of 10 servers x 50 tools (500 tools, aggregated
and renamed by the gateway) against one SDK server that lists the same 500 tools itself
over streamable HTTP. The SDK client lists them; p50/p99 at concurrency 1, both protocol
generations, alternating subject and baseline round by round."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import trio

from bench import env
from bench.common import Row, emit, latency, median, progress, timed_calls
from bench.warm import DIRECT, MODES

SCENARIO = "2 tools/list"


@dataclass
class Size:
    servers: int
    tools: int  # per server
    rounds: int
    calls: int


FULL = Size(servers=10, tools=50, rounds=5, calls=100)
QUICK = Size(servers=2, tools=5, rounds=1, calls=3)


@contextlib.asynccontextmanager
async def lister(
    url: str, token: str | None, mode: str, expected: int
) -> AsyncIterator[Callable[[], Awaitable[object]]]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60.0) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as mcp,
    ):

        async def list_tools() -> object:
            result = await mcp.list_tools()
            if len(result.tools) != expected:
                raise RuntimeError(f"{url} listed {len(result.tools)} tools, not {expected}")
            return result

        yield list_tools


async def measure(subjects: dict[str, tuple[str, str | None]], size: Size) -> list[Row]:
    expected = size.servers * size.tools
    rows = []
    for mode, label in MODES.items():
        p50: dict[str, list[float]] = {name: [] for name in subjects}
        p99: dict[str, list[float]] = {name: [] for name in subjects}
        for index in range(size.rounds):
            progress(f"{SCENARIO} {mode}: round {index + 1}/{size.rounds}")
            names = list(subjects) if index % 2 == 0 else list(reversed(subjects))
            for name in names:
                url, token = subjects[name]
                async with lister(url, token, mode, expected) as call:
                    await call()
                    stats = latency(await timed_calls(call, size.calls))
                p50[name].append(stats.p50)
                p99[name].append(stats.p99)
        for metric, values in (("p50", p50), ("p99", p99)):
            row = Row(
                SCENARIO,
                f"{label} {size.servers}x{size.tools} tools",
                metric,
                "ms",
                median(values["svcgate"]),
                baseline=f"{DIRECT} ({expected} tools)",
                baseline_value=median(values[DIRECT]),
                rounds=size.rounds,
            )
            rows.append(row)
            emit(row)
    return rows


def run(quick: bool) -> list[Row]:
    size = QUICK if quick else FULL
    sdk = env.stage_sdk()
    names = [f"list{i}" for i in range(size.servers)]
    servers = {name: env.sandboxed_echo(sdk, extra_tools=size.tools - 1) for name in names}
    with contextlib.ExitStack() as stack:
        gw = stack.enter_context(env.gateway(servers))
        profile = gw.profile("listing", names)
        direct = stack.enter_context(env.direct_server(extra_tools=size.servers * size.tools - 1))
        subjects = {"svcgate": (gw.endpoint("listing"), profile["token"]), DIRECT: (direct, None)}
        return trio.run(measure, subjects, size)
