"""The operator control socket: a root-only local unix socket for the ``svcgate`` operator
commands (:mod:`svcgate.operator_cli`).

Served by the daemon's root nursery, never by the public listener. Protocol: one JSON object
per line in each direction; a connection may carry several requests. What each command does
is in :mod:`svcgate.operator_commands` and :mod:`svcgate.operator_records`; docs/api.md
("Operator CLI") has the result shapes.

==================  ==========================================  ================================
request ``cmd``     other fields                                ``result``
==================  ==========================================  ================================
``sandbox.ps``      —                                           list of sandboxes (runtime info)
``netns.ls``        —                                           list of namespaces with owners
``sandbox.logs``    ``profile`` (slug or id), ``server``,       ``{"profile", "server", "lines"}``
                    optional ``lines`` (1-10000)                (the stderr ring buffer)
``netns.inspect``   ``name``                                    ``{"namespace", "sandbox",
                                                                "interfaces", "routes",
                                                                "egress"}``
``sandbox.kill``    ``profile``, ``server``                     ``{"profile", "server",
                                                                "killed_pid", "restarted",
                                                                "state", "error", "pid"}``
``profile.warm``    ``profile``                                 ``{"profile", "state",
                                                                "servers", "seconds"}``
``profile.cold``    ``profile``                                 ``{"profile", "was", "state",
                                                                "stopped"}``
``status``          —                                           version, pid, uptime,
                                                                listeners, OIDC, registry,
                                                                counts, schema version
``db.info``         —                                           ``{"path", "schema_version"}``
``audit.tail``      optional ``limit`` (1-1000, default 20),    ``{"events", "cursor"}``
                    ``after`` (an audit id), ``kind``
``vault.status``    —                                           ``{"active", "fingerprints",
                                                                "credentials"}``
``vault.rotate``    one file descriptor (``SCM_RIGHTS``): the   ``{"version", "rewrapped",
                    key file, open read-only                    "retired"}``
==================  ==========================================  ================================

Every response is ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": {"code": ..., "message": ...}}`` with code ``bad_request``,
``unknown_command``, ``not_found``, ``start_failed``, ``unavailable``, ``timeout``,
``forbidden`` (a peer that is not root) or ``internal``.

File descriptors: the socket reads with ``recvmsg`` and keeps descriptors passed with
``SCM_RIGHTS`` (at most :data:`MAX_FDS` per message, received close-on-exec) for the request
whose line they arrived with; every one is closed once that request is answered. Only
``vault.rotate`` uses one: key bytes never travel in the JSON lines.

Access control: the socket file is created with mode 0600 owned by the daemon's user (bound
in a private 0700 directory and renamed into place, so it is never reachable with looser
permissions), and each connection's peer credentials (``SO_PEERCRED``) must be uid 0 or the
daemon's own uid.

Resource handling:
    :func:`serve_control_socket` binds, reports the path through ``task_status``, and serves
    clients in its own nursery. Each client has an idle deadline for reading a request and
    for writing an answer, a bounded request size, and :data:`ANSWER_TIMEOUT` per answer
    (warming a profile or re-wrapping every credential takes a while). On cancellation the
    listener and every client connection close, received descriptors are closed, and the
    socket file is removed if it is still ours (same inode).

Error handling:
    A socket path that is in use by a live daemon, or exists and is not a socket, raises
    :class:`ControlSocketError` before readiness; a stale socket file (nobody listening) is
    replaced. A malformed request gets an error response; an unexpected error while
    answering is logged with its traceback and answered ``internal``, and never ends the
    server or other connections.
"""

from __future__ import annotations

import array
import contextlib
import json
import logging
import os
import socket
import stat
import struct
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import trio

from svcgate import operator_records as records
from svcgate.operator_commands import (
    Command,
    OperatorContext,
    RequestError,
    SandboxDirectory,
    netns_inspect,
    netns_ls,
    profile_cold,
    profile_warm,
    sandbox_kill,
    sandbox_logs,
    sandbox_ps,
)

__all__ = [
    "ControlSocketError",
    "OperatorContext",
    "SandboxDirectory",
    "bind_control_socket",
    "serve_control_socket",
]

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024
IDLE_TIMEOUT = 30.0
ANSWER_TIMEOUT = 600.0
MAX_FDS = 4
_FD_SPACE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
_PEERCRED = struct.Struct("3i")
# sun_path holds 108 bytes including the terminating NUL.
MAX_SUN_PATH = 107


class ControlSocketError(Exception):
    """The control socket cannot be served; ``str()`` is one line for the operator."""


COMMANDS: dict[str, Command] = {
    "status": records.status,
    "netns.ls": netns_ls,
    "netns.inspect": netns_inspect,
    "sandbox.ps": sandbox_ps,
    "sandbox.logs": sandbox_logs,
    "sandbox.kill": sandbox_kill,
    "profile.warm": profile_warm,
    "profile.cold": profile_cold,
    "db.info": records.db_info,
    "audit.tail": records.audit_tail,
    "vault.status": records.vault_status,
    "vault.rotate": records.vault_rotate,
}


async def answer(request: object, context: OperatorContext, fds: list[int]) -> Any:
    """The ``result`` for one parsed request; raises :class:`RequestError` for bad input."""
    if not isinstance(request, dict) or not isinstance(request.get("cmd"), str):
        raise RequestError("bad_request", 'a request is a JSON object with a "cmd" string')
    command = COMMANDS.get(request["cmd"])
    if command is None:
        raise RequestError("unknown_command", f"unknown command {request['cmd']!r}")
    return await command(context, request, fds)


async def respond(line: bytes, context: OperatorContext, fds: list[int]) -> dict[str, Any]:
    """The full response object for one request line."""
    try:
        try:
            request = json.loads(line)
        except ValueError as exc:
            raise RequestError("bad_request", "the request is not valid JSON") from exc
        with trio.move_on_after(ANSWER_TIMEOUT) as deadline:
            return {"ok": True, "result": await answer(request, context, fds)}
        assert deadline.cancelled_caught
        raise RequestError("timeout", f"no answer within {ANSWER_TIMEOUT:g} s")
    except RequestError as exc:
        return {"ok": False, "error": {"code": exc.code, "message": str(exc)}}
    except Exception:  # one request's bug must not end the connection or the server
        log.exception("control socket request failed")
        return {"ok": False, "error": {"code": "internal", "message": "internal error"}}


def _encode(response: dict[str, Any]) -> bytes:
    return json.dumps(response, separators=(",", ":")).encode() + b"\n"


def _error(code: str, message: str) -> bytes:
    return _encode({"ok": False, "error": {"code": code, "message": message}})


def _peer_allowed(stream: trio.SocketStream) -> bool:
    raw = stream.socket.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    _, uid, _ = _PEERCRED.unpack(raw)
    return uid in (0, os.geteuid())


class _LineTooLong(Exception):
    pass


def _close_all(fds: list[int]) -> None:
    while fds:
        with contextlib.suppress(OSError):
            os.close(fds.pop())


class _LineReader:
    """Request lines, and the descriptors passed with them (``recvmsg``: a plain ``recv``
    would make the kernel drop them)."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self._sock = sock
        self._buffer = bytearray()
        self.fds: list[int] = []

    async def _receive(self) -> bytes:
        data, ancillary, _, _ = await self._sock.recvmsg(65536, _FD_SPACE, socket.MSG_CMSG_CLOEXEC)
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                self.fds.extend(fds)
        return data

    async def readline(self) -> bytes | None:
        """The next line without its newline; None at EOF."""
        while (newline := self._buffer.find(b"\n")) < 0:
            if len(self._buffer) > MAX_REQUEST_BYTES:
                raise _LineTooLong
            chunk = await self._receive()
            if not chunk:
                return None
            self._buffer += chunk
        line = bytes(self._buffer[:newline])
        del self._buffer[: newline + 1]
        return line


async def _serve_client(context: OperatorContext, stream: trio.SocketStream) -> None:
    reader = _LineReader(stream.socket)
    async with stream:
        try:
            if not _peer_allowed(stream):
                await stream.send_all(_error("forbidden", "the control socket is root-only"))
                return
            while True:
                line: bytes | None = None
                with trio.move_on_after(IDLE_TIMEOUT):
                    line = await reader.readline()
                if line is None:
                    return  # EOF, or idle for too long: hang up
                if not line.strip():
                    continue
                try:
                    response = await respond(line, context, reader.fds)
                finally:
                    _close_all(reader.fds)
                with trio.move_on_after(IDLE_TIMEOUT) as write:
                    await stream.send_all(_encode(response))
                if write.cancelled_caught:
                    return
        except _LineTooLong:
            with trio.move_on_after(IDLE_TIMEOUT):
                await stream.send_all(_error("bad_request", "request line too long"))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return  # the client went away
        finally:
            _close_all(reader.fds)


def _socket_in_use(path: Path) -> bool:
    """True if something accepts connections at ``path`` (a live daemon)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except BlockingIOError:
        return True  # a full backlog: someone is listening
    finally:
        probe.close()
    return True


def bind_control_socket(path: Path, backlog: int = 16) -> tuple[socket.socket, tuple[int, int]]:
    """Bind and listen on ``path`` with mode 0600; return the socket and (st_dev, st_ino).

    Raises :class:`ControlSocketError`.
    """
    # mkdtemp's name (".c" + 8 characters) is as long as "control.sock": check both.
    if max(len(os.fsencode(path)), len(os.fsencode(path.parent)) + 13) > MAX_SUN_PATH:
        raise ControlSocketError(f"{path}: path too long for a unix socket")
    try:
        return _bind(path, backlog)
    except OSError as exc:
        raise ControlSocketError(f"cannot serve {path}: {exc.strerror or exc}") from exc


def _bind(path: Path, backlog: int) -> tuple[socket.socket, tuple[int, int]]:
    with contextlib.suppress(FileExistsError):
        path.parent.mkdir(parents=True, mode=0o755)
    try:
        st = path.lstat()
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise ControlSocketError(f"{path} exists and is not a socket")
        if _socket_in_use(path):
            raise ControlSocketError(f"{path} is in use (is another svcgate running?)")
        path.unlink(missing_ok=True)  # stale: left by a daemon that was killed
    # Bind in a private directory, set the mode, then rename into place: the socket is never
    # reachable under its real name with the umask's permissions.
    private = Path(tempfile.mkdtemp(prefix=".c", dir=path.parent))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    ident: tuple[int, int] | None = None
    try:
        sock.bind(str(private / "s"))
        os.chmod(private / "s", 0o600)
        os.rename(private / "s", path)
        placed = path.lstat()
        ident = (placed.st_dev, placed.st_ino)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        if ident is not None:
            _remove_if_ours(path, ident)
        raise
    finally:
        with contextlib.suppress(OSError):
            (private / "s").unlink()
        with contextlib.suppress(OSError):
            private.rmdir()
    return sock, ident


def _remove_if_ours(path: Path, ident: tuple[int, int]) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if (st.st_dev, st.st_ino) == ident:
        path.unlink(missing_ok=True)


async def serve_control_socket(
    path: Path,
    context: OperatorContext | SandboxDirectory,
    *,
    task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the control socket at ``path`` until cancelled; see the module docstring.

    ``context`` may be a bare sandbox directory (the supervisor): then only the commands
    about sandboxes and namespaces are served, the others answer ``unavailable``.
    """
    if not isinstance(context, OperatorContext):
        context = OperatorContext(directory=context)
    sock, ident = bind_control_socket(path)
    try:
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    except BaseException:
        sock.close()
        _remove_if_ours(path, ident)
        raise
    try:
        async with listener, trio.open_nursery() as nursery:
            await nursery.start(
                partial(
                    trio.serve_listeners,
                    partial(_serve_client, context),
                    [listener],
                    handler_nursery=nursery,
                )
            )
            log.info("operator control socket at %s", path)
            task_status.started(path)
    finally:
        _remove_if_ours(path, ident)
