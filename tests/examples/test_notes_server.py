"""The example notes server over stdio: the MCP Python SDK client, and raw JSON-RPC lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import trio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

import svcgate.examples

NOTES = Path(svcgate.examples.__file__).parent / "notes_server.py"


async def test_sdk_client_adds_lists_and_clears_notes() -> None:
    params = StdioServerParameters(command=sys.executable, args=[str(NOTES)])
    with trio.fail_after(30):
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            init = await session.initialize()
            assert init.server_info.name == "notes"
            tools = await session.list_tools()
            assert [t.name for t in tools.tools] == ["add_note", "list_notes", "clear_notes"]
            empty = await session.call_tool("list_notes", {})
            assert empty.content[0].text == "no notes"  # type: ignore[union-attr]
            first = await session.call_tool("add_note", {"text": "buy milk"})
            assert first.content[0].text == "note 1 added"  # type: ignore[union-attr]
            second = await session.call_tool("add_note", {"text": "call Ada"})
            assert second.content[0].text == "note 2 added"  # type: ignore[union-attr]
            listed = await session.call_tool("list_notes", {})
            assert listed.content[0].text == "buy milk\ncall Ada"  # type: ignore[union-attr]
            cleared = await session.call_tool("clear_notes", {})
            assert cleared.content[0].text == "cleared 2 notes"  # type: ignore[union-attr]
            again = await session.call_tool("clear_notes", {})
            assert again.content[0].text == "cleared 0 notes"  # type: ignore[union-attr]
            assert (await session.call_tool("list_notes", {})).content[0].text == "no notes"  # type: ignore[union-attr]
            bad = await session.call_tool("add_note", {"text": 5})
            assert bad.is_error
            assert (await session.call_tool("add_note", {"text": "x" * 5000})).is_error


def test_raw_stdio_negotiates_versions_and_answers_ping_and_errors() -> None:
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2024-11-05", "capabilities": {},
                    "clientInfo": {"name": "t", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "initialize",
         "params": {"protocolVersion": "1999-01-01"}},
        {"jsonrpc": "2.0", "id": 3, "method": "ping"},
        {"jsonrpc": "2.0", "id": 4, "method": "resources/list"},
        {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
         "params": {"name": "add_note", "arguments": {"text": "one"}}},
        {"jsonrpc": "2.0", "id": 6, "method": "tools/call",
         "params": {"name": "clear_notes"}},
        {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "nope"}},
    ]  # fmt: skip
    stdin = "".join(json.dumps(line) + "\n" for line in lines) + "not json\n"
    done = subprocess.run(
        [sys.executable, str(NOTES)], input=stdin, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    replies = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["id"] for r in replies] == [1, 2, 3, 4, 5, 6, 7, None]
    assert replies[0]["result"]["protocolVersion"] == "2024-11-05"
    assert replies[1]["result"]["protocolVersion"] == "2025-11-25"
    assert replies[2]["result"] == {}
    assert replies[3]["error"]["code"] == -32601
    assert replies[4]["result"]["content"][0]["text"] == "note 1 added"
    assert replies[5]["result"]["content"][0]["text"] == "cleared 1 note"
    assert replies[6]["result"]["isError"] is True
    assert replies[7]["error"]["code"] == -32700
