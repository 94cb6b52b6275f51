"""Egress policy (pure): which destinations a sandbox may reach, and with which credential.

Inputs are the server's own egress rules (a registry manifest's egress list, or the
``egress`` / ``credential_hosts`` of a ``SVC_SERVERS_FILE`` entry), the profile owner's
credential for that server (its ``allowed_hosts`` and injection settings), and the
operator's port allowlist. The caller has already canonicalised the destination
(:func:`svcgate.egress.addresses.parse_authority`); the decision is keyed only on that
canonical target, never on a header the sandbox sends.

Rules, in order (the first that applies decides):

1. A port outside the allowlist (``SVC_EGRESS_PORTS``, default 80 and 443): ``deny_port``.
2. The owner has a credential for this server and the host is one of its ``allowed_hosts``
   or one of the server's credential hosts: allowed, and the credential is injected.
3. The server's credential hosts (manifest) cover the host but the owner has no credential
   for the server: ``no_credential``.
4. The server's egress list covers the host: allowed, nothing injected.
5. Anything else: ``deny_host`` (or ``deny_ip_literal`` for an IP literal). No rules at all
   (no manifest list, no credential) therefore deny everything: the policy fails closed.

Host patterns follow :mod:`svcgate.host_patterns`: ``*.example.com`` covers names below
``example.com`` but not the apex, a wildcard never covers an IP literal, and an IP literal
is reachable only when a pattern names exactly that literal. A pattern that does not
normalise (a corrupt manifest or row) is dropped, never widened.

After a name is allowed, the proxy resolves it once and checks every address
(:func:`svcgate.egress.addresses.classify`): ``deny_resolve`` or ``deny_address``.

Decision names (the ``decision`` of ``egress`` audit events; docs/egress.md):

=================  ===========================================================================
``allow``          the connection or request was forwarded
``deny_port``      destination port not in the allowlist
``deny_host``      no rule allows this host for this server and user
``deny_ip_literal`` an IP literal that no rule names exactly
``no_credential``  the host takes the server's credential but the owner has none
``deny_resolve``   the name did not resolve
``deny_address``   the name (or literal) resolved to an internal, metadata or own address
``deny_mismatch``  Host header, SNI or absolute URI differs from the checked target
``deny_request``   malformed or ambiguous request (framing, smuggling, upgrade, scheme)
``deny_cleartext`` a credential would travel over plain HTTP to a non-carved-out address
``deny_limit``     the sandbox is over its tunnel or request-rate limit
``credential_error`` the vault refused to open the credential (tampered or moved)
=================  ===========================================================================
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from svcgate.egress.addresses import Target
from svcgate.host_patterns import HostPatternError, matches, normalize_pattern

ALLOW = "allow"
DENY_PORT = "deny_port"
DENY_HOST = "deny_host"
DENY_IP_LITERAL = "deny_ip_literal"
NO_CREDENTIAL = "no_credential"
DENY_RESOLVE = "deny_resolve"
DENY_ADDRESS = "deny_address"
DENY_MISMATCH = "deny_mismatch"
DENY_REQUEST = "deny_request"
DENY_CLEARTEXT = "deny_cleartext"
DENY_LIMIT = "deny_limit"
CREDENTIAL_ERROR = "credential_error"

DECISIONS = (
    ALLOW,
    DENY_PORT,
    DENY_HOST,
    DENY_IP_LITERAL,
    NO_CREDENTIAL,
    DENY_RESOLVE,
    DENY_ADDRESS,
    DENY_MISMATCH,
    DENY_REQUEST,
    DENY_CLEARTEXT,
    DENY_LIMIT,
    CREDENTIAL_ERROR,
)
DEFAULT_PORTS = frozenset({80, 443})
DEFAULT_FORMAT = "Bearer {token}"
DEFAULT_HEADER = "Authorization"


def clean_patterns(raw: Iterable[str]) -> tuple[str, ...]:
    """Normalised patterns; any that do not normalise are dropped (fail closed)."""
    out: list[str] = []
    for item in raw:
        try:
            pattern = normalize_pattern(item)
        except (HostPatternError, AttributeError, TypeError):
            continue
        if pattern not in out:
            out.append(pattern)
    return tuple(out)


def covered(patterns: Sequence[str], host: str) -> bool:
    return any(matches(pattern, host) for pattern in patterns)


@dataclass(frozen=True)
class ServerRules:
    """What a server itself declares: hosts it may reach, hosts that take its credential."""

    hosts: tuple[str, ...] = ()
    credential_hosts: tuple[str, ...] = ()
    # The environment variable that receives the credential's placeholder (or None).
    credential_env: str | None = None
    # How the credential is sent (a registry manifest's injection config), used when the
    # owner's credential does not say: header name and format with ``{token}``.
    inject_header: str | None = None
    inject_format: str | None = None

    @classmethod
    def of(
        cls,
        hosts: Iterable[str] = (),
        credential_hosts: Iterable[str] = (),
        credential_env: str | None = None,
        inject_header: str | None = None,
        inject_format: str | None = None,
    ) -> ServerRules:
        return cls(
            clean_patterns(hosts),
            clean_patterns(credential_hosts),
            credential_env,
            inject_header,
            inject_format,
        )


NO_RULES = ServerRules()


@dataclass(frozen=True)
class CredentialRule:
    """The owner's credential for the server, without the secret."""

    allowed_hosts: tuple[str, ...]
    inject_header: str | None = None
    inject_format: str | None = None
    placeholder: str | None = None

    @classmethod
    def of(
        cls,
        allowed_hosts: Iterable[str],
        inject_header: str | None = None,
        inject_format: str | None = None,
        placeholder: str | None = None,
    ) -> CredentialRule:
        return cls(clean_patterns(allowed_hosts), inject_header, inject_format, placeholder)

    def injection_header(self) -> tuple[str, str] | None:
        """(header, format) to set, or None when only the placeholder is substituted.

        With neither ``inject_header`` nor ``placeholder``: ``Authorization: Bearer {token}``.
        ``inject_header`` without a format: ``Bearer {token}`` for ``Authorization``, the
        bare ``{token}`` for any other header.
        """
        if self.inject_header is None:
            if self.placeholder is not None:
                return None
            return DEFAULT_HEADER, self.inject_format or DEFAULT_FORMAT
        fmt = self.inject_format
        if fmt is None:
            fmt = DEFAULT_FORMAT if self.inject_header.lower() == "authorization" else "{token}"
        return self.inject_header, fmt


@dataclass(frozen=True)
class Decision:
    decision: str
    inject: bool = False
    reason: str = ""

    @property
    def allowed(self) -> bool:
        return self.decision == ALLOW


def decide(
    target: Target,
    rules: ServerRules,
    credential: CredentialRule | None,
    *,
    ports: frozenset[int] = DEFAULT_PORTS,
) -> Decision:
    """The policy decision for ``target`` by name (see the module docstring)."""
    if target.port not in ports:
        return Decision(DENY_PORT, reason=f"port {target.port} is not allowed")
    host = target.host
    server_bound = covered(rules.credential_hosts, host)
    if credential is not None and (server_bound or covered(credential.allowed_hosts, host)):
        return Decision(ALLOW, inject=True, reason="credential host")
    if server_bound:
        return Decision(NO_CREDENTIAL, reason="the owner has no credential for this server")
    if covered(rules.hosts, host):
        return Decision(ALLOW, reason="server egress list")
    if target.ip is not None:
        return Decision(DENY_IP_LITERAL, reason="IP literals are refused unless named exactly")
    return Decision(DENY_HOST, reason="host not allowed for this server")
