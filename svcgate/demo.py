"""``svcgate demo``: the gateway with working defaults, a local identity provider and registry.

Starts the development identity provider (``python -m devidp``, a separate program the
gateway never imports) on a free loopback port, points the gateway's OIDC settings at it,
and runs the gateway on ``127.0.0.1:<port>`` with SQLite in ``<data-dir>``. Everything the
operator needs to sign in is printed. Ctrl-C stops everything.

It also starts the sample registry (``python -m devregistry``, another separate program):
Debian's ``docker-registry`` on loopback serving the sample servers ``pyecho`` and ``notes``
from an index signed by a key kept in ``<data-dir>/demo-registry``. The gateway trusts that
key (``SVC_REGISTRY_KEYS``), reads the index as a ``file://`` URL, and installs the servers
in the background at start (``SVC_REGISTRY_INSTALL``) into ``SVC_IMAGE_DIR`` (default
:data:`DEMO_IMAGE_DIR`/<hash of the data directory>, one store per data directory: the
sandbox uid opens the unpacked images, so every parent directory must be searchable by
other users, which the 0700 data directory is not). Each start
publishes a higher index version with the same key, so the gateway's rollback protection
accepts it. When ``docker-registry`` is missing, or the sample registry does not come up
within :data:`REGISTRY_START_TIMEOUT`, a warning is printed and the demo runs without it;
when ``SVC_REGISTRY_INDEX`` is already set, the operator's registry is used instead.

With a source checkout (``web/`` beside the package, its npm packages installed by
``scripts/web-deps``, which ``make demo`` runs), the demo also builds the dashboard for this
gateway's address (``SVC_GATEWAY_URL``; rebuilt only when the address or a source changed)
and serves it with ``next start`` on ``localhost:3000`` (``SVC_DEMO_DASHBOARD_PORT``). The
browser then signs in through the dashboard, so the OIDC redirect and the public origin are
the dashboard's. ``SVC_DEMO_DASHBOARD=0`` (or no node, or a failed build, with a warning)
runs the gateway alone, signed in to directly as before.

Resource handling: the helper programs are child processes, terminated (then killed after
10 s) when the gateway stops or fails to start; the dashboard runs in its own process group
so that ``next start``'s workers stop with it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from svcgate.daemon import serve_settings
from svcgate.settings import SettingsError, sandbox_dir_from_env, settings_from_env

ECHO_SERVER = Path(__file__).parent / "examples" / "echo_server.py"
DEMO_USERS = (("alice", "alice", "admin"), ("bob", "bob", "user"), ("carol", "carol", "user"))
DEMO_IMAGE_DIR = "/var/lib/svcgate-demo-images"
REGISTRY_BINARY = "/usr/bin/docker-registry"
REGISTRY_START_TIMEOUT = 120.0
WEB_DIR = Path(__file__).resolve().parent.parent / "web"
DASHBOARD_START_TIMEOUT = 60.0
# What a dashboard build depends on: rebuilt when any of these is newer than the last build.
_WEB_SOURCES = (
    "app",
    "components",
    "lib",
    "i18n",
    "messages",
    "public",
    "next.config.ts",
    "package-lock.json",
    "tsconfig.json",
    "postcss.config.mjs",
)


def _stage_echo_server(env: dict[str, str]) -> Path:
    """A copy of the sample server that the sandbox uid can read.

    bwrap opens bind sources as the unprivileged sandbox uid, and a checkout often sits
    under a private home directory; the copy lives beside the sandbox state directory.
    """
    try:
        stage = sandbox_dir_from_env(env).parent / "demo-servers"
        stage.mkdir(parents=True, exist_ok=True)
        stage.chmod(0o755)
        target = stage / ECHO_SERVER.name
        shutil.copyfile(ECHO_SERVER, target)
        target.chmod(0o755)
    except OSError as exc:
        print(
            f"svcgate: cannot stage the sample server ({exc}); using it in place", file=sys.stderr
        )
        return ECHO_SERVER
    return target


def _start_idp() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "devidp", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    prefix = "devidp: issuer "
    if not line.startswith(prefix):
        proc.terminate()
        raise RuntimeError("the demo identity provider did not start")
    return proc, line[len(prefix) :]


@dataclass(frozen=True)
class DemoRegistry:
    """What ``python -m devregistry`` printed: the index, its key and the servers."""

    index_url: str
    key: str
    servers: tuple[str, ...]


def _warn(message: str) -> None:
    print(f"svcgate: {message}; the demo runs without the sample registry", file=sys.stderr)


def _spawn_registry(directory: Path) -> subprocess.Popen[str] | None:
    """Start ``python -m devregistry`` (or warn and return None when it cannot run)."""
    if not os.access(REGISTRY_BINARY, os.X_OK):
        _warn(f"{REGISTRY_BINARY} is missing (scripts/system-packages installs docker-registry)")
        return None
    if importlib.util.find_spec("devregistry") is None:
        _warn("the devregistry package is not installed")
        return None
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "devregistry", "--dir", str(directory), "--port", "0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
    except OSError as exc:
        _warn(f"cannot start the sample registry ({exc})")
        return None


def _read_registry(proc: subprocess.Popen[str]) -> DemoRegistry | None:
    """The three lines the sample registry prints when ready; None (and a warning) if not."""
    assert proc.stdout is not None
    stdout = proc.stdout
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        # Keeps draining stdout afterwards, so the registry never blocks on a full pipe.
        for line in stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, name="devregistry-stdout", daemon=True).start()
    found: dict[str, str] = {}
    deadline = time.monotonic() + REGISTRY_START_TIMEOUT
    while len(found) < 3:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            _warn(f"the sample registry did not start within {REGISTRY_START_TIMEOUT:.0f}s")
            return None
        if line is None:
            _warn(f"the sample registry exited with status {proc.wait()}")
            return None
        label, _, value = line.strip().removeprefix("devregistry: ").partition(" ")
        if label in ("index", "key", "servers") and value:
            found[label] = value
    servers = tuple(name for name in found["servers"].split(",") if name)
    return DemoRegistry(found["index"], found["key"], servers)


def _stop(proc: subprocess.Popen[str] | None, *, group: bool = False) -> None:
    if proc is None:
        return
    if group:  # our child leads its own group (start_new_session): its workers stop too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    else:
        proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        if group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        proc.wait()


def _dashboard_warn(message: str) -> None:
    print(f"svcgate: {message}; the demo runs without the dashboard", file=sys.stderr)


def _newest_source() -> float:
    newest = 0.0
    for name in _WEB_SOURCES:
        top = WEB_DIR / name
        paths = [top] if top.is_file() else [p for p in top.rglob("*") if p.is_file()]
        for path in paths:
            newest = max(newest, path.stat().st_mtime)
    return newest


def _build_dashboard(next_bin: Path, gateway_url: str) -> bool:
    """``next build`` for ``gateway_url`` unless the last build was for it and is current."""
    stamp = WEB_DIR / ".next" / "svcgate-gateway-url"
    if (
        stamp.is_file()
        and stamp.read_text() == gateway_url
        and stamp.stat().st_mtime >= _newest_source()
    ):
        return True
    print("svcgate: building the dashboard for this gateway (about a minute)...", flush=True)
    env = {**os.environ, "SVC_GATEWAY_URL": gateway_url, "NEXT_TELEMETRY_DISABLED": "1"}
    result = subprocess.run(
        [str(next_bin), "build"], cwd=WEB_DIR, env=env, stdout=sys.stderr, check=False
    )
    if result.returncode != 0:
        _dashboard_warn(f"the dashboard build failed (exit {result.returncode})")
        return False
    stamp.write_text(gateway_url)
    return True


def _start_dashboard(*, gateway_port: int, port: int) -> subprocess.Popen[str] | None:
    """Build (when needed) and start the dashboard; None (and a warning) when it cannot."""
    if os.environ.get("SVC_DEMO_DASHBOARD", "1") == "0":
        return None
    next_bin = WEB_DIR / "node_modules" / ".bin" / "next"
    if not (WEB_DIR / "package.json").is_file():
        _dashboard_warn("web/ is not here (not a source checkout)")
        return None
    if shutil.which("node") is None or not next_bin.exists():
        _dashboard_warn("node or web/node_modules is missing (scripts/web-deps installs them)")
        return None
    if not _build_dashboard(next_bin, f"http://127.0.0.1:{gateway_port}"):
        return None
    env = {**os.environ, "NEXT_TELEMETRY_DISABLED": "1"}
    proc = subprocess.Popen(
        [str(next_bin), "start", "-p", str(port), "-H", "127.0.0.1"],
        cwd=WEB_DIR,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=sys.stderr,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + DASHBOARD_START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _dashboard_warn(f"the dashboard exited with status {proc.returncode}")
            return None
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return proc
        time.sleep(0.2)
    _stop(proc, group=True)
    _dashboard_warn(f"the dashboard did not start within {DASHBOARD_START_TIMEOUT:.0f}s")
    return None


def run_demo(*, port: int, data_dir: str) -> int:
    data = Path(data_dir).absolute()
    data.mkdir(parents=True, exist_ok=True, mode=0o700)
    token_file = data / "legacy-bearer-token"
    if "SVC_BEARER_TOKEN" in os.environ:
        bearer = os.environ["SVC_BEARER_TOKEN"]
    elif token_file.exists():
        bearer = token_file.read_text().strip()
    else:
        bearer = "svc_legacy_" + secrets.token_urlsafe(24)
        token_file.write_text(bearer + "\n")
        token_file.chmod(0o600)

    registry_proc: subprocess.Popen[str] | None = None
    idp: subprocess.Popen[str] | None = None
    dashboard: subprocess.Popen[str] | None = None
    try:
        if not os.environ.get("SVC_REGISTRY_INDEX", "").strip():
            registry_proc = _spawn_registry(data / "demo-registry")
        idp, issuer = _start_idp()
        dashboard_port = int(os.environ.get("SVC_DEMO_DASHBOARD_PORT", "3000"))
        dashboard = _start_dashboard(gateway_port=port, port=dashboard_port)
        registry = _read_registry(registry_proc) if registry_proc is not None else None
        if registry is None:
            _stop(registry_proc)
            registry_proc = None
        return _serve(
            port=port,
            data=data,
            bearer=bearer,
            issuer=issuer,
            registry=registry,
            dashboard_port=dashboard_port if dashboard is not None else None,
        )
    finally:
        _stop(dashboard, group=True)
        _stop(idp)
        _stop(registry_proc)


def _serve(
    *,
    port: int,
    data: Path,
    bearer: str,
    issuer: str,
    registry: DemoRegistry | None,
    dashboard_port: int | None = None,
) -> int:
    gateway_origin = f"http://localhost:{port}"
    # With the dashboard, the browser only ever sees the dashboard's origin.
    origin = f"http://localhost:{dashboard_port}" if dashboard_port else gateway_origin
    sign_in = f"{origin}/login" if dashboard_port else f"{origin}/api/auth/login?next=/api/me"
    env = {
        **os.environ,
        "SVC_LISTEN": f"127.0.0.1:{port}",
        "SVC_DATA_DIR": str(data),
        "SVC_BEARER_TOKEN": bearer,
        "SVC_OIDC_ISSUER": issuer,
        "SVC_OIDC_CLIENT_ID": "svcgate",
        "SVC_OIDC_REDIRECT_URL": f"{origin}/api/auth/callback",
        "SVC_PUBLIC_URL": origin,
    }
    # Metrics only when asked for: a demo must not fail because a real gateway on this host
    # already holds the default metrics port.
    env["SVC_METRICS_LISTEN"] = os.environ.get("SVC_METRICS_LISTEN") or "off"
    # The sample legacy server, run inside a sandbox by the supervisor.
    env["SVC_ECHO_BIN"] = os.environ.get("SVC_ECHO_BIN") or str(_stage_echo_server(env))
    # One store per data directory: a gateway collects the images its database does not
    # reference, so two demos must never share one.
    tag = hashlib.sha256(str(data).encode()).hexdigest()[:12]
    env["SVC_IMAGE_DIR"] = os.environ.get("SVC_IMAGE_DIR") or f"{DEMO_IMAGE_DIR}/{tag}"
    registry_line = "  Registry:       not running (see the warning above)"
    if registry is not None:
        env["SVC_REGISTRY_INDEX"] = registry.index_url
        env["SVC_REGISTRY_KEYS"] = registry.key
        env["SVC_REGISTRY_INSTALL"] = ",".join(registry.servers)
        registry_line = (
            f"  Registry:       {', '.join(registry.servers)} installed from the local signed "
            f"index ({registry.index_url}; the first start installs in the background)"
        )
    elif os.environ.get("SVC_REGISTRY_INDEX", "").strip():
        registry_line = f"  Registry:       {os.environ['SVC_REGISTRY_INDEX']} (SVC_REGISTRY_INDEX)"
    try:
        settings = settings_from_env(env)
    except SettingsError as exc:
        print(f"svcgate: {exc}", file=sys.stderr)
        return 2

    def ready(binds: list[str]) -> None:
        users = ", ".join(f"{u}/{p} ({r})" for u, p, r in DEMO_USERS)
        print(
            "\n".join(
                [
                    "",
                    "svcgate demo is running.",
                    *([f"  Dashboard:      {origin}"] if dashboard_port else []),
                    f"  Sign in:        {sign_in}",
                    f"  Demo users:     {users} (username/password)",
                    f"  Identity prov.: {issuer} (local, for the demo only)",
                    f"  Legacy MCP:     {gateway_origin}/mcp  (Authorization: Bearer {bearer})",
                    registry_line,
                    f"  Data directory: {data}",
                    "  Stop with Ctrl-C.",
                    "",
                ]
            ),
            flush=True,
        )

    return serve_settings(settings, ready)
