"""Install, run, upgrade and uninstall servers from a signed index, end to end (THREATS F1-F5).

Everything is real: Debian's ``docker-registry`` on loopback holds images built by the test
suite (a minimal Python runtime plus the repository's echo server, or the rug-pull server),
the index is signed with an Ed25519 key (``devregistry.publish``), and the gateway runs as its
own process with ``SVC_REGISTRY_*`` set. Servers are installed through the admin API, run in
bubblewrap sandboxes whose root is the unpacked image, and are called with the official MCP
SDK client through a profile.
"""

from __future__ import annotations

import json
import os
import stat
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from data_plane_support import (
    DataPlaneGateway,
    Notifications,
    data_plane_gateway,
    mcp_client,
    text_of,
)
from gateway_support import api
from image_support import (
    ImageParts,
    echo_image,
    file_info,
    image_from_layers,
    python_runtime_layer,
    rugpull_image,
    tar_layer,
)
from mcp.shared.exceptions import MCPError
from process_support import public_tmpdir
from registry_support import OCI_LAYER, LocalRegistry, TamperingProxy, sha256_digest

from devidp.provider import DevIdP
from devregistry.publish import Publisher, tool_pins
from svcgate.registry import signing

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
ECHO_SERVER = REPO / "svcgate" / "examples" / "echo_server.py"
RUGPULL_SERVER = REPO / "tests" / "fixtures" / "rugpull_server.py"
COMMAND = ["/usr/bin/python3", "/app/echo_server.py"]


class Recorder(ThreadingHTTPServer):
    """A loopback upstream that answers 200 and keeps the headers it saw."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                recorder.seen.append({k.lower(): v for k, v in self.headers.items()})
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        super().__init__(("127.0.0.1", 0), Handler)
        self.port = int(self.server_address[1])


@contextmanager
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@dataclass
class Env:
    registry: LocalRegistry
    publisher: Publisher
    dp: DataPlaneGateway
    image_dir: Path
    echo_pins: list[dict[str, Any]]
    upstream: Recorder

    def push(self, repo: str, parts: ImageParts) -> str:
        digest = self.registry.push_image(repo, parts.layers, parts.config)
        return self.registry.image_ref(repo, digest)

    def manifest(self, **extra: Any) -> dict[str, Any]:
        return {"tools": self.echo_pins, "command": COMMAND, **extra}

    def publish(self, servers: dict[str, Any], **kwargs: Any) -> bytes:
        return self.publisher.publish(servers, **kwargs)

    def publish_unchecked(self, servers: dict[str, Any]) -> None:
        """Sign an index the publisher would refuse to write (entries the gateway refuses)."""
        version = self.publisher.last_version() + 1
        expires = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        data = json.dumps({"version": version, "expires": expires, "servers": servers}).encode()
        key = signing.load_private_key(self.publisher.key_path)
        self.publisher.signature_path.write_bytes(signing.sign(data, [key]))
        self.publisher.index_path.write_bytes(data)
        self.publisher.version_path.write_text(f"{version}\n")

    def install(self, ref: str, **extra: Any) -> httpx2.Response:
        with api(self.dp.gateway, self.dp.admin_session) as client:
            return client.post(
                "/api/servers/install",
                json={"ref": ref, **extra},
                headers={"Origin": self.dp.gateway.origin},
                timeout=120,
            )

    def uninstall(self, name: str) -> httpx2.Response:
        with api(self.dp.gateway, self.dp.admin_session) as client:
            return client.delete(
                f"/api/servers/{name}", headers={"Origin": self.dp.gateway.origin}, timeout=60
            )

    def server_names(self) -> list[str]:
        with api(self.dp.gateway, self.dp.admin_session) as client:
            return [s["name"] for s in client.get("/api/servers").json()]

    def audit(self, decision: str) -> list[dict[str, Any]]:
        with api(self.dp.gateway, self.dp.admin_session) as client:
            events = client.get("/api/audit", params={"limit": 200}).json()["events"]
        return [e for e in events if e["decision"] == decision]

    def rootfs(self) -> set[str]:
        return {p.name for p in (self.image_dir / "rootfs").iterdir()}

    def leftovers(self) -> list[str]:
        return [p.name for p in (self.image_dir / "tmp").iterdir()]


def release(image: str, manifest: dict[str, Any]) -> dict[str, Any]:
    return {"image": image, "manifest": manifest}


@pytest.fixture(scope="module")
def env(idp: DevIdP, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("reg")
    images = public_tmpdir("images") / "store"
    publisher = Publisher(tmp / "index")
    with (
        LocalRegistry() as registry,
        recorder() as upstream,
        data_plane_gateway(
            tmp,
            idp,
            SVC_REGISTRY_INDEX=publisher.index_url,
            SVC_REGISTRY_KEYS=publisher.public_key_text,
            SVC_IMAGE_DIR=str(images),
            SVC_EGRESS_ALLOW_CIDRS="127.0.0.0/8",
            SVC_EGRESS_HOSTS=f"api.cred.test=127.0.0.1:{upstream.port}",
        ) as dp,
    ):
        yield Env(registry, publisher, dp, images, tool_pins(ECHO_SERVER), upstream)


def ok(response: httpx2.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    return response.json() if response.content else {}


def failed(response: httpx2.Response, code: str = "install_failed") -> str:
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == code
    message: str = error["message"]
    return message


# -- the whole life of a server ------------------------------------------------------------


async def test_install_run_upgrade_uninstall(env: Env) -> None:
    v1 = env.push("svcgate/pyecho", echo_image())
    v2 = env.push("svcgate/pyecho", echo_image(env={"PYECHO_BUILD": "2"}))
    env.publish({"pyecho": {"versions": {"1.0.0": release(v1, env.manifest())}}})
    installed = ok(await trio.to_thread.run_sync(env.install, "pyecho@1.0.0"), 201)
    assert installed["name"] == "pyecho" and installed["version"] == "1.0.0"
    assert installed["image"] == v1
    first_digest = installed["image_digest"]
    assert first_digest.removeprefix("sha256:") in env.rootfs()
    assert "pyecho" in env.server_names()
    assert any("pyecho@1.0.0" in e["detail"] for e in env.audit("server_install"))
    # Installing the same release again changes nothing.
    again = ok(await trio.to_thread.run_sync(env.install, "pyecho@1.0.0"), 201)
    assert again["id"] == installed["id"] and again["image_digest"] == first_digest

    profile = await trio.to_thread.run_sync(env.dp.create_profile, "reg-life", ["pyecho"])
    endpoint = env.dp.endpoint(profile["slug"])
    async with mcp_client(endpoint, profile["token"]) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == {"pyecho_echo", "pyecho_add", "pyecho_fetch"}
        # /app/echo_server.py exists only inside the image: the sandbox runs its rootfs.
        assert text_of(await client.call_tool("pyecho_echo", {"text": "from the image"})) == (
            "from the image"
        )

    # An upgrade that widens nothing happens in place; the bare name is the newest release.
    env.publish(
        {
            "pyecho": {
                "versions": {
                    "1.0.0": release(v1, env.manifest()),
                    "1.1.0": release(v2, env.manifest(limits={"memory_mb": 128})),
                }
            }
        }
    )
    upgraded = ok(await trio.to_thread.run_sync(env.install, "pyecho"), 201)
    assert upgraded["version"] == "1.1.0" and upgraded["id"] == installed["id"]
    assert upgraded["image_digest"] != first_digest
    # The old image is collected: nothing references it any more.
    assert first_digest.removeprefix("sha256:") not in env.rootfs()
    assert upgraded["image_digest"].removeprefix("sha256:") in env.rootfs()
    assert any("upgraded from 1.0.0" in e["detail"] for e in env.audit("server_install"))
    async with mcp_client(endpoint, profile["token"]) as client:
        result = await client.call_tool("pyecho_add", {"a": 2, "b": 3})
        assert text_of(result) == "5"

    # Uninstall: out of every profile, image gone, idempotent.
    assert env.uninstall("pyecho").status_code == 204
    assert "pyecho" not in env.server_names()
    assert upgraded["image_digest"].removeprefix("sha256:") not in env.rootfs()
    with api(env.dp.gateway, env.dp.user_session) as client:
        assert client.get(f"/api/profiles/{profile['id']}").json()["servers"] == []
    assert [e["server"] for e in env.audit("server_uninstall")].count("pyecho") == 1
    assert env.uninstall("pyecho").status_code == 204
    assert [e["server"] for e in env.audit("server_uninstall")].count("pyecho") == 1
    assert env.leftovers() == []


async def test_a_widening_upgrade_needs_explicit_approval(env: Env) -> None:
    image = env.push("svcgate/widen", echo_image())
    narrow = env.manifest()
    wide = env.manifest(
        egress=["example.com"], credential={"hosts": ["api.example.com"], "env": "TOKEN"}
    )
    env.publish(
        {"widen": {"versions": {"1.0.0": release(image, narrow), "2.0.0": release(image, wide)}}}
    )
    ok(await trio.to_thread.run_sync(env.install, "widen@1.0.0"), 201)
    message = failed(await trio.to_thread.run_sync(env.install, "widen@2.0.0"))
    for part in ("widens", "example.com", "api.example.com", "approve_permissions"):
        assert part in message, message
    # v1 stays active.
    still = ok(await trio.to_thread.run_sync(env.install, "widen@1.0.0"), 201)
    assert still["version"] == "1.0.0"
    approved = ok(
        await trio.to_thread.run_sync(lambda: env.install("widen@2.0.0", approve_permissions=True)),
        201,
    )
    assert approved["version"] == "2.0.0"
    assert any("approved: egress" in e["detail"] for e in env.audit("server_install"))
    # Going back to the narrower manifest needs no approval.
    assert ok(await trio.to_thread.run_sync(env.install, "widen@1.0.0"), 201)["version"] == (
        "1.0.0"
    )
    assert env.uninstall("widen").status_code == 204


async def test_the_manifest_decides_egress_and_how_the_credential_is_sent(env: Env) -> None:
    image = env.push("svcgate/cred", echo_image())
    manifest = env.manifest(
        credential={
            "hosts": ["api.cred.test"],
            "env": "CRED_TOKEN",
            "header": "X-Api-Key",
            "format": "key {token}",
        }
    )
    env.publish({"cred": {"versions": {"1.0.0": release(image, manifest)}}})
    ok(await trio.to_thread.run_sync(env.install, "cred"), 201)
    secret = "manifest-injected-secret-7Qx"
    with api(env.dp.gateway, env.dp.user_session) as client:
        stored = client.put(
            "/api/credentials/cred",
            json={"secret": secret},
            headers={"Origin": env.dp.gateway.origin},
        )
        assert stored.status_code == 204, stored.text
    profile = await trio.to_thread.run_sync(env.dp.create_profile, "reg-cred", ["cred"])
    async with mcp_client(env.dp.endpoint(profile["slug"]), profile["token"]) as client:
        fetched = text_of(await client.call_tool("cred_fetch", {"url": "http://api.cred.test/x"}))
        assert fetched.startswith("200"), fetched
        denied = text_of(await client.call_tool("cred_fetch", {"url": "http://elsewhere.test/"}))
        assert not denied.startswith("200")
    seen = env.upstream.seen[-1]
    assert seen["x-api-key"] == f"key {secret}"
    assert "authorization" not in seen
    assert secret not in fetched
    assert env.uninstall("cred").status_code == 204


# -- F1, F2: the index itself --------------------------------------------------------------


def test_tampered_foreign_rolled_back_and_expired_indexes_are_refused(
    env: Env, tmp_path: Path
) -> None:
    image = env.push("svcgate/fresh", echo_image())
    servers = {"fresh": {"versions": {"1.0.0": release(image, env.manifest())}}}
    env.publish(servers)
    index, sig = env.publisher.index_path, Path(f"{env.publisher.index_path}.sig")
    saved_index, saved_sig = index.read_bytes(), sig.read_bytes()

    # F1: one changed byte, still valid JSON.
    index.write_bytes(saved_index.replace(b'"1.0.0"', b'"1.0.1"'))
    assert "does not verify" in failed(env.install("fresh"))
    # F1: a valid signature by a key the gateway does not trust.
    signing.generate(tmp_path / "other")
    other = signing.load_private_key(tmp_path / "other")
    index.write_bytes(saved_index)
    sig.write_bytes(signing.sign(saved_index, [other]))
    assert "not signed by a trusted key" in failed(env.install("fresh"))
    # The genuine index installs.
    sig.write_bytes(saved_sig)
    ok(env.install("fresh"), 201)
    # F2: a newer index is accepted, then the older one is served again: rollback refused.
    env.publish(servers)
    ok(env.install("fresh"), 201)
    index.write_bytes(saved_index)
    sig.write_bytes(saved_sig)
    assert "rollback" in failed(env.install("fresh"))
    # F2: a validly signed, newer, but expired index (a freeze attack) is refused.
    env.publish(servers, expires=datetime.now(UTC) - timedelta(minutes=1))
    assert "expired" in failed(env.install("fresh"))
    assert env.uninstall("fresh").status_code == 204


# -- F3: images are pinned by digest -----------------------------------------------------------


async def test_images_run_only_by_digest(env: Env) -> None:
    parts = echo_image()
    digest = env.registry.push_image("svcgate/pinned", parts.layers, parts.config, tag="latest")
    by_tag = f"{env.registry.host}/svcgate/pinned:latest"
    missing = env.registry.image_ref("svcgate/pinned", "sha256:" + "0" * 64)
    env.publish_unchecked(
        {
            "tagged": {"versions": {"1.0.0": release(by_tag, env.manifest())}},
            "ghost": {"versions": {"1.0.0": release(missing, env.manifest())}},
        }
    )
    assert "digest" in failed(await trio.to_thread.run_sync(env.install, "tagged"))
    assert "not found" in failed(await trio.to_thread.run_sync(env.install, "ghost"))

    # The registry serves other bytes for a pinned layer: the pull stops, nothing is kept.
    layer_digest = sha256_digest(parts.layers[-1][1])
    with TamperingProxy(env.registry) as proxy:
        # Same length, one byte different: only the digest can tell.
        swapped = bytearray(parts.layers[-1][1])
        swapped[-20] ^= 0xFF
        proxy.override(f"/v2/svcgate/pinned/blobs/{layer_digest}", bytes(swapped))
        env.publish(
            {
                "tampered": {
                    "versions": {
                        "1.0.0": release(proxy.image_ref("svcgate/pinned", digest), env.manifest())
                    }
                }
            }
        )
        before = env.rootfs()
        message = failed(await trio.to_thread.run_sync(env.install, "tampered"))
    assert "digest" in message and layer_digest in message, message
    assert env.rootfs() == before and env.leftovers() == []
    assert not {"tagged", "ghost", "tampered"} & set(env.server_names())


# -- malicious layers ------------------------------------------------------------------------


def hostile(*entries: Any) -> ImageParts:
    return image_from_layers(
        [python_runtime_layer(), (OCI_LAYER, tar_layer(list(entries)))],
        entrypoint=COMMAND,
    )


def test_malicious_layers_are_refused_or_defused(env: Env) -> None:
    escape = file_info("../../../../tmp/svcgate-escape", 2)
    device = tarfile.TarInfo("dev-null-copy")
    device.type, device.devmajor, device.devminor = tarfile.CHRTYPE, 1, 3
    setuid = file_info("app/su", 4, mode=0o4755)
    echo = file_info("app/echo_server.py", ECHO_SERVER.stat().st_size)
    images = {
        "traversal": env.push("svcgate/traversal", hostile((escape, b"x\n"))),
        "devnode": env.push("svcgate/devnode", hostile(device)),
        "setuid": env.push(
            "svcgate/setuid", hostile((setuid, b"#!/\n"), (echo, ECHO_SERVER.read_bytes()))
        ),
    }
    env.publish(
        {
            name: {"versions": {"1.0.0": release(ref, env.manifest())}}
            for name, ref in images.items()
        }
    )
    before = env.rootfs()
    message = failed(env.install("traversal"))
    assert "svcgate-escape" in message, message
    assert not Path("/tmp/svcgate-escape").exists()  # noqa: S108  # where "../" would lead
    message = failed(env.install("devnode"))
    assert "dev-null-copy" in message, message
    assert env.rootfs() == before and env.leftovers() == []
    # A setuid bit is stripped; the server installs and runs.
    installed = ok(env.install("setuid"), 201)
    root = env.image_dir / "rootfs" / installed["image_digest"].removeprefix("sha256:")
    mode = os.lstat(root / "app" / "su").st_mode
    assert not mode & (stat.S_ISUID | stat.S_ISGID)
    assert env.uninstall("setuid").status_code == 204


# -- F5: tool rug pull ---------------------------------------------------------------------


async def test_a_tool_that_changes_after_install_is_withheld(env: Env) -> None:
    image = env.push("svcgate/rug", rugpull_image())
    pins = tool_pins(RUGPULL_SERVER)
    manifest = {"tools": pins, "command": ["/usr/bin/python3", "/app/rugpull_server.py"]}
    env.publish({"rug": {"versions": {"1.0.0": release(image, manifest)}}})
    ok(await trio.to_thread.run_sync(env.install, "rug"), 201)
    profile = await trio.to_thread.run_sync(env.dp.create_profile, "reg-rug", ["rug"])
    notes = Notifications()
    async with mcp_client(
        env.dp.endpoint(profile["slug"]), profile["token"], message_handler=notes
    ) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {"rug_greet", "rug_stable"}
        assert tools["rug_greet"].description == "Greet someone."
        assert text_of(await client.call_tool("rug_greet", {"name": "Ada"})) == "Hello, Ada!"
        # The server now rewrites greet's description, adds "exfiltrate" and says so.
        await notes.wait_for("notifications/tools/list_changed")
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {"rug_stable"}
        with pytest.raises(MCPError):
            await client.call_tool("rug_exfiltrate", {})
    withheld = [e for e in env.audit("tool_withheld") if e["server"] == "rug"]
    details = " ".join(e["detail"] for e in withheld)
    assert "changed tool 'greet'" in details and "new tool 'exfiltrate'" in details
    assert all(e["profile_id"] == profile["id"] for e in withheld)
    assert env.uninstall("rug").status_code == 204


# -- the API's refusals ----------------------------------------------------------------------


def test_install_api_refusals(env: Env) -> None:
    with api(env.dp.gateway, env.dp.user_session) as client:
        response = client.post(
            "/api/servers/install",
            json={"ref": "pyecho"},
            headers={"Origin": env.dp.gateway.origin},
        )
        assert response.status_code == 403
    for body in ({"ref": "Not A Ref"}, {"ref": "x@latest"}, {"ref": "x", "force": True}, {}):
        with api(env.dp.gateway, env.dp.admin_session) as client:
            response = client.post(
                "/api/servers/install", json=body, headers={"Origin": env.dp.gateway.origin}
            )
        assert response.status_code == 400, (body, response.text)
        assert response.json()["error"]["code"] == "invalid"
    env.publish({})
    assert "no server named" in failed(env.install("nothing-here"))
    assert "configuration" in failed(env.install("echo"))
    assert env.uninstall("never-installed").status_code == 204


async def test_an_install_while_a_profile_starts_restarts_it_instead_of_failing(
    env: Env,
) -> None:
    image = env.push("svcgate/during", echo_image())
    env.publish({"during": {"versions": {"1.0.0": release(image, env.manifest())}}})
    env.dp.close_gate()
    try:
        profile = await trio.to_thread.run_sync(env.dp.create_profile, "reg-during", ["slow"])
        tools: list[str] = []

        async def first_request() -> None:
            async with mcp_client(env.dp.endpoint(profile["slug"]), profile["token"]) as client:
                tools.extend(t.name for t in (await client.list_tools()).tools)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first_request)
            await trio.to_thread.run_sync(
                env.dp.wait_runtime, profile, lambda r: r["state"] == "starting"
            )
            # Installing invalidates runtimes that are starting (they may run any server):
            # the waiting request must get a fresh start, not an error.
            ok(await trio.to_thread.run_sync(env.install, "during"), 201)
            env.dp.open_gate()
        assert tools and all(name.startswith("slow_") for name in tools)
    finally:
        env.dp.open_gate()
    assert env.uninstall("during").status_code == 204
