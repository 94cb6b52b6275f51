"""Health endpoints and Prometheus metrics, on real gateway processes (docs/observability.md).

- ``/healthz`` and ``/readyz`` on the public listener: no authentication, no detail, 405 for
  other methods; ``/readyz`` turns 503 when the database file is damaged under the running
  gateway or when the identity provider is down, while ``/healthz`` stays 200.
- The metrics listener (``SVC_METRICS_LISTEN``) is a separate socket: the public port's
  ``/metrics`` is the legacy data plane (bearer token required), ``off`` opens no socket.
- After one request on every surface (legacy ``/mcp``, a profile with real sandboxed
  servers, ``/api``, health), an egress denial and a sandbox that cannot start, the
  exposition holds every metric with its label set, and no label carries a token or slug.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
import trio.testing
from data_plane_support import ECHO, PROBE, PYTHON, mcp_client, text_of
from gateway_support import ACCEPT, CLIENT_ID, INIT, Gateway, api, free_port, login, start_gateway
from process_support import public_tmpdir
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from supervisor_helpers import running_supervisor

from devidp.provider import DevIdP
from sandbox import SandboxSpec
from svcgate.asgi_io import Message, Receive, Scope, Send
from svcgate.egress.policy import DECISIONS
from svcgate.health import IDP_TTL, STORE_TTL, WAIT, Readiness, store_probe
from svcgate.metrics import Metrics, serve_metrics
from svcgate.settings import SettingsError, settings_from_env
from svcgate.store import open_store
from svcgate.supervisor import SandboxKey, SandboxOwner, SandboxSpawnError

ROOT = Path(__file__).resolve().parents[2]
NETPROBE = ROOT / "tests" / "fixtures" / "netprobe_server.py"
LEGACY = "legacy-test-token-0123456789"
SLUG = "metrics-slug-a7"
BLOCKED = "blocked.example.test"
POLL = 15.0


def _poll(what: str, check: Callable[[], Any], within: float = POLL) -> Any:
    """Poll an external process's observable state until ``check`` returns a truthy value."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {within}s (last: {value!r})")
        time.sleep(0.05)


def listening_ports(pid: int) -> dict[int, str]:
    """TCP ports ``pid`` listens on in its own network namespace, with the bound address."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports: dict[int, str] = {}
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                ports[int(port, 16)] = address
    return ports


def scrape(port: int) -> dict[str, list[Sample]]:
    response = httpx2.get(f"http://127.0.0.1:{port}/metrics", timeout=10.0)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    families = text_string_to_metric_families(response.text)
    return {family.name: list(family.samples) for family in families}


def value(samples: list[Sample], name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


def _assert_health(gw: Gateway, path: str, status: int) -> None:
    with gw.client() as client:
        response = client.get(path)
    assert response.status_code == status, (path, response.text)
    assert response.json() == {"status": "ok" if status == 200 else "unavailable"}
    assert response.headers["cache-control"] == "no-store"


# -- the gateway with real servers ---------------------------------------------------------


@dataclass
class Env:
    gateway: Gateway
    metrics_port: int
    profile: dict[str, Any]
    session: str


def _servers(stage: Path) -> dict[str, Any]:
    for source in (PROBE, NETPROBE, ECHO):
        shutil.copy(source, stage / source.name)
        (stage / source.name).chmod(0o755)

    def entry(name: str, source: Path) -> dict[str, Any]:
        dest = f"/opt/server/{name}/{source.name}"
        return {"command": [PYTHON, dest], "binds": [{"source": str(source), "dest": dest}]}

    return {
        "servers": {
            "probe": entry("probe", stage / PROBE.name),
            "netprobe": entry("netprobe", stage / NETPROBE.name),  # no egress rules at all
            # Its files are missing: bwrap cannot build the mount tree and gives up.
            "ghost": entry("ghost", stage / "gone" / "server.py"),
        }
    }


@pytest.fixture(scope="module")
def env(idp: DevIdP, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    stage = public_tmpdir("metrics")
    servers_file = stage / "servers.json"
    servers_file.write_text(json.dumps(_servers(stage)))
    metrics_port = free_port()
    gateway = start_gateway(
        tmp_path_factory.mktemp("metrics"),
        idp=idp,
        extra_env={
            "SVC_ECHO_BIN": str(stage / ECHO.name),
            "SVC_SERVERS_FILE": str(servers_file),
            "SVC_SANDBOX_DIR": str(stage / "sandboxes"),
            "SVC_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
        },
    )
    try:
        session = login(gateway, "bob")
        with api(gateway, session) as client:
            created = client.post(
                "/api/profiles",
                json={"name": "metrics", "slug": SLUG},
                headers={"Origin": gateway.origin},
            )
            assert created.status_code == 201, created.text
            profile: dict[str, Any] = created.json()
            bundle = client.put(
                f"/api/profiles/{profile['id']}/servers",
                json={"servers": ["probe", "netprobe", "ghost"]},
                headers={"Origin": gateway.origin},
            )
            assert bundle.status_code == 200, bundle.text
        yield Env(gateway, metrics_port, profile, session)
    finally:
        assert gateway.stop() == 0, gateway.log_text()[-3000:]
        shutil.rmtree(stage, ignore_errors=True)
    # The listener went with the gateway.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", metrics_port), 1).close()


@pytest.mark.root
def test_health_needs_no_authentication_and_says_nothing_more(env: Env) -> None:
    _assert_health(env.gateway, "/healthz", 200)
    _assert_health(env.gateway, "/readyz", 200)  # the store reads, the provider answers
    with env.gateway.client() as client:
        head = client.head("/readyz")
        assert head.status_code == 200 and head.content == b""
        # Exact paths only: anything else under them is the legacy data plane.
        assert client.get("/healthz/x").status_code == 401
        for method in ("POST", "PUT", "DELETE"):
            for path in ("/healthz", "/readyz"):
                response = client.request(method, path, content=b"{}")
                assert response.status_code == 405, (method, path)
                assert response.json()["error"]["code"] == "method_not_allowed"
                assert set(response.json()) == {"error"}
                assert "GET" in response.headers["allow"]


@pytest.mark.root
def test_metrics_have_their_own_listener_on_loopback(env: Env) -> None:
    ports = listening_ports(env.gateway.proc.pid)
    public = int(env.gateway.url.rsplit(":", 1)[1])
    assert set(ports) == {public, env.metrics_port}
    assert ports[env.metrics_port] == "0100007F"  # 127.0.0.1
    # The public port's /metrics is the legacy MCP endpoint: a bearer token is required.
    with env.gateway.client() as client:
        response = client.get("/metrics")
    assert response.status_code == 401
    assert "svcgate_" not in response.text
    base = f"http://127.0.0.1:{env.metrics_port}"
    assert httpx2.get(f"{base}/metrics", timeout=10).status_code == 200
    assert httpx2.get(f"{base}/", timeout=10).status_code == 404
    assert httpx2.get(f"{base}/metrics/x", timeout=10).status_code == 404
    assert httpx2.post(f"{base}/metrics", timeout=10).status_code == 405


async def _use_every_surface(env: Env) -> None:
    token = env.profile["token"]
    async with mcp_client(f"{env.gateway.url}/mcp/p/{SLUG}", token) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert "probe_echo" in names and "netprobe_raw_proxy" in names
        assert not any(n.startswith("ghost_") for n in names)
        assert text_of(await client.call_tool("probe_echo", {"text": "hi"})) == "hi"
        connect = f"CONNECT {BLOCKED}:443 HTTP/1.1\r\nHost: {BLOCKED}:443\r\n\r\n".encode()
        result = await client.call_tool(
            "netprobe_raw_proxy", {"data_b64": base64.b64encode(connect).decode(), "timeout": 5}
        )
        answer = json.loads(text_of(result))
        assert answer["ok"], answer
        reply = base64.b64decode(answer["response_b64"])
        assert reply.startswith(b"HTTP/1.1 403") and b"deny_host" in reply, reply

    def legacy_call() -> None:
        with httpx2.Client(timeout=60.0) as http:
            response = http.post(
                f"{env.gateway.url}/mcp",
                json=INIT,
                headers={"Authorization": f"Bearer {LEGACY}", "Accept": ACCEPT},
            )
        assert response.status_code == 200, response.text

    await trio.to_thread.run_sync(legacy_call)


@pytest.mark.root
async def test_every_metric_is_exposed_with_bounded_labels(env: Env) -> None:
    await _use_every_surface(env)
    with env.gateway.client() as client:
        assert client.get("/healthz").status_code == 200

    # The egress audit sink writes within a fraction of a second: wait for that batch.
    def audited() -> dict[str, list[Sample]] | None:
        families = scrape(env.metrics_port)
        written = value(
            families["svcgate_audit_write_seconds"], "svcgate_audit_write_seconds_count"
        )
        return families if written > 0 else None

    families = await trio.to_thread.run_sync(lambda: _poll("an audit write", audited))

    requests = [s for s in families["svcgate_http_requests"] if s.name.endswith("_total")]
    assert {frozenset(s.labels) for s in requests} == {frozenset({"surface", "method", "code"})}
    assert {s.labels["surface"] for s in requests} == {"mcp_profile", "mcp_legacy", "api", "health"}
    assert value(requests, "svcgate_http_requests_total", surface="api", code="201") >= 1
    assert value(requests, "svcgate_http_requests_total", surface="mcp_legacy", code="200") >= 1
    assert value(requests, "svcgate_http_requests_total", surface="mcp_profile", code="200") >= 1
    assert value(requests, "svcgate_http_requests_total", surface="health", method="GET") >= 1

    durations = families["svcgate_http_request_duration_seconds"]
    counted = {s.labels["surface"] for s in durations if s.name.endswith("_count") and s.value}
    assert counted == {"mcp_profile", "mcp_legacy", "api", "health"}
    assert {frozenset(s.labels) for s in durations if s.name.endswith("_bucket")} == {
        frozenset({"surface", "le"})
    }

    # The profile runtime and the legacy one are warm; their sandboxes run.
    assert value(families["svcgate_warm_runtimes"], "svcgate_warm_runtimes") >= 2
    sandboxes = families["svcgate_sandboxes"]
    assert {s.labels["state"] for s in sandboxes} == {"starting", "running", "stopping", "exited"}
    assert value(sandboxes, "svcgate_sandboxes", state="running") >= 3  # probe, netprobe, echo

    # ghost's bind source is missing: bwrap gives up either before the launcher lets it run
    # (a spawn failure) or right after (an exit), a race that the count follows; the
    # in-process test below counts a spawn failure deterministically.
    spawn = families["svcgate_sandbox_spawn_failures"]
    assert [(s.name, s.labels) for s in spawn] == [("svcgate_sandbox_spawn_failures_total", {})]

    decisions = [s for s in families["svcgate_egress_decisions"] if s.name.endswith("_total")]
    assert {s.labels["decision"] for s in decisions} == set(DECISIONS)
    assert value(decisions, "svcgate_egress_decisions_total", decision="deny_host") >= 1

    audit = families["svcgate_audit_write_seconds"]
    assert value(audit, "svcgate_audit_write_seconds_sum") > 0
    assert value(audit, "svcgate_audit_write_seconds_bucket", le="+Inf") >= 1

    for family in families.values():
        assert all(s.name.startswith("svcgate_") for s in family)
    secrets = {LEGACY, env.profile["token"], env.session, SLUG, "/mcp", "bob", "ghost", BLOCKED}
    labels = {v for family in families.values() for s in family for v in s.labels.values()}
    assert not [v for v in labels if any(secret in v for secret in secrets)], labels


# -- readiness failures ----------------------------------------------------------------------


def _wreck_by_deleting(database: Path) -> None:
    for path in database.parent.glob(f"{database.name}*"):
        path.unlink()


def _wreck_by_overwriting(database: Path) -> None:
    # What a botched restore or a failing disk leaves: the header is no longer SQLite's.
    with database.open("r+b") as file:
        file.write(b"\0" * 100)
    wal = database.with_name(f"{database.name}-wal")
    if wal.exists():
        wal.write_bytes(b"")


@pytest.mark.parametrize("wreck", [_wreck_by_deleting, _wreck_by_overwriting])
def test_readyz_is_503_when_the_database_cannot_be_read(
    wreck: Callable[[Path], None], tmp_path: Path
) -> None:
    gw = start_gateway(tmp_path, idp=None)
    try:
        _assert_health(gw, "/readyz", 200)
        wreck(tmp_path / "data" / "svcgate.db")

        def unavailable() -> bool:
            with gw.client() as client:
                return client.get("/readyz").status_code == 503

        _poll("readiness failing", unavailable)
        _assert_health(gw, "/readyz", 503)
        _assert_health(gw, "/healthz", 200)  # alive all the same: no restart for a bad disk
        assert "readiness: the database is unavailable" in gw.log_text()
    finally:
        gw.stop()


def test_readyz_is_503_while_the_identity_provider_is_down(tmp_path: Path) -> None:
    provider = DevIdP(host="127.0.0.1", port=0, client_id=CLIENT_ID)
    provider.start()
    try:
        gw = start_gateway(tmp_path, idp=provider)  # discovery succeeded at start
    finally:
        provider.stop()
    try:
        _assert_health(gw, "/readyz", 503)
        _assert_health(gw, "/healthz", 200)
        assert "readiness: the identity provider is unavailable" in gw.log_text()
    finally:
        gw.stop()


# -- the metrics listener's settings ---------------------------------------------------------

BASE = {"SVC_BEARER_TOKEN": "t", "SVC_LISTEN": "0.0.0.0:8080"}


def test_metrics_listener_defaults_to_loopback() -> None:
    assert settings_from_env(BASE).metrics_listen == ("127.0.0.1", 9464)
    assert settings_from_env({**BASE, "SVC_METRICS_LISTEN": "off"}).metrics_listen is None
    assert settings_from_env({**BASE, "SVC_METRICS_LISTEN": "OFF"}).metrics_listen is None
    parsed = settings_from_env({**BASE, "SVC_METRICS_LISTEN": "[::1]:9100"}).metrics_listen
    assert parsed == ("::1", 9100)
    for bad in ("nonsense", "127.0.0.1:99999", "127.0.0.1:8080"):
        with pytest.raises(SettingsError) as caught:
            settings_from_env({**BASE, "SVC_METRICS_LISTEN": bad})
        assert caught.value.variable == "SVC_METRICS_LISTEN"


def test_off_opens_no_metrics_socket(tmp_path: Path) -> None:
    gw = start_gateway(tmp_path, idp=None, extra_env={"SVC_METRICS_LISTEN": "off"})
    try:
        assert set(listening_ports(gw.proc.pid)) == {int(gw.url.rsplit(":", 1)[1])}
    finally:
        assert gw.stop() == 0


def test_a_busy_metrics_port_stops_the_start_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "svcgate", "serve"],
            env={
                "PATH": "/usr/bin:/bin",
                "SVC_DATA_DIR": str(tmp_path / "data"),
                "SVC_IMAGE_DIR": str(tmp_path / "images"),
                "SVC_BEARER_TOKEN": "t",
                "SVC_LISTEN": f"127.0.0.1:{free_port()}",
                "SVC_METRICS_LISTEN": f"127.0.0.1:{port}",
            },
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("svcgate: SVC_METRICS_LISTEN: cannot listen on"), result.stderr
    assert "listening" not in result.stdout


# -- in process: request accounting, readiness checks, the listener's lifetime ----------------


def _sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def _disconnected() -> Message:
    return {"type": "http.disconnect"}


def _scope(method: str = "GET") -> Scope:
    return {"type": "http", "method": method, "path": "/mcp/p/some-slug", "headers": []}


async def test_a_stream_is_counted_when_it_starts_and_timed_when_it_ends() -> None:
    metrics = Metrics()
    sent: list[Message] = []
    streaming, finish = trio.Event(), trio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        streaming.set()
        await finish.wait()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def send(message: Message) -> None:
        sent.append(message)

    labels = {"surface": "mcp_profile", "method": "GET", "code": "200"}
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                metrics.observe_request, "mcp_profile", app, _scope(), _disconnected, send
            )
            await streaming.wait()
            assert _sample(metrics, "svcgate_http_requests_total", **labels) == 1
            count = "svcgate_http_request_duration_seconds_count"
            assert _sample(metrics, count, surface="mcp_profile") == 0
            finish.set()
    assert _sample(metrics, count, surface="mcp_profile") == 1
    assert [m["type"] for m in sent] == ["http.response.start", *["http.response.body"] * 2]


async def test_a_failed_handler_counts_as_500_and_a_cancelled_one_not_at_all() -> None:
    metrics = Metrics()

    async def broken(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("bug")

    async def sink(message: Message) -> None:
        pass

    with pytest.raises(RuntimeError):
        await metrics.observe_request("api", broken, _scope("BREW"), _disconnected, sink)
    # An unknown method is "other": clients cannot mint label values.
    labels = {"surface": "api", "method": "other", "code": "500"}
    assert _sample(metrics, "svcgate_http_requests_total", **labels) == 1

    async def waits(scope: Scope, receive: Receive, send: Send) -> None:
        await trio.sleep_forever()

    with trio.CancelScope() as scope:
        scope.cancel()
        await metrics.observe_request("health", waits, _scope(), _disconnected, sink)
    text = metrics.exposition().decode()
    assert 'surface="health"' not in text


async def test_a_hanging_probe_costs_at_most_two_seconds_and_is_cached(
    autojump_clock: trio.abc.Clock,
) -> None:
    calls = 0

    async def database() -> str | None:
        return None

    async def provider() -> str | None:
        nonlocal calls
        calls += 1
        await trio.sleep_forever()

    readiness = Readiness(database, provider)
    started = trio.current_time()
    assert await readiness.ready() is False
    assert trio.current_time() - started <= WAIT
    assert await readiness.ready() is False  # the timeout was cached as a failure
    assert calls == 1
    await trio.sleep(IDP_TTL)
    assert await readiness.ready() is False
    assert calls == 2


async def test_concurrent_requests_share_one_probe_and_recover_after_its_ttl(
    autojump_clock: trio.abc.Clock,
) -> None:
    answers = ["disk gone", None]
    calls = 0

    async def database() -> str | None:
        nonlocal calls
        calls += 1
        await trio.sleep(0.5)
        return answers[min(calls, len(answers)) - 1]

    readiness = Readiness(database)
    results: list[bool] = []

    async def ask() -> None:
        results.append(await readiness.ready())

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(ask)
    assert results == [False] * 5 and calls == 1
    await trio.sleep(STORE_TTL / 2)
    assert await readiness.ready() is False and calls == 1
    await trio.sleep(STORE_TTL)
    assert await readiness.ready() is True and calls == 2


class _NoRuntimes:
    def counts(self) -> dict[str, int]:
        return {"warm": 0, "starting": 0}


@pytest.mark.root
async def test_a_failed_spawn_is_counted_once_for_all_its_waiters() -> None:
    state = public_tmpdir("metrics-sup")

    async def broken() -> SandboxSpec:
        raise LookupError("server has no manifest")

    async def wait_for_spawn() -> None:
        with pytest.raises(SandboxSpawnError, match="no manifest"):
            await supervisor.ensure(SandboxKey(3, "ghost"), broken, owner=SandboxOwner("p", 1))

    try:
        async with running_supervisor(state) as supervisor:
            metrics = Metrics()
            metrics.watch(_NoRuntimes(), supervisor)
            assert _sample(metrics, "svcgate_sandbox_spawn_failures_total") == 0
            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    for _ in range(3):
                        nursery.start_soon(wait_for_spawn)
            assert _sample(metrics, "svcgate_sandbox_spawn_failures_total") == 1
            states = ("starting", "running", "stopping", "exited")
            assert [_sample(metrics, "svcgate_sandboxes", state=s) for s in states] == [0] * 4
            await wait_for_spawn()  # not cached: tried, and counted, again
            assert _sample(metrics, "svcgate_sandbox_spawn_failures_total") == 2
    finally:
        shutil.rmtree(state, ignore_errors=True)


async def test_the_store_probe_reads_the_file_afresh(tmp_path: Path) -> None:
    database = tmp_path / "svcgate.db"
    async with open_store(database):
        assert await store_probe(database)() is None
        (tmp_path / "empty.db").write_bytes(b"")
        (tmp_path / "junk.db").write_bytes(b"\0" * 4096)
        assert await store_probe(tmp_path / "missing.db")() is not None
        assert "schema version 0" in str(await store_probe(tmp_path / "empty.db")())
        assert "cannot read it" in str(await store_probe(tmp_path / "junk.db")())
    assert not (tmp_path / "missing.db").exists()  # read-only: never created


async def test_the_metrics_listener_closes_when_cancelled_mid_request() -> None:
    port = free_port()
    serving = partial(
        serve_metrics, ("127.0.0.1", port), Metrics(), shutdown_trigger=trio.sleep_forever
    )
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(serving)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n")  # headers unfinished
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        assert await stream.receive_some() == b""  # the server closed the connection
        await stream.aclose()
        with pytest.raises(OSError, match="all attempts to connect"):
            await trio.open_tcp_stream("127.0.0.1", port)
