"""Servers defined by the operator in a local file (``SVC_SERVERS_FILE``), and how to run them.

Besides the legacy ``echo`` fallback (``SVC_ECHO_BIN``) and, later, servers installed from
the signed registry, an operator can run MCP servers that already exist on the host (an npm
package, a script): a JSON file lists them, and the daemon records each name in the server
catalogue at every start, like the legacy row. The file is read once, with the other
settings; a malformed file stops the start-up with one line.

Format::

    {"servers": {
        "memory": {
            "command": ["/usr/bin/node", "/opt/server/memory/dist/index.js"],
            "binds": [{"source": "/srv/mcp/server-memory", "dest": "/opt/server/memory"}],
            "env": {"MEMORY_FILE_PATH": "/home/sandbox/memory.json"},
            "tools": [{"name": "read_graph", "default": true},
                      {"name": "delete_entities", "default": false}]
        }}}

* ``command``: the argv run inside the sandbox (absolute path; the sandbox sees the host's
  ``/usr`` read-only, and the ``binds``). Required.
* ``binds``: host paths bound read-only into the sandbox, ``dest`` under ``/opt/``.
* ``env``: extra environment (never a secret: credentials go through the egress proxy).
* ``tools``: optional manifest. When present, only tools marked ``default: true`` are
  exposed; without it every tool of the server is exposed (SPEC).
* ``egress``: host patterns the server may reach through the egress proxy without a
  credential (a manifest's egress list). Default: none.
* ``credential_hosts``: host patterns that receive the profile owner's credential for this
  server; without a stored credential they are refused (``no_credential``).
* ``credential_env``: the environment variable that receives the credential's
  ``placeholder`` (the proxy swaps it for the secret on the way out).

Pure and standard-library only (the settings module, which the operator CLI imports, loads
it): :func:`parse_local_servers` takes the file's bytes;
:func:`svcgate.server_defs.local_server_spec` builds the sandbox spec.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Any

from svcgate.host_patterns import HostPatternError, normalize_pattern
from svcgate.servers import SERVER_NAME

_ENV_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
# Set by the gateway in every sandbox (the egress proxy and its CA bundle).
_RESERVED_ENV = frozenset(
    {
        "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy",
        "ALL_PROXY", "all_proxy", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS", "NODE_USE_ENV_PROXY",
    }
)  # fmt: skip


class LocalServersError(ValueError):
    """The servers file is malformed; ``str()`` says where."""


@dataclass(frozen=True)
class LocalServer:
    name: str
    command: tuple[str, ...]
    # (host source, sandbox destination), bound read-only.
    binds: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    # None: no manifest, every tool is exposed. Otherwise the tools marked default: true.
    default_tools: frozenset[str] | None = None
    # Hosts the server may reach without a credential (host patterns).
    egress: tuple[str, ...] = ()
    # Hosts that take the owner's credential for this server (no credential: refused).
    credential_hosts: tuple[str, ...] = ()
    # The variable that receives the credential's placeholder (never the secret).
    credential_env: str | None = None


def _fail(where: str, problem: str) -> LocalServersError:
    return LocalServersError(f"{where}: {problem}")


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(where, "must be a list of non-empty strings")
    return value


def _absolute(path: str, where: str) -> str:
    if not path.startswith("/") or posixpath.normpath(path) != path.rstrip("/") or "\x00" in path:
        raise _fail(where, f"{path!r} must be a normalised absolute path")
    return path


def _parse_server(name: str, body: Any) -> LocalServer:
    where = f"servers.{name}"
    if not SERVER_NAME.match(name):
        raise _fail(where, "server names match ^[a-z0-9][a-z0-9-]{0,63}$ (no '_')")
    if not isinstance(body, dict):
        raise _fail(where, "must be an object")
    unknown = set(body) - {
        "command",
        "binds",
        "env",
        "tools",
        "egress",
        "credential_hosts",
        "credential_env",
    }
    if unknown:
        raise _fail(where, f"unknown field(s) {sorted(unknown)}")
    command = _strings(body.get("command"), f"{where}.command")
    if not command:
        raise _fail(f"{where}.command", "must not be empty")
    _absolute(command[0], f"{where}.command[0]")
    binds: list[tuple[str, str]] = []
    for i, item in enumerate(body.get("binds", [])):
        at = f"{where}.binds[{i}]"
        if not isinstance(item, dict) or set(item) != {"source", "dest"}:
            raise _fail(at, 'must be {"source": ..., "dest": ...}')
        source = _absolute(str(item["source"]), f"{at}.source")
        dest = _absolute(str(item["dest"]), f"{at}.dest")
        if not dest.startswith("/opt/"):
            raise _fail(f"{at}.dest", "must be under /opt/")
        binds.append((source, dest))
    env = body.get("env", {})
    if not isinstance(env, dict):
        raise _fail(f"{where}.env", "must be an object of strings")
    for key, value in env.items():
        if not key or set(key) - _ENV_NAME_CHARS or not isinstance(value, str):
            raise _fail(f"{where}.env", f"bad entry {key!r}")
        if key in _RESERVED_ENV:
            raise _fail(f"{where}.env", f"{key} is set by the gateway")
    default_tools: frozenset[str] | None = None
    if "tools" in body:
        tools = body["tools"]
        if not isinstance(tools, list):
            raise _fail(f"{where}.tools", "must be a list")
        chosen: set[str] = set()
        for i, tool in enumerate(tools):
            at = f"{where}.tools[{i}]"
            if (
                not isinstance(tool, dict)
                or set(tool) != {"name", "default"}
                or not isinstance(tool["name"], str)
                or not isinstance(tool["default"], bool)
            ):
                raise _fail(at, 'must be {"name": string, "default": boolean}')
            if tool["default"]:
                chosen.add(tool["name"])
        default_tools = frozenset(chosen)
    egress = _patterns(body.get("egress", []), f"{where}.egress")
    credential_hosts = _patterns(body.get("credential_hosts", []), f"{where}.credential_hosts")
    credential_env = body.get("credential_env")
    if credential_env is not None:
        if (
            not isinstance(credential_env, str)
            or not credential_env
            or set(credential_env) - _ENV_NAME_CHARS
            or credential_env[0].isdigit()
        ):
            raise _fail(f"{where}.credential_env", "must be an environment variable name")
        if credential_env in _RESERVED_ENV or credential_env in env:
            raise _fail(f"{where}.credential_env", f"{credential_env} is already set")
    return LocalServer(
        name=name,
        command=tuple(command),
        binds=tuple(binds),
        env=tuple(sorted(env.items())),
        default_tools=default_tools,
        egress=egress,
        credential_hosts=credential_hosts,
        credential_env=credential_env,
    )


def _patterns(value: Any, where: str) -> tuple[str, ...]:
    """Host patterns (svcgate.host_patterns rules); a bad one refuses the file."""
    out: list[str] = []
    for item in _strings(value, where):
        try:
            out.append(normalize_pattern(item))
        except HostPatternError as exc:
            raise _fail(where, str(exc)) from None
    return tuple(out)


def parse_local_servers(data: bytes) -> dict[str, LocalServer]:
    """Parse the servers file. Raises :class:`LocalServersError`."""
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise LocalServersError(f"not valid JSON ({exc})") from None
    if not isinstance(document, dict) or set(document) != {"servers"}:
        raise LocalServersError('must be an object {"servers": {...}}')
    servers = document["servers"]
    if not isinstance(servers, dict):
        raise _fail("servers", "must be an object keyed by server name")
    return {name: _parse_server(name, body) for name, body in servers.items()}
