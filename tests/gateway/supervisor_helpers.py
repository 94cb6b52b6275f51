"""Helpers for the sandbox supervisor and operator socket tests (real bwrap, as root)."""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from process_support import processes_with

from sandbox.limits import CgroupManager, detect_cgroups
from svcgate.legacy_spec import legacy_spec_factory
from svcgate.supervisor import (
    SandboxHandle,
    SandboxKey,
    SandboxOwner,
    SandboxSupervisor,
    SpecFactory,
    SupervisorConfig,
    launcher_prefix,
)

REPO = Path(__file__).resolve().parents[2]
ECHO_SOURCE = REPO / "svcgate" / "examples" / "echo_server.py"


def copy_echo_server(directory: Path) -> Path:
    """The repository's echo server, copied where the sandbox uid can read it."""
    target = directory / "echo_server.py"
    shutil.copy(ECHO_SOURCE, target)
    target.chmod(0o755)
    return target


def unique_server(base: str = "echo") -> str:
    """A server name that also marks the sandbox's processes (it is in their argv)."""
    return f"{base}-{secrets.token_hex(4)}"


def leftovers(state_dir: Path, markers: tuple[str, ...] = ()) -> dict[str, Any]:
    """Everything a supervisor with ``state_dir`` could have leaked; empty means clean."""
    prefix = launcher_prefix(state_dir)
    host = detect_cgroups()
    netns_dir = Path("/var/run/netns")
    found = {
        "netns": sorted(p.name for p in netns_dir.glob(f"{prefix}*")) if netns_dir.exists() else [],
        "cgroups": CgroupManager(host).find(prefix) if host.mode != "none" else [],
        "scratch": sorted(p.name for p in (state_dir / "scratch").glob("*")),
        "records": sorted(p.name for p in (state_dir / "sandboxes").glob("*")),
        "netns records": sorted(p.name for p in (state_dir / "netns").glob("*")),
        "processes": [pid for marker in markers for pid in processes_with(marker)],
    }
    return {k: v for k, v in found.items() if v}


@asynccontextmanager
async def running_supervisor(state_dir: Path) -> AsyncIterator[SandboxSupervisor]:
    """A started supervisor, cancelled (like the daemon does) when the block exits."""
    supervisor = SandboxSupervisor(SupervisorConfig(state_dir=state_dir, stop_grace=2.0))
    async with trio.open_nursery() as nursery:
        with trio.fail_after(10):
            await nursery.start(supervisor.run)
        try:
            yield supervisor
        finally:
            nursery.cancel_scope.cancel()


def owner_of(profile_id: int) -> SandboxOwner:
    return SandboxOwner(profile_slug=f"profile-{profile_id}", user_id=100 + profile_id)


async def ensure_echo(
    supervisor: SandboxSupervisor, echo_bin: Path, profile_id: int, server: str
) -> SandboxHandle:
    key = SandboxKey(profile_id, server)
    owner = owner_of(profile_id)
    factory: SpecFactory = legacy_spec_factory(echo_bin, key, owner)
    with trio.fail_after(15):
        return await supervisor.ensure(key, factory, owner=owner)


class StdioClient:
    """Newline-delimited JSON-RPC over a sandbox's stdio (MCP's stdio transport)."""

    def __init__(self, handle: SandboxHandle) -> None:
        self.handle = handle
        self._buffer = b""
        self._next_id = 0

    async def send(self, message: dict[str, Any]) -> None:
        await self.handle.stdin.send_all(json.dumps(message).encode() + b"\n")

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._next_id += 1
        with trio.fail_after(15):
            await self.send(
                {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
            )
            while b"\n" not in self._buffer:
                chunk = await self.handle.stdout.receive_some(65536)
                if not chunk:
                    raise EOFError(f"server closed stdout; stderr: {self.handle.stderr_tail()}")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        reply: dict[str, Any] = json.loads(line)
        assert reply.get("id") == self._next_id, reply
        return reply

    async def initialize(self) -> dict[str, Any]:
        reply = await self.request(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "svcgate-tests", "version": "1"},
            },
        )
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return reply

    async def echo(self, text: str) -> str:
        reply = await self.request("tools/call", {"name": "echo", "arguments": {"text": text}})
        result = reply["result"]
        assert result["isError"] is False, result
        content: str = result["content"][0]["text"]
        return content
