"""The svcgate command line: the gateway daemon and the tools around it.

Commands: ``serve``, ``demo``, ``vault``, ``registry``, ``version``, and the operator
commands ``status``, ``netns``, ``sandbox``, ``profile``, ``audit``, ``backup``
(:mod:`svcgate.operator_cli`).

Exit codes: 0 after a clean shutdown, 2 for a bad setting (one line naming the variable),
1 for any other start-up failure (one line saying what failed). The operator commands exit
1 with one line when the daemon cannot be reached or refuses the request.

The operator commands are dispatched before anything else is imported (they are standard
library only); the daemon, the demo, the vault and the registry tools are imported only by
the commands that use them, so an operator command starts in a fraction of the daemon's
import time.

``vault rotate-key`` rotates the vault's key-encryption key. With a running daemon it goes
through the daemon (whose in-memory key ring must change too): the key *source* file
(``--key-file``, else ``SVC_VAULT_KEY_FILE``, else ``/etc/svcgate/vault.key`` if it exists,
else ``<data dir>/vault.key``) is checked against the daemon's keys by fingerprint, a new
version is added to it (atomically, before any credential is wrapped with it), the file is
handed to the daemon as an open read-only descriptor over the control socket, the daemon
re-wraps every credential and forgets the old keys, then the old versions are pruned from
the file. Killed at any point, a re-run finishes the rotation. Without a running daemon the
rotation runs offline on the database (:func:`svcgate.vault.rotate`).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from svcgate import __version__, operator_cli
from svcgate.operator_backup import DB_NAME
from svcgate.operator_client import Connection, ControlError, DaemonNotRunning, socket_path
from svcgate.settings import SettingsError, data_dir_from_env, settings_from_env

SYSTEM_KEY_FILE = Path("/etc/svcgate/vault.key")
# Re-wrapping every credential goes through the daemon's one writer.
ROTATE_TIMEOUT = 600.0
ENCRYPTED_NOTE = (
    "if the unit loads the key with LoadCredentialEncrypted=, encrypt the new key file again "
    "(systemd-creds encrypt --name=vault-key {key_file} {key_file}.cred) "
    "before the next restart"
)


def _announce(binds: list[str]) -> None:
    for url in binds:
        print(f"svcgate: listening on {url}", flush=True)


def cmd_serve(_: argparse.Namespace) -> int:
    from svcgate.daemon import serve_settings  # the daemon's imports, only when serving

    try:
        settings = settings_from_env()
    except SettingsError as exc:
        print(f"svcgate: {exc}", file=sys.stderr)
        return 2
    return serve_settings(settings, _announce)


def cmd_demo(args: argparse.Namespace) -> int:
    from svcgate.demo import run_demo  # the daemon's imports, only when serving

    return run_demo(port=args.port, data_dir=args.data_dir)


def rotation_key_file(override: str | None, env: Mapping[str, str]) -> Path:
    """The key source file: ``--key-file``, ``SVC_VAULT_KEY_FILE``, ``/etc/svcgate/vault.key``
    if it exists, else ``<data dir>/vault.key``."""
    if override:
        return Path(override).absolute()
    if env.get("SVC_VAULT_KEY_FILE"):
        return Path(env["SVC_VAULT_KEY_FILE"]).absolute()
    if SYSTEM_KEY_FILE.exists():
        return SYSTEM_KEY_FILE
    return data_dir_from_env(env) / "vault.key"


def _rotate_live(conn: Connection, key_file: Path) -> dict[str, Any]:
    from svcgate import vault

    ring = vault.load_key_file(key_file, create=False)
    held = conn.request({"cmd": "vault.status"})
    prints = held.get("fingerprints") if isinstance(held, dict) else None
    if not isinstance(prints, dict):
        raise ControlError("the daemon sent a malformed answer")
    for version, print_ in sorted(prints.items()):
        key = ring.keys.get(int(version))
        if key is None or vault.fingerprint(key) != print_:
            raise ControlError(
                f"{key_file} does not hold the daemon's key version {version}: name the file "
                "the daemon's key comes from with --key-file"
            )
    new = vault.next_ring(ring)
    if new is not ring:
        vault.write_key_file(key_file, new)  # durable before any credential uses it
    fd = os.open(key_file, os.O_RDONLY | os.O_CLOEXEC)
    try:
        result = conn.request({"cmd": "vault.rotate"}, fds=[fd], timeout=ROTATE_TIMEOUT)
    finally:
        os.close(fd)
    if not isinstance(result, dict) or not isinstance(result.get("version"), int):
        raise ControlError("the daemon sent a malformed answer")
    target: int = result["version"]
    if vault.load_key_file(key_file, create=False).keys != new.keys:
        raise ControlError(f"{key_file} changed during the rotation; run it again")
    vault.write_key_file(key_file, vault.KeyRing({target: new.keys[target]}))
    return {**result, "daemon": True}


def _rotate_offline(key_file: Path, env: Mapping[str, str]) -> dict[str, Any]:
    from svcgate import vault

    db = data_dir_from_env(env) / DB_NAME
    if not db.exists():
        raise ControlError(f"no database at {db} (set SVC_DATA_DIR)")
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout = 10000")
        conn.execute("PRAGMA synchronous = FULL")
        version, count = vault.rotate(conn, key_file)
    finally:
        conn.close()
    return {"version": version, "rewrapped": count, "daemon": False}


def cmd_vault_rotate(args: argparse.Namespace) -> int:
    from svcgate import vault

    env = os.environ
    try:
        key_file = rotation_key_file(args.key_file, env)
        try:
            conn = Connection(socket_path(args.socket, env))
        except DaemonNotRunning:
            result = _rotate_offline(key_file, env)
        else:
            with conn:
                result = _rotate_live(conn, key_file)
    except (ControlError, vault.VaultError) as exc:
        print(f"svcgate: {exc}", file=sys.stderr)
        return 1
    result["key_file"] = str(key_file)
    note = ENCRYPTED_NOTE.format(key_file=key_file)
    if args.json:
        print(json.dumps({**result, "note": note}, indent=2))
        return 0
    print(
        f"vault key rotated to version {result['version']}; "
        f"{result['rewrapped']} credential(s) re-wrapped"
        + (" by the running daemon" if result["daemon"] else "")
    )
    print(f"{key_file} now holds only version {result['version']}: back it up")
    print(f"note: {note}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from svcgate.registry import cli as registry_cli

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
        "rotate-key",
        help="add a new key-encryption key and re-wrap every credential (root)",
        description="With a running daemon the rotation goes through it; otherwise it runs "
        "offline on the database.",
    )
    rotate.add_argument(
        "--key-file",
        help="the key source file (default: $SVC_VAULT_KEY_FILE, /etc/svcgate/vault.key if it "
        "exists, else <data dir>/vault.key)",
    )
    rotate.add_argument(
        "--socket", help="control socket (default: $SVC_CONTROL_SOCKET or <data dir>/control.sock)"
    )
    rotate.add_argument("--json", action="store_true", help="print JSON for scripts")
    rotate.set_defaults(func=cmd_vault_rotate)
    operator_cli.add_parsers(sub)
    registry_cli.add_parsers(sub)
    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=lambda _: print(f"svcgate {__version__}") or 0)
    return parser


OPERATOR_COMMANDS = frozenset({"status", "netns", "sandbox", "profile", "audit", "backup"})


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    if arguments and arguments[0] in OPERATOR_COMMANDS:
        return operator_cli.main(arguments)
    args = build_parser().parse_args(arguments)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
