"""The operator commands against real daemon processes: ``status``, ``netns inspect``,
``sandbox kill``, ``profile warm|cold``, ``audit tail``, ``vault rotate-key`` and ``backup``.

The main daemon serves real sandboxed servers (``tests/data_plane_support.py``) and reads its
vault key from a read-only copy of the key source file, as under systemd
(``$CREDENTIALS_DIRECTORY``); its egress proxy reaches a loopback upstream that records the
credential it receives. A second, bare daemon is the source of the backup tests.
"""

from __future__ import annotations

import base64
import builtins
import hashlib
import json
import os
import queue
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import httpx2
import pytest
import trio
from data_plane_support import DataPlaneGateway, data_plane_gateway, mcp_client, text_of
from gateway_support import INIT, Gateway, api, run_cli, start_gateway
from process_support import public_tmpdir
from supervisor_helpers import REPO

from devidp.provider import DevIdP
from svcgate import operator_backup, operator_records
from svcgate.daemon import DB_NAME
from svcgate.migrations import MIGRATIONS
from svcgate.operator_client import Connection, ControlError
from svcgate.operator_socket import OperatorContext, serve_control_socket
from svcgate.store import open_store
from svcgate.supervisor import SandboxInfo, SandboxKey, SandboxNotFound
from svcgate.vault import (
    KeyRing,
    Sealed,
    Vault,
    VaultError,
    load_key_file,
    next_ring,
    write_key_file,
)

if os.geteuid() != 0:  # pragma: no cover - CI and dev machines run these as root
    pytest.skip("the daemon runs sandboxes and needs root", allow_module_level=True)

pytestmark = pytest.mark.root

SECRET = "opcli-secret-8d2f61c0a9b7e5"
UPSTREAM_HOST = "api.example.test"


def ok_json(*args: str, data_dir: Path) -> Any:
    result = run_cli(*args, "--json", data_dir=data_dir)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    return json.loads(result.stdout)


def fails(*args: str, data_dir: Path) -> str:
    """Run a command that must fail with one ``svcgate:`` line; return that line."""
    result = run_cli(*args, data_dir=data_dir)
    assert (result.returncode, result.stdout) == (1, ""), result
    assert result.stderr.startswith("svcgate: ") and result.stderr.count("\n") == 1
    return result.stderr.strip()


def field(label: str, value: str) -> str:
    """One line of ``svcgate status`` (labels padded to the longest, "installed servers")."""
    return f"{label.ljust(len('installed servers'))}  {value}"


def data_dir_of(gw: Gateway) -> Path:
    return Path(gw.env["SVC_DATA_DIR"])


class Upstream:
    """A loopback HTTP server that records the Authorization header of every request."""

    def __init__(self) -> None:
        seen: list[str | None] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                seen.append(self.headers.get("authorization"))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self.seen = seen
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.close()


@pytest.fixture(scope="module")
def keys() -> Iterator[dict[str, Path]]:
    """The key source file (the operator's) and the daemon's read-only copy of it."""
    root = public_tmpdir("opkeys")
    (root / "etc").mkdir(mode=0o700)
    (root / "creds").mkdir(mode=0o700)
    source, copy = root / "etc" / "vault.key", root / "creds" / "vault-key"
    write_key_file(source, KeyRing({1: os.urandom(32)}))
    shutil.copy(source, copy)
    copy.chmod(0o400)
    yield {"source": source, "copy": copy}
    shutil.rmtree(root)


@pytest.fixture(scope="module")
def dp(
    idp: DevIdP,
    tmp_path_factory: pytest.TempPathFactory,
    upstream: Upstream,
    keys: dict[str, Path],
) -> Iterator[DataPlaneGateway]:
    with data_plane_gateway(
        tmp_path_factory.mktemp("opcmd"),
        idp,
        SVC_VAULT_KEY_FILE=str(keys["copy"]),
        SVC_EGRESS_ALLOW_CIDRS="127.0.0.0/8",
        SVC_EGRESS_HOSTS=f"{UPSTREAM_HOST}=127.0.0.1:{upstream.port}",
        SVC_METRICS_LISTEN="127.0.0.1:0",
    ) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def data(dp: DataPlaneGateway) -> Path:
    return data_dir_of(dp.gateway)


def sandboxes(data: Path, slug: str) -> dict[str, dict[str, Any]]:
    return {
        s["server"]: s for s in ok_json("sandbox", "ps", data_dir=data) if s["profile_slug"] == slug
    }


def admin_events(data: Path, n: int = 20) -> list[dict[str, Any]]:
    result = run_cli("audit", "tail", "-n", str(n), "--kind", "admin", "--json", data_dir=data)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


# -- status ----------------------------------------------------------------------------------


def test_status_names_listeners_identity_provider_registry_and_counts(
    dp: DataPlaneGateway, data: Path, idp: DevIdP
) -> None:
    status = ok_json("status", data_dir=data)
    assert status["version"] and status["pid"] == dp.gateway.proc.pid
    assert status["uptime_seconds"] >= 0
    assert status["schema_version"] == len(MIGRATIONS)
    assert status["database"] == str(data / DB_NAME)
    assert status["listeners"]["http"] == [dp.gateway.url]
    assert status["listeners"]["control_socket"] == str(data / "control.sock")
    assert status["oidc"] == {
        "configured": True,
        "issuer": idp.issuer,
        "reachable": True,
        "error": None,
    }
    assert status["registry"]["configured"] is False
    assert status["registry"]["installed_servers"] == 0
    counts = status["counts"]
    assert counts["users"] >= 2 and counts["servers"] >= 5  # alice, bob; the staged servers
    assert {"profiles", "credentials", "warm", "starting", "sandboxes"} <= set(counts)

    (metrics,) = status["listeners"]["metrics"]  # SVC_METRICS_LISTEN=127.0.0.1:0
    assert metrics.startswith("http://127.0.0.1:") and not metrics.endswith(":0")

    human = run_cli("status", data_dir=data)
    assert human.returncode == 0
    lines = human.stdout.splitlines()
    assert lines[0] == field("version", f"svcgate {status['version']}")
    assert field("oidc", f"{idp.issuer} (reachable)") in lines
    assert field("registry", "not configured") in lines
    assert field("metrics", metrics) in lines
    assert field("http", dp.gateway.url) in lines


# -- profile warm / cold ---------------------------------------------------------------------


def test_warm_starts_every_server_and_cold_stops_them(dp: DataPlaneGateway, data: Path) -> None:
    profile = dp.create_profile("opwarm", ["probe", "probe2"])
    warm = ok_json("profile", "warm", "opwarm", data_dir=data)
    assert warm["profile"] == {"id": profile["id"], "slug": "opwarm", "user_id": profile["user_id"]}
    assert warm["state"] == "warm"
    assert [(s["name"], s["state"], s["error"]) for s in warm["servers"]] == [
        ("probe", "ready", None),
        ("probe2", "ready", None),
    ]
    assert all(s["tools"] > 0 for s in warm["servers"])
    running = sandboxes(data, "opwarm")
    assert {k: v["state"] for k, v in running.items()} == {"probe": "running", "probe2": "running"}
    assert dp.runtime(profile)["state"] == "warm"

    again = run_cli("profile", "warm", str(profile["id"]), data_dir=data)  # by id; no restart
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[0].startswith(f"profile opwarm (id {profile['id']}) is warm")
    assert again.stdout.splitlines()[1].split() == ["SERVER", "STATE", "TOOLS", "ERROR"]
    assert {k: v["pid"] for k, v in sandboxes(data, "opwarm").items()} == {
        k: v["pid"] for k, v in running.items()
    }

    cold = run_cli("profile", "cold", "opwarm", data_dir=data)
    assert (cold.returncode, cold.stderr) == (0, "")
    assert cold.stdout == (
        f"profile opwarm (id {profile['id']}) is cold (was warm); stopped: probe, probe2\n"
    )
    assert sandboxes(data, "opwarm") == {}
    assert dp.runtime(profile)["state"] == "cold"
    events = [e for e in admin_events(data) if e["profile_id"] == profile["id"]]
    decisions = [e["decision"] for e in events if e["decision"].startswith("operator.")]
    assert decisions == ["operator.profile.warm", "operator.profile.warm", "operator.profile.cold"]
    assert all(e["user_id"] == 0 and e["detail"] == "slug=opwarm" for e in events[-3:])


def test_warm_reports_the_servers_that_did_not_start(dp: DataPlaneGateway, data: Path) -> None:
    dp.create_profile("ophalf", ["probe", "broken"])
    result = run_cli("profile", "warm", "ophalf", data_dir=data)
    assert result.returncode == 1
    assert result.stderr == (
        "svcgate: 1 of 2 server(s) of profile 'ophalf' did not start: broken\n"
    )
    rows = {line.split()[0]: line.split()[1] for line in result.stdout.splitlines()[2:]}
    assert rows == {"broken": "failed", "probe": "ready"}
    dp.create_profile("opbroken", ["broken"])
    line = fails("profile", "warm", "opbroken", data_dir=data)
    assert line == (
        "svcgate: profile 'opbroken' did not start: no server of the bundle started (broken failed)"
    )
    assert fails("profile", "warm", "no-such-profile", data_dir=data) == (
        "svcgate: no profile 'no-such-profile'"
    )
    assert fails("profile", "cold", "no-such-profile", data_dir=data) == (
        "svcgate: no profile 'no-such-profile'"
    )
    assert run_cli("profile", "cold", "ophalf", data_dir=data).returncode == 0


# -- netns inspect ---------------------------------------------------------------------------


def test_netns_inspect_shows_the_sandbox_interfaces_routes_and_egress(
    dp: DataPlaneGateway, data: Path
) -> None:
    dp.create_profile("opnet", ["probe"])
    ok_json("profile", "warm", "opnet", data_dir=data)
    (row,) = [r for r in ok_json("netns", "ls", data_dir=data) if r["profile_slug"] == "opnet"]
    detail = ok_json("netns", "inspect", row["namespace"], data_dir=data)
    assert detail["namespace"] == row["namespace"]
    sandbox = detail["sandbox"]
    assert (sandbox["profile_slug"], sandbox["server"], sandbox["state"]) == (
        "opnet",
        "probe",
        "running",
    )
    assert sandbox["owner_user_id"] == row["owner_user_id"]
    assert sandbox["pid"] == row["pid"] and row["pid"] in sandbox["pids"]
    assert len(sandbox["pids"]) >= 2  # bwrap and the server inside its pid namespace
    interfaces = {i["name"]: i for i in detail["interfaces"]}
    assert interfaces["lo"]["up"] and "127.0.0.1/8" in interfaces["lo"]["addresses"]
    # Loopback only: no other interface has an address (the way out is the egress proxy).
    assert [n for n, i in interfaces.items() if i["addresses"] and n != "lo"] == []
    assert {"destination": "127.0.0.0/8", "table": "local", "type": "local"}.items() <= next(
        r for r in detail["routes"] if r["destination"] == "127.0.0.0/8"
    ).items()
    assert not any(r["destination"] == "default" for r in detail["routes"])
    assert detail["egress"] == {"listener": row["egress_listener"], "connections": 0}
    assert row["egress_listener"].startswith("127.0.0.1:")

    human = run_cli("netns", "inspect", row["namespace"], data_dir=data)
    assert human.returncode == 0
    assert f"namespace  {row['namespace']}" in human.stdout
    assert "INTERFACE  STATE" in human.stdout and "DESTINATION" in human.stdout
    assert fails("netns", "inspect", "svcgnothere-0", data_dir=data) == (
        "svcgate: no sandbox namespace named 'svcgnothere-0'"
    )
    assert fails("netns", "inspect", "../etc", data_dir=data) == (
        "svcgate: '../etc' is not a valid namespace name"
    )
    run_cli("profile", "cold", "opnet", data_dir=data)


# -- sandbox kill ----------------------------------------------------------------------------


async def test_kill_restarts_one_server_and_the_next_call_uses_the_new_sandbox(
    dp: DataPlaneGateway, data: Path
) -> None:
    profile = dp.create_profile("opkill", ["probe", "probe2"])
    async with mcp_client(dp.endpoint("opkill"), profile["token"]) as client:
        assert text_of(await client.call_tool("probe_echo", {"text": "before"})) == "before"
    before = sandboxes(data, "opkill")
    killed = ok_json("sandbox", "kill", "opkill", "probe", data_dir=data)
    assert killed["killed_pid"] == before["probe"]["pid"]
    assert (killed["restarted"], killed["state"], killed["error"]) == (True, "ready", None)
    after = sandboxes(data, "opkill")
    assert killed["pid"] == after["probe"]["pid"] != before["probe"]["pid"]
    assert after["probe2"]["pid"] == before["probe2"]["pid"]  # the other server kept running
    async with mcp_client(dp.endpoint("opkill"), profile["token"]) as client:
        assert text_of(await client.call_tool("probe_echo", {"text": "after"})) == "after"
        assert text_of(await client.call_tool("probe2_echo", {"text": "two"})) == "two"
    human = run_cli("sandbox", "kill", "opkill", "probe2", data_dir=data)
    assert human.returncode == 0, human.stderr
    assert human.stdout.startswith(
        f"stopped the sandbox of probe2 in profile opkill (id {profile['id']})"
        f" (pid {before['probe2']['pid']})\nstarted again: ready (pid "
    )
    kills = [e for e in admin_events(data) if e["decision"] == "operator.sandbox.kill"]
    assert [(e["server"], e["profile_id"], e["user_id"]) for e in kills[-2:]] == [
        ("probe", profile["id"], 0),
        ("probe2", profile["id"], 0),
    ]
    assert f"pid={before['probe']['pid']}" in kills[-2]["detail"]
    assert fails("sandbox", "kill", "opkill", "nope", data_dir=data) == (
        "svcgate: no sandbox for server 'nope' in profile 'opkill'"
    )
    assert fails("sandbox", "kill", "nobody", "probe", data_dir=data) == (
        "svcgate: no profile 'nobody'"
    )
    run_cli("profile", "cold", "opkill", data_dir=data)
    assert fails("sandbox", "kill", "opkill", "probe", data_dir=data) == (
        "svcgate: no sandbox for server 'probe' in profile 'opkill'"
    )


# -- audit tail ------------------------------------------------------------------------------


def test_audit_tail_prints_the_newest_rows_oldest_first(data: Path) -> None:
    tail = run_cli("audit", "tail", "-n", "3", "--json", data_dir=data)
    rows = [json.loads(line) for line in tail.stdout.splitlines()]
    assert len(rows) == 3 and [r["id"] for r in rows] == sorted(r["id"] for r in rows)
    newest = max(r["id"] for r in admin_events(data, 1000))
    assert rows[-1]["id"] >= newest
    assert set(rows[0]) == {
        "id", "ts", "kind", "user_id", "profile_id", "server", "host", "decision", "detail",
    }  # fmt: skip
    human = run_cli("audit", "tail", "-n", "2", data_dir=data)
    assert human.returncode == 0
    lines = human.stdout.splitlines()
    assert lines[0].split() == [
        "ID", "TIME", "KIND", "USER", "PROFILE", "SERVER", "HOST", "DECISION", "DETAIL",
    ]  # fmt: skip
    assert len(lines) == 3
    assert all(e["kind"] == "admin" for e in admin_events(data, 50))
    assert fails("audit", "tail", "-n", "0", data_dir=data) == (
        "svcgate: -n must be between 1 and 1000"
    )
    assert fails("audit", "tail", "-n", "1001", data_dir=data) == (
        "svcgate: -n must be between 1 and 1000"
    )
    assert fails("audit", "tail", "--kind", "bogus", data_dir=data) == (
        "svcgate: --kind must be one of egress, auth, admin"
    )


def test_audit_tail_follow_prints_rows_written_after_it_started(
    dp: DataPlaneGateway, data: Path
) -> None:
    dp.create_profile("opfollow", [])
    with subprocess.Popen(
        [sys.executable, "-m", "svcgate", "audit", "tail", "-f", "-n", "1", "--kind", "admin"],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SVC_DATA_DIR": str(data)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as follow:
        lines: queue.Queue[str] = queue.Queue()

        def pump() -> None:
            assert follow.stdout is not None
            for line in follow.stdout:
                lines.put(line.rstrip("\n"))

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            header, first = lines.get(timeout=30), lines.get(timeout=30)
            assert header.split()[:3] == ["ID", "TIME", "KIND"]
            assert "profile_servers" in first
            cold = run_cli("profile", "cold", "opfollow", data_dir=data)
            assert cold.returncode == 0
            line = lines.get(timeout=30)  # the next admin row is the one just written
            assert int(line.split()[0]) > int(first.split()[0])
            assert "operator.profile.cold" in line and "slug=opfollow" in line
        finally:
            follow.send_signal(signal.SIGINT)
            code = follow.wait(timeout=30)
            reader.join(timeout=10)
        assert follow.stderr is not None
        assert (code, follow.stderr.read()) == (0, "")


# -- vault rotate-key ------------------------------------------------------------------------


async def fetch(dp: DataPlaneGateway, profile: dict[str, Any]) -> str:
    async with mcp_client(dp.endpoint(profile["slug"]), profile["token"]) as client:
        result = await client.call_tool("echo_fetch", {"url": f"http://{UPSTREAM_HOST}/x"})
        assert not result.is_error, text_of(result)
        return text_of(result)


def kek_versions(data: Path) -> list[int]:
    with sqlite3.connect(f"file:{data / DB_NAME}?mode=ro", uri=True) as conn:
        return [row[0] for row in conn.execute("SELECT kek_version FROM credentials ORDER BY id")]


def key_forms(ring: KeyRing) -> list[str]:
    return [
        form for key in ring.keys.values() for form in (base64.b64encode(key).decode(), key.hex())
    ]


async def test_rotation_through_the_running_daemon_keeps_injection_working(
    dp: DataPlaneGateway, data: Path, upstream: Upstream, keys: dict[str, Path]
) -> None:
    with api(dp.gateway, dp.user_session) as client:
        response = client.put(
            "/api/credentials/echo",
            json={"secret": SECRET, "allowed_hosts": [UPSTREAM_HOST]},
            headers={"Origin": dp.gateway.origin},
        )
        assert response.status_code == 204, response.text
    profile = dp.create_profile("opvault", ["echo"])
    upstream.seen.clear()
    assert (await fetch(dp, profile)).startswith("200")
    assert upstream.seen == [f"Bearer {SECRET}"]
    assert kek_versions(data) == [1]
    original = load_key_file(keys["source"], create=False)
    stale_copy = keys["copy"].read_bytes()

    wrong = keys["source"].with_name("other.key")
    write_key_file(wrong, KeyRing({1: os.urandom(32)}))
    refused = run_cli("vault", "rotate-key", "--key-file", str(wrong), data_dir=data)
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr == (
        f"svcgate: {wrong} does not hold the daemon's key version 1: name the file the"
        " daemon's key comes from with --key-file\n"
    )
    assert list(load_key_file(wrong, create=False).keys) == [1]  # untouched

    rotated = run_cli("vault", "rotate-key", "--key-file", str(keys["source"]), data_dir=data)
    assert (rotated.returncode, rotated.stderr) == (0, ""), rotated.stderr
    assert rotated.stdout.splitlines()[:2] == [
        "vault key rotated to version 2; 1 credential(s) re-wrapped by the running daemon",
        f"{keys['source']} now holds only version 2: back it up",
    ]
    assert "LoadCredentialEncrypted" in rotated.stdout
    ring = load_key_file(keys["source"], create=False)
    assert list(ring.keys) == [2] and ring.keys[2] != original.keys[1]
    assert kek_versions(data) == [2]
    assert keys["copy"].read_bytes() == stale_copy  # the daemon's copy is stale now

    # Egress still injects: the daemon opens the re-wrapped credential with the new key.
    upstream.seen.clear()
    assert (await fetch(dp, profile)).startswith("200")
    assert upstream.seen == [f"Bearer {SECRET}"]
    # A credential sealed now uses the new key, never the stale copy's old one.
    with api(dp.gateway, dp.user_session) as client:
        response = client.put(
            "/api/credentials/probe",
            json={"secret": "another-secret-value", "allowed_hosts": [UPSTREAM_HOST]},
            headers={"Origin": dp.gateway.origin},
        )
        assert response.status_code == 204, response.text
    assert kek_versions(data) == [2, 2]

    again = run_cli(
        "vault", "rotate-key", "--json", "--key-file", str(keys["source"]), data_dir=data
    )
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert {k: report[k] for k in ("version", "rewrapped", "retired", "daemon")} == {
        "version": 3,
        "rewrapped": 2,
        "retired": [2],
        "daemon": True,
    }
    assert kek_versions(data) == [3, 3]
    upstream.seen.clear()
    assert (await fetch(dp, profile)).startswith("200")
    assert upstream.seen == [f"Bearer {SECRET}"]
    everything = rotated.stdout + again.stdout + dp.gateway.log_text()
    final = load_key_file(keys["source"], create=False)
    every_key = KeyRing({**original.keys, **ring.keys, **final.keys})
    assert not any(form in everything for form in key_forms(every_key))
    rotations = [e for e in admin_events(data) if e["decision"] == "operator.vault.rotate"]
    assert [e["detail"] for e in rotations[-2:]] == [
        "version=2 rewrapped=1 retired=1",
        "version=3 rewrapped=2 retired=2",
    ]


def test_a_pushed_ring_is_never_downgraded_by_a_stale_key_file(tmp_path: Path) -> None:
    old = KeyRing({1: os.urandom(32)})
    path = tmp_path / "vault-key"
    write_key_file(path, old)
    vault = Vault(load_key_file(path, create=False), path)
    before = vault.seal(1, "echo", b"s1")
    new = KeyRing({**old.keys, 2: os.urandom(32)})
    with pytest.raises(VaultError, match="lacks key version 1"):
        vault.adopt(KeyRing({2: new.keys[2]}))
    with pytest.raises(VaultError, match="different key for version 1"):
        vault.adopt(KeyRing({1: os.urandom(32), 2: new.keys[2]}))
    vault.adopt(new)
    vault.retire_except(2)
    sealed = vault.seal(1, "echo", b"s2")  # the file still says version 1 only
    assert sealed.kek_version == 2 and vault.open(1, "echo", sealed) == b"s2"
    with pytest.raises(VaultError, match="version 1 is not on the key ring"):
        vault.open(1, "echo", before)
    assert vault.fingerprints().keys() == {2}


def test_an_unadopted_vault_takes_a_newer_file_but_not_an_older_one(tmp_path: Path) -> None:
    path = tmp_path / "vault.key"
    one = KeyRing({1: os.urandom(32)})
    write_key_file(path, KeyRing({**one.keys, 2: os.urandom(32)}))
    vault = Vault(load_key_file(path, create=False), path)
    write_key_file(path, one)  # an older copy put back
    assert vault.seal(1, "echo", b"x").kek_version == 2
    write_key_file(path, KeyRing({**one.keys, 2: os.urandom(32)}))  # another key for v2
    with pytest.raises(VaultError, match="another key for the active version 2"):
        vault.seal(1, "echo", b"x")


# -- access ----------------------------------------------------------------------------------


def test_a_non_root_operator_is_refused_for_every_new_command(data: Path, tmp_path: Path) -> None:
    copy = public_tmpdir("opcmd-pkg")
    try:
        shutil.copytree(REPO / "svcgate", copy / "svcgate", ignore=shutil.ignore_patterns("*.pyc"))
        for path in copy.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        copy.chmod(0o755)
        for argv in (
            ["status"],
            ["audit", "tail", "-f"],
            ["profile", "warm", "x"],
            ["sandbox", "kill", "x", "y"],
            ["netns", "inspect", "x"],
            ["backup", str(copy / "b.db")],
        ):
            result = subprocess.run(
                [
                    "/usr/bin/python3",
                    "-c",
                    "import sys; from svcgate.operator_cli import main;"
                    " sys.exit(main(sys.argv[1:]))",
                    *argv,
                ],
                env={"PYTHONPATH": str(copy), "SVC_DATA_DIR": str(data)},
                cwd="/",
                user=65534,
                group=65534,
                extra_groups=[],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert (result.returncode, result.stdout) == (1, ""), (argv, result.stderr)
            assert result.stderr.startswith("svcgate: permission denied on "), result.stderr
            assert result.stderr.count("\n") == 1
        assert not (copy / "b.db").exists()
    finally:
        shutil.rmtree(copy)


# -- backup ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = start_gateway(tmp_path_factory.mktemp("opbackup"), idp=None)
    try:
        yield gw
    finally:
        assert gw.stop() == 0


def test_status_without_oidc_or_registry(bare: Gateway) -> None:
    status = ok_json("status", data_dir=data_dir_of(bare))
    assert status["oidc"] == {"configured": False, "issuer": None, "reachable": None, "error": None}
    lines = run_cli("status", data_dir=data_dir_of(bare)).stdout.splitlines()
    assert field("oidc", "not configured") in lines
    assert field("metrics", "not configured") in lines
    assert field("sandboxes", "none") in lines


SEQ_ISSUER = "seq-writer"


def seq_token(n: int) -> str:
    return f"svc_seqtoken{n:08d}"


class Writer:
    """Commits transactions that each add sequence number N to three tables at once: a user
    (issuer ``seq-writer``, subject N), a profile ``seq-N`` owned by it (token
    :func:`seq_token`) and an audit row (decision ``test.seq``, detail N)."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.committed = 0
        self.changed = threading.Condition()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        try:
            conn = sqlite3.connect(self.db, isolation_level=None)
            conn.execute("PRAGMA busy_timeout = 10000")
            while not self.stop.is_set():
                n = self.committed + 1
                conn.execute("BEGIN IMMEDIATE")
                user = conn.execute(
                    "INSERT INTO users (issuer, subject, role, created_at, updated_at)"
                    " VALUES (?, ?, 'user', 't', 't')",
                    (SEQ_ISSUER, str(n)),
                ).lastrowid
                conn.execute(
                    "INSERT INTO profiles (slug, name, user_id, token_hash, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, 't', 't')",
                    (
                        f"seq-{n}",
                        f"seq {n}",
                        user,
                        hashlib.sha256(seq_token(n).encode()).hexdigest(),
                    ),
                )
                conn.execute(
                    "INSERT INTO audit (ts, kind, decision, detail)"
                    " VALUES ('t', 'admin', 'test.seq', ?)",
                    (str(n),),
                )
                conn.execute("COMMIT")
                with self.changed:
                    self.committed = n
                    self.changed.notify_all()
            conn.close()
        except BaseException as exc:  # reported by the test (wait_for)
            with self.changed:
                self.error = exc
                self.changed.notify_all()

    def wait_for(self, count: int) -> None:
        with self.changed:
            self.changed.wait_for(
                lambda: self.committed >= count or self.error is not None, timeout=30
            )
        assert self.error is None and self.committed >= count, self.error


def dump(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        conn.execute("BEGIN")
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {
            t: sorted(conn.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables
        }


def seq_of(table: str, row: tuple[Any, ...], columns: dict[str, list[str]]) -> int | None:
    """The writer's sequence number in ``row``, or None for a row it did not write."""
    values = dict(zip(columns[table], row, strict=True))
    if table == "users" and values["issuer"] == SEQ_ISSUER:
        return int(values["subject"])
    if table == "profiles" and str(values["slug"]).startswith("seq-"):
        return int(values["slug"][4:])
    if table == "audit" and values["decision"] == "test.seq":
        return int(values["detail"])
    return None


def test_a_backup_taken_during_writes_is_the_database_at_one_commit_and_restores(
    bare: Gateway, tmp_path: Path
) -> None:
    data = data_dir_of(bare)
    source = data / DB_NAME
    writer = Writer(source)
    writer.thread.start()
    try:
        writer.wait_for(30)
        before = writer.committed
        target = tmp_path / "backups" / "svcgate-backup.db"
        target.parent.mkdir()
        result = run_cli("backup", str(target), "--json", data_dir=data)
        during = writer.committed
        writer.wait_for(during + 10)
    finally:
        writer.stop.set()
        writer.thread.join(timeout=30)
    assert writer.error is None
    assert result.returncode == 0, result.stderr
    assert during > before  # the writer kept committing while the backup ran
    report = json.loads(result.stdout)
    assert report["file"] == str(target) and report["integrity"] == "ok"
    assert report["schema_version"] == len(MIGRATIONS) and report["daemon"] is True
    assert report["source"] == str(source) and report["bytes"] == target.stat().st_size
    assert "vault key is not in the backup" in report["note"]
    assert stat_mode(target) == 0o600
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temp file left
    with sqlite3.connect(target) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)

    # The backup is the source as of one commit: for some M every table holds exactly the
    # writer's rows 1..M, and every other row equals the source's.
    copied, now = dump(target), dump(source)
    with sqlite3.connect(target) as conn:
        columns = {t: [c[1] for c in conn.execute(f'PRAGMA table_info("{t}")')] for t in copied}
    seqs = {
        t: sorted(n for row in copied[t] if (n := seq_of(t, row, columns)) is not None)
        for t in ("users", "profiles", "audit")
    }
    last = len(seqs["audit"])
    assert before <= last <= during
    assert seqs == {t: list(range(1, last + 1)) for t in seqs}
    assert report["tables"]["profiles"] == len(copied["profiles"])
    for table, rows in now.items():
        if table == "sqlite_sequence":
            continue
        expected = [r for r in rows if (seq_of(table, r, columns) or 0) <= last]
        assert copied[table] == expected, table
    audit_seq = dict(copied["sqlite_sequence"])["audit"]
    assert audit_seq == max(r[0] for r in copied["audit"])

    # A daemon started on the copy (with the same vault key) serves its profiles.
    restored = tmp_path / "restored"
    restored.mkdir(mode=0o700)
    shutil.copy(target, restored / DB_NAME)
    shutil.copy(data / "vault.key", restored / "vault.key")
    gw = start_gateway(tmp_path, idp=None, data_dir=restored)
    try:
        with httpx2.Client(timeout=60.0) as client:

            def initialize(n: int) -> int:
                response = client.post(
                    f"{gw.url}/mcp/p/seq-{n}",
                    json=INIT,
                    headers={
                        "Authorization": f"Bearer {seq_token(n)}",
                        "Accept": "application/json, text/event-stream",
                    },
                )
                return response.status_code

            assert initialize(last) == 200
            assert initialize(last + 1) == 401  # committed after the backup's snapshot
        status = ok_json("status", data_dir=restored)
        assert status["counts"]["profiles"] == len(copied["profiles"])
    finally:
        assert gw.stop() == 0

    # With no daemon running the backup reads the data directory's database itself.
    offline = run_cli("backup", str(tmp_path / "offline.db"), data_dir=restored)
    assert offline.returncode == 0, offline.stderr
    assert "(no daemon running)" in offline.stdout
    assert dump(tmp_path / "offline.db")["profiles"] == dump(restored / DB_NAME)["profiles"]


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_backup_refuses_to_replace_a_file_unless_forced(bare: Gateway, tmp_path: Path) -> None:
    data = data_dir_of(bare)
    target = tmp_path / "b.db"
    target.write_text("precious")
    line = fails("backup", str(target), data_dir=data)
    assert line == f"svcgate: {target} exists (use --force to replace it)"
    assert target.read_text() == "precious"
    forced = run_cli("backup", str(target), "--force", data_dir=data)
    assert forced.returncode == 0, forced.stderr
    lines = forced.stdout.splitlines()
    assert lines[0].startswith(f"backup written to {target} (")
    assert "schema version" in lines[0] and "integrity ok" in lines[0]
    assert lines[3].split() == ["TABLE", "ROWS"]
    assert any(line.split()[0] == "profiles" for line in lines[4:] if line.strip())
    assert lines[-1].startswith("note: the vault key is not in the backup")
    with sqlite3.connect(target) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert fails("backup", str(tmp_path), data_dir=data) == f"svcgate: {tmp_path} is a directory"
    missing = tmp_path / "nodata"
    assert fails("backup", str(tmp_path / "x.db"), data_dir=missing) == (
        f"svcgate: no database at {missing / DB_NAME}"
    )
    assert operator_backup.DB_NAME == DB_NAME


# -- the socket's side, in process -----------------------------------------------------------


class NoSandboxes:
    """A sandbox directory without sandboxes (the commands below need none)."""

    async def list(self) -> list[SandboxInfo]:
        return []

    def find(self, profile: str, server: str) -> SandboxKey:
        raise SandboxNotFound(f"no sandbox for server {server!r} in profile {profile!r}")

    async def logs(self, key: SandboxKey, n: int | None = None) -> builtins.list[str]:
        return []

    def handle(self, key: SandboxKey) -> None:
        return None

    async def stop(self, key: SandboxKey) -> bool:
        return False

    async def stop_profile(self, profile_id: int) -> int:
        return 0


def fds_open_on(path: Path) -> list[str]:
    found = []
    for entry in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{entry}") == str(path):
                found.append(entry)
        except OSError:
            continue
    return found


async def test_passed_descriptors_are_closed_once_the_request_is_answered() -> None:
    workdir = public_tmpdir("opfd")
    marker = workdir / "marker"
    marker.write_text("not a key ring")
    path = workdir / "control.sock"

    def request(cmd: str, *, pass_fd: bool) -> Any:
        fd = os.open(marker, os.O_RDONLY)
        try:
            with Connection(path) as conn:
                return conn.request({"cmd": cmd}, fds=[fd] if pass_fd else [])
        except ControlError as exc:
            return (exc.code, str(exc))
        finally:
            os.close(fd)

    try:
        async with trio.open_nursery() as nursery:
            context = OperatorContext(directory=NoSandboxes())
            with trio.fail_after(5):
                await nursery.start(serve_control_socket, path, context)
            assert await trio.to_thread.run_sync(lambda: request("sandbox.ps", pass_fd=True)) == []
            assert fds_open_on(marker) == []
            refused = await trio.to_thread.run_sync(lambda: request("vault.rotate", pass_fd=True))
            assert refused == ("unavailable", "this daemon holds no vault here")
            assert fds_open_on(marker) == []
            context.vault = Vault(KeyRing({1: os.urandom(32)}))
            context.store = cast(Any, object())  # never reached: the request is refused first
            refused = await trio.to_thread.run_sync(lambda: request("vault.rotate", pass_fd=False))
            assert refused == ("bad_request", "pass the key file as exactly one descriptor")
            marker.chmod(0o644)
            refused = await trio.to_thread.run_sync(lambda: request("vault.rotate", pass_fd=True))
            assert refused == (
                "bad_request",
                "the passed key file is accessible by group or others",
            )
            marker.chmod(0o600)
            refused = await trio.to_thread.run_sync(lambda: request("vault.rotate", pass_fd=True))
            assert refused == (
                "bad_request",
                "the passed key file: vault key file line 1 is malformed",
            )
            assert fds_open_on(marker) == []
            nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(workdir)


async def test_a_rotation_cancelled_midway_leaves_every_credential_readable_and_a_rerun_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = tmp_path / "vault.key"
    write_key_file(key, KeyRing({1: os.urandom(32)}))
    vault = Vault(load_key_file(key, create=False), key)
    secrets_by_server = {f"srv{n}": os.urandom(8).hex().encode() for n in range(450)}
    async with open_store(tmp_path / DB_NAME) as store:

        def seed(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO users (id, issuer, subject, role, created_at, updated_at)"
                " VALUES (1, 'i', 's', 'user', 't', 't')"
            )
            for server, secret in secrets_by_server.items():
                sealed = vault.seal(1, server, secret)
                conn.execute(
                    "INSERT INTO credentials (user_id, server, ciphertext, wrapped_dek,"
                    " kek_version, created_at, updated_at) VALUES (1, ?, ?, ?, ?, 't', 't')",
                    (server, sealed.ciphertext, sealed.wrapped_dek, sealed.kek_version),
                )

        await store.write(seed)
        write_key_file(key, next_ring(load_key_file(key, create=False)))  # as the CLI does
        context = OperatorContext(directory=NoSandboxes(), store=store, vault=vault)

        async def rotate() -> Any:
            fd = os.open(key, os.O_RDONLY)
            try:
                return await operator_records.vault_rotate(context, {}, [fd])
            finally:
                os.close(fd)

        real_write = store.write
        with trio.CancelScope() as scope:

            async def write_then_cancel(fn: Any) -> Any:
                result = await real_write(fn)
                scope.cancel()  # the daemon shuts down after the first batch committed
                return result

            monkeypatch.setattr(store, "write", write_then_cancel)
            await rotate()
        assert scope.cancelled_caught
        monkeypatch.setattr(store, "write", real_write)

        def rows(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return conn.execute(
                "SELECT user_id, server, ciphertext, wrapped_dek, kek_version FROM credentials"
            ).fetchall()

        def readable(found: list[tuple[Any, ...]]) -> dict[str, bytes]:
            fresh = Vault(load_key_file(key, create=False))  # what a restarted daemon loads
            return {r[1]: fresh.open(r[0], r[1], Sealed(r[2], r[3], r[4])) for r in found}

        found = await store.read(rows)
        assert sorted({r[4] for r in found}) == [1, 2]
        assert readable(found) == secrets_by_server
        result = await rotate()
        assert result == {"version": 2, "rewrapped": 250, "retired": [1]}
        found = await store.read(rows)
        assert {r[4] for r in found} == {2}
        assert vault.fingerprints().keys() == {2}
        write_key_file(key, KeyRing({2: load_key_file(key, create=False).keys[2]}))  # the prune
        assert readable(found) == secrets_by_server
