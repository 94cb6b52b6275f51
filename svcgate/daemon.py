"""The daemon: the root of the nursery tree (drawn in docs/architecture.md).

Resource handling: ``run_daemon`` opens, in order, the HTTP client used for OIDC, the
identity provider's discovery, the store, the egress audit sink (closed last: it writes
every buffered egress decision before the store closes), and then the root nursery, which
starts the sandbox supervisor (each sandbox with its egress listener), the operator control
socket, the Prometheus listener (``SVC_METRICS_LISTEN``) and the HTTP server, each with
``nursery.start`` (ready before the next one starts). SIGTERM/SIGINT trigger Hypercorn's
graceful shutdown: the listener closes, in-flight requests get up to ``GRACEFUL_TIMEOUT``
seconds to finish (sandboxes keep running meanwhile); then the root nursery is cancelled,
which stops every sandbox and removes the control socket, the store closes and the process
exits 0.

Error handling: a configuration problem found at start-up (unreachable identity provider,
unusable data directory, a host that cannot run sandboxes, a control socket in use) raises
:class:`StartupError` with one line for the operator.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import stat
import sys
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import cast

import httpx2
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from sandbox.images import ImageError, ImageStore
from svcgate import servers
from svcgate.api.app import create_api_app
from svcgate.api.context import Services
from svcgate.asgi_io import ASGIApp
from svcgate.data_plane import DataPlane
from svcgate.egress.addresses import IPAddress
from svcgate.egress.audit_sink import open_audit_sink
from svcgate.egress.ca import CAError, GatewayCA
from svcgate.egress.local_addrs import own_addresses
from svcgate.egress.service import EgressService, ca_directory
from svcgate.front import Front
from svcgate.health import Readiness, identity_provider_probe, store_probe
from svcgate.logs import configure_logging
from svcgate.metrics import Metrics, serve_metrics
from svcgate.oidc import FlowRegistry, OidcClient, OidcError
from svcgate.operator_socket import ControlSocketError, OperatorContext, serve_control_socket
from svcgate.registry.installed import InstalledCatalogue
from svcgate.registry.installer import Installer, load_catalogue
from svcgate.runtime import TEARDOWN_DEADLINE, RuntimeManager
from svcgate.sdnotify import Notifier
from svcgate.server_defs import ConfiguredServers
from svcgate.settings import Settings
from svcgate.store import Store, StoreOpenError, open_store
from svcgate.supervisor import SandboxSupervisor, SupervisorConfig, SupervisorStartError
from svcgate.vault import Vault, VaultError, load_key_file

log = logging.getLogger(__name__)

GRACEFUL_TIMEOUT = 20.0
DB_NAME = "svcgate.db"


class StartupError(Exception):
    """The daemon cannot start; ``str()`` is one line for the operator."""


def _hypercorn_config(settings: Settings) -> Config:
    config = Config()
    host = settings.listen_host
    bind_host = f"[{host}]" if ":" in host else host
    config.bind = [f"{bind_host}:{settings.listen_port}"]
    config.graceful_timeout = GRACEFUL_TIMEOUT
    config.accesslog = None  # access logs would carry query strings; A3 forbids token leaks
    config.errorlog = logging.getLogger("hypercorn.error")
    config.keep_alive_timeout = 75
    config.h11_max_incomplete_size = 16 * 1024
    config.include_server_header = False
    return config


def prepare_data_dir(settings: Settings) -> None:
    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        mode = settings.data_dir.stat().st_mode & 0o777
        if mode & 0o077:
            # The database and the vault key live here: no access for group or others.
            log.warning("SVC_DATA_DIR had mode %04o; tightening it to 0700", mode)
            settings.data_dir.chmod(0o700)
    except OSError as exc:
        raise StartupError(
            f"SVC_DATA_DIR: cannot prepare {str(settings.data_dir)!r} ({exc.strerror})"
        ) from exc


async def run_daemon(settings: Settings, *, on_ready: Callable[[list[str]], None]) -> None:
    """Run until SIGTERM/SIGINT. ``on_ready`` receives the bound URLs once serving."""
    prepare_data_dir(settings)
    try:
        vault = Vault(
            load_key_file(settings.vault_key_file, create=settings.vault_key_create),
            settings.vault_key_file,
        )
    except VaultError as exc:
        raise StartupError(f"SVC_VAULT_KEY_FILE: {exc}") from exc
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with httpx2.AsyncClient(timeout=10.0, follow_redirects=False) as http:
            oidc: OidcClient | None = None
            if settings.oidc is not None:
                try:
                    oidc = await OidcClient.discover(settings.oidc, http)
                except OidcError as exc:
                    raise StartupError(f"SVC_OIDC_ISSUER: {exc}") from exc
                log.info("OIDC provider %s discovered", oidc.metadata.issuer)
            async with open_store(settings.data_dir / DB_NAME) as store:
                configured = list(settings.local_servers)
                if settings.echo_bin is not None:
                    configured.append(servers.LEGACY_SERVER)
                await store.write(lambda conn: servers.ensure_server_rows(conn, configured))
                images = await open_image_store(settings)
                catalogue = InstalledCatalogue(images)
                await load_catalogue(store, images, catalogue)
                configured_servers = ConfiguredServers(settings, catalogue)
                ca, own = prepare_egress(settings)
                try:
                    metrics = Metrics()
                    async with open_audit_sink(store, metrics) as sink:
                        egress = EgressService(
                            settings.egress,
                            store=store,
                            vault=vault,
                            sink=sink,
                            ca=ca,
                            server_rules=configured_servers.egress_rules,
                            own_addresses=own,
                            self_ports=_own_ports(settings),
                        )
                        supervisor = SandboxSupervisor(
                            SupervisorConfig(state_dir=settings.sandbox_dir), egress=egress
                        )
                        runtimes = RuntimeManager(store, supervisor, configured_servers)
                        metrics.watch(runtimes, supervisor)
                        installer: Installer | None = None
                        if settings.registry is not None:
                            installer = Installer(
                                settings.registry,
                                store=store,
                                images=images,
                                catalogue=catalogue,
                                configured=configured_servers.configured,
                                runtimes=runtimes,
                                http=http,
                            )
                            log.info(
                                "registry installer ready: index %s, %d trusted key(s)",
                                settings.registry.index_url,
                                len(settings.registry.keys),
                            )
                        front = Front(
                            _api_app(settings, store, oidc, runtimes, vault, installer),
                            DataPlane(settings.bearer_token, store, runtimes, settings.mcp_origins),
                            readiness=Readiness(
                                store_probe(store.path),
                                None
                                if settings.oidc is None
                                else identity_provider_probe(settings.oidc, http),
                            ),
                            metrics=metrics,
                        )
                        operator = OperatorContext(
                            directory=supervisor,
                            settings=settings,
                            store=store,
                            runtimes=runtimes,
                            vault=vault,
                            http=http,
                        )
                        await _serve_until_signal(
                            front,
                            settings,
                            supervisor,
                            runtimes,
                            signals,
                            on_ready,
                            installer,
                            metrics=metrics,
                            operator=operator,
                        )
                except BaseExceptionGroup as group:
                    # A service that fails before it is ready fails inside a nursery.
                    startup, _ = group.split(StartupError)
                    if startup is None:
                        raise
                    raise _first_leaf(startup) from group
    log.info("svcgate stopped")


def _api_app(
    settings: Settings,
    store: Store,
    oidc: OidcClient | None,
    runtimes: RuntimeManager,
    vault: Vault,
    installer: Installer | None,
) -> ASGIApp | None:
    if oidc is None:
        log.warning("OIDC is not configured: the control plane (/api/) is disabled")
        return None
    services = Services(
        settings=settings,
        store=store,
        oidc=oidc,
        flow_key=secrets.token_bytes(32),
        flows=FlowRegistry(),
        runtimes=runtimes,
        vault=vault,
        installer=installer,
    )
    # Quart types its ASGI signature with hypercorn's TypedDicts; ours are plain.
    return cast(ASGIApp, create_api_app(services))


async def open_image_store(settings: Settings) -> ImageStore:
    """The unpacked-image store; its parents must be searchable by the sandbox uid."""
    root = settings.image_dir
    try:
        images = await trio.to_thread.run_sync(ImageStore, root)
    except (OSError, ImageError) as exc:
        raise StartupError(f"SVC_IMAGE_DIR: cannot prepare {str(root)!r} ({exc})") from exc
    closed = [
        str(parent) for parent in (root, *root.parents) if not parent.stat().st_mode & stat.S_IXOTH
    ]
    if closed:
        problem = (
            f"SVC_IMAGE_DIR: {closed[0]} is not searchable by other users, so sandboxes "
            "could not open installed images; choose a directory outside the data directory"
        )
        if settings.registry is not None:
            raise StartupError(problem)
        log.warning("%s", problem)
    return images


def prepare_egress(settings: Settings) -> tuple[GatewayCA, frozenset[IPAddress]]:
    """The egress CA (created in the data directory at first start) and the host's addresses."""
    try:
        ca = GatewayCA.load_or_create(ca_directory(settings.data_dir))
    except CAError as exc:
        raise StartupError(f"egress CA: {exc}") from exc
    config = settings.egress
    if config.allow_networks:
        log.warning(
            "SVC_EGRESS_ALLOW_CIDRS is set: sandboxes may reach these internal ranges "
            "through the egress proxy: %s",
            ", ".join(str(net) for net in config.allow_networks),
        )
    if config.host_map:
        log.warning("SVC_EGRESS_HOSTS maps %s without DNS", ", ".join(sorted(config.host_map)))
    try:
        own = own_addresses()
    except OSError as exc:
        raise StartupError(f"egress proxy: cannot list the host's addresses ({exc})") from exc
    return ca, own


def _own_ports(settings: Settings) -> frozenset[int]:
    """The gateway's listening ports: the egress proxy never relays a sandbox to them."""
    metrics = settings.metrics_listen
    return frozenset({settings.listen_port, *(() if metrics is None else (metrics[1],))})


def _first_leaf(group: BaseExceptionGroup[StartupError]) -> StartupError:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


async def _serve_until_signal(
    front: Front,
    settings: Settings,
    supervisor: SandboxSupervisor,
    runtimes: RuntimeManager,
    signals: AsyncIterator[int],
    on_ready: Callable[[list[str]], None],
    installer: Installer | None = None,
    *,
    metrics: Metrics,
    operator: OperatorContext | None = None,
) -> None:
    shutdown = trio.Event()
    served = trio.Event()
    notifier = Notifier.from_env(os.environ)  # systemd Type=notify; a no-op elsewhere

    async def watch_signals() -> None:
        async for signum in signals:
            log.info("received %s: draining in-flight requests", signal.Signals(signum).name)
            notifier.notify("STOPPING=1", "STATUS=draining in-flight requests")
            shutdown.set()
            return

    async def http_server(
        task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            await serve(
                front,  # type: ignore[arg-type]  # hypercorn's ASGI typing is narrower than ours
                _hypercorn_config(settings),
                shutdown_trigger=shutdown.wait,
                task_status=task_status,
            )
        finally:
            served.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_signals)
        # Started before the HTTP server and cancelled after it has drained: requests in
        # flight during the graceful shutdown still have their sandboxes.
        try:
            await nursery.start(supervisor.run)
        except SupervisorStartError as exc:
            raise StartupError(f"sandboxes ({settings.sandbox_dir}): {exc}") from exc
        await nursery.start(runtimes.run)
        try:
            await nursery.start(
                serve_control_socket, settings.control_socket, operator or supervisor
            )
        except ControlSocketError as exc:
            raise StartupError(f"control socket: {exc}") from exc
        if (listen := settings.metrics_listen) is not None:
            # Stopped by the same trigger as the HTTP server, before the sandboxes go.
            try:
                metrics_urls = await nursery.start(
                    partial(serve_metrics, listen, metrics, shutdown_trigger=shutdown.wait)
                )
                if operator is not None:
                    operator.metrics_binds.extend(metrics_urls)  # for `svcgate status`
            except* OSError as group:  # Hypercorn's bind error comes out of its nurseries
                leaf: BaseException = group
                while isinstance(leaf, BaseExceptionGroup):
                    leaf = leaf.exceptions[0]
                raise StartupError(
                    f"SVC_METRICS_LISTEN: cannot listen on {listen[0]}:{listen[1]}"
                    f" ({getattr(leaf, 'strerror', None) or leaf})"
                ) from group
        binds = await nursery.start(partial(http_server))
        if operator is not None:
            operator.http_binds.extend(binds)  # for `svcgate status`
        on_ready(binds)
        notifier.notify("READY=1", f"STATUS=serving on {' '.join(binds)}", f"MAINPID={os.getpid()}")
        if installer is not None and installer.settings.install_at_start:
            nursery.start_soon(installer.install_missing, installer.settings.install_at_start)
        await served.wait()
        # Profile runtimes first (they stop their sandboxes), then everything else.
        with trio.move_on_after(TEARDOWN_DEADLINE):
            await runtimes.close()
        nursery.cancel_scope.cancel()


def serve_settings(settings: Settings, on_ready: Callable[[list[str]], None]) -> int:
    """Run the daemon until a signal; return the process exit code."""
    chosen = configure_logging(settings.log_level, fmt=settings.log_format)
    try:
        trio.run(lambda: run_daemon(settings, on_ready=on_ready))
    except (StartupError, StoreOpenError) as exc:
        prefix = "database: " if isinstance(exc, StoreOpenError) else ""
        if chosen == "json":  # the journal gets one JSON object per line, this one too
            log.critical("%s%s", prefix, exc)
        else:
            print(f"svcgate: {prefix}{exc}", file=sys.stderr)
        return 1
    return 0
