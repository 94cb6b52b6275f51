"""Which servers this gateway can run, and how: the resolver the profile runtimes use.

A server is runnable when it is the legacy fallback (``echo`` with ``SVC_ECHO_BIN``), defined
in ``SVC_SERVERS_FILE``, or installed from the signed registry (:mod:`svcgate.registry`);
configured servers win over installed ones of the same name (the installer refuses such
names anyway). The same resolver says what each may reach through the egress proxy
(:meth:`ConfiguredServers.egress_rules`). A server row with none of these (the variable was
unset, the file entry removed) resolves to None and is skipped at spawn with a log line
(SPEC).
"""

from __future__ import annotations

from functools import partial

from sandbox import Bind, SandboxSpec
from svcgate.egress.policy import NO_RULES, ServerRules
from svcgate.legacy_spec import SANDBOX_ENV, legacy_server_spec
from svcgate.local_servers import LocalServer
from svcgate.registry.installed import InstalledCatalogue, installed_server_spec
from svcgate.runtime import ServerDefinition
from svcgate.servers import LEGACY_SERVER
from svcgate.settings import Settings
from svcgate.supervisor import SandboxKey, SandboxOwner


def local_server_spec(server: LocalServer, key: SandboxKey, owner: SandboxOwner) -> SandboxSpec:
    """The sandbox that runs ``server`` for ``owner``'s profile (host ``/usr``, read-only binds)."""
    return SandboxSpec(
        command=server.command,
        label=f"{owner.profile_slug}/{key.server}",
        env={**SANDBOX_ENV, **dict(server.env)},
        binds=tuple(Bind(source, dest) for source, dest in server.binds),
    )


# The legacy server has no manifest: by convention its credential placeholder (if the owner's
# credential has one) is in this variable, and it reaches only the credential's hosts.
LEGACY_CREDENTIAL_ENV = "SVC_CREDENTIAL"


class ConfiguredServers:
    """Resolves server names from the settings (legacy echo, ``SVC_SERVERS_FILE``)."""

    def __init__(self, settings: Settings, installed: InstalledCatalogue | None = None) -> None:
        self._installed = installed
        self._definitions: dict[str, ServerDefinition] = {}
        self._egress: dict[str, ServerRules] = {}
        for name, server in settings.local_servers.items():
            self._definitions[name] = ServerDefinition(
                name, partial(local_server_spec, server), server.default_tools
            )
            self._egress[name] = ServerRules.of(
                server.egress, server.credential_hosts, server.credential_env
            )
        if settings.echo_bin is not None:
            self._definitions[LEGACY_SERVER] = ServerDefinition(
                LEGACY_SERVER, partial(legacy_server_spec, settings.echo_bin)
            )
            self._egress[LEGACY_SERVER] = ServerRules(credential_env=LEGACY_CREDENTIAL_ENV)

    def configured(self, name: str) -> bool:
        """True for a server defined by the settings (not installable from the registry)."""
        return name in self._definitions

    def resolve(self, name: str) -> ServerDefinition | None:
        found = self._definitions.get(name)
        if found is not None or self._installed is None:
            return found
        server = self._installed.get(name)
        if server is None:
            return None
        return ServerDefinition(
            name,
            partial(installed_server_spec, server, self._installed.rootfs(server)),
            server.manifest.default_tools,
            pins={pin.name: pin for pin in server.manifest.tools},
        )

    def egress_rules(self, name: str) -> ServerRules:
        """What the server itself may reach (nothing for an unknown server: fail closed)."""
        found = self._egress.get(name)
        if found is not None:
            return found
        server = self._installed.get(name) if self._installed is not None else None
        if server is None:
            return NO_RULES
        manifest = server.manifest
        credential = manifest.credential
        if credential is None:
            return ServerRules.of(manifest.egress)
        return ServerRules.of(
            manifest.egress,
            credential.hosts,
            credential.env,
            credential.header,
            credential.format,
        )
