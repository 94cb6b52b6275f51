"""OCI distribution client: pull one image, pinned by digest, into verified blob files.

An image is named ``registry/repository@sha256:<64 hex>`` (:func:`parse_image_ref`); tags
are refused, also next to a digest, because a tag can point anywhere tomorrow. The digest
pins the exact manifest bytes, the manifest pins the config and every layer by digest and
size, so once :meth:`OCIClient.pull` returns, everything on disk is exactly what the digest
named, whoever served it.

Protocol (the distribution API as Docker Hub, GHCR and ``docker-registry`` speak it):

- Scheme: ``http://`` only when the registry host is loopback (``localhost``,
  ``127.0.0.0/8``, ``[::1]``), ``https://`` for everything else. ``docker.io`` is reached at
  ``registry-1.docker.io`` as Docker does (Docker Hub's official images need the explicit
  ``library/`` prefix).
- ``GET /v2/<repo>/manifests/<digest>`` accepting OCI manifests and indexes and Docker v2
  manifests and manifest lists. At most ``max_manifest_bytes`` are read; the SHA-256 of the
  exact bytes must equal the digest asked for. The kind comes from the body's
  ``mediaType`` (the ``Content-Type`` header only when the body has none); Docker schema 1
  and unknown kinds are refused. An index (or manifest list) resolves to the first entry
  whose platform has the wanted ``os`` and ``architecture`` (the variant is ignored), which
  is fetched by its digest and verified the same way; an index inside an index is refused.
  The image config must be an OCI or Docker image config (artifacts are refused) whose
  ``os``/``architecture``, when present, match the platform.
- ``GET /v2/<repo>/blobs/<digest>`` for the config and each layer, in order, one at a time.
  A blob must not be larger than its descriptor says nor than ``max_blob_bytes`` (refused
  before the download when the descriptor already says so, else as soon as the stream goes
  past the limit) and must match the descriptor's size and digest exactly. Descriptor
  ``urls`` (foreign layers) are never followed: every blob comes from the registry. Only
  ``sha256`` digests are supported. Bodies are verified as sent (``Accept-Encoding:
  identity`` is requested and any ``Content-Encoding`` is not undone).
- Redirects (registries send blob GETs to object storage) are followed by this module, up
  to :data:`MAX_REDIRECTS`, whatever the borrowed client's ``follow_redirects`` says. The
  ``Authorization`` header goes only to the registry's own origin (scheme, host, port), never
  to a redirect target elsewhere. A target must be ``https://``, except that a loopback
  ``http://`` registry may redirect to loopback ``http://``.
- Authentication as Docker Hub and GHCR do it: a 401 carries ``WWW-Authenticate``
  (:func:`parse_www_authenticate`). ``Bearer realm=...,service=...`` sends ``GET realm``
  with ``service`` and ``scope=repository:<repo>:pull`` (HTTP Basic with the registry's
  credentials when there are any, anonymously otherwise, which public images allow) and
  retries with ``Authorization: Bearer <token>`` from the answer's ``token`` or
  ``access_token``. The realm must be ``https://`` (``http://`` only on loopback) because
  the credentials go there. ``Basic`` retries with the credentials. The token is kept for
  the rest of the pull; a later 401 (an expired token) fetches a new one once more.
- Credentials are ``host[:port] -> RegistryCredentials`` (keys are normalised as
  :func:`load_auth_file` does, so a URL or upper-case key works too); :func:`load_auth_file`
  reads them from Docker's ``config.json`` format.

Resource handling: :class:`OCIClient` borrows an ``httpx2.AsyncClient`` (its timeouts apply
to every request; wrap :meth:`~OCIClient.pull` in a trio cancel scope for an overall
deadline) and owns nothing across pulls. Every response is opened streaming and closed in a
``finally``. A blob streams into a ``mkstemp`` file (mode 0600) in ``blob_dir`` (created if
missing), hashed as it arrives and written in 1 MiB pieces on a worker thread, fsynced, and
renamed to ``blob_dir/<hex>`` only once size and digest match. Any failure or cancellation
deletes the partial file. A regular file already named ``<hex>`` with the descriptor's size
is reused without a download: only this module renames files to those names, and only after
verifying them, so ``blob_dir`` must be private to the caller.

Error handling: every failure (HTTP, verification, and the blob directory's own ``OSError``)
raises :class:`OCIError` whose message is one line for an admin naming the registry,
repository and digest or step that failed. Messages never contain
credentials, tokens or ``Authorization`` values; nothing here logs. ``progress`` (when
given) is called with short human messages at each blob's start and end and about every
:data:`PROGRESS_INTERVAL` bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import os
import re
import stat
import string
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import httpx2
import trio

from svcgate.host_patterns import is_loopback_host
from svcgate.strict_json import StrictJSONError, loads_strict

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_SCHEMA1 = (
    "application/vnd.docker.distribution.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v1+prettyjws",
)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
CONFIG_TYPES = (OCI_CONFIG, DOCKER_CONFIG)
ACCEPT = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST))

MiB = 1024 * 1024
PROGRESS_INTERVAL = 32 * MiB
MAX_CONFIG_BYTES = 1 * MiB
MAX_TOKEN_RESPONSE_BYTES = 1 * MiB
MAX_LAYERS = 1000
MAX_REDIRECTS = 5
WRITE_CHUNK = 1 * MiB
MAX_NAME_LENGTH = 255
REDIRECT_STATUSES = (301, 302, 303, 307, 308)

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
DOCKER_HUB_ALIASES = ("index.docker.io", "registry-1.docker.io", "registry.hub.docker.com")

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_ALGORITHM = re.compile(r"[a-z0-9]+(?:[+._-][a-z0-9]+)*")
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*")
_LABEL = r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_TOKEN_VALUE = re.compile(r"[\x21-\x7e]+")
_TOKEN_CHARS = frozenset(string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~")
_TOKEN68 = re.compile(r"[A-Za-z0-9\-._~+/]+=*")

PINNED_FORM = "registry/repository@sha256:<64 lower-case hex>"


class OCIError(Exception):
    """An image could not be pulled. ``str()`` is one line for an admin, free of secrets."""


# -- image references ------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageRef:
    """An image pinned by digest: ``registry/repository@sha256:<hex>``."""

    registry: str
    repository: str
    digest: str

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}@{self.digest}"


def _short(text: str, limit: int = 200) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _normalise_host(text: str) -> str:
    """``host[:port]`` lower-cased (IPv6 literals in brackets); ValueError when malformed."""
    lower = text.lower()
    if lower.startswith("["):
        end = lower.find("]")
        if end < 0:
            raise ValueError("unterminated IPv6 literal")
        address = ipaddress.IPv6Address(lower[1:end])
        host, rest = f"[{address.compressed}]", lower[end + 1 :]
        if rest and not rest.startswith(":"):
            raise ValueError("junk after IPv6 literal")
        port = rest[1:] if rest else None
    else:
        host, colon, port_text = lower.partition(":")
        if not _HOSTNAME.fullmatch(host):
            raise ValueError("not a host name")
        port = port_text if colon else None
    if port is not None:
        if not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("bad port")
        return f"{host}:{int(port)}"
    return host


def _split_host(registry: str) -> str:
    """The host part of ``host[:port]`` without brackets."""
    if registry.startswith("["):
        return registry[1 : registry.index("]")]
    return registry.partition(":")[0]


def parse_image_ref(text: str) -> ImageRef:
    """Parse ``registry/repository@sha256:<64 hex>``. Raises :class:`OCIError`."""
    name, at, digest = text.partition("@")
    if not at:
        last = name.rsplit("/", 1)[-1]
        if ":" in last:
            raise OCIError(
                f"image {_short(text)} names a tag; image must be pinned by digest ({PINNED_FORM})"
            )
        raise OCIError(f"image must be pinned by digest ({PINNED_FORM}), got {_short(text)}")
    if "@" in digest:
        raise OCIError(f"image {_short(text)} has more than one '@'")
    algorithm, colon, _ = digest.partition(":")
    if not colon or not _ALGORITHM.fullmatch(algorithm):
        raise OCIError(f"image {_short(text)}: {_short(digest)} is not a digest ({PINNED_FORM})")
    if algorithm != "sha256":
        raise OCIError(f"image {_short(text)}: only sha256 digests are supported ({PINNED_FORM})")
    if not _DIGEST.fullmatch(digest):
        raise OCIError(
            f"image {_short(text)}: the digest must be 64 lower-case hex digits ({PINNED_FORM})"
        )
    host_text, slash, repository = name.partition("/")
    if not slash or not ("." in host_text or ":" in host_text or host_text.lower() == "localhost"):
        raise OCIError(
            f"image {_short(text)} must start with the registry host, e.g. "
            f"ghcr.io/owner/name@sha256:... ({PINNED_FORM})"
        )
    try:
        registry = _normalise_host(host_text)
    except ValueError as exc:
        raise OCIError(f"image {_short(text)}: {_short(host_text)} is not a host ({exc})") from None
    if ":" in repository.rsplit("/", 1)[-1]:
        raise OCIError(
            f"image {_short(text)} names both a tag and a digest; the tag is meaningless "
            f"next to a digest and misleading, pin by digest only ({PINNED_FORM})"
        )
    if not _REPOSITORY.fullmatch(repository):
        raise OCIError(
            f"image {_short(text)}: {_short(repository)} is not a valid repository name "
            "(lower-case letters, digits and . _ __ - separators between '/'-separated parts)"
        )
    if len(registry) + 1 + len(repository) > MAX_NAME_LENGTH:
        raise OCIError(f"image {_short(text)}: the name is longer than {MAX_NAME_LENGTH}")
    return ImageRef(registry, repository, digest)


# -- credentials -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegistryCredentials:
    username: str
    password: str = field(repr=False)


def _auth_file_key(key: str) -> str:
    """Normalise a ``config.json`` key (``host[:port]`` or a URL) to ``host[:port]``."""
    text = key.strip()
    netloc = urlsplit(text).netloc if "://" in text else text.split("/", 1)[0]
    if "@" in netloc:
        raise ValueError("user info in the key")
    registry = _normalise_host(netloc)
    return DOCKER_HUB if registry in DOCKER_HUB_ALIASES else registry


def load_auth_file(path: Path) -> dict[str, RegistryCredentials]:
    """Read registry credentials from a Docker ``config.json``.

    ``{"auths": {"<host[:port]> or <URL>": {"auth": base64("user:pass")}}}`` or
    ``{"username": ..., "password": ...}`` in an entry. Keys are normalised to lower-case
    ``host[:port]`` (Docker Hub's keys to ``docker.io``). Entries without a usable user name
    and password (an ``identitytoken``, or ``{}`` placeholders of a ``credsStore``) are
    skipped; other keys (``credsStore``, ``credHelpers``) are ignored. Raises
    :class:`OCIError` naming the file (and the entry's key) but never a secret.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise OCIError(f"cannot read registry auth file {path}: {exc.strerror}") from None
    try:
        doc = loads_strict(raw)
    except StrictJSONError as exc:
        raise OCIError(f"registry auth file {path} is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise OCIError(f"registry auth file {path} is not a JSON object")
    auths = doc.get("auths", {})
    if not isinstance(auths, dict):
        raise OCIError(f"registry auth file {path}: 'auths' is not an object")
    result: dict[str, RegistryCredentials] = {}
    for key, entry in auths.items():
        where = f"registry auth file {path}, entry {_short(key, 100)}"
        try:
            registry = _auth_file_key(key)
        except ValueError:
            raise OCIError(f"{where}: the key is not a registry host or URL") from None
        if not isinstance(entry, dict):
            raise OCIError(f"{where}: the entry is not an object")
        username, password = entry.get("username"), entry.get("password")
        auth = entry.get("auth")
        if isinstance(username, str) and isinstance(password, str) and username and password:
            credentials = RegistryCredentials(username, password)
        elif auth is not None and auth != "":
            if not isinstance(auth, str):
                raise OCIError(f"{where}: 'auth' is not a string")
            try:
                decoded = base64.b64decode(auth, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                raise OCIError(f"{where}: 'auth' is not base64 of 'user:password'") from None
            user, colon, secret = decoded.partition(":")
            if not colon or not user:
                raise OCIError(f"{where}: 'auth' is not base64 of 'user:password'")
            credentials = RegistryCredentials(user, secret)
        else:
            continue
        if registry in result:
            raise OCIError(f"{where}: credentials for {registry} are listed twice")
        result[registry] = credentials
    return result


# -- WWW-Authenticate ------------------------------------------------------------------------


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def peek(self, char: str) -> bool:
        return self.text.startswith(char, self.pos)

    def skip_spaces(self) -> bool:
        start = self.pos
        while not self.at_end() and self.text[self.pos] in " \t":
            self.pos += 1
        return self.pos > start

    def skip_separators(self) -> None:
        while not self.at_end() and self.text[self.pos] in " \t,":
            self.pos += 1

    def token(self) -> str:
        start = self.pos
        while not self.at_end() and self.text[self.pos] in _TOKEN_CHARS:
            self.pos += 1
        return self.text[start : self.pos]

    def quoted(self) -> str:
        self.pos += 1  # the opening quote
        out: list[str] = []
        while not self.at_end():
            char = self.text[self.pos]
            self.pos += 1
            if char == '"':
                return "".join(out)
            if char == "\\":
                if self.at_end():
                    break
                char = self.text[self.pos]
                self.pos += 1
            out.append(char)
        raise ValueError("unterminated quoted string")

    def token68(self) -> str | None:
        """A token68 credential here, if one ends at a separator or the end."""
        match = _TOKEN68.match(self.text, self.pos)
        if match is None:
            return None
        end = match.end()
        rest = self.text[end:].lstrip(" \t")
        if rest and not rest.startswith(","):
            return None
        self.pos = end
        return match.group()


def _at_param(scanner: _Scanner) -> bool:
    """Whether ``name=value`` (not a token68 such as ``abc==``) starts here."""
    save = scanner.pos
    name = scanner.token()
    scanner.skip_spaces()
    found = False
    if name and scanner.peek("="):
        scanner.pos += 1
        scanner.skip_spaces()
        found = not scanner.at_end() and not scanner.peek("=") and not scanner.peek(",")
    scanner.pos = save
    return found


def parse_www_authenticate(header: str) -> list[tuple[str, dict[str, str]]]:
    """Parse a ``WWW-Authenticate`` value (RFC 9110 section 11.6.1).

    Returns ``(scheme, params)`` per challenge, scheme and parameter names lower-cased,
    quoted values unescaped; a token68 credential is kept under the name ``""``. Several
    challenges may share one header, separated by commas. Raises :class:`ValueError` when
    the value is malformed (a duplicate parameter, an unterminated quoted string, junk).
    """
    scanner = _Scanner(header)
    challenges: list[tuple[str, dict[str, str]]] = []
    while True:
        scanner.skip_separators()
        if scanner.at_end():
            return challenges
        scheme = scanner.token()
        if not scheme:
            raise ValueError(f"expected an authentication scheme at offset {scanner.pos}")
        params: dict[str, str] = {}
        challenges.append((scheme.lower(), params))
        if not scanner.skip_spaces():
            continue
        if not _at_param(scanner):
            credential = scanner.token68()
            if credential is not None:
                params[""] = credential
            continue
        while True:
            save = scanner.pos
            name = scanner.token()
            scanner.skip_spaces()
            if not name or not scanner.peek("="):
                scanner.pos = save  # the next challenge's scheme
                break
            scanner.pos += 1
            scanner.skip_spaces()
            if scanner.peek('"'):
                value = scanner.quoted()
            else:
                value = scanner.token()
                if not value:
                    raise ValueError(f"parameter {name!r} has no value")
            key = name.lower()
            if key in params:
                raise ValueError(f"parameter {name!r} appears twice")
            params[key] = value
            scanner.skip_spaces()
            if scanner.at_end():
                break
            if not scanner.peek(","):
                raise ValueError(f"expected ',' at offset {scanner.pos}")
            scanner.skip_separators()


# -- pulled data -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Blob:
    """A verified blob on disk."""

    digest: str
    size: int
    media_type: str
    path: Path


@dataclass(frozen=True)
class PulledImage:
    manifest_digest: str
    config: dict[str, Any]
    layers: list[Blob]


@dataclass(frozen=True)
class _Descriptor:
    media_type: str
    digest: str
    size: int
    platform: Mapping[str, Any] | None = None

    @property
    def hex(self) -> str:
        return self.digest.removeprefix("sha256:")


def _short_digest(digest: str) -> str:
    return digest[:19] + "…"


def _mib(size: int) -> str:
    return f"{size / MiB:.1f}" if size < 10 * MiB else f"{size // MiB}"


@dataclass
class _Pull:
    """Per-pull state: where the registry is and the Authorization it accepted."""

    ref: ImageRef
    base: str
    origin: tuple[str, str, int]
    authorization: str | None = None

    @property
    def where(self) -> str:
        return f"{self.ref.registry}/{self.ref.repository}"


def _origin(url: httpx2.URL) -> tuple[str, str, int]:
    port = url.port or (443 if url.scheme == "https" else 80)
    return (url.scheme, url.host.lower(), port)


# -- the client ------------------------------------------------------------------------------


class OCIClient:
    """Pulls images by digest with a borrowed ``httpx2.AsyncClient``; see the module doc."""

    def __init__(
        self,
        http: httpx2.AsyncClient,
        credentials: Mapping[str, RegistryCredentials] | None = None,
        *,
        max_manifest_bytes: int = 4 * MiB,
        max_blob_bytes: int = 2 * 1024**3,
        platform: tuple[str, str] = ("linux", "amd64"),
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self._http = http
        self._credentials: dict[str, RegistryCredentials] = {}
        for key, value in (credentials or {}).items():
            try:
                self._credentials[_auth_file_key(key)] = value
            except ValueError:
                raise OCIError(
                    f"credentials key {_short(key, 100)} is not a registry host"
                ) from None
        self._max_manifest_bytes = max_manifest_bytes
        self._max_blob_bytes = max_blob_bytes
        self._platform = platform
        self._progress = progress

    async def pull(self, ref: ImageRef, blob_dir: Path) -> PulledImage:
        """Fetch and verify ``ref``'s manifest, config and layers into ``blob_dir``."""
        host = _split_host(ref.registry)
        api = DOCKER_HUB_API if ref.registry == DOCKER_HUB else ref.registry
        scheme = "http" if is_loopback_host(host) else "https"
        base = f"{scheme}://{api}"
        pull = _Pull(ref, base, _origin(httpx2.URL(base)))
        manifest_digest, manifest = await self._resolve(pull)
        config_desc, layer_descs = self._image_parts(pull, manifest_digest, manifest)
        try:
            await trio.Path(blob_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OCIError(f"cannot create blob directory {blob_dir}: {exc.strerror}") from None
        _, config_bytes = await self._blob(pull, config_desc, blob_dir, keep=True)
        config = self._parse_config(pull, config_desc, config_bytes)
        layers = []
        for desc in layer_descs:
            blob, _ = await self._blob(pull, desc, blob_dir, keep=False)
            layers.append(blob)
        return PulledImage(manifest_digest, config, layers)

    # manifests

    async def _resolve(self, pull: _Pull) -> tuple[str, dict[str, Any]]:
        """The platform manifest (following an index) and its digest."""
        digest = pull.ref.digest
        kind, doc = await self._manifest(pull, digest)
        if kind == "index":
            entry = self._choose(pull, digest, doc)
            if entry.media_type in INDEX_TYPES:
                raise OCIError(
                    f"index {digest} in {pull.where} points at another index "
                    f"({entry.digest}) for {'/'.join(self._platform)}; nested indexes are "
                    "not supported"
                )
            digest = entry.digest
            kind, doc = await self._manifest(pull, digest)
            if kind == "index":
                raise OCIError(
                    f"manifest {digest} listed in an index in {pull.where} is itself an "
                    "index; nested indexes are not supported"
                )
        return digest, doc

    async def _manifest(self, pull: _Pull, digest: str) -> tuple[str, dict[str, Any]]:
        what = f"manifest {digest}"
        response = await self._open(pull, what, f"/manifests/{digest}", accept=ACCEPT)
        try:
            body = await self._read_capped(pull, response, what, self._max_manifest_bytes)
        finally:
            await response.aclose()
        actual = "sha256:" + hashlib.sha256(body).hexdigest()
        if actual != digest:
            raise OCIError(
                f"digest mismatch for manifest {digest} from {pull.where}: the registry "
                f"sent bytes with digest {actual}"
            )
        try:
            doc = loads_strict(body)
        except StrictJSONError as exc:
            raise OCIError(f"{what} in {pull.where} is not valid JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise OCIError(f"{what} in {pull.where} is not a JSON object")
        media_type = doc.get("mediaType")
        if not isinstance(media_type, str) or not media_type:
            header = response.headers.get("content-type", "")
            media_type = header.split(";", 1)[0].strip().lower()
        if doc.get("schemaVersion") == 1 or media_type in DOCKER_SCHEMA1:
            raise OCIError(
                f"{what} in {pull.where} is a Docker schema 1 manifest, which is not "
                "supported (push the image again with a current Docker or buildah)"
            )
        if media_type in INDEX_TYPES:
            kind = "index"
        elif media_type in MANIFEST_TYPES:
            kind = "manifest"
        else:
            raise OCIError(
                f"{what} in {pull.where} has unsupported media type {_short(media_type)}"
            )
        if doc.get("schemaVersion") != 2:
            raise OCIError(f"{what} in {pull.where} does not have schemaVersion 2")
        return kind, doc

    def _descriptor(self, pull: _Pull, value: Any, where: str) -> _Descriptor:
        if not isinstance(value, dict):
            raise OCIError(f"{where} in {pull.where}: a descriptor is not an object")
        media_type, digest, size = value.get("mediaType"), value.get("digest"), value.get("size")
        if not isinstance(media_type, str) or not media_type:
            raise OCIError(f"{where} in {pull.where}: a descriptor has no mediaType")
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise OCIError(
                f"{where} in {pull.where}: descriptor digest {_short(str(digest), 80)} is not "
                "sha256:<64 lower-case hex> (only sha256 is supported)"
            )
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise OCIError(f"{where} in {pull.where}: descriptor {digest} has no valid size")
        platform = value.get("platform")
        return _Descriptor(
            media_type, digest, size, platform if isinstance(platform, dict) else None
        )

    def _choose(self, pull: _Pull, digest: str, index: dict[str, Any]) -> _Descriptor:
        entries = index.get("manifests")
        where = f"index {digest}"
        if not isinstance(entries, list):
            raise OCIError(f"{where} in {pull.where} has no manifests list")
        wanted_os, wanted_arch = self._platform
        offered: list[str] = []
        for value in entries:
            entry = self._descriptor(pull, value, where)
            platform = entry.platform or {}
            os_name, arch = platform.get("os"), platform.get("architecture")
            if not isinstance(os_name, str) or not isinstance(arch, str):
                continue
            if (os_name, arch) == (wanted_os, wanted_arch):
                return entry
            variant = platform.get("variant")
            label = f"{os_name}/{arch}" + (f"/{variant}" if isinstance(variant, str) else "")
            if label not in offered:
                offered.append(label)
        raise OCIError(
            f"{where} in {pull.where} has no image for {wanted_os}/{wanted_arch}; it offers "
            f"{', '.join(offered) if offered else 'no platforms'}"
        )

    def _image_parts(
        self, pull: _Pull, digest: str, manifest: dict[str, Any]
    ) -> tuple[_Descriptor, list[_Descriptor]]:
        where = f"manifest {digest}"
        config = self._descriptor(pull, manifest.get("config"), where)
        if config.media_type not in CONFIG_TYPES:
            raise OCIError(
                f"{where} in {pull.where} is not a container image: config media type "
                f"{_short(config.media_type, 100)}"
            )
        if config.size > MAX_CONFIG_BYTES:
            raise OCIError(
                f"{where} in {pull.where}: the image config is {config.size} bytes, more "
                f"than {MAX_CONFIG_BYTES}"
            )
        layers = manifest.get("layers")
        if not isinstance(layers, list):
            raise OCIError(f"{where} in {pull.where} has no layers list")
        if len(layers) > MAX_LAYERS:
            raise OCIError(f"{where} in {pull.where} has more than {MAX_LAYERS} layers")
        descs = [self._descriptor(pull, layer, where) for layer in layers]
        for desc in descs:
            if desc.size > self._max_blob_bytes:
                raise OCIError(
                    f"layer {desc.digest} in {pull.where} is {desc.size} bytes, more than the "
                    f"limit of {self._max_blob_bytes}"
                )
        return config, descs

    def _parse_config(self, pull: _Pull, desc: _Descriptor, body: bytes) -> dict[str, Any]:
        try:
            config = loads_strict(body)
        except StrictJSONError as exc:
            raise OCIError(
                f"image config {desc.digest} in {pull.where} is not valid JSON ({exc})"
            ) from None
        if not isinstance(config, dict):
            raise OCIError(f"image config {desc.digest} in {pull.where} is not a JSON object")
        wanted_os, wanted_arch = self._platform
        os_name, arch = config.get("os"), config.get("architecture")
        if (isinstance(os_name, str) and os_name != wanted_os) or (
            isinstance(arch, str) and arch != wanted_arch
        ):
            raise OCIError(
                f"image {pull.ref} is for {os_name}/{arch}, not {wanted_os}/{wanted_arch}"
            )
        return config

    # blobs

    async def _blob(
        self, pull: _Pull, desc: _Descriptor, blob_dir: Path, *, keep: bool
    ) -> tuple[Blob, bytes]:
        """Download (or reuse) one blob; its bytes too when ``keep`` (the config), else b""."""
        final = blob_dir / desc.hex
        blob = Blob(desc.digest, desc.size, desc.media_type, final)
        short, total = _short_digest(desc.digest), _mib(desc.size)
        if desc.size > self._max_blob_bytes:
            raise OCIError(
                f"blob {desc.digest} in {pull.where} is {desc.size} bytes, more than the "
                f"limit of {self._max_blob_bytes}"
            )
        try:
            try:
                existing = await trio.Path(final).lstat()
            except FileNotFoundError:
                existing = None
            if (
                existing is not None
                and stat.S_ISREG(existing.st_mode)
                and existing.st_size == desc.size
            ):
                self._report(f"already have {short} ({total} MiB)")
                return blob, (await trio.Path(final).read_bytes() if keep else b"")
            self._report(f"pulling {short} ({total} MiB)")
            fd, temp_name = tempfile.mkstemp(
                prefix=f".{desc.hex[:16]}.", suffix=".partial", dir=blob_dir
            )
            temp = Path(temp_name)
            try:
                with os.fdopen(fd, "wb") as out:
                    kept = await self._stream_blob(pull, desc, out, keep=keep)
                await trio.to_thread.run_sync(os.replace, temp, final)
            except BaseException:
                temp.unlink(missing_ok=True)  # noqa: ASYNC240 (one unlink, also when cancelled)
                raise
        except OSError as exc:
            raise OCIError(
                f"cannot store blob {desc.digest} of {pull.where} in {blob_dir}: {exc.strerror}"
            ) from None
        self._report(f"pulled {short} ({total} MiB)")
        return blob, kept

    async def _stream_blob(
        self, pull: _Pull, desc: _Descriptor, out: BinaryIO, *, keep: bool
    ) -> bytes:
        what = f"blob {desc.digest}"
        response = await self._open(pull, what, f"/blobs/{desc.digest}", accept=None)
        hasher = hashlib.sha256()
        size = 0
        pending = bytearray()
        kept = bytearray() if keep else None
        next_report = PROGRESS_INTERVAL
        too_big = (
            f"{what} from {pull.where} is larger than the {desc.size} bytes its manifest says; "
            "refusing it"
        )
        try:
            declared = response.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > desc.size:
                raise OCIError(too_big)
            try:
                async for chunk in response.aiter_raw():
                    size += len(chunk)
                    if size > desc.size:
                        raise OCIError(too_big)
                    hasher.update(chunk)
                    pending += chunk
                    if kept is not None:
                        kept += chunk
                    if len(pending) >= WRITE_CHUNK:
                        await trio.to_thread.run_sync(out.write, bytes(pending))
                        pending.clear()
                    if size >= next_report:
                        self._report(
                            f"pulling {_short_digest(desc.digest)} {_mib(size)}/"
                            f"{_mib(desc.size)} MiB"
                        )
                        next_report += PROGRESS_INTERVAL
            except httpx2.HTTPError as exc:
                raise self._transport_error(pull, what, exc) from None
        finally:
            await response.aclose()
        if size != desc.size:
            raise OCIError(f"{what} from {pull.where} was cut short: {size} of {desc.size} bytes")
        actual = "sha256:" + hasher.hexdigest()
        if actual != desc.digest:
            raise OCIError(
                f"digest mismatch for {what} from {pull.where}: the registry sent bytes with "
                f"digest {actual}"
            )

        def finish() -> None:
            out.write(bytes(pending))
            out.flush()
            os.fsync(out.fileno())

        await trio.to_thread.run_sync(finish)
        return bytes(kept) if kept is not None else b""

    def _report(self, message: str) -> None:
        if self._progress is not None:
            self._progress(message)

    # HTTP

    async def _read_capped(
        self, pull: _Pull, response: httpx2.Response, what: str, limit: int
    ) -> bytes:
        too_big = f"{what} from {pull.where} is larger than {limit} bytes"
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise OCIError(too_big)
        body = bytearray()
        try:
            async for chunk in response.aiter_raw():
                body += chunk
                if len(body) > limit:
                    raise OCIError(too_big)
        except httpx2.HTTPError as exc:
            raise self._transport_error(pull, what, exc) from None
        return bytes(body)

    def _transport_error(self, pull: _Pull, what: str, exc: Exception) -> OCIError:
        detail = str(exc).splitlines()[0][:200] if str(exc) else ""
        kind = type(exc).__name__ + (f": {detail}" if detail else "")
        return OCIError(f"registry {pull.ref.registry} unreachable while fetching {what} ({kind})")

    async def _send(
        self, pull: _Pull, what: str, url: httpx2.URL | str, headers: dict[str, str]
    ) -> httpx2.Response:
        try:
            request = self._http.build_request("GET", url, headers=headers)
            return await self._http.send(request, stream=True, follow_redirects=False, auth=None)
        except httpx2.HTTPError as exc:
            raise self._transport_error(pull, what, exc) from None
        except httpx2.InvalidURL as exc:
            raise OCIError(f"bad URL while fetching {what} from {pull.where} ({exc})") from None

    async def _open(
        self, pull: _Pull, what: str, path: str, *, accept: str | None
    ) -> httpx2.Response:
        """A streaming 2xx response for ``/v2/<repo><path>`` (auth and redirects handled)."""
        url = httpx2.URL(f"{pull.base}/v2/{pull.ref.repository}{path}")
        headers = {"Accept-Encoding": "identity"}
        if accept is not None:
            headers["Accept"] = accept

        def with_auth(target: httpx2.URL) -> dict[str, str]:
            if pull.authorization is not None and _origin(target) == pull.origin:
                return {**headers, "Authorization": pull.authorization}
            return headers

        response = await self._send(pull, what, url, with_auth(url))
        if response.status_code == 401:
            challenge = ", ".join(response.headers.get_list("www-authenticate"))
            await response.aclose()
            await self._authenticate(pull, challenge)
            response = await self._send(pull, what, url, with_auth(url))
            if response.status_code == 401:
                await response.aclose()
                raise self._refused(pull, 401, "the registry did not accept the credentials")
        hops = 0
        while response.status_code in REDIRECT_STATUSES:
            location = response.headers.get("location")
            current = response.url
            await response.aclose()
            hops += 1
            if hops > MAX_REDIRECTS:
                raise OCIError(f"too many redirects fetching {what} from {pull.where}")
            if not location:
                raise OCIError(f"redirect without Location fetching {what} from {pull.where}")
            try:
                target = current.join(location)
            except httpx2.InvalidURL:
                raise OCIError(f"bad redirect fetching {what} from {pull.where}") from None
            allowed = target.scheme == "https" or (
                target.scheme == "http"
                and pull.origin[0] == "http"
                and is_loopback_host(target.host)
            )
            if not allowed:
                raise OCIError(
                    f"refusing a redirect to {target.scheme}://{target.host} while fetching "
                    f"{what} from {pull.where} (https is required)"
                )
            response = await self._send(pull, what, target, with_auth(target))
        if 200 <= response.status_code < 300:
            return response
        status = response.status_code
        await response.aclose()
        if status == 404:
            raise OCIError(
                f"{what} not found in registry {pull.ref.registry} "
                f"(repository {pull.ref.repository})"
            )
        if status in (401, 403):
            raise self._refused(pull, status, "access denied")
        raise OCIError(f"registry {pull.ref.registry} answered {status} for {what} in {pull.where}")

    def _refused(self, pull: _Pull, status: int, reason: str) -> OCIError:
        has = pull.ref.registry in self._credentials
        creds = (
            f"credentials for {pull.ref.registry} were used"
            if has
            else f"no credentials configured for {pull.ref.registry}"
        )
        return OCIError(
            f"registry {pull.ref.registry} refused access ({status}) to "
            f"{pull.ref.repository}: {reason}; {creds}"
        )

    async def _authenticate(self, pull: _Pull, challenge: str) -> None:
        """Answer a 401 challenge: sets ``pull.authorization`` or raises."""
        try:
            challenges = parse_www_authenticate(challenge)
        except ValueError as exc:
            raise self._refused(
                pull, 401, f"unreadable WWW-Authenticate challenge ({exc})"
            ) from None
        schemes = dict(reversed(challenges))
        credentials = self._credentials.get(pull.ref.registry)
        if "bearer" in schemes:
            token = await self._token(pull, schemes["bearer"], credentials)
            pull.authorization = f"Bearer {token}"
        elif "basic" in schemes:
            if credentials is None:
                raise self._refused(pull, 401, "the registry wants a user name and password")
            pull.authorization = _basic(credentials)
        else:
            offered = ", ".join(sorted(schemes)) or "none"
            raise self._refused(pull, 401, f"unsupported authentication scheme ({offered})")

    async def _token(
        self, pull: _Pull, params: dict[str, str], credentials: RegistryCredentials | None
    ) -> str:
        realm = params.get("realm")
        if not realm:
            raise self._refused(pull, 401, "the bearer challenge names no realm")
        try:
            url = httpx2.URL(realm)
        except httpx2.InvalidURL:
            raise self._refused(pull, 401, "the bearer challenge's realm is not a URL") from None
        realm_host = f"{url.scheme}://{url.host}" + (f":{url.port}" if url.port else "")
        if not (url.scheme == "https" or (url.scheme == "http" and is_loopback_host(url.host))):
            raise self._refused(
                pull, 401, f"token realm {_short(realm_host, 100)} is not https://; refusing it"
            )
        query = {"scope": f"repository:{pull.ref.repository}:pull"}
        if params.get("service"):
            query["service"] = params["service"]
        headers = {"Accept-Encoding": "identity"}
        if credentials is not None:
            headers["Authorization"] = _basic(credentials)
        what = f"a token from {realm_host}"
        response = await self._send(pull, what, url.copy_merge_params(query), headers)
        try:
            if response.status_code != 200:
                reason = f"the token service at {realm_host} answered {response.status_code}" + (
                    " (credentials rejected)"
                    if credentials and response.status_code in (401, 403)
                    else ""
                )
                raise self._refused(pull, 401, reason)
            body = await self._read_capped(pull, response, what, MAX_TOKEN_RESPONSE_BYTES)
        finally:
            await response.aclose()
        try:
            doc = loads_strict(body)
        except StrictJSONError:
            doc = None
        token = None
        if isinstance(doc, dict):
            token = doc.get("token") or doc.get("access_token")
        if not isinstance(token, str) or not _TOKEN_VALUE.fullmatch(token):
            raise self._refused(
                pull, 401, f"the token service at {realm_host} sent no usable token"
            )
        return token


def _basic(credentials: RegistryCredentials) -> str:
    raw = f"{credentials.username}:{credentials.password}".encode()
    return "Basic " + base64.b64encode(raw).decode("ascii")
