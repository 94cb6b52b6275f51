"""The registry installer: install, upgrade and uninstall servers from the signed index.

Install (``POST /api/servers/install``), in order, one install or uninstall at a time:

1. Fetch the index and its detached signature (``SVC_REGISTRY_INDEX``/``_SIG``), verify the
   signature over the exact bytes against the pinned keys, and only then parse it
   (THREATS F1). An expired index, a version lower than the last one accepted, or the same
   version with different bytes is refused (F2); the last accepted version and digest live in
   the database (``registry_state``), outside the image store.
2. Resolve the ref (``name@version``; a bare name is the newest release) and refuse a name
   the gateway's own configuration defines.
3. An upgrade (the server is installed at another version, or the same version with another
   manifest) is refused when the new manifest widens permissions (more egress hosts, a new or
   wider credential, new environment, higher limits, more tools on by default) unless the
   admin approves with ``approve_permissions: true``; the refusal lists every change (F4).
4. Pull the image by digest (:mod:`.oci`, every blob verified while streaming, F3), unpack it
   into the content-addressed image store (:mod:`sandbox.images`: whiteouts, no devices, no
   traversal, no setuid bits, size caps) and decide its run spec
   (:func:`.installed.runtime_spec`).
5. Commit the server row, its release and the ``server_install`` audit event in one
   transaction; then refresh the daemon's catalogue, tear down the runtimes that ran the old
   version, and garbage-collect image content no server references.

Any failure is :class:`InstallError` (the API's 502 ``install_failed``) with a message for the
admin, and leaves nothing half-installed: the database changes only in step 5, a pulled but
unreferenced image is collected before the error is raised, and pull directories are removed.
Progress of large pulls and unpacks is logged.

Uninstall (``DELETE /api/servers/{name}``): delete the server row (profile assignments and
the release go with it, by foreign key) and write ``server_uninstall`` in one transaction,
tear down every runtime that ran it, then collect its image. A second call finds no row and
retries only the cleanup, so it is idempotent; a cleanup failure is :class:`UninstallError`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import httpx2
import trio

from sandbox.images import ImageError, ImageStore, Layer, UnpackLimits
from svcgate import audit
from svcgate.clock import now_iso
from svcgate.registry import signing
from svcgate.registry.config import RegistrySettings, check_location
from svcgate.registry.index import (
    MAX_INDEX_BYTES,
    IndexFormatError,
    RefError,
    RegistryIndex,
    Release,
    parse_index,
    parse_ref,
    widening,
)
from svcgate.registry.installed import (
    InstalledCatalogue,
    InstalledServer,
    RunSpecError,
    load_installed,
    read_installed,
    referenced_digests,
    runtime_spec,
)
from svcgate.registry.oci import OCIClient, OCIError, RegistryCredentials, load_auth_file
from svcgate.runtime_hooks import RuntimeInvalidator
from svcgate.store import Store

log = logging.getLogger(__name__)

FETCH_TIMEOUT = 30.0
_PROGRESS_STEP = 64 * 1024 * 1024


class InstallError(Exception):
    """The install failed; ``str()`` is the message for the admin (no secrets)."""


class UninstallError(Exception):
    """The uninstall's cleanup failed; re-running the uninstall retries it."""


@dataclass(frozen=True)
class FetchedIndex:
    index: RegistryIndex
    sha256: str
    keyid: str


def check_fresh(conn: sqlite3.Connection, fetched: FetchedIndex, now: datetime) -> None:
    """Refuse an expired or rolled-back index, else record it as the last accepted one."""
    index = fetched.index
    if index.expires <= now:
        raise InstallError(
            f"the registry index (version {index.version}) expired at "
            f"{index.expires.isoformat()}; the index operator must publish a fresh one"
        )
    row = conn.execute("SELECT version, sha256 FROM registry_state WHERE id = 1").fetchone()
    if row is not None:
        if index.version < row["version"]:
            raise InstallError(
                f"the registry index is version {index.version}, older than version "
                f"{row['version']} accepted before: refusing a rollback"
            )
        if index.version == row["version"]:
            if fetched.sha256 != row["sha256"]:
                raise InstallError(
                    f"the registry index version {index.version} differs from the version "
                    f"{index.version} accepted before: a re-signed index needs a new version"
                )
            return
    conn.execute(
        "INSERT INTO registry_state (id, version, sha256, expires, accepted_at)"
        " VALUES (1, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET version = excluded.version,"
        " sha256 = excluded.sha256, expires = excluded.expires,"
        " accepted_at = excluded.accepted_at",
        (index.version, fetched.sha256, index.expires.isoformat(), now_iso()),
    )


def registry_status(conn: sqlite3.Connection) -> dict[str, Any] | None:
    row = conn.execute("SELECT version, expires, accepted_at FROM registry_state").fetchone()
    return dict(row) if row is not None else None


class Installer:
    """See the module docstring. Built by the daemon when ``SVC_REGISTRY_*`` is set."""

    def __init__(
        self,
        settings: RegistrySettings,
        *,
        store: Store,
        images: ImageStore,
        catalogue: InstalledCatalogue,
        configured: Callable[[str], bool],
        runtimes: RuntimeInvalidator,
        http: httpx2.AsyncClient,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.settings = settings
        self._store = store
        self._images = images
        self._catalogue = catalogue
        self._configured = configured
        self._runtimes = runtimes
        self._http = http
        self._clock = clock
        self._lock = trio.Lock()
        self._keys = [signing.parse_public_key(key) for key in settings.keys]
        self._credentials: dict[str, RegistryCredentials] = {}
        if settings.auth_file is not None:
            self._credentials = load_auth_file(settings.auth_file)

    # -- the index ---------------------------------------------------------------------------

    async def _get(self, url: str, limit: int, what: str) -> bytes:
        parts = urlsplit(url)
        if parts.scheme == "file":
            path = trio.Path(parts.path)
            try:
                async with await path.open("rb") as handle:
                    data = await handle.read(limit + 1)
            except OSError as exc:
                raise InstallError(f"cannot read the {what} at {url} ({exc.strerror})") from None
        else:
            try:
                with trio.fail_after(FETCH_TIMEOUT):
                    async with self._http.stream("GET", url, follow_redirects=True) as response:
                        final = str(response.url)
                        try:
                            check_location("redirect", final)
                        except ValueError:
                            raise InstallError(
                                f"the {what} at {url} redirects to a location that is not "
                                "https:// or loopback http://"
                            ) from None
                        if response.status_code != 200:
                            raise InstallError(
                                f"fetching the {what} at {url} answered HTTP {response.status_code}"
                            )
                        chunks: list[bytes] = []
                        size = 0
                        async for chunk in response.aiter_bytes():
                            chunks.append(chunk)
                            size += len(chunk)
                            if size > limit:
                                break
                        data = b"".join(chunks)
            except trio.TooSlowError:
                raise InstallError(f"fetching the {what} at {url} timed out") from None
            except httpx2.HTTPError as exc:
                raise InstallError(
                    f"cannot fetch the {what} at {url} ({type(exc).__name__})"
                ) from None
        if len(data) > limit:
            raise InstallError(f"the {what} at {url} is larger than {limit} bytes")
        return data

    async def fetch_index(self) -> FetchedIndex:
        """Fetch, verify (before parsing), parse and freshness-check the index."""
        settings = self.settings
        data = await self._get(settings.index_url, MAX_INDEX_BYTES, "registry index")
        signature = await self._get(
            settings.signature_url, signing.MAX_SIGNATURE_FILE, "index signature"
        )
        try:
            key = signing.verify(data, signature, self._keys)
        except signing.SignatureError as exc:
            raise InstallError(f"the registry index is refused: {exc}") from None
        try:
            index = parse_index(data)
        except IndexFormatError as exc:
            raise InstallError(f"the registry index is malformed: {exc}") from None
        fetched = FetchedIndex(index, hashlib.sha256(data).hexdigest(), key.keyid)
        now = self._clock()
        await self._store.write(lambda conn: check_fresh(conn, fetched, now))
        return fetched

    # -- install -----------------------------------------------------------------------------

    async def install(self, ref: str, *, actor: int, approve: bool = False) -> dict[str, Any]:
        """Install or upgrade; returns the server for the API. Raises ``RefError`` for bad
        syntax (400) and :class:`InstallError` for everything else (502)."""
        name, version = parse_ref(ref)
        async with self._lock:
            try:
                return await self._install(name, version, actor=actor, approve=approve)
            except OSError as exc:  # the image directory: full disk, permissions
                raise InstallError(
                    f"installing {name} failed on this host: {exc.strerror or exc}"
                ) from None
            finally:
                with trio.CancelScope(shield=True):
                    await self._collect()

    async def _install(
        self, name: str, version: str | None, *, actor: int, approve: bool
    ) -> dict[str, Any]:
        if self._configured(name):
            raise InstallError(
                f"{name!r} is defined by this gateway's configuration (SVC_ECHO_BIN or "
                "SVC_SERVERS_FILE) and cannot be installed from the registry"
            )
        fetched = await self.fetch_index()
        try:
            release = fetched.index.resolve(name, version)
        except LookupError as exc:
            raise InstallError(str(exc)) from None
        existing = await self._store.read(partial(read_installed, name=name))
        if existing is not None and self._unchanged(existing, release):
            return existing.to_api()
        changes: list[str] = []
        if existing is not None:
            changes = widening(existing.manifest, release.manifest)
            if changes and not approve:
                raise InstallError(
                    f"upgrading {name} from {existing.version} to {release.version} widens its "
                    f"permissions: {'; '.join(changes)}. Nothing was changed; an admin can "
                    'approve by repeating the install with "approve_permissions": true'
                )
        digest, run = await self._fetch_image(release)
        server = await self._store.write(
            partial(
                self._record,
                release=release,
                digest=digest,
                run=run,
                index_version=fetched.index.version,
                actor=actor,
                previous=existing,
                approved=changes,
            )
        )
        await self._refresh_catalogue()
        await self._runtimes.invalidate_server(name, reason=f"server {name} installed")
        log.info(
            "installed %s %s (%s) from index version %d",
            name,
            release.version,
            digest,
            fetched.index.version,
        )
        return server.to_api()

    def _unchanged(self, existing: InstalledServer, release: Release) -> bool:
        return (
            existing.version == release.version
            and existing.image == str(release.image)
            and existing.manifest == release.manifest
            and self._images.has(existing.image_digest)
        )

    async def _fetch_image(self, release: Release) -> tuple[str, Any]:
        label = f"{release.name}@{release.version}"
        pull_dir = self._images.root / "tmp" / f"pull-{secrets.token_hex(8)}"
        await trio.Path(pull_dir).mkdir(mode=0o700, parents=True)
        try:
            client = OCIClient(
                self._http,
                self._credentials,
                max_blob_bytes=self.settings.max_image_bytes,
                progress=lambda message: log.info("install %s: %s", label, message),
            )
            try:
                pulled = await client.pull(release.image, pull_dir)
            except OCIError as exc:
                raise InstallError(f"pulling {release.image} failed: {exc}") from None
            try:
                run = runtime_spec(pulled.config, release.manifest)
            except RunSpecError as exc:
                raise InstallError(f"{label}: {exc}") from None
            layers = [Layer(blob.path, blob.media_type) for blob in pulled.layers]
            limits = UnpackLimits(max_bytes=self.settings.max_image_bytes)
            marks: dict[int, int] = {}

            def progress(layer: int, done: int) -> None:
                if done - marks.get(layer, 0) >= _PROGRESS_STEP:
                    marks[layer] = done
                    log.info(
                        "install %s: unpacking layer %d/%d, %d MiB",
                        label,
                        layer + 1,
                        len(layers),
                        done // (1024 * 1024),
                    )

            try:
                await trio.to_thread.run_sync(
                    partial(self._images.add, pulled.manifest_digest, layers, limits, progress)
                )
            except ImageError as exc:
                raise InstallError(f"unpacking {release.image} failed: {exc}") from None
            return pulled.manifest_digest, run
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(partial(shutil.rmtree, pull_dir, ignore_errors=True))

    def _record(
        self,
        conn: sqlite3.Connection,
        *,
        release: Release,
        digest: str,
        run: Any,
        index_version: int,
        actor: int,
        previous: InstalledServer | None,
        approved: list[str],
    ) -> InstalledServer:
        now = now_iso()
        conn.execute(
            "INSERT INTO servers (name, created_at) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
            (release.name, now),
        )
        server_id = conn.execute(
            "SELECT id FROM servers WHERE name = ?", (release.name,)
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO installed_servers (server_id, version, image, image_digest, manifest,"
            " runtime, index_version, installed_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (server_id) DO UPDATE SET"
            " version = excluded.version, image = excluded.image,"
            " image_digest = excluded.image_digest, manifest = excluded.manifest,"
            " runtime = excluded.runtime, index_version = excluded.index_version,"
            " updated_at = excluded.updated_at",
            (
                server_id,
                release.version,
                str(release.image),
                digest,
                json.dumps(release.manifest_json, sort_keys=True),
                run.to_json(),
                index_version,
                now,
                now,
            ),
        )
        detail = f"{release.name}@{release.version} {digest} (index version {index_version})"
        if previous is not None and previous.version != release.version:
            detail += f"; upgraded from {previous.version}"
        elif previous is not None:
            detail += "; reinstalled"
        if approved:
            detail += "; approved: " + "; ".join(approved)
        audit.record(
            conn,
            kind="admin",
            decision="server_install",
            user_id=actor,
            server=release.name,
            detail=detail,
        )
        installed = read_installed(conn, release.name)
        assert installed is not None
        return installed

    async def install_missing(self, refs: tuple[str, ...]) -> None:
        """``SVC_REGISTRY_INSTALL``: install each ref whose server is not installed yet."""
        for ref in refs:
            try:
                name, _ = parse_ref(ref)
                if self._catalogue.get(name) is not None or self._configured(name):
                    continue
                server = await self.install(ref, actor=0)
            except (RefError, InstallError) as exc:
                log.error("SVC_REGISTRY_INSTALL: %s: %s", ref, exc)
                continue
            log.info("SVC_REGISTRY_INSTALL: installed %s %s", server["name"], server["version"])

    # -- uninstall ---------------------------------------------------------------------------

    async def uninstall(self, name: str, *, actor: int) -> bool:
        """Remove ``name`` (see the module docstring); True if a row was removed."""
        async with self._lock:
            removed = await self._store.write(partial(remove_server, name=name, actor=actor))
            await self._refresh_catalogue()
            await self._runtimes.invalidate_server(name, reason=f"server {name} uninstalled")
            try:
                await self._collect(strict=True)
            except (OSError, ImageError) as exc:
                raise UninstallError(
                    f"{name} was removed, but its image could not be deleted ({exc}); "
                    "repeat the uninstall to retry"
                ) from None
            return removed

    # -- shared ------------------------------------------------------------------------------

    async def _refresh_catalogue(self) -> None:
        self._catalogue.replace(await self._store.read(load_installed))

    async def _collect(self, *, strict: bool = False) -> None:
        """Remove image content no installed server references."""
        await collect_images(
            self._images, await self._store.read(referenced_digests), strict=strict
        )


async def collect_images(images: ImageStore, keep: set[str], *, strict: bool = False) -> None:
    """Delete every stored image not in ``keep``; failures raise only when ``strict``."""
    try:
        removed = await trio.to_thread.run_sync(images.gc, keep)
    except (OSError, ImageError) as exc:
        if strict:
            raise
        log.warning("image garbage collection failed: %s", exc)
        return
    for digest in removed:
        log.info("image %s removed (no installed server uses it)", digest)


def remove_server(conn: sqlite3.Connection, *, name: str, actor: int) -> bool:
    row = conn.execute("SELECT id FROM servers WHERE name = ?", (name,)).fetchone()
    if row is None:
        return False
    installed = conn.execute(
        "SELECT version, image_digest FROM installed_servers WHERE server_id = ?", (row["id"],)
    ).fetchone()
    profiles = conn.execute(
        "SELECT COUNT(*) FROM profile_servers WHERE server_id = ?", (row["id"],)
    ).fetchone()[0]
    conn.execute("DELETE FROM servers WHERE id = ?", (row["id"],))
    detail = f"{name}@{installed['version']}" if installed is not None else f"{name} (configured)"
    audit.record(
        conn,
        kind="admin",
        decision="server_uninstall",
        user_id=actor,
        server=name,
        detail=f"{detail}; removed from {profiles} profile(s)",
    )
    return True


async def load_catalogue(store: Store, images: ImageStore, catalogue: InstalledCatalogue) -> None:
    """At start: load installed servers, warn about missing images, collect unused ones."""
    installed = await store.read(load_installed)
    catalogue.replace(installed)
    for server in installed.values():
        if not images.has(server.image_digest):
            log.warning(
                "installed server %s %s: its image %s is missing from %s; reinstall it",
                server.name,
                server.version,
                server.image_digest,
                images.root,
            )
    await collect_images(images, {server.image_digest for server in installed.values()})
