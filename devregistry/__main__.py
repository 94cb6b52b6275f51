"""Command line of the demo's sample registry: ``python -m devregistry --dir DIR [--port 0]``.

Builds the two sample servers as OCI images from the host (:mod:`devregistry.images`): the
echo server (``svcgate/examples/echo_server.py``) as ``pyecho`` 1.0.0 and the notes server
(``svcgate/examples/notes_server.py``) as ``notes`` 1.0.0. Starts ``docker-registry`` on
``127.0.0.1`` (:class:`~devregistry.registry.LocalRegistry`, storage under ``DIR/registry``),
pushes both images, pins their tools by running the scripts on the host
(:func:`~devregistry.publish.tool_pins`) and publishes a signed index naming them by digest
(:class:`~devregistry.publish.Publisher`, files in ``DIR``). Then it prints exactly::

    devregistry: index file:///.../index.json
    devregistry: key ed25519:...
    devregistry: servers pyecho,notes

on stdout and serves until SIGTERM or SIGINT, when it stops the registry and exits 0. The
signing key and the version counter stay in ``DIR``, so a restarted registry publishes a
higher index version signed by the same key (a gateway's rollback protection accepts it).

Errors: any failure prints one line ``devregistry: error ...`` on stderr and exits 1, after
stopping the registry if it had started. A signal before the lines are printed stops the
start-up (and the registry) and exits 0 without printing them.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import httpx2

from devregistry.images import ECHO_SERVER, NOTES_SERVER, python_server_image
from devregistry.publish import Publisher, tool_pins
from devregistry.registry import LocalRegistry
from svcgate.registry.signing import SignatureError

VERSION = "1.0.0"
LIMITS = {"memory_mb": 256, "pids": 64}
ERRORS = (
    OSError,
    RuntimeError,
    ValueError,
    KeyError,
    SignatureError,
    httpx2.HTTPError,
    subprocess.SubprocessError,
)


@dataclass(frozen=True)
class Sample:
    """One sample server of the index."""

    name: str
    script: Path
    description: str
    egress: tuple[str, ...] = ()
    default_off: frozenset[str] = frozenset()

    @property
    def repository(self) -> str:
        return f"samples/{self.name}"

    def release(self, image: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
        manifest: dict[str, Any] = {
            "tools": tools,
            "command": ["/usr/bin/python3", f"/app/{self.script.name}"],
            "workdir": "/app",
            "limits": dict(LIMITS),
        }
        if self.egress:
            manifest["egress"] = list(self.egress)
        return {
            "description": self.description,
            "versions": {VERSION: {"image": image, "manifest": manifest}},
        }


SAMPLES = (
    Sample(
        "pyecho",
        ECHO_SERVER,
        "Echo, add and fetch: the example echo server (fetch may reach example.com)",
        egress=("example.com",),
    ),
    Sample(
        "notes",
        NOTES_SERVER,
        "In-memory notes: add, list and clear (clear is off by default)",
        default_off=frozenset({"clear_notes"}),
    ),
)


class _Stopped(Exception):
    """A signal arrived while starting: unwind (stopping the registry) and exit 0."""


class _Signals:
    """SIGTERM/SIGINT handling: raise :class:`_Stopped` while starting, then set an event."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self._serving = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        first = not self.stop.is_set()
        self.stop.set()
        if first and not self._serving:
            raise _Stopped

    def serve_until_stopped(self) -> None:
        self._serving = True
        while not self.stop.wait(1.0):
            pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="devregistry",
        description="Sample OCI registry and signed index for the svcgate demo (dev only).",
    )
    p.add_argument(
        "--dir", required=True, help="directory for the key, the index and the registry storage"
    )
    p.add_argument("--port", type=int, default=0, help="registry port on 127.0.0.1; 0 picks one")
    return p


def _run(directory: Path, port: int, signals: _Signals) -> None:
    publisher = Publisher(directory)
    servers: dict[str, Any] = {}
    with LocalRegistry(root=directory / "registry", port=port) as registry:
        for sample in SAMPLES:
            image = python_server_image(sample.script.read_bytes(), name=sample.script.name)
            digest = registry.push_image(sample.repository, image.layers, image.config, tag=VERSION)
            pins = tool_pins(sample.script, default_off=sample.default_off)
            servers[sample.name] = sample.release(
                registry.image_ref(sample.repository, digest), pins
            )
        publisher.publish(servers, strict=True)
        print(
            f"devregistry: registry {registry.url}, index version {publisher.last_version()}",
            file=sys.stderr,
            flush=True,
        )
        print(f"devregistry: index {publisher.index_url}", flush=True)
        print(f"devregistry: key {publisher.public_key_text}", flush=True)
        print(f"devregistry: servers {','.join(servers)}", flush=True)
        signals.serve_until_stopped()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        with _Signals() as signals:
            _run(Path(args.dir).absolute(), args.port, signals)
    except _Stopped:
        return 0
    except ERRORS as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"devregistry: error {message}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
