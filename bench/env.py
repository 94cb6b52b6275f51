"""Starting the things a scenario measures: svcgate with sandboxed SDK servers, the direct
SDK server, and the peer proxies (mcp-proxy, fastmcp) from a separate virtual environment.

The gateway is started the way the test suite starts it (``tests/gateway_support``): a real
``svcgate serve`` process, a local OpenID Connect provider for sign-in, profiles created
through the control-plane API, servers in real bubblewrap sandboxes.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import ROOT, progress

ECHO = ROOT / "bench" / "servers" / "sdk_echo.py"
# Outside the checkout (a CI checkout may be private to root): the sandbox uid reads it.
CACHE = Path(os.environ.get("SVC_BENCH_CACHE", "/var/tmp/svcgate-bench"))  # noqa: S108
SANDBOX_PYTHON = "/usr/bin/python3"
SANDBOX_SDK = "/opt/sdk"
SANDBOX_ECHO = "/opt/bench/sdk_echo.py"
# The peers, pinned: what was measured is what is reported.
PEERS = ("mcp-proxy==0.13.0", "fastmcp==3.4.10")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _public(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o755)
    return path


def _closure(name: str) -> list[importlib.metadata.Distribution]:
    """``name``'s distribution and everything it requires (markers for this interpreter)."""
    from packaging.requirements import Requirement

    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = [name]
    while todo:
        key = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if key in seen:
            continue
        try:
            dist = importlib.metadata.distribution(key)
        except importlib.metadata.PackageNotFoundError:
            continue
        seen[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def stage_sdk() -> Path:
    """A directory the sandbox uid can read holding the MCP SDK and its dependencies (copied
    from this interpreter's site-packages; the sandbox's ``/usr/bin/python3`` has the same
    ABI), plus the echo server. Cached by SDK version and echo-server content."""
    version = importlib.metadata.version("mcp")
    stamp = f"{version}-{int(ECHO.stat().st_mtime_ns)}"
    target = CACHE / f"sdk-{stamp}"
    if (target / ".done").exists():
        return target
    progress(f"staging the MCP SDK {version} for the sandboxes in {target}")
    _public(CACHE)
    tmp = Path(tempfile.mkdtemp(prefix="sdk-", dir=CACHE))
    site = tmp / "site"
    for dist in _closure("mcp"):
        for file in dist.files or []:
            source = Path(str(dist.locate_file(file)))
            if ".." in file.parts:
                continue
            if not source.is_file() or "__pycache__" in file.parts:
                continue
            dest = site / file
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest)
    shutil.copy2(ECHO, tmp / "sdk_echo.py")
    # The sandbox mounts this read-only, so Python could not cache bytecode there: compile
    # it now with the sandbox's own interpreter, or every start recompiles the SDK.
    subprocess.run(
        [SANDBOX_PYTHON, "-m", "compileall", "-q", "-j", "0", str(site)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    for path in [tmp, *tmp.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    (tmp / ".done").write_text(stamp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


def sandboxed_echo(sdk: Path, *, extra_tools: int = 0) -> dict[str, Any]:
    """A ``SVC_SERVERS_FILE`` entry: the SDK echo server over stdio in a sandbox."""
    return {
        "command": [SANDBOX_PYTHON, SANDBOX_ECHO],
        "binds": [
            {"source": str(sdk / "site"), "dest": SANDBOX_SDK},
            {"source": str(sdk / "sdk_echo.py"), "dest": SANDBOX_ECHO},
        ],
        "env": {"PYTHONPATH": SANDBOX_SDK, "BENCH_EXTRA_TOOLS": str(extra_tools)},
    }


@dataclass
class BenchGateway:
    """A running svcgate with profiles; see :func:`gateway`."""

    url: str
    dp: Any  # data_plane_support.DataPlaneGateway

    def profile(self, slug: str, servers: list[str]) -> dict[str, Any]:
        profile: dict[str, Any] = self.dp.create_profile(slug, servers)
        return profile

    def endpoint(self, slug: str) -> str:
        return f"{self.url}/mcp/p/{slug}"

    @property
    def pid(self) -> int:
        pid: int = self.dp.gateway.proc.pid
        return pid

    @property
    def database(self) -> Path:
        """The gateway's SQLite database (``<SVC_DATA_DIR>/svcgate.db``)."""
        from svcgate.daemon import DB_NAME

        return Path(self.dp.gateway.env["SVC_DATA_DIR"]) / DB_NAME

    def restart(self, between: Callable[[Path], object] | None = None) -> float:
        """Stop the gateway (cleanly), call ``between(database)`` while it is stopped (a bulk
        insert with sqlite3, say), and start it again with the same settings, port and data
        directory, so the sign-in sessions and profile tokens stay valid. Returns the seconds
        the new process took until it listened."""
        from gateway_support import start_gateway

        old = self.dp.gateway
        code = old.stop()
        if code != 0:
            raise RuntimeError(f"svcgate exited {code} when stopped:\n{old.log_text()}")
        if between is not None:
            between(self.database)
        port = int(old.url.rsplit(":", 1)[1])
        start = time.perf_counter()
        self.dp.gateway = start_gateway(
            old.log_path.parent,
            idp=None,
            extra_env=old.env,
            port=port,
            data_dir=Path(old.env["SVC_DATA_DIR"]),
        )
        return time.perf_counter() - start


@contextlib.contextmanager
def gateway(servers: Mapping[str, Mapping[str, Any]], **env: str) -> Iterator[BenchGateway]:
    """svcgate serving ``servers`` (SVC_SERVERS_FILE entries), signed in as bob."""
    from data_plane_support import start_data_plane_gateway

    from devidp.provider import DevIdP

    idp = DevIdP(host="127.0.0.1", port=0, client_id="svcgate-test", test_hooks=True)
    idp.start()
    tmp = Path(tempfile.mkdtemp(prefix="svcgate-bench-"))
    try:
        settings = {"SVC_LOG_LEVEL": "WARNING", **env}
        dp = start_data_plane_gateway(tmp, idp, extra_servers=servers, **settings)
        try:
            yield BenchGateway(dp.url, dp)
        finally:
            dp.open_gate()
            dp.gateway.stop()
    finally:
        idp.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _process(argv: list[str], url: str, env: Mapping[str, str] | None = None) -> Iterator[str]:
    """Run ``argv`` until it answers HTTP at ``url``; stop it (by its pid) afterwards."""
    log = tempfile.TemporaryFile()  # noqa: SIM115  # closed in the finally below
    proc = subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    try:
        _wait_http(url, proc, log)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Any) -> None:
    import httpx2

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"{proc.args!r} exited:\n{log.read().decode(errors='replace')}")
        try:
            httpx2.get(url, timeout=1)
            return
        except httpx2.HTTPError:
            time.sleep(0.05)
    raise RuntimeError(f"{proc.args!r} did not answer at {url}")


def direct_server(
    *, json_mode: bool = False, extra_tools: int = 0
) -> contextlib.AbstractContextManager[str]:
    """The echo server served by the SDK itself over streamable HTTP (uvicorn); its URL."""
    port = free_port()
    argv = [sys.executable, str(ECHO), "http", str(port), *(["json"] if json_mode else [])]
    return _process(argv, f"http://127.0.0.1:{port}/mcp", {"BENCH_EXTRA_TOOLS": str(extra_tools)})


def peers_venv() -> Path:
    """A separate virtual environment with the peer proxies (they pin mcp 1.x)."""
    venv = CACHE / "peers-venv"
    stamp = venv / ".installed"
    if stamp.exists() and stamp.read_text() == json.dumps(PEERS):
        return venv
    progress(f"installing {', '.join(PEERS)} into {venv}")
    _public(CACHE)
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", *PEERS],
        check=True,
    )
    stamp.write_text(json.dumps(PEERS))
    return venv


def _stdio_echo() -> list[str]:
    return [sys.executable, str(ECHO)]


def mcp_proxy() -> contextlib.AbstractContextManager[str]:
    """The echo server (stdio) bridged to streamable HTTP by mcp-proxy; its URL."""
    venv = peers_venv()
    port = free_port()
    argv = [
        str(venv / "bin" / "mcp-proxy"),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--",
        *_stdio_echo(),
    ]
    return _process(argv, f"http://127.0.0.1:{port}/mcp")


FASTMCP_PROXY = """
import sys
from fastmcp import FastMCP
from fastmcp.client.transports import StdioTransport

port, command = int(sys.argv[1]), sys.argv[2:]
proxy = FastMCP.as_proxy(StdioTransport(command=command[0], args=command[1:]), name="proxy")
proxy.run(transport="http", host="127.0.0.1", port=port, path="/mcp", log_level="warning",
          show_banner=False)
"""


def fastmcp_proxy() -> contextlib.AbstractContextManager[str]:
    """The echo server (stdio) behind fastmcp's proxy over streamable HTTP; its URL."""
    venv = peers_venv()
    port = free_port()
    argv = [str(venv / "bin" / "python"), "-c", FASTMCP_PROXY, str(port), *_stdio_echo()]
    return _process(argv, f"http://127.0.0.1:{port}/mcp")


# -- sandboxes seen from the host (root): their processes and network namespaces ------------


def _parent_pid(pid: int) -> int:
    # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses.
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text.rsplit(")", 1)[1].split()[1])


def _descends_from(pid: int, ancestor: int) -> bool:
    for _ in range(64):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        try:
            pid = _parent_pid(pid)
        except (OSError, ValueError, IndexError):
            return False
    return False


def sandbox_processes(ancestor: int, marker: str) -> dict[int, dict[str, str]]:
    """Host pids of the sandboxed processes below process ``ancestor`` (a gateway) whose
    argv contains ``marker``, with their environment (read through ``/proc``: root only).
    bwrap's own processes, which carry the same argv, are left out."""
    found: dict[int, dict[str, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if marker.encode() not in b"\0".join(argv) or os.path.basename(argv[0]) == b"bwrap":
                continue
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if not _descends_from(pid, ancestor):
            continue
        items = raw.decode(errors="replace").split("\0")
        found[pid] = dict(item.split("=", 1) for item in items if "=" in item)
    return found


_CLONE_NEWNET = 0x40000000


def in_netns_of(pid: int, fn: Any) -> Any:
    """Call ``fn()`` in a fresh thread that has joined the network namespace of process
    ``pid`` (root only); the thread goes back and ends right after. Sockets ``fn`` creates
    stay in that namespace and can be used from any thread afterwards."""
    import ctypes
    import threading

    libc = ctypes.CDLL(None, use_errno=True)
    result: list[Any] = []
    error: list[BaseException] = []

    def inside() -> None:
        original = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if libc.setns(target, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into the netns of {pid} failed")
            try:
                result.append(fn())
            finally:
                if libc.setns(original, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns back failed")
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            error.append(exc)
        finally:
            os.close(target)
            os.close(original)

    thread = threading.Thread(target=inside, name=f"netns-of-{pid}", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def put_credential(gw: BenchGateway, server: str, body: Mapping[str, Any]) -> None:
    """``PUT /api/credentials/{server}`` as bob (the user who owns the bench's profiles)."""
    from gateway_support import api

    gateway = gw.dp.gateway
    with api(gateway, gw.dp.user_session) as client:
        response = client.put(
            f"/api/credentials/{server}", json=dict(body), headers={"Origin": gateway.origin}
        )
    if response.status_code != 204:
        raise RuntimeError(f"storing the credential failed: {response.status_code} {response.text}")


def newest_audit_id(gw: BenchGateway) -> int:
    """The id of the newest audit event (all users; through the admin's session), 0 if none."""
    from gateway_support import api

    with api(gw.dp.gateway, gw.dp.admin_session) as client:
        response = client.get("/api/audit", params={"limit": 1})
    response.raise_for_status()
    events = response.json()["events"]
    return int(events[0]["id"]) if events else 0
