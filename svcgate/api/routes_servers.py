"""Servers: ``GET /api/servers``, ``POST /api/servers/install``, ``DELETE /api/servers/{name}``.

Install and uninstall are admin-only (checked first) and answer 501 ``not_configured`` while
no registry installer is configured.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from quart import Blueprint

from svcgate import servers
from svcgate.api.context import access, json_body, services
from svcgate.api.openapi import array_of, documented, ref
from svcgate.errors import NotImplementedYet


class InstallRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    ref: str


bp = Blueprint("servers", __name__, url_prefix="/api/servers")

NO_INSTALLER = (
    "no registry installer is configured: set the registry index and its trusted key to "
    "install and uninstall servers"
)


@bp.get("")
@access("session")
@documented("Installed servers", response=array_of("Server"))
async def list_servers() -> list[dict[str, Any]]:
    return await services().store.read(servers.list_servers)


@bp.post("/install")
@access("admin")
@documented(
    "Install a server from the registry (ref name@version or name)",
    status=201,
    response=ref("Server"),
    request=InstallRequest,
    errors=(501, 502),
)
async def install() -> dict[str, Any]:
    await json_body(InstallRequest)
    raise NotImplementedYet(NO_INSTALLER)


@bp.delete("/<name>")
@access("admin")
@documented("Uninstall a server", status=204, errors=(501, 502))
async def uninstall(name: str) -> dict[str, Any]:
    raise NotImplementedYet(NO_INSTALLER)
