"""The example echo server, driven by the official MCP Python SDK client over stdio."""

from __future__ import annotations

import sys
from pathlib import Path

import trio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

import svcgate.examples

ECHO = Path(svcgate.examples.__file__).parent / "echo_server.py"


async def test_sdk_client_lists_and_calls_the_echo_tools() -> None:
    params = StdioServerParameters(command=sys.executable, args=[str(ECHO)])
    with trio.fail_after(30):
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            assert {t.name for t in tools.tools} == {"echo", "add", "fetch"}
            echoed = await session.call_tool("echo", {"text": "hello"})
            assert echoed.content[0].text == "hello"  # type: ignore[union-attr]
            added = await session.call_tool("add", {"a": 2, "b": 40})
            assert added.content[0].text == "42"  # type: ignore[union-attr]
            bad = await session.call_tool("fetch", {"url": "file:///etc/passwd"})
            assert bad.is_error
