"""Operator commands that talk to the running daemon: ``svcgate netns ls``,
``svcgate sandbox ps`` and ``svcgate sandbox logs PROFILE SERVER``.

They connect to the daemon's root-only control socket (:mod:`svcgate.operator_socket`),
found like the daemon finds it: ``--socket``, else ``SVC_CONTROL_SOCKET``, else
``<data dir>/control.sock`` with the data directory from ``SVC_DATA_DIR`` /
``$STATE_DIRECTORY`` / ``./svcgate-data``. Output is a human table by default and JSON with
``--json``. A short-lived blocking client: no event loop is needed for one request.

Error handling:
    Every failure (no socket, daemon not running, permission denied, no answer, an error
    response) is one line on stderr starting with ``svcgate:`` and exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from svcgate.settings import SettingsError, control_socket_from_env, data_dir_from_env

REQUEST_TIMEOUT = 10.0
MAX_RESPONSE_BYTES = 64 * 1024 * 1024


class ControlError(Exception):
    """The command failed; ``str()`` is one line for the operator."""


def socket_path(override: str | None, env: Mapping[str, str]) -> Path:
    if override:
        return Path(override).absolute()
    try:
        return control_socket_from_env(env, data_dir_from_env(env))
    except SettingsError as exc:
        raise ControlError(str(exc)) from exc


def _connect(path: Path, timeout: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    hint = "is the daemon running? (set SVC_CONTROL_SOCKET or SVC_DATA_DIR, or use --socket)"
    try:
        sock.connect(str(path))
    except FileNotFoundError:
        sock.close()
        raise ControlError(f"no control socket at {path}: {hint}") from None
    except PermissionError:
        sock.close()
        raise ControlError(
            f"permission denied on {path}: the control socket is root-only (run as root)"
        ) from None
    except ConnectionRefusedError:
        sock.close()
        raise ControlError(f"the daemon is not running ({path} is a stale socket)") from None
    except TimeoutError:
        sock.close()
        raise ControlError(f"the daemon at {path} did not accept the connection") from None
    except OSError as exc:
        sock.close()
        raise ControlError(f"cannot connect to {path}: {exc.strerror or exc}") from None
    return sock


def call(path: Path, request: Mapping[str, Any], *, timeout: float = REQUEST_TIMEOUT) -> Any:
    """Send one request and return its ``result``; raise :class:`ControlError` otherwise."""
    deadline = time.monotonic() + timeout
    sock = _connect(path, timeout)
    with sock:
        data = bytearray()
        try:
            # A refusal may have been sent and the connection closed: still read it.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(json.dumps(dict(request)).encode() + b"\n")
            while b"\n" not in data:
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
                if len(data) > MAX_RESPONSE_BYTES:
                    raise ControlError("the daemon's answer is too large")
        except TimeoutError:
            raise ControlError(f"the daemon did not answer within {timeout:g} s") from None
        except OSError as exc:
            raise ControlError(f"the connection to {path} failed: {exc.strerror or exc}") from None
    line = bytes(data).partition(b"\n")[0]
    try:
        response = json.loads(line)
    except ValueError:
        raise ControlError("the daemon closed the connection without an answer") from None
    if not isinstance(response, dict):
        raise ControlError("the daemon sent a malformed answer")
    if response.get("ok") is True:
        return response.get("result")
    error = response.get("error")
    message = error.get("message") if isinstance(error, dict) else None
    raise ControlError(str(message or "the daemon refused the request"))


def format_age(seconds: float | None) -> str:
    """A compact age: ``42s``, ``3m07s``, ``2h05m``, ``3d04h``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    total = int(seconds)
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    if total < 86400:
        return f"{total // 3600}h{total % 3600 // 60:02d}m"
    return f"{total // 86400}d{total % 86400 // 3600:02d}h"


def _cell(value: Any) -> str:
    text = "-" if value is None or value == "" else str(value)
    # One row per line whatever a profile slug or server name holds.
    return "".join(c if c.isprintable() else "?" for c in text)


def render_table(columns: Sequence[tuple[str, str]], rows: Sequence[Mapping[str, Any]]) -> str:
    """Left-aligned columns under upper-case headers; ``columns`` is (header, key)."""
    cells = [[_cell(row.get(key)) for _, key in columns] for row in rows]
    headers = [header for header, _ in columns]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = [headers, *cells]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


NETNS_COLUMNS = (
    ("NAMESPACE", "namespace"),
    ("PROFILE", "profile_slug"),
    ("SERVER", "server"),
    ("OWNER", "owner_user_id"),
    ("PID", "pid"),
    ("EGRESS", "egress_listener"),
    ("AGE", "age"),
    ("CONNS", "egress_connections"),
)
PS_COLUMNS = (
    ("PROFILE", "profile_slug"),
    ("SERVER", "server"),
    ("TENANT", "tenant"),
    ("OWNER", "owner_user_id"),
    ("STATE", "state"),
    ("PID", "pid"),
    ("NAMESPACE", "namespace"),
    ("AGE", "age"),
    ("EXIT", "exit_code"),
)


def _with_age(rows: Any) -> list[dict[str, Any]]:
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ControlError("the daemon sent a malformed answer")
    return [{**row, "age": format_age(row.get("age_seconds"))} for row in rows]


def render_netns(rows: Any) -> str:
    return render_table(NETNS_COLUMNS, _with_age(rows))


def render_ps(rows: Any) -> str:
    return render_table(PS_COLUMNS, _with_age(rows))


def render_logs(result: Any) -> str:
    lines = result.get("lines") if isinstance(result, dict) else None
    if not isinstance(lines, list):
        raise ControlError("the daemon sent a malformed answer")
    return "\n".join(str(line) for line in lines)


def run_command(
    args: argparse.Namespace,
    *,
    env: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run ``netns ls`` / ``sandbox ps`` / ``sandbox logs`` as parsed by the CLI."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        path = socket_path(args.socket, os.environ if env is None else env)
        if args.operator_command == "netns.ls":
            result = call(path, {"cmd": "netns.ls"})
            text = render_netns(result)
        elif args.operator_command == "sandbox.ps":
            result = call(path, {"cmd": "sandbox.ps"})
            text = render_ps(result)
        else:
            request: dict[str, Any] = {
                "cmd": "sandbox.logs",
                "profile": args.profile,
                "server": args.server,
            }
            if args.lines is not None:
                request["lines"] = args.lines
            result = call(path, request)
            text = render_logs(result)
    except ControlError as exc:
        print(f"svcgate: {exc}", file=err)
        return 1
    if args.json:
        print(json.dumps(result, indent=2), file=out)
    elif text:
        print(text, file=out)
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``netns`` and ``sandbox`` command groups to the ``svcgate`` parser."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    common.add_argument(
        "--socket", help="control socket (default: $SVC_CONTROL_SOCKET or <data dir>/control.sock)"
    )

    netns_cmd = sub.add_parser("netns", help="inspect sandbox network namespaces (root)")
    netns_sub = netns_cmd.add_subparsers(dest="netns_command", required=True)
    ls = netns_sub.add_parser(
        "ls", parents=[common], help="namespaces with their profile, server, owner and egress"
    )
    ls.set_defaults(func=run_command, operator_command="netns.ls")

    sandbox_cmd = sub.add_parser("sandbox", help="inspect running sandboxes (root)")
    sandbox_sub = sandbox_cmd.add_subparsers(dest="sandbox_command", required=True)
    ps = sandbox_sub.add_parser("ps", parents=[common], help="list sandboxes")
    ps.set_defaults(func=run_command, operator_command="sandbox.ps")
    logs = sandbox_sub.add_parser("logs", parents=[common], help="a sandbox's recent stderr lines")
    logs.add_argument("profile", help="profile slug (or id)")
    logs.add_argument("server", help="server name")
    logs.add_argument("-n", "--lines", type=int, help="only the last N lines")
    logs.set_defaults(func=run_command, operator_command="sandbox.logs")


def build_parser() -> argparse.ArgumentParser:
    """A parser with only the operator commands (``svcgate.cli`` adds them to the full one)."""
    parser = argparse.ArgumentParser(prog="svcgate")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The operator commands without the daemon's imports (for minimal environments)."""
    return run_command(build_parser().parse_args(argv))
