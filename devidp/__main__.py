"""Command line of the development OpenID Connect provider.

``python -m devidp --port 0`` binds and prints ``devidp: issuer http://127.0.0.1:PORT``
as its only stdout line. It then serves until SIGTERM or SIGINT and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from devidp.provider import DevIdP
from devidp.users import DEFAULT_ROLES_CLAIM, DEFAULT_USERS, User, load_users_file


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="devidp", description="Development OpenID Connect provider (demo and tests only)."
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one")
    p.add_argument("--client-id", default="svcgate", help="the one registered client")
    p.add_argument(
        "--client-secret", default="", help="client secret; empty makes the client public"
    )
    p.add_argument(
        "--redirect-uri",
        action="append",
        default=[],
        metavar="URL",
        help="registered redirect URI (repeatable); none given: any loopback URI is accepted",
    )
    p.add_argument(
        "--users-file", metavar="PATH", help="JSON list of users replacing the demo ones"
    )
    p.add_argument("--test-hooks", action="store_true", help="enable the /_test/* endpoints")
    p.add_argument("--roles-claim", default=DEFAULT_ROLES_CLAIM, help="name of the roles claim")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    users: Sequence[User] = DEFAULT_USERS
    if args.users_file:
        try:
            users = load_users_file(args.users_file)
        except (OSError, ValueError) as exc:
            parser.error(f"--users-file: {exc}")
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    idp = DevIdP(
        host=args.host,
        port=args.port,
        client_id=args.client_id,
        client_secret=args.client_secret,
        redirect_uris=args.redirect_uri,
        users=users,
        test_hooks=args.test_hooks,
        roles_claim=args.roles_claim,
        log_requests=True,
    )
    try:
        try:
            issuer = idp.start()
        except OSError as exc:
            print(f"devidp: cannot bind {args.host}:{args.port}: {exc}", file=sys.stderr)
            return 1
        print(f"devidp: issuer {issuer}", flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        idp.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
