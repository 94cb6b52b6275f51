"""THREATS A1-A9, F6 and F8 against the data plane (``/mcp/p/<slug>``, and ``/mcp`` where it
applies), through real clients: raw ``httpx2`` (and a raw socket) for protocol-level checks,
the official Python SDK client for behaviour.

The gateway is a real process with real OIDC sign-in; the servers are real probes
(``tests/fixtures/probe_server.py``) in real bubblewrap sandboxes (see
``tests/data_plane_support.py``).

Failed authentications are rate-limited per source address (A7), so tests that fail on
purpose connect from their own loopback address (``127.1.x.y``, from :func:`fresh_source`)
instead of weakening the limiter; A7 itself runs against a gateway of its own.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import ipaddress
import itertools
import json
import random
import re
import secrets
import socket
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import mcp_types as types
import pytest
import trio
from data_plane_support import DataPlaneGateway, mcp_client, start_data_plane_gateway, text_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, rule, run_state_machine_as_test
from mcp.shared.exceptions import MCPError

from devidp.provider import DevIdP
from svcgate.naming import map_names
from svcgate.ratelimit import FailureLimiter, source_key
from svcgate.settings import vault_key_location

pytestmark = pytest.mark.root

HANDSHAKE = "2025-06-18"
MODERN = "2026-07-28"
ACCEPT = "application/json, text/event-stream"
EXTRA_ORIGIN = "https://tools.example"
INIT: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": HANDSHAKE,
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
MEBIBYTE = 1024 * 1024
SESSION_ID = re.compile(r"[0-9a-f]{32}")

_sources = itertools.count(1)


def fresh_source() -> str:
    """A loopback address no other test of this module connects from."""
    n = next(_sources)
    return f"127.1.{n // 250}.{n % 250 + 1}"


def raw(source: str | None = None, timeout: float = 60.0) -> httpx2.Client:
    transport = httpx2.HTTPTransport(local_address=source) if source is not None else None
    return httpx2.Client(transport=transport, timeout=timeout)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def auth(token: str | None, **extra: str) -> dict[str, str]:
    headers = {"Accept": ACCEPT, "Content-Type": "application/json", **extra}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def messages(response: httpx2.Response) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a response, whether plain JSON or an SSE stream."""
    if response.headers.get("content-type", "").startswith("application/json"):
        body: dict[str, Any] = response.json()
        return [body]
    found: list[dict[str, Any]] = []
    for line in response.text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            found.append(json.loads(line[5:]))
    return found


def reply(response: httpx2.Response, request_id: Any) -> dict[str, Any]:
    for message in messages(response):
        if message.get("id") == request_id and ("result" in message or "error" in message):
            return message
    raise AssertionError(f"no reply to {request_id!r} in {response.text[:500]!r}")


def open_session(client: httpx2.Client, url: str, token: str) -> str:
    """Initialise a handshake-era session with raw requests; return its id."""
    response = client.post(url, json=INIT, headers=auth(token))
    assert response.status_code == 200, response.text
    session = response.headers["mcp-session-id"]
    done = client.post(
        url,
        json=INITIALIZED,
        headers=auth(token, **{"Mcp-Session-Id": session, "MCP-Protocol-Version": HANDSHAKE}),
    )
    assert done.status_code == 202, done.text
    return session


def call_tool(
    client: httpx2.Client,
    url: str,
    token: str | None,
    session: str,
    name: str,
    arguments: dict[str, Any],
    request_id: int = 7,
) -> httpx2.Response:
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }
    headers = auth(token, **{"Mcp-Session-Id": session, "MCP-Protocol-Version": HANDSHAKE})
    return client.post(url, json=body, headers=headers)


def modern_body(method: str, params: dict[str, Any], request_id: int = 1) -> dict[str, Any]:
    meta = {
        types.PROTOCOL_VERSION_META_KEY: MODERN,
        types.CLIENT_CAPABILITIES_META_KEY: {},
    }
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": method,
        "params": {**params, "_meta": meta},
    }


def modern_headers(token: str, method: str | None, name: str | None) -> list[tuple[str, str]]:
    headers = list(auth(token, **{"MCP-Protocol-Version": MODERN}).items())
    if method is not None:
        headers.append(("Mcp-Method", method))
    if name is not None:
        headers.append(("Mcp-Name", name))
    return headers


def modern_tool_names(client: httpx2.Client, url: str, token: str) -> set[str]:
    response = client.post(
        url,
        json=modern_body("tools/list", {}),
        headers=modern_headers(token, "tools/list", None),
    )
    assert response.status_code == 200, response.text
    return {tool["name"] for tool in reply(response, 1)["result"]["tools"]}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def no_cors(response: httpx2.Response) -> None:
    leaked = [k for k in response.headers if k.lower().startswith("access-control-")]
    assert not leaked, (response.request.method, response.status_code, leaked)


@pytest.fixture(scope="module")
def dp(idp: DevIdP, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DataPlaneGateway]:
    gateway = start_data_plane_gateway(
        tmp_path_factory.mktemp("dpthreats"), idp, SVC_MCP_ALLOWED_ORIGINS=EXTRA_ORIGIN
    )
    # The "slow" server waits for a gate; the legacy bundle includes it.
    gateway.open_gate()
    try:
        yield gateway
    finally:
        started = time.monotonic()
        assert gateway.gateway.stop() == 0
        # Nothing above left a connection hanging (graceful shutdown would wait for it).
        assert time.monotonic() - started < 10


# -- A1: one 401 for every wrong (slug, token) ------------------------------------------------

SLUG_KINDS = ("own", "other", "deleted", "unknown")
TOKEN_KINDS = ("valid", "rotated", "garbage")
METHODS = ("POST", "GET", "DELETE")


@dataclass
class A1World:
    slugs: dict[str, str]
    tokens: dict[tuple[str, str], str]
    source: str
    references: dict[str, httpx2.Response]


def a1_request(
    client: httpx2.Client, dp: DataPlaneGateway, method: str, slug: str, token: str
) -> httpx2.Response:
    headers = auth(token)
    if method == "POST":
        return client.post(dp.endpoint(slug), json=INIT, headers=headers)
    return client.request(method, dp.endpoint(slug), headers=headers)


def fingerprint(response: httpx2.Response) -> tuple[Any, ...]:
    """Everything a client can observe of a response except the ``Date`` header and the value
    of ``X-Request-Id`` (fresh for every response; its presence and place still count)."""
    headers = [
        (k.lower(), b"<per-response>" if k.lower() == b"x-request-id" else v)
        for k, v in response.headers.raw
        if k.lower() != b"date"
    ]
    return (
        response.http_version,
        response.status_code,
        response.reason_phrase,
        headers,
        response.content,
    )


@pytest.fixture(scope="module")
def a1(dp: DataPlaneGateway) -> A1World:
    """Profiles for A1. "valid" and "rotated" are the current and a replaced token of the
    URL's profile where it has (had) one of its own (own, deleted), else those of "own"
    (a token for A sent to B, or to a slug that does not exist)."""
    own = dp.create_profile("a1-own", ["probe"])
    own_old = own["token"]
    own_new = dp.rotate(own)
    dp.create_profile("a1-other", ["probe"])
    gone = dp.create_profile("a1-gone", ["probe"])
    gone_old = gone["token"]
    gone_last = dp.rotate(gone)
    source = fresh_source()
    with raw(source) as client:
        # The deleted profile was warm and its token valid until the deletion.
        assert a1_request(client, dp, "POST", "a1-gone", gone_last).status_code == 200
    dp.delete(gone)
    garbage = "svc_" + secrets.token_urlsafe(32)
    tokens: dict[tuple[str, str], str] = {}
    for kind in SLUG_KINDS:
        if kind == "deleted":
            tokens[kind, "valid"], tokens[kind, "rotated"] = gone_last, gone_old
        else:
            tokens[kind, "valid"], tokens[kind, "rotated"] = own_new, own_old
        tokens[kind, "garbage"] = garbage
    slugs = {"own": "a1-own", "other": "a1-other", "deleted": "a1-gone", "unknown": "a1-nobody"}
    with raw(source) as client:
        references = {
            method: a1_request(client, dp, method, slugs["unknown"], garbage) for method in METHODS
        }
    return A1World(slugs, tokens, source, references)


def test_a1_reference_is_a_bearer_401_and_the_same_for_every_method(a1: A1World) -> None:
    first = a1.references["POST"]
    assert first.status_code == 401
    assert first.headers["www-authenticate"] == "Bearer"
    assert first.json()["error"]["code"] == "unauthenticated"
    for method in METHODS:
        assert fingerprint(a1.references[method]) == fingerprint(first), method


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("token_kind", TOKEN_KINDS)
@pytest.mark.parametrize("slug_kind", SLUG_KINDS)
def test_a1_every_wrong_slug_token_pair_gets_the_identical_401(
    dp: DataPlaneGateway, a1: A1World, slug_kind: str, token_kind: str, method: str
) -> None:
    with raw(a1.source) as client:
        response = a1_request(
            client, dp, method, a1.slugs[slug_kind], a1.tokens[slug_kind, token_kind]
        )
    if (slug_kind, token_kind) == ("own", "valid"):
        # The one right pair passes authentication (GET/DELETE without a session are then
        # refused by the MCP transport, but not with 401).
        assert response.status_code != 401, response.text
        if method == "POST":
            assert response.status_code == 200, response.text
            assert SESSION_ID.fullmatch(response.headers["mcp-session-id"])
        return
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    assert fingerprint(response) == fingerprint(a1.references["POST"])


# -- A2: a rotated token is dead on the very next request --------------------------------------


def test_a2_rotated_token_never_succeeds_again(dp: DataPlaneGateway) -> None:
    profile = dp.create_profile("a2-rotated", ["probe"])
    old = profile["token"]
    url = dp.endpoint("a2-rotated")
    with raw(fresh_source()) as client:
        session = open_session(client, url, old)  # the old token works before the rotation
        before = call_tool(client, url, old, session, "probe_echo", {"text": "before"})
        assert before.status_code == 200
    new = dp.rotate(profile)
    outcomes: Counter[int] = Counter()
    variants = ("initialize", "call", "stream", "delete", "slash")
    # 200 failures: from four sources, so the per-source limiter (100 failures) stays out of it.
    for _ in range(4):
        with raw(fresh_source(), timeout=10) as client:
            for i in range(50):
                variant = variants[i % len(variants)]
                session_headers = {"Mcp-Session-Id": session, "MCP-Protocol-Version": HANDSHAKE}
                if variant == "initialize":
                    response = client.post(url, json=INIT, headers=auth(old))
                elif variant == "call":
                    response = call_tool(client, url, old, session, "probe_echo", {"text": "x"})
                elif variant == "stream":
                    response = client.get(url, headers=auth(old, **session_headers))
                elif variant == "delete":
                    response = client.delete(url, headers=auth(old, **session_headers))
                else:
                    response = client.post(f"{url}/", json=INIT, headers=auth(old))
                outcomes[response.status_code] += 1
                assert response.headers.get("www-authenticate") == "Bearer", variant
    assert outcomes == Counter({401: 200})
    with raw(fresh_source()) as client:
        # The refused DELETEs changed nothing: the session (bound to the profile, not to a
        # token) goes on with the new token.
        after = call_tool(client, url, new, session, "probe_echo", {"text": "after"})
        assert after.status_code == 200, after.text
        assert reply(after, 7)["result"]["content"][0]["text"] == "after"


# -- A3: tokens outside the Authorization header ----------------------------------------------


def test_a3_tokens_in_query_cookie_or_form_are_refused_and_never_logged(
    dp: DataPlaneGateway,
) -> None:
    profile = dp.create_profile("a3-where", ["probe"])
    token = profile["token"]
    legacy = dp.gateway.env["SVC_BEARER_TOKEN"]
    url = dp.endpoint("a3-where")
    plain = {"Accept": ACCEPT, "Content-Type": "application/json"}
    refused: list[httpx2.Response] = []
    with raw(fresh_source()) as client:
        for query in ("access_token", "token", "bearer", "authorization"):
            value = f"Bearer {token}" if query == "authorization" else token
            refused.append(client.post(url, params={query: value}, json=INIT, headers=plain))
        for cookie in (
            f"access_token={token}",
            f"svc_session={token}",
            f"Authorization=Bearer {token}",
            f"svc_session={dp.admin_session}",  # a real control-plane session
            f"svc_session={dp.user_session}",  # the owner's own session
        ):
            refused.append(client.post(url, json=INIT, headers={**plain, "Cookie": cookie}))
        # RFC 6750's form-encoded body parameter.
        refused.append(
            client.post(
                url,
                content=f"access_token={token}".encode(),
                headers={"Accept": ACCEPT, "Content-Type": "application/x-www-form-urlencoded"},
            )
        )
        for path in ("/mcp", "/"):
            refused.append(
                client.post(
                    f"{dp.url}{path}", params={"access_token": legacy}, json=INIT, headers=plain
                )
            )
            refused.append(
                client.post(
                    f"{dp.url}{path}",
                    json=INIT,
                    headers={**plain, "Cookie": f"access_token={legacy}"},
                )
            )
        # With the token in the header a request succeeds even when the URL also holds it;
        # the URL must still not be logged.
        accepted = client.post(url, params={"access_token": token}, json=INIT, headers=auth(token))
    for response in refused:
        assert response.status_code == 401, (response.request.url, response.text)
        assert response.headers["www-authenticate"] == "Bearer"
    assert accepted.status_code == 200, accepted.text
    log = dp.gateway.log_text()
    assert "a3-where" in log  # the log does record this profile's activity...
    for secret in (token, sha256(token), legacy, sha256(legacy)):
        assert secret not in log  # ...but never the token nor its hash


# -- A4: no token, cookie or key reaches a server ------------------------------------------------


def a4_needles(dp: DataPlaneGateway, token: str) -> dict[str, str]:
    env = dp.gateway.env
    key_path, _ = vault_key_location(env, Path(env["SVC_DATA_DIR"]))
    key_bytes = key_path.read_bytes()
    assert key_bytes.strip(), key_path
    needles = {
        "profile token": token,
        "profile token sha256": sha256(token),
        "legacy token": env["SVC_BEARER_TOKEN"],
        "legacy token sha256": sha256(env["SVC_BEARER_TOKEN"]),
        "admin svc_session": dp.admin_session,
        "admin svc_session sha256": sha256(dp.admin_session),
        "user svc_session": dp.user_session,
        "vault key file hex": key_bytes.hex(),
    }
    for i, line in enumerate(key_bytes.decode().splitlines()):
        if not line.strip():
            continue
        needles[f"vault key file line {i}"] = line.strip()
        encoded = json.loads(line)["key"]
        kek = base64.b64decode(encoded)
        assert len(kek) >= 16
        needles[f"KEK {i} base64"] = encoded
        needles[f"KEK {i} hex"] = kek.hex()
        needles[f"KEK {i} HEX"] = kek.hex().upper()
        needles[f"KEK {i} urlsafe base64"] = base64.urlsafe_b64encode(kek).decode().rstrip("=")
    return needles


def assert_clean(snapshot_text: str, server: str, needles: dict[str, str]) -> None:
    snapshot = json.loads(snapshot_text)
    assert {"env", "argv", "cwd"} <= snapshot.keys()
    assert snapshot["env"].get("PROBE_NAME") == server
    for what, needle in needles.items():
        assert needle not in snapshot_text, f"{what} reached {server}"


async def test_a4_servers_see_no_token_cookie_or_key(dp: DataPlaneGateway) -> None:
    profile = await trio.to_thread.run_sync(dp.create_profile, "a4-env", ["probe", "probe2"])
    token = profile["token"]
    needles = await trio.to_thread.run_sync(a4_needles, dp, token)
    async with mcp_client(dp.endpoint("a4-env"), token) as client:
        for server in ("probe", "probe2"):
            assert_clean(text_of(await client.call_tool(f"{server}_env", {})), server, needles)
    # The legacy bundle's sandboxes too.
    async with mcp_client(f"{dp.url}/mcp", dp.gateway.env["SVC_BEARER_TOKEN"]) as client:
        assert_clean(text_of(await client.call_tool("probe_env", {})), "probe", needles)


# -- A5: Origin ------------------------------------------------------------------------------


def test_a5_origin_matrix(dp: DataPlaneGateway) -> None:
    profile = dp.create_profile("a5-origin", ["probe"])
    token = profile["token"]
    legacy = dp.gateway.env["SVC_BEARER_TOKEN"]
    port = urlsplit(dp.url).port
    assert port is not None
    public = dp.url  # SVC_OIDC_REDIRECT_URL is http://127.0.0.1:PORT/api/auth/callback
    other_port = port + 1 if port < 65535 else port - 1
    refused_origins = [
        "null",
        "http://evil.example",
        f"http://127.0.0.1:{other_port}",  # same host, another port
        f"https://127.0.0.1:{port}",  # https instead of http
        "http://127.0.0.1",  # default port
        f"http://localhost:{port}",  # another name for the same host
        f"{public}/",  # not a serialised origin
        f"{public}.evil.example",
        "HTTP://127.0.0.1:" + str(port),  # browsers send lower case
        "http://tools.example",  # the extra origin is https
        f"{EXTRA_ORIGIN}:8443",
    ]
    targets = [(dp.endpoint("a5-origin"), token), (f"{dp.url}/mcp", legacy), (f"{dp.url}/", legacy)]
    seen: list[httpx2.Response] = []
    with raw(fresh_source()) as client:
        for url, secret in targets:
            for origin in refused_origins:
                for method in ("POST", "GET", "DELETE", "OPTIONS"):
                    headers = auth(secret, Origin=origin)
                    if method == "OPTIONS":
                        headers["Access-Control-Request-Method"] = "POST"
                        headers["Access-Control-Request-Headers"] = "authorization"
                    kwargs: dict[str, Any] = {"json": INIT} if method == "POST" else {}
                    response = client.request(method, url, headers=headers, **kwargs)
                    seen.append(response)
                    assert response.status_code == 403, (url, origin, method, response.text)
                    assert response.json()["error"]["code"] == "forbidden"
            for maybe in (None, public, EXTRA_ORIGIN):
                allowed = auth(secret) if maybe is None else auth(secret, Origin=maybe)
                response = client.post(url, json=INIT, headers=allowed)
                seen.append(response)
                assert response.status_code == 200, (url, maybe, response.text)
                # An allowed Origin is no credential: without the token it is still 401.
                unauthenticated = client.post(
                    url, json=INIT, headers=auth(None, **({"Origin": maybe} if maybe else {}))
                )
                seen.append(unauthenticated)
                assert unauthenticated.status_code == 401
                preflight = client.options(
                    url,
                    headers={
                        **({"Origin": maybe} if maybe else {}),
                        "Access-Control-Request-Method": "POST",
                    },
                )
                seen.append(preflight)
                assert preflight.status_code in (401, 405), preflight.text
    assert len(seen) == len(targets) * (len(refused_origins) * 4 + 3 * 3)
    for response in seen:
        no_cors(response)


# -- A6: sessions are bound to their profile and never authenticate ----------------------------


@pytest.fixture(scope="module")
def a6(dp: DataPlaneGateway) -> dict[str, dict[str, Any]]:
    return {
        "A": dp.create_profile("a6-alpha", ["probe"]),
        "B": dp.create_profile("a6-beta", ["probe"]),
    }


def test_a6_session_state_machine(dp: DataPlaneGateway, a6: dict[str, dict[str, Any]]) -> None:
    urls = {owner: dp.endpoint(profile["slug"]) for owner, profile in a6.items()}
    tokens = {owner: profile["token"] for owner, profile in a6.items()}
    tokens["garbage"] = "svc_" + secrets.token_urlsafe(32)
    all_ids: list[str] = []
    counter = itertools.count(1)

    def expected(live: dict[str, str], ended: set[str], session: str, url: str, token: str) -> int:
        if token not in ("A", "B") or token != url:
            return 401  # no token, a garbage one, or the other profile's
        if session in ended or live.get(session) != url:
            return 404  # the session is not this profile's (or is over)
        return 200

    class Sessions(RuleBasedStateMachine):
        sessions = Bundle("sessions")

        def __init__(self) -> None:
            super().__init__()
            self.client = raw(fresh_source())
            self.live: dict[str, str] = {}
            self.ended: set[str] = set()

        def teardown(self) -> None:
            self.client.close()

        def headers(self, session: str, token: str) -> dict[str, str]:
            extra = {"Mcp-Session-Id": session, "MCP-Protocol-Version": HANDSHAKE}
            return auth(tokens.get(token), **extra)

        @rule(target=sessions, owner=st.sampled_from(["A", "B"]))
        def create(self, owner: str) -> str:
            session = open_session(self.client, urls[owner], tokens[owner])
            assert SESSION_ID.fullmatch(session), session  # 32 hex digits: 128 bits
            assert session not in all_ids
            all_ids.append(session)
            self.live[session] = owner
            return session

        @rule(
            session=sessions,
            url=st.sampled_from(["A", "B"]),
            token=st.sampled_from(["A", "B", "none", "garbage"]),
        )
        def call(self, session: str, url: str, token: str) -> None:
            text = f"call-{next(counter)}"
            body = {
                "jsonrpc": "2.0",
                "id": 9,
                "method": "tools/call",
                "params": {"name": "probe_echo", "arguments": {"text": text}},
            }
            response = self.client.post(urls[url], json=body, headers=self.headers(session, token))
            want = expected(self.live, self.ended, session, url, token)
            assert response.status_code == want, (session, url, token, response.text)
            if want == 200:
                assert reply(response, 9)["result"]["content"][0]["text"] == text
            elif want == 401:
                assert response.headers["www-authenticate"] == "Bearer"
            else:
                assert "Session not found" in response.text

        @rule(
            session=sessions,
            url=st.sampled_from(["A", "B"]),
            token=st.sampled_from(["A", "B", "none", "garbage"]),
        )
        def delete(self, session: str, url: str, token: str) -> None:
            response = self.client.delete(urls[url], headers=self.headers(session, token))
            want = expected(self.live, self.ended, session, url, token)
            assert response.status_code == want, (session, url, token, response.text)
            if want == 200:
                self.ended.add(session)

    run_state_machine_as_test(
        Sessions,
        settings=settings(
            max_examples=15,
            stateful_step_count=8,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    assert len(all_ids) == len(set(all_ids)) > 0


def test_a6_session_ids_carry_128_random_bits(
    dp: DataPlaneGateway, a6: dict[str, dict[str, Any]]
) -> None:
    url, token = dp.endpoint("a6-alpha"), a6["A"]["token"]
    with raw(fresh_source()) as client:
        ids = [open_session(client, url, token) for _ in range(24)]
        for session in ids:
            client.delete(url, headers=auth(token, **{"Mcp-Session-Id": session}))
    assert len(set(ids)) == len(ids)
    assert all(SESSION_ID.fullmatch(i) for i in ids)
    # A bit that never changes over 24 ids carries no randomness (a random bit stays fixed
    # with probability 2 * 2**-24).
    values = [int(i, 16) for i in ids]
    varying = sum(1 for bit in range(128) if len({(v >> bit) & 1 for v in values}) == 2)
    assert varying >= 128, f"only {varying} of 128 bits vary"


# -- A7: brute force and enumeration -----------------------------------------------------------


@pytest.fixture(scope="module")
def a7gw(idp: DevIdP, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DataPlaneGateway]:
    """A gateway of its own: the limiter's state is per gateway and per source."""
    gateway = start_data_plane_gateway(tmp_path_factory.mktemp("dpa7"), idp)
    try:
        gateway.create_profile("a7-known", ["probe"])
        yield gateway
    finally:
        gateway.open_gate()
        assert gateway.gateway.stop() == 0


def test_a7_failures_are_rate_limited_per_source(a7gw: DataPlaneGateway) -> None:
    known = a7gw.endpoint("a7-known")
    token = a7gw.profiles["a7-known"]["token"]
    statuses: list[int] = []
    with_valid_token: list[int] = []
    retry_after: set[str] = set()
    with raw("127.0.0.1") as client:
        started = time.monotonic()
        for i in range(1000):
            slug_url = known if i % 2 else a7gw.endpoint(f"a7-guess-{i}")
            bad = "svc_" + secrets.token_urlsafe(32)
            response = client.post(slug_url, json=INIT, headers=auth(bad))
            statuses.append(response.status_code)
            if response.status_code == 429:
                retry_after.add(response.headers.get("retry-after", ""))
            if i >= 300 and i % 50 == 0:
                # The limiter runs before the token is looked at: while this source's
                # bucket is empty even the right token is refused (a refill of one
                # attempt every 0.1 s can let the odd one through).
                valid = client.post(known, json=INIT, headers=auth(token))
                with_valid_token.append(valid.status_code)
        elapsed = time.monotonic() - started
    assert set(statuses) <= {401, 429}, Counter(statuses)
    first = statuses.index(429)
    assert 50 <= first <= 200, first  # the burst is 100 failures
    # After the burst, at most the refill rate (10/s) gets through.
    assert statuses.count(401) <= 100 + 10 * elapsed + 5, (Counter(statuses), elapsed)
    assert retry_after and all(v.isdigit() and int(v) >= 1 for v in retry_after), retry_after
    assert set(with_valid_token) <= {200, 429}
    assert with_valid_token.count(429) >= len(with_valid_token) - 4, with_valid_token
    # Another source is unaffected.
    with raw("127.0.0.2") as client:
        valid = client.post(known, json=INIT, headers=auth(token))
    assert valid.status_code == 200, valid.text


def test_a7_an_ipv6_host_cannot_spray_addresses_of_its_own_64() -> None:
    """Pure: one IPv6 host usually holds a whole /64; each of its addresses is one source."""
    limiter = FailureLimiter()
    network = ipaddress.IPv6Address("2001:db8:1:2::")
    outcomes: Counter[str] = Counter()
    for i in range(300):
        source = source_key(str(network + i * 7919 + 1))
        if limiter.blocked(source, 0.0):
            outcomes["blocked"] += 1
        else:
            limiter.failed(source, 0.0)
            outcomes["tried"] += 1
    assert outcomes == Counter({"tried": 100, "blocked": 200})
    assert len(limiter) == 1
    assert not limiter.blocked(source_key("2001:db8:1:3::1"), 0.0)  # the next /64
    assert not limiter.blocked(source_key("198.51.100.7"), 0.0)
    # An IPv4 client seen through a dual-stack socket is that IPv4 address.
    assert source_key("::ffff:198.51.100.7") == source_key("198.51.100.7") == "198.51.100.7"
    assert source_key("127.0.0.2") != source_key("127.0.0.1")


def _median_gap(a: list[float], b: list[float]) -> float:
    return statistics.median(a) - statistics.median(b)


def _p_value(known: list[float], unknown: list[float]) -> float:
    """Two-sided: scipy's KS test if available, else a permutation test on the medians."""
    try:
        stats: Any = importlib.import_module("scipy.stats")
    except ImportError:
        stats = None
    if stats is not None:
        return float(stats.ks_2samp(known, unknown).pvalue)
    observed = abs(_median_gap(known, unknown))
    pooled = known + unknown
    rng = random.Random(1234)
    rounds = 2000
    extreme = 0
    for _ in range(rounds):
        rng.shuffle(pooled)
        if abs(_median_gap(pooled[: len(known)], pooled[len(known) :])) >= observed:
            extreme += 1
    return (extreme + 1) / (rounds + 1)


def test_a7_known_and_unknown_slugs_take_the_same_time(a7gw: DataPlaneGateway) -> None:
    bad = "svc_" + secrets.token_urlsafe(32)
    samples: dict[bool, list[float]] = {True: [], False: []}
    rng = random.Random(99)
    for _ in range(5):  # five sources, 81 failures each: below the limiter's burst
        with raw(fresh_source()) as client:
            client.post(a7gw.endpoint("a7-known"), json=INIT, headers=auth(bad))  # connect
            order = [True] * 40 + [False] * 40
            rng.shuffle(order)
            for is_known in order:
                slug = "a7-known" if is_known else f"a7-nope-{secrets.token_hex(4)}"
                started = time.perf_counter()
                response = client.post(a7gw.endpoint(slug), json=INIT, headers=auth(bad))
                samples[is_known].append(time.perf_counter() - started)
                assert response.status_code == 401
    known, unknown = samples[True], samples[False]
    gap = abs(_median_gap(known, unknown))
    p = _p_value(known, unknown)
    # Only a gross difference fails: statistically clear AND larger than 2 ms.
    assert not (p < 0.001 and gap > 0.002), (p, gap)


# -- A8: Mcp-Method / Mcp-Name must agree with the body -----------------------------------------

A8_NAMES = ["probe_add_tool", "probe2_add_tool", "probe_echo"]
SAME_BASE64 = "<base64 of the body's name>"
CANARY = re.compile(r"(probe2?)_(c[0-9a-f]{16})")


def _decoded(header: str | None, body_name: str) -> str | None:
    if header == SAME_BASE64:
        return body_name
    return header


@pytest.fixture(scope="module")
def a8(dp: DataPlaneGateway) -> dict[str, Any]:
    return dp.create_profile("a8-headers", ["probe", "probe2"])


def test_a8_header_body_disagreement_is_refused_and_never_executed(
    dp: DataPlaneGateway, a8: dict[str, Any]
) -> None:
    url, token = dp.endpoint("a8-headers"), a8["token"]
    executed: set[str] = set()
    refused: set[str] = set()
    client = raw(fresh_source(), timeout=20)

    header_methods = st.none() | st.sampled_from(
        ["tools/call", "tools/list", "prompts/get", "resources/read", "Tools/Call", ""]
    )
    header_names = st.none() | st.sampled_from(
        [*A8_NAMES, "PROBE_ADD_TOOL", "probe_add_tool2", "", SAME_BASE64]
    )

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        body_method = data.draw(st.sampled_from(["tools/call", "tools/list"]))
        body_name = data.draw(st.sampled_from(A8_NAMES))
        # Half the pairs start out aligned, so agreeing calls are common; the verdict below
        # is worked out from what is actually sent either way.
        header_method: str | None = body_method
        header_name: str | None = data.draw(st.sampled_from([body_name, SAME_BASE64]))
        duplicate_method = False
        if not data.draw(st.booleans()):
            header_method = data.draw(header_methods)
            header_name = data.draw(header_names)
            duplicate_method = data.draw(st.booleans())
        canary = f"c{secrets.token_hex(8)}"
        if body_method == "tools/call":
            arguments = {"name": canary} if body_name.endswith("add_tool") else {"text": canary}
            body = modern_body("tools/call", {"name": body_name, "arguments": arguments}, 3)
        else:
            body = modern_body("tools/list", {}, 3)
        name_header = header_name
        if header_name == SAME_BASE64:
            name_header = f"=?base64?{base64.b64encode(body_name.encode()).decode()}?="
        headers = modern_headers(token, header_method, name_header)
        sent_methods = [] if header_method is None else [header_method]
        if duplicate_method:
            # A second Mcp-Method that agrees with the body: with two copies, first- and
            # last-copy readers would disagree, so two are a mismatch whatever they say.
            headers.append(("Mcp-Method", body_method))
            sent_methods.append(body_method)
        agrees = sent_methods == [body_method] and (
            body_method != "tools/call" or _decoded(header_name, body_name) == body_name
        )
        response = client.post(url, json=body, headers=headers)
        answer = reply(response, 3)
        tool_call = body_method == "tools/call" and body_name.endswith("add_tool")
        server = body_name.split("_", 1)[0]
        if agrees:
            assert response.status_code == 200, (headers, response.text)
            assert "result" in answer
            if tool_call:
                executed.add(f"{server}_{canary}")
        else:
            assert response.status_code == 400, (headers, response.text)
            assert answer["error"]["code"] == types.HEADER_MISMATCH, answer
            if tool_call:
                refused.add(f"{server}_{canary}")

    try:
        check()
        assert executed and refused
        # Every add_tool that ran added its canary to its server. A final add_tool per server
        # (a sentinel) shows up in the gateway's listing only once the gateway re-listed that
        # server after every earlier call had finished; that listing holds every canary that
        # ran. (A refresh lost to a race would only delay this, so the sentinels are re-sent.)

        def add_sentinels() -> dict[str, str]:
            added: dict[str, str] = {}
            for server in ("probe", "probe2"):
                sentinel = f"c{secrets.token_hex(8)}"
                params = {"name": f"{server}_add_tool", "arguments": {"name": sentinel}}
                response = client.post(
                    url,
                    json=modern_body("tools/call", params),
                    headers=modern_headers(token, "tools/call", f"{server}_add_tool"),
                )
                assert response.status_code == 200, response.text
                added[server] = f"{server}_{sentinel}"
                executed.add(added[server])
            return added

        sentinels = add_sentinels()
        deadline = time.monotonic() + 30
        resend = time.monotonic() + 5
        while True:
            listed = modern_tool_names(client, url, token)
            if all(name in listed for name in sentinels.values()):
                break
            assert time.monotonic() < deadline, sentinels
            if time.monotonic() > resend:
                sentinels, resend = add_sentinels(), time.monotonic() + 5
            time.sleep(0.05)  # polling interval, not synchronisation
        canaries = {name for name in listed if CANARY.fullmatch(name)}
        assert not canaries & refused, canaries & refused
        assert canaries == executed
    finally:
        client.close()


def test_a8_agreeing_headers_route_by_the_body(dp: DataPlaneGateway, a8: dict[str, Any]) -> None:
    url, token = dp.endpoint("a8-headers"), a8["token"]
    with raw(fresh_source()) as client:
        body = modern_body("tools/call", {"name": "probe2_env", "arguments": {}}, 4)
        ok = client.post(url, json=body, headers=modern_headers(token, "tools/call", "probe2_env"))
        assert ok.status_code == 200, ok.text
        snapshot = json.loads(reply(ok, 4)["result"]["content"][0]["text"])
        assert snapshot["env"]["PROBE_NAME"] == "probe2"
        # No Mcp-Name at all on a name-bearing method is a mismatch too.
        missing = client.post(url, json=body, headers=modern_headers(token, "tools/call", None))
        assert missing.status_code == 400
        assert reply(missing, 4)["error"]["code"] == types.HEADER_MISMATCH


# -- A9: malformed, batched, nested, oversized -------------------------------------------------


@dataclass
class A9World:
    token: str
    url: str
    session: str
    source: str


@pytest.fixture(scope="module")
def a9(dp: DataPlaneGateway) -> A9World:
    profile = dp.create_profile("a9-bodies", ["probe"])
    source = fresh_source()
    with raw(source) as client:
        session = open_session(client, dp.endpoint("a9-bodies"), profile["token"])
    return A9World(profile["token"], dp.endpoint("a9-bodies"), session, source)


SLOT = b'"__slot__"'


def a9_request(dp: DataPlaneGateway, a9: A9World, path: str) -> tuple[str, dict[str, str], bytes]:
    """(url, headers, body template with SLOT where a value goes) for one request path."""
    if path == "new-session":
        body = {**INIT, "params": {**INIT["params"], "capabilities": {"experimental": {}}}}
        body["params"]["capabilities"]["experimental"]["x"] = {"v": "__slot__"}
        return a9.url, auth(a9.token), json.dumps(body).encode()
    if path == "legacy":
        body = {**INIT, "params": {**INIT["params"], "capabilities": {"experimental": {}}}}
        body["params"]["capabilities"]["experimental"]["x"] = {"v": "__slot__"}
        legacy = dp.gateway.env["SVC_BEARER_TOKEN"]
        return f"{dp.url}/mcp", auth(legacy), json.dumps(body).encode()
    if path == "session":
        body = {
            "jsonrpc": "2.0",
            "id": 5,
            "method": "tools/call",
            "params": {"name": "probe_echo", "arguments": {"text": "__slot__"}},
        }
        extra = {"Mcp-Session-Id": a9.session, "MCP-Protocol-Version": HANDSHAKE}
        return a9.url, auth(a9.token, **extra), json.dumps(body).encode()
    assert path == "modern"
    body = modern_body("tools/call", {"name": "probe_echo", "arguments": {"text": "__slot__"}}, 5)
    headers = dict(modern_headers(a9.token, "tools/call", "probe_echo"))
    return a9.url, headers, json.dumps(body).encode()


DEEP = b"[" * 10_000 + b"]" * 10_000
A9_SLOTS = {
    "nan": b"NaN",
    "infinity": b"Infinity",
    "minus-infinity": b"-Infinity",
    "lone-surrogate": b'"\\ud800"',
    "invalid-utf8": b'"\xff\xfe"',
    "huge-int": b"1" * 5000,
    "deep-array": DEEP,
    "deep-object": b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
}


def a9_body(template: bytes, case: str) -> bytes:
    if case in A9_SLOTS:
        return template.replace(SLOT, A9_SLOTS[case])
    valid = template.replace(SLOT, b'"ok"')
    if case == "batch":
        return b"[" + valid + b"," + valid + b"]"
    if case == "bom":
        return b"\xef\xbb\xbf" + valid
    if case == "truncated":
        return valid[:-7]
    if case == "empty":
        return b""
    if case == "not-an-object":
        return b'"tools/call"'
    if case == "wrong-types":
        return b'{"jsonrpc": 2, "id": {"x": 1}, "method": ["tools/call"], "params": 7}'
    if case == "nan-id":
        return valid.replace(b'"id": 1', b'"id": NaN').replace(b'"id": 5', b'"id": NaN')
    raise AssertionError(case)


A9_CASES = [
    *A9_SLOTS,
    "batch",
    "bom",
    "truncated",
    "empty",
    "not-an-object",
    "wrong-types",
    "nan-id",
]


@pytest.mark.parametrize("path", ["new-session", "session", "modern", "legacy"])
def test_a9_valid_control_request_succeeds(dp: DataPlaneGateway, a9: A9World, path: str) -> None:
    url, headers, template = a9_request(dp, a9, path)
    with raw(a9.source) as client:
        response = client.post(url, content=template.replace(SLOT, b'"ok"'), headers=headers)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("case", A9_CASES)
@pytest.mark.parametrize("path", ["new-session", "session", "modern", "legacy"])
def test_a9_malformed_bodies_get_4xx(
    dp: DataPlaneGateway, a9: A9World, path: str, case: str
) -> None:
    url, headers, template = a9_request(dp, a9, path)
    body = a9_body(template, case)
    with raw(a9.source) as client:
        response = client.post(url, content=body, headers=headers)
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    if response.headers.get("content-type", "").startswith("application/json"):
        assert response.json().get("error"), response.text[:300]


def send_oversized(url: str, headers: dict[str, str], *, chunked: bool, source: str) -> bytes:
    """POST a 5 MiB body over a raw socket, watching for an early answer; return it once the
    gateway has closed the connection."""
    total = 5 * MEBIBYTE
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    lines = [f"POST {parts.path} HTTP/1.1", f"Host: {parts.netloc}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}")
    piece = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"' + b"x" * 65_000
    response = b""
    sent = 0
    with socket.create_connection(
        (parts.hostname, parts.port), timeout=30, source_address=(source, 0)
    ) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        try:
            while sent < total and not response:
                chunk = piece[: total - sent]
                sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" if chunked else chunk)
                sent += len(chunk)
                sock.setblocking(False)
                try:
                    response = sock.recv(65536)
                except BlockingIOError:
                    response = b""
                finally:
                    sock.settimeout(30)  # blocking again, never forever
            if not response and chunked:
                sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        if not response:
            try:
                response = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                response = b""
        # The refusal closes the connection: the gateway must not sit on it.
        sock.settimeout(10)
        try:
            while sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
        except TimeoutError:
            raise AssertionError(f"connection left open after {response[:40]!r}") from None
    return response


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("path", ["new-session", "modern", "legacy"])
def test_a9_oversized_body_gets_413(
    dp: DataPlaneGateway, a9: A9World, path: str, chunked: bool
) -> None:
    url, headers, _ = a9_request(dp, a9, path)
    response = send_oversized(url, headers, chunked=chunked, source=a9.source)
    assert response.startswith(b"HTTP/1.1 413"), response[:300]


def json_values() -> st.SearchStrategy[Any]:
    scalars = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=20)
    )
    return st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=8), children, max_size=4)
        ),
        max_leaves=25,
    )


FUZZ_METHODS = [
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/read",
    "completion/complete",
    "notifications/initialized",
    "notifications/cancelled",
]


@st.composite
def fuzz_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["value", "envelope", "envelope", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "value":
        return json.dumps(draw(json_values())).encode()
    envelope: dict[str, Any] = {"jsonrpc": draw(st.sampled_from(["2.0", "2.0", "1.0", 2]))}
    if draw(st.booleans()):
        envelope["id"] = draw(st.integers() | st.text(max_size=6) | json_values())
    envelope["method"] = draw(st.sampled_from(FUZZ_METHODS) | st.text(max_size=12))
    params = draw(json_values())
    if isinstance(params, dict) and draw(st.booleans()):
        params["_meta"] = {
            types.PROTOCOL_VERSION_META_KEY: MODERN,
            types.CLIENT_CAPABILITIES_META_KEY: {},
        }
    if draw(st.booleans()):
        envelope["params"] = params
    return json.dumps(envelope).encode()


def test_a9_fuzzed_bodies_never_5xx_and_memory_stays_bounded(
    dp: DataPlaneGateway, a9: A9World
) -> None:
    pid = dp.gateway.proc.pid
    client = raw(a9.source)
    statuses: Counter[int] = Counter()
    try:
        # Warm everything this test touches before the baseline.
        for path in ("new-session", "session", "modern"):
            url, headers, template = a9_request(dp, a9, path)
            warm = client.post(url, content=template.replace(SLOT, b'"ok"'), headers=headers)
            assert warm.status_code == 200, warm.text
        baseline = rss_bytes(pid)
        for i in range(6):
            url, headers, template = a9_request(dp, a9, "modern")
            answer = send_oversized(url, headers, chunked=bool(i % 2), source=a9.source)
            assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
            response = client.post(url, content=template.replace(SLOT, DEEP), headers=headers)
            assert response.status_code == 400

        @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(path=st.sampled_from(["new-session", "session", "modern"]), body=fuzz_bodies())
        def check(path: str, body: bytes) -> None:
            url, headers, _ = a9_request(dp, a9, path)
            if path == "modern" and body.startswith(b"{"):
                try:
                    method = json.loads(body).get("method")
                except ValueError:
                    method = None
                if (
                    isinstance(method, str)
                    and method.isascii()
                    and method.isprintable()
                    and method.strip() == method
                ):
                    headers = {**headers, "Mcp-Method": method}
            response = client.post(url, content=body, headers=headers)
            statuses[response.status_code] += 1
            assert response.status_code < 500, (path, body[:200], response.text[:300])

        check()
        grown = rss_bytes(pid) - baseline
    finally:
        client.close()
    assert sum(statuses.values()) >= 100
    assert grown < 50 * MEBIBYTE, f"RSS grew by {grown / MEBIBYTE:.1f} MiB ({statuses})"
    # Still serving.
    with raw(a9.source) as client:
        url, headers, template = a9_request(dp, a9, "session")
        response = client.post(url, content=template.replace(SLOT, b'"alive"'), headers=headers)
        assert response.status_code == 200
        assert reply(response, 5)["result"]["content"][0]["text"] == "alive"


# -- F6: the same tool name on two servers of one profile ----------------------------------------


async def test_f6_colliding_tool_names_are_prefixed_and_routed_to_their_server(
    dp: DataPlaneGateway,
) -> None:
    profile = await trio.to_thread.run_sync(dp.create_profile, "f6-collide", ["probe", "probe2"])
    async with mcp_client(dp.endpoint("f6-collide"), profile["token"]) as client:
        tools = (await client.list_tools()).tools
        names = [t.name for t in tools]
        assert len(names) == len(set(names))
        assert {"probe_search", "probe2_search"} <= set(names)
        assert "search" not in names
        # The prefix names the server: each env tool reports its own server.
        for server in ("probe", "probe2"):
            snapshot = json.loads(text_of(await client.call_tool(f"{server}_env", {})))
            assert snapshot["env"]["PROBE_NAME"] == server
        # Both search tools answer (they echo their arguments as JSON)...
        for server in ("probe", "probe2"):
            result = await client.call_tool(f"{server}_search", {"q": server})
            assert json.loads(text_of(result)) == {"q": server}
        # ...and each reaches only its own server: once probe2 is gone, probe2_search fails
        # naming probe2 while probe_search still answers.
        with pytest.raises(MCPError):
            await client.call_tool("probe2_crash", {})
        with pytest.raises(MCPError, match="'probe2'"):
            await client.call_tool("probe2_search", {"q": "gone"})
        result = await client.call_tool("probe_search", {"q": "still"})
        assert json.loads(text_of(result)) == {"q": "still"}


async def test_f6_a_dotted_tool_name_follows_the_naming_rule(dp: DataPlaneGateway) -> None:
    profile = await trio.to_thread.run_sync(dp.create_profile, "f6-dotted", ["probe"])
    async with mcp_client(dp.endpoint("f6-dotted"), profile["token"]) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        # naming.py rule 2: "." is outside the alphabet and becomes "-"; "a-b" is free.
        assert "probe_a-b" in names
        assert not any("." in n for n in names)
        originals = [n.removeprefix("probe_") for n in names if n != "probe_a-b"] + ["a.b"]
        assert map_names("probe", originals).original_to_exposed["a.b"] == "a-b"
        result = await client.call_tool("probe_a-b", {"x": 1})
        assert json.loads(text_of(result)) == {"x": 1}


# -- F8: annotations are passed through and never used for decisions ----------------------------


def test_f8_annotations_are_listed_unchanged_and_grant_nothing(dp: DataPlaneGateway) -> None:
    profile = dp.create_profile("f8-annotated", ["probe"])
    url, token = dp.endpoint("f8-annotated"), profile["token"]
    with raw(fresh_source()) as client:
        listing = client.post(
            url,
            json=modern_body("tools/list", {}),
            headers=modern_headers(token, "tools/list", None),
        )
        tools = {t["name"]: t for t in reply(listing, 1)["result"]["tools"]}
        assert tools["probe_annotated"]["annotations"] == {
            "readOnlyHint": True,
            "destructiveHint": False,
        }
        assert tools["probe_annotated"]["description"] == "Returns ok."
        assert "annotations" not in tools["probe_crash"]  # none are invented either
        body = modern_body("tools/call", {"name": "probe_annotated", "arguments": {}}, 2)
        # "Read-only" earns no way around authentication...
        for headers in (
            modern_headers("svc_" + secrets.token_urlsafe(32), "tools/call", "probe_annotated"),
            [
                h
                for h in modern_headers(token, "tools/call", "probe_annotated")
                if h[0] != "Authorization"
            ],
        ):
            refused = client.post(url, json=body, headers=headers)
            assert refused.status_code == 401
        # ...nor around the header checks...
        mismatch = client.post(url, json=body, headers=modern_headers(token, "tools/list", None))
        assert mismatch.status_code == 400
        # ...and changes nothing about the call itself.
        called = client.post(
            url, json=body, headers=modern_headers(token, "tools/call", "probe_annotated")
        )
        assert called.status_code == 200
        assert reply(called, 2)["result"]["content"] == [{"type": "text", "text": "ok"}]


def test_f8_no_gateway_code_reads_annotations() -> None:
    root = Path(__file__).resolve().parents[2] / "svcgate"
    pattern = re.compile(
        r"""["']annotations["']|\.annotations\b|readOnlyHint|destructiveHint|idempotentHint"""
        r"""|openWorldHint|read_only_hint|destructive_hint|idempotent_hint|open_world_hint"""
        r"""|ToolAnnotations"""
    )
    # The example servers are MCP servers (they may declare hints), not gateway code.
    sources = sorted(p for p in root.rglob("*.py") if "examples" not in p.parts)
    assert len(sources) > 20
    hits = [
        f"{path.relative_to(root)}:{n}: {line.strip()}"
        for path in sources
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []
