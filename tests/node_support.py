"""Real node MCP clients and servers for the tests (the pinned packages in ``tests/node``).

``scripts/node-deps`` installs them (``make test`` runs it first). Everything here is
synchronous (``subprocess``): call the runners from trio tests through
``trio.to_thread.run_sync``, e.g. ``await trio.to_thread.run_sync(run_ts_client, url, tok)``.

* :func:`run_ts_client`: ``tests/node/ts_client.mjs``, the official TypeScript SDK client
  (``Client`` + ``StreamableHTTPClientTransport``) as a one-shot CLI printing one JSON object;
* :func:`run_inspector`: ``@modelcontextprotocol/inspector-cli`` in ``--cli`` mode over
  ``--transport http`` with an ``Authorization: Bearer`` header;
* :func:`everything_command` / :func:`memory_command`: the argv that runs
  ``server-everything`` / ``server-memory`` over stdio, on the host or (with
  ``node_modules=SANDBOX_NODE_MODULES, node=SANDBOX_NODE``) inside a sandbox that binds
  :func:`sandbox_node_modules_source` read-only at :data:`SANDBOX_NODE_MODULES`
  (:func:`node_server_spec` builds that spec);
* :class:`StdioJsonRpc`: newline-delimited JSON-RPC over any pair of trio streams (a
  process's pipes or a sandbox handle's stdio) that skips the notifications node servers
  interleave (server-everything may send ``notifications/tools/list_changed`` before its
  ``initialize`` result).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trio
from process_support import public_tmpdir

from sandbox import Bind, SandboxSpec
from sandbox.host import HostCheckError, check_traversable
from sandbox.spec import DEFAULT_UID

NODE_DIR = Path(__file__).resolve().parent / "node"
NODE_MODULES = NODE_DIR / "node_modules"
TS_CLIENT = NODE_DIR / "ts_client.mjs"
_SCOPE = "@modelcontextprotocol"
INSPECTOR_DIR = NODE_MODULES / _SCOPE / "inspector-cli"
# The package's bin (``mcp-inspector-cli``); ``--cli`` makes it run build/index.js.
INSPECTOR_CLI = INSPECTOR_DIR / "build" / "cli.js"
EVERYTHING_ENTRY = Path(_SCOPE, "server-everything", "dist", "index.js")
MEMORY_ENTRY = Path(_SCOPE, "server-memory", "dist", "index.js")
MIN_NODE_MAJOR = 20

# server-memory keeps its graph in this file; unset, it writes ``memory.jsonl`` next to its
# own dist/index.js (inside node_modules, read-only in a sandbox). Always set it.
MEMORY_FILE_ENV = "MEMORY_FILE_PATH"

# Inside a sandbox: Debian's node from the host's read-only /usr, the packages bound here.
SANDBOX_NODE = "/usr/bin/node"
SANDBOX_NODE_MODULES = "/opt/node-server/node_modules"

INIT_PROTOCOL_VERSION = "2025-06-18"


class NodeToolError(RuntimeError):
    """A node tool exited unsuccessfully or printed something that is not JSON."""

    def __init__(self, message: str, *, returncode: int, stdout: str, stderr: str) -> None:
        super().__init__(f"{message} (exit {returncode}); stderr: {stderr.strip()[-2000:]}")
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


def node_executable() -> str | None:
    """The ``node`` on PATH, or None."""
    return shutil.which("node")


@functools.cache
def _node_major(node: str) -> int:
    out = subprocess.run(
        [node, "-p", "process.versions.node"], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split(".")[0])


def node_available() -> bool:
    """True when node >= 20 is on PATH and ``scripts/node-deps`` has installed the packages."""
    node = node_executable()
    if node is None:
        return False
    try:
        major = _node_major(node)
    except (OSError, subprocess.CalledProcessError, ValueError):
        return False
    return major >= MIN_NODE_MAJOR and all(
        p.is_file()
        for p in (INSPECTOR_CLI, NODE_MODULES / EVERYTHING_ENTRY, NODE_MODULES / MEMORY_ENTRY)
    )


NODE_MISSING_REASON = "node >= 20 or tests/node/node_modules missing: run scripts/node-deps"


def _node() -> str:
    node = node_executable()
    if node is None:
        raise FileNotFoundError("node is not on PATH")
    return node


def _parse_json(proc: subprocess.CompletedProcess[str], what: str) -> Any:
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise NodeToolError(
            f"{what} printed no JSON: {proc.stdout[:500]!r}",
            returncode=proc.returncode,
            stdout=proc.stdout,
            stderr=proc.stderr,
        ) from None


def run_ts_client(
    url: str, token: str | None, *args: str, timeout: float = 60, check: bool = True
) -> dict[str, Any]:
    """Run ``ts_client.mjs --url URL --token TOKEN *args``; return its JSON object.

    ``token=None`` sends no Authorization header. With ``check`` (the default) a failure
    raises :class:`NodeToolError`; without it the ``{"error": ...}`` object is returned.
    """
    argv = [_node(), str(TS_CLIENT), "--url", url]
    if token is not None:
        argv += ["--token", token]
    argv += list(args)
    proc = subprocess.run(
        argv, cwd=NODE_DIR, capture_output=True, text=True, timeout=timeout, check=False
    )
    result: dict[str, Any] = _parse_json(proc, "ts_client.mjs")
    if check and (proc.returncode != 0 or "error" in result):
        raise NodeToolError(
            f"ts_client.mjs failed: {result.get('error')} (code {result.get('code')})",
            returncode=proc.returncode,
            stdout=proc.stdout,
            stderr=proc.stderr,
        )
    return result


def inspector_argv(url: str, token: str | None, *args: str) -> list[str]:
    """The inspector-cli invocation :func:`run_inspector` uses (``--method`` defaults to
    ``tools/list``)."""
    argv = [_node(), str(INSPECTOR_CLI), "--cli", url, "--transport", "http"]
    if token is not None:
        argv += ["--header", f"Authorization: Bearer {token}"]
    argv += list(args)
    if "--method" not in args:
        argv += ["--method", "tools/list"]
    return argv


def run_inspector(url: str, token: str | None, *args: str, timeout: float = 60) -> dict[str, Any]:
    """Run inspector-cli against ``url``; return the JSON result it prints.

    E.g. ``run_inspector(url, tok, "--method", "tools/call", "--tool-name", "add",
    "--tool-arg", "a=1", "b=2")``. Raises :class:`NodeToolError` when it exits non-zero
    (its error message is on stderr).

    inspector-cli 1.0.3 reads its own package.json with ``fs.existsSync("../package.json")``
    (relative to the *working directory*) and then ``import()``s the same string (relative
    to the module): only a working directory one level below the package resolves both to
    its package.json, so it runs in ``build/``.
    """
    argv = inspector_argv(url, token, *args)
    env = dict(os.environ)
    # cli.js re-spawns "node" by name.
    env["PATH"] = f"{Path(argv[0]).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(
        argv,
        cwd=INSPECTOR_CLI.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise NodeToolError(
            "inspector-cli failed",
            returncode=proc.returncode,
            stdout=proc.stdout,
            stderr=proc.stderr,
        )
    result: dict[str, Any] = _parse_json(proc, "inspector-cli")
    return result


def everything_command(
    node_modules: str | Path = NODE_MODULES, node: str | None = None
) -> list[str]:
    """argv running server-everything over stdio from ``node_modules`` with ``node``
    (default: the host's; pass :data:`SANDBOX_NODE_MODULES`/:data:`SANDBOX_NODE` for a
    sandbox)."""
    return [node or _node(), str(Path(node_modules) / EVERYTHING_ENTRY), "stdio"]


def memory_command(node_modules: str | Path = NODE_MODULES, node: str | None = None) -> list[str]:
    """argv running server-memory over stdio; set :data:`MEMORY_FILE_ENV` in its
    environment to a writable file."""
    return [node or _node(), str(Path(node_modules) / MEMORY_ENTRY)]


def readable_by(tree: Path, uid: int = DEFAULT_UID) -> bool:
    """Whether host ``uid`` can reach ``tree`` (a node_modules) and read the server entries."""
    try:
        check_traversable(tree, uid)
    except HostCheckError:
        return False
    entry = tree / EVERYTHING_ENTRY
    return entry.is_file() and bool(entry.stat().st_mode & stat.S_IROTH)


def copy_node_modules_public() -> Path:
    """A fresh copy of :data:`NODE_MODULES` in a public /tmp directory, readable by anyone
    (~0.5 s for the ~44 MB tree). The caller removes ``result.parent``."""
    directory = public_tmpdir("node-modules")
    target = directory / "node_modules"
    # cp and chmod: ~10x faster than shutil.copytree plus an os.walk over ~6000 files.
    subprocess.run(["cp", "-a", "--", str(NODE_MODULES), str(target)], check=True)
    subprocess.run(["chmod", "-R", "a+rX", "--", str(target)], check=True)
    return target


@functools.cache
def sandbox_node_modules_source(uid: int = DEFAULT_UID) -> Path:
    """A node_modules tree the sandbox host ``uid`` can read, to bind into a sandbox.

    bwrap resolves bind sources as that unprivileged uid, so every directory above the
    source must be searchable by it. The checkout's own tree is used when it is (as on this
    machine kind: /work is 0755); otherwise (a checkout under a 0700 home) the tree is
    copied once per test process to a public /tmp directory, removed at exit.
    """
    if readable_by(NODE_MODULES, uid):
        return NODE_MODULES
    target = copy_node_modules_public()
    atexit.register(shutil.rmtree, target.parent, True)
    return target


NODE_SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/home/sandbox",
    "LANG": "C.UTF-8",
}


def node_server_spec(
    command: Sequence[str],
    *,
    label: str,
    source: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> SandboxSpec:
    """A host-mode sandbox running ``command`` (built with ``node=SANDBOX_NODE,
    node_modules=SANDBOX_NODE_MODULES``) with ``source`` bound read-only at
    :data:`SANDBOX_NODE_MODULES`."""
    tree = source if source is not None else sandbox_node_modules_source()
    return SandboxSpec(
        command=tuple(command),
        label=label,
        env={**NODE_SANDBOX_ENV, **(env or {})},
        binds=(Bind(str(tree), SANDBOX_NODE_MODULES),),
    )


class StdioJsonRpc:
    """Newline-delimited JSON-RPC (MCP's stdio transport) over two trio streams.

    Requests wait for the response with their id; notifications and server-to-client
    requests that arrive meanwhile are kept in :attr:`other`.
    """

    def __init__(self, send: trio.abc.SendStream, receive: trio.abc.ReceiveStream) -> None:
        self._send = send
        self._receive = receive
        self._buffer = b""
        self._next_id = 0
        self.other: list[dict[str, Any]] = []

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self._send.send_all(json.dumps(message).encode() + b"\n")

    async def _read_message(self) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            chunk = await self._receive.receive_some(65536)
            if not chunk:
                raise EOFError("the server closed its stdout")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        message: dict[str, Any] = json.loads(line)
        return message

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a request; return the whole response message (``result`` or ``error``)."""
        self._next_id += 1
        request_id = self._next_id
        await self._send.send_all(
            json.dumps(
                {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}
            ).encode()
            + b"\n"
        )
        while True:
            message = await self._read_message()
            if "method" not in message and message.get("id") == request_id:
                return message
            self.other.append(message)

    async def initialize(self, protocol_version: str = INIT_PROTOCOL_VERSION) -> dict[str, Any]:
        """The handshake; returns the ``initialize`` result."""
        reply = await self.request(
            "initialize",
            {
                "protocolVersion": protocol_version,
                "capabilities": {},
                "clientInfo": {"name": "svcgate-tests", "version": "1"},
            },
        )
        await self.notify("notifications/initialized")
        result: dict[str, Any] = reply["result"]
        return result

    async def tool_names(self) -> list[str]:
        reply = await self.request("tools/list")
        return [tool["name"] for tool in reply["result"]["tools"]]


async def ts_client(url: str, token: str | None, *args: str, check: bool = True) -> dict[str, Any]:
    """:func:`run_ts_client` from a trio test, in a worker thread."""
    return await trio.to_thread.run_sync(
        functools.partial(run_ts_client, url, token, *args, check=check)
    )


async def inspector(url: str, token: str | None, *args: str) -> dict[str, Any]:
    """:func:`run_inspector` from a trio test, in a worker thread."""
    return await trio.to_thread.run_sync(functools.partial(run_inspector, url, token, *args))
