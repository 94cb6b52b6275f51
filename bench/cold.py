"""Scenario 3: cold start of a profile, against its slowest server's own start.

Subject: the time from a client's first request to a cold profile until the profile has
answered: the official SDK client connecting, initialising and listing tools on
``/mcp/p/<slug>``, for a profile of 1 server and of 5 servers (sdkecho1..5, all the SDK echo
server, each in its own sandbox). Baseline: the slowest of the profile's servers started
alone, the way the gateway starts it (the same :class:`sandbox.SandboxSpec`, built by the
product's own ``local_server_spec``, through the same :mod:`sandbox` launcher: network
namespace, cgroup, bwrap), timed from the spawn to its answer to ``initialize`` over stdio.
The launcher runs in the bench process without the egress listener the gateway adds; the
server without any sandbox is reported beside it (``bare_ms``). Rounds alternate the two
sides; before each subject round the profile is made cold through the API (``PUT
/api/profiles/{id}/servers`` tears the runtime down) and the gateway is checked to have no
sandbox process left.

Where the time goes (the row's ``extra``): with every round the servers' own CPU time
(utime + stime of the sandboxed processes once the profile is warm), the gateway's CPU time
over the start, the CPU the rest of the machine used meanwhile (``/proc/stat`` busy time
minus all of those and the bench process's own: other work on a shared machine) and when
each sandbox was spawned after the request (process start times) are recorded. A Python
SDK server spends ~1 s CPU importing the SDK, so five of them on a 2-core machine need
~2.7 s before the last can answer, whatever the gateway does: ``cpu_bound_ms`` is the
servers' and the gateway's CPU divided by the cores left to them (``available_cores``).
To show what the gateway itself adds, the same comparison runs with a light server that
waits 1 s at start without using CPU (a raw JSON-RPC stdio server, no SDK).

Coalescing: 50 concurrent first requests (raw ``initialize`` POSTs) on the cold 5-server
profile must start it once: while they run, the gateway's sandbox processes are sampled,
and its log's "sandbox ... started" lines are counted; exactly one sandbox per server must
have been started, and every request must be answered. The same burst is then sent to the
now warm profile (``warm_burst_ms``: what answering 50 initializes costs by itself).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bench import env
from bench.common import Goal, Row, emit, median, progress

SCENARIO = "3 cold start"
CLK_TCK = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1
PROTOCOL = "2025-11-25"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": PROTOCOL,
        "capabilities": {},
        "clientInfo": {"name": "svcgate-bench", "version": "0"},
    },
}
ACCEPT = "application/json, text/event-stream"

# A stdio MCP server without the SDK that sleeps before it reads its first line: a start
# that takes time without using CPU, so what the gateway adds to parallel starts shows.
LIGHT_SERVER = r"""
import json, os, sys, time
time.sleep(float(os.environ.get("BENCH_START_DELAY", "1")))
TOOL = {"name": "echo", "description": "Return the given text unchanged.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}}
def reply(msg_id, **body):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg_id, **body}) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg or "method" not in msg:
        continue
    method, params = msg["method"], msg.get("params") or {}
    if method == "initialize":
        reply(msg["id"], result={"protocolVersion": params.get("protocolVersion"),
              "capabilities": {"tools": {}}, "serverInfo": {"name": "light", "version": "0"}})
    elif method == "tools/list":
        reply(msg["id"], result={"tools": [TOOL]})
    elif method == "tools/call":
        text = (params.get("arguments") or {}).get("text", "")
        reply(msg["id"], result={"content": [{"type": "text", "text": text}]})
    elif method == "ping":
        reply(msg["id"], result={})
    else:
        reply(msg["id"], error={"code": -32601, "message": "method not found"})
"""


@dataclass
class Size:
    rounds: int
    cases: tuple[int, ...]  # servers per profile
    concurrent: int  # first requests in the coalescing test
    burst_rounds: int
    light_delay: float  # seconds the light server waits at start
    bare: bool = True  # also time the server without any sandbox


FULL = Size(rounds=7, cases=(1, 5), concurrent=50, burst_rounds=3, light_delay=1.0)
QUICK = Size(rounds=1, cases=(2,), concurrent=5, burst_rounds=1, light_delay=0.2, bare=False)


def light_server(delay: float) -> dict[str, Any]:
    """A ``SVC_SERVERS_FILE`` entry: :data:`LIGHT_SERVER` over stdio in a sandbox."""
    return {
        "command": [env.SANDBOX_PYTHON, "-c", LIGHT_SERVER],
        "env": {"BENCH_START_DELAY": str(delay)},
    }


# -- processes ------------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (every thread's), [] if it is gone."""
    out: list[int] = []
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for task in os.listdir(f"/proc/{pid}/task"):
            path = f"/proc/{pid}/task/{task}/children"
            with contextlib.suppress(FileNotFoundError, ProcessLookupError), open(path) as file:
                out.extend(int(p) for p in file.read().split())
    return out


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    for child in children(pid):
        out.append(child)
        out.extend(descendants(child))
    return out


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as file:
        return file.read().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (all its threads), 0 if it is gone."""
    try:
        fields = _stat(pid)
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def start_time(pid: int) -> float | None:
    """When ``pid`` started, in seconds since boot (the clock of :func:`uptime`)."""
    try:
        return int(_stat(pid)[19]) / CLK_TCK
    except (FileNotFoundError, ProcessLookupError):
        return None


def busy_cpu() -> float:
    """CPU seconds the whole machine has been busy (every core, every process) since boot."""
    with open("/proc/stat") as file:
        fields = [int(x) for x in file.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7]) / CLK_TCK


def uptime() -> float:
    with open("/proc/uptime") as file:
        return float(file.read().split()[0])


def command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


@dataclass
class SandboxProcs:
    """One sandbox's host processes: bwrap (the gateway's child), its init, the server."""

    bwrap: int
    others: list[int]

    @property
    def pids(self) -> list[int]:
        return [self.bwrap, *self.others]

    @property
    def servers(self) -> list[int]:
        """The processes that are not bwrap (the server and whatever it started)."""
        return [p for p in self.others if not command(p).startswith("/usr/bin/bwrap")]


def sandboxes(gateway_pid: int) -> list[SandboxProcs]:
    """The gateway's sandboxes: each child of the gateway is one sandbox's outer bwrap (it
    was started as ``prlimit ... nsenter ... bwrap``, each exec'ing the next)."""
    return [SandboxProcs(child, descendants(child)) for child in children(gateway_pid)]


def wait_no_sandboxes(gateway_pid: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while (left := sandboxes(gateway_pid)) and time.monotonic() < deadline:
        time.sleep(0.02)
    if left:
        raise RuntimeError(f"sandboxes still running: {[command(s.bwrap)[:80] for s in left]}")


# -- the subject: a cold profile ------------------------------------------------------------


@dataclass
class ColdSample:
    seconds: float
    servers_cpu: float  # CPU seconds of the servers (and their bwraps) until warm
    gateway_cpu: float  # CPU seconds of the gateway process during the start
    others_cpu: float  # CPU seconds the rest of the machine used meanwhile (interference)
    warm: float  # the same client exchange again, on the now warm profile
    first_spawn: float  # seconds from the request to the first / last sandbox's start
    last_spawn: float
    sandboxes: int


def make_cold(gw: env.BenchGateway, profile: dict[str, Any], servers: list[str]) -> None:
    """Tear the profile's runtime down through the API and check nothing of it runs."""
    gw.dp.set_servers(profile, servers)
    runtime = gw.dp.runtime(profile)
    if runtime["state"] != "cold":
        raise RuntimeError(f"profile {profile['slug']} is {runtime['state']} after a bundle edit")
    wait_no_sandboxes(gw.pid)


async def sdk_first_contact(
    url: str, token: str, before: Callable[[], None] = lambda: None
) -> tuple[float, int]:
    """Connect, initialise and list tools with the official SDK client: how long it took
    and how many tools it listed. The HTTP client (its TLS context) is made beforehand;
    ``before`` is called right before the clock starts."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=120.0) as http:
        before()
        start = time.perf_counter()
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as mcp:
            tools = len((await mcp.list_tools()).tools)
            return time.perf_counter() - start, tools


async def cold_start(
    gw: env.BenchGateway, profile: dict[str, Any], servers: list[str]
) -> ColdSample:
    make_cold(gw, profile, servers)
    await trio.sleep(0.2)  # let the teardown's work settle
    marks: dict[str, float] = {}

    def before() -> None:
        marks.update(
            gw_cpu=cpu_seconds(gw.pid),
            since_boot=uptime(),
            busy=busy_cpu(),
            own=time.process_time(),
        )

    seconds, tools = await sdk_first_contact(gw.endpoint(profile["slug"]), profile["token"], before)
    busy = busy_cpu() - marks["busy"]
    own_cpu = time.process_time() - marks["own"]
    gw_cpu = cpu_seconds(gw.pid) - marks["gw_cpu"]
    since_boot = marks["since_boot"]
    if tools != len(servers):
        raise RuntimeError(f"profile {profile['slug']} listed {tools} tools, not {len(servers)}")
    found = sandboxes(gw.pid)
    starts = [t - since_boot for s in found if (t := start_time(s.bwrap)) is not None]
    servers_cpu = sum(cpu_seconds(p) for s in found for p in s.pids)
    warm, _ = await sdk_first_contact(gw.endpoint(profile["slug"]), profile["token"])
    sample = ColdSample(
        seconds=seconds,
        servers_cpu=servers_cpu,
        gateway_cpu=gw_cpu,
        others_cpu=max(0.0, busy - servers_cpu - gw_cpu - own_cpu),
        first_spawn=min(starts, default=0.0),
        last_spawn=max(starts, default=0.0),
        sandboxes=len(found),
        warm=warm,
    )
    make_cold(gw, profile, servers)
    return sample


# -- the baseline: each server started alone ------------------------------------------------


@dataclass
class OwnSample:
    seconds: float
    cpu: float


class OwnStarts:
    """Starts servers alone in sandboxes the way the gateway does (see the docstring)."""

    def __init__(self, definitions: dict[str, dict[str, Any]]) -> None:
        from svcgate.local_servers import parse_local_servers

        self.servers = parse_local_servers(json.dumps({"servers": definitions}).encode())
        self.launcher: Any = None

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[OwnStarts]:
        from sandbox import LauncherConfig, open_launcher
        from svcgate.supervisor import launcher_prefix

        state = Path(tempfile.mkdtemp(prefix="svcgate-bench-sb-"))
        os.chmod(state, 0o755)  # noqa: S103  # the sandbox uid must reach the state dir
        config = LauncherConfig(state_dir=state, prefix=launcher_prefix(state))
        try:
            async with open_launcher(config) as launcher:
                self.launcher = launcher
                yield self
        finally:
            self.launcher = None
            import shutil

            shutil.rmtree(state, ignore_errors=True)

    async def start(self, name: str) -> OwnSample:
        """Spawn ``name`` alone; time until it answered ``initialize`` over stdio."""
        from svcgate.server_defs import local_server_spec
        from svcgate.supervisor import SandboxKey, SandboxOwner

        spec = local_server_spec(
            self.servers[name], SandboxKey(0, name), SandboxOwner("bench-baseline", 0)
        )
        start = time.perf_counter()
        async with self.launcher.sandbox(spec) as sandbox:
            await sandbox.stdin.send_all(json.dumps(INITIALIZE).encode() + b"\n")
            answer = await _read_line(sandbox.stdout)
            seconds = time.perf_counter() - start
            cpu = sum(cpu_seconds(p) for p in sandbox.host_pids())
            if "result" not in json.loads(answer):
                raise RuntimeError(f"{name} did not initialise: {answer[:200]!r}")
            await sandbox.stdin.aclose()
        return OwnSample(seconds, cpu)


async def _read_line(stream: trio.abc.ReceiveStream) -> bytes:
    data = b""
    with trio.fail_after(120):
        while b"\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                raise RuntimeError(f"the server closed stdout: {data[:200]!r}")
            data += chunk
    return data.split(b"\n", 1)[0]


async def bare_start(sdk: Path) -> float:
    """The SDK echo server without any sandbox: spawn to ``initialize`` answered."""
    argv = [env.SANDBOX_PYTHON, str(sdk / "sdk_echo.py")]
    environ = {
        "PYTHONPATH": str(sdk / "site"),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PATH": "/usr/bin:/bin",
    }
    start = time.perf_counter()
    proc = await trio.lowlevel.open_process(
        argv,
        stdin=-1,
        stdout=-1,
        stderr=-3,
        env=environ,  # PIPE, PIPE, DEVNULL
    )
    try:
        assert proc.stdin is not None
        assert proc.stdout is not None
        await proc.stdin.send_all(json.dumps(INITIALIZE).encode() + b"\n")
        await _read_line(proc.stdout)
        return time.perf_counter() - start
    finally:
        proc.kill()
        await proc.wait()


# -- coalescing -----------------------------------------------------------------------------


@contextlib.contextmanager
def watch_sandboxes(gateway_pid: int) -> Iterator[set[int]]:
    """Sample the gateway's sandbox processes (outer bwrap pids) every 10 ms meanwhile."""
    seen: set[int] = set()
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.update(children(gateway_pid))
            stop.wait(0.01)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()
        seen.update(children(gateway_pid))


async def raw_initialize(http: Any, url: str) -> tuple[float, str]:
    """One raw ``initialize`` POST; its duration and the session id it was given."""
    start = time.perf_counter()
    response = await http.post(url, json=INITIALIZE)
    seconds = time.perf_counter() - start
    body = response.text
    if response.status_code != 200 or '"result"' not in body:
        raise RuntimeError(f"initialize: {response.status_code} {body[:200]}")
    return seconds, response.headers.get("mcp-session-id", "")


def _read_from(path: Path, offset: int) -> str:
    with open(path, "rb") as file:
        file.seek(offset)
        return file.read().decode(errors="replace")


@dataclass
class Burst:
    all_done: float  # seconds until every request was answered
    p50: float
    spawned: int  # distinct sandboxes seen while they ran
    logged: int  # "sandbox ... started" log lines of this profile
    sessions: int
    answered: int
    warm_all_done: float  # the same burst again on the now warm profile


async def burst(
    gw: env.BenchGateway, profile: dict[str, Any], servers: list[str], count: int
) -> Burst:
    import httpx2

    make_cold(gw, profile, servers)
    await trio.sleep(0.2)
    log_path: Path = gw.dp.gateway.log_path
    offset = os.stat(log_path).st_size
    url = gw.endpoint(profile["slug"])
    headers = {"Authorization": f"Bearer {profile['token']}", "Accept": ACCEPT}
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
    results: list[tuple[float, str]] = []
    async with httpx2.AsyncClient(headers=headers, timeout=120.0, limits=limits) as http:
        with watch_sandboxes(gw.pid) as seen:
            start = time.perf_counter()

            async def one() -> None:
                results.append(await raw_initialize(http, url))

            async with trio.open_nursery() as nursery:
                for _ in range(count):
                    nursery.start_soon(one)
            all_done = time.perf_counter() - start
        # The same burst on the warm profile: what answering the requests costs by itself.
        answered = len(results)
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(one)
        warm_all_done = time.perf_counter() - start
    text = _read_from(log_path, offset)
    marker = f"(profile {profile['slug']}): pid"
    logged = sum(1 for line in text.splitlines() if " started for " in line and marker in line)
    runtime = gw.dp.runtime(profile)
    ready = [s for s in runtime["servers"] if s["state"] == "ready"]
    if runtime["state"] != "warm" or len(ready) != len(servers):
        raise RuntimeError(f"profile {profile['slug']} after the burst: {runtime}")
    return Burst(
        all_done=all_done,
        p50=median([r[0] for r in results[:answered]]),
        spawned=len(seen),
        logged=logged,
        sessions=len({r[1] for r in results[:answered]}),
        answered=answered,
        warm_all_done=warm_all_done,
    )


async def raw_cold(gw: env.BenchGateway, profile: dict[str, Any], servers: list[str]) -> float:
    """One raw ``initialize`` on the cold profile (the burst's single-request baseline)."""
    import httpx2

    make_cold(gw, profile, servers)
    await trio.sleep(0.2)
    headers = {"Authorization": f"Bearer {profile['token']}", "Accept": ACCEPT}
    async with httpx2.AsyncClient(headers=headers, timeout=120.0) as http:
        seconds, _ = await raw_initialize(http, gw.endpoint(profile["slug"]))
    return seconds


# -- the scenario -------------------------------------------------------------------------


@dataclass
class Case:
    label: str
    slug: str
    servers: list[str]
    goal: Goal | None
    subject: list[ColdSample] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)  # slowest own start per round
    baseline_cpu: list[float] = field(default_factory=list)  # its CPU seconds
    bare: list[float] = field(default_factory=list)


async def _baseline_round(own: OwnStarts, case: Case) -> None:
    samples = [await own.start(name) for name in case.servers]
    slowest = max(samples, key=lambda s: s.seconds)
    case.baseline.append(slowest.seconds)
    case.baseline_cpu.append(slowest.cpu)


async def measure(
    gw: env.BenchGateway, own: OwnStarts, cases: list[Case], size: Size, sdk: Path
) -> list[Row]:
    rows: list[Row] = []
    profiles = {case.slug: gw.profile(case.slug, case.servers) for case in cases}
    for index in range(size.rounds):
        for case in cases:
            progress(f"{SCENARIO} {case.label}: round {index + 1}/{size.rounds}")
            profile = profiles[case.slug]
            if index % 2 == 0:
                await _baseline_round(own, case)
            case.subject.append(await cold_start(gw, profile, case.servers))
            if index % 2 == 1:
                await _baseline_round(own, case)
            if case is cases[0] and size.bare:
                case.bare.append(await bare_start(sdk))
    for case in cases:
        row = _case_row(case, size)
        rows.append(row)
        emit(row)
    return rows


def _case_row(case: Case, size: Size) -> Row:
    s = case.subject
    servers_cpu = median([x.servers_cpu for x in s])
    gateway_cpu = median([x.gateway_cpu for x in s])
    seconds = median([x.seconds for x in s])
    others_cpu = median([x.others_cpu for x in s])
    # The cores left to the start by everything else running on the machine meanwhile, and
    # how long the start's CPU (servers + gateway) needs on them at the least.
    available = max(0.1, CORES - others_cpu / seconds)
    extra: dict[str, Any] = {
        "servers": len(case.servers),
        "cores": CORES,
        "servers_cpu_s": round(servers_cpu, 3),
        "gateway_cpu_s": round(gateway_cpu, 3),
        # Busy CPU of everything else on the machine meanwhile (the bench client excluded).
        "others_cpu_s": round(others_cpu, 3),
        "available_cores": round(available, 2),
        "cpu_bound_ms": round((servers_cpu + gateway_cpu) / available * 1e3, 1),
        # What the CPU alone needs: every server's start and the gateway's, on every core.
        "cpu_floor_ms": round((servers_cpu + gateway_cpu) / CORES * 1e3, 1),
        # The client's own exchange (connect, initialize, tools/list) on the warm profile.
        "warm_ms": round(median([x.warm for x in s]) * 1e3, 1),
        "first_spawn_ms": round(median([x.first_spawn for x in s]) * 1e3, 1),
        "last_spawn_ms": round(median([x.last_spawn for x in s]) * 1e3, 1),
        "baseline_server_cpu_s": round(median(case.baseline_cpu), 3),
        "baseline": "each server alone via the sandbox launcher (no egress listener), "
        "spawn to initialize answered; the slowest",
        "subject": "SDK client connect + initialize + tools/list on the cold profile",
    }
    if case.bare:
        extra["bare_ms"] = round(median(case.bare) * 1e3, 1)
    return Row(
        SCENARIO,
        case.label,
        "time",
        "ms",
        seconds * 1e3,
        baseline="slowest server alone (sandboxed)",
        baseline_value=median(case.baseline) * 1e3,
        goal=case.goal,
        rounds=size.rounds,
        extra=extra,
    )


async def measure_burst(gw: env.BenchGateway, servers: list[str], size: Size) -> Row:
    profile = gw.profile("cold-burst", servers)
    singles: list[float] = []
    bursts: list[Burst] = []
    for index in range(size.burst_rounds):
        progress(
            f"{SCENARIO} {size.concurrent} concurrent first requests: round "
            f"{index + 1}/{size.burst_rounds}"
        )
        if index % 2 == 0:
            singles.append(await raw_cold(gw, profile, servers))
            bursts.append(await burst(gw, profile, servers, size.concurrent))
        else:
            bursts.append(await burst(gw, profile, servers, size.concurrent))
            singles.append(await raw_cold(gw, profile, servers))
    make_cold(gw, profile, servers)
    expected = len(servers)
    coalesced = all(
        b.spawned == expected and b.logged == expected and b.answered == size.concurrent
        for b in bursts
    )
    verdict = (
        f"coalesced: each round started exactly {expected} sandbox(es) for "
        f"{size.concurrent} concurrent first requests, all answered"
        if coalesced
        else "NOT coalesced: "
        + "; ".join(
            f"{b.spawned} sandboxes seen, {b.logged} logged, {b.answered} answered" for b in bursts
        )
    )
    row = Row(
        SCENARIO,
        f"{expected} servers, {size.concurrent} concurrent first requests",
        "time",
        "ms",
        median([b.all_done for b in bursts]) * 1e3,
        baseline="one first request (raw initialize)",
        baseline_value=median(singles) * 1e3,
        rounds=size.burst_rounds,
        extra={
            "coalesced": coalesced,
            "verdict": verdict,
            "p50_ms": round(median([b.p50 for b in bursts]) * 1e3, 1),
            "warm_burst_ms": round(median([b.warm_all_done for b in bursts]) * 1e3, 1),
            "sandboxes_started": [b.spawned for b in bursts],
            "sandboxes_logged": [b.logged for b in bursts],
            "sessions": [b.sessions for b in bursts],
            "value": "time until all requests were answered (raw initialize POSTs)",
        },
    )
    emit(row)
    if not coalesced:
        progress(f"{SCENARIO}: {verdict}")
    return row


def run(quick: bool) -> list[Row]:
    size = QUICK if quick else FULL
    sdk = env.stage_sdk()
    most = max(size.cases)
    sdk_names = [f"sdkecho{i}" for i in range(1, most + 1)]
    light_names = [f"light{i}" for i in range(1, most + 1)]
    definitions = {name: env.sandboxed_echo(sdk) for name in sdk_names}
    definitions.update({name: light_server(size.light_delay) for name in light_names})
    cases = [
        Case(
            f"{n} server{'s' if n > 1 else ''}",
            f"cold-{n}",
            sdk_names[:n],
            Goal("ratio", "<=", 1.3) if n > 1 else None,
        )
        for n in size.cases
    ]
    light = Case(
        f"{most} light servers ({size.light_delay:g} s idle start, no SDK)",
        f"cold-light-{most}",
        light_names,
        None,
    )
    with env.gateway(definitions, SVC_LOG_LEVEL="INFO") as gw:

        async def main() -> list[Row]:
            own = OwnStarts(definitions)
            async with own.open():
                rows = await measure(gw, own, [*cases, light], size, sdk)
            rows.append(await measure_burst(gw, sdk_names, size))
            return rows

        return trio.run(main)


if __name__ == "__main__":
    import sys

    from bench.common import table

    print(table(run(quick="--quick" in sys.argv)))
