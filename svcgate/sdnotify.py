"""systemd's service notification protocol (``sd_notify(3)``): tell the manager we are ready.

The unit runs with ``Type=notify``: systemd considers the service started only when the
daemon sends ``READY=1``, which it does right after the HTTP listener is bound, so
``systemctl start`` returns (and units ordered ``After=svcgate.service`` start) only once
requests are accepted. ``STOPPING=1`` is sent when the shutdown signal arrives, and
``STATUS=`` lines show up in ``systemctl status``.

Hand-written with the standard library: the protocol is one ``AF_UNIX`` datagram of
newline-separated ``KEY=VALUE`` lines sent to the socket named by ``$NOTIFY_SOCKET`` (an
absolute path, or an abstract name written with a leading ``@``), which is a dozen lines and
not worth a dependency (libsystemd bindings or a PyPI package).

Resource handling:
    :class:`Notifier` holds only the decoded address. Each :meth:`Notifier.notify` opens a
    non-blocking datagram socket, sends one message and closes the socket, so nothing is
    held between calls and the event loop never waits on the manager (a full receive queue
    drops the message instead of blocking). Sandboxes never inherit ``NOTIFY_SOCKET``: they
    are spawned with an empty environment.

Error handling:
    Notifications are advisory and must never take the daemon down: without
    ``$NOTIFY_SOCKET`` (not started by systemd) :meth:`Notifier.notify` does nothing, and an
    unusable address or a failed send is logged once at debug level and otherwise ignored.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)


def notify_address(value: str) -> str | bytes | None:
    """The socket address ``$NOTIFY_SOCKET`` names, or None when it is not one we can use.

    ``/path`` is a file-system socket; ``@name`` an abstract one (its leading NUL written as
    ``@`` in the environment). Other forms (``vsock:``, relative paths) are not supported.
    """
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return b"\0" + os.fsencode(value[1:])
    return None


class Notifier:
    """Sends notifications to the service manager named by ``$NOTIFY_SOCKET``, if any."""

    def __init__(self, socket_value: str | None) -> None:
        self._raw = socket_value or ""
        self._address = notify_address(self._raw) if self._raw else None
        self._complained = False
        if self._raw and self._address is None:
            self._debug_once("NOTIFY_SOCKET=%r is not a supported address", self._raw)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Notifier:
        return cls(env.get("NOTIFY_SOCKET"))

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, *fields: str) -> bool:
        """Send ``fields`` (``"READY=1"``, ``"STATUS=..."``) as one message; True if sent."""
        if self._address is None:
            return False
        message = "\n".join(field.replace("\n", " ") for field in fields).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.setblocking(False)
                sock.sendto(message, self._address)
        except OSError as exc:
            self._debug_once("sd_notify to %r failed: %s", self._raw, exc)
            return False
        return True

    def _debug_once(self, message: str, *args: object) -> None:
        if not self._complained:
            self._complained = True
            log.debug(message, *args)
