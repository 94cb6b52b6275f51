"""Real MCP clients against ``/mcp/p/<slug>`` with real sandboxed servers, npm ones included.

Clients: the official TypeScript SDK client (``tests/node/ts_client.mjs``),
``@modelcontextprotocol/inspector-cli`` (``--transport http --header "Authorization: Bearer
..."``) and the official Python SDK client in both modes (``legacy`` and 2026-07-28).
Servers (``tests/data_plane_support.py``), each in its own bubblewrap sandbox: the
repository's ``echo`` server, the probe (``tests/fixtures/probe_server.py``), and the npm
``server-everything`` and ``server-memory`` under node with node_modules bound read-only.

Profile ``bundle`` runs [echo, probe, everything]; profile ``mem`` runs [memory]. The node
clients run as subprocesses (``tests/node_support.py``), from worker threads.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from data_plane_support import DataPlaneGateway, data_plane_gateway, mcp_client, text_of
from node_support import (
    NODE_MISSING_REASON,
    NodeToolError,
    inspector,
    node_available,
    ts_client,
)

from devidp.provider import DevIdP

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not node_available(), reason=NODE_MISSING_REASON),
]

MODERN = "2026-07-28"
EVERYTHING_DOC = "demo://resource/static/document/architecture.md"


class Profiles:
    def __init__(self, dp: DataPlaneGateway) -> None:
        self.dp = dp
        self.bundle = dp.create_profile("bundle", ["echo", "probe", "everything"])
        self.mem = dp.create_profile("mem", ["memory"])

    def url(self, profile: dict[str, Any]) -> str:
        return self.dp.endpoint(profile["slug"])


@pytest.fixture(scope="module")
def profiles(idp: DevIdP, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Profiles]:
    with data_plane_gateway(tmp_path_factory.mktemp("dpc"), idp) as gateway:
        yield Profiles(gateway)


def texts(result: dict[str, Any]) -> str:
    return "".join(c.get("text", "") for c in result["content"])


# -- the TypeScript SDK client ---------------------------------------------------------------


async def test_ts_client_lists_the_bundle_and_calls_each_server(profiles: Profiles) -> None:
    url, token = profiles.url(profiles.bundle), profiles.bundle["token"]
    out = await ts_client(
        url,
        token,
        "--call",
        "echo_echo",
        "--args",
        '{"text": "from ts"}',
        "--list-prompts",
        "--list-resources",
        "--read",
        EVERYTHING_DOC,
    )
    assert out["protocolVersion"] == "2025-11-25"
    assert out["serverInfo"]["name"] == "svcgate"
    assert out["sessionId"]
    tools = set(out["tools"])
    assert len(tools) == len(out["tools"])
    assert {"echo_echo", "echo_add", "probe_echo", "probe_sleep"} <= tools
    assert {"everything_echo", "everything_get-sum", "everything_trigger-sampling-request"} <= tools
    assert {name.split("_", 1)[0] for name in tools} == {"echo", "probe", "everything"}
    assert out["call"] == {"content": [{"type": "text", "text": "from ts"}], "isError": False}
    assert {"probe_greet", "everything_simple-prompt", "everything_args-prompt"} <= set(
        out["prompts"]
    )
    assert {"probe://readme", EVERYTHING_DOC} <= set(out["resources"])
    assert out["read"]["contents"][0]["uri"] == EVERYTHING_DOC
    assert "architecture" in out["read"]["contents"][0]["text"].lower()
    assert out["terminated"] is True

    third_party = await ts_client(
        url, token, "--call", "everything_echo", "--args", '{"message": "npm"}'
    )
    assert texts(third_party["call"]) == "Echo: npm"


async def test_ts_client_receives_progress(profiles: Profiles) -> None:
    url, token = profiles.url(profiles.bundle), profiles.bundle["token"]
    for tool, args in (
        ("everything_trigger-long-running-operation", {"duration": 0.3, "steps": 3}),
        ("probe_sleep", {"seconds": 0.3, "steps": 3}),
    ):
        out = await ts_client(url, token, "--call", tool, "--args", json.dumps(args), "--progress")
        assert not out["call"].get("isError"), out
        assert [(p["progress"], p["total"]) for p in out["progress"]] == [(1, 3), (2, 3), (3, 3)]


async def test_ts_client_answers_sampling_through_the_gateway(profiles: Profiles) -> None:
    url, token = profiles.url(profiles.bundle), profiles.bundle["token"]
    out = await ts_client(
        url,
        token,
        "--sampling-reply",
        "pong",
        "--call",
        "probe_sample",
        "--args",
        '{"prompt": "ping"}',
    )
    assert not out["call"]["isError"], out
    answer = json.loads(texts(out["call"]))
    assert answer["content"] == {"type": "text", "text": "pong"}
    assert answer["model"] == "svcgate-ts-client"
    [request] = out["sampling"]
    assert request["messages"] == [{"role": "user", "content": {"type": "text", "text": "ping"}}]

    everything = await ts_client(
        url,
        token,
        "--sampling-reply",
        "pong from ts",
        "--call",
        "everything_trigger-sampling-request",
        "--args",
        '{"prompt": "hello", "maxTokens": 7}',
    )
    assert "pong from ts" in texts(everything["call"])
    [request] = everything["sampling"]
    assert request["maxTokens"] == 7
    assert "hello" in request["messages"][0]["content"]["text"]


async def test_ts_client_is_refused_without_the_profile_token(profiles: Profiles) -> None:
    url = profiles.url(profiles.bundle)
    out = await ts_client(url, profiles.mem["token"], check=False)
    assert out["code"] == 401, out


# -- inspector-cli ------------------------------------------------------------------------------


async def test_inspector_cli_lists_and_calls_tools(profiles: Profiles) -> None:
    url, token = profiles.url(profiles.bundle), profiles.bundle["token"]
    listed = await inspector(url, token, "--method", "tools/list")
    names = {t["name"] for t in listed["tools"]}
    assert {"echo_echo", "probe_add", "everything_get-sum"} <= names
    schemas = {t["name"]: t["inputSchema"] for t in listed["tools"]}
    assert schemas["echo_echo"]["required"] == ["text"]

    summed = await inspector(
        url,
        token,
        "--method",
        "tools/call",
        "--tool-name",
        "everything_get-sum",
        "--tool-arg",
        "a=20",
        "b=22",
    )
    assert texts(summed) == "The sum of 20 and 22 is 42."
    echoed = await inspector(
        url,
        token,
        "--method",
        "tools/call",
        "--tool-name",
        "echo_echo",
        "--tool-arg",
        "text=inspected",
    )
    assert texts(echoed) == "inspected"

    with pytest.raises(NodeToolError):
        await inspector(url, "not-the-token")


# -- server-memory: state kept in its sandbox across clients -------------------------------------


async def test_memory_round_trip_across_clients(profiles: Profiles) -> None:
    url, token = profiles.url(profiles.mem), profiles.mem["token"]
    entity = {"name": "svcgate", "entityType": "project", "observations": ["runs sandboxes"]}
    async with mcp_client(url, token) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"memory_create_entities", "memory_read_graph", "memory_search_nodes"} <= names
        created = await client.call_tool("memory_create_entities", {"entities": [entity]})
        assert not created.is_error, text_of(created)

    # Another client, another session: the graph lives in the memory server's sandbox.
    out = await ts_client(url, token, "--call", "memory_read_graph")
    assert not out["call"].get("isError"), out
    graph = json.loads(texts(out["call"]))
    assert graph["entities"] == [entity]

    found = await inspector(
        url,
        token,
        "--method",
        "tools/call",
        "--tool-name",
        "memory_search_nodes",
        "--tool-arg",
        "query=sandboxes",
    )
    assert [e["name"] for e in json.loads(texts(found))["entities"]] == ["svcgate"]


# -- the Python SDK client against server-everything -------------------------------------------


@pytest.mark.parametrize("mode", ["legacy", MODERN])
async def test_python_client_uses_server_everything(profiles: Profiles, mode: str) -> None:
    url, token = profiles.url(profiles.bundle), profiles.bundle["token"]
    async with mcp_client(url, token, mode=mode) as client:
        assert client.protocol_version == ("2025-11-25" if mode == "legacy" else MODERN)
        tools = {t.name for t in (await client.list_tools()).tools}
        assert {"everything_echo", "everything_get-sum", "echo_echo", "probe_echo"} <= tools

        echoed = await client.call_tool("everything_echo", {"message": mode})
        assert text_of(echoed) == f"Echo: {mode}"
        summed = await client.call_tool("everything_get-sum", {"a": 2, "b": 3})
        assert text_of(summed) == "The sum of 2 and 3 is 5."

        resources = {str(r.uri) for r in (await client.list_resources()).resources}
        assert {EVERYTHING_DOC, "probe://readme"} <= resources
        doc = await client.read_resource(EVERYTHING_DOC)
        assert "architecture" in doc.contents[0].text.lower()  # type: ignore[union-attr]
        # Not listed, but produced by one of server-everything's resource templates.
        templates = {
            t.uri_template for t in (await client.list_resource_templates()).resource_templates
        }
        assert "demo://resource/dynamic/text/{resourceId}" in templates
        dynamic = await client.read_resource("demo://resource/dynamic/text/7")
        assert str(dynamic.contents[0].uri) == "demo://resource/dynamic/text/7"

        prompts = {p.name for p in (await client.list_prompts()).prompts}
        assert {"everything_simple-prompt", "everything_args-prompt", "probe_greet"} <= prompts
        prompt = await client.get_prompt("everything_args-prompt", {"city": "Paris", "state": "TX"})
        assert prompt.messages[0].content.text == "What's weather in Paris, TX?"  # type: ignore[union-attr]
