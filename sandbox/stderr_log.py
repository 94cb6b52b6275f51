"""A sandbox's stderr: logged line by line with its identity, and kept in a ring buffer.

The ring buffer (last N lines) backs ``svcgate sandbox logs`` and start-failure messages.
Lines are bounded in length: a process writing megabytes without a newline must not grow our
memory, so an over-long partial line is flushed as a line of its own.

Each line becomes a record of the ``sandbox.stderr`` logger with the fields the owner gave
(:meth:`StderrLog.annotate`: the sandbox's name, and profile and server in the gateway) and,
when the owner said how to learn them (:meth:`StderrLog.correlate`), ``request_id``: the ids
of the requests in flight to the sandbox when the line arrived (one: that id; several: a
list; none: ``None``). The same ids prefix the line in the ring buffer (``[rid=ID] ``,
``[rid=ID1,ID2] ``). A noisy process cannot flood the log: records are cut at
:data:`MAX_LOGGED_CHARS` and limited to a burst of :data:`LOG_BURST` lines, then
:data:`LOG_RATE` lines a second, per sandbox; what is held back is counted, and the count is
logged with the next line that passes (or at EOF). The ring buffer keeps every line.

Resource handling:
    :meth:`StderrLog.pump` reads until EOF or cancellation; it never closes the stream
    (the launcher owns it).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

import trio

logger = logging.getLogger("sandbox.stderr")

MAX_LINE_BYTES = 8192
MAX_LOGGED_CHARS = 2000
LOG_RATE = 50.0  # lines a second, per sandbox, once the burst is spent
LOG_BURST = 200

#: Returns the ids of the requests in flight to the sandbox, oldest first.
InFlight = Callable[[], list[str]]


class StderrLog:
    """Collects one sandbox's stderr lines."""

    def __init__(
        self,
        label: str,
        name: str,
        *,
        max_lines: int = 200,
        rate: float = LOG_RATE,
        burst: int = LOG_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.name = name
        self._lines: collections.deque[str] = collections.deque(maxlen=max_lines)
        self._partial = bytearray()
        self._fields: dict[str, object] = {"sandbox": name}
        self._in_flight: InFlight | None = None
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._allowance = float(burst)
        self._checked = clock()
        self._held_back = 0

    def annotate(self, **fields: object) -> None:
        """Add fields to every record from now on (e.g. ``profile``, ``server``)."""
        self._fields.update(fields)

    def correlate(self, in_flight: InFlight | None) -> None:
        """Tag every line from now on with what ``in_flight()`` returns when it arrives."""
        self._in_flight = in_flight

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
        """Emit a trailing line that had no newline (at EOF), and the held-back count."""
        if self._partial:
            self._emit(bytes(self._partial))
            self._partial.clear()
        if self._held_back:
            self._report_held_back()

    def _emit(self, raw: bytes) -> None:
        line = raw.decode("utf-8", errors="replace").rstrip("\r")
        ids = self._in_flight() if self._in_flight is not None else []
        self._lines.append(f"[rid={','.join(ids)}] {line}" if ids else line)
        if not logger.isEnabledFor(logging.INFO):
            return
        if not self._admit():
            self._held_back += 1
            return
        if self._held_back:
            self._report_held_back()
        if len(line) > MAX_LOGGED_CHARS:
            line = f"{line[:MAX_LOGGED_CHARS]}... ({len(line) - MAX_LOGGED_CHARS} more chars)"
        request_id = None if not ids else ids[0] if len(ids) == 1 else ids
        logger.info("%s", line, extra={**self._fields, "request_id": request_id})

    def _admit(self) -> bool:
        """Token bucket: ``burst`` lines at once, refilled at ``rate`` lines a second."""
        now = self._clock()
        self._allowance = min(self._burst, self._allowance + (now - self._checked) * self._rate)
        self._checked = now
        if self._allowance < 1.0:
            return False
        self._allowance -= 1.0
        return True

    def _report_held_back(self) -> None:
        held, self._held_back = self._held_back, 0
        logger.warning(
            "%d stderr line(s) not logged: over %g a second (the ring buffer keeps the latest)",
            held,
            self._rate,
            extra={**self._fields, "request_id": None, "suppressed": held},
        )

    async def pump(self, stream: trio.abc.ReceiveStream) -> None:
        """Read ``stream`` to EOF, feeding every chunk."""
        while chunk := await stream.receive_some(65536):
            self.feed(chunk)
        self.flush()
