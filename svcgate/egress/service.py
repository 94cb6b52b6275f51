"""The egress service: one proxy listener per sandbox, wired to the store, vault and CA.

The sandbox supervisor calls :meth:`EgressService.serve` (its ``SandboxEgress`` hook) once a
sandbox's network namespace exists and before anything runs in it. ``serve`` opens a TCP
listener on ``127.0.0.1`` *inside* that namespace (the namespace holds only ``lo``), reports
an :class:`Attachment` whose :meth:`~Attachment.apply` adds to the sandbox's spec:

- ``HTTP_PROXY``/``HTTPS_PROXY`` (both cases) pointing at the listener, ``NO_PROXY`` for the
  sandbox's own loopback, ``NODE_USE_ENV_PROXY=1`` (node >= 22 honours the proxy then);
- ``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE`` and ``NODE_EXTRA_CA_CERTS``
  naming :data:`CA_BUNDLE_PATH`, a read-only file holding the system roots plus the gateway
  CA (passed as data, no host path involved);
- the server's credential variable (``credential_env``; ``SVC_CREDENTIAL`` for the legacy
  server) set to the owner's credential **placeholder**, never the secret. A credential
  without a placeholder gives the fixed marker :data:`NO_PLACEHOLDER`, so a server that
  insists on the variable still starts (its requests get the injection header).

It then serves the listener until cancelled (the sandbox stopped).

The owner's credential row is read afresh (a thread hop to SQLite) for every decision that
sends the credential and for every refusal, so a deleted, replaced or narrowed credential
applies to the next request; the secret is decrypted only when a request is about to carry
it. What a read found (the credential's hosts and injection settings, never the secret) is
remembered per (owner, server) for :data:`RECENT_TTL` seconds, and the proxy may decide from
it alone when the answer is "allowed, without a credential" (:meth:`EgressService.recent`):
nothing secret travels on such a decision. A credential created, replaced or deleted through
the API (:func:`svcgate.credentials.mark_changed`, after its commit) makes every read that
began before it untrusted, so a change applies to the next request. Plain requests to hosts
on a server's own egress list skip the database that way.
"""

from __future__ import annotations

import functools
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import trio

from netns import core as netns_core
from sandbox import SandboxSpec
from svcgate import credentials
from svcgate.credentials import StoredCredential, read_stored
from svcgate.egress.addresses import IPAddress
from svcgate.egress.audit_sink import EgressAuditSink
from svcgate.egress.ca import GatewayCA, upstream_context
from svcgate.egress.config import EgressSettings
from svcgate.egress.policy import CredentialRule, ServerRules
from svcgate.egress.proxy import EgressIdentity, EgressProxy, ProxyConfig, SandboxState
from svcgate.egress.resolver import Resolver
from svcgate.store import Store
from svcgate.supervisor import SandboxKey, SandboxOwner
from svcgate.vault import Vault

log = logging.getLogger(__name__)

CA_BUNDLE_PATH = "/svcgate/tls/ca-bundle.pem"
NO_PLACEHOLDER = "svcgate-credential-injected-by-proxy"
CA_ENV = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")
PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
# How long a read's outcome may decide "allowed without a credential" (see the module doc).
RECENT_TTL = 1.0
RECENT_MAX = 4096


@dataclass(frozen=True)
class _Policy:
    """What the policy needs from a credential row: everything but the sealed secret."""

    allowed_hosts: tuple[str, ...]
    inject_header: str | None
    inject_format: str | None
    placeholder: str | None

    @classmethod
    def of(cls, row: StoredCredential) -> _Policy:
        return cls(tuple(row.allowed_hosts), row.inject_header, row.inject_format, row.placeholder)

    def rule(self, rules: ServerRules) -> CredentialRule:
        header, fmt = self.inject_header, self.inject_format
        if header is None and fmt is None:
            # The credential says nothing about how it is sent: the manifest decides.
            header, fmt = rules.inject_header, rules.inject_format
        return _rule(self.allowed_hosts, header, fmt, self.placeholder)


@dataclass(frozen=True)
class _Lookup:
    rules: ServerRules
    credential: CredentialRule | None
    _open: Callable[[], bytes] = field(repr=False)

    def open_secret(self) -> bytes:
        return self._open()


@dataclass
class Attachment:
    """One sandbox's listener (the supervisor's ``EgressAttachment``)."""

    port: int
    env: dict[str, str] = field(repr=False)
    files: tuple[tuple[str, bytes], ...] = field(repr=False)
    state: SandboxState = field(repr=False)

    @property
    def listener(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def connections(self) -> int:
        return self.state.connections

    def apply(self, spec: SandboxSpec) -> SandboxSpec:
        return replace(spec, env={**spec.env, **self.env}, files=(*spec.files, *self.files))


class EgressService:
    def __init__(
        self,
        settings: EgressSettings,
        *,
        store: Store,
        vault: Vault,
        sink: EgressAuditSink,
        ca: GatewayCA,
        server_rules: Callable[[str], ServerRules],
        own_addresses: frozenset[IPAddress] = frozenset(),
        self_ports: frozenset[int] = frozenset(),
        resolver: Resolver | None = None,
        upstream: ssl.SSLContext | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.vault = vault
        self.server_rules = server_rules
        self.config = ProxyConfig(
            ports=settings.ports,
            allowed_networks=settings.allow_networks,
            own_addresses=own_addresses,
            self_ports=self_ports,
            max_connections=settings.max_connections,
            rate=settings.rate,
            burst=max(1, int(settings.rate * 2)),
            connect_timeout=settings.connect_timeout,
            idle_timeout=settings.idle_timeout,
            max_duration=settings.max_duration,
        )
        self.proxy = EgressProxy(
            self.config,
            self.lookup,
            resolver or Resolver(settings.host_map),
            ca,
            upstream or upstream_context(settings.upstream_ca_file),
            sink,
            recent=self.recent,
        )
        self.bundle = ca.bundle()
        self._listen_limiter = trio.CapacityLimiter(4)
        # (owner, server) -> (monotonic time the read started, what it found; no secret).
        self._recent: dict[tuple[int, str], tuple[float, _Policy | None]] = {}

    async def lookup(self, identity: EgressIdentity) -> _Lookup:
        """The owner's credential read afresh (and remembered for :meth:`recent`)."""
        rules = self.server_rules(identity.server)
        row: StoredCredential | None = None
        started = time.monotonic()
        if identity.user_id:  # the legacy profile has no owner, so no credentials
            row = await self.store.read(
                partial(read_stored, user_id=identity.user_id, server=identity.server)
            )
        found = None if row is None else _Policy.of(row)
        self._remember((identity.user_id, identity.server), started, found)
        if row is None or found is None:
            return _Lookup(rules, None, _no_secret)
        vault, sealed = self.vault, row.sealed
        rule = found.rule(rules)
        return _Lookup(rules, rule, lambda: vault.open(identity.user_id, identity.server, sealed))

    def _remember(self, key: tuple[int, str], started: float, found: _Policy | None) -> None:
        known = self._recent.get(key)
        if known is not None and known[0] > started:
            return  # a read that started later finished first: keep the newer answer
        if known is None and len(self._recent) >= RECENT_MAX:
            self._recent.clear()
        self._recent[key] = (started, found)

    def recent(self, identity: EgressIdentity) -> _Lookup | None:
        """What a read at most :data:`RECENT_TTL` seconds old found, with the server's rules
        as they are now; never a secret (its ``open_secret`` raises). None: read afresh."""
        found = self._recent.get((identity.user_id, identity.server))
        if found is None or time.monotonic() - found[0] > RECENT_TTL:
            return None
        if found[0] <= credentials.last_change():
            return None  # a credential changed since that read began: read afresh
        rules = self.server_rules(identity.server)
        policy = found[1]
        return _Lookup(rules, None if policy is None else policy.rule(rules), _no_secret)

    def _env(self, port: int, rules: ServerRules, placeholder: str | None) -> dict[str, str]:
        proxy = f"http://127.0.0.1:{port}"
        env = dict.fromkeys(PROXY_ENV, proxy)
        env.update(dict.fromkeys(CA_ENV, CA_BUNDLE_PATH))
        env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
        env["NODE_USE_ENV_PROXY"] = "1"
        if rules.credential_env is not None and placeholder is not None:
            env[rules.credential_env] = placeholder
        return env

    async def serve(
        self,
        key: SandboxKey,
        owner: SandboxOwner,
        namespace: str,
        *,
        task_status: trio.TaskStatus[Attachment] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        identity = EgressIdentity(
            server=key.server,
            user_id=owner.user_id,
            profile_id=key.profile_id,
            profile_slug=owner.profile_slug,
        )
        rules = self.server_rules(key.server)
        placeholder: str | None = None
        if owner.user_id and rules.credential_env is not None:
            row = await self.store.read(
                partial(read_stored, user_id=owner.user_id, server=key.server)
            )
            if row is not None:
                placeholder = row.placeholder or NO_PLACEHOLDER
        sock = await trio.to_thread.run_sync(
            partial(netns_core.open_listener, namespace, host="127.0.0.1", port=0, backlog=256),
            limiter=self._listen_limiter,
        )
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        port = int(sock.getsockname()[1])
        state = SandboxState(self.config)
        attachment = Attachment(
            port=port,
            env=self._env(port, rules, placeholder),
            files=((CA_BUNDLE_PATH, self.bundle),),
            state=state,
        )
        log.debug(
            "egress listener for %s/%s on %s in %s",
            owner.profile_slug,
            key.server,
            attachment.listener,
            namespace,
        )
        task_status.started(attachment)
        await self.proxy.serve(listener, identity, state)


def _no_secret() -> bytes:
    raise LookupError("no credential")


@functools.lru_cache(maxsize=1024)
def _rule(
    hosts: tuple[str, ...], header: str | None, fmt: str | None, placeholder: str | None
) -> CredentialRule:
    """:meth:`CredentialRule.of` (normalising every host pattern) once per distinct rule."""
    return CredentialRule.of(hosts, header, fmt, placeholder)


def ca_directory(data_dir: Path) -> Path:
    return data_dir / "egress-ca"
