"""The forwarding fast path (:mod:`svcgate.fastpath`).

First what qualifies, exhaustively and without I/O: only a ``tools/call`` the SDK would
accept and answer the same way; everything else goes to the SDK server. Then, against real
sandboxed servers and raw HTTP: a qualifying call is answered as JSON by the fast path while
a session that declared sampling still gets the SDK's event stream; progress commits an
event stream with the notifications before the result; errors keep their JSON-RPC shape
(and the 2026-07-28 status mapping); a client that hangs up cancels the call downstream,
and a handshake client's ``notifications/cancelled`` does too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
import trio
from data_plane_support import DataPlaneGateway, data_plane_gateway

from devidp.provider import DevIdP
from svcgate import fastpath
from svcgate.runtime import legacy_params

MODERN = "2026-07-28"
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}
ACCEPT = (b"accept", b"application/json, text/event-stream")
JSON = (b"content-type", b"application/json")


def call(name: str = "probe_echo", **extra: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": {"text": "hi"}}
    params.update(extra)
    return {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}


def legacy_headers(*more: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    return [ACCEPT, JSON, (b"mcp-session-id", b"s1"), *more]


def modern_headers(
    name: str = "probe_echo", *more: tuple[bytes, bytes]
) -> list[tuple[bytes, bytes]]:
    return [
        ACCEPT,
        JSON,
        (b"mcp-protocol-version", MODERN.encode()),
        (b"mcp-method", b"tools/call"),
        (b"mcp-name", name.encode()),
        *more,
    ]


def classify(headers: list[tuple[bytes, bytes]], message: Any) -> fastpath.FastRequest | None:
    return fastpath.classify(
        headers,
        message,
        fast_session=lambda session: session == "s1",
        plain_tool=lambda tool: tool == "probe_echo",
    )


def test_a_handshake_call_on_a_known_session_qualifies() -> None:
    request = classify(legacy_headers(), call())
    assert request == fastpath.FastRequest(7, "probe_echo", call()["params"], False, "s1")
    versioned = legacy_headers((b"mcp-protocol-version", b"2025-06-18"))
    assert classify(versioned, call()) is not None
    wildcard = [(b"accept", b"*/*"), JSON, (b"mcp-session-id", b"s1")]
    assert classify(wildcard, call()) is not None
    assert classify(legacy_headers(), {**call(), "id": "x"}) is not None


def test_a_2026_call_that_passes_the_sdk_ladder_qualifies() -> None:
    message = call(_meta=ENVELOPE)
    request = classify(modern_headers(), message)
    assert request is not None and request.modern and request.session_id is None


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        # Not a single tools/call request.
        (legacy_headers(), {**call(), "method": "tools/list"}),
        (legacy_headers(), [call()]),
        (legacy_headers(), {k: v for k, v in call().items() if k != "id"}),
        (legacy_headers(), {**call(), "id": None}),
        (legacy_headers(), {**call(), "id": True}),
        (legacy_headers(), {**call(), "id": 1.5}),
        (legacy_headers(), {**call(), "jsonrpc": "1.0"}),
        (legacy_headers(), {**call(), "params": None}),
        (legacy_headers(), call(name=None)),
        (legacy_headers(), call(arguments=[1])),
        (legacy_headers(), call(_meta="x")),
        # Headers the SDK would refuse or must check.
        ([JSON, (b"mcp-session-id", b"s1")], call()),
        ([(b"accept", b"application/json"), JSON, (b"mcp-session-id", b"s1")], call()),
        ([ACCEPT, (b"mcp-session-id", b"s1")], call()),
        ([ACCEPT, (b"content-type", b"text/plain"), (b"mcp-session-id", b"s1")], call()),
        (legacy_headers((b"mcp-param-text", b"hi")), call()),
        (legacy_headers((b"mcp-protocol-version", b"1999-01-01")), call()),
        # Sessions: none, unknown, or one that does not qualify.
        ([ACCEPT, JSON], call()),
        ([ACCEPT, JSON, (b"mcp-session-id", b"other")], call()),
        # A tool the fast path may not serve (unknown, not ready, x-mcp-header parameters).
        (legacy_headers(), call(name="probe_sample")),
        # 2026-07-28 requests that fail the SDK's ladder: the SDK answers them.
        (modern_headers(), call()),
        (modern_headers("other_tool"), call(_meta=ENVELOPE)),
        (modern_headers("probe_echo", (b"mcp-name", b"probe_echo")), call(_meta=ENVELOPE)),
        (modern_headers("probe_echo", (b"mcp-session-id", b"s1")), call(_meta=ENVELOPE)),
        (
            modern_headers(),
            call(_meta={**ENVELOPE, "io.modelcontextprotocol/protocolVersion": "2025-11-25"}),
        ),
        (
            [h for h in modern_headers() if h[0] != b"mcp-method"],
            call(_meta=ENVELOPE),
        ),
    ],
)
def test_everything_else_goes_to_the_sdk(headers: list[tuple[bytes, bytes]], message: Any) -> None:
    assert classify(headers, message) is None


@pytest.mark.parametrize(
    ("capabilities", "qualifies"),
    [
        ({}, True),
        ({"experimental": {}}, True),
        ({"sampling": {}}, False),
        ({"elicitation": {"form": {}}}, False),
        ({"roots": {"listChanged": True}}, False),
        (None, False),
        ("x", False),
    ],
)
def test_only_sessions_that_take_no_server_requests_qualify(
    capabilities: Any, qualifies: bool
) -> None:
    assert fastpath.qualifies_for_fast_path(capabilities) is qualifies


def test_the_2026_envelope_is_not_passed_to_handshake_era_servers() -> None:
    # An SDK server refuses a request carrying the envelope on a handshake connection.
    params = {"name": "t", "_meta": {**ENVELOPE, "progressToken": 3, "x/y": 1}}
    assert legacy_params(params) == {"name": "t", "_meta": {"progressToken": 3, "x/y": 1}}
    assert legacy_params({"name": "t", "_meta": ENVELOPE}) == {"name": "t"}
    plain = {"name": "t", "_meta": {"progressToken": 3}}
    assert legacy_params(plain) is plain


# -- against real sandboxed servers ------------------------------------------------------------


@pytest.fixture(scope="module")
def dp(idp: DevIdP, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DataPlaneGateway]:
    with data_plane_gateway(tmp_path_factory.mktemp("fast"), idp) as gateway:
        yield gateway


class Raw:
    """Raw streamable-HTTP exchanges with one profile."""

    def __init__(self, dp: DataPlaneGateway, profile: dict[str, Any]) -> None:
        self.url = dp.endpoint(profile["slug"])
        self.auth = {"Authorization": f"Bearer {profile['token']}"}
        self.accept = {"Accept": "application/json, text/event-stream"}

    def initialize(self, capabilities: dict[str, Any]) -> str:
        body = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": capabilities,
                "clientInfo": {"name": "raw", "version": "1"},
            },
        }
        response = httpx2.post(self.url, json=body, headers={**self.auth, **self.accept})
        assert response.status_code == 200, response.text
        session = response.headers["mcp-session-id"]
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        headers = {**self.auth, **self.accept, "Mcp-Session-Id": session}
        assert httpx2.post(self.url, json=note, headers=headers).status_code == 202
        return session

    def post(self, body: Any, session: str | None = None, **headers: str) -> httpx2.Response:
        extra = {"Mcp-Session-Id": session} if session else {}
        return httpx2.post(
            self.url,
            json=body,
            headers={**self.auth, **self.accept, **extra, **headers},
            timeout=30,
        )


def sse_messages(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


@pytest.mark.root
def test_qualifying_calls_are_answered_as_json_and_others_by_the_sdk(dp: DataPlaneGateway) -> None:
    raw = Raw(dp, dp.create_profile("fast-json", ["probe"]))
    plain = raw.initialize({})
    response = raw.post(call(), plain)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.headers["mcp-session-id"] == plain
    assert response.json() == {
        "jsonrpc": "2.0",
        "id": 7,
        "result": {"content": [{"type": "text", "text": "hi"}], "isError": False},
    }
    # A session that declared sampling is served by the SDK (its event stream).
    sampling = raw.initialize({"sampling": {}})
    response = raw.post(call(), sampling)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert sse_messages(response.text)[-1]["result"]["content"][0]["text"] == "hi"
    # A downstream error keeps its code and message.
    response = raw.post(call(name="probe_echo", arguments={"text": 1}), plain)
    assert response.json()["result"]["isError"] is True
    # An unknown tool is the SDK's error, unchanged.
    response = raw.post(call(name="probe_nope"), plain)
    assert "unknown tool" in response.text


@pytest.mark.root
def test_a_2026_call_gets_its_result_type(dp: DataPlaneGateway) -> None:
    raw = Raw(dp, dp.create_profile("fast-modern", ["probe"]))
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "probe_echo"}
    response = raw.post(call(_meta=ENVELOPE), **headers)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json()["result"] == {
        "content": [{"type": "text", "text": "hi"}],
        "isError": False,
        "resultType": "complete",
    }


@pytest.mark.root
def test_progress_commits_an_event_stream_before_the_result(dp: DataPlaneGateway) -> None:
    raw = Raw(dp, dp.create_profile("fast-progress", ["probe"]))
    session = raw.initialize({})
    message = call(
        name="probe_sleep", arguments={"seconds": 0.1, "steps": 2}, _meta={"progressToken": "p"}
    )
    response = raw.post(message, session)
    assert response.headers["content-type"].startswith("text/event-stream")
    messages = sse_messages(response.text)
    assert [m.get("method") for m in messages] == [
        "notifications/progress",
        "notifications/progress",
        None,
    ]
    assert [m["params"]["progressToken"] for m in messages[:2]] == ["p", "p"]
    assert messages[-1]["id"] == 7 and "result" in messages[-1]


async def counted(raw: Raw, session: str, at_least: int) -> str:
    message = call(name="probe_cancelled_count", arguments={"at_least": at_least, "timeout": 20})
    response = await trio.to_thread.run_sync(lambda: raw.post(message, session))
    return str(response.json()["result"]["content"][0]["text"])


@pytest.mark.root
async def test_hanging_up_or_cancelling_cancels_the_call_downstream(dp: DataPlaneGateway) -> None:
    profile = await trio.to_thread.run_sync(dp.create_profile, "fast-cancel", ["probe"])
    raw = Raw(dp, profile)
    session = await trio.to_thread.run_sync(raw.initialize, {})
    assert await counted(raw, session, 0) == "0"
    long = call(
        name="probe_sleep", arguments={"seconds": 120, "steps": 1200}, _meta={"progressToken": 1}
    )
    headers = {**raw.auth, **raw.accept, "Mcp-Session-Id": session}
    # 1. The client hangs up once the call has started (its first progress event).
    async with (
        httpx2.AsyncClient(timeout=30) as client,
        client.stream("POST", raw.url, json=long, headers=headers) as response,
    ):
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                break
    assert await counted(raw, session, 1) == "1"
    # 2. The client sends notifications/cancelled for the call in flight.
    async with (
        httpx2.AsyncClient(timeout=30) as client,
        client.stream("POST", raw.url, json=long, headers=headers) as response,
    ):
        lines = response.aiter_lines()
        async for line in lines:
            if line.startswith("data:"):
                break
        cancel = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": 7, "reason": "test"},
        }
        answer = await client.post(raw.url, json=cancel, headers=headers)
        assert answer.status_code == 202
        rest = [line async for line in lines]
    assert not [line for line in rest if line.startswith("data:")]  # no answer is owed
    assert await counted(raw, session, 2) == "2"
