"""The host's own interface addresses, for :func:`svcgate.egress.addresses.classify` (I/O).

Rules:

- Every address configured on any interface of the **current** network namespace, IPv4 and
  IPv6, up or down, read over netlink (pyroute2 ``RTM_GETADDR``). Call it in the namespace
  the proxy dials from.
- Both ``IFA_LOCAL`` and ``IFA_ADDRESS`` are taken: on point-to-point links ``IFA_ADDRESS``
  is the peer's address, and refusing the peer as well is the safe side.
- IPv6 zone ids (``fe80::1%eth0``) are stripped: zones take part in ``ipaddress`` equality,
  and :func:`~svcgate.egress.addresses.classify` compares zone-free addresses.
- The answer is a snapshot; callers that live long should refresh it (addresses change when
  interfaces come and go).
"""

from __future__ import annotations

import ipaddress

from pyroute2 import IPRoute

from svcgate.egress.addresses import IPAddress

_ATTRIBUTES = ("IFA_LOCAL", "IFA_ADDRESS")


def own_addresses() -> frozenset[IPAddress]:
    """Every address on any interface of this network namespace, without zone ids."""
    found: set[IPAddress] = set()
    with IPRoute() as ipr:
        for message in ipr.get_addr():
            for attribute in _ATTRIBUTES:
                value = message.get_attr(attribute)
                if not value:
                    continue
                text = str(value).partition("%")[0]
                try:
                    found.add(ipaddress.ip_address(text))
                except ValueError:
                    continue  # not an IP address (never expected from RTM_GETADDR)
    return frozenset(found)
