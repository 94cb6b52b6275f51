"""The one error hierarchy of the gateway.

Every error the control plane can answer with is an :class:`ApiError` carrying its API
``code`` and HTTP ``status``. One handler (``svcgate.api.app``) turns it into the envelope
``{"error": {"code", "message"}}``. Unexpected exceptions never reach the client: they become
``internal`` and are logged with their traceback.

Messages are written for the client and must never contain secrets (tokens, cookies,
credential values) or echo raw exception text.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ApiError(Exception):
    """An error with a stable API code and an HTTP status."""

    code: ClassVar[str] = "internal"
    status: ClassVar[int] = 500

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status_override: int | None = status
        else:
            self.status_override = None

    @property
    def http_status(self) -> int:
        return self.status_override if self.status_override is not None else self.status

    def envelope(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}


class Unauthenticated(ApiError):
    code = "unauthenticated"
    status = 401


class Forbidden(ApiError):
    code = "forbidden"
    status = 403


class Impersonating(ApiError):
    code = "impersonating"
    status = 403


class NotFound(ApiError):
    code = "not_found"
    status = 404


class MethodNotAllowed(ApiError):
    code = "method_not_allowed"
    status = 405


class Invalid(ApiError):
    """Bad input: 400, or 413 for an oversized body, or 415 for a non-JSON body."""

    code = "invalid"
    status = 400


class Conflict(ApiError):
    code = "conflict"
    status = 409


class Internal(ApiError):
    code = "internal"
    status = 500


class InstallFailed(ApiError):
    code = "install_failed"
    status = 502


class UninstallFailed(ApiError):
    code = "uninstall_failed"
    status = 502


class NotImplementedYet(ApiError):
    """A capability that is not configured on this gateway (e.g. no registry installer)."""

    code = "not_configured"
    status = 501


class ControlPlaneDisabled(ApiError):
    code = "control_plane_disabled"
    status = 404


def envelope(code: str, message: str) -> dict[str, Any]:
    """Build the error envelope for places that have no exception object."""
    return {"error": {"code": code, "message": message}}
