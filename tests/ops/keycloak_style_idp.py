"""The repository's OIDC provider (devidp) shaped like the Keycloak client of
docs/operations.md: a confidential client, one exact redirect URI, and the roles as a *list*
of names under ``urn:keycloak:iam:org:project:roles`` (what Keycloak's "User Realm Role"
mapper emits with "Multivalued" on), in the ID token and in userinfo.

devidp itself always sends Zitadel's object shape; only the claim's value is changed here.

``python keycloak_style_idp.py --client-secret S --redirect-uri URL`` prints
``devidp: issuer http://127.0.0.1:PORT`` and serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from devidp.provider import DevIdP, User

ROLES_CLAIM = "urn:keycloak:iam:org:project:roles"
CLIENT_ID = "svcgate"


class KeycloakStyleIdP(DevIdP):
    """devidp with the roles claim as a list of role names (plus Keycloak's default roles)."""

    def _user_claims(self, user: User) -> dict[str, Any]:
        claims = super()._user_claims(user)
        claims[self.roles_claim] = [*user.roles, "offline_access", "uma_authorization"]
        return claims


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client-secret", required=True)
    parser.add_argument("--redirect-uri", required=True)
    args = parser.parse_args()
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    idp = KeycloakStyleIdP(
        client_id=CLIENT_ID,
        client_secret=args.client_secret,
        redirect_uris=[args.redirect_uri],
        roles_claim=ROLES_CLAIM,
    )
    print(f"devidp: issuer {idp.start()}", flush=True)
    try:
        stop.wait()
    finally:
        idp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
