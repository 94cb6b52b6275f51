"""Helpers shared by the sandbox tests (imported by name; tests have no packages)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from process_support import processes_with

from sandbox.launcher import Sandbox
from sandbox.limits import CgroupManager, detect_cgroups

PROBE_PYTHON = "/usr/bin/python3"  # Debian's: host mode binds /usr, not /root/.pyenv


def leftovers(state_dir: Path, prefix: str, marker: str | None = None) -> dict[str, Any]:
    """Everything a test run could have leaked; empty values mean clean."""
    host = detect_cgroups()
    cgroups = CgroupManager(host).find(prefix) if host.mode != "none" else []
    netns_dir = Path("/var/run/netns")
    found = {
        "netns": sorted(p.name for p in netns_dir.glob(f"{prefix}*")) if netns_dir.exists() else [],
        "cgroups": cgroups,
        "scratch": sorted(p.name for p in (state_dir / "scratch").glob("*")),
        "records": sorted(p.name for p in (state_dir / "sandboxes").glob("*")),
        "processes": processes_with(marker) if marker else [],
    }
    return {k: v for k, v in found.items() if v}


@dataclass
class Probe:
    """Talks to the probe script inside a sandbox."""

    sandbox: Sandbox
    _buffer: bytes = b""

    async def call(self, op: str, within: float = 10.0, **args: Any) -> dict[str, Any]:
        with trio.fail_after(within):
            await self.sandbox.stdin.send_all(json.dumps({"op": op, **args}).encode() + b"\n")
            line = await self.readline()
        if line is None:
            raise EOFError(f"probe closed stdout; stderr: {self.sandbox.stderr_tail()}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    async def readline(self) -> bytes | None:
        while b"\n" not in self._buffer:
            chunk = await self.sandbox.stdout.receive_some(65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line
