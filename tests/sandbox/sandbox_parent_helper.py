"""A stand-in gateway for the SIGKILL test: starts one sandbox, reports it, then idles.

Run as ``python sandbox_parent_helper.py STATE_DIR PREFIX PROBE_DIR MARKER``. Prints one JSON
line with the sandbox's host pids and resources, then sleeps until killed. The test kills it
with SIGKILL and checks that the sandbox dies with it (bwrap --die-with-parent).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

from sandbox import Bind, LauncherConfig, SandboxSpec, open_launcher


async def main(state_dir: Path, prefix: str, probe_dir: str, marker: str) -> None:
    spec = SandboxSpec(
        command=("/usr/bin/python3", "/probe/probe.py", marker),
        label="orphan-probe",
        binds=(Bind(probe_dir, "/probe"),),
        scratch="/scratch",
    )
    async with open_launcher(LauncherConfig(state_dir=state_dir, prefix=prefix)) as launcher:
        sb = await launcher.start(spec)
        # Make sure the command is running (not just bwrap) before reporting.
        await sb.stdin.send_all(b'{"op": "daemon"}\n')
        reply = await sb.stdout.receive_some(4096)
        report = {
            "name": sb.name,
            "pids": sb.host_pids(),
            "netns": sb.netns_name,
            "cgroup": [str(d) for d in sb.cgroup.dirs] if sb.cgroup else [],
            "scratch": str(sb.scratch_dir),
            "reply": reply.decode(),
        }
        print(json.dumps(report), flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4])
