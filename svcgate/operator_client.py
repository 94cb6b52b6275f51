"""The operator's side of the control socket: find it, connect, send requests, read answers.

A short-lived blocking client (no event loop is needed for a few requests). Standard library
only, like everything the operator commands import: they also run under a bare ``python3``.

Error handling:
    Every failure is a :class:`ControlError` whose ``str()`` is one line for the operator;
    :class:`DaemonNotRunning` when there is no socket or nobody listens on it (commands that
    can work offline, ``backup`` and ``vault rotate-key``, fall back on it).
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from svcgate.settings import SettingsError, control_socket_from_env, data_dir_from_env

REQUEST_TIMEOUT = 10.0
MAX_RESPONSE_BYTES = 64 * 1024 * 1024


class ControlError(Exception):
    """The command failed; ``str()`` is one line for the operator, ``code`` the daemon's
    error code when it refused the request."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class DaemonNotRunning(ControlError):
    """No control socket, or a stale one: no daemon is serving."""


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
        raise DaemonNotRunning(f"no control socket at {path}: {hint}") from None
    except PermissionError:
        sock.close()
        raise ControlError(
            f"permission denied on {path}: the control socket is root-only (run as root)"
        ) from None
    except ConnectionRefusedError:
        sock.close()
        raise DaemonNotRunning(f"the daemon is not running ({path} is a stale socket)") from None
    except TimeoutError:
        sock.close()
        raise ControlError(f"the daemon at {path} did not accept the connection") from None
    except OSError as exc:
        sock.close()
        raise ControlError(f"cannot connect to {path}: {exc.strerror or exc}") from None
    return sock


class Connection:
    """One connection to the control socket; it may carry several requests."""

    def __init__(self, path: Path, *, timeout: float = REQUEST_TIMEOUT) -> None:
        self.path = path
        self._sock = _connect(path, timeout)
        self._buffer = bytearray()

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def request(
        self,
        request: Mapping[str, Any],
        *,
        fds: Sequence[int] = (),
        timeout: float = REQUEST_TIMEOUT,
    ) -> Any:
        """Send one request (with ``fds`` passed along) and return its ``result``."""
        deadline = time.monotonic() + timeout
        payload = json.dumps(dict(request)).encode() + b"\n"
        try:
            # A refusal may have been sent and the connection closed: still read it.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                if fds:
                    # The descriptors ride on the first byte; send the rest if need be.
                    sent = socket.send_fds(self._sock, [payload], list(fds))
                    self._sock.sendall(payload[sent:])
                else:
                    self._sock.sendall(payload)
            while b"\n" not in self._buffer:
                self._sock.settimeout(max(0.001, deadline - time.monotonic()))
                chunk = self._sock.recv(65536)
                if not chunk:
                    break
                self._buffer += chunk
                if len(self._buffer) > MAX_RESPONSE_BYTES:
                    raise ControlError("the daemon's answer is too large")
        except TimeoutError:
            raise ControlError(f"the daemon did not answer within {timeout:g} s") from None
        except OSError as exc:
            raise ControlError(
                f"the connection to {self.path} failed: {exc.strerror or exc}"
            ) from None
        line, newline, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        try:
            response = json.loads(line) if newline else None
        except ValueError:
            response = None
        if response is None:
            raise ControlError("the daemon closed the connection without an answer")
        if not isinstance(response, dict):
            raise ControlError("the daemon sent a malformed answer")
        if response.get("ok") is True:
            return response.get("result")
        error = response.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        code = error.get("code") if isinstance(error, dict) else None
        raise ControlError(
            str(message or "the daemon refused the request"),
            code if isinstance(code, str) else None,
        )


def call(path: Path, request: Mapping[str, Any], *, timeout: float = REQUEST_TIMEOUT) -> Any:
    """Send one request on a fresh connection and return its ``result``; raise
    :class:`ControlError` otherwise."""
    with Connection(path, timeout=timeout) as conn:
        return conn.request(request, timeout=timeout)
