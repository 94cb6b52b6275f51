"""The egress proxy: attribution, host policy and credential injection outside the sandbox.

Modules (pure ones have no I/O):

- :mod:`svcgate.egress.addresses` (pure): canonical hosts and authorities, IP literals in
  every encoding, classification of addresses (loopback, private, metadata, ...).
- :mod:`svcgate.egress.policy` (pure): which (host, port) a sandbox may reach, whether a
  credential applies, and the decision names.
- :mod:`svcgate.egress.redact` (pure): the secret's encoded forms and a streaming redactor.
- :mod:`svcgate.egress.inject` (pure): request header rewriting (injection, hop-by-hop).
- :mod:`svcgate.egress.ca`: the gateway CA and per-host leaf certificates.
- :mod:`svcgate.egress.resolver`: the static host map and resolve-once lookups.
- :mod:`svcgate.egress.audit_sink`: batched audit writes that are never lost.
- :mod:`svcgate.egress.proxy`: the trio proxy (h11) serving one listener per sandbox.
- :mod:`svcgate.egress.service`: wires the proxy to the supervisor, store and vault.
"""
