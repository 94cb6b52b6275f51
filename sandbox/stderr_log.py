"""A sandbox's stderr: logged line by line with its identity, and kept in a ring buffer.

The ring buffer (last N lines) backs a future ``sandbox logs`` command and start-failure
messages. Lines are bounded in length: a process writing megabytes without a newline must
not grow our memory, so an over-long partial line is flushed as a line of its own.

Resource handling:
    :meth:`StderrLog.pump` reads until EOF or cancellation; it never closes the stream
    (the launcher owns it).
"""

from __future__ import annotations

import collections
import logging

import trio

logger = logging.getLogger("sandbox.stderr")

MAX_LINE_BYTES = 8192


class StderrLog:
    """Collects one sandbox's stderr lines."""

    def __init__(self, label: str, name: str, *, max_lines: int = 200) -> None:
        self.label = label
        self.name = name
        self._lines: collections.deque[str] = collections.deque(maxlen=max_lines)
        self._partial = bytearray()

    def tail(self, n: int | None = None) -> list[str]:
        """The last ``n`` lines (all kept lines when None), oldest first."""
        lines = list(self._lines)
        return lines if n is None else lines[-n:] if n > 0 else []

    def feed(self, data: bytes | bytearray) -> None:
        """Add raw bytes; complete lines are logged and kept."""
        self._partial += data
        while True:
            newline = self._partial.find(b"\n")
            if newline < 0:
                if len(self._partial) >= MAX_LINE_BYTES:
                    self._emit(bytes(self._partial[:MAX_LINE_BYTES]))
                    del self._partial[:MAX_LINE_BYTES]
                    continue
                return
            self._emit(bytes(self._partial[:newline]))
            del self._partial[: newline + 1]

    def flush(self) -> None:
        """Emit a trailing line that had no newline (at EOF)."""
        if self._partial:
            self._emit(bytes(self._partial))
            self._partial.clear()

    def _emit(self, raw: bytes) -> None:
        line = raw.decode("utf-8", errors="replace").rstrip("\r")
        self._lines.append(line)
        logger.info(
            "[%s %s] %s",
            self.label,
            self.name,
            line,
            extra={"sandbox_label": self.label, "sandbox_name": self.name},
        )

    async def pump(self, stream: trio.abc.ReceiveStream) -> None:
        """Read ``stream`` to EOF, feeding every chunk."""
        while chunk := await stream.receive_some(65536):
            self.feed(chunk)
        self.flush()
