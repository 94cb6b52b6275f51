"""Shared fixtures: a real OIDC provider on loopback and real gateway processes.

The gateway always runs as its own process (``python -m svcgate serve``), configured only
through ``SVC_*`` variables, and every sign-in goes through the identity provider over HTTP.
Helpers live in ``tests/gateway_support.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gateway_support import CLIENT_ID, Gateway, start_gateway

from devidp.provider import DevIdP


@pytest.fixture(scope="session")
def idp() -> Iterator[DevIdP]:
    provider = DevIdP(host="127.0.0.1", port=0, client_id=CLIENT_ID, test_hooks=True)
    provider.start()
    try:
        yield provider
    finally:
        provider.stop()


@pytest.fixture(scope="module")
def gateway(idp: DevIdP, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = start_gateway(tmp_path_factory.mktemp("gw"), idp=idp)
    try:
        yield gw
    finally:
        gw.stop()
