"""The HTTP request handler of the development identity provider: routing and framing."""

from __future__ import annotations

import json
import logging
import socket
import socketserver
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from devidp import pages
from devidp.oauth import OAuthError, PageError, Params, RedirectError, parse_params, with_query
from devidp.users import parse_roles

if TYPE_CHECKING:
    from devidp.provider import DevIdP

logger = logging.getLogger("devidp")

MAX_BODY = 64 * 1024


class IdPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], idp: DevIdP) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.idp = idp
        super().__init__(address, Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn); not wanted here.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Handler(BaseHTTPRequestHandler):
    server: IdPServer
    server_version = "devidp/0.1"
    protocol_version = "HTTP/1.0"  # one request per connection: nothing lingers after stop()

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.idp.log_requests:
            super().log_message(format, *args)

    # -- plumbing ----------------------------------------------------------------------------

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: object, headers: Mapping[str, str] | None = None) -> None:
        body = json.dumps(obj, indent=2).encode("utf-8") + b"\n"
        self._send(
            status, body, "application/json", {"Cache-Control": "no-store", **(headers or {})}
        )

    def _html(self, status: int, page: str) -> None:
        headers = {
            "Cache-Control": "no-store",
            "X-Frame-Options": "DENY",
            "Referrer-Policy": "no-referrer",
        }
        self._send(status, page.encode("utf-8"), "text/html; charset=utf-8", headers)

    def _text(self, status: int, text: str, headers: Mapping[str, str] | None = None) -> None:
        self._send(status, (text + "\n").encode("utf-8"), "text/plain; charset=utf-8", headers)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            raise _BadRequest(411, "chunked request bodies are not supported; send Content-Length")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise _BadRequest(400, "bad Content-Length") from None
        if length < 0 or length > MAX_BODY:
            raise _BadRequest(413, "request body too large")
        return self.rfile.read(length)

    def _form(self) -> Params:
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if ctype != "application/x-www-form-urlencoded":
            raise _BadRequest(415, "expected application/x-www-form-urlencoded")
        try:
            text = self._body().decode("utf-8")
        except UnicodeDecodeError:
            raise _BadRequest(400, "request body is not UTF-8") from None
        return parse_params(parse_qsl(text, keep_blank_values=True))

    def _json_body(self) -> dict[str, Any]:
        try:
            data = json.loads(self._body() or b"null")
        except ValueError:
            raise _BadRequest(400, "request body is not JSON") from None
        if not isinstance(data, dict):
            raise _BadRequest(400, "expected a JSON object")
        return data

    def _dispatch(self) -> None:
        path = urlsplit(self.path).path
        routes: dict[str, dict[str, Callable[[], None]]] = {
            "/.well-known/openid-configuration": {"GET": self._discovery},
            "/jwks": {"GET": self._jwks},
            "/authorize": {"GET": self._authorize_get, "POST": self._authorize_post},
            "/token": {"POST": self._token},
            "/userinfo": {"GET": self._userinfo, "POST": self._userinfo},
        }
        if self.server.idp.test_hooks:
            routes["/_test/next_id_token"] = {"POST": self._hook_next_id_token}
            routes["/_test/users"] = {"POST": self._hook_users}
            routes["/_test/requests"] = {"GET": self._hook_requests}
        methods = routes.get(path)
        if methods is None:
            self._text(404, "not found")
            return
        handler = methods.get(self.command)
        if handler is None:
            self._text(405, "method not allowed", {"Allow": ", ".join(methods)})
            return
        try:
            handler()
        except _BadRequest as exc:
            self._text(exc.status, str(exc))
        except Exception:
            logger.exception("devidp: error handling %s %s", self.command, path)
            self._text(500, "internal error")

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _dispatch

    # -- endpoints ---------------------------------------------------------------------------

    def _discovery(self) -> None:
        self._json(200, self.server.idp.discovery(), {"Cache-Control": "max-age=0"})

    def _jwks(self) -> None:
        self._json(200, self.server.idp.jwks(), {"Cache-Control": "max-age=0"})

    def _authorize(self, params: Params, username: str | None, password: str | None) -> None:
        idp = self.server.idp
        try:
            request = idp.validate_authorize(params)
        except PageError as exc:
            self._html(400, pages.error_page(str(exc)))
            return
        except RedirectError as exc:
            fields = {"error": "invalid_request", "error_description": exc.description}
            if exc.state is not None:
                fields["state"] = exc.state
            self._send(302, b"", "text/plain", {"Location": with_query(exc.redirect_uri, fields)})
            return
        error = None
        if username is not None or password is not None:
            location = idp.login(request, username or "", password or "")
            if location is not None:
                self._send(
                    302, b"", "text/plain", {"Location": location, "Cache-Control": "no-store"}
                )
                return
            error = "Invalid username or password."
        self._html(200, pages.login_page(request.params, idp.demo_users(), error))

    def _authorize_get(self) -> None:
        self._authorize(
            parse_params(parse_qsl(urlsplit(self.path).query, keep_blank_values=True)), None, None
        )

    def _authorize_post(self) -> None:
        form = self._form()
        username = (form.pop("username", None) or [""])[0]
        password = (form.pop("password", None) or [""])[0]
        self._authorize(form, username, password)

    def _token(self) -> None:
        try:
            params = self._form()
        except _BadRequest as exc:
            self._json(400, {"error": "invalid_request", "error_description": str(exc)})
            return
        try:
            answer = self.server.idp.token(params, self.headers.get("Authorization"))
        except OAuthError as exc:
            headers = {"WWW-Authenticate": 'Basic realm="devidp"'} if exc.status == 401 else {}
            body = {"error": exc.error, "error_description": exc.description}
            self._json(exc.status, body, {"Pragma": "no-cache", **headers})
            return
        self._json(200, answer, {"Pragma": "no-cache"})

    def _userinfo(self) -> None:
        authorization = self.headers.get("Authorization")
        claims = self.server.idp.userinfo(authorization)
        if claims is None:
            # RFC 6750 section 3.1: no error code when no credentials were sent at all.
            challenge = 'Bearer error="invalid_token"' if authorization else 'Bearer realm="devidp"'
            self._json(401, {"error": "invalid_token"}, {"WWW-Authenticate": challenge})
            return
        self._json(200, claims)

    # -- test hooks --------------------------------------------------------------------------

    def _hook_next_id_token(self) -> None:
        mutation = self._json_body().get("mutation")
        try:
            self.server.idp.set_next_id_token_mutation(str(mutation))
        except ValueError as exc:
            raise _BadRequest(400, str(exc)) from None
        self._json(200, {"next_id_token": mutation})

    def _hook_users(self) -> None:
        body = self._json_body()
        username = body.get("username")
        try:
            roles = parse_roles(body.get("roles"))
        except ValueError as exc:
            raise _BadRequest(400, str(exc)) from None
        try:
            user = self.server.idp.set_user_roles(str(username), roles)
        except KeyError:
            raise _BadRequest(404, f"no such user {username!r}") from None
        self._json(200, user.public_dict())

    def _hook_requests(self) -> None:
        self._json(200, self.server.idp.token_requests())
