#!/usr/bin/env python3
"""A small real MCP server over stdio that keeps notes in memory (the demo's ``notes``).

Hand-written with the standard library only, like :mod:`echo_server`: it runs inside a
sandbox whose read-only root is a minimal Python runtime image, where the MCP SDK is not
installed. It speaks newline-delimited JSON-RPC 2.0 as MCP's stdio transport defines,
negotiates the protocol revisions 2024-11-05 to 2025-11-25, answers ``ping``, and offers
three tools:

- ``add_note``    stores its ``text`` argument and returns ``note N added``;
- ``list_notes``  returns the notes, one per line, or ``no notes``;
- ``clear_notes`` forgets every note and returns ``cleared N note(s)``.

Resource handling: the notes live only in this process (a sandbox restart forgets them) and
are bounded: at most :data:`MAX_NOTES` notes of at most :data:`MAX_NOTE_CHARS` characters
each, so a caller cannot grow the process past its memory limit. Errors (bad arguments, a
full notebook, an unknown tool) are tool results with ``isError`` set; an unknown method is
a JSON-RPC ``-32601`` error and a line that is not JSON a ``-32700`` one.
"""

from __future__ import annotations

import json
import sys
from typing import Any

SUPPORTED = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
MAX_NOTES = 1000
MAX_NOTE_CHARS = 4096

TOOLS: list[dict[str, Any]] = [
    {
        "name": "add_note",
        "description": "Store a short text note.",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
    {
        "name": "list_notes",
        "description": "List the stored notes, one per line.",
        "inputSchema": {"type": "object", "properties": {}},
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "clear_notes",
        "description": "Delete every stored note.",
        "inputSchema": {"type": "object", "properties": {}},
        "annotations": {"destructiveHint": True},
    },
]

NOTES: list[str] = []


def _text(text: str, *, error: bool = False) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": error}


def call_tool(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    if name == "add_note" and isinstance(arguments.get("text"), str):
        text: str = arguments["text"]
        if not text.strip():
            return _text("text must not be empty", error=True)
        if len(text) > MAX_NOTE_CHARS:
            return _text(f"a note has at most {MAX_NOTE_CHARS} characters", error=True)
        if len(NOTES) >= MAX_NOTES:
            return _text(f"the notebook is full ({MAX_NOTES} notes)", error=True)
        NOTES.append(text)
        return _text(f"note {len(NOTES)} added")
    if name == "list_notes":
        return _text("\n".join(NOTES) if NOTES else "no notes")
    if name == "clear_notes":
        count = len(NOTES)
        NOTES.clear()
        return _text(f"cleared {count} note{'' if count == 1 else 's'}")
    return _text(f"unknown tool or bad arguments: {name}", error=True)


def handle(message: dict[str, Any]) -> dict[str, Any] | None:
    method = message.get("method")
    msg_id = message.get("id")
    params = message.get("params") or {}
    if msg_id is None:
        return None  # a notification (e.g. notifications/initialized)
    if not isinstance(params, dict):
        params = {}
    if method == "initialize":
        asked = params.get("protocolVersion")
        version = asked if asked in SUPPORTED else SUPPORTED[0]
        result: dict[str, Any] = {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "notes", "version": "1.0.0"},
        }
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        arguments = params.get("arguments") or {}
        if not isinstance(arguments, dict):
            arguments = {}
        result = call_tool(str(params.get("name")), arguments)
    else:
        return {
            "jsonrpc": "2.0",
            "id": msg_id,
            "error": {"code": -32601, "message": f"method not found: {method}"},
        }
    return {"jsonrpc": "2.0", "id": msg_id, "result": result}


def main() -> int:
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            message = json.loads(line)
        except ValueError:
            reply: dict[str, Any] | None = {
                "jsonrpc": "2.0",
                "id": None,
                "error": {"code": -32700, "message": "parse error"},
            }
        else:
            reply = handle(message) if isinstance(message, dict) else None
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
