"""``python -m devregistry``: the demo's sample registry and its signed index, end to end.

The program runs as a real subprocess (as ``svcgate demo`` starts it): its three stdout lines
are checked, the index is verified with the gateway's own signature and index code, both
images are pulled with the gateway's OCI client and compared with a fresh host build (the
builds are deterministic, so the digests must match), and SIGTERM must stop it and its
``docker-registry`` child. A restart in the same directory reuses the key and publishes a
higher version.
"""

from __future__ import annotations

import hashlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import pytest
import trio
from process_support import processes_with

from devregistry.images import (
    ECHO_SERVER,
    HOST_PYTHON,
    NOTES_SERVER,
    ImageParts,
    python_server_image,
)
from devregistry.registry import REGISTRY_BINARY, sha256_digest
from svcgate.examples import echo_server, notes_server
from svcgate.registry import signing
from svcgate.registry.index import RegistryIndex, parse_index
from svcgate.registry.oci import OCIClient
from svcgate.registry.toolpins import tool_hash

pytestmark = pytest.mark.skipif(
    not (os.access(REGISTRY_BINARY, os.X_OK) and os.access(HOST_PYTHON, os.X_OK)),
    reason=f"needs {REGISTRY_BINARY} and {HOST_PYTHON}",
)

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 120.0


@dataclass
class Served:
    proc: subprocess.Popen[str]
    directory: Path
    index_url: str
    key: str
    servers: list[str]

    @property
    def registry_marker(self) -> str:
        """What only this instance's docker-registry has on its command line."""
        return str(self.directory / "registry" / "config.yml")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()


def start(directory: Path) -> Served:
    """Run ``python -m devregistry --dir directory`` and read its three lines."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "devregistry", "--dir", str(directory), "--port", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    got: list[str] = []
    try:
        while len(got) < 3:
            line = lines.get(timeout=START_TIMEOUT)
            assert line is not None, f"devregistry exited with {proc.wait()} after {got}"
            got.append(line.rstrip("\n"))
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    index, key, servers = got
    assert index.startswith("devregistry: index file:///"), got
    assert key.startswith("devregistry: key ed25519:"), got
    assert servers.startswith("devregistry: servers "), got
    return Served(
        proc,
        directory,
        index.removeprefix("devregistry: index "),
        key.removeprefix("devregistry: key "),
        servers.removeprefix("devregistry: servers ").split(","),
    )


def read_index(served: Served) -> tuple[bytes, RegistryIndex]:
    path = Path(urlsplit(served.index_url).path)
    data = path.read_bytes()
    key = signing.parse_public_key(served.key)
    assert signing.verify(data, Path(f"{path}.sig").read_bytes(), [key]) == key
    return data, parse_index(data)


@dataclass(frozen=True)
class Expected:
    index: RegistryIndex
    images: dict[str, ImageParts]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    running = start(tmp_path_factory.mktemp("devregistry") / "reg")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def expected(served: Served) -> Expected:
    _, index = read_index(served)
    images = {
        "pyecho": python_server_image(ECHO_SERVER.read_bytes(), name="echo_server.py"),
        "notes": python_server_image(NOTES_SERVER.read_bytes(), name="notes_server.py"),
    }
    return Expected(index, images)


def pins(tools: list[dict[str, Any]], off: set[str]) -> list[tuple[str, bool, str]]:
    return [(t["name"], t["name"] not in off, tool_hash(t)) for t in tools]


def test_the_index_is_signed_and_names_both_samples_by_digest(
    served: Served, expected: Expected
) -> None:
    assert served.servers == ["pyecho", "notes"]
    assert served.index_url == (served.directory / "index.json").as_uri()
    index = expected.index
    assert index.version == 1
    assert index.errors == {}
    assert set(index.releases) == {"pyecho", "notes"}
    key_file = served.directory / "index-key.pem"
    assert key_file.stat().st_mode & 0o777 == 0o600

    echo = index.resolve("pyecho", None)
    notes = index.resolve("notes", "1.0.0")
    assert (echo.version, notes.version) == ("1.0.0", "1.0.0")
    for release, script in ((echo, "echo_server.py"), (notes, "notes_server.py")):
        assert release.image.registry.startswith("127.0.0.1:")
        assert release.image.repository == f"samples/{release.name}"
        assert release.image.digest.startswith("sha256:")
        assert len(release.image.digest) == len("sha256:") + 64
        assert release.manifest.command == ("/usr/bin/python3", f"/app/{script}")
        assert release.manifest.limits.memory_mb == 256
        assert release.manifest.limits.pids == 64
    assert echo.manifest.egress == ("example.com",)
    assert notes.manifest.egress == ()
    assert notes.manifest.default_tools == {"add_note", "list_notes"}
    # The pins are the hashes of the tool definitions the servers really send.
    got = [(p.name, p.default, p.sha256) for p in echo.manifest.tools]
    assert got == pins(echo_server.TOOLS, set())
    got = [(p.name, p.default, p.sha256) for p in notes.manifest.tools]
    assert got == pins(notes_server.TOOLS, {"clear_notes"})


async def test_both_images_pull_and_equal_a_fresh_host_build(
    served: Served, expected: Expected, tmp_path: Path
) -> None:
    async with httpx2.AsyncClient(timeout=30) as http:
        client = OCIClient(http)
        for name, parts in expected.images.items():
            ref = expected.index.resolve(name, None).image
            with trio.fail_after(60):
                pulled = await client.pull(ref, tmp_path / name)
            assert pulled.manifest_digest == ref.digest
            assert pulled.config == parts.config
            assert [blob.digest for blob in pulled.layers] == [
                sha256_digest(data) for _, data in parts.layers
            ]
            for blob in pulled.layers:
                content = await trio.Path(blob.path).read_bytes()
                assert "sha256:" + hashlib.sha256(content).hexdigest() == blob.digest
    # Both images share the runtime layer; only the app layer differs.
    echo, notes = expected.images["pyecho"], expected.images["notes"]
    assert echo.layers[0] == notes.layers[0]
    assert echo.layers[1] != notes.layers[1]


def test_sigterm_stops_it_and_a_restart_reuses_the_key_with_a_higher_version(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "reg"
    first = start(directory)
    data_one, index_one = read_index(first)
    assert processes_with(first.registry_marker) != []
    assert first.stop() == 0
    assert processes_with(first.registry_marker) == []

    second = start(directory)
    try:
        data_two, index_two = read_index(second)
        assert second.key == first.key
        assert second.index_url == first.index_url
        assert (index_one.version, index_two.version) == (1, 2)
        assert data_two != data_one
        assert (directory / "version").read_text().strip() == "2"
        # The same images: the storage was kept and the builds are deterministic.
        for name in ("pyecho", "notes"):
            one = index_one.resolve(name, None).image.digest
            assert index_two.resolve(name, None).image.digest == one
    finally:
        assert second.stop() == 0
    assert processes_with(second.registry_marker) == []


def test_a_failure_is_one_error_line_and_status_1(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    done = subprocess.run(
        [sys.executable, "-m", "devregistry", "--dir", str(blocker)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("devregistry: error "), done.stderr
