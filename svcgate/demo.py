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

Resource handling: both helper programs are child processes, terminated (then killed after
10 s) when the gateway stops or fails to start.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import queue
import secrets
import shutil
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


def _stop(proc: subprocess.Popen[str] | None) -> None:
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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
    try:
        if not os.environ.get("SVC_REGISTRY_INDEX", "").strip():
            registry_proc = _spawn_registry(data / "demo-registry")
        idp, issuer = _start_idp()
        registry = _read_registry(registry_proc) if registry_proc is not None else None
        if registry is None:
            _stop(registry_proc)
            registry_proc = None
        return _serve(port=port, data=data, bearer=bearer, issuer=issuer, registry=registry)
    finally:
        _stop(idp)
        _stop(registry_proc)


def _serve(
    *, port: int, data: Path, bearer: str, issuer: str, registry: DemoRegistry | None
) -> int:
    origin = f"http://localhost:{port}"
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
                    f"  Sign in:        {origin}/api/auth/login?next=/api/me",
                    f"  Demo users:     {users} (username/password)",
                    f"  Identity prov.: {issuer} (local, for the demo only)",
                    f"  Legacy MCP:     {origin}/mcp  (Authorization: Bearer {bearer})",
                    registry_line,
                    f"  Data directory: {data}",
                    "  Stop with Ctrl-C.",
                    "",
                ]
            ),
            flush=True,
        )

    return serve_settings(settings, ready)
