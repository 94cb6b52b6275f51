"""Egress proxy settings (``SVC_EGRESS_*``), parsed with the other settings.

========================================  =====================================================
``SVC_EGRESS_PORTS``                      destination ports a sandbox may ask for
                                          (default ``80,443``)
``SVC_EGRESS_ALLOW_CIDRS``                operator carve-out: internal ranges (CIDRs) the proxy
                                          may dial anyway; off by default, logged loudly at
                                          start. Metadata, multicast, unspecified and
                                          IPv4-embedding IPv6 addresses are never allowed.
``SVC_EGRESS_HOSTS``                      static host map ``name=address[:port],...``
``SVC_EGRESS_UPSTREAM_CA_FILE``           extra PEM roots for verifying upstream TLS
``SVC_EGRESS_MAX_CONNECTIONS``            concurrent connections per sandbox (default 64)
``SVC_EGRESS_RATE``                       requests per second per sandbox (default 20,
                                          bursts of twice that)
``SVC_EGRESS_CONNECT_TIMEOUT``            upstream connect/TLS handshake (default 10s)
``SVC_EGRESS_IDLE_TIMEOUT``               no bytes either way (default 60s)
``SVC_EGRESS_MAX_DURATION``               any one connection or tunnel (default 1h)
========================================  =====================================================

Standard library only at import time (the settings module imports it, and the operator CLI
imports the settings module under a bare ``python3``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from svcgate.duration import parse_duration

if TYPE_CHECKING:
    from svcgate.egress.addresses import Network
    from svcgate.egress.resolver import HostMapEntry


class EgressConfigError(ValueError):
    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(problem)
        self.variable = variable


@dataclass(frozen=True)
class EgressSettings:
    ports: frozenset[int] = frozenset({80, 443})
    allow_networks: tuple[Network, ...] = ()
    host_map: Mapping[str, HostMapEntry] = field(default_factory=dict)
    upstream_ca_file: Path | None = None
    max_connections: int = 64
    rate: float = 20.0
    connect_timeout: float = 10.0
    idle_timeout: float = 60.0
    max_duration: float = 3600.0


def _int(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    text = env.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise EgressConfigError(name, f"must be a whole number from {low} to {high}")
    return int(text)


def _duration(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = parse_duration(text)
    except ValueError as exc:
        raise EgressConfigError(
            name, f"invalid duration {text[:32]!r} (examples: 10s, 5m)"
        ) from exc
    if value <= 0:
        raise EgressConfigError(name, "must be positive")
    return value


def egress_settings_from_env(env: Mapping[str, str]) -> EgressSettings:
    # Imported here: the operator CLI imports the settings module under a bare python3.
    from svcgate.egress.addresses import parse_networks
    from svcgate.egress.resolver import parse_host_map

    ports: set[int] = set()
    ports_text = env.get("SVC_EGRESS_PORTS", "").strip() or "80,443"
    for item in ports_text.split(","):
        item = item.strip()
        if not item:
            continue
        if not item.isdigit() or not 1 <= int(item) <= 65535:
            raise EgressConfigError("SVC_EGRESS_PORTS", f"{item[:16]!r} is not a port")
        ports.add(int(item))
    if not ports:
        raise EgressConfigError("SVC_EGRESS_PORTS", "lists no port")
    try:
        networks = parse_networks(env.get("SVC_EGRESS_ALLOW_CIDRS", ""))
    except ValueError as exc:
        raise EgressConfigError("SVC_EGRESS_ALLOW_CIDRS", str(exc)) from exc
    try:
        host_map = parse_host_map(env.get("SVC_EGRESS_HOSTS", ""))
    except ValueError as exc:
        raise EgressConfigError("SVC_EGRESS_HOSTS", str(exc)) from exc
    ca_text = env.get("SVC_EGRESS_UPSTREAM_CA_FILE", "").strip()
    ca_file: Path | None = None
    if ca_text:
        ca_file = Path(ca_text)
        if not ca_file.is_file():
            raise EgressConfigError("SVC_EGRESS_UPSTREAM_CA_FILE", f"{ca_text!r} is not a file")
    rate = _int(env, "SVC_EGRESS_RATE", 20, 1, 100_000)
    return EgressSettings(
        ports=frozenset(ports),
        allow_networks=networks,
        host_map=host_map,
        upstream_ca_file=ca_file,
        max_connections=_int(env, "SVC_EGRESS_MAX_CONNECTIONS", 64, 1, 100_000),
        rate=float(rate),
        connect_timeout=_duration(env, "SVC_EGRESS_CONNECT_TIMEOUT", 10.0),
        idle_timeout=_duration(env, "SVC_EGRESS_IDLE_TIMEOUT", 60.0),
        max_duration=_duration(env, "SVC_EGRESS_MAX_DURATION", 3600.0),
    )
