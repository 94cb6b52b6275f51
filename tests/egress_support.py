"""Helpers for the egress tests: a fake upstream, credentials, audit rows, leak checks.

* :func:`fake_github`: the fake GitHub REST API (``tests/fixtures/fake_github.py``) on
  loopback over HTTPS with its own CA, recording every request's headers;
* :func:`egress_env`: the gateway settings that let the proxy reach it
  (``SVC_EGRESS_ALLOW_CIDRS=127.0.0.0/8``, ``SVC_EGRESS_HOSTS=api.github.com=127.0.0.1:<port>``,
  ``SVC_EGRESS_UPSTREAM_CA_FILE``);
* :func:`github_server`: the ``SVC_SERVERS_FILE`` entry running
  ``@modelcontextprotocol/server-github`` under node, its HTTP(S) routed through the proxy;
* :func:`egress_gateway`: a data-plane gateway (``tests/data_plane_support.py``: every server
  of :func:`data_plane_support.stage_servers`) plus extra servers, e.g. ``github``;
* :func:`put_credential`, :func:`audit_events`, :func:`wait_audit`: the credentials and audit
  APIs as a signed-in user;
* :func:`secret_forms`, :func:`leaks`, :func:`sandbox_processes`, :func:`files_containing`:
  where a secret must never appear (its raw and base64 forms, a sandbox's environment and
  files seen from the host through ``/proc/<pid>``; root only);
* :func:`wire_tool_call`: one ``tools/call`` over raw HTTP, returning every byte received.

Node 20's global ``fetch`` (undici) ignores ``HTTPS_PROXY`` (``NODE_USE_ENV_PROXY`` only
exists from node 22.21/24), and server-github only falls back to ``node-fetch`` (the
``http``/``https`` modules) when there is no global ``fetch``. So :func:`github_server` runs
node with ``--no-experimental-fetch`` and preloads ``global-agent``'s bootstrap, which makes
the ``http``/``https`` modules use ``HTTP_PROXY``/``HTTPS_PROXY`` (with an empty
``GLOBAL_AGENT_ENVIRONMENT_VARIABLE_NAMESPACE``); node trusts the gateway CA through
``NODE_EXTRA_CA_CERTS``, which the gateway sets.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
from data_plane_support import DataPlaneGateway, start_data_plane_gateway
from fixtures.fake_github import GITHUB_HOST, FakeGitHub
from gateway_support import Gateway, api
from node_support import (
    NODE_MODULES,
    SANDBOX_NODE,
    SANDBOX_NODE_MODULES,
    node_available,
    node_executable,
    sandbox_node_modules_source,
)
from process_support import processes_with, public_tmpdir

from devidp.provider import DevIdP

GITHUB_SERVER = "github"
GITHUB_TOKEN_ENV = "GITHUB_PERSONAL_ACCESS_TOKEN"
GITHUB_ENTRY = Path("@modelcontextprotocol", "server-github", "dist", "index.js")
GLOBAL_AGENT_BOOTSTRAP = Path("global-agent", "bootstrap.js")
LOOPBACK_CIDR = "127.0.0.0/8"
AUDIT_TIMEOUT = 15.0

GITHUB_MISSING_REASON = (
    "node >= 20 or server-github/global-agent missing in tests/node: run scripts/node-deps"
)


def github_available() -> bool:
    """node is usable and ``scripts/node-deps`` installed server-github and global-agent."""
    return node_available() and all(
        (NODE_MODULES / p).is_file() for p in (GITHUB_ENTRY, GLOBAL_AGENT_BOOTSTRAP)
    )


# -- the fake upstream and the gateway settings that reach it --------------------------------


@contextmanager
def fake_github(
    tokens: Mapping[str, str] | None = None, *, tls: bool = True
) -> Iterator[FakeGitHub]:
    """The fake GitHub API on 127.0.0.1 (ephemeral port), stopped at the end.

    ``tokens`` maps the bearer tokens it accepts to account logins (None: any token)."""
    with FakeGitHub(tokens=tokens, tls=tls) as fake:
        yield fake


def egress_env(
    upstreams: Mapping[str, str] | None = None,
    *,
    ca_files: Sequence[Path] = (),
    allow_cidrs: str = LOOPBACK_CIDR,
    **more: str,
) -> dict[str, str]:
    """Gateway settings for tests whose upstreams listen on loopback.

    ``upstreams`` maps host names to ``127.0.0.1:<port>`` (``SVC_EGRESS_HOSTS``, the port
    overriding the one dialled), ``ca_files`` are the upstreams' test CAs (concatenated into
    one file for ``SVC_EGRESS_UPSTREAM_CA_FILE``), ``allow_cidrs`` is the operator carve-out
    (``SVC_EGRESS_ALLOW_CIDRS``; empty: none). ``more``: further ``SVC_*`` settings.
    """
    env: dict[str, str] = {}
    if allow_cidrs:
        env["SVC_EGRESS_ALLOW_CIDRS"] = allow_cidrs
    if upstreams:
        env["SVC_EGRESS_HOSTS"] = ",".join(f"{h}={a}" for h, a in upstreams.items())
    if len(ca_files) == 1:
        env["SVC_EGRESS_UPSTREAM_CA_FILE"] = str(ca_files[0])
    elif ca_files:
        bundle = public_tmpdir("egress-ca") / "upstream-cas.pem"
        bundle.write_text("".join(Path(f).read_text() for f in ca_files))
        bundle.chmod(0o644)
        env["SVC_EGRESS_UPSTREAM_CA_FILE"] = str(bundle)
    env.update(more)
    return env


def github_egress_env(fake: FakeGitHub, **more: str) -> dict[str, str]:
    """:func:`egress_env` for the fake GitHub API as ``api.github.com``."""
    ca = [fake.ca_file] if fake.tls else []
    return egress_env({GITHUB_HOST: fake.address}, ca_files=ca, **more)


# -- servers --------------------------------------------------------------------------------


def sandbox_node() -> str:
    """The node binary a sandbox runs: the host's when it lives under ``/usr`` (which the
    sandbox sees read-only), else :data:`SANDBOX_NODE`."""
    host_node = os.path.realpath(node_executable() or SANDBOX_NODE)
    return host_node if host_node.startswith("/usr/") else SANDBOX_NODE


def node_proxy_env(node_modules: str = SANDBOX_NODE_MODULES) -> dict[str, str]:
    """Environment making a node server's ``http``/``https`` requests use the proxy."""
    bootstrap = Path(node_modules) / GLOBAL_AGENT_BOOTSTRAP
    return {
        # No global fetch: libraries fall back to node-fetch / http(s), which global-agent
        # routes through HTTP_PROXY / HTTPS_PROXY.
        "NODE_OPTIONS": f"--no-experimental-fetch --require {bootstrap}",
        "GLOBAL_AGENT_ENVIRONMENT_VARIABLE_NAMESPACE": "",
    }


def github_server(
    *,
    egress: Sequence[str] | None = None,
    credential_env: str | None = GITHUB_TOKEN_ENV,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The ``SVC_SERVERS_FILE`` entry for server-github in a sandbox.

    ``credential_env``: the variable the gateway sets to the owner's credential placeholder
    (None: the field is left out). ``egress``: hosts reachable without a credential (None:
    the field is left out).
    """
    entry: dict[str, Any] = {
        "command": [sandbox_node(), str(Path(SANDBOX_NODE_MODULES) / GITHUB_ENTRY)],
        "binds": [{"source": str(sandbox_node_modules_source()), "dest": SANDBOX_NODE_MODULES}],
        "env": {**node_proxy_env(), **(env or {})},
    }
    if egress is not None:
        entry["egress"] = list(egress)
    if credential_env is not None:
        entry["credential_env"] = credential_env
    return entry


# -- the gateway ----------------------------------------------------------------------------


@contextmanager
def egress_gateway(
    tmp: Path, idp: DevIdP, servers: Mapping[str, Mapping[str, Any]], **extra_env: str
) -> Iterator[DataPlaneGateway]:
    """:func:`data_plane_support.start_data_plane_gateway` with ``servers`` added to (or
    replacing entries of) the servers file, stopped cleanly (exit 0) at the end; its staged
    files and sandbox state directory are removed then."""
    gateway = start_data_plane_gateway(tmp, idp, extra_servers=servers, **extra_env)
    try:
        yield gateway
    finally:
        gateway.open_gate()
        code = gateway.gateway.stop()
        shutil.rmtree(gateway.stage, ignore_errors=True)
        shutil.rmtree(Path(gateway.gateway.env["SVC_SANDBOX_DIR"]).parent, ignore_errors=True)
        assert code == 0, gateway.gateway.log_text()[-4000:]


# -- the credentials and audit APIs ---------------------------------------------------------


def put_credential(
    gateway: Gateway,
    session: str,
    server: str,
    secret: str,
    *,
    placeholder: str | None = None,
    allowed_hosts: Sequence[str] = (),
    inject_header: str | None = None,
    inject_format: str | None = None,
) -> None:
    """``PUT /api/credentials/{server}`` as the user of ``session`` (expects 204)."""
    body: dict[str, Any] = {"secret": secret, "allowed_hosts": list(allowed_hosts)}
    for key, value in (
        ("placeholder", placeholder),
        ("inject_header", inject_header),
        ("inject_format", inject_format),
    ):
        if value is not None:
            body[key] = value
    with api(gateway, session) as client:
        response = client.put(
            f"/api/credentials/{server}", json=body, headers={"Origin": gateway.origin}
        )
    assert response.status_code == 204, response.text


def user_id(gateway: Gateway, session: str) -> int:
    """The id of the user signed in with ``session`` (``GET /api/me``)."""
    with api(gateway, session) as client:
        response = client.get("/api/me")
    assert response.status_code == 200, response.text
    uid: int = response.json()["user"]["id"]
    return uid


def audit_events(
    gateway: Gateway, session: str, *, kind: str | None = "egress"
) -> list[dict[str, Any]]:
    """Every audit event ``session`` may see (all users' for an admin), newest first,
    of ``kind`` (None: every kind)."""
    events: list[dict[str, Any]] = []
    params: dict[str, int] = {"limit": 200}
    with api(gateway, session) as client:
        while True:
            response = client.get("/api/audit", params=params)
            assert response.status_code == 200, response.text
            page = response.json()
            events.extend(e for e in page["events"] if kind is None or e["kind"] == kind)
            if not page["next_before"]:
                return events
            params["before"] = page["next_before"]


def wait_audit(
    gateway: Gateway,
    session: str,
    match: Callable[[dict[str, Any]], bool],
    *,
    kind: str | None = "egress",
    timeout: float = AUDIT_TIMEOUT,
) -> list[dict[str, Any]]:
    """Poll the audit log until an event of ``kind`` satisfies ``match`` (egress rows are
    written in batches); return every such event. Fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        events = audit_events(gateway, session, kind=kind)
        found = [e for e in events if match(e)]
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"no matching {kind} audit event; got {events[:20]}")
        time.sleep(0.1)


def egress_match(
    *, server: str, host: str, decision: str, user: int | None = None
) -> Callable[[dict[str, Any]], bool]:
    """A :func:`wait_audit` predicate for one egress decision."""

    def match(event: dict[str, Any]) -> bool:
        return (
            event["server"] == server
            and event["host"] == host
            and event["decision"] == decision
            and (user is None or event["user_id"] == user)
        )

    return match


# -- where secrets must not appear -----------------------------------------------------------


def _base64_cores(data: bytes) -> list[str]:
    """For each alignment of ``data`` inside a longer byte string, the base64 characters
    that depend on ``data`` alone: any base64 text of a string containing ``data`` contains
    one of them."""
    cores: list[str] = []
    n = len(data)
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + data + b"\0\0").decode()
        core = "".join(
            c for j, c in enumerate(encoded) if 6 * j >= 8 * shift and 6 * j + 6 <= 8 * (shift + n)
        )
        if core:
            cores.append(core)
    return cores


def secret_forms(secret: str) -> list[str]:
    """The forms of ``secret`` that must not leak: raw, percent-encoded, base64 (standard
    and URL-safe, alone or inside a longer string, as in ``Basic`` credentials)."""
    raw = secret.encode()
    forms = {secret, urllib.parse.quote(secret, safe=""), base64.b64encode(raw).decode()}
    forms.add(base64.urlsafe_b64encode(raw).decode().rstrip("="))
    for core in _base64_cores(raw):
        forms.add(core)
        forms.add(core.replace("+", "-").replace("/", "_"))
    return sorted(f for f in forms if len(f) >= 8)


def leaks(text: str | bytes, secrets: Iterable[str]) -> list[str]:
    """The forms of ``secrets`` (:func:`secret_forms`) found in ``text``."""
    haystack = text if isinstance(text, bytes) else text.encode()
    return [f for s in secrets for f in secret_forms(s) if f.encode() in haystack]


def _parent(pid: int) -> int:
    # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses.
    stat_line = Path(f"/proc/{pid}/stat").read_text()
    return int(stat_line.rsplit(")", 1)[1].split()[1])


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether host process ``pid`` is ``ancestor`` or one of its descendants."""
    seen = 0
    while pid > 1 and seen < 64:
        if pid == ancestor:
            return True
        try:
            pid = _parent(pid)
        except (OSError, ValueError, IndexError):
            return False
        seen += 1
    return pid == ancestor


def sandbox_processes(marker: str, *, under: int | None = None) -> dict[int, dict[str, str]]:
    """Host pids of the sandboxed processes whose argv contains ``marker`` (descendants of
    process ``under`` only, e.g. a gateway's pid), with their environment (read through
    ``/proc``: root only). bwrap's own process, which carries the same argv, is left out."""
    found: dict[int, dict[str, str]] = {}
    for pid in processes_with(marker):
        if under is not None and not descends_from(pid, under):
            continue
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if os.path.basename(argv0) == b"bwrap":
            continue
        env = dict(
            item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item
        )
        found[pid] = env
    return found


# Paths inside the sandbox (read through /proc/<pid>/root), not the host's: the writable
# ones, the generated /etc and the gateway's /svcgate (the CA bundle).
SANDBOX_PRIVATE_ROOTS = (
    "/home",
    "/tmp",  # noqa: S108
    "/var/tmp",  # noqa: S108
    "/run",
    "/dev/shm",  # noqa: S108
    "/etc",
    "/svcgate",
)


def files_containing(
    pid: int, needles: Iterable[str], roots: Sequence[str] = SANDBOX_PRIVATE_ROOTS
) -> list[str]:
    """Files under ``roots`` *as process ``pid`` sees them* (``/proc/<pid>/root``) that
    contain one of ``needles`` in any of their :func:`secret_forms`: the sandbox's home, temp
    dirs, generated ``/etc`` and ``/svcgate`` (the CA bundle). Read-only binds of host trees
    (``/usr``, node_modules) are not walked."""
    forms = [f.encode() for n in needles for f in secret_forms(n)]
    base = Path(f"/proc/{pid}/root")
    hits: list[str] = []
    for root in roots:
        for directory, _dirs, files in os.walk(base / root.lstrip("/")):
            for name in files:
                path = Path(directory, name)
                try:
                    # lstat: a symlink in the sandbox would resolve against the host's root.
                    info = path.lstat()
                    if not stat.S_ISREG(info.st_mode) or info.st_size > 16 << 20:
                        continue
                    data = path.read_bytes()
                except OSError:
                    continue
                if any(f in data for f in forms):
                    hits.append(str(path.relative_to(base)))
    return hits


# -- MCP on the wire ------------------------------------------------------------------------

WIRE_PROTOCOL = "2025-06-18"
_ACCEPT = "application/json, text/event-stream"


def _wire_headers(token: str, session: str | None = None) -> dict[str, str]:
    headers = {
        "Accept": _ACCEPT,
        "Content-Type": "application/json",
        "Authorization": f"Bearer {token}",
    }
    if session is not None:
        headers.update({"Mcp-Session-Id": session, "MCP-Protocol-Version": WIRE_PROTOCOL})
    return headers


def _wire_messages(text: str, content_type: str) -> list[dict[str, Any]]:
    if content_type.startswith("application/json"):
        return [json.loads(text)]
    return [
        json.loads(line[5:])
        for line in text.splitlines()
        if line.startswith("data:") and line[5:].strip()
    ]


def wire_tool_call(
    url: str, token: str, name: str, arguments: Mapping[str, Any], *, timeout: float = 60.0
) -> tuple[dict[str, Any], str]:
    """``tools/call`` over raw HTTP (handshake-era session): return the JSON-RPC reply and
    every byte the client received in the session (headers and bodies, as text), for the
    checks that nothing on the wire carries a secret. Synchronous: call it from a plain
    test or a worker thread."""
    received: list[str] = []

    def keep(response: httpx2.Response) -> None:
        received.append("".join(f"{k}: {v}\n" for k, v in response.headers.multi_items()))
        received.append(response.text)

    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": WIRE_PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "egress-tests", "version": "1"},
        },
    }
    with httpx2.Client(timeout=timeout) as client:
        response = client.post(url, json=init, headers=_wire_headers(token))
        keep(response)
        assert response.status_code == 200, response.text
        session = response.headers["mcp-session-id"]
        done = client.post(
            url,
            json={"jsonrpc": "2.0", "method": "notifications/initialized"},
            headers=_wire_headers(token, session),
        )
        keep(done)
        assert done.status_code == 202, done.text
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": name, "arguments": dict(arguments)},
        }
        response = client.post(url, json=call, headers=_wire_headers(token, session))
        keep(response)
        assert response.status_code == 200, response.text
        ended = client.delete(url, headers=_wire_headers(token, session))
        keep(ended)
    for message in _wire_messages(response.text, response.headers.get("content-type", "")):
        if message.get("id") == 2 and ("result" in message or "error" in message):
            return message, "".join(received)
    raise AssertionError(f"no reply to tools/call in {response.text[:500]!r}")
