"""Scenario 1: a warm ``tools/call`` through ``/mcp/p/<slug>`` against the same SDK echo
server served directly by the SDK over streamable HTTP, behind mcp-proxy and behind
fastmcp's proxy. p50/p99 at concurrency 1, throughput at 10 and 50, both protocol
generations (the peers speak only the handshake generation)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import trio

from bench import env
from bench.common import Goal, Row, emit, latency, median, progress, throughput, timed_calls

SCENARIO = "1 warm tools/call"
DIRECT = "direct SDK HTTP"
MODES = {"legacy": "handshake (2025-11-25)", "2026-07-28": "stateless (2026-07-28)"}


@dataclass
class Size:
    rounds: int
    calls: int  # sequential calls per round (c=1)
    seconds: float  # per throughput round
    concurrency: tuple[int, ...]


FULL = Size(rounds=7, calls=300, seconds=3.0, concurrency=(10, 50))
QUICK = Size(rounds=1, calls=5, seconds=0.3, concurrency=(2,))


@contextlib.asynccontextmanager
async def client(
    url: str, token: str | None, mode: str
) -> AsyncIterator[Callable[[], Awaitable[object]]]:
    """An initialised SDK client; yields one echo call."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    tool = "sdkecho_echo" if token else "echo"
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60.0, limits=limits) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as mcp,
    ):

        async def call() -> object:
            result = await mcp.call_tool(tool, {"text": "hello"})
            if result.is_error or getattr(result.content[0], "text", None) != "hello":
                raise RuntimeError(f"unexpected echo result from {url}: {result}")
            return result

        await call()
        yield call


@dataclass
class Subject:
    name: str
    url: str
    token: str | None
    modes: tuple[str, ...]


async def _latency_round(subject: Subject, mode: str, calls: int) -> tuple[float, float]:
    async with client(subject.url, subject.token, mode) as call:
        for _ in range(max(3, calls // 20)):  # warm the connection and both ends
            await call()
        stats = latency(await timed_calls(call, calls))
    return stats.p50, stats.p99


async def _throughput_round(subject: Subject, mode: str, workers: int, seconds: float) -> float:
    async with contextlib.AsyncExitStack() as stack:
        calls = []
        for _ in range(workers):
            calls.append(await stack.enter_async_context(client(subject.url, subject.token, mode)))
        return await throughput(calls, seconds)


async def measure(subjects: list[Subject], size: Size) -> list[Row]:
    rows: list[Row] = []
    gateway = subjects[0]
    for mode, label in MODES.items():
        active = [s for s in subjects if mode in s.modes]
        p50: dict[str, list[float]] = {s.name: [] for s in active}
        p99: dict[str, list[float]] = {s.name: [] for s in active}
        for index in range(size.rounds):
            progress(f"{SCENARIO} {mode}: latency round {index + 1}/{size.rounds}")
            order = active if index % 2 == 0 else list(reversed(active))
            for subject in order:
                a, b = await _latency_round(subject, mode, size.calls)
                p50[subject.name].append(a)
                p99[subject.name].append(b)
        tput: dict[int, dict[str, list[float]]] = {
            c: {s.name: [] for s in active} for c in size.concurrency
        }
        for index in range(size.rounds):
            progress(f"{SCENARIO} {mode}: throughput round {index + 1}/{size.rounds}")
            for workers in size.concurrency:
                order = active if index % 2 == 0 else list(reversed(active))
                for subject in order:
                    tput[workers][subject.name].append(
                        await _throughput_round(subject, mode, workers, size.seconds)
                    )
        for other in [s for s in active if s is not gateway]:
            vs_direct = other.name == DIRECT
            for metric, values, goal in (
                ("p50", p50, Goal("ratio", "<=", 1.1) if vs_direct else None),
                ("p99", p99, None),
            ):
                row = Row(
                    SCENARIO,
                    f"{label} c=1",
                    metric,
                    "ms",
                    median(values[gateway.name]),
                    baseline=other.name,
                    baseline_value=median(values[other.name]),
                    goal=goal,
                    rounds=size.rounds,
                )
                rows.append(row)
                emit(row)
            for workers in size.concurrency:
                goal = None
                if vs_direct and workers == 10:
                    goal = Goal("ratio", ">=", 0.9)
                elif other.name == "mcp-proxy":
                    goal = Goal("ratio", ">=", 1.5)
                row = Row(
                    SCENARIO,
                    f"{label} c={workers}",
                    "throughput",
                    "calls/s",
                    median(tput[workers][gateway.name]),
                    baseline=other.name,
                    baseline_value=median(tput[workers][other.name]),
                    goal=goal,
                    rounds=size.rounds,
                )
                rows.append(row)
                emit(row)
    return rows


def run(quick: bool, peers: bool = True) -> list[Row]:
    size = QUICK if quick else FULL
    sdk = env.stage_sdk()
    with contextlib.ExitStack() as stack:
        gw = stack.enter_context(env.gateway({"sdkecho": env.sandboxed_echo(sdk)}))
        profile = gw.profile("bench", ["sdkecho"])
        subjects = [
            Subject("svcgate", gw.endpoint("bench"), profile["token"], tuple(MODES)),
            Subject(DIRECT, stack.enter_context(env.direct_server()), None, tuple(MODES)),
        ]
        if peers:
            subjects.append(
                Subject("mcp-proxy", stack.enter_context(env.mcp_proxy()), None, ("legacy",))
            )
            subjects.append(
                Subject(
                    "fastmcp proxy", stack.enter_context(env.fastmcp_proxy()), None, ("legacy",)
                )
            )
        return trio.run(measure, subjects, size)


if __name__ == "__main__":
    import sys

    rows = run(quick="--quick" in sys.argv, peers="--no-peers" not in sys.argv)
    from bench.common import table

    print(table(rows))
