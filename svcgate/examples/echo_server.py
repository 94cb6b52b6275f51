#!/usr/bin/env python3
"""A small real MCP server over stdio: the legacy fallback that ``SVC_ECHO_BIN`` points at.

Hand-written with the standard library only, on purpose: it runs inside a sandbox whose
read-only root is the host's ``/usr`` (Debian's ``/usr/bin/python3``), where the MCP SDK is
not installed. It speaks newline-delimited JSON-RPC 2.0 as MCP's stdio transport defines,
negotiates the protocol revisions 2024-11-05 to 2025-11-25, and offers three tools:

- ``echo``  returns its ``text`` argument;
- ``add``   returns ``a + b``;
- ``fetch`` performs an HTTP GET of ``url`` through the environment's proxy settings
  (``HTTP_PROXY``/``HTTPS_PROXY``), which inside a sandbox is the gateway's egress proxy,
  and returns the status and up to 64 KiB of the body.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from typing import Any

SUPPORTED = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
FETCH_LIMIT = 64 * 1024

TOOLS: list[dict[str, Any]] = [
    {
        "name": "echo",
        "description": "Return the given text unchanged.",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
    {
        "name": "add",
        "description": "Add two numbers.",
        "inputSchema": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
    {
        "name": "fetch",
        "description": "HTTP GET a URL through the configured proxy; return status and body.",
        "inputSchema": {
            "type": "object",
            "properties": {"url": {"type": "string"}},
            "required": ["url"],
        },
    },
]


def _text(text: str, *, error: bool = False) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": error}


def _fetch(url: str) -> dict[str, Any]:
    if not url.startswith(("http://", "https://")):
        return _text("url must be http:// or https://", error=True)
    request = urllib.request.Request(url, headers={"User-Agent": "svcgate-echo/1"})  # noqa: S310 - scheme checked above
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - scheme checked above
            body = response.read(FETCH_LIMIT).decode("utf-8", "replace")
            return _text(f"{response.status}\n{body}")
    except urllib.error.HTTPError as exc:
        body = exc.read(FETCH_LIMIT).decode("utf-8", "replace")
        return _text(f"{exc.code}\n{body}", error=True)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return _text(f"request failed: {exc}", error=True)


def call_tool(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    if name == "echo" and isinstance(arguments.get("text"), str):
        return _text(arguments["text"])
    if name == "add":
        a, b = arguments.get("a"), arguments.get("b")
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return _text(str(a + b))
    if name == "fetch" and isinstance(arguments.get("url"), str):
        return _fetch(arguments["url"])
    return _text(f"unknown tool or bad arguments: {name}", error=True)


def handle(message: dict[str, Any]) -> dict[str, Any] | None:
    method = message.get("method")
    msg_id = message.get("id")
    params = message.get("params") or {}
    if msg_id is None:
        return None  # a notification (e.g. notifications/initialized)
    if method == "initialize":
        asked = params.get("protocolVersion")
        version = asked if asked in SUPPORTED else SUPPORTED[0]
        result: dict[str, Any] = {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "echo", "version": "1.0.0"},
        }
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        result = call_tool(str(params.get("name")), params.get("arguments") or {})
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
