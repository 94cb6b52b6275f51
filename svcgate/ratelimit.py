"""Per-source limits on failed data-plane authentication (THREATS A7). Pure; the clock is
passed in.

Each source has a bucket of ``burst`` failures that refills at ``rate`` per second. A source
is the peer address of the TCP connection as :func:`source_key` names it: an IPv4 address,
or the /64 network of an IPv6 address (one host usually holds a whole /64, so per-address
buckets would give it 2**64 fresh buckets); an IPv4-mapped IPv6 address is its IPv4
address. A failed authentication takes one; a source whose bucket is empty gets 429
*before* its token is looked at, so guessing cannot go faster than ``rate`` per second.
Successful requests cost nothing. At most ``max_sources`` sources are tracked (least
recently failing forgotten first), so memory stays bounded under a spray of source
addresses.

Behind a reverse proxy every client shares the proxy's address, so one client's failures
can delay others; the defaults (100 failures, then 10 per second) leave room for honest
mistakes.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from dataclasses import dataclass

DEFAULT_BURST = 100.0
DEFAULT_RATE = 10.0
DEFAULT_MAX_SOURCES = 10_000
IPV6_PREFIX = 64


def source_key(address: str) -> str:
    """The rate-limit key of a peer address (see the module docstring); other text as is."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, IPV6_PREFIX), strict=False))
    return str(ip)


@dataclass
class _Bucket:
    tokens: float
    stamp: float


class FailureLimiter:
    def __init__(
        self,
        burst: float = DEFAULT_BURST,
        rate: float = DEFAULT_RATE,
        max_sources: int = DEFAULT_MAX_SOURCES,
    ) -> None:
        if burst < 1 or rate <= 0 or max_sources < 1:
            raise ValueError("burst >= 1, rate > 0 and max_sources >= 1 are required")
        self._burst = burst
        self._rate = rate
        self._max = max_sources
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def _level(self, source: str, now: float) -> _Bucket | None:
        bucket = self._buckets.get(source)
        if bucket is None:
            return None
        bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.stamp) * self._rate)
        bucket.stamp = now
        if bucket.tokens >= self._burst:
            del self._buckets[source]  # full again: nothing to remember
            return None
        return bucket

    def blocked(self, source: str, now: float) -> bool:
        """True while ``source`` has no failures left."""
        bucket = self._level(source, now)
        return bucket is not None and bucket.tokens < 1

    def failed(self, source: str, now: float) -> None:
        """Record one failed authentication from ``source``."""
        bucket = self._level(source, now)
        if bucket is None:
            bucket = _Bucket(self._burst, now)
            self._buckets[source] = bucket
        bucket.tokens = max(0.0, bucket.tokens - 1)
        self._buckets.move_to_end(source)
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)

    def __len__(self) -> int:
        return len(self._buckets)
