"""The operator control socket: a root-only local unix socket for ``svcgate netns|sandbox``.

Served by the daemon's root nursery, never by the public listener. Protocol: one JSON object
per line in each direction; a connection may carry several requests.

=================  =====================================  =================================
request ``cmd``    other fields                           ``result``
=================  =====================================  =================================
``sandbox.ps``     —                                      list of sandboxes (runtime info)
``netns.ls``       —                                      list of namespaces with owners
``sandbox.logs``   ``profile`` (slug or id), ``server``,  ``{"profile", "server", "lines"}``
                   optional ``lines`` (1-10000)           (the stderr ring buffer)
=================  =====================================  =================================

Every response is ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": {"code": ..., "message": ...}}`` with code ``bad_request``,
``unknown_command``, ``not_found``, ``forbidden`` (a peer that is not root) or ``internal``.

Access control: the socket file is created with mode 0600 owned by the daemon's user (bound
in a private 0700 directory and renamed into place, so it is never reachable with looser
permissions), and each connection's peer credentials (``SO_PEERCRED``) must be uid 0 or the
daemon's own uid.

Resource handling:
    :func:`serve_control_socket` binds, reports the path through ``task_status``, and serves
    clients in its own nursery. Each client has an idle deadline and a bounded request size.
    On cancellation the listener and every client connection close, and the socket file is
    removed if it is still ours (same inode).

Error handling:
    A socket path that is in use by a live daemon, or exists and is not a socket, raises
    :class:`ControlSocketError` before readiness; a stale socket file (nobody listening) is
    replaced. A malformed request gets an error response; an unexpected error while
    answering is logged with its traceback and answered ``internal``, and never ends the
    server or other connections.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
import os
import socket
import stat
import struct
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import trio

from svcgate.supervisor import SandboxInfo, SandboxKey, SandboxNotFound

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024
IDLE_TIMEOUT = 30.0
MAX_LOG_LINES = 10_000
_PEERCRED = struct.Struct("3i")
# sun_path holds 108 bytes including the terminating NUL.
MAX_SUN_PATH = 107


class ControlSocketError(Exception):
    """The control socket cannot be served; ``str()`` is one line for the operator."""


class SandboxDirectory(Protocol):
    """What the control socket asks of the sandbox supervisor."""

    async def list(self) -> builtins.list[SandboxInfo]: ...

    def find(self, profile: str, server: str) -> SandboxKey: ...

    async def logs(self, key: SandboxKey, n: int | None = None) -> builtins.list[str]: ...


class RequestError(Exception):
    """A request the socket refuses; ``code`` goes into the error response."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _age(info: SandboxInfo, now: float) -> float | None:
    return None if info.started_at is None else round(max(0.0, now - info.started_at), 3)


def _string_field(request: dict[str, Any], name: str) -> str:
    value = request.get(name)
    if not isinstance(value, str) or not value:
        raise RequestError("bad_request", f"{name!r} must be a non-empty string")
    return value


async def answer(request: object, directory: SandboxDirectory, now: float) -> Any:
    """The ``result`` for one parsed request; raises :class:`RequestError` for bad input."""
    if not isinstance(request, dict) or not isinstance(request.get("cmd"), str):
        raise RequestError("bad_request", 'a request is a JSON object with a "cmd" string')
    cmd = request["cmd"]
    if cmd == "sandbox.ps":
        infos = await directory.list()
        return [{**info.to_json(), "age_seconds": _age(info, now)} for info in infos]
    if cmd == "netns.ls":
        return [
            {
                "namespace": info.namespace,
                "profile_id": info.profile_id,
                "profile_slug": info.profile_slug,
                "server": info.server,
                "owner_user_id": info.owner_user_id,
                "pid": info.pid,
                "state": info.state,
                "egress_listener": info.egress_listener,
                "egress_connections": info.egress_connections,
                "started_at": info.started_at,
                "age_seconds": _age(info, now),
            }
            for info in await directory.list()
            if info.namespace is not None
        ]
    if cmd == "sandbox.logs":
        profile, server = _string_field(request, "profile"), _string_field(request, "server")
        lines = request.get("lines")
        if lines is not None and (
            not isinstance(lines, int) or isinstance(lines, bool) or not 1 <= lines <= MAX_LOG_LINES
        ):
            raise RequestError("bad_request", f"'lines' must be an integer 1-{MAX_LOG_LINES}")
        try:
            key = directory.find(profile, server)
            tail = await directory.logs(key, lines)
        except SandboxNotFound as exc:
            raise RequestError("not_found", str(exc)) from exc
        return {"profile": profile, "server": server, "lines": tail}
    raise RequestError("unknown_command", f"unknown command {cmd!r}")


async def respond(line: bytes, directory: SandboxDirectory) -> dict[str, Any]:
    """The full response object for one request line."""
    try:
        try:
            request = json.loads(line)
        except ValueError as exc:
            raise RequestError("bad_request", "the request is not valid JSON") from exc
        return {"ok": True, "result": await answer(request, directory, time.time())}
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


class _LineReader:
    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    async def readline(self) -> bytes | None:
        """The next line without its newline; None at EOF."""
        while (newline := self._buffer.find(b"\n")) < 0:
            if len(self._buffer) > MAX_REQUEST_BYTES:
                raise _LineTooLong
            chunk = await self._stream.receive_some(65536)
            if not chunk:
                return None
            self._buffer += chunk
        line = bytes(self._buffer[:newline])
        del self._buffer[: newline + 1]
        return line


async def _serve_client(directory: SandboxDirectory, stream: trio.SocketStream) -> None:
    async with stream:
        try:
            if not _peer_allowed(stream):
                await stream.send_all(_error("forbidden", "the control socket is root-only"))
                return
            reader = _LineReader(stream)
            while True:
                # Each request (read, answer, write) gets the idle deadline; then we hang up.
                with trio.move_on_after(IDLE_TIMEOUT) as idle:
                    line = await reader.readline()
                    if line is not None and line.strip():
                        await stream.send_all(_encode(await respond(line, directory)))
                if line is None or idle.cancelled_caught:
                    return
        except _LineTooLong:
            with trio.move_on_after(IDLE_TIMEOUT):
                await stream.send_all(_error("bad_request", "request line too long"))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return  # the client went away


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
    directory: SandboxDirectory,
    *,
    task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the control socket at ``path`` until cancelled; see the module docstring."""
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
                    partial(_serve_client, directory),
                    [listener],
                    handler_nursery=nursery,
                )
            )
            log.info("operator control socket at %s", path)
            task_status.started(path)
    finally:
        _remove_if_ours(path, ident)
