"""``svcgate backup FILE``: a consistent copy of the SQLite database while the daemon runs.

The copy is made by the CLI process, not the daemon: under systemd the daemon runs with
``ProtectSystem=strict`` and may not write where the operator wants the backup, while the
CLI (root) may. The daemon only says where its database is (``db.info``); without a running
daemon the database is ``<data dir>/svcgate.db``.

How: SQLite's online backup API (``sqlite3.Connection.backup``) copies every page in one
step under one read transaction of a read-only connection, so the copy is the database as
of one commit, whatever the daemon writes meanwhile (WAL: the daemon's writer is never
blocked). The copy goes into a temporary file next to FILE (mode 0600), is switched to a
rollback journal (a standalone file, no ``-wal``), checked with ``PRAGMA integrity_check``,
fsynced, and renamed into place (never over an existing FILE unless ``--force``); the
directory is fsynced too.

The vault key is not in the database: a backup alone cannot decrypt the credentials in it.
Back up the key file separately (and keep the two apart).

Standard library only (the operator commands run under a bare ``python3``).

Error handling: every failure is one ``svcgate: ...`` line and exit status 1; the temporary
file is removed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from svcgate.operator_client import ControlError, DaemonNotRunning, call, socket_path
from svcgate.settings import data_dir_from_env

# The daemon's database file name in the data directory (svcgate.daemon.DB_NAME; this
# module may not import the daemon).
DB_NAME = "svcgate.db"
KEY_NOTE = (
    "the vault key is not in the backup: back up the key file (SVC_VAULT_KEY_FILE, "
    "/etc/svcgate/vault.key under systemd) separately; without it the credentials in "
    "this backup cannot be decrypted"
)


def source_database(override: str | None, env: Mapping[str, str]) -> tuple[Path, bool]:
    """The live database (asked of the daemon) and whether a daemon answered."""
    try:
        info = call(socket_path(override, env), {"cmd": "db.info"})
    except DaemonNotRunning:
        return data_dir_from_env(env) / DB_NAME, False
    if not isinstance(info, dict) or not isinstance(info.get("path"), str):
        raise ControlError("the daemon sent a malformed answer")
    return Path(info["path"]), True


def _fsync(path: Path, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy(source: Path, tmp: Path) -> dict[str, Any]:
    """Back ``source`` up into the (empty) file ``tmp``; return what the copy holds."""
    src = sqlite3.connect(f"file:{quote(str(source))}?mode=ro", uri=True, isolation_level=None)
    try:
        src.execute("PRAGMA busy_timeout = 10000")
        dst = sqlite3.connect(tmp, isolation_level=None)
        try:
            # pages=-1: every page in one step, under one read transaction: one snapshot.
            src.backup(dst, pages=-1)
            dst.execute("PRAGMA journal_mode = DELETE")
            check = [row[0] for row in dst.execute("PRAGMA integrity_check")]
            if check != ["ok"]:
                raise ControlError(f"the copy failed its integrity check: {'; '.join(check[:3])}")
            tables = [
                row[0]
                for row in dst.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table'"
                    " AND name NOT LIKE 'sqlite_%' ORDER BY name"
                )
            ]
            counts = {
                # Names from the copy's own catalogue, quoted as identifiers.
                name: int(dst.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0])
                for name in tables
            }
            version = int(dst.execute("PRAGMA user_version").fetchone()[0])
        finally:
            dst.close()
    finally:
        src.close()
    return {"schema_version": version, "integrity": "ok", "tables": counts}


def backup(source: Path, dest: Path, *, force: bool) -> dict[str, Any]:
    """Copy ``source`` to ``dest`` (see the module docstring); raise :class:`ControlError`."""
    if not source.is_file():
        raise ControlError(f"no database at {source}")
    if dest.is_dir():
        raise ControlError(f"{dest} is a directory")
    if dest.exists() and not force:
        raise ControlError(f"{dest} exists (use --force to replace it)")
    tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.tmp")
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        try:
            summary = _copy(source, tmp)
        except sqlite3.Error as exc:
            raise ControlError(f"backup of {source} failed: {exc}") from None
        _fsync(tmp)
        if force:
            os.replace(tmp, dest)
        else:
            try:
                os.link(tmp, dest)  # unlike rename, never replaces a file made meanwhile
            except FileExistsError:
                raise ControlError(f"{dest} exists (use --force to replace it)") from None
        _fsync(dest.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise ControlError(f"cannot write {dest}: {exc.strerror or exc}") from None
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-journal")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
    return {
        "file": str(dest),
        "bytes": dest.stat().st_size,
        "source": str(source),
        **summary,
    }


def render(result: Mapping[str, Any]) -> str:
    lines = [
        f"backup written to {result['file']} ({result['bytes']} bytes, schema version "
        f"{result['schema_version']}, integrity ok)",
        f"source: {result['source']}" + ("" if result.get("daemon") else " (no daemon running)"),
        "",
    ]
    tables: Mapping[str, int] = result["tables"]
    width = max([len("TABLE"), *(len(name) for name in tables)])
    lines.append(f"{'TABLE'.ljust(width)}  ROWS")
    lines.extend(f"{name.ljust(width)}  {count}" for name, count in tables.items())
    lines += ["", f"note: {KEY_NOTE}"]
    return "\n".join(lines)


def run_backup(
    args: argparse.Namespace,
    *,
    env: Mapping[str, str] | None = None,
    out: TextIO,
    err: TextIO,
) -> int:
    env = os.environ if env is None else env
    try:
        source, daemon = source_database(args.socket, env)
        result = {**backup(source, Path(args.file).absolute(), force=args.force), "daemon": daemon}
    except ControlError as exc:
        print(f"svcgate: {exc}", file=err)
        return 1
    if args.json:
        print(json.dumps({**result, "note": KEY_NOTE}, indent=2), file=out)
    else:
        print(render(result), file=out)
    return 0
