"""``svcgate registry keygen|sign|verify|pin-tools``, and fetching the index over HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import pytest

from sandbox.images import ImageStore
from svcgate.cli import main
from svcgate.registry.config import RegistrySettings
from svcgate.registry.installed import InstalledCatalogue
from svcgate.registry.installer import Installer, InstallError
from svcgate.registry.toolpins import tool_hash
from svcgate.store import open_store

DIGEST = "sha256:" + "cd" * 32
TOOL = {"name": "echo", "description": "Echo.", "inputSchema": {"type": "object"}}


def index_bytes(version: int = 1, **extra: Any) -> bytes:
    manifest = {"tools": [{"name": "echo", "default": True, "sha256": tool_hash(TOOL)}]}
    return json.dumps(
        {
            "version": version,
            "expires": "2099-01-01T00:00:00Z",
            "servers": {
                "echo": {
                    "versions": {
                        "1.0.0": {"image": f"127.0.0.1:5000/e@{DIGEST}", "manifest": manifest}
                    }
                },
                **extra,
            },
        }
    ).encode()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["registry", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_keygen_sign_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "index.key"
    code, out, _ = run(capsys, "keygen", str(key))
    assert code == 0 and "SVC_REGISTRY_KEYS=ed25519:" in out
    assert key.stat().st_mode & 0o777 == 0o600
    public = Path(f"{key}.pub").read_text().strip()
    assert public in out and "PRIVATE" not in out
    assert run(capsys, "keygen", str(key))[0] == 1  # never overwrites

    index = tmp_path / "index.json"
    index.write_bytes(index_bytes(bad_server={"versions": {"1.0.0": {"image": "x:latest"}}}))
    code, out, err = run(capsys, "sign", "--key", str(key), str(index))
    assert code == 0 and "REFUSED bad_server" in err
    code, out, _ = run(capsys, "verify", "--key", f"{key}.pub", str(index))
    assert code == 0 and "signature OK" in out and "echo: 1.0.0" in out
    code, out, _ = run(capsys, "verify", "--key", public, str(index))
    assert code == 0

    other = tmp_path / "other.key"
    run(capsys, "keygen", str(other))
    code, _, err = run(capsys, "verify", "--key", f"{other}.pub", str(index))
    assert code == 1 and "not signed by a trusted key" in err
    index.write_bytes(index.read_bytes().replace(b"1.0.0", b"1.0.1"))
    code, _, err = run(capsys, "verify", "--key", public, str(index))
    assert code == 1 and "does not verify" in err

    index.write_text('{"version": 1}')
    code, _, err = run(capsys, "sign", "--key", str(key), str(index))
    assert code == 1 and "malformed" in err


def test_pin_tools(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    listing = tmp_path / "tools.json"
    listing.write_text(json.dumps({"jsonrpc": "2.0", "id": 2, "result": {"tools": [TOOL]}}))
    code, out, _ = run(capsys, "pin-tools", str(listing))
    assert code == 0
    assert json.loads(out) == [{"name": "echo", "default": True, "sha256": tool_hash(TOOL)}]
    code, out, _ = run(capsys, "pin-tools", "--off", str(listing))
    assert json.loads(out)[0]["default"] is False
    listing.write_text("[1, 2]")
    assert run(capsys, "pin-tools", str(listing))[0] == 1


@contextmanager
def serve_directory(directory: Path) -> Iterator[str]:
    handler = partial(SimpleHTTPRequestHandler, directory=str(directory))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def publish_signed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, str]:
    key = tmp_path / "k"
    run(capsys, "keygen", str(key))
    published = tmp_path / "www"
    published.mkdir()
    (published / "index.json").write_bytes(index_bytes(3))
    run(capsys, "sign", "--key", str(key), str(published / "index.json"))
    return published, Path(f"{key}.pub").read_text().strip()


class NoRuntimes:
    async def invalidate_server(self, server: str, *, reason: str) -> None:
        return None


async def test_the_index_is_fetched_over_http_and_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    published, public = publish_signed(tmp_path, capsys)
    with serve_directory(published) as url:
        async with (
            open_store(tmp_path / "db.sqlite") as store,
            httpx2.AsyncClient(timeout=10) as http,
        ):
            images = ImageStore(tmp_path / "images")

            def installer(index_url: str) -> Installer:
                return Installer(
                    RegistrySettings(index_url, index_url + ".sig", (public,)),
                    store=store,
                    images=images,
                    catalogue=InstalledCatalogue(images),
                    configured=lambda name: False,
                    runtimes=NoRuntimes(),  # type: ignore[arg-type]
                    http=http,
                )

            fetched = await installer(f"{url}/index.json").fetch_index()
            assert fetched.index.version == 3
            state = await store.read(
                lambda conn: conn.execute("SELECT version FROM registry_state").fetchone()[0]
            )
            assert state == 3
            with pytest.raises(InstallError, match="HTTP 404"):
                await installer(f"{url}/missing.json").fetch_index()
            # The signature of another document: refused before parsing.
            (published / "other.json").write_bytes(index_bytes(4))
            (published / "other.json.sig").write_bytes((published / "index.json.sig").read_bytes())
            with pytest.raises(InstallError, match="does not verify"):
                await installer(f"{url}/other.json").fetch_index()
            with pytest.raises(InstallError, match="cannot fetch"):
                await installer("http://127.0.0.1:9/index.json").fetch_index()
