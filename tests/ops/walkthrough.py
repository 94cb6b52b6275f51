"""Follow docs/operations.md step by step, inside namespaces of its own.

Run by ``test_operations_walkthrough.py`` as
``unshare --mount --net --pid --fork --mount-proc -- python walkthrough.py CONFIG.json``.
It becomes PID 1 of the new pid namespace, forks the worker and reaps orphans (nginx's old
master, double-forked helpers) until the worker exits; when PID 1 exits the kernel kills
whatever is left in the namespace, so nothing can outlive the run.

The worker:

1. moves itself into a cgroup of its own below the test's (``cgroup_name``), so the
   gateway's sandbox cgroups and its start-up sweep of leftover cgroups stay inside it;
2. makes ``/etc``, ``/opt``, ``/var``, ``/usr/local`` and ``/root`` copy-on-write overlays
   (the upper layers on a tmpfs), mounts an empty tmpfs on ``/run``, brings ``lo`` up and
   lets ``gw.example`` resolve to 127.0.0.1: the host is not touched and a fresh host's
   ``/run`` is reproduced;
3. starts the Keycloak-style provider (``keycloak_style_idp.py``) and the stand-in service
   manager (``service_manager.py``) with its ``systemctl``/``journalctl`` shims;
4. runs the document's blocks in order (``PLAN``), with the checks after each, and writes a
   JSON result (steps with their durations, leftovers found) for the test to assert on.

Every wait is bounded. On a failure the journal of the units and nginx's error log are
appended to the log, everything started is stopped, and the exit status is 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import ssl
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO / "tests"), str(REPO)]

import httpx2  # noqa: E402  (after the path set-up)
from doc_blocks import Block, env_assignments, parse_blocks, set_env_lines  # noqa: E402
from gateway_support import authorize  # noqa: E402
from service_manager import DEFAULT_PATH, ServiceManager, write_shims  # noqa: E402

from sandbox.limits import detect_cgroups  # noqa: E402
from svcgate.vault import KeyRing, Sealed, Vault  # noqa: E402

HOST = "gw.example"
ORIGIN = f"https://{HOST}"
OVERLAYS = ("/etc", "/opt", "/var", "/usr/local", "/root")
CLIENT_SECRET = "walkthrough-client-secret-0123456789"
CERT = "/etc/nginx/ssl/svcgate.crt"
BLOCK_TIMEOUT = 240.0
ADMIN = "alice"
CREDENTIAL_SERVER = "echo"
CREDENTIAL_SECRET = "walkthrough-api-key-0123456789"

#: What the walkthrough does with each marked block of the document, in document order:
#: "run" (as written), "special" (run as written with a substitution or check described in
#: the step), "skip" (checked by hand; the reason is in the document's appendix).
PLAN: dict[str, str] = {
    "host-check": "run",
    "ubuntu-apparmor": "skip",
    "apt-packages": "special",
    "fetch-git": "skip",
    "fetch-tarball": "run",
    "install-venv": "run",
    "cli-wrapper": "run",
    "config-dir": "run",
    "vault-key": "run",
    "oidc-secret": "run",
    "env-install": "run",
    "env-values": "special",
    "units-install": "run",
    "service-check": "run",
    "tls-self-signed": "run",
    "nginx-site": "run",
    "tls-check": "run",
    "dashboard-build": "skip",
    "first-admin": "run",
    "profile-create": "run",
    "mcp-call": "run",
    "health": "run",
    "day2-status": "run",
    "day2-sandboxes": "run",
    "day2-logs": "run",
    "day2-encrypt": "run",
    "day2-rotate": "run",
    "backup": "run",
    "restore": "run",
    "upgrade": "run",
    "rollback": "run",
    "uninstall": "run",
}


class StepFailed(Exception):
    """A block failed or a check after it did not hold; the message says which."""


@dataclass
class Config:
    doc: Path
    work: Path
    wheelhouse: Path
    releases: Path  # holds svcgate-<old>.tar.gz and svcgate-<new>.tar.gz
    old_version: str
    new_version: str
    upgrade_table: str  # created by the extra migration of the new version
    cgroup_name: str
    result: Path

    @classmethod
    def load(cls, path: Path) -> Config:
        raw = json.loads(path.read_text())
        return cls(
            doc=Path(raw["doc"]),
            work=Path(raw["work"]),
            wheelhouse=Path(raw["wheelhouse"]),
            releases=Path(raw["releases"]),
            old_version=raw["old_version"],
            new_version=raw["new_version"],
            upgrade_table=raw["upgrade_table"],
            cgroup_name=raw["cgroup_name"],
            result=Path(raw["result"]),
        )


# -- cgroups ---------------------------------------------------------------------------------


def own_cgroup_dirs(name: str) -> list[Path]:
    """``name`` below this process's cgroup, in each hierarchy the gateway creates sandbox
    cgroups in (``sandbox.limits.detect_cgroups``: v2, or v1's memory/pids/cpu)."""
    host = detect_cgroups()
    if host.mode == "v2" and host.v2_mount is not None:
        return [host.v2_mount / host.v2_own.lstrip("/") / name]
    return [mount / own.lstrip("/") / name for _, mount, own in host.v1]


def enter_own_cgroups(name: str) -> list[Path]:
    dirs = own_cgroup_dirs(name)
    for directory in dirs:
        directory.mkdir(exist_ok=True)
        (directory / "cgroup.procs").write_text(str(os.getpid()))
    return dirs


def leftover_cgroups(dirs: list[Path]) -> list[str]:
    return sorted(str(child) for d in dirs if d.is_dir() for child in d.iterdir() if child.is_dir())


# -- the namespace ---------------------------------------------------------------------------


def sh(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60, **kwargs)


def isolate_host(work: Path) -> None:
    layers = work / "layers"
    layers.mkdir()
    sh(["mount", "-t", "tmpfs", "-o", "mode=0700", "walkthrough-layers", str(layers)])
    for target in OVERLAYS:
        name = target.strip("/").replace("/", "-")
        upper, scratch = layers / name / "upper", layers / name / "work"
        upper.mkdir(parents=True)
        scratch.mkdir(parents=True)
        options = f"lowerdir={target},upperdir={upper},workdir={scratch}"
        sh(["mount", "-t", "overlay", "-o", options, f"walkthrough-{name}", target])
    sh(["mount", "-t", "tmpfs", "-o", "mode=0755,nosuid,nodev", "walkthrough-run", "/run"])
    sh(["ip", "link", "set", "lo", "up"])
    with open("/etc/hosts", "a") as hosts:
        hosts.write(f"\n127.0.0.1 {HOST}\n")


# -- the run ---------------------------------------------------------------------------------


@dataclass
class Walkthrough:
    cfg: Config
    log: TextIO
    blocks: dict[str, Block]
    env: dict[str, str]
    cgroups: list[Path]
    issuer: str = ""
    steps: list[dict[str, Any]] = field(default_factory=list)
    session: str = ""

    def note(self, message: str) -> None:
        self.log.write(f"{time.strftime('%H:%M:%S')} {message}\n")
        self.log.flush()

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        self.note(f"=== step {name}")
        started = time.monotonic()
        yield
        seconds = round(time.monotonic() - started, 2)
        self.steps.append({"step": name, "seconds": seconds, "plan": PLAN.get(name, "check")})
        self.note(f"=== step {name} done in {seconds}s")

    def run_block(self, name: str, *, cwd: Path | None = None, **extra: str) -> str:
        """Run the document's block ``name`` with bash (-euo pipefail); return its stdout
        (both streams go to the log)."""
        block = self.blocks[name]
        self.note(f"$ # docs/operations.md line {block.line}\n{block.text.rstrip()}")
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block.text],
            env={**self.env, **extra},
            cwd=cwd or self.cfg.work,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT,
        )
        output = result.stdout + result.stderr
        self.note(output.rstrip())
        if result.returncode != 0:
            raise StepFailed(f"block {name!r} exited {result.returncode}:\n{output}")
        return result.stdout

    def expect(self, condition: bool, message: str) -> None:
        if not condition:
            raise StepFailed(message)


def start_idp(log: TextIO) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "keycloak_style_idp.py"),
            "--client-secret",
            CLIENT_SECRET,
            "--redirect-uri",
            f"{ORIGIN}/api/auth/callback",
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()  # bounded: the provider prints it at once or exits
    if not line.startswith("devidp: issuer "):
        proc.kill()
        proc.wait()
        raise StepFailed(f"identity provider did not start: {line!r}")
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    return proc, line.removeprefix("devidp: issuer ")


def tls_context() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=CERT)


def sign_in(username: str) -> str:
    """The browser's sign-in through nginx and TLS; return the ``svc_session`` cookie."""
    with httpx2.Client(verify=tls_context(), timeout=30.0) as client:
        start = client.get(f"{ORIGIN}/api/auth/login")
        if start.status_code != 302:
            raise StepFailed(f"/api/auth/login answered {start.status_code}: {start.text}")
        callback = authorize(start.headers["location"], username)
        if not callback.startswith(f"{ORIGIN}/api/auth/callback?"):
            raise StepFailed(f"the provider redirected to {callback!r}")
        done = client.get(callback)
        if done.status_code != 302:
            raise StepFailed(f"callback answered {done.status_code}: {done.text}")
        session = client.cookies.get("svc_session")
        if not session:
            raise StepFailed("no svc_session cookie after sign-in")
        return session


def api_get(path: str, session: str) -> Any:
    with httpx2.Client(verify=tls_context(), timeout=30.0) as client:
        response = client.get(f"{ORIGIN}{path}", headers={"Cookie": f"svc_session={session}"})
    if response.status_code != 200:
        raise StepFailed(f"GET {path} answered {response.status_code}: {response.text}")
    return response.json()


def profile_slugs(session: str) -> list[str]:
    return sorted(p["slug"] for p in api_get("/api/profiles", session))


def store_credential(session: str) -> None:
    """A user's API credential, so that backup, restore and key rotation have one to keep."""
    with httpx2.Client(verify=tls_context(), timeout=30.0) as client:
        response = client.put(
            f"{ORIGIN}/api/credentials/{CREDENTIAL_SERVER}",
            json={"secret": CREDENTIAL_SECRET},
            headers={"Cookie": f"svc_session={session}", "Origin": ORIGIN},
        )
    if response.status_code != 204:
        raise StepFailed(f"storing a credential answered {response.status_code}: {response.text}")


def check_credential(w: Walkthrough, db: Path, *, restarted: bool) -> None:
    """The stored credential opens with /etc/svcgate/vault.key, whose sealed copy holds the
    same ring; after a restart the daemon was handed exactly that ring (through
    LoadCredentialEncrypted=). Before one it still has the copy it started with."""
    ring_text = Path("/etc/svcgate/vault.key").read_text()
    ring = KeyRing.parse(ring_text)
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = conn.execute(
            "SELECT user_id, ciphertext, wrapped_dek, kek_version FROM credentials"
            " WHERE server = ?",
            (CREDENTIAL_SERVER,),
        ).fetchone()
    finally:
        conn.close()
    w.expect(row is not None, "the stored credential is gone")
    sealed = Sealed(row[1], row[2], row[3])
    opened = Vault(ring).open(row[0], CREDENTIAL_SERVER, sealed)
    w.expect(opened == CREDENTIAL_SECRET.encode(), "the credential does not decrypt")
    sealed_copy = sh(
        ["systemd-creds", "decrypt", "--name=vault-key", "/etc/svcgate/vault.key.cred", "-"]
    ).stdout
    w.expect(sealed_copy == ring_text, "vault.key.cred does not hold vault.key's ring")
    if restarted:
        handed = Path("/run/credentials/svcgate.service/vault-key").read_text()
        w.expect(handed == ring_text, "the daemon was handed another key ring than vault.key")
    w.note(f"credential of {CREDENTIAL_SERVER!r} opens with key version {sealed.kek_version}")


def schema_version(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def table_exists(db: Path, table: str) -> bool:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone()
        return row is not None
    finally:
        conn.close()


def apt_packages(block: Block) -> list[str]:
    words = block.text.replace("\\\n", " ").split()
    start = words.index("install") + 1 if "install" in words else len(words)
    return [w for w in words[start:] if not w.startswith("-")]


def missing_packages(names: list[str]) -> list[str]:
    missing = []
    for name in names:
        result = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True, check=False
        )
        if "install ok installed" not in result.stdout:
            missing.append(name)
    return missing


def netns_names() -> list[str]:
    """``ip netns list``, names only."""
    listed = sh(["ip", "netns", "list"]).stdout
    return sorted(line.split()[0] for line in listed.splitlines() if line.strip())


def other_processes() -> list[str]:
    """Processes in this pid namespace other than PID 1 (the reaper) and this worker."""
    mine = {1, os.getpid()}
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in mine:
            with contextlib.suppress(OSError):
                stat_text = (entry / "stat").read_text()
                if stat_text.rsplit(")", 1)[1].split()[0] == "Z":
                    continue
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                found.append(f"{entry.name} {cmdline.strip()}")
    return found


def walk(w: Walkthrough) -> None:
    """The document, block by block, with the checks a reader would make after each."""
    cfg = w.cfg
    db = Path("/var/lib/svcgate/svcgate.db")

    unknown = sorted(set(w.blocks) ^ set(PLAN))
    w.expect(not unknown, f"blocks and plan differ: {unknown}")
    w.expect(list(w.blocks) == list(PLAN), "the plan's order is not the document's")

    with w.step("apt-packages"):
        names = apt_packages(w.blocks["apt-packages"])
        w.note(f"checking that these are installed: {' '.join(names)}")
        missing = missing_packages(names)
        w.expect(not missing, f"not installed (scripts/system-packages): {missing}")

    with w.step("host-check"):
        out = w.run_block("host-check")
        w.expect("DISABLED" not in out, "a cgroup controller is disabled")

    with w.step("install"):
        w.run_block("fetch-tarball", cwd=cfg.releases)
        version = w.run_block("install-venv").strip()
        w.expect(version.endswith(f"svcgate {cfg.old_version}"), f"version: {version[-200:]!r}")
        w.run_block("cli-wrapper")

    with w.step("config-and-keys"):
        w.run_block("config-dir")
        w.run_block("vault-key")
        key = Path("/etc/svcgate/vault.key")
        w.expect(oct(key.stat().st_mode & 0o777) == "0o400", "vault.key is not 0400")
        w.expect(KeyRing.parse(key.read_text()).active == 1, "vault.key is not a version-1 ring")
        w.run_block("oidc-secret", CLIENT_SECRET=CLIENT_SECRET)
        w.run_block("env-install")
        values = env_assignments(w.blocks["env-values"])
        values["SVC_OIDC_ISSUER"] = w.issuer
        env_file = Path("/etc/svcgate/svcgate.env")
        env_file.write_text(set_env_lines(env_file.read_text(), values))
        w.note(f"set in {env_file}: {sorted(values)} (SVC_OIDC_ISSUER={w.issuer})")

    with w.step("units"):
        w.run_block("units-install")
        out = w.run_block("service-check")
        w.expect(out.startswith("active"), "svcgate.service is not active")
        handed = Path("/run/credentials/svcgate.service")
        w.expect((handed / "vault-key").read_text() == key.read_text(), "vault-key not handed")
        secret = (handed / "oidc-client-secret").read_text()
        w.expect(secret == CLIENT_SECRET + "\n", "oidc-client-secret not handed")
        w.expect(oct((handed / "vault-key").stat().st_mode & 0o777) == "0o400", "not 0400")

    with w.step("tls-proxy"):
        w.run_block("tls-self-signed")
        w.env.update(CURL_CA_BUNDLE=CERT, SSL_CERT_FILE=CERT)  # as the document says
        w.run_block("nginx-site")
        out = w.run_block("tls-check")
        w.expect("401 max-age=63072000" in out, "no 401 with HSTS through TLS")

    with w.step("first-admin"):
        w.session = sign_in(ADMIN)
        me = api_get("/api/me", w.session)
        w.expect(me["user"]["role"] == "admin", f"{ADMIN} is not an admin: {me}")
        out = w.run_block("first-admin")
        w.expect("role=admin" in out, "the audit log shows no admin sign-in")

    with w.step("profile-and-mcp"):
        w.run_block("profile-create", SESSION=w.session)
        store_credential(w.session)
        out = w.run_block("mcp-call")
        w.expect("hello through TLS" in out, "the MCP call did not echo")
        w.expect(profile_slugs(w.session) == ["smoke"], "profile smoke missing")

    with w.step("health"):
        w.run_block("health")

    with w.step("day-2"):
        key = Path("/etc/svcgate/vault.key")
        w.run_block("day2-status")
        out = w.run_block("day2-sandboxes")
        w.expect("smoke" in out and "echo" in out, "sandbox ps shows no smoke/echo sandbox")
        out = w.run_block("day2-logs")
        journal = [line for line in out.splitlines() if line.startswith("{")]
        w.expect(bool(journal), "no JSON log lines in the journal")
        for line in journal:
            json.loads(line)
        w.run_block("day2-encrypt")
        sealed_files = {
            "vault-key": ("/etc/svcgate/vault.key.cred", key.read_text()),
            "oidc-client-secret": ("/etc/svcgate/oidc-client-secret.cred", CLIENT_SECRET + "\n"),
        }
        for name, (source, plain) in sealed_files.items():
            opened = sh(["systemd-creds", "decrypt", f"--name={name}", source, "-"]).stdout
            w.expect(opened == plain, f"systemd-creds decrypt of {source} differs")
            handed = Path("/run/credentials/svcgate.service", name).read_text()
            w.expect(handed == plain, f"the restarted daemon was not handed {name}")
        w.expect(not Path("/etc/svcgate/oidc-client-secret").exists(), "plain secret left")
        w.run_block("day2-rotate")
        w.expect(KeyRing.parse(key.read_text()).active == 2, "the key was not rotated")
        w.expect(oct(key.stat().st_mode & 0o777) == "0o400", "vault.key is not 0400 again")
        check_credential(w, db, restarted=False)

    with w.step("backup"):
        w.run_block("backup")
        backups = sorted(Path("/var/backups/svcgate").glob("svcgate-*.db"))
        w.expect(len(backups) == 1, f"backups: {backups}")
        conn = sqlite3.connect(f"file:{backups[0]}?mode=ro", uri=True)
        try:
            slugs = [r[0] for r in conn.execute("SELECT slug FROM profiles")]
        finally:
            conn.close()
        w.expect(slugs == ["smoke"], f"backup holds profiles {slugs}")

    with w.step("restore"):
        before = profile_slugs(w.session)
        inode = db.stat().st_ino
        w.run_block("restore")
        w.expect(db.stat().st_ino != inode, "the database was not replaced")
        w.expect(profile_slugs(w.session) == before, "profiles differ after the restore")
        out = w.run_block("mcp-call")
        w.expect("hello through TLS" in out, "the MCP call failed after the restore")
        check_credential(w, db, restarted=True)

    with w.step("upgrade"):
        old_schema = schema_version(db)
        w.run_block("upgrade", cwd=cfg.releases)
        w.expect(schema_version(db) == old_schema + 1, "the new migration did not run")
        w.expect(table_exists(db, cfg.upgrade_table), "the new migration's table is missing")
        version = sh(["/opt/svcgate/venv/bin/svcgate", "--version"]).stdout.strip()
        w.expect(version == f"svcgate {cfg.new_version}", f"after the upgrade: {version!r}")
        w.expect(profile_slugs(w.session) == ["smoke"], "profiles lost in the upgrade")
        upgraded = cfg.work / "upgraded.db"
        sh(["/usr/local/sbin/svcgate", "backup", str(upgraded)], env=w.env)

    with w.step("rollback"):
        w.run_block("rollback")
        w.expect(schema_version(db) == old_schema, "the rollback did not restore the database")
        w.expect(not table_exists(db, cfg.upgrade_table), "the upgrade's table survived")
        w.expect(profile_slugs(w.session) == ["smoke"], "profiles lost in the rollback")
        check_credential(w, db, restarted=True)
        refused = refuse_newer_schema(cfg, upgraded)
        w.note(refused)
        w.expect("newer than this svcgate" in refused, "old version did not refuse a newer DB")

    with w.step("uninstall"):
        w.run_block("uninstall")
        w.expect(not Path("/run/svcgate").exists(), "/run/svcgate is left")
        w.expect(not Path("/run/credentials/svcgate.service").exists(), "credentials are left")
        w.expect(netns_names() == [], f"network namespaces left: {netns_names()}")
        w.expect(leftover_cgroups(w.cgroups) == [], "sandbox cgroups left")
        gateway = [p for p in other_processes() if "svcgate" in p or "bwrap" in p]
        w.expect(gateway == [], f"processes left: {gateway}")


def refuse_newer_schema(cfg: Config, upgraded: Path) -> str:
    """The old version, started on a database the new one migrated, exits 1 naming it."""
    scratch = cfg.work / "refuse"
    scratch.mkdir()
    (scratch / "data").mkdir(mode=0o700)
    shutil.copyfile(upgraded, scratch / "data" / "svcgate.db")
    env = {
        "PATH": DEFAULT_PATH,
        "SVC_BEARER_TOKEN": "walkthrough-refusal-token-0123456789",
        "SVC_LISTEN": "127.0.0.1:0",
        "SVC_DATA_DIR": str(scratch / "data"),
        "SVC_SANDBOX_DIR": str(scratch / "sandboxes"),
        "SVC_IMAGE_DIR": str(scratch / "images"),
    }
    result = subprocess.run(
        ["/opt/svcgate/venv/bin/svcgate", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 1:
        raise StepFailed(f"old version on a newer database exited {result.returncode}")
    return result.stderr.strip().splitlines()[-1]


def worker(cfg: Config) -> int:
    log = (cfg.work / "walkthrough.log").open("a")
    result: dict[str, Any] = {"ok": False, "steps": [], "error": ""}
    cgroups = enter_own_cgroups(cfg.cgroup_name)
    isolate_host(cfg.work)
    journals = cfg.work / "journal"
    journals.mkdir()
    manager = ServiceManager(journals, cfg.work / "manager.sock")
    threading.Thread(target=manager.serve, daemon=True).start()
    shims = cfg.work / "shims"
    write_shims(shims, cfg.work / "manager.sock")
    env = {
        "PATH": f"{shims}:{DEFAULT_PATH}",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(cfg.wheelhouse),
        "PIP_NO_CACHE_DIR": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_PROGRESS_BAR": "off",
        "PIP_QUIET": "1",
    }
    blocks = parse_blocks(cfg.doc.read_text())
    w = Walkthrough(cfg, log, blocks, env, cgroups)
    idp: subprocess.Popen[str] | None = None
    try:
        idp, w.issuer = start_idp(log)
        w.note(f"identity provider: {w.issuer}")
        walk(w)
        result["ok"] = True
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        w.note(traceback.format_exc())
        for journal in sorted(journals.glob("*.log")):
            w.note(f"--- journal {journal.name}\n{journal.read_text(errors='replace')[-20000:]}")
        nginx_errors = Path("/var/log/nginx/error.log")
        if nginx_errors.exists():
            w.note(f"--- {nginx_errors}\n{nginx_errors.read_text(errors='replace')[-5000:]}")
    finally:
        manager.close()
        if idp is not None:
            idp.terminate()
            try:
                idp.wait(timeout=10)
            except subprocess.TimeoutExpired:
                idp.kill()
                idp.wait()
    result["steps"] = w.steps
    result["leftover_processes"] = other_processes()
    result["leftover_namespaces"] = netns_names()
    result["leftover_cgroups"] = leftover_cgroups(cgroups)
    cfg.result.write_text(json.dumps(result, indent=2))
    log.close()
    return 0 if result["ok"] else 1


def reap_until(child: int) -> int:
    """PID 1's duty: reap every orphan; return the worker's exit status."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1
        if pid == child:
            return os.waitstatus_to_exitcode(status)


def main() -> int:
    cfg = Config.load(Path(sys.argv[1]))
    child = os.fork()
    if child == 0:
        code = 1
        try:
            code = worker(cfg)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(child, signal.SIGTERM))
    return reap_until(child)


if __name__ == "__main__":
    sys.exit(main())
