"""Profiles: ``/api/profiles`` and ``/api/profiles/{id}[/servers|/token]``.

Success codes: create 201, list/get/rename/servers/token 200, delete 204. Another user's
profile is a 404 identical to a missing one; admins reach every profile.
"""

from __future__ import annotations

import sqlite3
from typing import Annotated, Any

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint, Response

from svcgate import profiles
from svcgate.api.context import access, caller, json_body, services
from svcgate.api.openapi import array_of, documented, ref
from svcgate.errors import NotFound

bp = Blueprint("profiles", __name__, url_prefix="/api/profiles")

MAX_ID = 2**63 - 1


Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]*$")]
Slug = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{1,62}$")]


class CreateProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: Name
    slug: Slug


class RenameProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: Name


class SetServers(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    servers: list[str]


def _owner() -> int | None:
    return profiles.visible_owner(caller())


def _checked_id(profile_id: int) -> int:
    if profile_id > MAX_ID:
        raise NotFound("no such profile")
    return profile_id


@bp.get("")
@access("session")
@documented("Profiles: own, or all for admins", response=array_of("Profile"))
async def list_profiles() -> Response:
    owner = _owner()

    def listing(conn: sqlite3.Connection) -> bytes:
        # Read and serialised in the worker thread, by pydantic-core's encoder (several times
        # faster than json's): a user may own thousands of profiles and the list has no
        # paging, so the event loop only sends the bytes.
        return pydantic_core.to_json(profiles.list_public(conn, owner))

    body = await services().store.read(listing)
    return Response(body, content_type="application/json")


@bp.post("")
@access("session")
@documented(
    "Create a profile; the response carries its token once",
    status=201,
    response=ref("Profile"),
    request=CreateProfile,
    errors=(409,),
)
async def create_profile() -> tuple[dict[str, Any], int]:
    body = await json_body(CreateProfile)
    profiles.check_name(body.name)
    profiles.check_slug(body.slug)
    owner = caller().user.id
    profile, token = await services().store.write(
        lambda conn: profiles.create_profile(conn, owner, body.name, body.slug)
    )
    return profile.public(token), 201


@bp.get("/<int:profile_id>")
@access("session")
@documented(
    "One profile, with its runtime state (cold or warm, per-server status)",
    response=ref("Profile"),
    errors=(404,),
)
async def get_profile(profile_id: int) -> dict[str, Any]:
    owner, pid = _owner(), _checked_id(profile_id)
    profile = await services().store.read(lambda conn: profiles.get_profile(conn, pid, owner))
    # Start errors can name host paths: only admins (the real user) see them.
    detail = caller().real_user.role == "admin"
    return {**profile.public(), "runtime": services().runtimes.status(pid, detail=detail)}


@bp.patch("/<int:profile_id>")
@access("session")
@documented("Rename a profile", response=ref("Profile"), request=RenameProfile, errors=(404,))
async def rename_profile(profile_id: int) -> dict[str, Any]:
    owner, pid, actor = _owner(), _checked_id(profile_id), caller().real_user.id
    body = await json_body(RenameProfile)
    profiles.check_name(body.name)

    def rename(conn: sqlite3.Connection) -> profiles.Profile:
        return profiles.rename_profile(
            conn, profiles.get_profile(conn, pid, owner), body.name, actor
        )

    return (await services().store.write(rename)).public()


@bp.delete("/<int:profile_id>")
@access("session")
@documented("Delete a profile and tear down its runtime", status=204, errors=(404,))
async def delete_profile(profile_id: int) -> Response:
    owner, pid, actor = _owner(), _checked_id(profile_id), caller().real_user.id

    def delete(conn: sqlite3.Connection) -> None:
        profiles.delete_profile(conn, profiles.get_profile(conn, pid, owner), actor)

    await services().store.write(delete)
    await services().runtimes.invalidate([pid], reason="profile deleted", restart=False)
    return Response(b"", status=204)


@bp.put("/<int:profile_id>/servers")
@access("session")
@documented(
    "Replace the bundle (installed server names)",
    response=ref("Profile"),
    request=SetServers,
    errors=(404,),
)
async def set_servers(profile_id: int) -> dict[str, Any]:
    owner, pid, actor = _owner(), _checked_id(profile_id), caller().real_user.id
    body = await json_body(SetServers)

    def replace(conn: sqlite3.Connection) -> profiles.Profile:
        profile = profiles.get_profile(conn, pid, owner)
        return profiles.set_servers(conn, profile, body.servers, actor)

    updated = await services().store.write(replace)
    await services().runtimes.invalidate([pid], reason="bundle edited")
    return updated.public()


@bp.post("/<int:profile_id>/token")
@access("session")
@documented(
    "Rotate the token; the response carries it once", response=ref("Profile"), errors=(404,)
)
async def rotate_token(profile_id: int) -> dict[str, Any]:
    owner, pid, actor = _owner(), _checked_id(profile_id), caller().real_user.id

    def rotate(conn: sqlite3.Connection) -> tuple[profiles.Profile, str]:
        profile = profiles.get_profile(conn, pid, owner)
        return profile, profiles.rotate_token(conn, profile, actor)

    profile, token = await services().store.write(rotate)
    return profile.public(token)
