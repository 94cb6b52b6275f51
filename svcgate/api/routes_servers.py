"""Servers: ``GET /api/servers``, ``POST /api/servers/install``, ``DELETE /api/servers/{name}``.

Install and uninstall are admin-only (checked first) and answer 501 ``not_configured`` while
no registry installer is configured. The work is :mod:`svcgate.registry.installer`'s: a ref
that is not ``name`` or ``name@version`` is 400 ``invalid``; any other failure is 502
``install_failed`` (or ``uninstall_failed``) with the installer's message. An upgrade that
widens permissions is refused with the list of changes until the body says
``"approve_permissions": true``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from quart import Blueprint, Response

from svcgate import servers
from svcgate.api.context import access, caller, json_body, services
from svcgate.api.openapi import array_of, documented, ref
from svcgate.errors import InstallFailed, Invalid, NotImplementedYet, UninstallFailed
from svcgate.registry.index import RefError
from svcgate.registry.installer import Installer, InstallError, UninstallError


class InstallRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    ref: str
    # Confirms an upgrade that widens the server's permissions (docs/registry.md).
    approve_permissions: bool = False


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
    response=ref("InstalledServer"),
    request=InstallRequest,
    errors=(501, 502),
)
async def install() -> tuple[dict[str, Any], int]:
    installer = _installer()
    body = await json_body(InstallRequest)
    try:
        server = await installer.install(
            body.ref, actor=caller().real_user.id, approve=body.approve_permissions
        )
    except RefError as exc:
        raise Invalid(str(exc)) from None
    except InstallError as exc:
        raise InstallFailed(str(exc)) from None
    return server, 201


@bp.delete("/<name>")
@access("admin")
@documented("Uninstall a server (idempotent)", status=204, errors=(501, 502))
async def uninstall(name: str) -> Response:
    installer = _installer()
    if not servers.SERVER_NAME.match(name):
        # No such server can exist: nothing to remove (idempotent).
        return Response(b"", status=204)
    try:
        await installer.uninstall(name, actor=caller().real_user.id)
    except UninstallError as exc:
        raise UninstallFailed(str(exc)) from None
    return Response(b"", status=204)


def _installer() -> Installer:
    installer = services().installer
    if installer is None:
        raise NotImplementedYet(NO_INSTALLER)
    return installer
