"""Servers: ``GET /api/servers``, ``POST /api/servers/install``, ``DELETE /api/servers/{name}``.

Install and uninstall are admin-only (checked first) and answer 501 ``not_configured`` while
no registry installer is configured.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint

from svcgate import servers
from svcgate.api.context import access, services
from svcgate.errors import NotImplementedYet

bp = Blueprint("servers", __name__, url_prefix="/api/servers")

NO_INSTALLER = (
    "no registry installer is configured: set the registry index and its trusted key to "
    "install and uninstall servers"
)


@bp.get("")
@access("session")
async def list_servers() -> list[dict[str, Any]]:
    return await services().store.read(servers.list_servers)


@bp.post("/install")
@access("admin")
async def install() -> dict[str, Any]:
    raise NotImplementedYet(NO_INSTALLER)


@bp.delete("/<name>")
@access("admin")
async def uninstall(name: str) -> dict[str, Any]:
    raise NotImplementedYet(NO_INSTALLER)
