"""Operator commands that talk to the running daemon over its root-only control socket
(:mod:`svcgate.operator_socket`):

- ``svcgate status``: version, uptime, listeners, OIDC, registry, counts;
- ``svcgate netns ls`` / ``netns inspect NAME``: sandbox namespaces, one in detail;
- ``svcgate sandbox ps`` / ``sandbox logs PROFILE SERVER`` / ``sandbox kill PROFILE SERVER``;
- ``svcgate profile warm SLUG`` / ``profile cold SLUG``: start or stop a profile's runtime;
- ``svcgate audit tail [-n N] [-f] [--kind K]``: the newest audit rows, and new ones as they
  are written;
- ``svcgate backup FILE``: a consistent copy of the database (:mod:`svcgate.operator_backup`).

``svcgate vault rotate-key`` also uses the socket (it lives in :mod:`svcgate.cli`: it needs
the vault). The socket is found like the daemon finds it: ``--socket``, else
``SVC_CONTROL_SOCKET``, else ``<data dir>/control.sock`` with the data directory from
``SVC_DATA_DIR`` / ``$STATE_DIRECTORY`` / ``./svcgate-data``. Output is a human table or text
by default and JSON with ``--json`` (``audit tail``: one JSON object per line). Standard
library only: these commands also run under a bare ``python3`` with only the repository on
the path.

Error handling:
    Every failure (no socket, daemon not running, permission denied, no answer, an error
    response, bad input) is one line on stderr starting with ``svcgate:`` and exit status 1.
    ``profile warm`` also exits 1 when a server of the profile did not start (after printing
    the table). ``audit tail --follow`` ends with status 0 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from svcgate.operator_backup import run_backup
from svcgate.operator_client import (
    MAX_RESPONSE_BYTES,
    REQUEST_TIMEOUT,
    Connection,
    ControlError,
    DaemonNotRunning,
    call,
    socket_path,
)

__all__ = [
    "MAX_RESPONSE_BYTES",
    "REQUEST_TIMEOUT",
    "ControlError",
    "DaemonNotRunning",
    "add_parsers",
    "build_parser",
    "call",
    "main",
    "run_command",
    "socket_path",
]

# Warming a profile starts its servers (each may take up to a minute to initialise).
SLOW_TIMEOUT = 300.0
AUDIT_KINDS = ("egress", "auth", "admin")
MAX_AUDIT_ROWS = 1000
FOLLOW_INTERVAL = 0.5


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
    if isinstance(value, list):
        value = " ".join(str(v) for v in value)
    text = "-" if value is None or value == "" else str(value)
    # One row per line whatever a profile slug, server name or audit detail holds.
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


def render_fields(fields: Sequence[tuple[str, Any]]) -> str:
    """``label  value`` lines with the values aligned."""
    width = max(len(label) for label, _ in fields)
    return "\n".join(f"{label.ljust(width)}  {_cell(value)}".rstrip() for label, value in fields)


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
INTERFACE_COLUMNS = (
    ("INTERFACE", "name"),
    ("STATE", "state"),
    ("MTU", "mtu"),
    ("ADDRESSES", "addresses"),
)
ROUTE_COLUMNS = (
    ("DESTINATION", "destination"),
    ("GATEWAY", "gateway"),
    ("DEVICE", "device"),
    ("SOURCE", "source"),
    ("TABLE", "table"),
    ("TYPE", "type"),
    ("SCOPE", "scope"),
)
SERVER_COLUMNS = (("SERVER", "name"), ("STATE", "state"), ("TOOLS", "tools"), ("ERROR", "error"))
AUDIT_COLUMNS = (
    ("ID", "id"),
    ("TIME", "ts"),
    ("KIND", "kind"),
    ("USER", "user_id"),
    ("PROFILE", "profile_id"),
    ("SERVER", "server"),
    ("HOST", "host"),
    ("DECISION", "decision"),
    ("DETAIL", "detail"),
)


def _malformed() -> ControlError:
    return ControlError("the daemon sent a malformed answer")


def _rows(rows: Any) -> list[dict[str, Any]]:
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise _malformed()
    return rows


def _object(result: Any) -> dict[str, Any]:
    if not isinstance(result, dict):
        raise _malformed()
    return result


def _with_age(rows: Any) -> list[dict[str, Any]]:
    return [{**row, "age": format_age(row.get("age_seconds"))} for row in _rows(rows)]


def render_netns(rows: Any) -> str:
    return render_table(NETNS_COLUMNS, _with_age(rows))


def render_ps(rows: Any) -> str:
    return render_table(PS_COLUMNS, _with_age(rows))


def render_logs(result: Any) -> str:
    lines = result.get("lines") if isinstance(result, dict) else None
    if not isinstance(lines, list):
        raise _malformed()
    return "\n".join(str(line) for line in lines)


def render_inspect(result: Any) -> str:
    result = _object(result)
    sandbox = _object(result.get("sandbox"))
    egress = _object(result.get("egress"))
    fields = [
        ("namespace", result.get("namespace")),
        ("profile", f"{sandbox.get('profile_slug')} (id {sandbox.get('profile_id')})"),
        ("server", sandbox.get("server")),
        ("owner", sandbox.get("owner_user_id")),
        ("state", sandbox.get("state")),
        ("pid", sandbox.get("pid")),
        ("pids", sandbox.get("pids") or None),
        ("age", format_age(sandbox.get("age_seconds"))),
        ("egress", f"{egress.get('listener') or '-'}, {egress.get('connections')} open"),
    ]
    interfaces = [
        {**i, "state": f"{'up' if i.get('up') else 'down'}/{str(i.get('operstate')).lower()}"}
        for i in _rows(result.get("interfaces"))
    ]
    routes = _rows(result.get("routes"))
    return "\n\n".join(
        [
            render_fields(fields),
            render_table(INTERFACE_COLUMNS, interfaces),
            render_table(ROUTE_COLUMNS, routes) if routes else "no routes",
        ]
    )


def _profile_label(result: dict[str, Any]) -> str:
    profile = _object(result.get("profile"))
    return f"{profile.get('slug')} (id {profile.get('id')})"


def render_kill(result: Any) -> str:
    result = _object(result)
    killed = result.get("killed_pid")
    head = f"stopped the sandbox of {result.get('server')} in profile {_profile_label(result)}" + (
        f" (pid {killed})" if killed is not None else ""
    )
    if not result.get("restarted"):
        return f"{head}; the profile was not warm: the next request starts it"
    again = f"started again: {result.get('state')}"
    if result.get("pid") is not None:
        again += f" (pid {result.get('pid')})"
    if result.get("error"):
        again += f": {result.get('error')}"
    return f"{head}\n{again}"


def render_warm(result: Any) -> str:
    result = _object(result)
    head = f"profile {_profile_label(result)} is {result.get('state')} ({result.get('seconds')} s)"
    servers = _rows(result.get("servers"))
    return f"{head}\n{render_table(SERVER_COLUMNS, servers)}" if servers else f"{head}; no servers"


def warm_failures(result: Any) -> list[str]:
    """Names of the servers of a warmed profile that are not ready."""
    return [s["name"] for s in _rows(_object(result).get("servers")) if s.get("state") != "ready"]


def render_cold(result: Any) -> str:
    result = _object(result)
    stopped = result.get("stopped") or []
    text = f"profile {_profile_label(result)} is cold (was {result.get('was')})"
    return text + (f"; stopped: {', '.join(map(str, stopped))}" if stopped else "")


def _counted(counts: Mapping[str, Any]) -> str:
    return ", ".join(f"{n} {state}" for state, n in counts.items()) or "none"


def render_status(result: Any) -> str:
    result = _object(result)
    listeners = _object(result.get("listeners"))
    oidc = _object(result.get("oidc"))
    registry = _object(result.get("registry"))
    counts = _object(result.get("counts"))
    if not oidc.get("configured"):
        idp = "not configured"
    elif oidc.get("reachable"):
        idp = f"{oidc.get('issuer')} (reachable)"
    else:
        idp = f"{oidc.get('issuer')} (unreachable: {oidc.get('error')})"
    if not registry.get("configured"):
        index = "not configured"
    else:
        index = str(registry.get("index_url"))
        if registry.get("index_version") is not None:
            index += f", index version {registry['index_version']}"
            index += f" (expires {registry.get('index_expires')})"
        else:
            index += ", no index accepted yet"
    fields = [
        ("version", f"svcgate {result.get('version')}"),
        ("pid", result.get("pid")),
        ("uptime", format_age(result.get("uptime_seconds"))),
        ("schema version", result.get("schema_version")),
        ("database", result.get("database")),
        ("http", listeners.get("http") or None),
        ("control socket", listeners.get("control_socket")),
        ("metrics", listeners.get("metrics") or "not configured"),
        ("oidc", idp),
        ("registry", index),
        ("installed servers", registry.get("installed_servers")),
        ("profiles", counts.get("profiles")),
        ("servers", counts.get("servers")),
        ("users", counts.get("users")),
        ("credentials", counts.get("credentials")),
        ("runtimes", f"{counts.get('warm', 0)} warm, {counts.get('starting', 0)} starting"),
        ("sandboxes", _counted(_object(counts.get("sandboxes", {})))),
    ]
    return render_fields(fields)


Request = Callable[[argparse.Namespace], dict[str, Any]]
Renderer = Callable[[Any], str]


def _profile_request(cmd: str) -> Request:
    return lambda args: {"cmd": cmd, "profile": args.profile}


# operator_command -> (request builder, renderer, timeout)
_SIMPLE: dict[str, tuple[Request, Renderer, float]] = {
    "status": (lambda _: {"cmd": "status"}, render_status, REQUEST_TIMEOUT),
    "netns.ls": (lambda _: {"cmd": "netns.ls"}, render_netns, REQUEST_TIMEOUT),
    "netns.inspect": (
        lambda args: {"cmd": "netns.inspect", "name": args.name},
        render_inspect,
        REQUEST_TIMEOUT,
    ),
    "sandbox.ps": (lambda _: {"cmd": "sandbox.ps"}, render_ps, REQUEST_TIMEOUT),
    "sandbox.logs": (
        lambda args: {
            "cmd": "sandbox.logs",
            "profile": args.profile,
            "server": args.server,
            **({} if args.lines is None else {"lines": args.lines}),
        },
        render_logs,
        REQUEST_TIMEOUT,
    ),
    "sandbox.kill": (
        lambda args: {"cmd": "sandbox.kill", "profile": args.profile, "server": args.server},
        render_kill,
        SLOW_TIMEOUT,
    ),
    "profile.warm": (_profile_request("profile.warm"), render_warm, SLOW_TIMEOUT),
    "profile.cold": (_profile_request("profile.cold"), render_cold, SLOW_TIMEOUT),
}


class _AuditPrinter:
    """Audit rows as a table whose column widths are set by the first batch (later rows
    follow them), or as JSON lines. Every line is flushed: ``--follow`` feeds pipes."""

    def __init__(self, out: TextIO, *, as_json: bool) -> None:
        self._out = out
        self._json = as_json
        self._widths: list[int] | None = None

    def _line(self, cells: list[str], widths: list[int]) -> None:
        text = "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
        print(text, file=self._out, flush=True)

    def print(self, events: list[dict[str, Any]]) -> None:
        if self._json:
            for event in events:
                print(json.dumps(event), file=self._out, flush=True)
            return
        rows = [[_cell(event.get(key)) for _, key in AUDIT_COLUMNS] for event in events]
        if self._widths is None:
            headers = [header for header, _ in AUDIT_COLUMNS]
            self._widths = [
                max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)
            ]
            self._line(headers, self._widths)
        for row in rows:
            self._line(row, self._widths)


def _audit_tail(args: argparse.Namespace, path: Path, out: TextIO) -> int:
    if not 1 <= args.lines <= MAX_AUDIT_ROWS:
        raise ControlError(f"-n must be between 1 and {MAX_AUDIT_ROWS}")
    if args.kind is not None and args.kind not in AUDIT_KINDS:
        raise ControlError(f"--kind must be one of {', '.join(AUDIT_KINDS)}")
    request: dict[str, Any] = {"cmd": "audit.tail", "limit": args.lines}
    if args.kind is not None:
        request["kind"] = args.kind
    printer = _AuditPrinter(out, as_json=args.json)
    with Connection(path) as conn:
        result = _object(conn.request(request))
        printer.print(_rows(result.get("events")))
        if not args.follow:
            return 0
        cursor = result.get("cursor")
        try:
            while True:
                page = _object(conn.request({**request, "limit": MAX_AUDIT_ROWS, "after": cursor}))
                events = _rows(page.get("events"))
                if events:
                    printer.print(events)
                cursor = page.get("cursor")
                if len(events) < MAX_AUDIT_ROWS:
                    time.sleep(FOLLOW_INTERVAL)
        except KeyboardInterrupt:
            return 0


def run_command(
    args: argparse.Namespace,
    *,
    env: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run one operator command as parsed by the CLI; return the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    env = os.environ if env is None else env
    if args.operator_command == "backup":
        return run_backup(args, env=env, out=out, err=err)
    try:
        path = socket_path(args.socket, env)
        if args.operator_command == "audit.tail":
            return _audit_tail(args, path, out)
        build, render, timeout = _SIMPLE[args.operator_command]
        result = call(path, build(args), timeout=timeout)
        text = render(result)
        failed = warm_failures(result) if args.operator_command == "profile.warm" else []
    except ControlError as exc:
        print(f"svcgate: {exc}", file=err)
        return 1
    except KeyboardInterrupt:
        return 130
    if args.json:
        print(json.dumps(result, indent=2), file=out)
    elif text:
        print(text, file=out)
    if failed:
        total = len(_rows(result.get("servers")))
        print(
            f"svcgate: {len(failed)} of {total} server(s) of profile {args.profile!r} did not"
            f" start: {', '.join(failed)}",
            file=err,
        )
        return 1
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the operator command groups to the ``svcgate`` parser."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    common.add_argument(
        "--socket", help="control socket (default: $SVC_CONTROL_SOCKET or <data dir>/control.sock)"
    )

    def command(
        parent: argparse._SubParsersAction[argparse.ArgumentParser],
        name: str,
        name_in: str,
        **kw: Any,
    ) -> argparse.ArgumentParser:
        parser = parent.add_parser(name, parents=[common], **kw)
        parser.set_defaults(func=run_command, operator_command=name_in)
        return parser

    command(sub, "status", "status", help="what the running daemon is doing (root)")

    netns_sub = sub.add_parser(
        "netns", help="inspect sandbox network namespaces (root)"
    ).add_subparsers(dest="netns_command", required=True)
    command(netns_sub, "ls", "netns.ls", help="namespaces with their profile, server, owner")
    inspect = command(
        netns_sub, "inspect", "netns.inspect", help="one namespace: interfaces, routes, egress"
    )
    inspect.add_argument("name", help="namespace name (from netns ls)")

    sandbox_sub = sub.add_parser(
        "sandbox", help="inspect and stop sandboxes (root)"
    ).add_subparsers(dest="sandbox_command", required=True)
    command(sandbox_sub, "ps", "sandbox.ps", help="list sandboxes")
    logs = command(sandbox_sub, "logs", "sandbox.logs", help="a sandbox's recent stderr lines")
    logs.add_argument("profile", help="profile slug (or id)")
    logs.add_argument("server", help="server name")
    logs.add_argument("-n", "--lines", type=int, help="only the last N lines")
    kill = command(
        sandbox_sub,
        "kill",
        "sandbox.kill",
        help="stop a sandbox; a warm profile starts a fresh one at once",
    )
    kill.add_argument("profile", help="profile slug (or id)")
    kill.add_argument("server", help="server name")

    profile_sub = sub.add_parser(
        "profile", help="start or stop a profile's runtime (root)"
    ).add_subparsers(dest="profile_command", required=True)
    warm = command(profile_sub, "warm", "profile.warm", help="start every server of a profile")
    warm.add_argument("profile", help="profile slug (or id)")
    cold = command(profile_sub, "cold", "profile.cold", help="stop a profile's runtime")
    cold.add_argument("profile", help="profile slug (or id)")

    audit_sub = sub.add_parser("audit", help="read the audit log (root)").add_subparsers(
        dest="audit_command", required=True
    )
    tail = command(audit_sub, "tail", "audit.tail", help="the newest audit rows, oldest first")
    tail.add_argument("-n", "--lines", type=int, default=20, help="how many rows (1-1000)")
    tail.add_argument("-f", "--follow", action="store_true", help="print new rows until Ctrl-C")
    tail.add_argument("--kind", help="only rows of this kind (egress, auth, admin)")

    backup = command(sub, "backup", "backup", help="copy the database while the daemon runs")
    backup.add_argument("file", help="where to write the copy")
    backup.add_argument("--force", action="store_true", help="replace FILE if it exists")


def build_parser() -> argparse.ArgumentParser:
    """A parser with only the operator commands (``svcgate.cli`` adds them to the full one)."""
    parser = argparse.ArgumentParser(prog="svcgate")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The operator commands without the daemon's imports (for minimal environments)."""
    return run_command(build_parser().parse_args(argv))
