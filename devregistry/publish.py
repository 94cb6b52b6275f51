"""Publish a signed registry index into a directory, and pin a server's tools by running it.

:class:`Publisher` owns one directory::

    <dir>/index-key.pem   the Ed25519 signing key (PKCS#8 PEM, 0600), created on first use
    <dir>/version         the highest index version published so far
    <dir>/index.json      the index (schema: :mod:`svcgate.registry.index`)
    <dir>/index.json.sig  its detached signature (:func:`svcgate.registry.signing.sign`)

Each :meth:`Publisher.publish` writes a new index whose version is one more than the last
one published from this directory (1 at first), so a gateway that accepted an earlier
index (its rollback protection remembers the highest version) accepts the next. Files are
written to a temp file and renamed into place, the version file first: an interrupted
publish can skip a version number but never reuse one for different bytes. The document is
parsed with the gateway's own :func:`~svcgate.registry.index.parse_index` before it is
written, so a malformed document (and, with ``strict``, a malformed entry) fails here
rather than in the gateway.

:func:`tool_pins` starts a stdio MCP server script with the host's ``/usr/bin/python3``,
asks for ``tools/list`` (following ``nextCursor``) and returns the manifest ``tools`` entries
(:func:`svcgate.registry.toolpins.pins_for`). The server gets a minimal environment plus the
given one, runs under an overall timeout, and is terminated (then killed) afterwards
whatever happened.

Errors: :class:`PublishError` for an unusable directory, version file or index document;
:class:`ToolPinError` (with the server's stderr) when the server does not answer properly;
:class:`svcgate.registry.signing.SignatureError` for an unreadable key. Dev tooling only: the
gateway never imports this package.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Set
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from cryptography.hazmat.primitives import serialization

from svcgate.registry import signing
from svcgate.registry.index import IndexFormatError, parse_index
from svcgate.registry.toolpins import pins_for

INDEX_NAME = "index.json"
KEY_NAME = "index-key.pem"
VERSION_NAME = "version"
DEFAULT_LIFETIME = timedelta(days=30)
HOST_PYTHON = "/usr/bin/python3"
PIN_TIMEOUT = 30.0
PROTOCOL = "2025-06-18"


class PublishError(RuntimeError):
    """The index could not be published; ``str()`` says why."""


class ToolPinError(RuntimeError):
    """The server did not list its tools; ``str()`` says why and quotes its stderr."""


def _write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


class Publisher:
    """Signs and writes registry indexes into ``directory`` (see the module docstring)."""

    def __init__(self, directory: Path, key_path: Path | None = None) -> None:
        self.directory = directory.absolute()
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise PublishError(f"cannot create {self.directory}: {exc.strerror}") from None
        self.key_path = (key_path or self.directory / KEY_NAME).absolute()
        try:
            signing.generate(self.key_path)
        except FileExistsError:
            pass  # reuse the key of an earlier run
        except OSError as exc:
            raise PublishError(f"cannot create the key {self.key_path}: {exc.strerror}") from None
        self._key = signing.load_private_key(self.key_path)
        raw = self._key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.public_key = signing.PublicKey(raw)

    @property
    def public_key_text(self) -> str:
        """The trusted key for ``SVC_REGISTRY_KEYS``: ``ed25519:<base64>``."""
        return self.public_key.text()

    @property
    def index_path(self) -> Path:
        return self.directory / INDEX_NAME

    @property
    def signature_path(self) -> Path:
        return self.directory / (INDEX_NAME + ".sig")

    @property
    def index_url(self) -> str:
        """The index as a ``file://`` URL for ``SVC_REGISTRY_INDEX``."""
        return self.index_path.as_uri()

    @property
    def version_path(self) -> Path:
        return self.directory / VERSION_NAME

    def last_version(self) -> int:
        """The highest version published from this directory (0 before the first)."""
        try:
            text = self.version_path.read_text().strip()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise PublishError(f"cannot read {self.version_path}: {exc.strerror}") from None
        if not text.isdigit():
            raise PublishError(f"{self.version_path} does not hold a version number")
        return int(text)

    def publish(
        self,
        servers: Mapping[str, Any],
        *,
        expires: datetime | None = None,
        version: int | None = None,
        strict: bool = False,
    ) -> bytes:
        """Write and sign an index of ``servers``; return the index bytes as written.

        ``version`` defaults to the last published one plus one; ``expires`` to 30 days
        from now (a naive datetime is taken as UTC). The document must parse as an index;
        entries the gateway would refuse (a tag instead of a digest, an unknown field...) are
        published as given, which hostile-index tests need, unless ``strict`` is set.
        """
        previous = self.last_version()
        number = previous + 1 if version is None else version
        moment = expires or datetime.now(UTC) + DEFAULT_LIFETIME
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        document = {
            "version": number,
            "expires": moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "servers": dict(servers),
        }
        data = json.dumps(document, indent=2).encode() + b"\n"
        try:
            parsed = parse_index(data)
        except IndexFormatError as exc:
            raise PublishError(f"the index would be malformed: {exc}") from None
        if strict and parsed.errors:
            problems = "; ".join(f"{key}: {why}" for key, why in sorted(parsed.errors.items()))
            raise PublishError(f"the index would refuse entries: {problems}")
        signature = signing.sign(data, [self._key])
        try:
            _write_atomic(self.version_path, f"{max(previous, number)}\n".encode())
            _write_atomic(self.index_path, data)
            _write_atomic(self.signature_path, signature)
        except OSError as exc:
            raise PublishError(f"cannot write the index into {self.directory}: {exc}") from None
        return data


# -- tool pins -------------------------------------------------------------------------------


def _pump(stream: IO[bytes], lines: queue.Queue[bytes | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def tool_pins(
    script: Path,
    env: Mapping[str, str] | None = None,
    default_off: Set[str] = frozenset(),
    *,
    timeout: float = PIN_TIMEOUT,
    python: str = HOST_PYTHON,
) -> list[dict[str, Any]]:
    """Manifest ``tools`` entries of the stdio MCP server ``script`` (see the module doc).

    Tools named in ``default_off`` get ``"default": false``; naming a tool the server does
    not offer is an error (a typo would otherwise switch nothing off).
    """
    child_env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    child_env.update(env or {})
    with tempfile.TemporaryFile() as stderr:
        try:
            proc = subprocess.Popen(
                [python, str(script)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=child_env,
            )
        except OSError as exc:
            raise ToolPinError(f"cannot run {python} {script}: {exc.strerror}") from None
        assert proc.stdin is not None
        assert proc.stdout is not None
        lines: queue.Queue[bytes | None] = queue.Queue()
        reader = threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout
        try:
            tools = _list_tools(proc.stdin, lines, deadline)
        except ToolPinError as exc:
            stderr.seek(0)
            tail = stderr.read()[-2000:].decode(errors="replace").strip()
            suffix = f" (stderr: {tail})" if tail else ""
            raise ToolPinError(f"{script.name}: {exc}{suffix}") from None
        finally:
            _stop(proc)
            reader.join(timeout=5)
            proc.stdout.close()
    names = {tool.get("name") for tool in tools}
    unknown = sorted(set(default_off) - names)
    if unknown:
        raise ToolPinError(f"{script.name} offers no tool named {', '.join(unknown)}")
    pins = pins_for(tools)
    for pin in pins:
        pin["default"] = pin["name"] not in default_off
    return pins


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdin is not None:
        with contextlib.suppress(OSError):  # the server is gone already
            proc.stdin.close()
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _list_tools(
    stdin: IO[bytes], lines: queue.Queue[bytes | None], deadline: float
) -> list[dict[str, Any]]:
    next_id = 0

    def request(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        nonlocal next_id
        next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": next_id, "method": method}
        if params is not None:
            message["params"] = params
        send(message)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ToolPinError(f"no answer to {method} in time")
            try:
                line = lines.get(timeout=remaining)
            except queue.Empty:
                raise ToolPinError(f"no answer to {method} in time") from None
            if line is None:
                raise ToolPinError(f"the server exited before answering {method}")
            try:
                reply = json.loads(line)
            except ValueError:
                raise ToolPinError(
                    f"the server wrote a line that is not JSON: {line[:200]!r}"
                ) from None
            if not isinstance(reply, dict) or reply.get("id") != next_id:
                continue  # a notification or a log line in JSON
            if "error" in reply or not isinstance(reply.get("result"), dict):
                raise ToolPinError(f"{method} failed: {str(reply.get('error'))[:300]}")
            result: dict[str, Any] = reply["result"]
            return result

    def send(message: dict[str, Any]) -> None:
        try:
            stdin.write(json.dumps(message).encode() + b"\n")
            stdin.flush()
        except OSError as exc:
            raise ToolPinError(f"cannot write to the server: {exc.strerror}") from None

    request(
        "initialize",
        {
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "devregistry", "version": "1"},
        },
    )
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(100):
        page = request("tools/list", {"cursor": cursor} if cursor else None)
        listed = page.get("tools")
        if not isinstance(listed, list) or not all(isinstance(t, dict) for t in listed):
            raise ToolPinError("tools/list did not return a list of tools")
        tools += listed
        cursor = page.get("nextCursor")
        if not isinstance(cursor, str) or not cursor:
            return tools
    raise ToolPinError("tools/list pages never end")
