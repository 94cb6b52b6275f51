"""The egress CA: files on disk, refusals, and real TLS handshakes against its leaves.

Handshakes run trio's SSLStream over an in-memory stream pair; no TLS code is mocked.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
import stat
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import trio
import trio.testing
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from svcgate.egress import ca as ca_module
from svcgate.egress.ca import CAError, GatewayCA, sni_mismatched, upstream_context


@dataclass
class Handshake:
    client: trio.SSLStream[trio.abc.Stream]
    server: trio.SSLStream[trio.abc.Stream]
    client_error: BaseException | None
    server_error: BaseException | None

    @property
    def ok(self) -> bool:
        return self.client_error is None and self.server_error is None


async def handshake(
    server_context: ssl.SSLContext, client_context: ssl.SSLContext, server_hostname: str | None
) -> Handshake:
    left, right = trio.testing.memory_stream_pair()
    client: trio.SSLStream[trio.abc.Stream] = trio.SSLStream(
        left, client_context, server_hostname=server_hostname
    )
    server: trio.SSLStream[trio.abc.Stream] = trio.SSLStream(
        right, server_context, server_side=True
    )
    errors: dict[str, BaseException] = {}

    async def run(name: str, stream: trio.SSLStream[trio.abc.Stream]) -> None:
        try:
            await stream.do_handshake()
        except trio.BrokenResourceError as exc:
            errors[name] = exc
            await stream.transport_stream.aclose()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "client", client)
            nursery.start_soon(run, "server", server)
    return Handshake(client, server, errors.get("client"), errors.get("server"))


def trusting(ca: GatewayCA, alpn: list[str] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    if alpn:
        context.set_alpn_protocols(alpn)
    return context


def peer_leaf(stream: trio.SSLStream[trio.abc.Stream]) -> x509.Certificate:
    der = stream.getpeercert(binary_form=True)
    assert der
    return x509.load_der_x509_certificate(der)


@pytest.fixture
def ca_dir(tmp_path: Path) -> Path:
    return tmp_path / "state" / "egress-ca"


@pytest.fixture
def ca(ca_dir: Path) -> GatewayCA:
    return GatewayCA.load_or_create(ca_dir)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def load_key(ca_dir: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key((ca_dir / "ca-key.pem").read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


def write_cert(
    ca_dir: Path,
    key: ec.EllipticCurvePrivateKey,
    *,
    is_ca: bool = True,
    not_after: datetime | None = None,
) -> None:
    now = datetime.now(UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "replacement")])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=30))
        .not_valid_after(not_after or now + timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    cert = builder.sign(key, hashes.SHA256())
    (ca_dir / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def refusal(ca_dir: Path) -> str:
    with pytest.raises(CAError) as info:
        GatewayCA.load_or_create(ca_dir)
    message = str(info.value)
    assert "\n" not in message
    assert "PRIVATE KEY" not in message
    assert "BEGIN" not in message
    return message


# --- files --------------------------------------------------------------------------------


def test_first_start_creates_private_files(ca: GatewayCA, ca_dir: Path) -> None:
    assert mode(ca_dir) == 0o700
    assert mode(ca_dir / "ca-key.pem") == 0o600
    assert mode(ca_dir / "ca.pem") == 0o644
    assert sorted(p.name for p in ca_dir.iterdir()) == ["ca-key.pem", "ca.pem"]
    assert (ca_dir / "ca.pem").read_bytes() == ca.cert_pem
    assert (ca_dir / "ca-key.pem").read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")


@pytest.mark.parametrize("umask", [0o000, 0o077])
def test_modes_do_not_depend_on_the_umask(tmp_path: Path, umask: int) -> None:
    previous = os.umask(umask)
    try:
        GatewayCA.load_or_create(tmp_path / "ca")
    finally:
        os.umask(previous)
    assert mode(tmp_path / "ca") == 0o700
    assert mode(tmp_path / "ca" / "ca-key.pem") == 0o600
    assert mode(tmp_path / "ca" / "ca.pem") == 0o644


def test_ca_certificate_profile(ca: GatewayCA) -> None:
    cert = x509.load_pem_x509_certificate(ca.cert_pem)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == (
        "svcgate egress CA"
    )
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "svcgate"
    assert cert.issuer == cert.subject
    public = cert.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    assert public.curve.name == "secp256r1"
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value.ca
    assert constraints.value.path_length == 0
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical
    assert usage.value.key_cert_sign
    assert usage.value.crl_sign
    assert usage.value.digital_signature
    cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    now = datetime.now(UTC)
    assert now - timedelta(hours=2) < cert.not_valid_before_utc < now
    assert cert.not_valid_after_utc - now > timedelta(days=3640)
    assert cert.serial_number > 2**64


def test_reload_gives_the_same_ca(ca: GatewayCA, ca_dir: Path) -> None:
    key_before = (ca_dir / "ca-key.pem").read_bytes()
    again = GatewayCA.load_or_create(ca_dir)
    assert again.cert_pem == ca.cert_pem
    assert (ca_dir / "ca-key.pem").read_bytes() == key_before


def test_existing_directory_is_used(tmp_path: Path) -> None:
    ca = GatewayCA.load_or_create(tmp_path)
    assert (tmp_path / "ca.pem").read_bytes() == ca.cert_pem


def test_refuses_key_readable_by_others(ca: GatewayCA, ca_dir: Path) -> None:
    os.chmod(ca_dir / "ca-key.pem", 0o644)
    message = refusal(ca_dir)
    assert "0644" in message
    assert "chmod 600" in message
    os.chmod(ca_dir / "ca-key.pem", 0o640)
    refusal(ca_dir)


def test_refuses_mismatched_pair(ca: GatewayCA, ca_dir: Path, tmp_path: Path) -> None:
    other = GatewayCA.load_or_create(tmp_path / "other")
    (ca_dir / "ca.pem").write_bytes(other.cert_pem)
    assert "does not match" in refusal(ca_dir)


@pytest.mark.parametrize("missing", ["ca.pem", "ca-key.pem"])
def test_refuses_half_state(ca: GatewayCA, ca_dir: Path, missing: str) -> None:
    (ca_dir / missing).unlink()
    survivor = next(ca_dir.iterdir())
    content = survivor.read_bytes()
    assert "missing" in refusal(ca_dir)
    assert sorted(p.name for p in ca_dir.iterdir()) == [survivor.name]
    assert survivor.read_bytes() == content


def test_refuses_garbage_key(ca: GatewayCA, ca_dir: Path) -> None:
    (ca_dir / "ca-key.pem").write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot base64\n")
    assert "private key" in refusal(ca_dir)


def test_refuses_garbage_certificate(ca: GatewayCA, ca_dir: Path) -> None:
    (ca_dir / "ca.pem").write_bytes(b"hello\n")
    assert "certificate" in refusal(ca_dir)


def test_refuses_certificate_that_is_not_a_ca(ca: GatewayCA, ca_dir: Path) -> None:
    write_cert(ca_dir, load_key(ca_dir), is_ca=False)
    assert "not a CA" in refusal(ca_dir)


def test_refuses_expired_certificate(ca: GatewayCA, ca_dir: Path) -> None:
    write_cert(ca_dir, load_key(ca_dir), not_after=datetime.now(UTC) - timedelta(days=1))
    assert "expired" in refusal(ca_dir)


def test_accepts_a_replacement_ca_certificate_for_the_key(ca: GatewayCA, ca_dir: Path) -> None:
    write_cert(ca_dir, load_key(ca_dir))
    assert GatewayCA.load_or_create(ca_dir).cert_pem != ca.cert_pem


def test_unwritable_location_is_a_ca_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CAError):
        GatewayCA.load_or_create(blocker / "ca")


# --- leaves and handshakes ----------------------------------------------------------------


async def test_handshake_verifies_and_offers_only_http11(ca: GatewayCA) -> None:
    result = await handshake(
        ca.server_context("api.example.com"),
        trusting(ca, ["h2", "http/1.1"]),
        "api.example.com",
    )
    assert result.ok, (result.client_error, result.server_error)
    assert result.client.selected_alpn_protocol() == "http/1.1"
    assert result.server.selected_alpn_protocol() == "http/1.1"
    assert not sni_mismatched(result.server._ssl_object)


async def test_client_offering_only_h2_gets_no_h2(ca: GatewayCA) -> None:
    result = await handshake(
        ca.server_context("api.example.com"), trusting(ca, ["h2"]), "api.example.com"
    )
    assert result.ok
    assert result.client.selected_alpn_protocol() != "h2"


async def test_leaf_certificate_profile(ca: GatewayCA) -> None:
    result = await handshake(ca.server_context("api.example.com"), trusting(ca), "api.example.com")
    assert result.ok
    leaf = peer_leaf(result.client)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["api.example.com"]
    assert san.get_values_for_type(x509.IPAddress) == []
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    constraints = leaf.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert not constraints.ca
    aki = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert aki.key_identifier == ski.digest
    assert leaf.issuer == ca_cert.subject
    public = leaf.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    assert public.curve.name == "secp256r1"
    now = datetime.now(UTC)
    assert leaf.not_valid_before_utc < now - timedelta(minutes=59)
    assert timedelta(days=6, hours=23) < leaf.not_valid_after_utc - now <= timedelta(days=7)


async def test_leaf_is_only_valid_for_its_host(ca: GatewayCA) -> None:
    client = trusting(ca)
    client.check_hostname = False  # no SNI is sent, so only the client's check can object
    leaf_context = ca.server_context("other.example.com")
    assert (await handshake(leaf_context, client, None)).ok
    result = await handshake(leaf_context, trusting(ca), "api.example.com")
    assert result.client_error is not None


async def test_sni_mismatch_is_refused_and_recorded(ca: GatewayCA) -> None:
    result = await handshake(ca.server_context("api.example.com"), trusting(ca), "evil.example")
    assert result.server_error is not None
    assert result.client_error is not None
    assert sni_mismatched(result.server._ssl_object)


async def test_sni_is_compared_case_and_dot_insensitively(ca: GatewayCA) -> None:
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    result = await handshake(ca.server_context("api.example.com"), client, "API.Example.COM.")
    assert result.ok, (result.client_error, result.server_error)
    assert not sni_mismatched(result.server._ssl_object)


async def test_no_sni_is_accepted(ca: GatewayCA) -> None:
    client = trusting(ca)
    client.check_hostname = False
    result = await handshake(ca.server_context("api.example.com"), client, None)
    assert result.ok
    assert not sni_mismatched(result.server._ssl_object)


async def test_ip_literal_leaf_verifies_by_ip(ca: GatewayCA) -> None:
    ip = ipaddress.ip_address("127.0.0.1")
    result = await handshake(ca.server_context("127.0.0.1", ip), trusting(ca), "127.0.0.1")
    assert result.ok, (result.client_error, result.server_error)
    san = peer_leaf(result.client).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.value.get_values_for_type(x509.IPAddress) == [ip]
    assert san.value.get_values_for_type(x509.DNSName) == []


async def test_ipv6_literal_leaf_verifies_by_ip(ca: GatewayCA) -> None:
    ip = ipaddress.ip_address("2001:db8::7")
    result = await handshake(ca.server_context("2001:db8::7", ip), trusting(ca), "2001:db8::7")
    assert result.ok, (result.client_error, result.server_error)


async def test_dns_leaf_does_not_verify_for_an_ip(ca: GatewayCA) -> None:
    result = await handshake(ca.server_context("127.0.0.1"), trusting(ca), "127.0.0.1")
    assert result.client_error is not None


async def test_operator_rsa_ca_is_usable(tmp_path: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = datetime.now(UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "operator CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    directory = tmp_path / "ca"
    directory.mkdir(mode=0o700)
    key_path = directory / "ca-key.pem"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    (directory / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    ca = GatewayCA.load_or_create(directory)
    result = await handshake(ca.server_context("api.example.com"), trusting(ca), "api.example.com")
    assert result.ok, (result.client_error, result.server_error)


# --- bundle and upstream context ----------------------------------------------------------


def test_bundle_has_system_roots_and_the_ca(ca: GatewayCA, tmp_path: Path) -> None:
    roots = tmp_path / "roots.crt"
    roots.write_bytes(b"# system roots\nSYSTEM-ROOTS-PEM\n")
    bundle = ca.bundle(roots)
    assert bundle.startswith(b"# system roots\nSYSTEM-ROOTS-PEM\n")
    assert bundle.endswith(ca.cert_pem)


def test_bundle_default_uses_the_real_system_file(ca: GatewayCA) -> None:
    system = Path("/etc/ssl/certs/ca-certificates.crt")
    if not system.is_file():
        pytest.skip("no system CA file on this host")
    bundle = ca.bundle()
    assert bundle.startswith(system.read_bytes())
    assert bundle.endswith(ca.cert_pem)


def test_bundle_falls_back_to_certifi(ca: GatewayCA, tmp_path: Path) -> None:
    certifi = pytest.importorskip("certifi")
    bundle = ca.bundle(tmp_path / "missing.crt")
    assert bundle.startswith(Path(certifi.where()).read_bytes())
    assert bundle.endswith(ca.cert_pem)


async def test_bundle_file_verifies_leaves(ca: GatewayCA, tmp_path: Path) -> None:
    bundle_file = tmp_path / "bundle.crt"
    bundle_file.write_bytes(ca.bundle())
    client = ssl.create_default_context(cafile=str(bundle_file))
    result = await handshake(ca.server_context("api.example.com"), client, "api.example.com")
    assert result.ok, (result.client_error, result.server_error)


async def test_upstream_context_trusts_the_extra_ca_file(ca: GatewayCA, tmp_path: Path) -> None:
    extra = tmp_path / "internal-ca.pem"
    extra.write_bytes(ca.cert_pem)
    context = upstream_context(extra)
    assert context.check_hostname
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    result = await handshake(ca.server_context("upstream.test"), context, "upstream.test")
    assert result.ok, (result.client_error, result.server_error)
    assert result.client.selected_alpn_protocol() == "http/1.1"


async def test_upstream_context_without_extra_ca_refuses_unknown_issuer(ca: GatewayCA) -> None:
    result = await handshake(
        ca.server_context("upstream.test"), upstream_context(), "upstream.test"
    )
    assert result.client_error is not None


def test_upstream_context_missing_extra_file(tmp_path: Path) -> None:
    with pytest.raises(CAError) as info:
        upstream_context(tmp_path / "nope.pem")
    assert "\n" not in str(info.value)


# --- context cache ------------------------------------------------------------------------


def test_context_is_cached_per_host(ca: GatewayCA) -> None:
    first = ca.server_context("api.example.com")
    assert ca.server_context("api.example.com") is first
    assert ca.server_context("API.example.com.") is first
    assert ca.server_context("other.example.com") is not first
    ip = ipaddress.ip_address("127.0.0.1")
    by_ip = ca.server_context("127.0.0.1", ip)
    assert ca.server_context("127.0.0.1", ip) is by_ip
    assert ca.server_context("127.0.0.1") is not by_ip


def test_cache_evicts_least_recently_used(ca: GatewayCA, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ca_module, "CONTEXT_CACHE_SIZE", 2)
    a = ca.server_context("a.test")
    b = ca.server_context("b.test")
    assert ca.server_context("a.test") is a  # a is now the most recent
    ca.server_context("c.test")  # evicts b
    assert ca.server_context("a.test") is a
    assert ca.server_context("b.test") is not b


def test_leaf_near_expiry_is_reminted(ca: GatewayCA, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ca_module, "LEAF_LIFETIME", timedelta(hours=12))
    first = ca.server_context("api.example.com")
    assert ca.server_context("api.example.com") is not first


def test_rejects_non_ascii_host(ca: GatewayCA) -> None:
    with pytest.raises(ValueError, match="A-label"):
        ca.server_context("bücher.example")
