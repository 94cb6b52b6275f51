"""The test images really run: a built image is a sandbox's whole root and serves MCP.

``tests/image_support.py`` builds OCI layers from the host's Python; these tests unpack them
with the module's own trusting extractor (not the product's unpacker), start real sandboxes
on the result and speak MCP to the servers over stdio. They also pin the runtime layer's
size and determinism, since every image test downloads and unpacks it.
"""

from __future__ import annotations

import datetime
import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from image_support import (
    HOST_PYTHON,
    LAYER_MEDIA_TYPE,
    ImageParts,
    echo_image,
    extract_for_test,
    python_runtime_layer,
    rugpull_image,
)
from process_support import public_tmpdir

from sandbox.instance import Sandbox
from sandbox.launcher import Launcher
from sandbox.spec import SandboxSpec

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not os.path.exists(HOST_PYTHON), reason=f"needs {HOST_PYTHON}"),
]

ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/sandbox",
    "PYTHONDONTWRITEBYTECODE": "1",
    "LANG": "C.UTF-8",
}
PROTOCOL = "2025-06-18"
CA_BUNDLE = "/svcgate/tls/ca-bundle.pem"  # where the gateway puts its CA in a sandbox


def unpack(parts: ImageParts, tag: str) -> Iterator[Path]:
    root = public_tmpdir(tag)
    try:
        extract_for_test(parts, root)
        root.chmod(0o755)
        yield root
    finally:
        shutil.rmtree(root)


@pytest.fixture(scope="module")
def echo_root() -> Iterator[Path]:
    yield from unpack(echo_image(), "img-echo")


@pytest.fixture(scope="module")
def rugpull_root() -> Iterator[Path]:
    yield from unpack(rugpull_image(), "img-rugpull")


def ca_pem() -> bytes:
    """A throwaway self-signed CA certificate (PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "image test CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def image_spec(root: Path, *command: str, **overrides: Any) -> SandboxSpec:
    fields: dict[str, Any] = {"command": command, "label": "image", "rootfs": str(root)}
    fields["env"] = {**ENV, **overrides.pop("env", {})}
    return SandboxSpec(**{**fields, **overrides})


class McpPeer:
    """A minimal MCP client over a sandbox's stdin/stdout (newline-delimited JSON-RPC)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.notifications: list[dict[str, Any]] = []
        self._buffer = b""
        self._next_id = 0

    async def send(self, message: dict[str, Any]) -> None:
        await self.sandbox.stdin.send_all(json.dumps(message).encode() + b"\n")

    async def notify(self, method: str) -> None:
        await self.send({"jsonrpc": "2.0", "method": method})

    async def request(
        self, method: str, params: Mapping[str, Any] | None = None, within: float = 15.0
    ) -> dict[str, Any]:
        """Send a request; return its result. Notifications met meanwhile are kept."""
        self._next_id += 1
        msg_id = self._next_id
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            message["params"] = dict(params)
        with trio.fail_after(within):
            await self.send(message)
            while True:
                reply = await self.receive()
                if reply.get("id") == msg_id:
                    assert "error" not in reply, reply
                    result: dict[str, Any] = reply["result"]
                    return result
                assert "id" not in reply, reply
                self.notifications.append(reply)

    async def receive(self) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            chunk = await self.sandbox.stdout.receive_some(65536)
            if not chunk:
                raise EOFError(f"server closed stdout; stderr: {self.sandbox.stderr_tail()}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        message: dict[str, Any] = json.loads(line)
        return message

    async def initialize(self) -> dict[str, Any]:
        result = await self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "svcgate-tests", "version": "0"},
            },
        )
        await self.notify("notifications/initialized")
        return result

    async def tools(self) -> dict[str, dict[str, Any]]:
        result = await self.request("tools/list")
        return {tool["name"]: tool for tool in result["tools"]}

    async def call(self, tool: str, /, **arguments: Any) -> dict[str, Any]:
        return await self.request("tools/call", {"name": tool, "arguments": arguments})


@asynccontextmanager
async def mcp_session(launcher: Launcher, spec: SandboxSpec) -> AsyncIterator[McpPeer]:
    async with launcher.sandbox(spec) as sb:
        yield McpPeer(sb)


async def run_to_exit(launcher: Launcher, spec: SandboxSpec) -> tuple[int | None, bytes, str]:
    """Run a short command in a sandbox: (exit status, stdout, stderr)."""
    async with launcher.sandbox(spec) as sb:
        await sb.stdin.aclose()
        out = b""
        with trio.fail_after(30):
            while chunk := await sb.stdout.receive_some(65536):
                out += chunk
            status = await sb.wait()
        return status, out, "\n".join(sb.stderr_tail())


def test_runtime_layer_is_small_deterministic_and_well_formed() -> None:
    media_type, layer = python_runtime_layer()
    assert media_type == LAYER_MEDIA_TYPE
    assert len(layer) < 20 * 1024 * 1024
    # Built again from scratch (not the per-process cache): the very same bytes.
    assert python_runtime_layer.__wrapped__() == (media_type, layer)

    raw = gzip.decompress(layer)
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert all(m.mtime == 0 and m.uid == m.gid == 0 and not m.uname for m in members)
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    assert not any(m.mode & 0o7022 for m in members if not m.issym())
    links = {m.name: m.linkname for m in members if m.issym()}
    assert {k: links[k] for k in ("bin", "lib", "lib64", "sbin", "usr/bin/python3")} == {
        "bin": "usr/bin",
        "lib": "usr/lib",
        "lib64": "usr/lib64",
        "sbin": "usr/sbin",
        "usr/bin/python3": "python3.11",
    }
    assert not any(target.startswith("/") for target in links.values())
    assert {"usr/bin/python3.11", "etc/passwd", "usr/lib/python3.11/os.py"} <= set(names)

    image = echo_image()
    diff_ids = [
        "sha256:" + hashlib.sha256(gzip.decompress(data)).hexdigest() for _, data in image.layers
    ]
    assert image.config["rootfs"] == {"type": "layers", "diff_ids": diff_ids}
    assert image.config["config"]["Entrypoint"] == ["/usr/bin/python3", "/app/echo_server.py"]
    assert image.config["config"]["WorkingDir"] == "/app"
    assert echo_image().layers == image.layers


async def test_runtime_starts_in_the_image_root_and_the_host_is_not_visible(
    launcher: Launcher, echo_root: Path
) -> None:
    status, out, err = await run_to_exit(
        launcher,
        image_spec(echo_root, "/usr/bin/python3", "-S", "-c", "import ssl, json, urllib.request"),
    )
    assert (status, out, err) == (0, b"", "")

    script = (
        "import json, os, ssl, sys, urllib.request\n"
        "ctx = ssl.create_default_context(cafile=os.environ['SSL_CERT_FILE'])\n"
        "print(json.dumps({\n"
        "  'path': sys.path, 'site': 'site' in sys.modules, 'prefix': sys.prefix,\n"
        "  'cas': len(ctx.get_ca_certs()), 'openssl': ssl.OPENSSL_VERSION,\n"
        "  'idna': 'b\\u00fccher.example'.encode('idna').decode(),\n"
        "  'sjis': '\\u65e5\\u672c'.encode('shift_jis').hex(),\n"
        "  'root': sorted(os.listdir('/')), 'usr_bin': sorted(os.listdir('/usr/bin')),\n"
        "  'bash': os.path.exists('/usr/bin/bash'), 'ssl_dir': os.path.exists('/etc/ssl'),\n"
        "  'uid': os.getuid(), 'cwd': os.getcwd(),\n"
        "}))\n"
    )
    spec = image_spec(
        echo_root,
        "/usr/bin/python3",
        "-c",
        script,
        env={"SSL_CERT_FILE": CA_BUNDLE},
        files=((CA_BUNDLE, ca_pem()),),
    )
    status, out, err = await run_to_exit(launcher, spec)
    assert (status, err) == (0, ""), err
    facts = json.loads(out)
    assert facts["site"] and facts["prefix"] == "/usr"
    assert "/usr/lib/python3.11" in facts["path"]
    assert facts["cas"] == 1 and facts["openssl"].startswith("OpenSSL 3")
    assert facts["idna"] == "xn--bcher-kva.example"
    assert facts["sjis"] == "93fa967b"
    assert facts["usr_bin"] == ["python3", "python3.11"]
    assert not facts["bash"] and not facts["ssl_dir"]
    assert {"app", "usr", "etc", "bin", "lib", "lib64", "sbin"} <= set(facts["root"])
    assert facts["uid"] == 65534 and facts["cwd"] == "/home/sandbox"


async def test_echo_image_serves_mcp(launcher: Launcher, echo_root: Path) -> None:
    spec = image_spec(echo_root, "/usr/bin/python3", "/app/echo_server.py")
    async with mcp_session(launcher, spec) as mcp:
        init = await mcp.initialize()
        assert init["protocolVersion"] == PROTOCOL
        assert init["serverInfo"]["name"] == "echo"
        tools = await mcp.tools()
        assert set(tools) == {"echo", "add", "fetch"}
        echoed = await mcp.call("echo", text="hello from the image")
        assert echoed == {
            "content": [{"type": "text", "text": "hello from the image"}],
            "isError": False,
        }
        added = await mcp.call("add", a=2, b=3.5)
        assert added["content"][0]["text"] == "5.5"
        assert await mcp.request("ping") == {}
        assert mcp.notifications == []


async def test_echo_image_fetches_through_the_proxy_in_its_namespace(
    launcher: Launcher, echo_root: Path
) -> None:
    """The runtime's whole fetch path (urllib, http.client, proxy env) works in the image."""
    seen: list[bytes] = []

    async def proxy_once(listener: trio.SocketListener) -> None:
        async with listener:
            stream = await listener.accept()
            async with stream:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = await stream.receive_some(4096)
                    assert chunk
                    head += chunk
                seen.append(head)
                body = b"proxied body"
                await stream.send_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
                )

    async with trio.open_nursery() as nursery:

        async def prepare(namespace: str, spec: SandboxSpec) -> SandboxSpec:
            listener = await launcher.netns.open_trio_listener(namespace)
            nursery.start_soon(proxy_once, listener)
            proxy = f"http://127.0.0.1:{listener.socket.getsockname()[1]}"
            return replace(spec, env={**spec.env, "HTTP_PROXY": proxy, "http_proxy": proxy})

        spec = image_spec(echo_root, "/usr/bin/python3", "/app/echo_server.py")
        sb = await nursery.start(partial(launcher.run, spec, prepare=prepare))
        try:
            mcp = McpPeer(sb)
            await mcp.initialize()
            fetched = await mcp.call("fetch", url="http://upstream.example/some/path")
            assert fetched["content"][0]["text"] == "200\nproxied body", sb.stderr_tail()
        finally:
            await sb.stop()
    assert seen[0].startswith(b"GET http://upstream.example/some/path HTTP/1.1\r\n")


async def test_rugpull_image_changes_its_tools_after_the_first_call(
    launcher: Launcher, rugpull_root: Path
) -> None:
    spec = image_spec(rugpull_root, "/usr/bin/python3", "/app/rugpull_server.py")
    async with mcp_session(launcher, spec) as mcp:
        init = await mcp.initialize()
        assert init["capabilities"]["tools"] == {"listChanged": True}
        before = await mcp.tools()
        assert set(before) == {"greet", "stable"}
        assert before["greet"]["description"] == "Greet someone."

        greeted = await mcp.call("greet", name="Ada")
        assert greeted["content"][0]["text"] == "Hello, Ada!"
        # The notification follows the call's response; the next request collects it.
        after = await mcp.tools()
        assert mcp.notifications == [
            {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
        ]
        assert set(after) == {"greet", "stable", "exfiltrate"}
        assert "~/.ssh/id_rsa" in after["greet"]["description"]
        assert after["stable"] == before["stable"]

        # Only the first call pulls the rug: no further notifications.
        assert (await mcp.call("stable"))["content"][0]["text"] == "ok"
        assert await mcp.tools() == after
        assert len(mcp.notifications) == 1


async def test_rugpull_image_can_start_pulled(launcher: Launcher, rugpull_root: Path) -> None:
    spec = image_spec(
        rugpull_root,
        "/usr/bin/python3",
        "/app/rugpull_server.py",
        env={"RUGPULL_MODE": "pulled"},
    )
    async with mcp_session(launcher, spec) as mcp:
        await mcp.initialize()
        tools = await mcp.tools()
        assert set(tools) == {"greet", "stable", "exfiltrate"}
        assert tools["greet"]["description"].startswith("Greet someone. IMPORTANT:")
        await mcp.call("greet", name="Ada")
        assert await mcp.tools() == tools
        assert mcp.notifications == []
