"""The egress boundary seen from inside a real sandbox (THREATS.md C6, C10, C11, C12, D1).

The in-sandbox network probe (``tests/fixtures/netprobe_server.py``) runs under Debian's
``/usr/bin/python3`` in bubblewrap sandboxes of a real gateway, as two servers defined in
this module's own ``SVC_SERVERS_FILE`` (the shared ``stage_servers`` document is not used):

- ``netprobe``: egress list ``api.example.test`` (a header-reflecting loopback upstream),
  ``secure.example.test`` (its HTTPS twin, a leaf from a throwaway CA the gateway trusts),
  ``h2.example.test`` (a raw loopback listener that records the bytes it receives), and
  every address of the host (IPv4 literals, and a ``self-N.test`` host-map name for each
  address) so that a refusal of the host's own addresses is the *address* check
  (``deny_address``), not the name check;
- ``netbare``: no egress rules at all.

Bob and carol store a credential for ``netprobe`` (``allowed_hosts`` the two upstreams);
carol also stores one for ``netbare`` with an empty ``allowed_hosts``. The carve-out is
``127.0.0.0/8`` (the upstreams live on loopback) and the port allowlist adds 22 and the
gateway's own port (chosen before the gateway starts), so refusals there come from the
address check. Consequence, by design of the carve-out: ``127.0.0.1:22`` is *allowed* by the
proxy (loopback is carved out and 22 is not the gateway's port); it is left out of the C12
proxy checks (the sandbox still cannot reach it directly).

Every denial is also looked up in ``GET /api/audit`` (admin) as an ``egress`` event with the
server, host and decision.
"""

from __future__ import annotations

import base64
import json
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from data_plane_support import PYTHON, DataPlaneGateway, mcp_client, text_of
from gateway_support import api, free_port, login, start_gateway
from mcp import Client
from process_support import public_tmpdir
from upstream_support import Listener, Upstream, upstream_server

from devidp.provider import DevIdP
from svcgate.egress.addresses import IPAddress
from svcgate.egress.local_addrs import own_addresses
from svcgate.egress.redact import secret_forms

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parents[2]
NETPROBE = ROOT / "tests" / "fixtures" / "netprobe_server.py"
CURL = "/usr/bin/curl"  # the sandbox sees the host's /usr
HAS_CURL = Path(CURL).exists()

ALLOWED = "api.example.test"
SECURE = "secure.example.test"
H2 = "h2.example.test"
BLOCKED = "blocked.example.test"
SECRETS = {"bob": "bob-sandbox-secret-6f1d2c3b4a", "carol": "carol-sandbox-secret-0e9d8c7b6a"}
# Errors a direct connection out of a netns that holds only ``lo`` may give.
NO_ROUTE = frozenset({"ENETUNREACH", "EHOSTUNREACH", "EPERM", "EACCES"})


def authority(ip: IPAddress, port: int) -> str:
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


@dataclass
class Reply:
    """A proxy's raw answer, parsed just enough."""

    raw: bytes
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def decision(self) -> str:
        return self.headers.get("x-svcgate-egress", "")

    @classmethod
    def parse(cls, raw: bytes) -> Reply:
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        return cls(raw, status, headers, body)


@dataclass
class Env:
    dp: DataPlaneGateway
    gateway_port: int
    plain: Upstream
    secure: Upstream
    raw: Listener
    own: list[IPAddress]
    own_names: dict[IPAddress, str]
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)
    user_ids: dict[str, int] = field(default_factory=dict)


def _servers(stage: Path, egress: list[str]) -> dict[str, Any]:
    shutil.copy(NETPROBE, stage / "netprobe_server.py")
    (stage / "netprobe_server.py").chmod(0o644)

    def entry(name: str) -> dict[str, Any]:
        dest = f"/opt/server/{name}/netprobe_server.py"
        return {
            "command": [PYTHON, dest],
            "binds": [{"source": str(stage / "netprobe_server.py"), "dest": dest}],
        }

    return {
        "servers": {
            "netprobe": {**entry("netprobe"), "egress": egress},
            "netbare": entry("netbare"),
        }
    }


def _put_credential(dp: DataPlaneGateway, session: str, server: str, body: dict[str, Any]) -> None:
    with api(dp.gateway, session) as client:
        response = client.put(
            f"/api/credentials/{server}", json=body, headers={"Origin": dp.gateway.origin}
        )
        assert response.status_code == 204, response.text


@pytest.fixture(scope="module")
def env(idp: DevIdP, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    ca_dir = tmp_path_factory.mktemp("sandbox-upstream-ca") / "ca"
    raw = Listener()
    own = sorted(own_addresses(), key=lambda ip: (ip.version, int(ip)))
    own_names = {ip: f"self-{n}.test" for n, ip in enumerate(own)}
    gateway_port = free_port()
    stage = public_tmpdir("egress-sb")
    sandboxes = public_tmpdir("egress-sb-state")
    try:
        with upstream_server() as plain, upstream_server(tls_name=SECURE, ca_dir=ca_dir) as secure:
            assert secure.ca_file is not None
            hosts = [
                f"{ALLOWED}=127.0.0.1:{plain.port}",
                f"{SECURE}=127.0.0.1:{secure.port}",
                f"{H2}=127.0.0.1:{raw.port}",
                *(
                    f"{name}=[{ip}]" if ip.version == 6 else f"{name}={ip}"
                    for ip, name in own_names.items()
                ),
            ]
            egress = [
                ALLOWED,
                SECURE,
                H2,
                *(str(ip) for ip in own if ip.version == 4),  # v6 literals cannot be patterns
                *own_names.values(),
            ]
            servers_file = stage / "servers.json"
            servers_file.write_text(json.dumps(_servers(stage, egress)))
            gateway = start_gateway(
                tmp_path_factory.mktemp("egress-sandbox"),
                idp=idp,
                port=gateway_port,
                extra_env={
                    "SVC_SERVERS_FILE": str(servers_file),
                    "SVC_SANDBOX_DIR": str(sandboxes / "state"),
                    "SVC_EGRESS_ALLOW_CIDRS": "127.0.0.0/8",
                    "SVC_EGRESS_HOSTS": ",".join(hosts),
                    "SVC_EGRESS_PORTS": f"80,443,22,{gateway_port}",
                    "SVC_EGRESS_UPSTREAM_CA_FILE": str(secure.ca_file),
                    "SVC_EGRESS_RATE": "1000",
                    "SVC_EGRESS_CONNECT_TIMEOUT": "3s",
                },
            )
            try:
                dp = DataPlaneGateway(
                    gateway=gateway,
                    stage=stage,
                    admin_session=login(gateway, "alice"),
                    user_session=login(gateway, "bob"),
                )
                yield _populate(Env(dp, gateway_port, plain, secure, raw, own, own_names))
            finally:
                assert gateway.stop() == 0, gateway.log_text()[-4000:]
    finally:
        raw.close()
        shutil.rmtree(stage, ignore_errors=True)
        shutil.rmtree(sandboxes, ignore_errors=True)


def _populate(env: Env) -> Env:
    dp = env.dp
    sessions = {"bob": dp.user_session, "carol": login(dp.gateway, "carol")}
    for user, secret in SECRETS.items():
        _put_credential(
            dp, sessions[user], "netprobe", {"secret": secret, "allowed_hosts": [ALLOWED, SECURE]}
        )
        env.profiles[user] = dp.create_profile(f"sb-{user}", ["netprobe"], session=sessions[user])
        env.user_ids[user] = int(env.profiles[user]["user_id"])
    # carol: a credential for netbare that allows no host at all; bob: none for netbare.
    _put_credential(
        dp, sessions["carol"], "netbare", {"secret": "carol-bare-secret-1234", "allowed_hosts": []}
    )
    for user in SECRETS:
        env.profiles[f"{user}-bare"] = dp.create_profile(
            f"sb-{user}-bare", ["netbare"], session=sessions[user]
        )
    return env


class NetProbe:
    """The netprobe tools of one profile's sandbox, through the gateway."""

    def __init__(self, client: Client, server: str) -> None:
        self.client = client
        self.server = server

    async def __call__(self, tool: str, **arguments: Any) -> dict[str, Any]:
        result = await self.client.call_tool(f"{self.server}_{tool}", arguments)
        text = text_of(result)
        assert not result.is_error, text
        answer: dict[str, Any] = json.loads(text)
        return answer

    async def proxy(self, data: bytes, wait: float = 5.0) -> Reply:
        """Send ``data`` to the proxy; read until it closes (or ``wait`` seconds pass)."""
        answer = await self("raw_proxy", data_b64=base64.b64encode(data).decode(), timeout=wait)
        assert answer["ok"], answer
        return Reply.parse(base64.b64decode(answer["response_b64"]))

    async def curl(self, *args: str) -> dict[str, Any]:
        answer = await self("run", argv=[CURL, "-sS", "--max-time", "10", *args], timeout=15)
        assert answer["ok"], answer
        return answer


@asynccontextmanager
async def netprobe(env: Env, profile: str) -> AsyncIterator[NetProbe]:
    record = env.profiles[profile]
    server = "netbare" if profile.endswith("-bare") else "netprobe"
    async with mcp_client(env.dp.endpoint(record["slug"]), record["token"]) as client:
        yield NetProbe(client, server)


def request(target: str, host: str, *extra: str, method: str = "GET") -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", *extra, "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def connect(target: str) -> bytes:
    return f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()


def audit_events(env: Env, after: int = 0) -> list[dict[str, Any]]:
    """Every egress event with an id above ``after`` (admin view, all pages)."""
    events: list[dict[str, Any]] = []
    before: int | None = None
    with api(env.dp.gateway, env.dp.admin_session) as client:
        while True:
            params: dict[str, int] = {"limit": 200}
            if before is not None:
                params["before"] = before
            response = client.get("/api/audit", params=params)
            assert response.status_code == 200, response.text
            page = response.json()
            fresh = [e for e in page["events"] if e["id"] > after]
            events += [e for e in fresh if e["kind"] == "egress"]
            before = page["next_before"]
            if not before or len(fresh) < len(page["events"]):
                return events


def last_audit_id(env: Env) -> int:
    with api(env.dp.gateway, env.dp.admin_session) as client:
        response = client.get("/api/audit", params={"limit": 1})
        assert response.status_code == 200, response.text
        events = response.json()["events"]
        return int(events[0]["id"]) if events else 0


Expected = set[tuple[str, str, str, str]]


def wait_audit(
    env: Env, after: int, expected: Expected, timeout: float = 10.0
) -> list[dict[str, Any]]:
    """Wait until every (user, server, host, decision) in ``expected`` is an egress event.

    The egress audit sink writes in batches (every 0.2 s): poll, bounded.
    """
    names = {user_id: user for user, user_id in env.user_ids.items()}
    deadline = time.monotonic() + timeout
    while True:
        events = audit_events(env, after)
        seen = {
            (names.get(e["user_id"], str(e["user_id"])), e["server"], e["host"], e["decision"])
            for e in events
        }
        if expected <= seen:
            return events
        if time.monotonic() > deadline:
            raise AssertionError(
                f"missing audit events {sorted(expected - seen)}; saw {sorted(seen)}"
            )
        time.sleep(0.1)


# -- D1 / C10: no route out of the sandbox ------------------------------------------------


async def test_raw_sockets_and_dns_have_no_route(env: Env) -> None:
    async with netprobe(env, "bob") as probe:
        for host, port in [
            ("1.1.1.1", 443),
            ("169.254.169.254", 80),
            ("8.8.8.8", 53),
            ("2606:4700:4700::1111", 443),
        ]:
            result = await probe("tcp_connect", host=host, port=port, timeout=3)
            assert not result["ok"], (host, result)
            assert result["errname"] in NO_ROUTE, (host, result)
        for host in ("1.1.1.1", "8.8.8.8"):
            result = await probe("udp_send", host=host, port=53, timeout=2)
            assert not result["ok"] and not result["sent"], (host, result)
            assert result["errname"] in NO_ROUTE, (host, result)
        for name in ("example.com", ALLOWED):
            result = await probe("dns", name=name)
            assert not result["ok"], (name, result)
            assert result["errname"] == "gaierror", (name, result)
        interfaces = await probe("interfaces")
    assert interfaces["if_nameindex"] == ["lo"], interfaces
    assert interfaces["proc_net_dev"] == ["lo"], interfaces
    assert {a["interface"] for a in interfaces["if_inet6"] or []} <= {"lo"}, interfaces
    # The main IPv4 table has no route at all (lo's routes live in the local table).
    assert len((interfaces["route"] or "").strip().splitlines()) <= 1, interfaces["route"]


# -- C10: protocol escapes through the proxy ----------------------------------------------


async def test_h2_preface_h2c_and_websocket_upgrades_are_refused(env: Env) -> None:
    start = last_audit_id(env)
    env.plain.clear()
    async with netprobe(env, "bob") as probe:
        # A hand-written HTTP/2 prior-knowledge preface to the plain proxy.
        reply = await probe.proxy(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        assert reply.status == 400 and reply.decision == "deny_request", reply.raw
        # h2c upgrade and WebSocket upgrade in absolute form to allowed hosts.
        for target, host in ((f"http://{H2}/", H2), (f"http://{ALLOWED}/ws", ALLOWED)):
            reply = await probe.proxy(
                request(
                    target,
                    host,
                    "Upgrade: h2c" if host == H2 else "Upgrade: websocket",
                    "HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA"
                    if host == H2
                    else "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
                    "Sec-WebSocket-Version: 13",
                ).replace(b"Connection: close", b"Connection: Upgrade")
            )
            assert reply.status == 400 and reply.decision == "deny_request", reply.raw
    assert b"pri * http/2.0" not in env.raw.received.lower()
    assert not [s for s in env.plain.seen if s.path == "/ws"], env.plain.seen
    events = wait_audit(
        env,
        start,
        {
            ("bob", "netprobe", "", "deny_request"),  # the preface names no host
            ("bob", "netprobe", H2, "deny_request"),
            ("bob", "netprobe", ALLOWED, "deny_request"),
        },
    )
    assert all(e["user_id"] == env.user_ids["bob"] for e in events), events


@pytest.mark.skipif(not HAS_CURL, reason=f"{CURL} is not installed")
async def test_curl_http2_through_the_proxy(env: Env) -> None:
    start = last_audit_id(env)
    received_before = env.raw.received
    async with netprobe(env, "bob") as probe:
        # curl --http2 over CONNECT to a host no rule allows: the tunnel is refused.
        result = await probe.curl("--http2", f"https://{BLOCKED}/")
        assert result["returncode"] != 0 and "403" in result["stderr"], result
        # curl --http2 on http:// asks for an h2c upgrade: refused.
        result = await probe.curl(
            "--http2", "-o", "/dev/null", "-w", "%{http_code}", f"http://{H2}/"
        )
        assert result["stdout"] == "400", result
        # Prior knowledge through a proxy: curl sends HTTP/1.1 absolute form, forwarded as
        # HTTP/1.1 (the raw listener then hangs up: 502); no HTTP/2 byte reaches it.
        result = await probe.curl(
            "--http2-prior-knowledge", "-o", "/dev/null", "-w", "%{http_code}", f"http://{H2}/"
        )
        assert result["stdout"] == "502", result
        # HTTPS with interception (bob's credential covers SECURE): only http/1.1 is offered.
        result = await probe.curl(
            "--http2",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{http_version}",
            f"https://{SECURE}/headers",
        )
        assert result["stdout"] == "200 1.1", result
    received = env.raw.received[len(received_before) :].lower()
    assert b"pri * http/2.0" not in received and b"h2c" not in received, received
    assert b"http2-settings" not in received and b"upgrade" not in received, received
    assert received.startswith(b"get / http/1.1\r\n"), received
    events = wait_audit(
        env,
        start,
        {
            ("bob", "netprobe", BLOCKED, "deny_host"),
            ("bob", "netprobe", H2, "deny_request"),
            ("bob", "netprobe", H2, "allow"),
            ("bob", "netprobe", SECURE, "allow"),
        },
    )
    assert all(e["user_id"] == env.user_ids["bob"] for e in events), events


# -- C12: the host's own addresses --------------------------------------------------------


async def test_host_addresses_are_unreachable_directly_and_through_the_proxy(env: Env) -> None:
    start = last_audit_id(env)
    ports = (env.gateway_port, 22)
    expected: Expected = set()
    async with netprobe(env, "bob") as probe:
        for ip in env.own:
            for port in ports:
                direct = await probe("tcp_connect", host=str(ip), port=port, timeout=2)
                assert not direct["ok"], (ip, port, direct)
                if ip.is_loopback:  # the sandbox's own lo, where nothing listens
                    assert direct["errname"] == "ECONNREFUSED", (ip, port, direct)
                else:  # EINVAL: a link-local address without a zone (no such link here)
                    assert direct["errname"] in NO_ROUTE | {"EINVAL"}, (ip, port, direct)
        for ip in env.own:
            name = env.own_names[ip]
            for port in ports:
                if ip.is_loopback and ip.version == 4 and port != env.gateway_port:
                    continue  # carved out on purpose (module docstring)
                by_name = await probe.proxy(connect(f"{name}:{port}"))
                assert by_name.status == 403 and by_name.decision == "deny_address", (
                    ip,
                    port,
                    by_name.raw,
                )
                expected.add(("bob", "netprobe", name, "deny_address"))
                literal = await probe.proxy(connect(authority(ip, port)))
                assert literal.status == 403, (ip, port, literal.raw)
                if ip.version == 4:  # named exactly in the egress list: the address check
                    assert literal.decision == "deny_address", (ip, port, literal.raw)
                    expected.add(("bob", "netprobe", str(ip), "deny_address"))
                else:  # an IPv6 literal cannot be named by a pattern
                    assert literal.decision in {"deny_address", "deny_ip_literal"}, literal.raw
                    expected.add(("bob", "netprobe", str(ip), literal.decision))
            port = env.gateway_port
            for host in (name, authority(ip, port).rsplit(":", 1)[0]):
                url = f"http://{host}:{port}/api/health"
                plain = await probe.proxy(request(url, f"{host}:{port}"))
                assert plain.status == 403, (url, plain.raw)
                if host == name or ip.version == 4:
                    assert plain.decision == "deny_address", (url, plain.raw)
    events = wait_audit(env, start, expected)
    gateway_refusals = [
        e for e in events if e["host"] == "127.0.0.1" and e["decision"] == "deny_address"
    ]
    assert gateway_refusals and all("gateway" in e["detail"] for e in gateway_refusals), events
    hosts = {host for _user, _server, host, _decision in expected}
    assert not [e for e in events if e["host"] in hosts and e["decision"] == "allow"], events


# -- C6: attribution comes from the sandbox, never from headers ---------------------------


async def test_spoofed_attribution_headers_do_not_change_the_credential(env: Env) -> None:
    """Each sandbox's requests carry its owner's credential, whatever headers it adds.

    Plain HTTP (absolute form, hand-written) and, when curl is installed, HTTPS through a
    CONNECT tunnel the proxy terminates (the owner's credential covers both upstreams).
    """
    start = last_audit_id(env)
    for user, other in (("bob", "carol"), ("carol", "bob")):
        spoofed = [
            f"X-Svcgate-User: {other}",
            f"X-Svcgate-Profile: sb-{other}",
            "Proxy-Authorization: Basic " + base64.b64encode(f"{other}:{other}".encode()).decode(),
            f"Forwarded: for={other};by=svcgate",
            f"X-Forwarded-User: {other}",
            "Authorization: Bearer spoofed-by-the-sandbox",
        ]
        env.plain.clear()
        env.secure.clear()
        async with netprobe(env, user) as probe:
            reply = await probe.proxy(request(f"http://{ALLOWED}/headers", ALLOWED, *spoofed))
            assert reply.status == 200, reply.raw
            outputs = [reply.raw.decode("latin-1")]
            if HAS_CURL:
                headers = [arg for header in spoofed for arg in ("-H", header)]
                result = await probe.curl(*headers, f"https://{SECURE}/headers")
                assert result["returncode"] == 0, result
                outputs.append(result["stdout"] + result["stderr"])
        for upstream in (env.plain, env.secure) if HAS_CURL else (env.plain,):
            assert len(upstream.seen) == 1, upstream.seen
            seen = upstream.seen[0]
            authorization = [v for k, v in seen.raw_headers if k.lower() == "authorization"]
            assert authorization == [f"Bearer {SECRETS[user]}"], seen.raw_headers
            assert "proxy-authorization" not in seen.headers, seen.raw_headers
        for text in outputs:
            assert f"Bearer {SECRETS[user]}" not in text  # reflected, but redacted
            for secret in SECRETS.values():
                for form in secret_forms(secret.encode()):
                    assert form.decode("latin-1") not in text
    expected = {(user, "netprobe", ALLOWED, "allow") for user in SECRETS}
    events = [e for e in wait_audit(env, start, expected) if e["host"] == ALLOWED]
    owners = {(e["user_id"], e["profile_id"]) for e in events}
    assert owners == {(env.user_ids[u], env.profiles[u]["id"]) for u in SECRETS}, events


# -- C11: no rules, no credential (or one with no hosts): everything is denied -------------


async def test_a_server_without_rules_reaches_nothing(env: Env) -> None:
    start = last_audit_id(env)
    env.plain.clear()
    env.secure.clear()
    expected: Expected = set()
    for user in SECRETS:
        async with netprobe(env, f"{user}-bare") as probe:
            for data, host in (
                (request(f"http://{ALLOWED}/", ALLOWED), ALLOWED),
                (connect(f"{ALLOWED}:443"), ALLOWED),
                (connect(f"{SECURE}:443"), SECURE),
                (connect(f"{BLOCKED}:443"), BLOCKED),
                (connect(f"{env.own_names[env.own[0]]}:443"), env.own_names[env.own[0]]),
            ):
                reply = await probe.proxy(data)
                assert reply.status == 403 and reply.decision == "deny_host", (user, reply.raw)
                expected.add((user, "netbare", host, "deny_host"))
            reply = await probe.proxy(request("http://1.1.1.1/", "1.1.1.1"))
            assert reply.status == 403 and reply.decision == "deny_ip_literal", reply.raw
            expected.add((user, "netbare", "1.1.1.1", "deny_ip_literal"))
    assert env.plain.connections == 0 and env.secure.connections == 0
    events = wait_audit(env, start, expected)
    # (Only netbare's events: another test's events may still be on their way to the audit.)
    assert not [e for e in events if e["server"] == "netbare" and e["decision"] == "allow"], events
