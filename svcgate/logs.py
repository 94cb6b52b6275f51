"""Structured logs: one JSON object per line under systemd, readable text on a terminal.

Every record of the process (svcgate's, the sandbox layer's, Hypercorn's error log, the MCP
SDK's, Python warnings) goes through one handler on stderr, formatted by
:class:`JsonFormatter` or :class:`TextFormatter` (``SVC_LOG_FORMAT``; ``auto`` picks JSON
when stderr *is* the journal stream systemd names in ``JOURNAL_STREAM``, text otherwise).

JSON records carry ``ts`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``, ``msg``, then
``request_id``, ``profile``, ``server``, ``sandbox`` when known, ``exc`` (the formatted
traceback) when there is one, and any other ``extra`` field the caller passed. Text records
read ``TIME LEVEL LOGGER [REQUEST_ID] MESSAGE key=value ...``.

Request ids: the HTTP front gives every request an id (:func:`request_id_from_header`) and
sets :data:`REQUEST_ID` in the request's task; trio copies the context into every task
spawned from there and into ``trio.to_thread.run_sync`` workers, so every record made while
handling the request carries it. A record that names its own ``request_id`` (a sandbox's
stderr line, tagged with the calls in flight to that sandbox) keeps that one, even ``None``.

Never a secret: every string of a record (message, field values, traceback) goes through
:func:`redact`, a last line of defence that masks the shapes of the secrets this gateway
handles (profile tokens, ``Authorization`` and ``Cookie`` values, bearer and basic
credentials, OIDC codes, states and tokens, JWTs, well-known API token formats). Code must
still never log a secret.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import secrets
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from types import TracebackType
from typing import Any, TextIO

#: The id of the HTTP request being handled by the current task (None outside requests).
REQUEST_ID: ContextVar[str | None] = ContextVar("svcgate_request_id", default=None)
REQUEST_ID_HEADER = b"x-request-id"
# Ids a client may choose: short, and nothing that could break a log line or a header.
_CLIENT_ID = re.compile(rb"[A-Za-z0-9._:-]{1,64}")
# Fields placed right after ``msg`` in this order, when known.
CONTEXT_FIELDS = ("request_id", "profile", "server", "sandbox")
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}
_NOT_EXTRA = _STANDARD | frozenset(CONTEXT_FIELDS)
# Text mode: control characters are shown escaped (newlines too, except in a traceback).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_NEWLINE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
REDACTED = "[REDACTED]"

# The secrets' shapes. A prefix group keeps the key and masks what follows it; the bare
# shapes are masked whole. Values stop at quotes, whitespace, '&', ',', ';', '}', ']', '\\'.
_VALUE = r"[^\s\"'&,;}\]\\]+"
_SECRET_SHAPES = re.compile(
    # An Authorization or Cookie header, whatever the scheme: the rest of the value.
    r"(?P<header>(?i:\b(?:proxy-)?authorization|\b(?:set-)?cookie)[\"']?\s*[:=]\s*[\"']?)"
    r"[^\"'\r\n\\]+"
    # A credential after its scheme.
    rf"|(?P<scheme>(?i:\b(?:bearer|basic)\s+)){_VALUE}"
    # Our cookies, and OIDC parameters in a query string.
    rf"|(?P<param>\bsvc_(?:session|flow)=|[?&](?i:code|state)=){_VALUE}"
    # key=value / "key": "value" for names that always hold a secret.
    r"|(?P<key>(?<![A-Za-z0-9_])(?i:client_secret|access_token|refresh_token|id_token|"
    r"code_verifier|password|passwd|api_?key|private_key|secret)[\"']?\s*[:=]\s*[\"']?)"
    rf"{_VALUE}"
    # Bare shapes: profile tokens, JWTs, GitHub/Slack/AWS/OpenAI-style keys.
    r"|\bsvc_[A-Za-z0-9_-]{20,}"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"
    r"|\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}"
    r"|AKIA[0-9A-Z]{16}|sk-[A-Za-z0-9_-]{20,})"
)
# Every shape above contains one of these (lower-cased): text without any of them is left
# alone without running the expression, which costs some 30x more than this scan.
_TRIGGERS = (
    "authorization", "cookie", "bearer", "basic", "svc_", "code=", "state=", "secret",
    "token", "passw", "apikey", "api_key", "private_key", "eyj", "ghp_", "gho_", "ghu_",
    "ghs_", "ghr_", "github_pat_", "xox", "akia", "sk-",
)  # fmt: skip
_CACHE_LIMIT = 4096
_MAX_CACHED = 256


def _mask(match: re.Match[str]) -> str:
    kept = match.group("header") or match.group("scheme") or match.group("param")
    kept = kept or match.group("key") or ""
    return kept + REDACTED


def redact(text: str) -> str:
    """``text`` with every known secret shape masked (see the module docstring)."""
    lowered = text.lower()
    if not any(trigger in lowered for trigger in _TRIGGERS):
        return text
    return _SECRET_SHAPES.sub(_mask, text)


class _Redactor:
    """:func:`redact` with a bounded memo: the same short strings (names, messages without
    numbers) come back on every request."""

    def __init__(self) -> None:
        self._memo: dict[str, str] = {}

    def text(self, text: str) -> str:
        if len(text) > _MAX_CACHED:
            return redact(text)
        done = self._memo.get(text)
        if done is None:
            if len(self._memo) >= _CACHE_LIMIT:
                self._memo.clear()
            done = self._memo[text] = redact(text)
        return done

    def value(self, value: object) -> object:
        """A field value, ready for JSON: strings masked, containers as lists or text."""
        if type(value) is str:
            done = self._memo.get(value)
            return done if done is not None else self.text(value)
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)  # JSON has no NaN or Infinity
        if value is None or isinstance(value, (bool, int, float)):
            return value
        if isinstance(value, (list, tuple, set, frozenset)):
            return [self.value(item) for item in value]
        return self.text(str(value))


# -- request ids ---------------------------------------------------------------------------


def new_request_id() -> str:
    return secrets.token_hex(8)


def request_id_from_header(value: bytes | None) -> str:
    """The client's ``X-Request-Id`` if it is short and plain (``[A-Za-z0-9._:-]{1,64}``),
    else a new random id."""
    if value is not None and _CLIENT_ID.fullmatch(value):
        return value.decode("ascii")
    return new_request_id()


def detach_request() -> None:
    """Forget the request id in this task (and the tasks it spawns from now on).

    For long-lived tasks started on behalf of a request (a profile runtime, its sandboxes):
    they outlive it and serve every later request.
    """
    REQUEST_ID.set(None)


# -- formatting -----------------------------------------------------------------------------


class _Clock:
    """RFC 3339 UTC timestamps with milliseconds; the seconds part is reused within a second."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def stamp(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{int((created - second) * 1000):03d}Z"


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except (TypeError, ValueError, KeyError):
        # A call whose %-arguments do not fit its format: keep the format, never crash.
        return f"{record.msg} [unformattable arguments]"


class _StructuredFormatter(logging.Formatter):
    """What both formats share: the fields of a record, every string redacted."""

    def __init__(self) -> None:
        super().__init__()
        self._clock = _Clock()
        self._redactor = _Redactor()

    def parts(self, record: logging.LogRecord) -> tuple[str, str, dict[str, Any], str | None]:
        """(timestamp, message, fields, traceback): fields are the context fields in
        :data:`CONTEXT_FIELDS` order, then the caller's extras."""
        clean = self._redactor
        attrs = record.__dict__
        fields: dict[str, Any] = {}
        request_id = attrs["request_id"] if "request_id" in attrs else REQUEST_ID.get()
        if request_id is not None:
            fields["request_id"] = clean.value(request_id)
        for name in CONTEXT_FIELDS[1:]:
            value = attrs.get(name)
            if value is not None:
                fields[name] = clean.value(value)
        for name, value in attrs.items():
            if name not in _NOT_EXTRA:
                fields[name] = clean.value(value)
        return (
            self._clock.stamp(record.created),
            clean.text(_message(record)),
            fields,
            self._traceback(record),
        )

    def _traceback(self, record: logging.LogRecord) -> str | None:
        parts = []
        if record.exc_info and record.exc_info[0] is not None:
            parts.append(self.formatException(record.exc_info))
        elif record.exc_text:
            parts.append(record.exc_text)
        if record.stack_info:
            parts.append(self.formatStack(record.stack_info))
        return redact("\n".join(parts)) if parts else None


class JsonFormatter(_StructuredFormatter):
    """One JSON object per record, on one line (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        ts, msg, fields, exc = self.parts(record)
        payload: dict[str, Any] = {
            "ts": ts,
            "level": record.levelname,
            "logger": record.name,
            "msg": msg,
            **fields,
        }
        if exc is not None:
            payload["exc"] = exc
        # ASCII-only: valid on any stream encoding, and lone surrogates stay escaped.
        return json.dumps(payload, separators=(",", ":"))


def _text_value(value: object) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value)
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return json.dumps(text) if not text or " " in text or "=" in text else text


class TextFormatter(_StructuredFormatter):
    """``TIME LEVEL LOGGER [REQUEST_ID] MESSAGE key=value ...``, the traceback below."""

    def format(self, record: logging.LogRecord) -> str:
        ts, msg, fields, exc = self.parts(record)
        words = [ts, record.levelname, record.name]
        request_id = fields.pop("request_id", None)
        if request_id is not None:
            shown = ",".join(map(str, request_id)) if isinstance(request_id, list) else request_id
            words.append(f"[{shown}]")
        words.append(msg)
        words.extend(f"{name}={_text_value(value)}" for name, value in fields.items())
        # One line per record, and a terminal must not interpret what a sandboxed server or a
        # client wrote.
        line = _CONTROL.sub(_escaped, " ".join(words))
        if exc is not None:
            line = f"{line}\n{_CONTROL_BUT_NEWLINE.sub(_escaped, exc)}"
        return line


def _escaped(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


# -- configuration --------------------------------------------------------------------------


def stream_is_journal(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """Whether ``stream`` is the journal stream systemd connected (``JOURNAL_STREAM`` is
    ``DEVICE:INODE`` of it; a child whose stderr was redirected keeps the variable but not
    the stream)."""
    device, _, inode = environ.get("JOURNAL_STREAM", "").partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (int(device), int(inode))


def choose_format(fmt: str, stream: TextIO, environ: Mapping[str, str]) -> str:
    """``json`` or ``text`` for ``SVC_LOG_FORMAT`` = ``fmt`` (``auto``: JSON into the journal,
    text elsewhere: a terminal, a file, a pipe)."""
    if fmt != "auto":
        return fmt
    return "json" if stream_is_journal(stream, environ) else "text"


def configure_logging(
    level: str,
    *,
    fmt: str = "auto",
    stream: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
) -> str:
    """Send every logger's records to ``stream`` (stderr) in one format; return it.

    Replaces the root logger's handlers; loggers of libraries (``hypercorn.error``, ``mcp``)
    propagate to it. Python warnings and uncaught exceptions become records too, so a JSON
    stream stays one object per line.
    """
    stream = sys.stderr if stream is None else stream
    chosen = choose_format(fmt, stream, os.environ if environ is None else environ)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if chosen == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # Neither format shows them; not collecting them saves microseconds a record (the
    # logging HOWTO's "Optimization" table names these switches, _srcfile included).
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None
    for name in ("hypercorn.error", "mcp"):
        library = logging.getLogger(name)
        library.handlers.clear()
        library.propagate = True
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    return chosen


def _log_uncaught(
    kind: type[BaseException], value: BaseException, tb: TracebackType | None
) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, tb)
        return
    logging.getLogger("svcgate").critical(
        "uncaught exception: %s",
        "".join(traceback.format_exception_only(kind, value)).strip(),
        exc_info=(kind, value, tb),
    )


# -- the HTTP side ---------------------------------------------------------------------------

_Send = Callable[[dict[str, Any]], Awaitable[None]]


def echoing_request_id(send: _Send, request_id: str) -> _Send:
    """An ASGI ``send`` that adds ``X-Request-Id`` to the response's headers."""
    value = request_id.encode("ascii")

    async def send_with_id(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            # A new message and list: senders may reuse theirs (module-level header lists).
            headers = [*message.get("headers", ()), (REQUEST_ID_HEADER, value)]
            message = {**message, "headers": headers}
        await send(message)

    return send_with_id
