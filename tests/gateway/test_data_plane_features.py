"""Aggregation features of a profile runtime, driven by the official Python SDK client.

Legacy (handshake) mode: the tool union renamed ``<server>_<tool>`` and routed by prefix, the
naming rule of :mod:`svcgate.naming` for names outside ``^[a-zA-Z0-9_-]{1,64}$``, manifests
(only ``default: true`` tools), prompts and resources (URIs kept, first server by name wins),
and forwarding of progress, cancellation, logging, sampling, elicitation, roots and
``notifications/tools/list_changed`` (also when it comes while the server is being started).
Then a 2026-07-28 pass over lists, calls, prompts, resources, progress, logging and
cancellation; a server-to-client request made for a 2026-07-28 client (which has no session
to carry it) is answered with a clear error instead of hanging.

Servers are real processes in real bubblewrap sandboxes (``tests/data_plane_support.py``):
the probe (``tests/fixtures/probe_server.py``) as ``probe``, ``probe2`` and ``curated`` (with
a manifest: echo true, add false, env false), the repository's ``echo`` server, and the npm
``server-everything`` under node for elicitation.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
import pytest
import trio
from data_plane_support import (
    DataPlaneGateway,
    Notifications,
    data_plane_gateway,
    mcp_client,
    text_of,
)
from mcp import Client
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from node_support import NODE_MISSING_REASON, node_available

from devidp.provider import DevIdP

pytestmark = pytest.mark.root

MODERN = "2026-07-28"
NAME_RULE = re.compile(r"[a-zA-Z0-9_-]{1,64}")
PROBE_TOOLS = [
    "echo",
    "add",
    "sleep",
    "env",
    "sample",
    "roots",
    "log",
    "add_tool",
    "crash",
    "annotated",
    "cancelled_count",
]
ECHO_TOOLS = ["echo", "add", "fetch"]
RESOURCE_NOT_FOUND = -32002


@pytest.fixture(scope="module")
def dp(idp: DevIdP, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DataPlaneGateway]:
    with data_plane_gateway(tmp_path_factory.mktemp("dpf"), idp) as gateway:
        yield gateway


async def new_profile(dp: DataPlaneGateway, slug: str, servers: list[str]) -> dict[str, Any]:
    profile: dict[str, Any] = await trio.to_thread.run_sync(dp.create_profile, slug, servers)
    return profile


@asynccontextmanager
async def connect(
    dp: DataPlaneGateway, profile: dict[str, Any], **kwargs: Any
) -> AsyncIterator[Client]:
    async with mcp_client(dp.endpoint(profile["slug"]), profile["token"], **kwargs) as client:
        yield client


def hashed(original: str, sanitized: str, server: str) -> str:
    """The naming rule's hashed form, computed here independently of svcgate.naming."""
    room = 64 - len(server) - 1
    tag = hashlib.sha256(original.encode()).hexdigest()[:8]
    return f"{sanitized[: room - 9]}-{tag}"


# -- tools: union, names, routing, manifests ------------------------------------------------


async def test_tools_are_the_union_renamed_and_routed_by_prefix(dp: DataPlaneGateway) -> None:
    # Bundle order is not catalogue order: the result depends on the servers, not the list.
    profile = await new_profile(dp, "union", ["probe2", "echo", "curated", "probe"])
    async with connect(dp, profile) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        expected = (
            {f"probe_{n}" for n in [*PROBE_TOOLS, "search", "a-b"]}
            | {f"probe2_{n}" for n in [*PROBE_TOOLS, "search"]}
            | {f"echo_{n}" for n in ECHO_TOOLS}
            # curated has a manifest: only its default: true tool.
            | {"curated_echo"}
        )
        assert sorted(tools) == sorted(expected)
        assert all(NAME_RULE.fullmatch(name) for name in tools)
        # "a.b" breaks the rule: exposed under its sanitised name, description kept.
        assert tools["probe_a-b"].description == "Echo the arguments of a.b as JSON."
        assert tools["probe_annotated"].annotations is not None
        assert tools["probe_annotated"].annotations.read_only_hint is True
        assert tools["probe_add"].input_schema["required"] == ["a", "b"]

        # Calls are routed by prefix to the right sandbox, with the original name.
        envs = {}
        for server in ("probe", "probe2", "curated"):
            if f"{server}_env" in tools:
                report = json.loads(text_of(await client.call_tool(f"{server}_env", {})))
                envs[server] = report["env"]["PROBE_NAME"]
        assert envs == {"probe": "probe", "probe2": "probe2"}
        assert text_of(await client.call_tool("echo_echo", {"text": "routed"})) == "routed"
        assert text_of(await client.call_tool("echo_add", {"a": 2, "b": 40})) == "42"
        assert text_of(await client.call_tool("curated_echo", {"text": "kept"})) == "kept"
        result = await client.call_tool("probe_a-b", {"k": [1, "x"]})
        assert not result.is_error
        assert json.loads(text_of(result)) == {"k": [1, "x"]}
        assert json.loads(text_of(await client.call_tool("probe2_search", {"q": "s"}))) == {
            "q": "s"
        }

        # Tools left out by the manifest, unknown servers and names are refused.
        for name in ("curated_add", "curated_env", "nosuch_echo", "probe_nosuch", "echo", "a.b"):
            with pytest.raises(MCPError) as caught:
                await client.call_tool(name, {"a": 1, "b": 2})
            assert caught.value.code == types.INVALID_PARAMS
            assert name in caught.value.message
    runtime = await trio.to_thread.run_sync(dp.runtime, profile)
    counts = {s["name"]: s["tools"] for s in runtime["servers"]}
    assert counts == {
        "curated": 1,
        "echo": len(ECHO_TOOLS),
        "probe": len(PROBE_TOOLS) + 2,
        "probe2": len(PROBE_TOOLS) + 1,
    }


async def test_names_outside_the_rule_follow_the_deterministic_rule(dp: DataPlaneGateway) -> None:
    profile = await new_profile(dp, "names", ["probe"])
    notes = Notifications()
    long_name = "x" * 70
    async with connect(dp, profile, message_handler=notes) as client:
        before = {t.name for t in (await client.list_tools()).tools}
        assert "probe_a-b" in before
        for name in ("héllo wörld", long_name, "a b"):
            result = await client.call_tool("probe_add_tool", {"name": name})
            assert text_of(result) == f"added {name}"
            await notes.wait_for("notifications/tools/list_changed")
        tools = {t.name: t for t in (await client.list_tools()).tools}
    # Non-ASCII letters and spaces become "-"; too long for "probe_" + 58: prefix + hash;
    # "a b" and "a.b" both sanitise to "a-b": the first in code point order ("a b") keeps
    # it and "a.b" moves to its hashed form.
    expected = {
        "probe_h-llo-w-rld": "héllo wörld",
        f"probe_{hashed(long_name, long_name, 'probe')}": long_name,
        "probe_a-b": "a b",
        f"probe_{hashed('a.b', 'a-b', 'probe')}": "a.b",
    }
    for exposed, original in expected.items():
        assert exposed in tools, sorted(tools)
        assert tools[exposed].description == f"Echo the arguments of {original} as JSON."
        assert NAME_RULE.fullmatch(exposed)
    assert len(f"probe_{hashed(long_name, long_name, 'probe')}") == 64
    assert set(tools) == (before - {"probe_a-b"}) | set(expected)


# -- prompts and resources --------------------------------------------------------------------


async def test_prompts_are_aggregated_with_the_prefix_rule(dp: DataPlaneGateway) -> None:
    profile = await new_profile(dp, "prompts", ["probe", "probe2", "echo"])
    async with connect(dp, profile) as client:
        prompts = {p.name: p for p in (await client.list_prompts()).prompts}
        # The echo server offers no prompts.
        assert sorted(prompts) == ["probe2_greet", "probe_greet"]
        assert prompts["probe_greet"].description == "A greeting"
        assert [a.name for a in prompts["probe_greet"].arguments or []] == ["name"]
        result = await client.get_prompt("probe2_greet", {"name": "Ann"})
        assert result.messages[0].content.text == "Hello, Ann"  # type: ignore[union-attr]
        for name in ("greet", "echo_greet", "probe_nosuch"):
            with pytest.raises(MCPError) as caught:
                await client.get_prompt(name, {"name": "x"})
            assert caught.value.code == types.INVALID_PARAMS


async def test_resources_keep_their_uris_and_the_first_server_by_name_wins(
    dp: DataPlaneGateway,
) -> None:
    # probe and probe2 both offer probe://readme and shared://doc; bundle order reversed.
    profile = await new_profile(dp, "resources", ["probe2", "probe"])
    async with connect(dp, profile) as client:
        uris = [str(r.uri) for r in (await client.list_resources()).resources]
        assert sorted(uris) == ["probe://readme", "shared://doc"]
        shared = await client.read_resource("shared://doc")
        assert [c.text for c in shared.contents] == ["from probe"]  # type: ignore[union-attr]
        readme = await client.read_resource("probe://readme")
        assert [c.text for c in readme.contents] == ["probe readme"]  # type: ignore[union-attr]
        with pytest.raises(MCPError) as caught:
            await client.read_resource("shared://nothing")
        assert caught.value.code == RESOURCE_NOT_FOUND
    assert "resource 'shared://doc' of server 'probe2' hidden" in dp.gateway.log_text()


# -- forwarding: progress, cancellation, logging ---------------------------------------------


async def test_progress_is_forwarded_per_request(dp: DataPlaneGateway) -> None:
    profile = await new_profile(dp, "progress", ["probe"])
    seen: dict[str, list[tuple[float, float | None]]] = {"a": [], "b": []}
    results: dict[str, str] = {}

    async with connect(dp, profile) as client:

        async def call(key: str, steps: int) -> None:
            async def on_progress(
                progress: float, total: float | None, message: str | None
            ) -> None:
                seen[key].append((progress, total))

            result = await client.call_tool(
                "probe_sleep", {"seconds": 0.2, "steps": steps}, progress_callback=on_progress
            )
            results[key] = text_of(result)

        # Two calls at once on one session: each gets its own notifications, in order.
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call, "a", 2)
                nursery.start_soon(call, "b", 4)
    assert results == {"a": "slept 0.2", "b": "slept 0.2"}
    assert seen["a"] == [(1, 2), (2, 2)]
    assert seen["b"] == [(1, 4), (2, 4), (3, 4), (4, 4)]


async def cancel_a_running_call(client: Client) -> None:
    """Start a 120 s probe_sleep, cancel it once it reports progress, and return."""
    started = trio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        started.set()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:

            async def call() -> None:
                await client.call_tool(
                    "probe_sleep", {"seconds": 120, "steps": 1200}, progress_callback=on_progress
                )
                raise AssertionError("the call was not cancelled")

            nursery.start_soon(call)
            await started.wait()
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("mode", ["legacy", MODERN])
async def test_cancellation_reaches_the_running_downstream_call(
    dp: DataPlaneGateway, mode: str
) -> None:
    profile = await new_profile(dp, f"cancel-{mode.replace('-', '')}", ["probe"])
    async with connect(dp, profile, mode=mode) as client:
        await client.list_tools()
        counted = await client.call_tool("probe_cancelled_count", {})
        assert text_of(counted) == "0"
        await cancel_a_running_call(client)
        # The probe counts notifications/cancelled that named a running call; it waits (in
        # the sandbox, bounded) for the first one instead of the test sleeping.
        counted = await client.call_tool("probe_cancelled_count", {"at_least": 1, "timeout": 20})
        assert text_of(counted) == "1"
        # The session and the server are still usable.
        assert text_of(await client.call_tool("probe_echo", {"text": "after"})) == "after"


async def test_log_messages_are_forwarded_with_the_server_prefix(dp: DataPlaneGateway) -> None:
    profile = await new_profile(dp, "logs", ["probe", "probe2"])
    send, receive = trio.open_memory_channel[types.LoggingMessageNotificationParams](100)

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        await send.send(params)

    async def next_log() -> types.LoggingMessageNotificationParams:
        with trio.fail_after(20):
            return await receive.receive()

    async with connect(dp, profile, logging_callback=on_log) as client:
        assert text_of(await client.call_tool("probe2_log", {"message": "hello"})) == "logged"
        first = await next_log()
        assert (first.level, first.logger, first.data) == ("info", "probe2.probe", "hello")
        # logging/setLevel is forwarded to every server that logs.
        with pytest.warns(MCPDeprecationWarning):
            await client.set_logging_level("error")
        for server in ("probe", "probe2"):
            for level in ("warning", "error"):
                message = f"{server} {level}"
                args = {"level": level, "message": message}
                assert text_of(await client.call_tool(f"{server}_log", args)) == "logged"
        got = [await next_log(), await next_log()]
        assert [(m.level, m.logger, m.data) for m in got] == [
            ("error", "probe.probe", "probe error"),
            ("error", "probe2.probe", "probe2 error"),
        ]


# -- server-to-client requests ----------------------------------------------------------------


async def test_sampling_is_forwarded_to_the_calling_client(dp: DataPlaneGateway) -> None:
    profile = await new_profile(dp, "sampling", ["probe"])
    asked: list[types.CreateMessageRequestParams] = []

    async def sampling(
        context: Any, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        asked.append(params)
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text="four"),
            model="test-model",
            stop_reason="endTurn",
        )

    async with connect(dp, profile, sampling_callback=sampling) as client:
        with trio.fail_after(30):
            result = await client.call_tool("probe_sample", {"prompt": "2+2?"})
        assert not result.is_error, text_of(result)
        assert json.loads(text_of(result)) == {
            "role": "assistant",
            "content": {"type": "text", "text": "four"},
            "model": "test-model",
            "stopReason": "endTurn",
        }
    assert len(asked) == 1
    assert asked[0].max_tokens == 100
    assert asked[0].messages[0].content.text == "2+2?"  # type: ignore[union-attr]

    # The client's refusal reaches the server as a JSON-RPC error.
    async def refuse(context: Any, params: types.CreateMessageRequestParams) -> types.ErrorData:
        return types.ErrorData(code=-1, message="the user declined")

    async with connect(dp, profile, sampling_callback=refuse) as client:
        with trio.fail_after(30):
            result = await client.call_tool("probe_sample", {"prompt": "2+2?"})
        assert result.is_error
        assert json.loads(text_of(result)) == {"code": -1, "message": "the user declined"}

    # A client that declared no sampling capability: a clear error, not a hang.
    async with connect(dp, profile) as client:
        with trio.fail_after(30):
            result = await client.call_tool("probe_sample", {"prompt": "2+2?"})
        assert result.is_error
        assert "no connected client can answer sampling/createMessage" in text_of(result)


async def test_roots_are_forwarded_to_the_calling_client(dp: DataPlaneGateway) -> None:
    profile = await new_profile(dp, "roots", ["probe"])

    async def roots(context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(
            roots=[types.Root(uri="file:///work/project", name="project")]  # type: ignore[arg-type]
        )

    async with connect(dp, profile, list_roots_callback=roots) as client:
        with trio.fail_after(30):
            result = await client.call_tool("probe_roots", {})
        assert json.loads(text_of(result)) == {
            "roots": [{"uri": "file:///work/project", "name": "project"}]
        }
    # Without the capability the gateway answers an empty list itself.
    async with connect(dp, profile) as client:
        with trio.fail_after(30):
            result = await client.call_tool("probe_roots", {})
        assert json.loads(text_of(result)) == {"roots": []}


@pytest.mark.skipif(not node_available(), reason=NODE_MISSING_REASON)
async def test_elicitation_is_forwarded_to_the_calling_client(dp: DataPlaneGateway) -> None:
    profile = await new_profile(dp, "elicit", ["everything"])
    asked: list[str] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"name": "Ada", "check": True})

    async with connect(dp, profile, elicitation_callback=elicit) as client:
        with trio.fail_after(30):
            result = await client.call_tool("everything_trigger-elicitation-request", {})
        text = text_of(result)
    assert asked == ["Please provide inputs for the following fields:"]
    assert "- Name: Ada" in text
    assert "- Agreed to terms: true" in text


# -- list changes -------------------------------------------------------------------------------


async def test_list_changed_is_emitted_and_the_new_tool_is_listed(dp: DataPlaneGateway) -> None:
    profile = await new_profile(dp, "changing", ["probe", "probe2"])
    watcher_notes, caller_notes = Notifications(), Notifications()
    async with (
        connect(dp, profile, message_handler=watcher_notes) as watcher,
        connect(dp, profile, message_handler=caller_notes) as caller,
    ):
        assert "probe_fresh" not in {t.name for t in (await watcher.list_tools()).tools}
        await caller.list_tools()
        result = await caller.call_tool("probe_add_tool", {"name": "fresh"})
        assert text_of(result) == "added fresh"
        # Every session that listed is told, not only the one whose call caused it.
        await caller_notes.wait_for("notifications/tools/list_changed")
        await watcher_notes.wait_for("notifications/tools/list_changed")
        for client in (watcher, caller):
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"probe_fresh", "probe2_echo"} <= names
            assert "probe2_fresh" not in names
        assert json.loads(text_of(await watcher.call_tool("probe_fresh", {"n": 1}))) == {"n": 1}


async def test_a_list_change_while_the_server_starts_is_not_lost(dp: DataPlaneGateway) -> None:
    # "lately" adds tool "late" and says list_changed just after answering the gateway's
    # first tools/list, while the gateway is still starting it (listing prompts, resources).
    profile = await new_profile(dp, "lately", ["lately"])
    notes = Notifications()
    async with connect(dp, profile, message_handler=notes) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        if "lately_late" not in names:
            # Listed before the gateway re-listed the server: this session is then told.
            await notes.wait_for("notifications/tools/list_changed", within=10)
            names = {t.name for t in (await client.list_tools()).tools}
        assert {"lately_late", "lately_echo"} <= names
        assert json.loads(text_of(await client.call_tool("lately_late", {"x": 1}))) == {"x": 1}


# -- the 2026-07-28 revision ----------------------------------------------------------------------


async def test_modern_clients_list_call_prompts_and_resources(dp: DataPlaneGateway) -> None:
    profile = await new_profile(dp, "modern", ["probe", "probe2", "curated"])
    async with connect(dp, profile) as legacy:
        legacy_tools = sorted(t.name for t in (await legacy.list_tools()).tools)
    send, receive = trio.open_memory_channel[types.LoggingMessageNotificationParams](math.inf)

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        await send.send(params)

    async with connect(
        dp, profile, mode=MODERN, logging_callback=on_log, log_level="info"
    ) as client:
        assert client.protocol_version == MODERN
        assert sorted(t.name for t in (await client.list_tools()).tools) == legacy_tools
        assert text_of(await client.call_tool("probe2_echo", {"text": "modern"})) == "modern"
        assert text_of(await client.call_tool("curated_echo", {"text": "c"})) == "c"
        with pytest.raises(MCPError):
            await client.call_tool("curated_add", {"a": 1, "b": 2})
        prompts = sorted(p.name for p in (await client.list_prompts()).prompts)
        assert prompts == ["curated_greet", "probe2_greet", "probe_greet"]
        greeting = await client.get_prompt("probe_greet", {"name": "Bo"})
        assert greeting.messages[0].content.text == "Hello, Bo"  # type: ignore[union-attr]
        uris = sorted(str(r.uri) for r in (await client.list_resources()).resources)
        assert uris == ["probe://readme", "shared://doc"]
        shared = await client.read_resource("shared://doc")
        assert [c.text for c in shared.contents] == ["from probe"]  # type: ignore[union-attr]

        seen: list[float] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append(progress)

        slept = await client.call_tool(
            "probe_sleep", {"seconds": 0.2, "steps": 2}, progress_callback=on_progress
        )
        assert text_of(slept) == "slept 0.2"
        assert seen == [1, 2]

        # Log messages reach a 2026-07-28 request that opted in (log_level), prefixed.
        assert text_of(await client.call_tool("probe2_log", {"message": "now"})) == "logged"
        with trio.fail_after(20):
            message = await receive.receive()
        assert (message.level, message.logger, message.data) == ("info", "probe2.probe", "now")


async def test_modern_client_gets_a_clear_error_for_server_requests(dp: DataPlaneGateway) -> None:
    profile = await new_profile(dp, "modern-sample", ["probe"])

    asked: list[types.CreateMessageRequestParams] = []

    async def sampling(
        context: Any, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        asked.append(params)
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text="unexpected"),
            model="test-model",
        )

    # The client declares sampling, but the gateway has no session to send the request on.
    async with connect(dp, profile, mode=MODERN, sampling_callback=sampling) as client:
        with trio.fail_after(20):
            result = await client.call_tool("probe_sample", {"prompt": "hi"})
        assert result.is_error
        assert "no connected client can answer sampling/createMessage" in text_of(result)
        assert asked == []
        # Roots: the gateway answers an empty list itself.
        with trio.fail_after(20):
            roots = await client.call_tool("probe_roots", {})
        assert json.loads(text_of(roots)) == {"roots": []}
