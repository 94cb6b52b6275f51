"""Control-plane application factory and the request pipeline every route shares.

Pipeline (in order): route match (404/405 envelopes) -> CSRF checks for unsafe methods ->
session -> view-as refusal -> admin check on the real user -> the view. Every response gets
``Cache-Control: no-store``; every error is the envelope.

CSRF (THREATS.md B7): the session cookie is ``SameSite=Lax``, so an unsafe request must carry
a JSON body type (or no body at all), must not come from another origin (``Origin`` present
and not the public origin) and must not be marked cross-site or same-site by the browser
(``Sec-Fetch-Site``). GET never changes state.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from quart import Response, current_app, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from svcgate import accounts
from svcgate.api import (
    routes_audit,
    routes_auth,
    routes_credentials,
    routes_meta,
    routes_profiles,
    routes_servers,
    routes_session,
)
from svcgate.api.context import Services, services
from svcgate.errors import (
    ApiError,
    Forbidden,
    Impersonating,
    Internal,
    Invalid,
    MethodNotAllowed,
    NotFound,
    Unauthenticated,
)
from svcgate.store import StoreUnavailable

log = logging.getLogger(__name__)

SESSION_COOKIE = "svc_session"
SAFE_METHODS = frozenset({"GET", "HEAD"})
STOP_IMPERSONATION = ("DELETE", "session.stop_impersonation")


def _error_response(error: ApiError) -> Response:
    return Response(
        _dumps(error.envelope()), status=error.http_status, content_type="application/json"
    )


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _check_csrf() -> None:
    settings = services().settings
    origin = request.headers.get("Origin")
    if origin is not None and origin != settings.public_origin:
        raise Forbidden("cross-origin request refused")
    fetch_site = request.headers.get("Sec-Fetch-Site")
    if fetch_site in ("cross-site", "same-site"):
        raise Forbidden("cross-site request refused")
    content_type = request.headers.get("Content-Type")
    has_body = (request.content_length or 0) > 0 or "Transfer-Encoding" in request.headers
    if content_type is None:
        if has_body:
            raise Invalid("request bodies must be application/json", status=415)
        return
    mime = content_type.split(";", 1)[0].strip().lower()
    if mime != "application/json":
        raise Invalid("request bodies must be application/json", status=415)


async def _authenticate() -> None:
    # Route errors first: an unknown path is 404 and a wrong method 405 for everyone.
    if request.routing_exception is not None:
        raise request.routing_exception
    view = services_view()
    level = getattr(view, "svcgate_access", "session")
    if request.method not in SAFE_METHODS:
        _check_csrf()
    if level == "public":
        return
    token = request.cookies.get(SESSION_COOKIE)
    if not token or len(token) > 256:
        raise Unauthenticated("sign in first")
    session = await services().store.read(lambda conn: accounts.lookup_session(conn, token))
    if session is None:
        raise Unauthenticated("session missing or expired; sign in again")
    g.svcgate_session = session
    if (
        session.impersonating
        and request.method not in SAFE_METHODS
        and (request.method, request.endpoint) != STOP_IMPERSONATION
    ):
        raise Impersonating("view-as is read-only; stop impersonating first")
    if level == "admin" and session.real_user.role != "admin":
        raise Forbidden("admin role required")


def services_view() -> Any:
    return current_app.view_functions.get(request.endpoint or "")


def create_api_app(svc: Services) -> QuartTrio:
    app = QuartTrio("svcgate.api")
    app.extensions["svcgate"] = svc
    app.config["MAX_CONTENT_LENGTH"] = None  # enforced by the front before the app
    app.config["PROPAGATE_EXCEPTIONS"] = False
    app.url_map.strict_slashes = False
    for blueprint in (
        routes_auth.bp,
        routes_session.bp,
        routes_audit.bp,
        routes_profiles.bp,
        routes_servers.bp,
        routes_credentials.bp,
        routes_meta.bp,
    ):
        app.register_blueprint(blueprint)

    app.before_request(_authenticate)

    @app.after_request
    async def _no_store(response: Response) -> Response:
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    @app.errorhandler(ApiError)
    async def _api_error(error: ApiError) -> Response:
        return _error_response(error)

    @app.errorhandler(HTTPException)
    async def _http_error(error: HTTPException) -> Response:
        if error.code == 404:
            return _error_response(NotFound("no such route"))
        if error.code == 405:
            response = _error_response(MethodNotAllowed("method not allowed"))
            allowed = getattr(error, "valid_methods", None)
            if allowed:
                response.headers["Allow"] = ", ".join(sorted(allowed))
            return response
        if error.code == 413:
            return _error_response(Invalid("request body too large", status=413))
        if error.code is not None and 400 <= error.code < 500:
            return _error_response(Invalid("bad request", status=error.code))
        log.error("unexpected HTTP exception %s", error.code)
        return _error_response(Internal("internal error"))

    @app.errorhandler(StoreUnavailable)
    async def _store_error(error: StoreUnavailable) -> Response:
        log.error("database write failed: %s", error)
        return _error_response(Internal("the database is unavailable; nothing was changed"))

    @app.errorhandler(Exception)
    async def _unexpected(error: Exception) -> Response:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return _error_response(Internal("internal error"))

    return app
