"""``SVC_SERVERS_FILE`` parsing, the sandbox spec it yields, and the data-plane settings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sandbox import Bind
from svcgate.local_servers import LocalServersError, parse_local_servers
from svcgate.server_defs import local_server_spec
from svcgate.settings import SettingsError, settings_from_env
from svcgate.supervisor import SandboxKey, SandboxOwner

GOOD: dict[str, Any] = {
    "servers": {
        "memory": {
            "command": ["/usr/bin/node", "/opt/server/memory/index.js"],
            "binds": [{"source": "/srv/mcp", "dest": "/opt/server/memory"}],
            "env": {"MEMORY_FILE_PATH": "/home/sandbox/m.jsonl"},
            "tools": [
                {"name": "read_graph", "default": True},
                {"name": "delete_entities", "default": False},
            ],
        },
        "plain": {"command": ["/usr/bin/python3", "-V"]},
    }
}


def test_a_good_file_parses_into_runnable_definitions() -> None:
    servers = parse_local_servers(json.dumps(GOOD).encode())
    memory, plain = servers["memory"], servers["plain"]
    assert memory.default_tools == frozenset({"read_graph"})
    assert plain.default_tools is None  # no manifest: every tool is exposed
    spec = local_server_spec(memory, SandboxKey(7, "memory"), SandboxOwner("team", 3))
    assert spec.command == ("/usr/bin/node", "/opt/server/memory/index.js")
    assert spec.binds == (Bind("/srv/mcp", "/opt/server/memory"),)
    assert spec.env["MEMORY_FILE_PATH"] == "/home/sandbox/m.jsonl"
    assert spec.env["PATH"].startswith("/usr/local/bin")
    assert spec.label == "team/memory"


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda d: d["servers"].update({"bad_name": {"command": ["/x"]}}), "servers.bad_name"),
        (lambda d: d["servers"]["plain"].update({"command": []}), "command"),
        (lambda d: d["servers"]["plain"].update({"command": ["relative"]}), "command[0]"),
        (lambda d: d["servers"]["plain"].update({"extra": 1}), "unknown field"),
        (
            lambda d: d["servers"]["plain"].update(
                {"binds": [{"source": "/srv", "dest": "/etc/x"}]}
            ),
            "under /opt/",
        ),
        (
            lambda d: d["servers"]["plain"].update(
                {"binds": [{"source": "/srv/../etc", "dest": "/opt/x"}]}
            ),
            "normalised",
        ),
        (lambda d: d["servers"]["plain"].update({"env": {"HTTPS_PROXY": "x"}}), "gateway"),
        (lambda d: d["servers"]["plain"].update({"env": {"A B": "x"}}), "bad entry"),
        (lambda d: d["servers"]["plain"].update({"tools": [{"name": "x"}]}), "tools[0]"),
        (lambda d: d.update({"other": 1}), "must be an object"),
    ],
)
def test_malformed_files_are_refused_naming_the_place(mutate: Any, where: str) -> None:
    document = json.loads(json.dumps(GOOD))
    mutate(document)
    with pytest.raises(LocalServersError, match=where.replace("[", r"\[").replace("]", r"\]")):
        parse_local_servers(json.dumps(document).encode())


@pytest.mark.parametrize("data", [b"", b"{", b"[]", b'{"servers": []}', b"[" * 100_000])
def test_non_json_or_wrong_shapes_are_refused(data: bytes) -> None:
    with pytest.raises(LocalServersError):
        parse_local_servers(data)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"SVC_BEARER_TOKEN": "t", "SVC_DATA_DIR": str(tmp_path / "d"), **extra}


def test_settings_read_the_servers_file_and_report_problems(tmp_path: Path) -> None:
    good = tmp_path / "servers.json"
    good.write_text(json.dumps(GOOD))
    settings = settings_from_env(_env(tmp_path, SVC_SERVERS_FILE=str(good)))
    assert sorted(settings.local_servers) == ["memory", "plain"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"servers": {"x_y": {"command": ["/bin/true"]}}}')
    with pytest.raises(SettingsError, match=r"^SVC_SERVERS_FILE: servers\.x_y"):
        settings_from_env(_env(tmp_path, SVC_SERVERS_FILE=str(bad)))
    with pytest.raises(SettingsError, match=r"^SVC_SERVERS_FILE: cannot read"):
        settings_from_env(_env(tmp_path, SVC_SERVERS_FILE=str(tmp_path / "missing.json")))


def test_allowed_origins_are_origins(tmp_path: Path) -> None:
    settings = settings_from_env(
        _env(
            tmp_path,
            SVC_PUBLIC_URL="https://gw.example",
            SVC_MCP_ALLOWED_ORIGINS="https://app.example, http://127.0.0.1:3000",
        )
    )
    assert settings.mcp_origins == (
        "https://gw.example",
        "https://app.example",
        "http://127.0.0.1:3000",
    )
    for bad in ("https://app.example/path", "ftp://x", "not a url"):
        with pytest.raises(SettingsError, match=r"^SVC_MCP_ALLOWED_ORIGINS"):
            settings_from_env(_env(tmp_path, SVC_MCP_ALLOWED_ORIGINS=bad))
