"""The node tooling the data-plane tests rely on, proven against real things.

* ``ts_client.mjs`` (the official TypeScript SDK client) and ``inspector-cli`` against the
  official Python SDK's streamable HTTP server (served in-process by Hypercorn on trio,
  behind a bearer-token check);
* ``server-everything`` and ``server-memory`` over stdio under the host's node;
* ``server-everything`` inside a real bubblewrap sandbox started by the supervisor, with
  the node_modules tree bound read-only.
"""

from __future__ import annotations

import hmac
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from mcp import types
from mcp.server.mcpserver import Context, MCPServer
from node_support import (
    MEMORY_FILE_ENV,
    NODE_MISSING_REASON,
    NODE_MODULES,
    SANDBOX_NODE,
    SANDBOX_NODE_MODULES,
    NodeToolError,
    StdioJsonRpc,
    copy_node_modules_public,
    everything_command,
    inspector,
    memory_command,
    node_available,
    node_server_spec,
    readable_by,
    sandbox_node_modules_source,
    ts_client,
)
from process_support import public_tmpdir

from sandbox import SandboxSpec
from svcgate.supervisor import SandboxKey, SandboxOwner, SandboxSupervisor, SupervisorConfig

pytestmark = pytest.mark.skipif(not node_available(), reason=NODE_MISSING_REASON)

TOKEN = "node-tooling-token"


def build_server() -> MCPServer:
    server = MCPServer("py-upstream", version="1.2.3")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    async def count(n: int, ctx: Context) -> str:
        """Report progress n times."""
        for i in range(1, n + 1):
            await ctx.report_progress(i, n, f"step {i}")
        return f"counted {n}"

    @server.tool()
    async def ask(question: str, ctx: Context) -> str:
        """Ask the client's model (sampling/createMessage)."""
        reply = await ctx.session.create_message(
            [
                types.SamplingMessage(
                    role="user", content=types.TextContent(type="text", text=question)
                )
            ],
            max_tokens=16,
        )
        assert isinstance(reply.content, types.TextContent)
        return reply.content.text

    @server.prompt()
    def greet(name: str) -> str:
        return f"Hello, {name}"

    @server.resource("note://greeting", mime_type="text/plain")
    def greeting() -> str:
        return "hello from python"

    return server


@dataclass
class Upstream:
    url: str
    # Authorization header values of refused requests.
    refused: list[str] = field(default_factory=list)


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    """The Python SDK's streamable HTTP app behind a bearer check, on a free loopback port."""
    inner = build_server().streamable_http_app()
    expected = f"Bearer {TOKEN}".encode()
    state = Upstream(url="")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            got = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(got, expected):
                state.refused.append(got.decode(errors="replace"))
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": b'{"error":"unauthorized"}'})
                return
        await inner(scope, receive, send)

    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.graceful_timeout = 2
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, app, config, shutdown_trigger=shutdown.wait))
        state.url = f"{binds[0]}/mcp"
        try:
            yield state
        finally:
            shutdown.set()


async def test_ts_client_initializes_lists_and_calls_with_a_bearer_token(
    upstream: Upstream,
) -> None:
    out = await ts_client(
        upstream.url,
        TOKEN,
        "--call",
        "add",
        "--args",
        '{"a": 2, "b": 3}',
        "--list-prompts",
        "--list-resources",
        "--read",
        "note://greeting",
    )
    assert out["protocolVersion"] == "2025-11-25"
    assert out["serverInfo"] == {"name": "py-upstream", "version": "1.2.3"}
    assert out["sessionId"]
    assert out["tools"] == ["add", "count", "ask"]
    assert out["call"]["isError"] is False
    assert out["call"]["structuredContent"] == {"result": 5}
    assert out["call"]["content"] == [{"type": "text", "text": "5"}]
    assert out["prompts"] == ["greet"]
    assert out["resources"] == ["note://greeting"]
    assert out["read"]["contents"][0]["text"] == "hello from python"
    assert out["terminated"] is True
    assert upstream.refused == []


async def test_ts_client_reports_a_refused_token_as_an_error(upstream: Upstream) -> None:
    out = await ts_client(upstream.url, "wrong", check=False)
    assert out["code"] == 401 and "unauthorized" in out["error"], out
    assert upstream.refused == ["Bearer wrong"]
    with pytest.raises(NodeToolError, match="401"):
        await ts_client(upstream.url, None)


async def test_ts_client_collects_progress_notifications(upstream: Upstream) -> None:
    out = await ts_client(
        upstream.url, TOKEN, "--call", "count", "--args", '{"n": 3}', "--progress"
    )
    assert out["call"]["structuredContent"] == {"result": "counted 3"}
    assert out["progress"] == [
        {"progress": i, "total": 3, "message": f"step {i}"} for i in (1, 2, 3)
    ]


# The SDK marks server-initiated sampling deprecated (2026-07-28 revision); servers in the
# wild still use it, so the client must answer it.
@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
async def test_ts_client_answers_sampling_requests(upstream: Upstream) -> None:
    out = await ts_client(
        upstream.url,
        TOKEN,
        "--call",
        "ask",
        "--args",
        '{"question": "meaning of life?"}',
        "--sampling-reply",
        "forty-two",
    )
    assert out["call"]["structuredContent"] == {"result": "forty-two"}
    [request] = out["sampling"]
    assert request["messages"] == [
        {"role": "user", "content": {"type": "text", "text": "meaning of life?"}}
    ]
    assert request["maxTokens"] == 16


async def test_inspector_cli_lists_and_calls_tools_over_http(upstream: Upstream) -> None:
    listed = await inspector(upstream.url, TOKEN, "--method", "tools/list")
    assert [t["name"] for t in listed["tools"]] == ["add", "count", "ask"]
    assert listed["tools"][0]["inputSchema"]["required"] == ["a", "b"]

    called = await inspector(
        upstream.url,
        TOKEN,
        "--method",
        "tools/call",
        "--tool-name",
        "add",
        "--tool-arg",
        "a=20",
        "b=22",
    )
    assert called["structuredContent"] == {"result": 42}

    assert upstream.refused == []

    with pytest.raises(NodeToolError, match="unauthorized"):
        await inspector(upstream.url, "wrong")
    assert upstream.refused == ["Bearer wrong"]


@pytest.fixture
def memory_file() -> Iterator[Path]:
    directory = public_tmpdir("node-memory")
    yield directory / "memory.jsonl"
    shutil.rmtree(directory)


@pytest.mark.parametrize(
    ("server", "name", "some_tools"),
    [
        ("everything", "mcp-servers/everything", {"echo", "get-sum", "get-env"}),
        ("memory", "memory-server", {"create_entities", "read_graph", "search_nodes"}),
    ],
)
async def test_npm_servers_answer_over_stdio_under_node(
    server: str, name: str, some_tools: set[str], memory_file: Path
) -> None:
    argv = everything_command() if server == "everything" else memory_command()
    env = {**os.environ, MEMORY_FILE_ENV: str(memory_file)}
    proc = await trio.lowlevel.open_process(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        client = StdioJsonRpc(proc.stdin, proc.stdout)
        with trio.fail_after(20):
            init = await client.initialize()
            assert init["serverInfo"]["name"] == name
            assert init["protocolVersion"] == "2025-06-18"
            tools = await client.tool_names()
            assert some_tools <= set(tools)
            if server == "memory":
                reply = await client.request(
                    "tools/call",
                    {
                        "name": "create_entities",
                        "arguments": {
                            "entities": [
                                {"name": "svcgate", "entityType": "project", "observations": []}
                            ]
                        },
                    },
                )
                assert not reply["result"].get("isError"), reply
                assert "svcgate" in await trio.Path(memory_file).read_text()
            else:
                reply = await client.request(
                    "tools/call", {"name": "echo", "arguments": {"message": "hi"}}
                )
                assert reply["result"]["content"] == [{"type": "text", "text": "Echo: hi"}]
    finally:
        proc.kill()
        await proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                await stream.aclose()


def test_a_tree_below_a_private_directory_is_not_bindable(tmp_path: Path) -> None:
    # pytest's tmp_path is 0700, like a home directory a checkout may live in.
    private = tmp_path / "node_modules"
    shutil.copytree(
        NODE_MODULES / "@modelcontextprotocol" / "server-everything",
        private / "@modelcontextprotocol" / "server-everything",
    )
    assert (tmp_path.stat().st_mode & 0o777) == 0o700
    assert not readable_by(private)
    assert readable_by(sandbox_node_modules_source())


# Copying ~6000 files takes 0.5 s on an idle machine and 5-11 s on a busy one.
@pytest.fixture(params=["checkout", pytest.param("public-copy", marks=pytest.mark.slow)])
def node_modules_source(request: pytest.FixtureRequest) -> Iterator[Path]:
    """The tree bound into the sandbox: the checkout's (when reachable) and a public copy."""
    if request.param == "checkout":
        yield sandbox_node_modules_source()
        return
    copy = copy_node_modules_public()
    yield copy
    shutil.rmtree(copy.parent)


@pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root (namespaces, cgroups)")
async def test_everything_runs_inside_a_sandbox_with_node_modules_bound_read_only(
    node_modules_source: Path,
) -> None:
    source = node_modules_source
    assert readable_by(source)
    argv = everything_command(SANDBOX_NODE_MODULES, SANDBOX_NODE)
    spec = node_server_spec(argv, label="node-tooling/everything", source=source)
    key = SandboxKey(9, f"everything-{os.getpid()}")
    owner = SandboxOwner(profile_slug="node-tooling", user_id=109)

    async def factory() -> SandboxSpec:
        return spec

    state_dir = public_tmpdir("node-sup")
    try:
        supervisor = SandboxSupervisor(SupervisorConfig(state_dir=state_dir, stop_grace=2.0))
        async with trio.open_nursery() as nursery:
            with trio.fail_after(10):
                await nursery.start(supervisor.run)
            try:
                started = trio.current_time()
                with trio.fail_after(20):
                    handle = await supervisor.ensure(key, factory, owner=owner)
                    client = StdioJsonRpc(handle.stdin, handle.stdout)
                    try:
                        init = await client.initialize()
                    except EOFError as exc:
                        raise AssertionError(f"stderr: {handle.stderr_tail()}") from exc
                    elapsed = trio.current_time() - started
                    assert init["serverInfo"]["name"] == "mcp-servers/everything"
                    assert {"echo", "get-env"} <= set(await client.tool_names())
                    reply = await client.request("tools/call", {"name": "get-env", "arguments": {}})
                env = json.loads(reply["result"]["content"][0]["text"])
                # Only the spec's environment reaches the server, not the test process's.
                assert env["HOME"] == "/home/sandbox"
                assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
                assert "VIRTUAL_ENV" not in env and "PYTEST_CURRENT_TEST" not in env
                # The server runs as the sandbox uid; cold start is node's, not bwrap's.
                cmdlines = {
                    pid: await trio.Path(f"/proc/{pid}/cmdline").read_bytes()
                    for pid in handle.host_pids()
                }
                [node_pid] = [p for p, c in cmdlines.items() if c.startswith(b"/usr/bin/node\0")]
                assert os.stat(f"/proc/{node_pid}").st_uid == 65534
                assert elapsed < 10, elapsed
                with trio.fail_after(15):
                    assert await supervisor.stop(key) is True
            finally:
                nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
