"""``@modelcontextprotocol/server-github`` in a sandbox, its credential injected by the proxy.

The real server-github 2025.4.8 runs under node in a bubblewrap sandbox (one per profile),
its HTTPS to ``api.github.com`` going through the gateway's egress proxy (node without its
global fetch, ``global-agent`` preloaded: see ``tests/egress_support.py``). The proxy dials
the fake GitHub API (``tests/fixtures/fake_github.py``) on loopback (``SVC_EGRESS_HOSTS``,
``SVC_EGRESS_ALLOW_CIDRS=127.0.0.0/8``) and verifies it with the fake's test CA.

* alice (admin) and bob each store a credential for ``github`` (``allowed_hosts:
  [api.github.com]``, a placeholder of their own); their sandboxes get the placeholder as
  ``GITHUB_PERSONAL_ACCESS_TOKEN`` and the upstream sees each owner's real secret;
* ``github-inject`` (no ``credential_env``: server-github sends no token at all) with
  alice's credential using ``inject_header``: the proxy sets the header itself;
* carol's credential does not cover ``api.github.com``: the request is refused
  (``deny_host``), audited, and never reaches the upstream;
* no secret (raw or base64) in tool results, the MCP responses on the wire, the sandboxes'
  environments and files, any host process's argv, or the gateway's log; a careless upstream
  that reflects the request headers does not hand the secret back to the sandbox.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from data_plane_support import DataPlaneGateway, mcp_client
from egress_support import (
    GITHUB_ENTRY,
    GITHUB_MISSING_REASON,
    GITHUB_SERVER,
    GITHUB_TOKEN_ENV,
    audit_events,
    egress_gateway,
    egress_match,
    fake_github,
    files_containing,
    github_available,
    github_egress_env,
    github_server,
    leaks,
    put_credential,
    sandbox_processes,
    user_id,
    wait_audit,
    wire_tool_call,
)
from fixtures.fake_github import GITHUB_HOST, FakeGitHub, RecordedRequest
from gateway_support import login
from mcp.shared.exceptions import MCPError
from process_support import processes_with

from devidp.provider import DevIdP

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not github_available(), reason=GITHUB_MISSING_REASON),
]

INJECT_SERVER = "github-inject"
SEARCH = "search_repositories"

ALICE_SECRET = "ghp_aliceREALsecret_7Q2m9xK4vB8nL3pZ"
BOB_SECRET = "ghp_bobREALsecret_5T1k8wJ2cN6hR0yDq"
CAROL_SECRET = "ghp_carolREALsecret_3F6s1aM9eU4gW7"
INJECT_SECRET = "ghp_aliceINJECTsecret_8Y3d5rV1tH6j"
SECRETS = (ALICE_SECRET, BOB_SECRET, CAROL_SECRET, INJECT_SECRET)
PLACEHOLDERS = {
    "alice": "ghp_placeholder_alice_xxxxxxxx",
    "bob": "ghp_placeholder_bob_xxxxxxxxxx",
    "carol": "ghp_placeholder_carol_xxxxxxxx",
}
ACCOUNTS = {
    ALICE_SECRET: "alice-gh",
    BOB_SECRET: "bob-gh",
    CAROL_SECRET: "carol-gh",
    INJECT_SECRET: "alice-inject",
}


@dataclass
class World:
    dp: DataPlaneGateway
    fake: FakeGitHub
    sessions: dict[str, str]
    users: dict[str, int]
    # Profile per user ("alice" also runs github-inject).
    profiles: dict[str, dict[str, Any]]

    def url(self, who: str) -> str:
        return self.dp.endpoint(self.profiles[who]["slug"])

    def token(self, who: str) -> str:
        token: str = self.profiles[who]["token"]
        return token


@pytest.fixture(scope="module")
def world(idp: DevIdP, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    servers = {
        GITHUB_SERVER: github_server(),
        INJECT_SERVER: github_server(credential_env=None),
    }
    with (
        fake_github(tokens=ACCOUNTS) as fake,
        egress_gateway(
            tmp_path_factory.mktemp("egh"), idp, servers, **github_egress_env(fake)
        ) as dp,
    ):
        gateway = dp.gateway
        sessions = {
            "alice": dp.admin_session,
            "bob": dp.user_session,
            "carol": login(gateway, "carol"),
        }
        # Credentials first: a sandbox gets its placeholder when it starts, and a profile's
        # sandboxes start as soon as it has servers.
        for who, secret, hosts in (
            ("alice", ALICE_SECRET, [GITHUB_HOST]),
            ("bob", BOB_SECRET, [GITHUB_HOST]),
            ("carol", CAROL_SECRET, ["api.example.com"]),
        ):
            put_credential(
                gateway,
                sessions[who],
                GITHUB_SERVER,
                secret,
                placeholder=PLACEHOLDERS[who],
                allowed_hosts=hosts,
            )
        put_credential(
            gateway,
            sessions["alice"],
            INJECT_SERVER,
            INJECT_SECRET,
            inject_header="Authorization",
            inject_format="Bearer {token}",
            allowed_hosts=[GITHUB_HOST],
        )
        profiles = {
            "alice": dp.create_profile(
                "gh-alice", [GITHUB_SERVER, INJECT_SERVER], session=sessions["alice"]
            ),
            "bob": dp.create_profile("gh-bob", [GITHUB_SERVER], session=sessions["bob"]),
            "carol": dp.create_profile("gh-carol", [GITHUB_SERVER], session=sessions["carol"]),
        }
        users = {who: user_id(gateway, session) for who, session in sessions.items()}
        yield World(dp, fake, sessions, users, profiles)


@dataclass
class Outcome:
    error: bool
    text: str
    # Everything the SDK client handed back, serialised.
    everything: str


async def call(world: World, who: str, tool: str, arguments: dict[str, Any]) -> Outcome:
    """``tools/call`` through ``who``'s profile with the official Python SDK client."""
    async with mcp_client(world.url(who), world.token(who)) as client:
        try:
            result = await client.call_tool(tool, arguments)
        except MCPError as exc:
            return Outcome(True, str(exc), f"{exc!r} {exc.error!r}")
    text = "".join(getattr(c, "text", "") for c in result.content)
    return Outcome(bool(result.is_error), text, result.model_dump_json())


def no_leak(*texts: str) -> None:
    for text in texts:
        found = leaks(text, SECRETS)
        assert not found, f"secret forms {found} in {text[:2000]!r}"


def searched(fake: FakeGitHub, query: str) -> list[RecordedRequest]:
    return [r for r in fake.seen("/search/repositories") if r.query.get("q") == [query]]


# -- tools/list needs no egress ---------------------------------------------------------------


async def test_server_github_lists_its_tools(world: World) -> None:
    async with mcp_client(world.url("alice"), world.token("alice")) as client:
        names = {t.name for t in (await client.list_tools()).tools}
    assert {f"{GITHUB_SERVER}_{SEARCH}", f"{GITHUB_SERVER}_search_code"} <= names
    assert f"{INJECT_SERVER}_{SEARCH}" in names


# -- each owner's secret reaches the upstream, and only there -----------------------------------


@pytest.mark.parametrize(
    ("who", "secret"), [("alice", ALICE_SECRET), ("bob", BOB_SECRET)], ids=["alice", "bob"]
)
async def test_the_owner_secret_reaches_the_upstream(world: World, who: str, secret: str) -> None:
    query = f"svcgate {who}"
    outcome = await call(world, who, f"{GITHUB_SERVER}_{SEARCH}", {"query": query})
    assert not outcome.error, outcome.text
    # The answer is the fake API's, for the account the real secret belongs to.
    found = json.loads(outcome.text)
    assert [item["full_name"] for item in found["items"]] == [
        f"{ACCOUNTS[secret]}/fake-svcgate-{who}"
    ]
    assert found["items"][0]["description"] == "served by the fake GitHub API"

    [request] = searched(world.fake, query)
    assert request.sni == GITHUB_HOST  # the proxy opened its own TLS to the upstream
    assert request.header_values("Authorization") == [f"Bearer {secret}"]
    headers = json.dumps(request.headers)
    assert PLACEHOLDERS[who] not in headers  # every occurrence was replaced
    others = [s for s in SECRETS if s != secret]
    assert not leaks(headers, others), "another user's secret reached the upstream"
    assert (request.header("User-Agent") or "").startswith("modelcontextprotocol/servers/github")
    no_leak(outcome.text, outcome.everything)


async def test_inject_header_sets_the_credential_itself(world: World) -> None:
    query = "svcgate injected"
    outcome = await call(world, "alice", f"{INJECT_SERVER}_{SEARCH}", {"query": query})
    assert not outcome.error, outcome.text
    [item] = json.loads(outcome.text)["items"]
    assert item["full_name"] == "alice-inject/fake-svcgate-injected"
    [request] = searched(world.fake, query)
    assert request.header_values("Authorization") == [f"Bearer {INJECT_SECRET}"]
    no_leak(outcome.text, outcome.everything)


def test_the_mcp_responses_on_the_wire_carry_no_secret(world: World) -> None:
    for who in ("alice", "bob"):
        query = f"wire {who}"
        reply, received = wire_tool_call(
            world.url(who), world.token(who), f"{GITHUB_SERVER}_{SEARCH}", {"query": query}
        )
        assert "result" in reply, reply
        assert not reply["result"].get("isError"), reply
        assert f"fake-wire-{who}" in reply["result"]["content"][0]["text"]
        assert len(searched(world.fake, query)) == 1
        no_leak(received)


async def test_an_upstream_reflecting_the_secret_does_not_hand_it_back(world: World) -> None:
    """/search/code on the fake API echoes the request headers, the injected credential
    included: whatever the proxy does with that answer, the sandbox must not read it."""
    for who, secret in (("alice", ALICE_SECRET), ("bob", BOB_SECRET)):
        query = f"reflect {who}"
        outcome = await call(world, who, f"{GITHUB_SERVER}_search_code", {"q": query})
        [request] = [r for r in world.fake.seen("/search/code") if r.query.get("q") == [query]]
        assert request.header_values("Authorization") == [f"Bearer {secret}"]
        # The answer still arrives (the secret in it redacted), so the check below is not
        # passed by an error message alone.
        assert not outcome.error, outcome.text
        [item] = json.loads(outcome.text)["items"]
        assert item["name"] == "reflected"
        assert item["query"] == query
        no_leak(outcome.text, outcome.everything)


# -- a host outside the credential is refused ------------------------------------------------


async def test_a_host_outside_the_credential_is_refused_and_audited(world: World) -> None:
    query = "svcgate carol"
    outcome = await call(world, "carol", f"{GITHUB_SERVER}_{SEARCH}", {"query": query})
    assert outcome.error, outcome.text
    assert not searched(world.fake, query)
    assert not any(CAROL_SECRET in json.dumps(r.headers) for r in world.fake.seen()), (
        "carol's secret reached a host her credential does not name"
    )
    wait_audit(
        world.dp.gateway,
        world.dp.admin_session,
        egress_match(
            server=GITHUB_SERVER, host=GITHUB_HOST, decision="deny_host", user=world.users["carol"]
        ),
    )
    no_leak(outcome.text, outcome.everything)


# -- audit -------------------------------------------------------------------------------------


async def test_allowed_egress_is_audited_per_owner(world: World) -> None:
    for who in ("alice", "bob"):
        outcome = await call(world, who, f"{GITHUB_SERVER}_{SEARCH}", {"query": f"audit {who}"})
        assert not outcome.error, outcome.text
    gateway, admin = world.dp.gateway, world.dp.admin_session
    for who in ("alice", "bob"):
        match = egress_match(
            server=GITHUB_SERVER, host=GITHUB_HOST, decision="allow", user=world.users[who]
        )
        events = wait_audit(gateway, admin, match)
        assert all(e["kind"] == "egress" for e in events)
    # bob sees his own egress rows, never alice's.
    mine = audit_events(gateway, world.sessions["bob"])
    assert mine
    assert {e["user_id"] for e in mine} == {world.users["bob"]}
    no_leak(json.dumps(audit_events(gateway, admin, kind=None)))


# -- the sandboxes never hold a secret ---------------------------------------------------------


async def test_sandboxes_hold_placeholders_never_secrets(world: World) -> None:
    # Every sandbox runs (carol's too), alice's and bob's after a request through the proxy.
    for who in ("alice", "bob"):
        outcome = await call(world, who, f"{GITHUB_SERVER}_{SEARCH}", {"query": f"env {who}"})
        assert not outcome.error, outcome.text
    async with mcp_client(world.url("carol"), world.token("carol")) as client:
        assert (await client.list_tools()).tools

    processes = sandbox_processes(str(GITHUB_ENTRY), under=world.dp.gateway.proc.pid)
    tokens = sorted(env.get(GITHUB_TOKEN_ENV, "") for env in processes.values())
    # alice: github (placeholder) and github-inject (no variable); bob, carol: github.
    assert tokens == sorted(["", *PLACEHOLDERS.values()]), tokens
    for pid, env in processes.items():
        assert env["HTTPS_PROXY"].startswith("http://127.0.0.1:"), env
        no_leak("\n".join(f"{k}={v}" for k, v in env.items()))
        assert not files_containing(pid, SECRETS), f"a secret in the files of sandbox {pid}"
    for secret in SECRETS:
        assert not processes_with(secret), "a secret in a host process's argv"


def test_the_gateway_log_holds_no_secret(world: World) -> None:
    no_leak(world.dp.gateway.log_text())
