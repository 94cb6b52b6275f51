"""The OpenAPI 3.1 document of the control plane, built from the live route table.

Each view declares its contract with :func:`documented`; :func:`build_document` walks Quart's
URL map so a route without a declaration cannot be published silently (the test suite fails
on any undocumented route). Request schemas come from the pydantic models the views parse
with, so the document and the validation cannot drift apart.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel
from quart import Quart

from svcgate import __version__

F = TypeVar("F", bound=Callable[..., Any])

ERROR = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
        }
    },
}
USER = {
    "type": "object",
    "required": ["id", "email", "display_name", "role"],
    "properties": {
        "id": {"type": "integer"},
        "email": {"type": "string"},
        "display_name": {"type": "string"},
        "role": {"type": "string", "enum": ["admin", "user"]},
    },
}
PROFILE = {
    "type": "object",
    "required": ["id", "slug", "name", "user_id", "endpoint", "servers"],
    "properties": {
        "id": {"type": "integer"},
        "slug": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{1,62}$"},
        "name": {"type": "string", "minLength": 1, "maxLength": 128},
        "user_id": {"type": "integer"},
        "endpoint": {"type": "string"},
        "servers": {"type": "array", "items": {"type": "string"}},
        "token": {"type": "string", "description": "Only in create and rotate responses."},
        "runtime": {"$ref": "#/components/schemas/Runtime"},
    },
}
RUNTIME = {
    "type": "object",
    "description": "Only in GET /api/profiles/{id}: the profile runtime's state.",
    "required": ["state", "servers"],
    "properties": {
        "state": {"type": "string", "enum": ["cold", "starting", "warm"]},
        "servers": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "state", "tools"],
                "properties": {
                    "name": {"type": "string"},
                    "state": {
                        "type": "string",
                        "enum": ["starting", "ready", "failed", "exited", "skipped"],
                    },
                    "tools": {"type": "integer", "description": "Tools exposed."},
                    "error": {
                        "type": ["string", "null"],
                        "description": "Why it is not ready; admins only.",
                    },
                },
            },
        },
    },
}
SERVER = {
    "type": "object",
    "required": ["id", "name"],
    "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
}
INSTALLED_SERVER = {
    "type": "object",
    "required": ["id", "name", "version", "image", "image_digest"],
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string"},
        "version": {"type": "string"},
        "image": {"type": "string", "description": "registry/repository@sha256:... as indexed"},
        "image_digest": {"type": "string", "description": "the platform manifest unpacked"},
    },
}
CREDENTIAL = {
    "type": "object",
    "required": ["server", "allowed_hosts"],
    "properties": {
        "server": {"type": "string"},
        "inject_header": {"type": ["string", "null"]},
        "inject_format": {"type": ["string", "null"]},
        "placeholder": {"type": ["string", "null"]},
        "allowed_hosts": {"type": "array", "items": {"type": "string"}},
        "created_at": {"type": "string"},
        "updated_at": {"type": "string"},
    },
}
AUDIT_EVENT = {
    "type": "object",
    "required": [
        "id",
        "ts",
        "kind",
        "user_id",
        "profile_id",
        "server",
        "host",
        "decision",
        "detail",
    ],
    "properties": {
        "id": {"type": "integer"},
        "ts": {"type": "string"},
        "kind": {"type": "string", "enum": ["egress", "auth", "admin"]},
        "user_id": {"type": "integer"},
        "profile_id": {"type": "integer"},
        "server": {"type": "string"},
        "host": {"type": "string"},
        "decision": {"type": "string"},
        "detail": {"type": "string"},
    },
}
AUDIT_PAGE = {
    "type": "object",
    "required": ["events", "next_before"],
    "properties": {
        "events": {"type": "array", "items": {"$ref": "#/components/schemas/AuditEvent"}},
        "next_before": {"type": "integer"},
    },
}
ME = {
    "type": "object",
    "required": ["user", "impersonating"],
    "properties": {
        "user": {"$ref": "#/components/schemas/User"},
        "impersonating": {"type": "boolean"},
        "real_user": {"$ref": "#/components/schemas/User"},
        "impersonation_expires_at": {"type": "number"},
    },
}
COMPONENTS = {
    "Error": ERROR,
    "User": USER,
    "Profile": PROFILE,
    "Runtime": RUNTIME,
    "Server": SERVER,
    "InstalledServer": INSTALLED_SERVER,
    "CredentialMetadata": CREDENTIAL,
    "AuditEvent": AUDIT_EVENT,
    "AuditPage": AUDIT_PAGE,
    "Me": ME,
}


def ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def array_of(name: str) -> dict[str, Any]:
    return {"type": "array", "items": ref(name)}


@dataclass(frozen=True)
class RouteDoc:
    summary: str
    status: int
    response: Mapping[str, Any] | None = None
    request: type[BaseModel] | None = None
    errors: tuple[int, ...] = ()
    parameters: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)


def documented(
    summary: str,
    *,
    status: int = 200,
    response: Mapping[str, Any] | None = None,
    request: type[BaseModel] | None = None,
    errors: tuple[int, ...] = (),
    parameters: tuple[Mapping[str, Any], ...] = (),
) -> Callable[[F], F]:
    def mark(view: F) -> F:
        view.svcgate_doc = RouteDoc(summary, status, response, request, errors, parameters)  # type: ignore[attr-defined]  # read by build_document
        return view

    return mark


_CONVERTER = re.compile(r"<(?:(\w+)(?:\([^)]*\))?:)?(\w+)>")
_DESCRIPTIONS = {
    400: "Invalid input",
    401: "Not signed in",
    403: "Forbidden, or a mutation during view-as",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Body larger than 64 KiB",
    415: "Body is not application/json",
    500: "Internal error",
    501: "Not configured",
    502: "Upstream failure",
}


def _operation(
    method: str, path_params: list[tuple[str, str]], doc: RouteDoc, access: str
) -> dict[str, Any]:
    overrides = {p["name"]: dict(p) for p in doc.parameters if p.get("in") == "path"}
    parameters: list[dict[str, Any]] = [
        overrides.get(name)
        or {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
            if conv == "int"
            else {"type": "string"},
        }
        for conv, name in path_params
    ]
    parameters.extend(dict(p) for p in doc.parameters if p.get("in") != "path")
    success: dict[str, Any] = {"description": doc.summary}
    if doc.response is not None:
        success["content"] = {"application/json": {"schema": dict(doc.response)}}
    responses: dict[str, Any] = {str(doc.status): success}
    codes = set(doc.errors) | {405, 500}
    if access != "public":
        codes |= {401}
    if access == "admin":
        codes |= {403}
    if method not in ("GET", "HEAD"):
        codes |= {403, 413, 415}
    if doc.request is not None:
        codes |= {400}
    for code in sorted(codes):
        responses[str(code)] = {
            "description": _DESCRIPTIONS.get(code, "Error"),
            "content": {"application/json": {"schema": ref("Error")}},
        }
    operation: dict[str, Any] = {
        "summary": doc.summary,
        "operationId": f"{method.lower()}_{'_'.join(n for _, n in path_params) or 'root'}",
        "responses": responses,
    }
    if parameters:
        operation["parameters"] = parameters
    if access != "public":
        operation["security"] = [{"session": []}]
    if doc.request is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": doc.request.model_json_schema()}},
        }
    return operation


def undocumented_routes(app: Quart) -> list[str]:
    missing = []
    for rule in app.url_map.iter_rules():
        view = app.view_functions.get(rule.endpoint)
        if rule.endpoint != "static" and getattr(view, "svcgate_doc", None) is None:
            missing.append(rule.rule)
    return missing


def build_document(app: Quart) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        if rule.endpoint == "static":
            continue
        view = app.view_functions[rule.endpoint]
        doc: RouteDoc | None = getattr(view, "svcgate_doc", None)
        if doc is None:
            continue
        path_params = [(m.group(1) or "string", m.group(2)) for m in _CONVERTER.finditer(rule.rule)]
        path = _CONVERTER.sub(lambda m: "{" + m.group(2) + "}", rule.rule)
        access = getattr(view, "svcgate_access", "session")
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            base = path.rstrip("/") or "/"
            operation = _operation(method, path_params, doc, access)
            operation["operationId"] = f"{rule.endpoint.replace('.', '_')}"
            paths.setdefault(base, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "svcgate control plane",
            "version": __version__,
            "description": "JSON control-plane API of the svcgate MCP gateway. Pre-1.0.",
        },
        "paths": paths,
        "components": {
            "schemas": COMPONENTS,
            "securitySchemes": {
                "session": {"type": "apiKey", "in": "cookie", "name": "svc_session"}
            },
        },
    }


def offline_document() -> dict[str, Any]:
    """The document without a running gateway (the route table needs no services)."""
    from typing import cast

    from svcgate.api.app import create_api_app
    from svcgate.api.context import Services

    return build_document(create_api_app(cast(Services, object())))


def snapshot_text() -> str:
    """The document as the dashboard's committed snapshot (``web/openapi.json``) spells it."""
    import json

    return json.dumps(offline_document(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":  # python -m svcgate.api.openapi > web/openapi.json
    import sys

    sys.stdout.write(snapshot_text())
