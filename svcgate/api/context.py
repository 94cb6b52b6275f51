"""What a control-plane request can reach: the services, its caller, and its parsed body."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError
from quart import current_app, g, request

from svcgate.accounts import SessionInfo
from svcgate.errors import Invalid, Unauthenticated
from svcgate.oidc import FlowRegistry, OidcClient
from svcgate.registry.installer import Installer
from svcgate.runtime_hooks import RuntimeInvalidator
from svcgate.settings import Settings
from svcgate.store import Store
from svcgate.strict_json import StrictJSONError, loads_strict
from svcgate.vault import Vault

Access = Literal["public", "session", "admin"]
M = TypeVar("M", bound=BaseModel)
F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Services:
    """Everything a route may use, built by the daemon and handed to the app factory."""

    settings: Settings
    store: Store
    oidc: OidcClient
    flow_key: bytes
    flows: FlowRegistry
    runtimes: RuntimeInvalidator
    vault: Vault
    # The registry installer (None: install and uninstall answer 501).
    installer: Installer | None = None


def services() -> Services:
    found: Services = current_app.extensions["svcgate"]
    return found


def access(level: Access) -> Callable[[F], F]:
    """Declare who may call a view: anyone, any signed-in user, or admins (real user)."""

    def mark(view: F) -> F:
        view.svcgate_access = level  # type: ignore[attr-defined]  # read by the before-request hook
        return view

    return mark


def caller() -> SessionInfo:
    session: SessionInfo | None = g.get("svcgate_session")
    if session is None:
        raise Unauthenticated("sign in first")
    return session


def _describe(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "body"
    if first["type"] == "extra_forbidden":
        return f"unknown field {where!r}"
    if first["type"] == "missing":
        return f"missing field {where!r}"
    return f"{where}: {first['msg']}"


async def json_body(model: type[M]) -> M:
    """Parse the body strictly into ``model`` (unknown fields and wrong types are 400)."""
    raw = await request.get_data(as_text=False)
    if isinstance(raw, str):  # quart types both forms; bytes is what as_text=False gives
        raw = raw.encode()
    if not raw:
        raise Invalid("a JSON object body is required")
    try:
        value = loads_strict(raw)
    except StrictJSONError as exc:
        raise Invalid(str(exc)) from exc
    if not isinstance(value, dict):
        raise Invalid("the body must be a JSON object")
    try:
        return model.model_validate(value, strict=True)
    except ValidationError as exc:
        raise Invalid(_describe(exc)) from exc
