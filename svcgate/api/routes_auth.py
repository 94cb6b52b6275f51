"""Sign-in routes: ``/api/auth/login``, ``/api/auth/callback``, ``/api/auth/logout``.

The flow cookie (signed, httpOnly, 10 minutes, single use) carries state, nonce and the PKCE
verifier; the callback checks it before anything else and always clears it. A successful
callback deletes any session cookie the browser already had (no fixation, THREATS.md B5),
creates a fresh session and writes the ``login`` audit row in the same transaction.
"""

from __future__ import annotations

import hmac
import json
import logging
import sqlite3

from quart import Blueprint, Response, request

from svcgate import accounts, audit, flow_cookie
from svcgate.api.context import access, caller, services
from svcgate.api.openapi import documented
from svcgate.clock import now_epoch
from svcgate.errors import Invalid, Unauthenticated
from svcgate.oidc import Identity, OidcError
from svcgate.redirects import safe_next
from svcgate.roles import role_for
from svcgate.tokens import sha256_hex

log = logging.getLogger(__name__)

bp = Blueprint("auth", __name__, url_prefix="/api/auth")

SESSION_COOKIE = "svc_session"
FLOW_PATH = "/api/auth"


def _redirect(location: str) -> Response:
    return Response(b"", status=302, headers={"Location": location})


def _clear_flow(response: Response) -> None:
    response.delete_cookie(
        flow_cookie.FLOW_COOKIE,
        path=FLOW_PATH,
        httponly=True,
        samesite="Lax",
        secure=services().settings.secure_cookies,
    )


@bp.after_request
async def _callback_always_clears_the_flow(response: Response) -> Response:
    # Success, refusal or a failed write: the flow is spent either way (single use).
    if request.endpoint == "auth.callback":
        _clear_flow(response)
    return response


@bp.get("/login")
@access("public")
@documented(
    "Start sign-in: 302 to the identity provider with a flow cookie",
    status=302,
    parameters=({"name": "next", "in": "query", "required": False, "schema": {"type": "string"}},),
)
async def login() -> Response:
    svc = services()
    flow = flow_cookie.Flow.new(next_path=safe_next(request.args.get("next")), now=now_epoch())
    response = _redirect(svc.oidc.authorize_url(flow))
    response.set_cookie(
        flow_cookie.FLOW_COOKIE,
        flow_cookie.sign(flow, svc.flow_key),
        max_age=int(flow_cookie.FLOW_TTL),
        path=FLOW_PATH,
        httponly=True,
        samesite="Lax",
        secure=svc.settings.secure_cookies,
    )
    return response


async def _audit_failure(reason: str) -> None:
    await services().store.write(
        lambda conn: audit.record(conn, kind="auth", decision="login_failed", detail=reason)
    )


@bp.get("/callback")
@access("public")
@documented(
    "Finish sign-in: verify the flow, set svc_session, 302 to / (or next)",
    status=302,
    errors=(401,),
    parameters=(
        {"name": "state", "in": "query", "required": False, "schema": {"type": "string"}},
        {"name": "code", "in": "query", "required": False, "schema": {"type": "string"}},
    ),
)
async def callback() -> Response:
    svc = services()
    try:
        flow = flow_cookie.verify(
            request.cookies.get(flow_cookie.FLOW_COOKIE), svc.flow_key, now=now_epoch()
        )
    except flow_cookie.FlowCookieError as exc:
        raise Unauthenticated(f"sign-in failed: {exc}") from exc
    if not svc.flows.consume(flow, now=now_epoch()):
        raise Unauthenticated("sign-in failed: this login flow was already used; start again")
    try:
        identity = await _complete(flow)
    except (OidcError, Invalid) as exc:
        log.warning("sign-in failed: %s", exc)
        await _audit_failure(str(exc))
        error = Unauthenticated(f"sign-in failed: {exc}")
        return Response(
            _envelope_json(error.envelope()), status=401, content_type="application/json"
        )

    role = role_for(identity.claims, svc.settings.admin_role)
    old_cookie = request.cookies.get(SESSION_COOKIE)
    ttl = svc.settings.session_ttl

    def sign_in(conn: sqlite3.Connection) -> tuple[str, int]:
        if old_cookie:
            accounts.delete_session(conn, sha256_hex(old_cookie))
        user = accounts.upsert_user(conn, identity, role)
        token = accounts.create_session(conn, user.id, ttl)
        audit.record(
            conn,
            kind="auth",
            decision="login",
            user_id=user.id,
            detail=f"role={user.role}",
        )
        return token, user.id

    token, user_id = await svc.store.write(sign_in)
    log.info("user %d signed in", user_id)
    response = _redirect(flow.next_path)
    response.set_cookie(
        SESSION_COOKIE,
        token,
        max_age=int(ttl),
        path="/",
        httponly=True,
        samesite="Lax",
        secure=svc.settings.secure_cookies,
    )
    return response


def _envelope_json(body: object) -> str:
    return json.dumps(body, separators=(",", ":"))


async def _complete(flow: flow_cookie.Flow) -> Identity:
    state = request.args.get("state", "")
    if not hmac.compare_digest(state.encode(), flow.state.encode()):
        raise Invalid("state does not match this browser's login flow")
    if "error" in request.args:
        error = request.args.get("error", "")[:64]
        raise Invalid(f"identity provider returned an error ({error!r})")
    code = request.args.get("code", "")
    if not code or len(code) > 2048:
        raise Invalid("authorization code missing")
    return await services().oidc.complete(code, flow)


@bp.post("/logout")
@access("session")
@documented("Sign out: delete the session and clear the cookie", status=204)
async def logout() -> Response:
    session = caller()

    def sign_out(conn: sqlite3.Connection) -> None:
        accounts.delete_session(conn, session.token_hash)
        audit.record(conn, kind="auth", decision="logout", user_id=session.real_user.id)

    await services().store.write(sign_out)
    response = Response(b"", status=204)
    response.delete_cookie(
        SESSION_COOKIE,
        path="/",
        httponly=True,
        samesite="Lax",
        secure=services().settings.secure_cookies,
    )
    return response
