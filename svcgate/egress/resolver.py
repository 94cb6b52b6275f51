"""Name resolution for the egress proxy: the operator's static host map, then DNS, once.

``SVC_EGRESS_HOSTS`` is a comma-separated list of ``name=address`` or ``name=address:port``
(IPv6 as ``[addr]:port``). A mapped name is never looked up in DNS; with a port the dial goes
to that port whatever port the sandbox asked for (an internal API on a non-standard port,
or a test upstream on loopback). Mapped addresses are still checked like resolved ones: a
map entry to ``127.0.0.1`` needs the loopback carve-out too.

Every destination is resolved exactly once per connection or request and the proxy dials one
of the addresses it checked (THREATS.md C2): :meth:`Resolver.resolve` returns addresses,
never a name to look up again.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import trio

from svcgate.egress.addresses import IPAddress, TargetError, canonical_host

GetAddrInfo = Callable[[str, int], Awaitable[list[IPAddress]]]


class ResolveError(Exception):
    """The name does not resolve (``str()`` is safe to show)."""


@dataclass(frozen=True)
class HostMapEntry:
    address: IPAddress
    port: int | None = None


def parse_host_map(text: str) -> dict[str, HostMapEntry]:
    """Parse ``SVC_EGRESS_HOSTS``; raise ValueError naming the bad entry."""
    result: dict[str, HostMapEntry] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        name, sep, dest = item.partition("=")
        if not sep or not name.strip() or not dest.strip():
            raise ValueError(f"entry {item[:64]!r} is not NAME=ADDRESS[:PORT]")
        try:
            host, ip = canonical_host(name.strip())
        except TargetError as exc:
            raise ValueError(f"entry {item[:64]!r}: {exc}") from exc
        if ip is not None:
            raise ValueError(f"entry {item[:64]!r}: the name must be a DNS name")
        result[host] = _parse_destination(item, dest.strip())
    return result


def _parse_destination(item: str, dest: str) -> HostMapEntry:
    port: int | None = None
    address = dest
    if dest.startswith("["):
        address, _, rest = dest[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"entry {item[:64]!r}: malformed [IPv6]:PORT")
            port = _port(item, rest[1:])
    elif dest.count(":") == 1:
        address, _, port_text = dest.partition(":")
        port = _port(item, port_text)
    try:
        ip = ipaddress.ip_address(address)
    except ValueError as exc:
        raise ValueError(f"entry {item[:64]!r}: {address[:64]!r} is not an IP address") from exc
    return HostMapEntry(ip, port)


def _port(item: str, text: str) -> int:
    if not text.isdigit() or len(text) > 5 or not 1 <= int(text) <= 65535:
        raise ValueError(f"entry {item[:64]!r}: bad port {text[:8]!r}")
    return int(text)


async def system_getaddrinfo(host: str, port: int) -> list[IPAddress]:
    """Addresses of ``host`` from the system resolver (trio runs it in a thread)."""
    try:
        infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ResolveError(f"{host} does not resolve") from exc
    out: list[IPAddress] = []
    for *_rest, sockaddr in infos:
        text = str(sockaddr[0]).split("%", 1)[0]
        ip = ipaddress.ip_address(text)
        if ip not in out:
            out.append(ip)
    if not out:
        raise ResolveError(f"{host} has no address")
    return out


class Resolver:
    """Resolve-once lookups with the static host map first. ``lookup`` is a test seam."""

    def __init__(
        self,
        host_map: Mapping[str, HostMapEntry] | None = None,
        *,
        lookup: GetAddrInfo = system_getaddrinfo,
    ) -> None:
        self.host_map = dict(host_map or {})
        self._lookup = lookup

    async def resolve(self, host: str, port: int) -> list[tuple[IPAddress, int]]:
        """(address, port to dial) pairs for the canonical DNS name ``host``."""
        entry = self.host_map.get(host)
        if entry is not None:
            return [(entry.address, entry.port or port)]
        return [(ip, port) for ip in await self._lookup(host, port)]
