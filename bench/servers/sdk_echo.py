"""The benchmark's downstream: an echo server written with the official MCP SDK (mcp 2.x).

The same file is served three ways, so every subject runs the same server code:

- ``sdk_echo.py``                 stdio (inside a gateway sandbox; under mcp-proxy, fastmcp)
- ``sdk_echo.py http PORT``       streamable HTTP, stateful, event streams (the SDK default)
- ``sdk_echo.py http PORT json``  streamable HTTP, stateless JSON responses

``BENCH_EXTRA_TOOLS=N`` adds N more tools (``tool_0`` ...) for the tools/list scenario.
"""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer

app = MCPServer("echo", log_level="WARNING")


@app.tool(description="Return the given text unchanged.")
def echo(text: str) -> str:
    return text


def _extra(index: int) -> None:
    def tool(value: str = "") -> str:
        return value

    app.add_tool(
        tool,
        name=f"tool_{index}",
        description=f"Extra tool {index} of the tools/list benchmark; returns its value.",
    )


for _index in range(int(os.environ.get("BENCH_EXTRA_TOOLS", "0"))):
    _extra(_index)


def main(argv: list[str]) -> None:
    if len(argv) >= 2 and argv[0] == "http":
        json_mode = len(argv) > 2 and argv[2] == "json"
        app.run(
            transport="streamable-http",
            host="127.0.0.1",
            port=int(argv[1]),
            json_response=json_mode,
            stateless_http=json_mode,
        )
    else:
        app.run()


if __name__ == "__main__":
    main(sys.argv[1:])
