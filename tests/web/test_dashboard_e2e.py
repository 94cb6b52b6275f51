"""End-to-end tests of the dashboard: Playwright driving Debian's chromium against the real stack.

Everything is real and local: the development identity provider (devidp), a gateway process
with sandboxed servers (``tests/data_plane_support.stage_servers``) and a signed registry
index on a local OCI registry (so the admin installs a server by ref from the UI), and the
dashboard built with ``next build`` and served by ``next start`` on port 3000. The browser
always uses http://localhost:3000 (one origin for cookies and ``Origin`` checks: the gateway's
``SVC_PUBLIC_URL`` and OIDC redirect URL point there).

The gateway's address is fixed at build time (``SVC_GATEWAY_URL``), so a free port is picked
first, the dashboard is built for it, and the gateway is started on it; phase 2 restarts the
gateway on the same port without OIDC.

The servers file adds ``netprobe`` (``tests/fixtures/netprobe_server.py``, the in-sandbox network
probe of tests/egress) with the egress list ``EGRESS_ALLOWED`` only; that name is mapped
(``SVC_EGRESS_HOSTS``, loopback carved out) to a small loopback upstream of this module, so
the egress proxy allows it, and any other host is ``deny_host``.

1. ``test_sse_streams_through_the_dashboard``: an MCP tools/call whose SSE response carries
   a server-to-client request (sampling) before its result; the call cannot finish until
   the client answers that request, so reading it proves the rewrite streams. A buffering
   hop makes this test fail (checked with a buffering proxy in front of port 3000).
   ``test_dashboard_does_not_compress`` checks ``compress: false`` itself: the SDK's streams
   carry ``Cache-Control: no-transform``, which Next's gzip already leaves alone.
   ``test_real_egress_decisions_reach_the_audit``: bob's ``egress-alarm`` profile (netprobe
   only) sends, from the sandbox, a request to a host not in its egress list and one to
   ``EGRESS_ALLOWED``; the proxy answers ``deny_host`` and ``allow``, and both decisions
   reach ``GET /api/audit`` as bob (written in batches: polled).
2. ``test_playwright_oidc``: ``playwright test`` phase ``oidc`` (web/e2e/oidc); the same
   profile (``E2E_EGRESS_*``) lets ``05-egress-alarm.spec.ts`` provoke fresh decisions and
   check that the denial is alarming on the Overview and the audit log.
3. ``test_playwright_control_plane_disabled``: phase ``disabled`` (web/e2e/disabled).

Screenshots land in web/e2e-artifacts/screenshots (gitignored). Run::

    .venv/bin/python -m pytest tests/web -s

``E2E_PLAYWRIGHT_ARGS`` adds arguments to ``playwright test`` (e.g. ``--grep credential``);
``E2E_WEB_DIR`` tests another copy of ``web/`` (with its own node_modules).
Without /usr/bin/chromium or web/node_modules the module is skipped, except under CI
(``CI`` set), where that is a failure.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import queue
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import pytest
from data_plane_support import ECHO, PYTHON, stage_servers
from gateway_support import Gateway, api, free_port, login, start_gateway
from image_support import echo_image
from process_support import public_tmpdir
from registry_support import LocalRegistry

from devidp.provider import DevIdP
from devidp.users import DEFAULT_USERS
from devregistry.publish import Publisher, tool_pins

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parents[2]
# Another checkout of the dashboard can be tested instead (e.g. a copy with a changed config).
WEB = Path(os.environ.get("E2E_WEB_DIR") or ROOT / "web").resolve()
NEXT = WEB / "node_modules" / ".bin" / "next"
PLAYWRIGHT = WEB / "node_modules" / ".bin" / "playwright"
CHROMIUM = Path("/usr/bin/chromium")
DASHBOARD_PORT = 3000
DASHBOARD = f"http://localhost:{DASHBOARD_PORT}"
SCREENSHOTS = WEB / "e2e-artifacts" / "screenshots"
BUILD_TIMEOUT = 900.0
START_TIMEOUT = 60.0
E2E_TIMEOUT = 1800.0
SSE_READ_TIMEOUT = 20.0
ADMIN, USER = "alice", "bob"
INSTALL_NAME, INSTALL_VERSION = "pyecho", "1.0.0"
IMAGE_COMMAND = ["/usr/bin/python3", "/app/echo_server.py"]
PROTOCOL = "2025-06-18"
ACCEPT = "application/json, text/event-stream"
SAMPLING = "sampling/createMessage"
# Servers of the servers file the specs rely on (see data_plane_support.stage_servers).
BUNDLE = ("echo", "probe")
LISTED = ("echo", "probe", "probe2", "slow")
# The egress probe: its sandbox may reach EGRESS_ALLOWED (a loopback upstream) and nothing else.
NETPROBE = ROOT / "tests" / "fixtures" / "netprobe_server.py"
EGRESS_SERVER, EGRESS_PROFILE = "netprobe", "egress-alarm"
EGRESS_ALLOWED, EGRESS_DENIED = "api.example.test", "blocked.example.test"
EGRESS_DENY = "deny_host"
EGRESS_AUDIT_TIMEOUT = 15.0


def _missing_toolchain() -> list[str]:
    missing = []
    if not CHROMIUM.exists():
        missing.append(f"{CHROMIUM} (Debian package chromium: scripts/system-packages)")
    if shutil.which("node") is None:
        missing.append("node on PATH")
    for tool in (NEXT, PLAYWRIGHT):
        if not tool.exists():
            missing.append(f"{tool} (run scripts/web-check)")
    return missing


@pytest.fixture(scope="module", autouse=True)
def toolchain() -> None:
    missing = _missing_toolchain()
    if not missing:
        return
    reason = "dashboard e2e needs: " + "; ".join(missing)
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def _port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _tail(text: str, lines: int = 150) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _node_env(**extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SVC_", "E2E_", "NEXT_", "PLAYWRIGHT_"))
    }
    env.update(
        {
            "NEXT_TELEMETRY_DISABLED": "1",
            "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1",
            "NO_COLOR": "1",
            "FORCE_COLOR": "0",
        }
    )
    env.update(extra)
    return env


# -- processes ---------------------------------------------------------------------------------


@dataclass
class Service:
    """A long-running child in a process group of its own, stopped by that group's id."""

    name: str
    proc: subprocess.Popen[str]
    log_path: Path
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    pump: threading.Thread | None = None

    @classmethod
    def start(
        cls, name: str, argv: list[str], *, cwd: Path, env: dict[str, str], log: Path
    ) -> Service:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        service = cls(name, proc, log)

        def pump() -> None:
            assert proc.stdout is not None
            with log.open("a") as sink:
                for line in proc.stdout:
                    sink.write(line)
                    sink.flush()
                    service.lines.put(line.rstrip("\n"))
            service.lines.put(None)

        service.pump = threading.Thread(target=pump, daemon=True)
        service.pump.start()
        return service

    def wait_for(self, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(remaining, 0.01))
            except queue.Empty:
                line = ""
            if line is None:
                raise RuntimeError(f"{self.name} exited:\n{_tail(self.log_text())}")
            if needle in line:
                return
            if remaining <= 0:
                raise RuntimeError(f"{self.name} not ready in {timeout:g} s:\n{self.log_text()}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)
        if self.pump is not None:
            self.pump.join(timeout=15)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# -- the stack -----------------------------------------------------------------------------


@dataclass
class Stack:
    idp: DevIdP
    tmp: Path
    port: int
    base_env: dict[str, str]
    gateway: Gateway
    user_session: str
    dashboard: Service | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def restart_without_oidc(self) -> None:
        """Phase 2: the same port, no OIDC: the control plane answers control_plane_disabled."""
        assert self.gateway.stop() == 0, self.gateway.log_text()
        (self.tmp / "disabled").mkdir()
        self.gateway = start_gateway(
            self.tmp / "disabled",
            idp=None,
            port=self.port,
            data_dir=self.tmp / "disabled" / "data",
            extra_env=self.base_env,
        )
        # The dashboard's proxy may hold connections to the old process: go through it once.
        response = httpx2.get(f"{DASHBOARD}/api/me", timeout=20)
        for _ in range(2):
            if response.headers.get("content-type", "").startswith("application/json"):
                break
            response = httpx2.get(f"{DASHBOARD}/api/me", timeout=20)
        assert response.json()["error"]["code"] == "control_plane_disabled", response.text


def _stage_netprobe(stage: Path) -> dict[str, Any]:
    """The ``netprobe`` entry of the servers file (staged readable by the sandbox's uid)."""
    shutil.copy(NETPROBE, stage / "netprobe_server.py")
    (stage / "netprobe_server.py").chmod(0o644)
    dest = f"/opt/server/{EGRESS_SERVER}/netprobe_server.py"
    return {
        "command": [PYTHON, dest],
        "binds": [{"source": str(stage / "netprobe_server.py"), "dest": dest}],
        "egress": [EGRESS_ALLOWED],
    }


@contextlib.contextmanager
def _loopback_upstream() -> Iterator[int]:
    """An HTTP server on 127.0.0.1 answering 200 ``ok`` to every GET; yields its port."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = b"ok\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=15)


@pytest.fixture(scope="module")
def gateway_port() -> int:
    port = free_port()
    if port == DASHBOARD_PORT:
        port = free_port()
    return port


@pytest.fixture(scope="module")
def dashboard_build(gateway_port: int, tmp_path_factory: pytest.TempPathFactory) -> float:
    """``next build`` for this gateway port; returns the seconds it took."""
    log = tmp_path_factory.mktemp("web") / "next-build.log"
    started = time.monotonic()
    result = subprocess.run(
        [str(NEXT), "build"],
        cwd=WEB,
        env=_node_env(SVC_GATEWAY_URL=f"http://127.0.0.1:{gateway_port}"),
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=False,
    )
    took = time.monotonic() - started
    log.write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        pytest.fail(f"next build failed ({took:.0f} s):\n{_tail(result.stdout + result.stderr)}")
    print(f"next build: {took:.1f} s")
    return took


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A local OCI registry holding the echo server image, in a signed index as pyecho@1.0.0."""
    tmp = tmp_path_factory.mktemp("web-registry")
    publisher = Publisher(tmp / "index")
    images = public_tmpdir("web-images")
    with LocalRegistry() as local:
        parts = echo_image()
        digest = local.push_image("svcgate/pyecho", parts.layers, parts.config)
        release = {
            "image": local.image_ref("svcgate/pyecho", digest),
            "manifest": {"tools": tool_pins(ECHO), "command": IMAGE_COMMAND},
        }
        publisher.publish({INSTALL_NAME: {"versions": {INSTALL_VERSION: release}}}, strict=True)
        try:
            yield {
                "SVC_REGISTRY_INDEX": publisher.index_url,
                "SVC_REGISTRY_KEYS": publisher.public_key_text,
                "SVC_IMAGE_DIR": str(images / "store"),
            }
        finally:
            shutil.rmtree(images, ignore_errors=True)


@pytest.fixture(scope="module")
def stack(
    idp: DevIdP,
    gateway_port: int,
    dashboard_build: float,
    registry: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    if _port_in_use(DASHBOARD_PORT):
        pytest.fail(f"port {DASHBOARD_PORT} is in use: the dashboard e2e needs it")
    tmp = tmp_path_factory.mktemp("web-stack")
    with contextlib.ExitStack() as cleanup:
        stage = public_tmpdir("web-dp")
        cleanup.callback(shutil.rmtree, stage, ignore_errors=True)
        sandboxes = public_tmpdir("web-sb")
        cleanup.callback(shutil.rmtree, sandboxes, ignore_errors=True)
        servers = stage_servers(stage)
        servers["servers"][EGRESS_SERVER] = _stage_netprobe(stage)
        servers_file = stage / "servers.json"
        servers_file.write_text(json.dumps(servers))
        (stage / "gate" / "open").write_text("")  # the "slow" server starts at once
        # Outlives both gateways (closed after them: the exit stack unwinds in reverse).
        upstream_port = cleanup.enter_context(_loopback_upstream())
        base_env = {
            "SVC_ECHO_BIN": str(stage / "echo_server.py"),
            "SVC_SERVERS_FILE": str(servers_file),
            "SVC_SANDBOX_DIR": str(sandboxes / "state"),
            # EGRESS_ALLOWED is the loopback upstream: map it, and carve that address out.
            "SVC_EGRESS_HOSTS": f"{EGRESS_ALLOWED}=127.0.0.1:{upstream_port}",
            "SVC_EGRESS_ALLOW_CIDRS": "127.0.0.1/32",
            **registry,
        }
        oidc_env = {
            **base_env,
            "SVC_OIDC_REDIRECT_URL": f"{DASHBOARD}/api/auth/callback",
            "SVC_PUBLIC_URL": DASHBOARD,
        }
        (tmp / "oidc").mkdir()
        gateway = start_gateway(tmp / "oidc", idp=idp, port=gateway_port, extra_env=oidc_env)
        stack = Stack(idp, tmp, gateway_port, base_env, gateway, user_session="")

        def stop_gateway() -> None:
            # Phase 2 replaces the gateway: stop whichever runs now; it must exit cleanly.
            code = stack.gateway.stop()
            assert code == 0, _tail(stack.gateway.log_text())

        cleanup.callback(stop_gateway)
        # Users exist before the browser runs (the admin views as bob; bob is also signed in
        # through the browser by the specs).
        stack.user_session = login(gateway, USER)
        login(gateway, "carol")
        stack.timings["build"] = dashboard_build
        started = time.monotonic()
        dashboard = Service.start(
            "next start",
            [str(NEXT), "start", "-p", str(DASHBOARD_PORT), "-H", "127.0.0.1"],
            cwd=WEB,
            env=_node_env(),
            log=tmp / "next-start.log",
        )
        cleanup.callback(dashboard.stop)
        dashboard.wait_for("Ready", START_TIMEOUT)
        stack.dashboard = dashboard
        response = httpx2.get(f"{DASHBOARD}/login", timeout=30)
        assert response.status_code == 200, response.text[:500]
        stack.timings["start"] = time.monotonic() - started
        cleanup.callback(
            lambda: print("timings:", ", ".join(f"{k} {v:.1f} s" for k, v in stack.timings.items()))
        )
        yield stack


def run_playwright(stack: Stack, phase: str, **extra: str) -> None:
    """``playwright test`` for ``phase``; fails the test with its output unless it exits 0.

    ``extra``: more E2E_* variables for the specs.
    """
    user = next(u for u in DEFAULT_USERS if u.username == USER)
    env = _node_env(
        E2E_PHASE=phase,
        E2E_BASE_URL=DASHBOARD,
        E2E_IDP_URL=stack.idp.issuer,
        E2E_ADMIN=ADMIN,
        E2E_USER=USER,
        E2E_USER_NAME=user.name,
        E2E_USER_EMAIL=user.email,
        E2E_BUNDLE=",".join(BUNDLE),
        E2E_SERVERS=",".join(LISTED),
        E2E_CREDENTIAL_SERVER="probe",
        E2E_INSTALL_REF=f"{INSTALL_NAME}@{INSTALL_VERSION}",
        E2E_SCREENSHOTS=str(SCREENSHOTS),
        **extra,
    )
    if os.environ.get("CI"):
        env["CI"] = os.environ["CI"]
    argv = [str(PLAYWRIGHT), "test", *shlex.split(os.environ.get("E2E_PLAYWRIGHT_ARGS", ""))]
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=WEB, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    output: list[str] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            print(line, end="")
            output.append(line)
        code = proc.wait(timeout=E2E_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    took = time.monotonic() - started
    stack.timings[f"e2e {phase}"] = took
    if code != 0:
        dashboard_log = stack.dashboard.log_text() if stack.dashboard else ""
        pytest.fail(
            f"playwright phase {phase} exited {code} after {took:.0f} s:\n"
            f"{_tail(''.join(output), 300)}\n"
            f"--- gateway log (tail) ---\n{_tail(stack.gateway.log_text(), 60)}\n"
            f"--- next start log (tail) ---\n{_tail(dashboard_log, 40)}"
        )


# -- streaming through the rewrite ------------------------------------------------------------


def _mcp_headers(token: str, session: str | None = None) -> dict[str, str]:
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": ACCEPT,
        "Content-Type": "application/json",
        "MCP-Protocol-Version": PROTOCOL,
    }
    if session is not None:
        headers["Mcp-Session-Id"] = session
    return headers


def _messages(response: httpx2.Response) -> list[dict[str, Any]]:
    if response.headers.get("content-type", "").startswith("application/json"):
        return [response.json()]
    return [
        json.loads(line[5:])
        for line in response.text.splitlines()
        if line.startswith("data:") and line[5:].strip()
    ]


def _sse_messages(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The JSON-RPC messages of an SSE stream, each as soon as its event is complete."""
    data: list[str] = []
    for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line == "" and data:
            text = "\n".join(data)
            data = []
            if text.strip():
                yield json.loads(text)


def test_sse_streams_through_the_dashboard(stack: Stack) -> None:
    slug = "sse-through-3000"
    with api(stack.gateway, stack.user_session) as client:
        created = client.post("/api/profiles", json={"name": slug, "slug": slug})
        assert created.status_code == 201, created.text
        profile = created.json()
        put = client.put(f"/api/profiles/{profile['id']}/servers", json={"servers": ["probe"]})
        assert put.status_code == 200, put.text
    token = profile["token"]
    url = f"{DASHBOARD}/mcp/p/{slug}"
    timeout = httpx2.Timeout(60.0, read=SSE_READ_TIMEOUT)
    with httpx2.Client(timeout=timeout) as client, httpx2.Client(timeout=60.0) as other:
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL,
                "capabilities": {"sampling": {}},
                "clientInfo": {"name": "sse-probe", "version": "1"},
            },
        }
        response = client.post(url, json=init, headers=_mcp_headers(token))
        assert response.status_code == 200, response.text
        assert _messages(response)[0]["result"]["protocolVersion"] == PROTOCOL
        session = response.headers["mcp-session-id"]
        done = client.post(
            url,
            json={"jsonrpc": "2.0", "method": "notifications/initialized"},
            headers=_mcp_headers(token, session),
        )
        assert done.status_code == 202, done.text

        call = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "probe_sample", "arguments": {"prompt": "2+2?"}},
        }
        with contextlib.ExitStack() as streaming:
            try:
                stream = streaming.enter_context(
                    client.stream("POST", url, json=call, headers=_mcp_headers(token, session))
                )
                messages = _sse_messages(stream.iter_lines())
                # The tool cannot finish before we answer its sampling request: its headers
                # and this event arrive only if every hop streams the response.
                request = next(m for m in messages if m.get("method") == SAMPLING)
            except StopIteration:
                pytest.fail(f"the stream ended without a {SAMPLING} request")
            except httpx2.ReadTimeout:
                pytest.fail(
                    f"no SSE event through {DASHBOARD} within {SSE_READ_TIMEOUT:g} s: "
                    "the dashboard's rewrite buffers text/event-stream (is compress: false set?)"
                )
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            # compress: false: Next must not gzip (and so buffer) the stream.
            assert "content-encoding" not in stream.headers, stream.headers
            answer = {
                "jsonrpc": "2.0",
                "id": request["id"],
                "result": {
                    "role": "assistant",
                    "content": {"type": "text", "text": "four"},
                    "model": "e2e-model",
                },
            }
            posted = other.post(url, json=answer, headers=_mcp_headers(token, session))
            assert posted.status_code == 202, posted.text
            result = next(m for m in messages if m.get("id") == 7)
        assert "error" not in result, result
        text = "".join(part.get("text", "") for part in result["result"]["content"])
        assert "four" in text and "e2e-model" in text, result
        other.delete(url, headers=_mcp_headers(token, session))


def test_dashboard_does_not_compress(stack: Stack) -> None:
    """``compress: false``: with it, Next gzips (and so buffers) proxied event streams that do
    not say ``Cache-Control: no-transform``. The MCP SDK's streams do say it, so the test
    above passes either way; this one checks the setting itself, on a page and on the rewrite.
    """
    gzip = {"Accept-Encoding": "gzip, deflate, br"}
    page = httpx2.get(f"{DASHBOARD}/login", headers=gzip, timeout=30)
    assert page.status_code == 200
    assert "content-encoding" not in page.headers, page.headers
    proxied = httpx2.get(f"{DASHBOARD}/api/openapi.json", headers=gzip, timeout=30)
    assert proxied.status_code == 200, proxied.text[:300]
    assert "content-encoding" not in proxied.headers, proxied.headers


# -- real egress decisions ---------------------------------------------------------------------


@dataclass
class EgressProfile:
    """Bob's profile holding only the netprobe server."""

    slug: str
    token: str


@pytest.fixture(scope="module")
def egress_profile(stack: Stack) -> EgressProfile:
    with api(stack.gateway, stack.user_session) as client:
        body = {"name": "Egress alarm", "slug": EGRESS_PROFILE}
        created = client.post("/api/profiles", json=body)
        assert created.status_code == 201, created.text
        profile = created.json()
        put = client.put(
            f"/api/profiles/{profile['id']}/servers", json={"servers": [EGRESS_SERVER]}
        )
        assert put.status_code == 200, put.text
    return EgressProfile(slug=EGRESS_PROFILE, token=profile["token"])


def _rpc(
    client: httpx2.Client, url: str, headers: dict[str, str], message: dict[str, Any]
) -> dict[str, Any]:
    response = client.post(url, json=message, headers=headers)
    assert response.status_code == 200, response.text
    reply = next((m for m in _messages(response) if m.get("id") == message["id"]), None)
    assert reply is not None and "error" not in reply, response.text
    result: dict[str, Any] = reply["result"]
    return result


@dataclass
class ProxyReply:
    status: int
    decision: str  # X-Svcgate-Egress: set on the proxy's own refusals, not on forwarded replies
    body: bytes


def _proxy_get(
    client: httpx2.Client, url: str, headers: dict[str, str], host: str, rpc_id: int
) -> ProxyReply:
    """From the sandbox (netprobe's ``raw_proxy``), a plain GET for http://``host``/ sent to
    the egress proxy; the proxy's answer."""
    raw = f"GET http://{host}/ HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    result = _rpc(
        client,
        url,
        headers,
        {
            "jsonrpc": "2.0",
            "id": rpc_id,
            "method": "tools/call",
            "params": {
                "name": f"{EGRESS_SERVER}_raw_proxy",
                "arguments": {"data_b64": base64.b64encode(raw.encode()).decode(), "timeout": 10},
            },
        },
    )
    text = "".join(part.get("text", "") for part in result["content"])
    assert not result.get("isError"), text
    answer = json.loads(text)
    assert answer["ok"], answer
    head, _, body = base64.b64decode(answer["response_b64"]).partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    fields = {
        name.strip().lower(): value.strip()
        for name, sep, value in (line.partition(":") for line in lines)
        if sep
    }
    status = status_line.split(" ")[1:2]
    assert status and status[0].isdigit(), head
    return ProxyReply(int(status[0]), fields.get("x-svcgate-egress", ""), body)


def _egress_events(stack: Stack, after: int) -> list[dict[str, Any]]:
    """Bob's egress events newer than ``after`` (his own view of the audit log)."""
    with api(stack.gateway, stack.user_session) as client:
        response = client.get("/api/audit", params={"limit": 100})
        assert response.status_code == 200, response.text
        events: list[dict[str, Any]] = response.json()["events"]
    return [e for e in events if e["id"] > after and e["kind"] == "egress"]


def test_real_egress_decisions_reach_the_audit(stack: Stack, egress_profile: EgressProfile) -> None:
    with api(stack.gateway, stack.user_session) as client:
        latest = client.get("/api/audit", params={"limit": 1})
        assert latest.status_code == 200, latest.text
        start = max((e["id"] for e in latest.json()["events"]), default=0)
    url = f"{DASHBOARD}/mcp/p/{egress_profile.slug}"
    token = egress_profile.token
    with httpx2.Client(timeout=60.0) as client:
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "egress-probe", "version": "1"},
            },
        }
        response = client.post(url, json=init, headers=_mcp_headers(token))
        assert response.status_code == 200, response.text
        headers = _mcp_headers(token, response.headers["mcp-session-id"])
        done = client.post(
            url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
        )
        assert done.status_code == 202, done.text
        denied = _proxy_get(client, url, headers, EGRESS_DENIED, 3)
        assert (denied.status, denied.decision) == (403, EGRESS_DENY), denied
        allowed = _proxy_get(client, url, headers, EGRESS_ALLOWED, 4)
        assert (allowed.status, allowed.body) == (200, b"ok\n"), allowed  # the upstream's
        client.delete(url, headers=headers)
    # The egress audit sink writes in batches: poll, bounded.
    expected = {(EGRESS_DENIED, EGRESS_DENY), (EGRESS_ALLOWED, "allow")}
    deadline = time.monotonic() + EGRESS_AUDIT_TIMEOUT
    while True:
        events = [e for e in _egress_events(stack, start) if e["server"] == EGRESS_SERVER]
        seen = {(e["host"], e["decision"]) for e in events}
        if expected <= seen:
            break
        assert time.monotonic() < deadline, f"egress events missing: {expected - seen}; {events}"
        time.sleep(0.1)
    assert all(e["user_id"] and e["profile_id"] for e in events), events


# -- the browser -------------------------------------------------------------------------------


def test_playwright_oidc(stack: Stack, egress_profile: EgressProfile) -> None:
    run_playwright(
        stack,
        "oidc",
        E2E_EGRESS_PROFILE=egress_profile.slug,
        E2E_EGRESS_TOKEN=egress_profile.token,
        E2E_EGRESS_SERVER=EGRESS_SERVER,
        E2E_EGRESS_ALLOWED=EGRESS_ALLOWED,
        E2E_EGRESS_DENIED=EGRESS_DENIED,
        E2E_EGRESS_DECISION=EGRESS_DENY,
    )


def test_playwright_control_plane_disabled(stack: Stack) -> None:
    stack.restart_without_oidc()
    run_playwright(stack, "disabled")
