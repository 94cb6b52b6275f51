"""The ``svcgate`` command: ``serve``, ``demo``, ``vault``, ``netns``, ``sandbox``, ``registry``,
``version``.

Exit codes: 0 after a clean shutdown, 2 for a bad setting (one line naming the variable),
1 for any other start-up failure (one line saying what failed). The operator commands
(``netns ls``, ``sandbox ps``, ``sandbox logs``) exit 1 with one line when the daemon cannot
be reached (:mod:`svcgate.operator_cli`).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from collections.abc import Sequence

from svcgate import __version__, operator_cli, vault
from svcgate.daemon import DB_NAME, serve_settings
from svcgate.demo import run_demo
from svcgate.registry import cli as registry_cli
from svcgate.settings import (
    SettingsError,
    data_dir_from_env,
    settings_from_env,
    vault_key_location,
)


def _announce(binds: list[str]) -> None:
    for url in binds:
        print(f"svcgate: listening on {url}", flush=True)


def cmd_serve(_: argparse.Namespace) -> int:
    try:
        settings = settings_from_env()
    except SettingsError as exc:
        print(f"svcgate: {exc}", file=sys.stderr)
        return 2
    return serve_settings(settings, _announce)


def cmd_demo(args: argparse.Namespace) -> int:

    return run_demo(port=args.port, data_dir=args.data_dir)


def cmd_vault_rotate(_: argparse.Namespace) -> int:
    env = dict(os.environ)
    data_dir = data_dir_from_env(env)
    key_file = vault_key_location(env, data_dir)[0]
    db = data_dir / DB_NAME
    if not db.exists():
        print(f"svcgate: no database at {db} (set SVC_DATA_DIR)", file=sys.stderr)
        return 1
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout = 10000")
        conn.execute("PRAGMA synchronous = FULL")
        version, count = vault.rotate(conn, key_file)
    except vault.VaultError as exc:
        print(f"svcgate: {exc}", file=sys.stderr)
        return 1
    finally:
        conn.close()
    print(f"vault key rotated to version {version}; {count} credential(s) re-wrapped")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="svcgate", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"svcgate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway (settings from SVC_* variables)")
    serve.set_defaults(func=cmd_serve)
    demo = sub.add_parser(
        "demo", help="run the gateway with a local identity provider and demo users"
    )
    demo.add_argument("--port", type=int, default=int(os.environ.get("SVC_DEMO_PORT", "8080")))
    demo.add_argument("--data-dir", default=os.environ.get("SVC_DATA_DIR", "svcgate-data"))
    demo.set_defaults(func=cmd_demo)
    vault_cmd = sub.add_parser("vault", help="vault key management")
    vault_sub = vault_cmd.add_subparsers(dest="vault_command", required=True)
    rotate = vault_sub.add_parser(
        "rotate-key", help="add a new key-encryption key and re-wrap every credential"
    )
    rotate.set_defaults(func=cmd_vault_rotate)
    operator_cli.add_parsers(sub)
    registry_cli.add_parsers(sub)
    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=lambda _: print(f"svcgate {__version__}") or 0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
