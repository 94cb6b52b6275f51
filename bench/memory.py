"""Scenario 6: memory. The gateway's own memory per warm profile, and each idle sandbox's.

Gateway per warm profile: a gateway serving the SDK echo server (sandboxed) gets a few
profiles warmed first (warm-ups: the first runtime imports and caches what every later one
shares), then its memory is read (``/proc/PID/smaps_rollup`` of the gateway process alone:
its sandboxes are separate processes and not counted), N more profiles of one server each
are warmed (the SDK client connects, initialises, lists tools and calls ``echo``, then
disconnects: the runtime stays warm, there is no idle reaping), and its memory is read
again. Reported: (after - before) / N for RSS, and beside it PSS and private memory.

Per idle sandbox: the processes of each warm sandbox (bwrap, bwrap's init in the sandbox's
pid namespace, the server), found as the gateway's child processes and their descendants,
summed: private memory (``Private_Clean + Private_Dirty``: what one more sandbox costs),
with PSS and RSS beside it; the median over the N sandboxes. Baseline: the same SDK echo
server run directly over stdio (no sandbox), after the same exchange (initialize, tools/list,
one call), its private memory; the difference is what the sandbox adds (bwrap's two
processes and anything the sandbox changes in the server).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from bench import env
from bench.cold import sandboxes
from bench.common import Row, emit, median, progress

SCENARIO = "6 memory"
MB = 1024 * 1024
SERVER = "sdkecho"
SETTLE = 1.0  # seconds to let the gateway settle before reading its memory


@dataclass
class Size:
    warmups: int
    profiles: int


FULL = Size(warmups=3, profiles=20)
QUICK = Size(warmups=1, profiles=3)


def smaps(pid: int) -> dict[str, int]:
    """``/proc/PID/smaps_rollup`` in bytes (Rss, Pss, Private_Clean, ...)."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as file:
        for line in file:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                out[key] = int(parts[0]) * 1024
    return out


def private(usage: dict[str, int]) -> int:
    return usage.get("Private_Clean", 0) + usage.get("Private_Dirty", 0)


@dataclass
class Usage:
    rss: int
    pss: int
    private: int

    @classmethod
    def of(cls, pids: list[int]) -> Usage:
        rss = pss = priv = 0
        for pid in pids:
            usage = smaps(pid)
            rss += usage.get("Rss", 0)
            pss += usage.get("Pss", 0)
            priv += private(usage)
        return cls(rss, pss, priv)

    def __sub__(self, other: Usage) -> Usage:
        return Usage(self.rss - other.rss, self.pss - other.pss, self.private - other.private)


async def use_profile(url: str, token: str) -> None:
    """What a client does with a profile: connect, initialise, list tools, call one."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=120.0) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as mcp,
    ):
        await mcp.list_tools()
        result = await mcp.call_tool(f"{SERVER}_echo", {"text": "hello"})
        if result.is_error:
            raise RuntimeError(f"echo through {url} failed: {result}")


def warm(gw: env.BenchGateway, profiles: list[dict[str, Any]]) -> None:
    async def main() -> None:
        for profile in profiles:
            await use_profile(gw.endpoint(profile["slug"]), profile["token"])

    trio.run(main)
    for profile in profiles:
        runtime = gw.dp.runtime(profile)
        if runtime["state"] != "warm":
            raise RuntimeError(f"profile {profile['slug']} is {runtime['state']}, not warm")


def direct_server(sdk: Path) -> Usage:
    """The echo server over stdio without a sandbox, after the exchange a gateway has with
    it (initialize, initialized, tools/list) and one call: its memory."""
    argv = [env.SANDBOX_PYTHON, str(sdk / "sdk_echo.py")]
    environ = {
        "PYTHONPATH": str(sdk / "site"),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "PATH": "/usr/bin:/bin",
        "HOME": tempfile.gettempdir(),
        "LANG": "C.UTF-8",
    }
    messages: list[dict[str, Any]] = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "svcgate-bench", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
         "params": {"name": "echo", "arguments": {"text": "hello"}}},
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=environ,
        text=True,
    )
    try:
        assert proc.stdin is not None
        assert proc.stdout is not None
        for message in messages:
            proc.stdin.write(json.dumps(message) + "\n")
            proc.stdin.flush()
            if "id" in message:
                answer = json.loads(proc.stdout.readline())
                if "result" not in answer:
                    raise RuntimeError(f"direct echo server: {answer}")
        time.sleep(SETTLE)
        return Usage.of([proc.pid])
    finally:
        proc.kill()
        proc.wait()


def run(quick: bool) -> list[Row]:
    size = QUICK if quick else FULL
    sdk = env.stage_sdk()
    rows: list[Row] = []
    with env.gateway({SERVER: env.sandboxed_echo(sdk)}) as gw:
        total = size.warmups + size.profiles
        progress(f"{SCENARIO}: creating {total} profiles")
        profiles = [gw.profile(f"mem-{i}", [SERVER]) for i in range(total)]
        warmups, measured = profiles[: size.warmups], profiles[size.warmups :]
        progress(f"{SCENARIO}: warming {len(warmups)} profile(s) first")
        warm(gw, warmups)
        time.sleep(SETTLE)
        before = Usage.of([gw.pid])
        progress(f"{SCENARIO}: warming {len(measured)} profiles")
        started = time.perf_counter()
        warm(gw, measured)
        warm_seconds = time.perf_counter() - started
        time.sleep(SETTLE)
        after = Usage.of([gw.pid])
        grown = after - before
        count = len(measured)
        row = Row(
            SCENARIO,
            "gateway per warm profile (1 server)",
            "rss",
            "MB",
            grown.rss / count / MB,
            rounds=1,
            extra={
                "profiles": count,
                "warmups": len(warmups),
                "pss_mb": round(grown.pss / count / MB, 3),
                "private_mb": round(grown.private / count / MB, 3),
                "gateway_rss_before_mb": round(before.rss / MB, 1),
                "gateway_rss_after_mb": round(after.rss / MB, 1),
                "warm_s_per_profile": round(warm_seconds / count, 3),
                "what": "gateway process only (sandboxes excluded): (after - before) / N",
            },
        )
        rows.append(row)
        emit(row)

        found = sandboxes(gw.pid)
        if len(found) != total:
            raise RuntimeError(f"{len(found)} sandboxes running, expected {total}")
        per = [Usage.of(s.pids) for s in found]
        bwraps = [Usage.of([p for p in s.pids if p not in s.servers]) for s in found]
        servers = [Usage.of(s.servers) for s in found]
        progress(f"{SCENARIO}: the same server without a sandbox")
        direct = direct_server(sdk)
        row = Row(
            SCENARIO,
            "per idle sandbox (SDK echo server)",
            "private",
            "MB",
            median([u.private for u in per]) / MB,
            baseline="same server, direct stdio",
            baseline_value=direct.private / MB,
            rounds=1,
            extra={
                "sandboxes": len(per),
                "pss_mb": round(median([u.pss for u in per]) / MB, 2),
                "rss_mb": round(median([u.rss for u in per]) / MB, 2),
                "bwrap_private_mb": round(median([u.private for u in bwraps]) / MB, 3),
                "server_private_mb": round(median([u.private for u in servers]) / MB, 2),
                "direct_pss_mb": round(direct.pss / MB, 2),
                "direct_rss_mb": round(direct.rss / MB, 2),
                "what": "bwrap + bwrap's init + the server, private (Private_Clean + "
                "Private_Dirty), median over the sandboxes",
            },
        )
        rows.append(row)
        emit(row)
    return rows


if __name__ == "__main__":
    import sys

    from bench.common import table

    print(table(run(quick="--quick" in sys.argv)))
