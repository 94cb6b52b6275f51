"""The README's first command (``svcgate demo``) and secrets staying out of logs."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

import httpx2
from gateway_support import Gateway, api, authorize, free_port, login

INIT = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "demo-test", "version": "1"},
}


def test_demo_starts_with_a_local_identity_provider_and_demo_users(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "svcgate", "demo", "--port", str(port), "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        banner = ""
        while "Stop with Ctrl-C" not in banner:
            banner += lines.get(timeout=60)
        sign_in = re.search(r"Sign in:\s+(\S+)", banner)
        assert sign_in is not None
        assert "alice/alice (admin)" in banner
        assert "bob/bob (user)" in banner
        url = urlsplit(sign_in.group(1))
        with httpx2.Client(base_url=f"{url.scheme}://{url.netloc}", timeout=20) as client:
            start = client.get(f"{url.path}?{url.query}")
            assert start.status_code == 302
            callback = urlsplit(authorize(start.headers["location"], "alice"))
            done = client.get(
                f"{callback.path}?{callback.query}",
                headers={"Cookie": f"svc_flow={start.cookies['svc_flow']}"},
            )
            assert done.status_code == 302
            assert done.headers["location"] == "/api/me"
            session = done.cookies["svc_session"]
            me = client.get("/api/me", headers={"Cookie": f"svc_session={session}"})
            assert me.json()["user"]["role"] == "admin"
            # The sample server answers on the legacy MCP endpoint, in its sandbox.
            legacy = re.search(r"Legacy MCP:\s+(\S+)\s+\(Authorization: Bearer (\S+)\)", banner)
            assert legacy is not None
            listed = client.post(
                urlsplit(legacy.group(1)).path,
                json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT},
                headers={
                    "Authorization": f"Bearer {legacy.group(2)}",
                    "Accept": "application/json, text/event-stream",
                },
                timeout=60,
            )
            assert listed.status_code == 200, listed.text
            assert '"serverInfo"' in listed.text
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        reader.join(timeout=10)
        if proc.stdout:
            proc.stdout.close()


def test_tokens_and_cookies_never_reach_the_log(gateway: Gateway) -> None:
    session = login(gateway, "bob")
    with api(gateway, session) as client:
        client.get("/api/me")
        client.get("/api/me", params={"access_token": "svc_query_canary_123456"})
        client.post("/api/auth/logout")
    with gateway.client() as client:
        client.post("/mcp", headers={"Authorization": "Bearer svc_header_canary_654321"})
        client.post("/mcp", params={"access_token": "svc_query_canary_123456"})
        client.post("/mcp", headers={"Cookie": "svc_session=cookie_canary_777"})
    text = gateway.log_text()
    for secret in (
        session,
        "svc_query_canary_123456",
        "svc_header_canary_654321",
        "cookie_canary_777",
        gateway.env["SVC_BEARER_TOKEN"],
    ):
        assert secret not in text
