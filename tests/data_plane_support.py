"""Helpers for data-plane tests: a gateway with real sandboxed servers, profiles, MCP clients.

The servers run for real in bubblewrap sandboxes: the repository's echo server (legacy
``SVC_ECHO_BIN``), several instances of the in-sandbox probe (``tests/fixtures/probe_server.py``)
defined through ``SVC_SERVERS_FILE`` (``curated`` with a manifest, ``lately`` changing its tool
list while it starts), one server that cannot start, one whose start waits for a gate file
the test opens, and (when node is installed, :func:`node_support.node_available`) the npm
servers ``everything`` (``server-everything``) and ``memory`` (``server-memory``, its
graph in ``/home/sandbox/memory.jsonl``), run by the host's node with the pinned
``tests/node/node_modules`` tree bound read-only.

Bind sources must be reachable by the sandbox's unprivileged host uid, and a CI checkout may
live under a 0700 directory, so the server files are staged into a public temp directory (and
node_modules is copied to one when the checkout's own tree is not traversable:
:func:`node_support.sandbox_node_modules_source`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import trio
from gateway_support import Gateway, api, login, start_gateway
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from node_support import (
    MEMORY_FILE_ENV,
    SANDBOX_NODE,
    SANDBOX_NODE_MODULES,
    everything_command,
    memory_command,
    node_available,
    node_executable,
    sandbox_node_modules_source,
)
from process_support import public_tmpdir

from devidp.provider import DevIdP

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "tests" / "fixtures" / "probe_server.py"
ECHO = ROOT / "svcgate" / "examples" / "echo_server.py"
PYTHON = "/usr/bin/python3"
# Where server-memory keeps its graph inside the sandbox (the writable, per-sandbox home).
MEMORY_FILE = "/home/sandbox/memory.jsonl"


def _probe(stage: Path, name: str, **env: str) -> dict[str, Any]:
    dest = f"/opt/server/{name}/probe_server.py"
    return {
        "command": [PYTHON, dest],
        "binds": [{"source": str(stage / "probe_server.py"), "dest": dest}],
        "env": {"PROBE_NAME": name, **env},
    }


def stage_servers(stage: Path) -> dict[str, Any]:
    """Copy the server files into ``stage`` and return the SVC_SERVERS_FILE document."""
    shutil.copy(PROBE, stage / "probe_server.py")
    shutil.copy(ECHO, stage / "echo_server.py")
    (stage / "echo_server.py").chmod(0o755)
    gate = stage / "gate"
    gate.mkdir(exist_ok=True)
    for path in (stage / "probe_server.py", gate):
        path.chmod(0o755 if path.is_dir() else 0o644)
    slow = _probe(stage, "slow")
    slow["command"] = [
        "/bin/sh",
        "-c",
        "while [ ! -e /opt/gate/open ]; do sleep 0.05; done; exec "
        f"{PYTHON} /opt/server/slow/probe_server.py",
    ]
    slow["binds"].append({"source": str(gate), "dest": "/opt/gate"})
    curated = _probe(stage, "curated")
    curated["tools"] = [
        {"name": "echo", "default": True},
        {"name": "add", "default": False},
        {"name": "env", "default": False},
    ]
    servers: dict[str, Any] = {
        "probe": _probe(
            stage, "probe", PROBE_EXTRA_TOOLS="search,a.b", PROBE_RESOURCE_URI="shared://doc"
        ),
        "probe2": _probe(
            stage, "probe2", PROBE_EXTRA_TOOLS="search", PROBE_RESOURCE_URI="shared://doc"
        ),
        "curated": curated,
        # Adds tool "late" (list_changed) just after answering the gateway's first tools/list.
        "lately": _probe(stage, "lately", PROBE_LATE_TOOL="late"),
        "slow": slow,
        "broken": {"command": ["/usr/bin/false"]},
    }
    if node_available():
        servers.update(node_servers())
    return {"servers": servers}


def node_servers() -> dict[str, Any]:
    """``everything`` and ``memory``: npm servers under the host's node, node_modules read-only."""
    binds = [{"source": str(sandbox_node_modules_source()), "dest": SANDBOX_NODE_MODULES}]
    # The sandbox sees the host's /usr: run the node found on PATH when it lives there.
    host_node = os.path.realpath(node_executable() or SANDBOX_NODE)
    node = host_node if host_node.startswith("/usr/") else SANDBOX_NODE
    return {
        "everything": {
            "command": everything_command(SANDBOX_NODE_MODULES, node),
            "binds": binds,
        },
        "memory": {
            "command": memory_command(SANDBOX_NODE_MODULES, node),
            "binds": binds,
            "env": {MEMORY_FILE_ENV: MEMORY_FILE},
        },
    }


@dataclass
class DataPlaneGateway:
    gateway: Gateway
    stage: Path
    admin_session: str
    user_session: str
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.gateway.url

    def endpoint(self, slug: str) -> str:
        return f"{self.gateway.url}/mcp/p/{slug}"

    def open_gate(self) -> None:
        (self.stage / "gate" / "open").write_text("")

    def close_gate(self) -> None:
        (self.stage / "gate" / "open").unlink(missing_ok=True)

    def create_profile(
        self, slug: str, servers: list[str], *, session: str | None = None
    ) -> dict[str, Any]:
        with api(self.gateway, session or self.user_session) as client:
            created = client.post(
                "/api/profiles",
                json={"name": slug, "slug": slug},
                headers={"Origin": self.gateway.origin},
            )
            assert created.status_code == 201, created.text
            profile: dict[str, Any] = created.json()
            self.set_servers(profile, servers, session=session)
        self.profiles[slug] = profile
        return profile

    def set_servers(
        self, profile: dict[str, Any], servers: list[str], *, session: str | None = None
    ) -> None:
        with api(self.gateway, session or self.user_session) as client:
            response = client.put(
                f"/api/profiles/{profile['id']}/servers",
                json={"servers": servers},
                headers={"Origin": self.gateway.origin},
            )
            assert response.status_code == 200, response.text

    def rotate(self, profile: dict[str, Any]) -> str:
        with api(self.gateway, self.user_session) as client:
            response = client.post(
                f"/api/profiles/{profile['id']}/token", headers={"Origin": self.gateway.origin}
            )
            assert response.status_code == 200, response.text
            token: str = response.json()["token"]
        profile["token"] = token
        return token

    def delete(self, profile: dict[str, Any]) -> None:
        with api(self.gateway, self.user_session) as client:
            response = client.delete(
                f"/api/profiles/{profile['id']}", headers={"Origin": self.gateway.origin}
            )
            assert response.status_code == 204, response.text

    def runtime(self, profile: dict[str, Any], *, admin: bool = True) -> dict[str, Any]:
        session = self.admin_session if admin else self.user_session
        with api(self.gateway, session) as client:
            response = client.get(f"/api/profiles/{profile['id']}")
            assert response.status_code == 200, response.text
            runtime: dict[str, Any] = response.json()["runtime"]
            return runtime

    def wait_runtime(
        self, profile: dict[str, Any], done: Callable[[dict[str, Any]], bool], timeout: float = 30
    ) -> dict[str, Any]:
        """Poll the admin view of ``profile``'s runtime until ``done`` holds (or fail)."""
        deadline = time.monotonic() + timeout
        while True:
            runtime = self.runtime(profile)
            if done(runtime):
                return runtime
            if time.monotonic() > deadline:
                raise AssertionError(f"runtime of {profile['slug']} is still {runtime}")
            time.sleep(0.05)


def start_data_plane_gateway(
    tmp: Path,
    idp: DevIdP,
    *,
    extra_servers: Mapping[str, Mapping[str, Any]] | None = None,
    **extra_env: str,
) -> DataPlaneGateway:
    """A gateway serving every server of :func:`stage_servers`, plus ``extra_servers``
    (added to, or replacing entries of, the servers file); ``extra_env``: more settings."""
    stage = public_tmpdir("dp")
    document = stage_servers(stage)
    document["servers"].update({name: dict(body) for name, body in (extra_servers or {}).items()})
    servers_file = stage / "servers.json"
    servers_file.write_text(json.dumps(document))
    sandboxes = public_tmpdir("dp-sb")
    gateway = start_gateway(
        tmp,
        idp=idp,
        extra_env={
            "SVC_ECHO_BIN": str(stage / "echo_server.py"),
            "SVC_SERVERS_FILE": str(servers_file),
            "SVC_SANDBOX_DIR": str(sandboxes / "state"),
            **extra_env,
        },
    )
    return DataPlaneGateway(
        gateway=gateway,
        stage=stage,
        admin_session=login(gateway, "alice"),
        user_session=login(gateway, "bob"),
    )


@contextmanager
def data_plane_gateway(
    tmp: Path,
    idp: DevIdP,
    *,
    extra_servers: Mapping[str, Mapping[str, Any]] | None = None,
    **extra_env: str,
) -> Iterator[DataPlaneGateway]:
    """A module's data-plane gateway: started, and stopped cleanly (exit 0) at the end."""
    gateway = start_data_plane_gateway(tmp, idp, extra_servers=extra_servers, **extra_env)
    try:
        yield gateway
    finally:
        gateway.open_gate()  # nothing may stay parked on the gate at shutdown
        assert gateway.gateway.stop() == 0


@asynccontextmanager
async def mcp_client(
    url: str, token: str | None, *, mode: str = "legacy", **kwargs: Any
) -> AsyncIterator[Client]:
    """The official Python SDK client on ``url`` with a bearer token."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60.0)) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode=mode, **kwargs) as client:
            yield client


def text_of(result: Any) -> str:
    """The text of a tools/call result (its text content parts, joined)."""
    return "".join(getattr(c, "text", "") for c in result.content)


class Notifications:
    """A message_handler that hands tools/list_changed notifications to the test."""

    def __init__(self) -> None:
        self.send, self.receive = trio.open_memory_channel[str](math.inf)

    async def __call__(self, message: Any) -> None:
        root = getattr(message, "root", message)
        method = getattr(root, "method", None)
        if isinstance(method, str):
            await self.send.send(method)

    async def wait_for(self, method: str, within: float = 20) -> None:
        with trio.fail_after(within):
            async for seen in self.receive:
                if seen == method:
                    return
