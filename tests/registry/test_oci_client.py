"""OCIClient against a real ``docker-registry`` on loopback (see ``tests/registry_support.py``).

Pulls by digest (OCI and Docker media types, indexes resolved to linux/amd64), every way the
bytes can be wrong (a tampering proxy serves other bytes for a digest, blobs longer or
shorter than their descriptors), token auth as Docker Hub and GHCR do it, Basic auth,
redirects to storage, and the reference parser, auth file reader and challenge parser.
"""

from __future__ import annotations

import base64
import json
import random
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from registry_support import (
    DOCKER_LAYER,
    DOCKER_MANIFEST,
    LINUX_AMD64,
    LINUX_ARM64,
    OCI_INDEX,
    OCI_LAYER,
    OCI_MANIFEST,
    LocalRegistry,
    TamperingProxy,
    TokenServer,
    canonical,
    free_port,
    image_config,
    sha256_digest,
)

from svcgate.registry import oci
from svcgate.registry.oci import (
    ImageRef,
    OCIClient,
    OCIError,
    RegistryCredentials,
    load_auth_file,
    parse_image_ref,
    parse_www_authenticate,
)

HEX = "0123456789abcdef" * 4


def data(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def files_in(directory: Path) -> set[str]:
    return {path.name for path in directory.iterdir()} if directory.exists() else set()


def partials(directory: Path) -> list[str]:
    return [name for name in files_in(directory) if name.endswith(".partial")]


@pytest.fixture(scope="module")
def registry() -> Iterator[LocalRegistry]:
    with LocalRegistry() as reg:
        yield reg


@pytest.fixture(scope="module")
def token_server() -> Iterator[TokenServer]:
    with TokenServer() as server:
        yield server


@pytest.fixture(scope="module")
def token_registry(token_server: TokenServer) -> Iterator[LocalRegistry]:
    with LocalRegistry(token_auth=token_server) as reg:
        yield reg


@pytest.fixture
def proxy(registry: LocalRegistry) -> Iterator[TamperingProxy]:
    with TamperingProxy(registry) as tampering:
        yield tampering


@pytest.fixture
async def http() -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(timeout=30, follow_redirects=False) as client:
        yield client


async def pull(
    http: httpx2.AsyncClient, ref: str, blob_dir: Path, **kwargs: Any
) -> oci.PulledImage:
    return await OCIClient(http, **kwargs).pull(parse_image_ref(ref), blob_dir)


async def pull_error(http: httpx2.AsyncClient, ref: str, blob_dir: Path, **kwargs: Any) -> str:
    with pytest.raises(OCIError) as caught:
        await pull(http, ref, blob_dir, **kwargs)
    return str(caught.value)


def push_simple(
    reg: LocalRegistry, repo: str, seed: int = 1, arch: str = "amd64"
) -> tuple[str, list[bytes]]:
    layers = [data(seed, 70_000), data(seed + 1, 123)]
    digest = reg.push_image(repo, [(OCI_LAYER, layer) for layer in layers], image_config(arch))
    return digest, layers


# -- pulling -------------------------------------------------------------------------------


async def test_pull_oci_image_by_digest(
    registry: LocalRegistry, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    layers = [data(10, 200_000), data(11, 5)]
    config = image_config(config={"Cmd": ["/app/server"], "WorkingDir": "/app"})
    digest = registry.push_image(
        "svcgate/echo", [(OCI_LAYER, layer) for layer in layers], config, tag="v1"
    )
    image = await pull(http, registry.image_ref("svcgate/echo", digest), tmp_path / "blobs")
    assert image.manifest_digest == digest
    assert image.config == config
    assert [blob.digest for blob in image.layers] == [sha256_digest(layer) for layer in layers]
    for blob, layer in zip(image.layers, layers, strict=True):
        assert blob.path == tmp_path / "blobs" / blob.digest.removeprefix("sha256:")
        assert blob.path.read_bytes() == layer
        assert blob.size == len(layer)
        assert blob.media_type == OCI_LAYER
    config_hex = sha256_digest(canonical(config)).removeprefix("sha256:")
    assert (tmp_path / "blobs" / config_hex).read_bytes() == canonical(config)
    assert not partials(tmp_path / "blobs")


async def test_manifest_request_accepts_every_kind_and_sends_no_credentials(
    registry: LocalRegistry, proxy: TamperingProxy, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    digest, _ = push_simple(registry, "accept/check")
    await pull(http, proxy.image_ref("accept/check", digest), tmp_path)
    manifest_requests = [r for r in proxy.requests if "/manifests/" in r.path]
    assert [r.path for r in manifest_requests] == [f"/v2/accept/check/manifests/{digest}"]
    accept = manifest_requests[0].headers["Accept"]
    for media_type in (OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, oci.DOCKER_LIST):
        assert media_type in accept
    assert all("Authorization" not in r.headers for r in proxy.requests)


async def test_pull_docker_v2_image(
    registry: LocalRegistry, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    layer = data(20, 4096)
    digest = registry.push_image(
        "docker/v2", [(DOCKER_LAYER, layer)], image_config(), docker_media_types=True
    )
    image = await pull(http, registry.image_ref("docker/v2", digest), tmp_path)
    assert image.manifest_digest == digest
    assert image.layers[0].media_type == DOCKER_LAYER
    assert image.layers[0].path.read_bytes() == layer


@pytest.mark.parametrize("docker_list", [False, True], ids=["oci-index", "docker-list"])
async def test_index_resolves_to_linux_amd64(
    registry: LocalRegistry,
    proxy: TamperingProxy,
    http: httpx2.AsyncClient,
    tmp_path: Path,
    docker_list: bool,
) -> None:
    repo = f"multi/{'list' if docker_list else 'index'}"
    arm_layer, amd_layer = data(30, 1000), data(31, 1000)
    arm = registry.push_image(
        repo, [(OCI_LAYER, arm_layer)], image_config("arm64"), docker_media_types=docker_list
    )
    amd = registry.push_image(
        repo, [(OCI_LAYER, amd_layer)], image_config("amd64"), docker_media_types=docker_list
    )
    media_type = DOCKER_MANIFEST if docker_list else OCI_MANIFEST
    index = registry.push_index(
        repo,
        [
            (arm, registry.manifest_size(repo, arm), media_type, LINUX_ARM64),
            (amd, registry.manifest_size(repo, amd), media_type, LINUX_AMD64),
        ],
        docker_list=docker_list,
    )
    image = await pull(http, proxy.image_ref(repo, index), tmp_path)
    assert image.manifest_digest == amd
    assert image.config["architecture"] == "amd64"
    assert image.layers[0].path.read_bytes() == amd_layer
    paths = [r.path for r in proxy.requests]
    assert f"/v2/{repo}/manifests/{arm}" not in paths
    assert f"/v2/{repo}/blobs/{sha256_digest(arm_layer)}" not in paths


async def test_platform_option_picks_another_entry(
    registry: LocalRegistry, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    repo = "multi/arm"
    arm, _ = push_simple(registry, repo, seed=40, arch="arm64")
    amd, _ = push_simple(registry, repo, seed=42)
    index = registry.push_index(
        repo,
        [
            (amd, registry.manifest_size(repo, amd), OCI_MANIFEST, LINUX_AMD64),
            (arm, registry.manifest_size(repo, arm), OCI_MANIFEST, LINUX_ARM64),
        ],
    )
    image = await pull(http, registry.image_ref(repo, index), tmp_path, platform=("linux", "arm64"))
    assert image.manifest_digest == arm


async def test_index_without_the_platform(
    registry: LocalRegistry, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    repo = "multi/none"
    arm, _ = push_simple(registry, repo, seed=50, arch="arm64")
    s390, _ = push_simple(registry, repo, seed=52, arch="s390x")
    index = registry.push_index(
        repo,
        [
            (arm, registry.manifest_size(repo, arm), OCI_MANIFEST, LINUX_ARM64),
            (s390, registry.manifest_size(repo, s390), OCI_MANIFEST, {
                "os": "linux", "architecture": "s390x"
            }),
        ],
    )  # fmt: skip
    message = await pull_error(http, registry.image_ref(repo, index), tmp_path)
    assert f"index {index} in {registry.host}/{repo} has no image for linux/amd64" in message
    assert "offers linux/arm64/v8, linux/s390x" in message
    assert files_in(tmp_path) == set()


async def test_nested_index_refused(
    registry: LocalRegistry, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    repo = "multi/nested"
    amd, _ = push_simple(registry, repo, seed=60)
    inner = registry.push_index(
        repo, [(amd, registry.manifest_size(repo, amd), OCI_MANIFEST, LINUX_AMD64)]
    )
    outer = registry.push_index(
        repo, [(inner, registry.manifest_size(repo, inner), OCI_INDEX, LINUX_AMD64)]
    )
    message = await pull_error(http, registry.image_ref(repo, outer), tmp_path)
    assert "nested indexes are not supported" in message


async def test_index_entry_that_lies_about_being_a_manifest(
    registry: LocalRegistry, proxy: TamperingProxy, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    amd, _ = push_simple(registry, "multi/liar", seed=62)
    inner = registry.push_index(
        "multi/liar", [(amd, registry.manifest_size("multi/liar", amd), OCI_MANIFEST, LINUX_AMD64)]
    )
    size = registry.manifest_size("multi/liar", inner)
    body = canonical({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [{"mediaType": OCI_MANIFEST, "digest": inner, "size": size,
                       "platform": LINUX_AMD64}],
    })  # fmt: skip
    proxy.override(f"/v2/multi/liar/manifests/{sha256_digest(body)}", body)
    message = await pull_error(http, proxy.image_ref("multi/liar", sha256_digest(body)), tmp_path)
    assert f"manifest {inner} listed in an index" in message
    assert "nested indexes are not supported" in message


async def test_single_manifest_for_another_architecture_refused(
    registry: LocalRegistry, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    digest, _ = push_simple(registry, "arch/arm-only", seed=70, arch="arm64")
    message = await pull_error(http, registry.image_ref("arch/arm-only", digest), tmp_path)
    assert "is for linux/arm64, not linux/amd64" in message


async def test_artifact_and_non_object_config_refused(
    registry: LocalRegistry, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    helm = "application/vnd.cncf.helm.config.v1+json"
    body = registry.image_manifest("odd/config", [], b"{}", config_media_type=helm)
    digest = registry.push_manifest("odd/config", body, OCI_MANIFEST, sha256_digest(body))
    message = await pull_error(http, registry.image_ref("odd/config", digest), tmp_path)
    assert f"is not a container image: config media type '{helm}'" in message

    body = registry.image_manifest("odd/config", [(OCI_LAYER, b"x")], b"[1, 2]")
    digest = registry.push_manifest("odd/config", body, OCI_MANIFEST, sha256_digest(body))
    message = await pull_error(http, registry.image_ref("odd/config", digest), tmp_path)
    assert "image config sha256:" in message
    assert "is not a JSON object" in message


async def test_schema1_and_unknown_manifest_kinds_refused(
    registry: LocalRegistry, proxy: TamperingProxy, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    schema1 = canonical({"schemaVersion": 1, "name": "old/image", "tag": "latest",
                         "fsLayers": [], "history": []})  # fmt: skip
    proxy.override(
        f"/v2/old/image/manifests/{sha256_digest(schema1)}",
        schema1,
        content_type="application/vnd.docker.distribution.manifest.v1+prettyjws",
    )
    message = await pull_error(http, proxy.image_ref("old/image", sha256_digest(schema1)), tmp_path)
    assert "Docker schema 1 manifest, which is not supported" in message

    odd = canonical({"schemaVersion": 2, "mediaType": "application/x-something"})
    proxy.override(f"/v2/old/image/manifests/{sha256_digest(odd)}", odd)
    message = await pull_error(http, proxy.image_ref("old/image", sha256_digest(odd)), tmp_path)
    assert "unsupported media type 'application/x-something'" in message

    # No mediaType in the body: the Content-Type header decides.
    bare = canonical({"schemaVersion": 2, "manifests": []})
    proxy.override(f"/v2/old/image/manifests/{sha256_digest(bare)}", bare, content_type=OCI_INDEX)
    message = await pull_error(http, proxy.image_ref("old/image", sha256_digest(bare)), tmp_path)
    assert "has no image for linux/amd64; it offers no platforms" in message


# -- tampering and sizes -------------------------------------------------------------------


async def test_manifest_digest_mismatch(
    registry: LocalRegistry, proxy: TamperingProxy, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    digest, _ = push_simple(registry, "tamper/manifest", seed=80)
    genuine = registry.fetch(f"/v2/tamper/manifest/manifests/{digest}").content
    # The same manifest, re-serialised: same meaning, different bytes, different digest.
    proxy.override(
        f"/v2/tamper/manifest/manifests/{digest}",
        canonical(json.loads(genuine)),
        content_type=OCI_MANIFEST,
    )
    message = await pull_error(http, proxy.image_ref("tamper/manifest", digest), tmp_path)
    assert f"digest mismatch for manifest {digest} from {proxy.host}/tamper/manifest" in message
    assert files_in(tmp_path) == set()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_blob_digest_mismatch_leaves_nothing(
    registry: LocalRegistry,
    proxy: TamperingProxy,
    http: httpx2.AsyncClient,
    tmp_path: Path,
    chunked: bool,
) -> None:
    digest, layers = push_simple(registry, "tamper/blob", seed=90)
    evil = bytearray(layers[0])
    evil[-1] ^= 0xFF
    layer_digest = sha256_digest(layers[0])
    proxy.override(f"/v2/tamper/blob/blobs/{layer_digest}", bytes(evil), chunked=chunked)
    message = await pull_error(http, proxy.image_ref("tamper/blob", digest), tmp_path)
    assert f"digest mismatch for blob {layer_digest} from {proxy.host}/tamper/blob" in message
    assert layer_digest.removeprefix("sha256:") not in files_in(tmp_path)
    assert not partials(tmp_path)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_blob_longer_or_shorter_than_its_descriptor(
    registry: LocalRegistry,
    proxy: TamperingProxy,
    http: httpx2.AsyncClient,
    tmp_path: Path,
    chunked: bool,
) -> None:
    digest, layers = push_simple(registry, "tamper/size", seed=100)
    path = f"/v2/tamper/size/blobs/{sha256_digest(layers[0])}"
    proxy.override(path, layers[0] + b"more", chunked=chunked)
    message = await pull_error(http, proxy.image_ref("tamper/size", digest), tmp_path)
    assert f"is larger than the {len(layers[0])} bytes its manifest says" in message
    assert not partials(tmp_path)

    proxy.override(path, layers[0][:-10], chunked=chunked)
    message = await pull_error(http, proxy.image_ref("tamper/size", digest), tmp_path)
    assert f"was cut short: {len(layers[0]) - 10} of {len(layers[0])} bytes" in message
    assert not partials(tmp_path)
    assert sha256_digest(layers[0]).removeprefix("sha256:") not in files_in(tmp_path)


async def test_real_registry_blob_larger_than_descriptor(
    registry: LocalRegistry, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    layer = data(110, 50_000)

    def shrink(manifest: dict[str, Any]) -> None:
        manifest["layers"][0]["size"] = 1000

    body = registry.image_manifest("size/lie", [(OCI_LAYER, layer)], canonical(image_config()),
                                   edit=shrink)  # fmt: skip
    digest = registry.push_manifest("size/lie", body, OCI_MANIFEST, sha256_digest(body))
    message = await pull_error(http, registry.image_ref("size/lie", digest), tmp_path)
    assert f"blob {sha256_digest(layer)} from {registry.host}/size/lie is larger" in message
    assert not partials(tmp_path)


async def test_blob_over_max_blob_bytes_is_not_downloaded(
    registry: LocalRegistry, proxy: TamperingProxy, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    digest, layers = push_simple(registry, "limit/blob", seed=120)
    message = await pull_error(
        http, proxy.image_ref("limit/blob", digest), tmp_path, max_blob_bytes=10_000
    )
    assert f"layer {sha256_digest(layers[0])} in {proxy.host}/limit/blob is 70000 bytes" in message
    assert "more than the limit of 10000" in message
    assert not [r for r in proxy.requests if "/blobs/" in r.path]


async def test_manifest_over_max_manifest_bytes(
    registry: LocalRegistry, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    digest, _ = push_simple(registry, "limit/manifest", seed=130)
    message = await pull_error(
        http, registry.image_ref("limit/manifest", digest), tmp_path, max_manifest_bytes=100
    )
    assert f"manifest {digest} from {registry.host}/limit/manifest is larger than 100" in message


async def test_unknown_manifest_and_missing_blob_not_found(
    registry: LocalRegistry, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    unknown = "sha256:" + HEX
    push_simple(registry, "missing/things", seed=140)
    message = await pull_error(http, registry.image_ref("missing/things", unknown), tmp_path)
    assert message == (
        f"manifest {unknown} not found in registry {registry.host} (repository missing/things)"
    )

    digest, layers = push_simple(registry, "missing/things", seed=142)
    registry.delete_blob("missing/things", sha256_digest(layers[1]))
    message = await pull_error(http, registry.image_ref("missing/things", digest), tmp_path)
    assert f"blob {sha256_digest(layers[1])} not found in registry {registry.host}" in message
    assert not partials(tmp_path)


async def test_blob_directory_problems(
    registry: LocalRegistry, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    digest, layers = push_simple(registry, "store/fail", seed=145)
    ref = registry.image_ref("store/fail", digest)
    (tmp_path / "file").write_text("not a directory")
    message = await pull_error(http, ref, tmp_path / "file")
    assert message.startswith(f"cannot create blob directory {tmp_path / 'file'}")

    blobs = tmp_path / "blobs"
    (blobs / sha256_digest(layers[0]).removeprefix("sha256:")).mkdir(parents=True)
    message = await pull_error(http, ref, blobs)
    assert message.startswith(f"cannot store blob {sha256_digest(layers[0])} of {registry.host}")
    assert not partials(blobs)


async def test_registry_down(http: httpx2.AsyncClient, tmp_path: Path) -> None:
    port = free_port()
    message = await pull_error(http, f"127.0.0.1:{port}/gone/away@sha256:{HEX}", tmp_path)
    assert message.startswith(f"registry 127.0.0.1:{port} unreachable while fetching manifest")
    assert "ConnectError" in message


# -- reuse and progress ------------------------------------------------------------------------


async def test_blobs_already_present_are_reused(
    registry: LocalRegistry, proxy: TamperingProxy, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    digest, layers = push_simple(registry, "reuse/me", seed=150)
    ref = proxy.image_ref("reuse/me", digest)
    await pull(http, ref, tmp_path)
    assert len([r for r in proxy.requests if "/blobs/" in r.path]) == 3

    proxy.requests.clear()
    messages: list[str] = []
    image = await pull(http, ref, tmp_path, progress=messages.append)
    assert not [r for r in proxy.requests if "/blobs/" in r.path]
    assert all(m.startswith("already have sha256:") for m in messages)
    assert image.layers[0].path.read_bytes() == layers[0]

    # A file of the wrong size under the blob's name is replaced by the verified blob.
    image.layers[0].path.write_bytes(b"stale")
    proxy.requests.clear()
    image = await pull(http, ref, tmp_path)
    assert [r.path for r in proxy.requests if "/blobs/" in r.path] == [
        f"/v2/reuse/me/blobs/{sha256_digest(layers[0])}"
    ]
    assert image.layers[0].path.read_bytes() == layers[0]


async def test_progress_reports(
    registry: LocalRegistry,
    http: httpx2.AsyncClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(oci, "PROGRESS_INTERVAL", 100 * 1024)
    layer = data(160, 350 * 1024)
    digest = registry.push_image("progress/big", [(OCI_LAYER, layer)], image_config())
    messages: list[str] = []
    await pull(http, registry.image_ref("progress/big", digest), tmp_path, progress=messages.append)
    short = sha256_digest(layer)[:19] + "…"
    mine = [m for m in messages if short in m]
    assert mine[0] == f"pulling {short} (0.3 MiB)"
    assert mine[-1] == f"pulled {short} (0.3 MiB)"
    middle = mine[1:-1]
    assert len(middle) == 3
    assert all(m.startswith(f"pulling {short} 0.") and m.endswith("/0.3 MiB") for m in middle)
    assert len(messages) == 2 + len(mine)  # the config blob: start and end


# -- authentication ----------------------------------------------------------------------------


async def test_token_auth_with_credentials(
    token_registry: LocalRegistry,
    token_server: TokenServer,
    http: httpx2.AsyncClient,
    tmp_path: Path,
) -> None:
    digest, layers = push_simple(token_registry, "private/echo", seed=200)
    credentials = {token_registry.host: RegistryCredentials("puller", token_server.password)}
    token_server.requests.clear()
    image = await pull(
        http, token_registry.image_ref("private/echo", digest), tmp_path, credentials=credentials
    )
    assert image.layers[0].path.read_bytes() == layers[0]
    # One token for the whole pull (manifest, config, two layers).
    assert len(token_server.requests) == 1
    request = token_server.requests[0]
    assert request.username == "puller"
    assert request.service == token_server.service
    assert request.scopes == ["repository:private/echo:pull"]


async def test_token_auth_refusals_never_show_secrets(
    token_registry: LocalRegistry,
    token_server: TokenServer,
    http: httpx2.AsyncClient,
    tmp_path: Path,
) -> None:
    digest, _ = push_simple(token_registry, "private/secret", seed=210)
    ref = token_registry.image_ref("private/secret", digest)
    wrong = {token_registry.host: RegistryCredentials("puller", "hunter2-wrong-password")}
    message = await pull_error(http, ref, tmp_path, credentials=wrong)
    assert message.startswith(
        f"registry {token_registry.host} refused access (401) to private/secret"
    )
    assert "credentials rejected" in message
    assert "hunter2" not in message
    assert base64.b64encode(b"puller:hunter2-wrong-password").decode() not in message

    message = await pull_error(http, ref, tmp_path)
    assert "refused access (401) to private/secret" in message
    assert f"no credentials configured for {token_registry.host}" in message
    assert files_in(tmp_path) == set()


async def test_token_the_registry_rejects(http: httpx2.AsyncClient, tmp_path: Path) -> None:
    with TokenServer() as server, LocalRegistry(token_auth=server) as reg:
        digest, _ = push_simple(reg, "private/aud", seed=220)
        server.audience = "some-other-registry"  # from now on the registry refuses its tokens
        server.issued.clear()
        credentials = {reg.host: RegistryCredentials(server.username, server.password)}
        message = await pull_error(
            http, reg.image_ref("private/aud", digest), tmp_path, credentials=credentials
        )
    assert message.startswith(f"registry {reg.host} refused access (401) to private/aud")
    assert "did not accept the credentials" in message
    assert len(server.issued) == 1  # a fresh token is refused: no second try
    assert all(token not in message for token in server.issued)
    assert server.password not in message


async def test_expired_token_is_replaced_once(
    token_registry: LocalRegistry,
    token_server: TokenServer,
    http: httpx2.AsyncClient,
    tmp_path: Path,
) -> None:
    digest, layers = push_simple(token_registry, "private/expiry", seed=225)
    with TamperingProxy(token_registry) as proxy:

        def expire_current_token(message: str) -> None:
            # Once blobs start, the registry stops accepting the token used so far.
            proxy.reject_authorization.add(f"Bearer {token_server.issued[-1]}")

        token_server.requests.clear()
        credentials = {proxy.host: RegistryCredentials("puller", token_server.password)}
        image = await pull(
            http,
            proxy.image_ref("private/expiry", digest),
            tmp_path,
            credentials=credentials,
            progress=expire_current_token,
        )
    assert [blob.path.read_bytes() for blob in image.layers] == layers
    # Manifest: challenge + token 1. Config blob: 401 + token 2. Each layer: 401 + a new one.
    assert len(token_server.requests) == 4


async def test_anonymous_token_with_access_token_field_and_kid(
    http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    with (
        TokenServer(anonymous_pull=True, key_header="kid", token_field="access_token") as server,
        LocalRegistry(token_auth=server) as reg,
    ):
        digest, layers = push_simple(reg, "public/echo", seed=230)
        server.requests.clear()
        image = await pull(http, reg.image_ref("public/echo", digest), tmp_path)
    assert image.layers[1].path.read_bytes() == layers[1]
    assert [r.username for r in server.requests] == [None]


async def test_basic_challenge(
    registry: LocalRegistry, proxy: TamperingProxy, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    digest, layers = push_simple(registry, "basic/auth", seed=240)
    proxy.require_basic = ("reader", "s3cret-basic")
    ref = proxy.image_ref("basic/auth", digest)
    good = {f"HTTP://{proxy.host}/": RegistryCredentials("reader", "s3cret-basic")}
    image = await pull(http, ref, tmp_path / "ok", credentials=good)
    assert image.layers[0].path.read_bytes() == layers[0]
    expected = "Basic " + base64.b64encode(b"reader:s3cret-basic").decode()
    sent = [r.headers.get("Authorization") for r in proxy.requests]
    assert sent[0] is None  # the first request goes out without credentials
    assert set(sent[1:]) == {expected}  # then the challenge is answered once and reused
    assert sent.count(None) == 1

    message = await pull_error(http, ref, tmp_path / "none")
    assert message == (
        f"registry {proxy.host} refused access (401) to basic/auth: the registry wants a user "
        f"name and password; no credentials configured for {proxy.host}"
    )
    wrong = {proxy.host: RegistryCredentials("reader", "not-the-password")}
    message = await pull_error(http, ref, tmp_path / "wrong", credentials=wrong)
    assert "did not accept the credentials" in message
    assert "not-the-password" not in message


@pytest.mark.parametrize(
    ("challenge", "expected"),
    [
        ('Bearer realm="http://auth.example/token",service="x"',
         "token realm 'http://auth.example' is not https://; refusing it"),
        ('Bearer service="x"', "the bearer challenge names no realm"),
        ('Negotiate abc==', "unsupported authentication scheme (negotiate)"),
        ('Bearer realm="unterminated', "unreadable WWW-Authenticate challenge"),
    ],
)  # fmt: skip
async def test_challenges_refused_before_any_credential_leaves(
    registry: LocalRegistry,
    proxy: TamperingProxy,
    http: httpx2.AsyncClient,
    tmp_path: Path,
    challenge: str,
    expected: str,
) -> None:
    digest = "sha256:" + HEX
    proxy.override(
        f"/v2/auth/odd/manifests/{digest}",
        b"{}",
        status=401,
        headers={"WWW-Authenticate": challenge},
    )
    credentials = {proxy.host: RegistryCredentials("user", "pw-never-sent")}
    message = await pull_error(
        http, proxy.image_ref("auth/odd", digest), tmp_path, credentials=credentials
    )
    assert f"registry {proxy.host} refused access (401) to auth/odd: {expected}" in message
    assert len(proxy.requests) == 1


# -- redirects ---------------------------------------------------------------------------------


async def test_blob_redirects_drop_authorization_at_the_storage_origin(
    token_registry: LocalRegistry,
    token_server: TokenServer,
    http: httpx2.AsyncClient,
    tmp_path: Path,
) -> None:
    digest, layers = push_simple(token_registry, "redirect/me", seed=250)
    with TamperingProxy(token_registry) as proxy:
        proxy.redirect_blobs = True
        credentials = {proxy.host: RegistryCredentials("puller", token_server.password)}
        image = await pull(
            http, proxy.image_ref("redirect/me", digest), tmp_path, credentials=credentials
        )
    assert [blob.path.read_bytes() for blob in image.layers] == layers
    assert len(proxy.storage_requests) == 3
    assert all("Authorization" not in r.headers for r in proxy.storage_requests)
    authorized = [r for r in proxy.requests if "Authorization" in r.headers]
    assert authorized
    assert all(r.headers["Authorization"].startswith("Bearer ") for r in authorized)


async def test_httpx_drops_authorization_on_cross_origin_redirects() -> None:
    """httpx2 on its own strips ``Authorization`` on a cross-origin redirect too.

    OCIClient does not depend on it (it follows redirects itself and attaches the header
    per hop); this pins the library behaviour a caller with ``follow_redirects`` relies on.
    """
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        if request.url.host == "registry.test":
            return httpx2.Response(307, headers={"Location": "https://storage.test/blob"})
        return httpx2.Response(200, content=b"blob")

    async with httpx2.AsyncClient(
        transport=httpx2.MockTransport(handler), follow_redirects=True
    ) as client:
        await client.get(
            "https://registry.test/v2/x/blobs/y", headers={"Authorization": "Bearer t"}
        )
    assert seen[0].headers["Authorization"] == "Bearer t"
    assert "Authorization" not in seen[1].headers


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("http://storage.example/blob", "refusing a redirect to http://storage.example"),
        ("ftp://127.0.0.1/blob", "refusing a redirect to ftp://127.0.0.1"),
    ],
)
async def test_redirect_to_plain_http_elsewhere_refused(
    registry: LocalRegistry,
    proxy: TamperingProxy,
    http: httpx2.AsyncClient,
    tmp_path: Path,
    location: str,
    expected: str,
) -> None:
    digest, layers = push_simple(registry, "redirect/bad", seed=260)
    path = f"/v2/redirect/bad/blobs/{sha256_digest(layers[0])}"
    proxy.override(path, b"", status=302, headers={"Location": location})
    message = await pull_error(http, proxy.image_ref("redirect/bad", digest), tmp_path)
    assert expected in message
    assert "(https is required)" in message
    assert not partials(tmp_path)


async def test_redirect_loop_stops(
    registry: LocalRegistry, proxy: TamperingProxy, http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    digest, layers = push_simple(registry, "redirect/loop", seed=270)
    path = f"/v2/redirect/loop/blobs/{sha256_digest(layers[0])}"
    proxy.override(path, b"", status=307, headers={"Location": path})
    message = await pull_error(http, proxy.image_ref("redirect/loop", digest), tmp_path)
    assert "too many redirects" in message
    assert len([r for r in proxy.requests if r.path == path]) == oci.MAX_REDIRECTS + 1


# -- references ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"ghcr.io/owner/name@sha256:{HEX}", ImageRef("ghcr.io", "owner/name", f"sha256:{HEX}")),
        (f"Registry.Example:5000/a/b-c/d__e.f@sha256:{HEX}",
         ImageRef("registry.example:5000", "a/b-c/d__e.f", f"sha256:{HEX}")),
        (f"localhost/x@sha256:{HEX}", ImageRef("localhost", "x", f"sha256:{HEX}")),
        (f"127.0.0.1:5000/x@sha256:{HEX}", ImageRef("127.0.0.1:5000", "x", f"sha256:{HEX}")),
        (f"[::1]:5000/x@sha256:{HEX}", ImageRef("[::1]:5000", "x", f"sha256:{HEX}")),
        (f"docker.io/library/alpine@sha256:{HEX}",
         ImageRef("docker.io", "library/alpine", f"sha256:{HEX}")),
    ],
)  # fmt: skip
def test_parse_good_refs(text: str, expected: ImageRef) -> None:
    ref = parse_image_ref(text)
    assert ref == expected
    assert parse_image_ref(str(ref)) == ref


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("ghcr.io/owner/name:v1", "names a tag; image must be pinned by digest"),
        (f"ghcr.io/owner/name:v1@sha256:{HEX}", "names both a tag and a digest"),
        ("ghcr.io/owner/name", "image must be pinned by digest"),
        (f"ghcr.io/owner/name@sha512:{HEX}{HEX}", "only sha256 digests are supported"),
        ("ghcr.io/owner/name@sha256:abc123", "must be 64 lower-case hex digits"),
        (f"ghcr.io/owner/name@sha256:{HEX.upper()}", "must be 64 lower-case hex digits"),
        (f"ghcr.io/owner/name@{HEX}", "is not a digest"),
        (f"owner/name@sha256:{HEX}", "must start with the registry host"),
        (f"name@sha256:{HEX}", "must start with the registry host"),
        (f"ghcr.io/Owner/name@sha256:{HEX}", "is not a valid repository name"),
        (f"ghcr.io/@sha256:{HEX}", "is not a valid repository name"),
        (f"ghcr.io/a//b@sha256:{HEX}", "is not a valid repository name"),
        (f"ghcr.io/a/-b@sha256:{HEX}", "is not a valid repository name"),
        (f"ghcr.io:99999/a@sha256:{HEX}", "is not a host"),
        (f"gh_cr.io/a@sha256:{HEX}", "is not a host"),
        (f"ghcr.io/a@sha256:{HEX}@sha256:{HEX}", "more than one '@'"),
        (f"ghcr.io/{'a' * 250}@sha256:{HEX}", "longer than 255"),
        (f" ghcr.io/a@sha256:{HEX}", "is not a host"),
    ],
)
def test_parse_bad_refs(text: str, fragment: str) -> None:
    with pytest.raises(OCIError) as caught:
        parse_image_ref(text)
    assert fragment in str(caught.value)
    assert "\n" not in str(caught.value)


# -- auth file and challenges ------------------------------------------------------------------


def test_load_auth_file_formats(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({
        "auths": {
            "registry.example:5000": {"auth": base64.b64encode(b"alice:pa:ss").decode()},
            "https://GHCR.io/v2/": {"username": "bob", "password": "tok"},
            "https://index.docker.io/v1/": {"auth": base64.b64encode(b"carol:hub").decode()},
            "http://127.0.0.1:5001": {"auth": base64.b64encode(b"dave:x").decode()},
            "placeholder.example": {},
            "azure.example": {"identitytoken": "refresh"},
        },
        "credsStore": "desktop",
    }))  # fmt: skip
    creds = load_auth_file(path)
    assert creds == {
        "registry.example:5000": RegistryCredentials("alice", "pa:ss"),
        "ghcr.io": RegistryCredentials("bob", "tok"),
        "docker.io": RegistryCredentials("carol", "hub"),
        "127.0.0.1:5001": RegistryCredentials("dave", "x"),
    }
    assert "pa:ss" not in repr(creds)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "is not valid JSON"),
        ("[]", "is not a JSON object"),
        ('{"auths": []}', "'auths' is not an object"),
        ('{"auths": {"r.example": "x"}}', "entry 'r.example': the entry is not an object"),
        ('{"auths": {"r.example": {"auth": "bm9jb2xvbg=="}}}', "'auth' is not base64 of"),
        ('{"auths": {"r.example": {"auth": "%%%secret%%%"}}}', "'auth' is not base64 of"),
        ('{"auths": {"r.example": {"auth": 5}}}', "'auth' is not a string"),
        ('{"auths": {"https://u:p@r.example": {"auth": "dTpw"}}}', "is not a registry host"),
        ('{"auths": {"r.example": {"auth": "dTpw"}, "https://r.example": {"auth": "dTpw"}}}',
         "credentials for r.example are listed twice"),
        ('{"auths": {"a": {"auth": "dTpw"}, "a": {"auth": "dTpw"}}}', "duplicate key"),
    ],
)  # fmt: skip
def test_load_auth_file_refuses_broken_files(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(OCIError) as caught:
        load_auth_file(path)
    message = str(caught.value)
    assert fragment in message
    assert str(path) in message
    for secret in ("secret", "bm9jb2xvbg", "nocolon", "dTpw"):
        assert secret not in message


def test_load_auth_file_missing(tmp_path: Path) -> None:
    with pytest.raises(OCIError, match=r"cannot read registry auth file .*No such file"):
        load_auth_file(tmp_path / "absent.json")


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ('Bearer realm="https://auth.example/token",service="registry.example",'
         'scope="repository:a/b:pull"',
         [("bearer", {"realm": "https://auth.example/token", "service": "registry.example",
                      "scope": "repository:a/b:pull"})]),
        ('Bearer realm="a\\"b\\\\c", Service = x',
         [("bearer", {"realm": 'a"b\\c', "service": "x"})]),
        ('Basic realm="x", Bearer realm="y",service=z',
         [("basic", {"realm": "x"}), ("bearer", {"realm": "y", "service": "z"})]),
        ("Negotiate abc/d+e==, Basic realm=r",
         [("negotiate", {"": "abc/d+e=="}), ("basic", {"realm": "r"})]),
        ("Basic, Bearer realm=\"\"", [("basic", {}), ("bearer", {"realm": ""})]),
        ("", []),
    ],
)  # fmt: skip
def test_parse_www_authenticate(header: str, expected: list[tuple[str, dict[str, str]]]) -> None:
    assert parse_www_authenticate(header) == expected


@pytest.mark.parametrize(
    ("header", "fragment"),
    [
        ('Bearer realm="unterminated', "unterminated quoted string"),
        ("Bearer realm=a,realm=b", "appears twice"),
        ("Bearer realm=a junk", "expected ','"),
        ("=x", "expected an authentication scheme"),
        ("Bearer realm=a,,service=", "has no value"),
    ],
)
def test_parse_www_authenticate_refuses(header: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        parse_www_authenticate(header)
