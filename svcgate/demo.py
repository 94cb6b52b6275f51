"""``svcgate demo``: the gateway with working defaults and a local identity provider.

Starts the development identity provider (``python -m devidp``, a separate program the
gateway never imports) on a free loopback port, points the gateway's OIDC settings at it,
and runs the gateway on ``127.0.0.1:<port>`` with SQLite in ``<data-dir>``. Everything the
operator needs to sign in is printed. Ctrl-C stops both.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

from svcgate.daemon import serve_settings
from svcgate.settings import SettingsError, sandbox_dir_from_env, settings_from_env

ECHO_SERVER = Path(__file__).parent / "examples" / "echo_server.py"
DEMO_USERS = (("alice", "alice", "admin"), ("bob", "bob", "user"), ("carol", "carol", "user"))


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

    idp, issuer = _start_idp()
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
    try:
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
                        f"  Data directory: {data}",
                        "  Stop with Ctrl-C.",
                        "",
                    ]
                ),
                flush=True,
            )

        return serve_settings(settings, ready)
    finally:
        idp.terminate()
        try:
            idp.wait(timeout=10)
        except subprocess.TimeoutExpired:
            idp.kill()
            idp.wait()
