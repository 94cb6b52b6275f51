"""Helpers for the gateway tests: real gateway processes and sign-in through the real provider.

Imported by name (the tests have no packages); the fixtures live in ``tests/conftest.py``.

The gateway always runs as its own process (``python -m svcgate serve``), configured only
through ``SVC_*`` variables, and every sign-in goes through the identity provider over HTTP.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import httpx2

from devidp.provider import DevIdP

START_TIMEOUT = 30.0
CLIENT_ID = "svcgate-test"
# A raw MCP initialize request (2025-06-18 handshake) and the Accept header it needs.
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}
ACCEPT = "application/json, text/event-stream"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Gateway:
    """A running ``svcgate serve`` process."""

    proc: subprocess.Popen[str]
    url: str
    log_path: Path
    env: dict[str, str]
    stdout_lines: queue.Queue[str] = field(default_factory=queue.Queue)

    @property
    def origin(self) -> str:
        return self.url

    def client(self, **kwargs: object) -> httpx2.Client:
        return httpx2.Client(base_url=self.url, timeout=20.0, **kwargs)  # type: ignore[arg-type]

    pump: threading.Thread | None = None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout)
        if self.pump is not None:
            self.pump.join(timeout=timeout)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return code

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_gateway(
    tmp: Path,
    *,
    idp: DevIdP | None,
    extra_env: dict[str, str] | None = None,
    port: int | None = None,
    data_dir: Path | None = None,
    expect_ready: bool = True,
) -> Gateway:
    port = port or free_port()
    data_dir = data_dir or tmp / "data"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "SVC_LISTEN": f"127.0.0.1:{port}",
        "SVC_DATA_DIR": str(data_dir),
        "SVC_BEARER_TOKEN": "legacy-test-token-0123456789",
        "SVC_ECHO_BIN": "/bin/true",
        # Never the default /var/lib/svcgate-images: each gateway gets its own image store.
        "SVC_IMAGE_DIR": str(tmp / "images"),
        # The default metrics listener (127.0.0.1:9464) would collide between test gateways.
        "SVC_METRICS_LISTEN": "off",
        "PYTHONUNBUFFERED": "1",
    }
    if idp is not None:
        env.update(
            {
                "SVC_OIDC_ISSUER": idp.issuer,
                "SVC_OIDC_CLIENT_ID": CLIENT_ID,
                "SVC_OIDC_REDIRECT_URL": f"http://127.0.0.1:{port}/api/auth/callback",
            }
        )
    env.update(extra_env or {})
    log_path = tmp / f"gateway-{port}.log"
    log_file = log_path.open("a")
    proc = subprocess.Popen(
        [sys.executable, "-m", "svcgate", "serve"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=log_file,
        text=True,
    )
    log_file.close()
    gw = Gateway(proc=proc, url=f"http://127.0.0.1:{port}", log_path=log_path, env=env)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            gw.stdout_lines.put(line.rstrip("\n"))
        gw.stdout_lines.put("")

    gw.pump = threading.Thread(target=pump, daemon=True)
    gw.pump.start()
    if expect_ready:
        try:
            line = gw.stdout_lines.get(timeout=START_TIMEOUT)
        except queue.Empty:
            gw.stop(signal.SIGKILL)
            raise RuntimeError(f"gateway did not start:\n{gw.log_text()}") from None
        if not line.startswith("svcgate: listening on "):
            gw.stop(signal.SIGKILL)
            raise RuntimeError(f"gateway did not start ({line!r}):\n{gw.log_text()}")
    return gw


@dataclass
class LoginResult:
    response: httpx2.Response
    session: str | None
    flow_cookie: str


def begin_login(gw: Gateway, next_path: str | None = None) -> tuple[str, str]:
    """Start a flow: return (flow cookie value, authorize URL)."""
    params = {"next": next_path} if next_path is not None else {}
    with gw.client() as client:
        response = client.get("/api/auth/login", params=params)
    assert response.status_code == 302, response.text
    flow = response.cookies.get("svc_flow")
    assert flow
    return flow, response.headers["location"]


def authorize(authorize_url: str, username: str, password: str | None = None) -> str:
    """Sign in at the identity provider's form; return the callback URL it redirects to."""
    page = httpx2.get(authorize_url, timeout=10.0)
    assert page.status_code == 200, page.text
    parts = urlsplit(authorize_url)
    form = dict(parse_qsl(parts.query))
    form.update({"username": username, "password": password or username})
    action = f"{parts.scheme}://{parts.netloc}{parts.path}"
    response = httpx2.post(action, data=form, timeout=10.0)
    assert response.status_code == 302, response.text
    location: str = response.headers["location"]
    return location


def finish_login(gw: Gateway, callback_url: str, flow: str | None, **headers: str) -> LoginResult:
    parts = urlsplit(callback_url)
    cookie_header = {"Cookie": f"svc_flow={flow}"} if flow else {}
    with gw.client() as client:
        response = client.get(f"{parts.path}?{parts.query}", headers={**cookie_header, **headers})
    return LoginResult(response, response.cookies.get("svc_session"), flow or "")


def login(gw: Gateway, username: str, password: str | None = None) -> str:
    """Sign in through the real identity provider; return the ``svc_session`` value."""
    flow, url = begin_login(gw)
    result = finish_login(gw, authorize(url, username, password), flow)
    assert result.response.status_code == 302, result.response.text
    assert result.session
    return result.session


def api(gw: Gateway, session: str | None) -> httpx2.Client:
    """A client that sends the session cookie and a same-origin ``Origin`` on writes."""
    cookies = {"svc_session": session} if session else {}
    return gw.client(headers={"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())})


def run_cli(
    *args: str, data_dir: Path, extra_env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``svcgate ARGS`` (an operator command) against the daemon using ``data_dir``."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SVC_DATA_DIR": str(data_dir)}
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, "-m", "svcgate", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
