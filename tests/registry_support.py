"""A real OCI registry on loopback for the registry tests, plus its token service and a proxy.

Imported by name (the tests have no packages), like ``gateway_support``.

* :class:`LocalRegistry`: Debian's ``docker-registry`` (distribution 2.8) as a child process on
  ``127.0.0.1:<free port>``, with push helpers that do the bearer-token dance when the
  registry uses token auth. It lives in :mod:`devregistry.registry` (the demo's sample
  registry uses it too) and is re-exported here with its helpers and media types.
* :class:`TokenServer`: the token service Docker Hub and GHCR put in front of their
  registries. It checks HTTP Basic credentials and issues an ES256 JWT; the registry trusts
  its self-signed certificate through ``auth.token.rootcertbundle``. distribution 2.8 finds
  the signing key through the token header: ``x5c`` (the DER certificate, which must chain
  to the bundle; a self-signed certificate that *is* in the bundle does) or the
  libtrust-style ``kid`` of a key in the bundle. Both work; ``key_header`` picks one.
* :class:`TamperingProxy`: forwards to a registry but answers chosen paths itself with
  chosen bytes or statuses ("the same digest serving different bytes"), can redirect blob
  GETs to a separate "storage" origin (as registries redirect to object storage), and
  records every request it saw (headers included) for the tests to inspect.

Resource handling: every server is a context manager. The registry process is stopped by
its own pid (SIGTERM, then SIGKILL after 5 s) and its temp dir removed (see
:mod:`devregistry.registry`). The HTTP servers run on daemon threads and are shut down and
closed on exit.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

import httpx2
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from devregistry.registry import (
    _CHALLENGE_PARAM,
    ALL_MANIFEST_TYPES,
    DOCKER_CONFIG,
    DOCKER_LAYER,
    DOCKER_LIST,
    DOCKER_MANIFEST,
    OCI_CONFIG,
    OCI_INDEX,
    OCI_LAYER,
    OCI_MANIFEST,
    REGISTRY_BINARY,
    START_TIMEOUT,
    STOP_TIMEOUT,
    LocalRegistry,
    RegistryError,
    TokenAuth,
    _bearer_challenge,
    canonical,
    descriptor,
    free_port,
    sha256_digest,
)

__all__ = [
    "ALL_MANIFEST_TYPES",
    "DOCKER_CONFIG",
    "DOCKER_LAYER",
    "DOCKER_LIST",
    "DOCKER_MANIFEST",
    "LINUX_AMD64",
    "LINUX_ARM64",
    "OCI_CONFIG",
    "OCI_INDEX",
    "OCI_LAYER",
    "OCI_MANIFEST",
    "REGISTRY_BINARY",
    "START_TIMEOUT",
    "STOP_TIMEOUT",
    "_CHALLENGE_PARAM",
    "LocalRegistry",
    "Override",
    "Recorded",
    "RegistryError",
    "TamperingProxy",
    "TokenAuth",
    "TokenRequest",
    "TokenServer",
    "_bearer_challenge",
    "canonical",
    "descriptor",
    "free_port",
    "image_config",
    "libtrust_key_id",
    "sha256_digest",
]

LINUX_AMD64 = {"os": "linux", "architecture": "amd64"}
LINUX_ARM64 = {"os": "linux", "architecture": "arm64", "variant": "v8"}


def image_config(arch: str = "amd64", **extra: Any) -> dict[str, Any]:
    return {
        "architecture": arch,
        "os": "linux",
        "config": {"Cmd": ["/bin/echo", "hello"], "Env": ["PATH=/usr/bin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": []},
        **extra,
    }


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def libtrust_key_id(public_key: ec.EllipticCurvePublicKey) -> str:
    """The key id distribution 2.8 (libtrust) derives for a key in the root bundle."""
    der = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    text = base64.b32encode(hashlib.sha256(der).digest()[:30]).decode().rstrip("=")
    return ":".join(text[i : i + 4] for i in range(0, len(text), 4))


# -- servers on daemon threads ---------------------------------------------------------------


class _Server:
    """A ThreadingHTTPServer on 127.0.0.1 running on a daemon thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._httpd.owner = self  # type: ignore[attr-defined]
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10

    def log_message(self, format: str, *args: Any) -> None:
        pass

    @property
    def owner(self) -> Any:
        return self.server.owner  # type: ignore[attr-defined]

    def reply(
        self,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        *,
        chunked: bool = False,
    ) -> None:
        """Send a whole response; ``chunked`` sends the body without a Content-Length."""
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if not chunked:
            self.wfile.write(body)
            return
        for start in range(0, len(body), 16384):
            piece = body[start : start + 16384]
            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")

    def read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""


# -- token service -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenRequest:
    username: str | None
    service: str | None
    scopes: list[str]


class _TokenHandler(_Handler):
    def do_GET(self) -> None:
        self.owner.handle(self)


class TokenServer:
    """A Docker-style token service on loopback issuing ES256 JWTs.

    ``key_header`` names the JWT header that identifies the signing key to the registry:
    ``"x5c"`` (certificate chain) or ``"kid"`` (libtrust key id). ``anonymous_pull`` grants
    ``pull`` without credentials, as Docker Hub does for public repositories. ``audience``
    overrides the ``aud`` claim (a wrong one makes the registry refuse the token).
    ``token_field`` is ``"token"``, ``"access_token"`` or ``"both"``.
    """

    def __init__(
        self,
        username: str = "puller",
        password: str = "correct horse battery staple",
        *,
        service: str = "svcgate-test-registry",
        issuer: str = "svcgate-test-issuer",
        key_header: str = "x5c",
        anonymous_pull: bool = False,
        audience: str | None = None,
        token_field: str = "token",
    ) -> None:
        self.username = username
        self.password = password
        self.service = service
        self.issuer = issuer
        self.key_header = key_header
        self.anonymous_pull = anonymous_pull
        self.audience = audience
        self.token_field = token_field
        self.requests: list[TokenRequest] = []
        self.issued: list[str] = []
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "svcgate test token signer")])
        now = datetime.now(UTC)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(hours=1))
            .not_valid_after(now + timedelta(days=1))
            .sign(self._key, hashes.SHA256())
        )
        self._server: _Server | None = None

    def __enter__(self) -> Self:
        self._server = _Server(_TokenHandler)
        self._server._httpd.owner = self  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    @property
    def realm(self) -> str:
        assert self._server is not None, "TokenServer not started"
        return f"{self._server.url}/token"

    def cert_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def handle(self, request: _Handler) -> None:
        query = parse_qs(urlsplit(request.path).query)
        scopes = query.get("scope", [])
        user = self._authenticate(request.headers.get("Authorization"))
        self.requests.append(
            TokenRequest(
                username=user if isinstance(user, str) else None,
                service=query["service"][0] if "service" in query else None,
                scopes=scopes,
            )
        )
        if user is False:
            request.reply(401, b'{"details":"incorrect username or password"}')
            return
        if user is None and not self.anonymous_pull:
            request.reply(401, b'{"details":"authentication required"}')
            return
        allowed = {"pull", "push"} if user else {"pull"}
        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            granted = [a for a in actions.split(",") if a in allowed]
            access.append({"type": kind, "name": name, "actions": granted})
        token = self.issue(user if isinstance(user, str) else "", access)
        body: dict[str, Any] = {"expires_in": 300}
        if self.token_field in ("token", "both"):
            body["token"] = token
        if self.token_field in ("access_token", "both"):
            body["access_token"] = token
        request.reply(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def _authenticate(self, header: str | None) -> str | bool | None:
        """The user name, None when anonymous, False for wrong credentials."""
        if not header:
            return None
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(value).decode().partition(":")
        except ValueError:
            return False
        return user if (user, password) == (self.username, self.password) else False

    def issue(self, subject: str, access: list[dict[str, Any]]) -> str:
        now = int(time.time())
        header: dict[str, Any] = {"typ": "JWT", "alg": "ES256"}
        if self.key_header == "x5c":
            der = self.certificate.public_bytes(serialization.Encoding.DER)
            header["x5c"] = [base64.b64encode(der).decode()]
        elif self.key_header == "kid":
            header["kid"] = libtrust_key_id(self._key.public_key())
        else:
            raise ValueError(f"unknown key_header {self.key_header!r}")
        claims = {
            "iss": self.issuer,
            "sub": subject,
            "aud": self.audience or self.service,
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": uuid.uuid4().hex,
            "access": access,
        }
        signing_input = f"{_b64url(canonical(header))}.{_b64url(canonical(claims))}"
        r, s = decode_dss_signature(
            self._key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))
        )
        signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
        token = f"{signing_input}.{_b64url(signature)}"
        self.issued.append(token)
        return token


# -- a proxy that can lie --------------------------------------------------------------------


@dataclass
class Override:
    body: bytes
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    chunked: bool = False


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]


_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}
_NOT_FORWARDED = _HOP_BY_HOP | {"content-encoding", "date", "server"}


class _ProxyHandler(_Handler):
    def do_GET(self) -> None:
        self.owner.handle(self)

    do_HEAD = do_GET


class _StorageHandler(_Handler):
    def do_GET(self) -> None:
        self.owner.handle_storage(self)


class TamperingProxy:
    """An HTTP proxy in front of a :class:`LocalRegistry` that can substitute answers.

    :meth:`override` makes the proxy answer one path (``/v2/<repo>/manifests/<digest>`` or
    ``.../blobs/<digest>``) itself. With ``redirect_blobs`` set, blob GETs are answered with
    ``307`` to a second loopback origin (another port) that serves the blob; requests seen
    there are in :attr:`storage_requests`. With ``require_basic = (user, password)`` the
    proxy itself demands HTTP Basic (``WWW-Authenticate: Basic``) before anything else, as a
    registry with htpasswd auth does. Upstream requests carry the client's headers, so a
    token-auth registry behind the proxy works as usual, except that an ``Authorization``
    value in :attr:`reject_authorization` is dropped first (a token the registry no longer
    accepts, as after its expiry).
    """

    def __init__(self, registry: LocalRegistry) -> None:
        self.registry = registry
        self.overrides: dict[str, Override] = {}
        self.requests: list[Recorded] = []
        self.storage_requests: list[Recorded] = []
        self.redirect_blobs = False
        self.require_basic: tuple[str, str] | None = None
        self.reject_authorization: set[str] = set()
        self._proxy: _Server | None = None
        self._storage: _Server | None = None
        self._upstream: httpx2.Client | None = None

    def __enter__(self) -> Self:
        self._upstream = httpx2.Client(timeout=20.0)
        self._proxy = _Server(_ProxyHandler)
        self._proxy._httpd.owner = self  # type: ignore[attr-defined]
        self._storage = _Server(_StorageHandler)
        self._storage._httpd.owner = self  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc: object) -> None:
        for server in (self._proxy, self._storage):
            if server is not None:
                server.close()
        if self._upstream is not None:
            self._upstream.close()

    @property
    def host(self) -> str:
        assert self._proxy is not None
        return f"127.0.0.1:{self._proxy.port}"

    @property
    def storage_url(self) -> str:
        assert self._storage is not None
        return self._storage.url

    def image_ref(self, repo: str, digest: str) -> str:
        return f"{self.host}/{repo}@{digest}"

    def override(
        self,
        path: str,
        body: bytes,
        *,
        status: int = 200,
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
        chunked: bool = False,
    ) -> None:
        extra = dict(headers or {})
        if content_type is not None:
            extra["Content-Type"] = content_type
        self.overrides[path] = Override(body, status, extra, chunked)

    def handle(self, request: _Handler) -> None:
        self.requests.append(Recorded(request.command, request.path, dict(request.headers)))
        if self.require_basic is not None:
            user, password = self.require_basic
            expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
            if request.headers.get("Authorization") != expected:
                challenge = {"WWW-Authenticate": 'Basic realm="svcgate test registry"'}
                request.reply(401, b"{}", challenge)
                return
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        if headers.get("Authorization") in self.reject_authorization:
            del headers["Authorization"]  # the registry answers with its genuine challenge
        override = self.overrides.get(request.path)
        if override is not None:
            request.reply(
                override.status, override.body, override.headers, chunked=override.chunked
            )
            return
        if self.redirect_blobs and "/blobs/" in request.path and request.command == "GET":
            request.reply(307, headers={"Location": self.storage_url + request.path})
            return
        assert self._upstream is not None
        upstream = self._upstream.request(
            request.command, self.registry.url + request.path, headers=headers
        )
        reply_headers = {
            k: v for k, v in upstream.headers.items() if k.lower() not in _NOT_FORWARDED
        }
        request.reply(upstream.status_code, upstream.content, reply_headers)

    def handle_storage(self, request: _Handler) -> None:
        self.storage_requests.append(Recorded(request.command, request.path, dict(request.headers)))
        upstream = self.registry.fetch(request.path)
        request.reply(
            upstream.status_code,
            upstream.content,
            {"Content-Type": "application/octet-stream"},
        )
