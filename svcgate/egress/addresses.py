"""Canonical hosts, authorities and the address-safety check of the egress proxy (pure).

The proxy receives ``CONNECT host:port`` or an absolute-form ``http://host:port/...`` from an
untrusted sandbox. It canonicalises the host with :func:`parse_authority`, decides policy by
the canonical name, resolves that name **once**, checks every resolved address with
:func:`classify` and dials exactly the address that passed (THREATS C1-C4). Nothing here does
I/O; the host's own interface addresses come from :mod:`svcgate.egress.local_addrs`.

Canonical hosts (:func:`canonical_host`):

- No whitespace, control or format characters (U+200C/U+200D, which IDNA itself polices, are
  the only format characters let through), and none of ``@ / \\ %``: userinfo, paths and IPv6
  zone ids are refused, never interpreted.
- ``[...]`` is IPv6 only; an unbracketed text containing ``:`` must be a bare IPv6 address.
  IPv6 hosts come back compressed (``str(IPv6Address)``) without brackets. IPv6 addresses
  that embed IPv4 are *not* rewritten to IPv4; :func:`classify` refuses them all.
- Names are UTS #46 mapped (non-transitional, STD3 rules: case folding, full-width dots and
  digits become ASCII), then one trailing dot is stripped.
- If the last label is then all decimal digits or ``0x`` hex, the host is an IPv4 literal and
  must decode exactly as glibc ``inet_aton`` decodes it (one to four parts; ``0x`` hex, a
  leading ``0`` octal, else decimal; every part but the last at most 255, the last fills the
  remaining bytes). Anything else, like ``example.123`` or ``1.2.3.4.5``, is refused rather
  than left for a resolver to interpret. ``1.2.3.4.example.com`` is a name.
- Other labels are IDNA 2008 encoded to A-labels (so a Cyrillic homograph of ``example.com``
  becomes a distinct ``xn--`` name); ASCII labels must be LDH: 1-63 characters of
  ``a-z0-9-``, not starting or ending with ``-``. ``xn--`` labels must be valid, canonical
  punycode. The whole name is at most 253 characters.

Authorities (:func:`parse_authority`): ``host:port``, ``[v6]:port`` or, when the caller
supplies a default port, a bare host or ``[v6]``. The port is 1-5 ASCII digits in 1-65535.
An unbracketed IPv6 address is refused even without a port: it is ambiguous.

Classification (:func:`classify`) returns ``None`` when the address may be dialled and a
reason otherwise, checked in this order:

1. Never dialled, whatever the operator carve-out says: cloud metadata endpoints (including
   169.254.169.0/24 and AWS's ``fd00:ec2::/32``) -> ``metadata``; ``0.0.0.0/8`` and ``::`` ->
   ``unspecified``; multicast -> ``multicast``; ``255.255.255.255`` -> ``broadcast``; IPv6
   forms that embed IPv4 (mapped, compatible, translated, NAT64, 6to4, Teredo) ->
   ``embedded_ipv4``.
2. One of the host's own addresses -> ``own_address``, unless it is a loopback address the
   carve-out covers.
3. Inside the carve-out (``allowed``) -> allowed.
4. The IANA special-purpose ranges, by an explicit table: ``loopback``, ``private``,
   ``link_local``, ``cgnat`` and ``reserved`` (documentation, benchmarking, protocol
   assignments, 240/4, ...). IPv6 outside ``2000::/3`` (unallocated) and anything Python
   does not call global are ``reserved`` too; the explicit table is there because Python's
   flags have had bugs.
5. Otherwise allowed.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import re
import unicodedata
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Final

import idna

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_NAME_LENGTH: Final = 253
# Longest raw host text looked at: a maximal name plus its trailing dot. Longer input is
# refused before any IDNA work (UTS #46 can only shorten text by dropping ignored characters,
# and those are refused as format characters anyway).
_MAX_RAW_HOST: Final = MAX_NAME_LENGTH + 1
_MAX_AUTHORITY: Final = _MAX_RAW_HOST + 6  # ":65535"
_ECHO: Final = 64

_LABEL: Final = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_NUMERIC_LAST_LABEL: Final = re.compile(r"[0-9]+|0x[0-9a-f]*")
_PORT: Final = re.compile(r"[0-9]{1,5}")
# One inet_aton part: hex, octal (a lone "0" included) or decimal.
_IPV4_PART: Final = re.compile(r"0x(?P<hex>[0-9a-f]+)|(?P<oct>0[0-7]*)|(?P<dec>[1-9][0-9]*)")
_REFUSED_CHARS: Final = frozenset("@/\\%")
_JOINERS: Final = frozenset("\u200c\u200d")
# With n parts, the last one fills 4 - (n - 1) bytes.
_LAST_PART_MAX: Final = (0xFFFFFFFF, 0xFFFFFF, 0xFFFF, 0xFF)


class TargetError(ValueError):
    """Malformed host or authority; ``str()`` is safe to show (echoed input is truncated)."""


@dataclass(frozen=True)
class Target:
    """A canonical destination; build it with :func:`parse_authority`."""

    host: str
    """Lower-case ASCII name without trailing dot, or canonical IP text (no brackets)."""
    ip: IPAddress | None
    """The address when the host was an IP literal, in any encoding; ``None`` for names."""
    port: int

    @property
    def authority(self) -> str:
        """``host:port``, with IPv6 hosts in brackets."""
        if isinstance(self.ip, ipaddress.IPv6Address):
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"


def _echo(raw: str) -> str:
    return repr(raw[:_ECHO])


def _check_characters(raw: str) -> None:
    for ch in raw:
        if ch in _REFUSED_CHARS:
            raise TargetError(f"host {_echo(raw)} contains a refused character {ch!r}")
        if ch.isspace() or (unicodedata.category(ch)[0] in "CZ" and ch not in _JOINERS):
            raise TargetError(f"host {_echo(raw)} contains whitespace or a control character")


def _parse_ipv6(text: str, raw: str) -> ipaddress.IPv6Address:
    try:
        address = ipaddress.IPv6Address(text)
    except ValueError:
        raise TargetError(f"host {_echo(raw)} is not a valid IPv6 address") from None
    if address.scope_id is not None:  # pragma: no cover - "%" is refused earlier
        raise TargetError(f"host {_echo(raw)} carries an IPv6 zone id")
    return address


def _parse_ipv4_number(host: str, raw: str) -> ipaddress.IPv4Address:
    """Decode ``host`` (lower case) exactly as glibc ``inet_aton`` would, or refuse it."""
    parts = host.split(".")
    if len(parts) > 4:
        raise TargetError(f"host {_echo(raw)} has a numeric last label but is not an IPv4 address")
    values: list[int] = []
    for part in parts:
        match = _IPV4_PART.fullmatch(part)
        if match is None:
            raise TargetError(
                f"host {_echo(raw)} has a numeric last label but is not an IPv4 address"
            )
        if match["hex"] is not None:
            values.append(int(match["hex"], 16))
        elif match["oct"] is not None:
            values.append(int(match["oct"], 8))
        else:
            values.append(int(match["dec"], 10))
    *leading, last = values
    if any(value > 0xFF for value in leading) or last > _LAST_PART_MAX[len(leading)]:
        raise TargetError(f"host {_echo(raw)} is an IPv4 address with an out-of-range part")
    number = last
    for index, value in enumerate(leading):
        number |= value << (8 * (3 - index))
    return ipaddress.IPv4Address(number)


def _encode_label(label: str, raw: str) -> str:
    if label.isascii() and not label.startswith("xn--"):
        if _LABEL.fullmatch(label) is None:
            raise TargetError(f"host {_echo(raw)} has an empty or malformed label")
        return label
    try:
        if label.isascii():
            # An A-label must decode and re-encode to itself: no junk punycode, no aliases.
            encoded = idna.alabel(idna.ulabel(label)).decode("ascii")
            if encoded != label:
                raise TargetError(f"host {_echo(raw)} has a non-canonical punycode label")
        else:
            encoded = idna.encode(label, uts46=False).decode("ascii")
    except (idna.IDNAError, UnicodeError):
        raise TargetError(f"host {_echo(raw)} is not a valid internationalised name") from None
    if _LABEL.fullmatch(encoded) is None:
        raise TargetError(f"host {_echo(raw)} has an empty or malformed label")
    return encoded


def canonical_host(raw: str) -> tuple[str, IPAddress | None]:
    """Return ``(canonical host, address if it was an IP literal)`` or raise TargetError."""
    if not raw:
        raise TargetError("host is empty")
    if len(raw) > _MAX_RAW_HOST:
        raise TargetError(f"host {_echo(raw)}... is longer than {MAX_NAME_LENGTH} characters")
    _check_characters(raw)
    if raw.startswith("["):
        if not raw.endswith("]"):
            raise TargetError(f"host {_echo(raw)} has an unterminated '['")
        v6 = _parse_ipv6(raw[1:-1], raw)
        return str(v6), v6
    if ":" in raw:
        v6 = _parse_ipv6(raw, raw)
        return str(v6), v6
    if raw.isascii():
        host = raw.lower()
    else:
        try:
            host = idna.uts46_remap(raw, std3_rules=True, transitional=False)
        except (idna.IDNAError, UnicodeError):
            raise TargetError(f"host {_echo(raw)} is not a valid internationalised name") from None
    if host.endswith("."):
        host = host[:-1]
    if not host:
        raise TargetError("host is empty")
    if _NUMERIC_LAST_LABEL.fullmatch(host.rpartition(".")[2]) is not None:
        v4 = _parse_ipv4_number(host, raw)
        return str(v4), v4
    name = ".".join(_encode_label(label, raw) for label in host.split("."))
    if len(name) > MAX_NAME_LENGTH:
        raise TargetError(f"host {_echo(raw)} is longer than {MAX_NAME_LENGTH} characters")
    return name, None


def _parse_port(text: str, authority: str) -> int:
    if _PORT.fullmatch(text) is None or not 1 <= int(text) <= 65535:
        raise TargetError(f"authority {_echo(authority)} has an invalid port")
    return int(text)


def parse_authority(authority: str, *, default_port: int | None = None) -> Target:
    """Parse ``host:port`` / ``[v6]:port`` (or a bare host when ``default_port`` is given).

    Pure, so results are memoised (:data:`PARSE_CACHE_SIZE` most recent, LRU): the proxy
    parses the same few authorities on every request. Refusals are not cached (they raise
    afresh each time)."""
    if default_port is not None and not 1 <= default_port <= 65535:
        raise ValueError(f"default port {default_port} is outside 1-65535")
    return _parse_authority(authority, default_port)


PARSE_CACHE_SIZE: Final = 1024


@functools.lru_cache(maxsize=PARSE_CACHE_SIZE)
def _parse_authority(authority: str, default_port: int | None) -> Target:
    if len(authority) > _MAX_AUTHORITY:
        raise TargetError(f"authority {_echo(authority)}... is too long")
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            raise TargetError(f"authority {_echo(authority)} has an unterminated '['")
        host_text, rest = authority[: close + 1], authority[close + 1 :]
        if rest and not rest.startswith(":"):
            raise TargetError(f"authority {_echo(authority)} has junk after ']'")
        port_text: str | None = rest[1:] if rest else None
    elif authority.count(":") > 1:
        raise TargetError(
            f"authority {_echo(authority)} is ambiguous: put IPv6 addresses in brackets"
        )
    elif ":" in authority:
        host_text, _, port_text = authority.partition(":")
    else:
        host_text, port_text = authority, None
    if port_text is None:
        if default_port is None:
            raise TargetError(f"authority {_echo(authority)} has no port")
        port = default_port
    else:
        port = _parse_port(port_text, authority)
    host, ip = canonical_host(host_text)
    return Target(host=host, ip=ip, port=port)


def _net(text: str) -> Network:
    return ipaddress.ip_network(text)


_METADATA_ADDRESSES: Final = frozenset(
    ipaddress.ip_address(text)
    for text in (
        "169.254.169.254",  # AWS, GCP, Azure, OCI, DigitalOcean, ... instance metadata
        "169.254.170.2",  # AWS ECS task metadata and credentials
        "169.254.170.23",  # AWS EKS Pod Identity agent
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "fd00:ec2::23",  # AWS EKS Pod Identity agent over IPv6
        "100.100.100.200",  # Alibaba Cloud metadata
    )
)
_METADATA_NETWORKS: Final = (_net("169.254.169.0/24"), _net("fd00:ec2::/32"))

_ALWAYS_DENIED: Final[tuple[tuple[Network, str], ...]] = (
    (_net("0.0.0.0/8"), "unspecified"),
    (_net("::/128"), "unspecified"),
    (_net("224.0.0.0/4"), "multicast"),
    (_net("ff00::/8"), "multicast"),
    (_net("255.255.255.255/32"), "broadcast"),
    (_net("::ffff:0:0/96"), "embedded_ipv4"),  # IPv4-mapped
    (_net("::ffff:0:0:0/96"), "embedded_ipv4"),  # IPv4-translated (SIIT)
    (_net("64:ff9b::/96"), "embedded_ipv4"),  # NAT64 well-known prefix
    (_net("64:ff9b:1::/48"), "embedded_ipv4"),  # NAT64 local-use prefix
    (_net("2002::/16"), "embedded_ipv4"),  # 6to4
    (_net("2001::/32"), "embedded_ipv4"),  # Teredo
)
_IPV4_COMPATIBLE: Final = _net("::/96")
_LOOPBACK: Final = (_net("127.0.0.0/8"), _net("::1/128"))

# IANA IPv4 and IPv6 special-purpose address registries (plus deprecated site-local), as of
# 2025. Ranges IANA marks "globally reachable" (AS112, AMT, some anycast) are left off when
# they are standalone; inside 2001::/23 everything is refused.
_SPECIAL_RANGES: Final[tuple[tuple[Network, str], ...]] = (
    (_net("127.0.0.0/8"), "loopback"),
    (_net("::1/128"), "loopback"),
    (_net("10.0.0.0/8"), "private"),
    (_net("172.16.0.0/12"), "private"),
    (_net("192.168.0.0/16"), "private"),
    (_net("fc00::/7"), "private"),
    (_net("169.254.0.0/16"), "link_local"),
    (_net("fe80::/10"), "link_local"),
    (_net("100.64.0.0/10"), "cgnat"),
    (_net("192.0.0.0/24"), "reserved"),  # IETF protocol assignments
    (_net("192.0.2.0/24"), "reserved"),  # TEST-NET-1
    (_net("192.88.99.0/24"), "reserved"),  # deprecated 6to4 relay anycast
    (_net("198.18.0.0/15"), "reserved"),  # benchmarking
    (_net("198.51.100.0/24"), "reserved"),  # TEST-NET-2
    (_net("203.0.113.0/24"), "reserved"),  # TEST-NET-3
    (_net("240.0.0.0/4"), "reserved"),  # reserved for future use
    (_net("100::/64"), "reserved"),  # discard-only
    (_net("100:0:0:1::/64"), "reserved"),  # dummy prefix
    (_net("2001::/23"), "reserved"),  # IETF protocol assignments (benchmarking, ORCHID, ...)
    (_net("2001:db8::/32"), "reserved"),  # documentation
    (_net("3fff::/20"), "reserved"),  # documentation
    (_net("5f00::/16"), "reserved"),  # SRv6 SIDs
    (_net("fec0::/10"), "reserved"),  # deprecated site-local
)
_IPV6_GLOBAL_UNICAST: Final = _net("2000::/3")


def _in(ip: IPAddress, network: Network) -> bool:
    return ip.version == network.version and ip in network


def _plain(ip: IPAddress) -> IPAddress:
    """``ip`` without an IPv6 zone id (zones take part in equality)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        return ipaddress.IPv6Address(int(ip))
    return ip


def classify(
    ip: IPAddress, *, allowed: Sequence[Network] = (), own: Collection[IPAddress] = ()
) -> str | None:
    """Return ``None`` when ``ip`` may be dialled, otherwise the reason it may not."""
    ip = _plain(ip)
    if ip in _METADATA_ADDRESSES or any(_in(ip, net) for net in _METADATA_NETWORKS):
        return "metadata"
    for network, reason in _ALWAYS_DENIED:
        if _in(ip, network):
            return reason
    if _in(ip, _IPV4_COMPATIBLE) and not _in(ip, _LOOPBACK[1]):
        return "embedded_ipv4"
    carved_out = any(_in(ip, network) for network in allowed)
    if ip in own and not (carved_out and any(_in(ip, net) for net in _LOOPBACK)):
        return "own_address"
    if carved_out:
        return None
    for network, reason in _SPECIAL_RANGES:
        if _in(ip, network):
            return reason
    if isinstance(ip, ipaddress.IPv6Address) and not _in(ip, _IPV6_GLOBAL_UNICAST):
        return "reserved"
    if not ip.is_global:
        return "reserved"
    return None


def parse_networks(text: str) -> tuple[Network, ...]:
    """Parse the operator carve-out: comma-separated CIDRs or single addresses.

    Blank items are ignored, so ``""`` is the empty carve-out. A network with host bits set
    (``10.0.0.1/8``) is refused rather than silently widened, and zone ids are refused.
    Duplicates are dropped; order is kept.
    """
    networks: list[Network] = []
    for item in text.split(","):
        entry = item.strip()
        if not entry:
            continue
        if "%" in entry:
            raise ValueError(f"carve-out entry {entry[:_ECHO]!r}: zone ids are not allowed")
        try:
            network = ipaddress.ip_network(entry, strict=True)
        except ValueError as exc:
            hint = ""
            with contextlib.suppress(ValueError):
                hint = f"; did you mean {ipaddress.ip_network(entry, strict=False)}?"
            raise ValueError(
                f"carve-out entry {entry[:_ECHO]!r} is not an IP address or CIDR network"
                f" ({exc}){hint}"
            ) from None
        if network not in networks:
            networks.append(network)
    return tuple(networks)
