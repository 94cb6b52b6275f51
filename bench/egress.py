"""Scenario 4: the egress proxy. Plain HTTP and HTTPS-intercepted requests through a real
gateway's egress proxy against the same requests sent directly to the same loopback
upstream: p50/p99 at concurrency 1 and throughput at higher concurrency, alternating proxy
and direct round by round.

What runs where:

- the upstream: a small asyncio server in its own process (HTTP and HTTPS listeners on
  127.0.0.1, a fixed 1 KiB body, keep-alive), identical for both sides. It answers
  ``auth`` instead of ``anon`` in the body when the request carries the credential.
- the subject: a real ``svcgate serve`` (:func:`bench.env.gateway`) with the SDK echo server
  in a bubblewrap sandbox. The server's egress list names the plain host; the owner (bob)
  has a credential for the server whose ``allowed_hosts`` names the secure host, so a
  CONNECT there is intercepted: TLS terminated with a leaf of the gateway CA, the
  credential injected into every inner request, responses scanned for the secret.
  ``SVC_EGRESS_HOSTS`` maps both names to the upstream's loopback ports and
  ``SVC_EGRESS_ALLOW_CIDRS=127.0.0.0/8`` carves out loopback (as the egress tests do);
  ``SVC_EGRESS_RATE`` is raised to its maximum so the per-sandbox rate limit (default
  20/s) does not throttle the benchmark.
- the client: this process. Its proxy-side sockets are created *inside the sandbox's
  network namespace* (setns in a throwaway thread, the socket keeps the namespace) and
  connect to the proxy's in-namespace listener ``127.0.0.1:PORT`` read from the sandboxed
  process's ``HTTP_PROXY``, so the network path is the one a sandboxed server uses (the
  client process itself is not under bwrap). It trusts the CA bundle the gateway hands the
  sandbox (read through ``/proc/<pid>/root``). Direct sockets are ordinary host sockets to
  the upstream's ports; the direct HTTPS client sends the credential itself.
- keep-alive: the proxy keeps a plain-HTTP client connection open across requests and
  keeps its upstream connection for the same target; an intercepted tunnel carries many
  requests over one kept upstream TLS connection. The main cases therefore use one kept
  connection (tunnel) per client; the "new connection" cases open one per request.

Per request the proxy does what the product does in production: a policy decision (for a
plain request to a host on the server's egress list, from the owner's credential row as
read at most ``RECENT_TTL`` seconds before; for an intercepted request, from the row read
afresh, with the vault opened and the response scanned), and an audit event for every
plain request and every tunnel (batched by the egress audit sink, as in the product; an
intercepted tunnel's inner requests are audited only when refused, docs/egress.md). The
run checks that one audit row is written per proxied plain request.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import trio

from bench import env
from bench.common import Goal, Row, emit, latency, median, progress, throughput

SCENARIO = "4 egress proxy"
SERVER = "egressecho"
PLAIN_HOST = "plain.bench.test"
SECURE_HOST = "secure.bench.test"
SECRET = "bench-egress-secret-5c1e0a7d9b"  # noqa: S105 - a bench fixture
BODY_BYTES = 1024
DIRECT = "direct"
CA_BUNDLE = "/svcgate/tls/ca-bundle.pem"  # where the gateway puts its bundle in a sandbox
MODES = {"http": "plain HTTP", "https": "HTTPS intercepted"}
CLIENT_PATH = "sandbox netns socket -> proxy's in-namespace listener (not in-process)"


@dataclass
class Size:
    rounds: int
    calls: int  # sequential requests per latency round on one kept connection
    fresh_calls: int  # sequential requests per round, one new connection each
    seconds: float  # per throughput round
    concurrency: tuple[int, ...]


FULL = Size(rounds=7, calls=2000, fresh_calls=200, seconds=3.0, concurrency=(10, 50))
QUICK = Size(rounds=1, calls=20, fresh_calls=5, seconds=0.3, concurrency=(2,))


# -- the upstream ---------------------------------------------------------------------------

UPSTREAM = r"""
import asyncio, json, ssl, sys

cert, key, secret, size = sys.argv[1], sys.argv[2], sys.argv[3].encode(), int(sys.argv[4])
needle = b"\r\nauthorization: bearer " + secret.lower() + b"\r\n"


def response(tag):
    body = tag + b"." * (size - len(tag))
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n"
    return head % len(body) + body


ANON, AUTH = response(b"anon"), response(b"auth")


class Http(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
        self.buffer = b""

    def data_received(self, data):
        buffer = self.buffer + data
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buffer[: end + 2].lower()
            length = 0
            at = head.find(b"\r\ncontent-length:")
            if at >= 0:
                length = int(head[at + 17 : head.index(b"\r\n", at + 2)])
            if len(buffer) < end + 4 + length:
                break
            buffer = buffer[end + 4 + length :]
            self.transport.write(AUTH if needle in head else ANON)
        self.buffer = buffer


async def main():
    loop = asyncio.get_running_loop()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["http/1.1"])
    plain = await loop.create_server(Http, "127.0.0.1", 0, backlog=512)
    tls = await loop.create_server(Http, "127.0.0.1", 0, ssl=context, backlog=512)
    ports = [s.sockets[0].getsockname()[1] for s in (plain, tls)]
    print(json.dumps({"http": ports[0], "https": ports[1]}), flush=True)
    await asyncio.Event().wait()


asyncio.run(main())
"""


@dataclass
class Upstream:
    http: int
    https: int
    ca_file: Path


def _write_tls_files(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and an ECDSA P-256 leaf for :data:`SECURE_HOST` (like the gateway's
    own leaves); returns (CA file, leaf chain file, leaf key file)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.now(UTC)

    def build(subject: str, issuer: str, public: Any, ca: bool) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(hours=1))
            .not_valid_after(now + timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        build("bench upstream CA", "bench upstream CA", ca_key.public_key(), True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        )
        .sign(ca_key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        build(SECURE_HOST, "bench upstream CA", leaf_key.public_key(), False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(SECURE_HOST)]), False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_file, chain, key = directory / "ca.pem", directory / "leaf.pem", directory / "leaf-key.pem"
    ca_file.write_bytes(ca_cert.public_bytes(pem))
    chain.write_bytes(leaf.public_bytes(pem) + ca_cert.public_bytes(pem))
    key.write_bytes(
        leaf_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    # The CA file is what SVC_EGRESS_UPSTREAM_CA_FILE names (the gateway runs as root); the
    # directory stays private (mkdtemp's 0700), the key with it.
    return ca_file, chain, key


@contextlib.contextmanager
def upstream() -> Iterator[Upstream]:
    """The upstream process; stopped (by its pid) at the end."""
    directory = Path(tempfile.mkdtemp(prefix="svcgate-bench-egress-"))
    ca_file, chain, key = _write_tls_files(directory)
    argv = [sys.executable, "-c", UPSTREAM, str(chain), str(key), SECRET, str(BODY_BYTES)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the upstream exited before listening")
        ports = json.loads(line)
        yield Upstream(ports["http"], ports["https"], ca_file)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, 15)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        for path in (ca_file, chain, key):
            path.unlink(missing_ok=True)
        directory.rmdir()


# -- the two sides --------------------------------------------------------------------------


@dataclass
class Side:
    """How to open one client connection (socket, TLS, CONNECT) and what to send on it."""

    name: str  # "svcgate" or DIRECT
    mode: str  # "http" | "https"
    port: int
    netns_pid: int | None  # create the socket in this process's network namespace
    request: bytes
    expect: bytes  # the body must start with this
    context: ssl.SSLContext | None = field(default=None, repr=False)
    connect: bytes | None = None  # CONNECT first (the proxy's HTTPS side)

    def new_socket(self) -> socket.socket:
        def make() -> socket.socket:
            return socket.socket(socket.AF_INET, socket.SOCK_STREAM)

        sock = make() if self.netns_pid is None else env.in_netns_of(self.netns_pid, make)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


def _parse(buffer: bytes) -> tuple[int, int, int] | None:
    """(status, start of body, body length) of a complete response head, or None."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buffer[: end + 2].lower()
    status = int(head[9:12])
    at = head.find(b"\r\ncontent-length:")
    if at < 0:
        raise RuntimeError(f"response without content-length: {bytes(head[:300])!r}")
    length = int(head[at + 17 : head.index(b"\r\n", at + 2)])
    return status, end + 4, length


def _check(side: Side, buffer: bytes, status: int, start: int) -> None:
    if status != 200 or not buffer.startswith(side.expect, start):
        raise RuntimeError(f"{side.name} {side.mode}: unexpected response {buffer[:400]!r}")


class SyncConnection:
    """A blocking keep-alive client connection (latency rounds: the least client overhead)."""

    def __init__(self, side: Side, sock: socket.socket | None = None) -> None:
        """Connect (on ``sock``, made by :meth:`Side.new_socket`, when given) and do the
        CONNECT and TLS handshake the side needs."""
        self.side = side
        sock = sock or side.new_socket()
        try:
            sock.settimeout(30)
            sock.connect(("127.0.0.1", side.port))
            if side.connect is not None:
                sock.sendall(side.connect)
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = sock.recv(4096)
                    if not chunk:
                        raise RuntimeError("the proxy closed the CONNECT")
                    head += chunk
                _check_connect_reply(head)
            if side.context is not None:
                sock = side.context.wrap_socket(sock, server_hostname=SECURE_HOST)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def call(self) -> None:
        sock = self.sock
        sock.sendall(self.side.request)
        buffer = b""
        while (parsed := _parse(buffer)) is None:
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError(f"{self.side.name} closed the connection")
            buffer += chunk
        status, start, length = parsed
        while len(buffer) < start + length:
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError(f"{self.side.name} closed the connection")
            buffer += chunk
        _check(self.side, buffer, status, start)

    def close(self) -> None:
        self.sock.close()


class AsyncConnection:
    """A trio keep-alive client connection (throughput rounds: many at once)."""

    def __init__(self, side: Side, stream: trio.abc.Stream) -> None:
        self.side = side
        self.stream = stream

    @classmethod
    async def open(cls, side: Side) -> AsyncConnection:
        sock = trio.socket.from_stdlib_socket(side.new_socket())
        try:
            await sock.connect(("127.0.0.1", side.port))
        except BaseException:
            sock.close()
            raise
        stream: trio.abc.Stream = trio.SocketStream(sock)
        try:
            if side.connect is not None:
                await stream.send_all(side.connect)
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        raise RuntimeError("the proxy closed the CONNECT")
                    head += chunk
                _check_connect_reply(head)
            if side.context is not None:
                tls = trio.SSLStream(stream, side.context, server_hostname=SECURE_HOST)
                await tls.do_handshake()
                stream = tls
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        return cls(side, stream)

    async def call(self) -> None:
        stream = self.stream
        await stream.send_all(self.side.request)
        buffer = b""
        while (parsed := _parse(buffer)) is None:
            chunk = await stream.receive_some(65536)
            if not chunk:
                raise RuntimeError(f"{self.side.name} closed the connection")
            buffer += chunk
        status, start, length = parsed
        while len(buffer) < start + length:
            chunk = await stream.receive_some(65536)
            if not chunk:
                raise RuntimeError(f"{self.side.name} closed the connection")
            buffer += chunk
        _check(self.side, buffer, status, start)

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


# -- rounds ---------------------------------------------------------------------------------


def _kept_round(side: Side, calls: int) -> list[float]:
    """``calls`` sequential requests on one kept connection (after a warm-up); seconds each."""
    conn = SyncConnection(side)
    try:
        for _ in range(max(5, calls // 10)):
            conn.call()
        samples = []
        for _ in range(calls):
            start = time.perf_counter()
            conn.call()
            samples.append(time.perf_counter() - start)
        return samples
    finally:
        conn.close()


def _fresh_round(side: Side, calls: int) -> list[float]:
    """``calls`` sequential requests, each on a new connection: TCP connect, CONNECT and
    TLS handshakes, the request and the close are timed; making the socket is not."""
    warmup = max(2, calls // 10)
    samples = []
    for index in range(warmup + calls):
        sock = side.new_socket()
        start = time.perf_counter()
        conn = SyncConnection(side, sock)
        try:
            conn.call()
        finally:
            conn.close()
        if index >= warmup:
            samples.append(time.perf_counter() - start)
    return samples


async def _throughput_round(side: Side, workers: int, seconds: float) -> float:
    connections = [await AsyncConnection.open(side) for _ in range(workers)]
    try:
        for conn in connections:  # warm every connection once
            await conn.call()
        calls: list[Callable[[], Awaitable[object]]] = [conn.call for conn in connections]
        return await throughput(calls, seconds)
    finally:
        for conn in connections:
            await conn.aclose()


# -- the gateway ----------------------------------------------------------------------------


@dataclass
class Sandbox:
    pid: int
    proxy_port: int
    ca_bundle: Path


def _find_sandbox(gw: env.BenchGateway) -> Sandbox:
    found = env.sandbox_processes(gw.pid, env.SANDBOX_ECHO)
    if len(found) != 1:
        raise RuntimeError(f"expected one sandboxed echo server below {gw.pid}, found {found}")
    ((pid, environ),) = found.items()
    proxy = environ.get("HTTP_PROXY", "")
    if not proxy.startswith("http://127.0.0.1:"):
        raise RuntimeError(f"the sandbox has no egress proxy: HTTP_PROXY={proxy!r}")
    bundle = Path(tempfile.mkdtemp(prefix="svcgate-bench-ca-")) / "ca-bundle.pem"
    bundle.write_bytes(Path(f"/proc/{pid}/root{CA_BUNDLE}").read_bytes())
    return Sandbox(pid, int(proxy.rsplit(":", 1)[1]), bundle)


async def _warm(url: str, token: str) -> None:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60.0) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as mcp,
    ):
        result = await mcp.call_tool(f"{SERVER}_echo", {"text": "hello"})
        if result.is_error:
            raise RuntimeError(f"the sandboxed echo server failed: {result}")


def _sides(up: Upstream, box: Sandbox) -> dict[str, dict[str, Side]]:
    def context(cafile: Path) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(cafile))
        ctx.set_alpn_protocols(["http/1.1"])
        return ctx

    plain = f"Host: {PLAIN_HOST}\r\nUser-Agent: svcgate-bench\r\nAccept: */*\r\n"
    secure = f"Host: {SECURE_HOST}\r\nUser-Agent: svcgate-bench\r\nAccept: */*\r\n"
    auth = f"Authorization: Bearer {SECRET}\r\n"
    connect = f"CONNECT {SECURE_HOST}:443 HTTP/1.1\r\nHost: {SECURE_HOST}:443\r\n\r\n".encode()
    return {
        "http": {
            "svcgate": Side(
                "svcgate",
                "http",
                box.proxy_port,
                box.pid,
                f"GET http://{PLAIN_HOST}/v1/ping HTTP/1.1\r\n{plain}\r\n".encode(),
                b"anon",
            ),
            DIRECT: Side(
                DIRECT,
                "http",
                up.http,
                None,
                f"GET /v1/ping HTTP/1.1\r\n{plain}\r\n".encode(),
                b"anon",
            ),
        },
        "https": {
            # The sandbox sends no credential: the proxy injects it (the upstream says "auth").
            "svcgate": Side(
                "svcgate",
                "https",
                box.proxy_port,
                box.pid,
                f"GET /v1/ping HTTP/1.1\r\n{secure}\r\n".encode(),
                b"auth",
                context(box.ca_bundle),
                connect,
            ),
            DIRECT: Side(
                DIRECT,
                "https",
                up.https,
                None,
                f"GET /v1/ping HTTP/1.1\r\n{secure}{auth}\r\n".encode(),
                b"auth",
                context(up.ca_file),
            ),
        },
    }


def _audit_check(gw: env.BenchGateway, side: Side, requests: int) -> float:
    """Audit rows written per proxied plain request (waits for the batched sink)."""
    before = env.newest_audit_id(gw)
    conn = SyncConnection(side)
    try:
        for _ in range(requests):
            conn.call()
    finally:
        conn.close()
    deadline = time.monotonic() + 10
    last, stable_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = env.newest_audit_id(gw)
        if now != last:
            last, stable_since = now, time.monotonic()
        elif now - before >= requests and time.monotonic() - stable_since > 0.5:
            break
        time.sleep(0.1)
    return (last - before) / requests


# -- the scenario ---------------------------------------------------------------------------


def _order(sides: dict[str, Side], index: int) -> list[Side]:
    pair = [sides[DIRECT], sides["svcgate"]]
    return pair if index % 2 == 0 else pair[::-1]


def measure(sides: dict[str, dict[str, Side]], size: Size, extra: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    common = {"client": CLIENT_PATH}

    def add(row: Row) -> None:
        rows.append(row)
        emit(row)

    for mode, label in MODES.items():
        pair = sides[mode]
        p50: dict[str, list[float]] = {DIRECT: [], "svcgate": []}
        p99: dict[str, list[float]] = {DIRECT: [], "svcgate": []}
        for index in range(size.rounds):
            progress(f"{SCENARIO} {mode}: keep-alive latency round {index + 1}/{size.rounds}")
            for side in _order(pair, index):
                stats = latency(_kept_round(side, size.calls))
                p50[side.name].append(stats.p50)
                p99[side.name].append(stats.p99)
        case = f"{label} keep-alive c=1"
        added = [s - d for s, d in zip(p50["svcgate"], p50[DIRECT], strict=True)]
        add(
            Row(
                SCENARIO,
                case,
                "added p50",
                "ms",
                median(added),
                goal=Goal("value", "<=", 0.5) if mode == "http" else None,
                rounds=size.rounds,
                extra={**extra, "per_round_ms": [round(a, 4) for a in added]},
            )
        )
        for metric, values in (("p50", p50), ("p99", p99)):
            add(
                Row(
                    SCENARIO,
                    case,
                    metric,
                    "ms",
                    median(values["svcgate"]),
                    baseline=DIRECT,
                    baseline_value=median(values[DIRECT]),
                    rounds=size.rounds,
                    extra={**common, "requests_per_round": size.calls},
                )
            )

        fresh: dict[str, list[float]] = {DIRECT: [], "svcgate": []}
        for index in range(size.rounds):
            progress(f"{SCENARIO} {mode}: new-connection latency round {index + 1}/{size.rounds}")
            for side in _order(pair, index):
                fresh[side.name].append(latency(_fresh_round(side, size.fresh_calls)).p50)
        what = "new connection" if mode == "http" else "new tunnel"
        add(
            Row(
                SCENARIO,
                f"{label} {what} per request c=1",
                "p50",
                "ms",
                median(fresh["svcgate"]),
                baseline=DIRECT,
                baseline_value=median(fresh[DIRECT]),
                rounds=size.rounds,
                extra={
                    **common,
                    "requests_per_round": size.fresh_calls,
                    "includes": "TCP connect"
                    + (
                        ", CONNECT, TLS handshakes (client-proxy and proxy-upstream)"
                        if mode == "https"
                        else ""
                    ),
                },
            )
        )

        tput: dict[int, dict[str, list[float]]] = {
            c: {DIRECT: [], "svcgate": []} for c in size.concurrency
        }
        for index in range(size.rounds):
            progress(f"{SCENARIO} {mode}: throughput round {index + 1}/{size.rounds}")
            for workers in size.concurrency:
                for side in _order(pair, index):
                    tput[workers][side.name].append(
                        trio.run(_throughput_round, side, workers, size.seconds)
                    )
        for workers in size.concurrency:
            add(
                Row(
                    SCENARIO,
                    f"{label} keep-alive c={workers}",
                    "throughput",
                    "req/s",
                    median(tput[workers]["svcgate"]),
                    baseline=DIRECT,
                    baseline_value=median(tput[workers][DIRECT]),
                    rounds=size.rounds,
                    extra={**common, "connections": workers, "seconds_per_round": size.seconds},
                )
            )
    return rows


@dataclass
class Setup:
    gw: env.BenchGateway
    box: Sandbox
    sides: dict[str, dict[str, Side]]
    settings: dict[str, str]


@contextlib.contextmanager
def setup() -> Iterator[Setup]:
    """The upstream, the gateway with a warm sandboxed server, and the client sides."""
    sdk = env.stage_sdk()
    with contextlib.ExitStack() as stack:
        up = stack.enter_context(upstream())
        server = {
            **env.sandboxed_echo(sdk),
            "egress": [PLAIN_HOST],
            "credential_hosts": [SECURE_HOST],
        }
        settings = {
            "SVC_EGRESS_ALLOW_CIDRS": "127.0.0.0/8",
            "SVC_EGRESS_HOSTS": f"{PLAIN_HOST}=127.0.0.1:{up.http},"
            f"{SECURE_HOST}=127.0.0.1:{up.https}",
            "SVC_EGRESS_UPSTREAM_CA_FILE": str(up.ca_file),
            "SVC_EGRESS_RATE": "100000",
        }
        progress(f"{SCENARIO}: starting the gateway")
        gw = stack.enter_context(env.gateway({SERVER: server}, **settings))
        # Before the sandbox starts: storing a first credential restarts warm runtimes.
        env.put_credential(gw, SERVER, {"secret": SECRET, "allowed_hosts": [SECURE_HOST]})
        profile = gw.profile("egress", [SERVER])
        trio.run(_warm, gw.endpoint("egress"), profile["token"])
        box = _find_sandbox(gw)
        stack.callback(shutil.rmtree, box.ca_bundle.parent, ignore_errors=True)
        yield Setup(gw, box, _sides(up, box), settings)


def run(quick: bool) -> list[Row]:
    size = QUICK if quick else FULL
    with setup() as bench:
        sides = bench.sides
        audit_rows = _audit_check(bench.gw, sides["http"]["svcgate"], 20 if quick else 200)
        progress(f"{SCENARIO}: {audit_rows:.2f} audit rows per proxied plain request")
        extra = {
            "client": "this process; proxy-side sockets made inside the sandbox's network "
            "namespace, connecting to the proxy's in-namespace listener (the path a "
            "sandboxed server uses; the client itself is not under bwrap)",
            "upstream": f"asyncio server in its own process on loopback, {BODY_BYTES}-byte "
            "body, the same for both sides",
            "keep_alive": "one kept client connection (one tunnel for HTTPS) per client; the "
            "proxy keeps its upstream connection (plain HTTP: per client connection and "
            "target; HTTPS: per tunnel)",
            "per_request_work": "a policy decision per request. Plain HTTP to a host on the "
            "server's egress list: decided from the owner's credential row as read at most "
            "1 s before (svcgate.egress.service.RECENT_TTL; only 'allowed without a "
            "credential' is decided that way). HTTPS intercepted: every inner request reads "
            "the row from SQLite, opens the vault, injects the credential and scans the "
            "response. An audit event per plain request and per tunnel (batched sink, "
            "written every 0.2 s)",
            "audit_rows_per_plain_request": round(audit_rows, 3),
            "settings": {"SVC_EGRESS_RATE": bench.settings["SVC_EGRESS_RATE"]},
        }
        return measure(sides, size, extra)


def _check_connect_reply(head: bytes) -> None:
    """The proxy's answer to CONNECT, read up to its blank line, must be 200 and nothing more."""
    if not head.startswith(b"HTTP/1.1 200") or not head.endswith(b"\r\n\r\n"):
        raise RuntimeError(f"CONNECT refused: {head[:400]!r}")


if __name__ == "__main__":
    from bench.common import table

    print(table(run(quick="--quick" in sys.argv)))
