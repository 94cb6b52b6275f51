"""A real OCI registry on loopback: Debian's ``docker-registry`` as a child process.

:class:`LocalRegistry` runs ``docker-registry serve`` (distribution 2.8) on
``127.0.0.1:<port>`` (a free port unless one is given), configured through a ``config.yml``
it writes: filesystem storage, deletes enabled, logging quiet, and optionally token auth
behind a Docker-style token service (anything with the :class:`TokenAuth` shape; the tests
have one). The push helpers (:meth:`~LocalRegistry.push_blob`,
:meth:`~LocalRegistry.push_manifest`, :meth:`~LocalRegistry.push_image`,
:meth:`~LocalRegistry.push_index`) and :meth:`~LocalRegistry.fetch` speak the distribution
API with a sync ``httpx2.Client``, doing the same bearer-token dance as a real client when
the registry uses token auth.

Used by the demo's sample registry (``python -m devregistry``) and the registry tests; the
gateway never imports it.

Resource handling: the registry is a context manager. Without ``root`` its configuration and
storage live in a private temp dir that is removed on exit; with ``root`` they live there
(created 0700 if missing) and are kept, so a restarted registry serves what was pushed
before. The process is stopped by its own pid (SIGTERM, then SIGKILL after
:data:`STOP_TIMEOUT`). Its output goes to ``registry.stderr`` in that directory and is quoted
when it does not come up within :data:`START_TIMEOUT`.

Errors: a registry that exits or does not answer raises :class:`RegistryError` (with its
stderr); so does a push the registry refuses (with its status and answer). Transport
failures are ``httpx2`` exceptions.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self, overload
from urllib.parse import urlsplit

import httpx2

REGISTRY_BINARY = "/usr/bin/docker-registry"
START_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"

ALL_MANIFEST_TYPES = ",".join([OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST])


class RegistryError(RuntimeError):
    """The registry did not start, or refused a request of the push helpers."""


class TokenAuth(Protocol):
    """What :class:`LocalRegistry` needs of a token service to configure ``auth.token``."""

    @property
    def username(self) -> str: ...

    @property
    def password(self) -> str: ...

    @property
    def service(self) -> str: ...

    @property
    def issuer(self) -> str: ...

    @property
    def realm(self) -> str: ...

    def cert_pem(self) -> bytes: ...


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def descriptor(media_type: str, data: bytes, **extra: Any) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": sha256_digest(data), "size": len(data), **extra}


_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


def _bearer_challenge(header: str) -> dict[str, str]:
    """Minimal ``WWW-Authenticate: Bearer`` parser for the registry's own push client."""
    if not header.lower().startswith("bearer "):
        raise RegistryError(f"unexpected challenge {header!r}")
    return dict(_CHALLENGE_PARAM.findall(header))


def _expect(response: httpx2.Response, status: int, what: str) -> None:
    if response.status_code != status:
        raise RegistryError(
            f"{what}: the registry answered {response.status_code}: {response.text[:500]}"
        )


class LocalRegistry:
    """``docker-registry serve`` on 127.0.0.1, optionally behind a token service."""

    def __init__(
        self, token_auth: TokenAuth | None = None, *, root: Path | None = None, port: int = 0
    ) -> None:
        self.token_auth = token_auth
        self.port = port
        self._root = root
        self._dir: Path | None = None
        self._temporary = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._http: httpx2.Client | None = None
        self._tokens: dict[str, str] = {}

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    @property
    def pid(self) -> int | None:
        """The registry process' pid while it runs."""
        return self._proc.pid if self._proc is not None else None

    def image_ref(self, repo: str, digest: str) -> str:
        return f"{self.host}/{repo}@{digest}"

    # lifecycle

    def __enter__(self) -> Self:
        if self._root is None:
            self._dir = Path(tempfile.mkdtemp(prefix="svcg-registry-"))
            self._temporary = True
        else:
            self._root.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._dir = self._root
        try:
            self._start(self._dir)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self, root: Path) -> None:
        if not self.port:
            self.port = free_port()
        lines = [
            "version: 0.1",
            "log:",
            "  level: error",
            "  accesslog:",
            "    disabled: true",
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {root / 'data'}",
            "  delete:",
            "    enabled: true",
            "http:",
            f"  addr: 127.0.0.1:{self.port}",
            f"  secret: {uuid.uuid4().hex}",
        ]
        if self.token_auth is not None:
            bundle = root / "token-signer.pem"
            bundle.write_bytes(self.token_auth.cert_pem())
            lines += [
                "auth:",
                "  token:",
                f"    realm: {self.token_auth.realm}",
                f"    service: {self.token_auth.service}",
                f"    issuer: {self.token_auth.issuer}",
                f"    rootcertbundle: {bundle}",
            ]
        config = root / "config.yml"
        config.write_text("\n".join(lines) + "\n")
        self._stderr_path = root / "registry.stderr"
        with self._stderr_path.open("wb") as stderr:
            self._proc = subprocess.Popen(
                [REGISTRY_BINARY, "serve", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
            )
        self._http = httpx2.Client(timeout=20.0)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self._proc.poll() is not None:
                raise RegistryError(
                    f"docker-registry exited with {self._proc.returncode}: {self.stderr()}"
                )
            try:
                response = self._http.get(f"{self.url}/v2/")
            except httpx2.TransportError:
                pass
            else:
                if response.status_code in (200, 401):
                    return
            if time.monotonic() > deadline:
                raise RegistryError(
                    f"docker-registry not answering on {self.url} after {START_TIMEOUT}s: "
                    f"{self.stderr()}"
                )
            time.sleep(0.05)

    def stderr(self) -> str:
        try:
            return self._stderr_path.read_text(errors="replace")[-4000:]
        except (OSError, AttributeError):
            return ""

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(timeout=STOP_TIMEOUT)
            self._proc = None
        if self._dir is not None and self._temporary:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None

    # the registry's own client, with the token dance

    def request(
        self,
        method: str,
        url: str,
        repo: str,
        *,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx2.Response:
        """One request to the registry as its admin (pull and push on ``repo``)."""
        if self._http is None:
            raise RegistryError("LocalRegistry not started")
        if url.startswith("/"):
            url = self.url + url
        for attempt in range(2):
            sent = dict(headers or {})
            if repo in self._tokens:
                sent["Authorization"] = f"Bearer {self._tokens[repo]}"
            response = self._http.request(method, url, content=content, headers=sent)
            if response.status_code != 401 or self.token_auth is None or attempt:
                return response
            challenge = _bearer_challenge(response.headers["WWW-Authenticate"])
            token_response = self._http.get(
                challenge["realm"],
                params={"service": challenge["service"], "scope": f"repository:{repo}:pull,push"},
                auth=(self.token_auth.username, self.token_auth.password),
            )
            token_response.raise_for_status()
            answer = token_response.json()
            self._tokens[repo] = answer.get("token") or answer["access_token"]
        raise AssertionError("unreachable")

    @overload
    def fetch(self, path: str) -> httpx2.Response: ...

    @overload
    def fetch(self, path: str, reference: str) -> bytes: ...

    def fetch(self, path: str, reference: str | None = None) -> httpx2.Response | bytes:
        """GET a registry path (``/v2/<repo>/...``) with admin access: the response.

        ``fetch(repo, reference)`` instead returns the bytes of the manifest ``reference``
        (a digest or tag) in ``repo``, and raises :class:`RegistryError` unless it exists.
        """
        if reference is not None:
            response = self.request(
                "GET",
                f"/v2/{path}/manifests/{reference}",
                path,
                headers={"Accept": ALL_MANIFEST_TYPES},
            )
            _expect(response, 200, f"fetching the manifest {path}@{reference}")
            return response.content
        repo = re.sub(r"^/v2/(.+)/(blobs|manifests)/[^/]+$", r"\1", urlsplit(path).path)
        return self.request("GET", path, repo, headers={"Accept": ALL_MANIFEST_TYPES})

    def push_blob(self, repo: str, data: bytes) -> str:
        digest = sha256_digest(data)
        if self.request("HEAD", f"/v2/{repo}/blobs/{digest}", repo).status_code == 200:
            return digest
        started = self.request("POST", f"/v2/{repo}/blobs/uploads/", repo)
        _expect(started, 202, f"starting an upload to {repo}")
        location = str(started.url.join(started.headers["Location"]))
        separator = "&" if "?" in location else "?"
        done = self.request(
            "PUT",
            f"{location}{separator}digest={digest}",
            repo,
            content=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        _expect(done, 201, f"uploading {digest} to {repo}")
        return digest

    def delete_blob(self, repo: str, digest: str) -> None:
        response = self.request("DELETE", f"/v2/{repo}/blobs/{digest}", repo)
        _expect(response, 202, f"deleting {digest} from {repo}")

    def push_manifest(self, repo: str, body: bytes, media_type: str, reference: str) -> str:
        response = self.request(
            "PUT",
            f"/v2/{repo}/manifests/{reference}",
            repo,
            content=body,
            headers={"Content-Type": media_type},
        )
        _expect(response, 201, f"pushing a manifest to {repo}:{reference}")
        digest = sha256_digest(body)
        answered = response.headers.get("Docker-Content-Digest")
        if answered != digest:
            raise RegistryError(f"the registry stored the manifest as {answered}, not {digest}")
        return digest

    def push_image(
        self,
        repo: str,
        layers: list[tuple[str, bytes]],
        config: dict[str, Any],
        tag: str | None = None,
        docker_media_types: bool = False,
    ) -> str:
        """Push the blobs and a manifest; the manifest's digest."""
        body = self.image_manifest(repo, layers, canonical(config), docker_media_types)
        media_type = DOCKER_MANIFEST if docker_media_types else OCI_MANIFEST
        return self.push_manifest(repo, body, media_type, tag or sha256_digest(body))

    def image_manifest(
        self,
        repo: str,
        layers: list[tuple[str, bytes]],
        config: bytes,
        docker_media_types: bool = False,
        config_media_type: str | None = None,
        edit: Callable[[dict[str, Any]], None] | None = None,
    ) -> bytes:
        """Push the blobs and return a manifest body (not pushed) that ``edit`` may change."""
        self.push_blob(repo, config)
        for _, data in layers:
            self.push_blob(repo, data)
        manifest = {
            "schemaVersion": 2,
            "mediaType": DOCKER_MANIFEST if docker_media_types else OCI_MANIFEST,
            "config": descriptor(
                config_media_type or (DOCKER_CONFIG if docker_media_types else OCI_CONFIG),
                config,
            ),
            "layers": [descriptor(media_type, data) for media_type, data in layers],
        }
        if edit is not None:
            edit(manifest)
        return json.dumps(manifest, indent=3).encode()

    def push_index(
        self,
        repo: str,
        manifests: list[tuple[str, int, str, dict[str, Any]]],
        docker_list: bool = False,
        tag: str | None = None,
    ) -> str:
        """Push an OCI index (or a docker manifest list) over already pushed manifests."""
        media_type = DOCKER_LIST if docker_list else OCI_INDEX
        body = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": media_type,
                "manifests": [
                    {"mediaType": mt, "digest": digest, "size": size, "platform": platform}
                    for digest, size, mt, platform in manifests
                ],
            },
            indent=2,
        ).encode()
        return self.push_manifest(repo, body, media_type, tag or sha256_digest(body))

    def manifest_size(self, repo: str, digest: str) -> int:
        response = self.request(
            "GET",
            f"/v2/{repo}/manifests/{digest}",
            repo,
            headers={"Accept": ALL_MANIFEST_TYPES},
        )
        _expect(response, 200, f"fetching the manifest {repo}@{digest}")
        return len(response.content)
