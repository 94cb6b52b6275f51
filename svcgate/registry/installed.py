"""Servers installed from the registry: their rows, their run spec, and the in-memory catalogue.

An installed server is a ``servers`` row plus an ``installed_servers`` row holding the release
(version, image reference, the digest of the platform manifest that was unpacked), the signed
manifest exactly as the index gave it, and the run spec decided at install time
(:func:`runtime_spec`): the command, environment and working directory, from the manifest
where it says so and from the image's own config otherwise. Nothing of the image config
beyond those three fields is used (no volumes, users, ports, labels: THREATS F7).

:class:`InstalledCatalogue` is the daemon's copy of these rows, loaded at start and replaced
by the installer after each committed install or uninstall; the profile runtimes and the
egress proxy resolve server names through it (:mod:`svcgate.server_defs`).
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox import ResourceLimits, SandboxSpec
from sandbox.images import ImageStore
from svcgate.legacy_spec import SANDBOX_ENV
from svcgate.registry.index import RESERVED_ENV, Manifest, parse_manifest
from svcgate.supervisor import SandboxKey, SandboxOwner

MIB = 1024 * 1024
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# What every image sandbox gets unless the image or manifest says otherwise.
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


class RunSpecError(ValueError):
    """The image and manifest do not say how to run the server."""


@dataclass(frozen=True)
class RunSpec:
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    workdir: str | None

    def to_json(self) -> str:
        return json.dumps(
            {"command": list(self.command), "env": dict(self.env), "workdir": self.workdir},
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        data = json.loads(text)
        return cls(tuple(data["command"]), tuple(sorted(data["env"].items())), data["workdir"])


def _strings(value: Any) -> list[str]:
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    return []


def runtime_spec(image_config: Mapping[str, Any], manifest: Manifest) -> RunSpec:
    """How to run the server: the manifest's fields, else the image config's (pure)."""
    config = image_config.get("config")
    config = config if isinstance(config, dict) else {}
    if manifest.command is not None:
        command = list(manifest.command)
    else:
        command = _strings(config.get("Entrypoint")) + _strings(config.get("Cmd"))
    if not command:
        raise RunSpecError("neither the manifest nor the image names a command")
    if not command[0].startswith("/"):
        raise RunSpecError(
            f"the command {command[0][:64]!r} is not an absolute path; set manifest.command"
        )
    if any("\x00" in arg for arg in command):
        raise RunSpecError("the command contains a NUL byte")
    env: dict[str, str] = dict(BASE_ENV)
    for item in _strings(config.get("Env")):
        key, sep, value = item.partition("=")
        if sep and _ENV_NAME.match(key) and key not in RESERVED_ENV and "\x00" not in value:
            env[key] = value
    env.update(dict(manifest.env))
    workdir = manifest.workdir
    if workdir is None:
        configured = config.get("WorkingDir")
        if isinstance(configured, str) and configured.startswith("/") and ".." not in configured:
            workdir = configured.rstrip("/") or "/"
    return RunSpec(tuple(command), tuple(sorted(env.items())), workdir)


@dataclass(frozen=True)
class InstalledServer:
    id: int
    name: str
    version: str
    image: str
    image_digest: str
    manifest: Manifest
    run: RunSpec
    index_version: int
    installed_at: str
    updated_at: str

    def to_api(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "version": self.version,
            "image": self.image,
            "image_digest": self.image_digest,
        }


_SELECT = (
    "SELECT s.id, s.name, i.version, i.image, i.image_digest, i.manifest, i.runtime,"
    " i.index_version, i.installed_at, i.updated_at"
    " FROM installed_servers i JOIN servers s ON s.id = i.server_id"
)


def _row(row: sqlite3.Row) -> InstalledServer:
    return InstalledServer(
        id=row["id"],
        name=row["name"],
        version=row["version"],
        image=row["image"],
        image_digest=row["image_digest"],
        manifest=parse_manifest(json.loads(row["manifest"])),
        run=RunSpec.from_json(row["runtime"]),
        index_version=row["index_version"],
        installed_at=row["installed_at"],
        updated_at=row["updated_at"],
    )


def load_installed(conn: sqlite3.Connection) -> dict[str, InstalledServer]:
    return {row["name"]: _row(row) for row in conn.execute(_SELECT + " ORDER BY s.name")}


def read_installed(conn: sqlite3.Connection, name: str) -> InstalledServer | None:
    row = conn.execute(_SELECT + " WHERE s.name = ?", (name,)).fetchone()
    return _row(row) if row is not None else None


def referenced_digests(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT DISTINCT image_digest FROM installed_servers")}


class InstalledCatalogue:
    """The daemon's view of installed servers (replaced wholesale, never mutated in place)."""

    def __init__(self, images: ImageStore) -> None:
        self.images = images
        self.servers: Mapping[str, InstalledServer] = {}

    def replace(self, servers: Mapping[str, InstalledServer]) -> None:
        self.servers = dict(servers)

    def get(self, name: str) -> InstalledServer | None:
        return self.servers.get(name)

    def rootfs(self, server: InstalledServer) -> Path:
        return self.images.path(server.image_digest)


def installed_server_spec(
    server: InstalledServer, rootfs: Path, key: SandboxKey, owner: SandboxOwner
) -> SandboxSpec:
    """The sandbox of a registry server: the image as its read-only root, the run spec."""
    limits = server.manifest.limits.effective()
    env = {**SANDBOX_ENV, **dict(server.run.env)}
    return SandboxSpec(
        command=server.run.command,
        label=f"{owner.profile_slug}/{key.server}",
        rootfs=str(rootfs),
        env=env,
        cwd=server.run.workdir,
        limits=ResourceLimits(
            memory_bytes=int(limits["memory_mb"]) * MIB,
            pids=int(limits["pids"]),
            cpus=float(limits["cpus"]),
        ),
    )
