"""The gateway's egress CA and the per-host leaf certificates the proxy presents.

Where a user's credential is injected, the proxy terminates the sandbox's TLS so it can
add the credential to each inner request. The sandbox trusts this CA through the bundle
from :meth:`GatewayCA.bundle` (system roots plus the CA), which the sandbox environment
names in ``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE`` and
``NODE_EXTRA_CA_CERTS``.

Rules:

- The CA lives in one directory (created 0700): ``ca-key.pem`` (PKCS8 PEM, mode 0600) and
  ``ca.pem`` (certificate, 0644). The key file is created 0600 with ``O_EXCL`` from the
  start and moved into place with ``os.replace``, so it is never readable by others, not
  even briefly. First start creates an ECDSA P-256 CA valid for 10 years
  (``BasicConstraints(ca=True, path_length=0)``, ``KeyUsage`` for certificate and CRL
  signing). Existing files are loaded and refused (:class:`CAError`) when the key is
  readable by group or others, the certificate does not match the key, is not a CA, has
  expired, or either file does not parse. Exactly one of the two files present is refused
  too: a half state is never silently replaced by a new CA.
- :meth:`GatewayCA.server_context` presents a leaf for exactly one host (DNS name, or IP
  address for IP-literal targets): ECDSA P-256, ``serverAuth``, valid from one hour ago
  for 7 days (never past the CA's own expiry), chain leaf + CA. The context offers ALPN
  ``http/1.1`` only, never ``h2``, requires TLS 1.2 or newer, and refuses renegotiation.
- SNI check (THREATS C5): the context's SNI callback compares the client's SNI, when it
  sends one, with the host the leaf was minted for (lower-case, trailing dot stripped). On
  a mismatch the handshake fails with ``unrecognized_name`` and the SSL object is recorded
  so the proxy can tell this apart from other handshake failures (:func:`sni_mismatched`).
  A client that sends no SNI (IP-literal targets) is accepted.
- :func:`upstream_context` is the proxy's own client context toward real upstreams:
  system roots (plus an operator CA file when configured), hostname checking on, TLS 1.2
  or newer, ALPN ``http/1.1``.

Resource handling: :mod:`ssl` loads certificates and keys only from files, so each leaf's
chain and key are written to a fresh private directory from :func:`tempfile.mkdtemp`
(0700, files 0600), loaded, and deleted in a ``finally``. The leaf key is written encrypted
under a random one-time password that never leaves memory, so not even a crash between
writing and deleting leaves a usable key on disk. Contexts are cached per (host, ip) in an
LRU of at most 1024 entries and re-minted when the cached leaf has less than a day left.
Minting (about a millisecond of CPU) runs inline; the cache is meant for one thread (trio).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import ssl
import stat
import tempfile
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KEY_FILE = "ca-key.pem"
CERT_FILE = "ca.pem"
CA_COMMON_NAME = "svcgate egress CA"
CA_ORGANIZATION = "svcgate"
CA_LIFETIME = timedelta(days=3650)
BACKDATE = timedelta(hours=1)
LEAF_LIFETIME = timedelta(days=7)
REMINT_MARGIN = timedelta(days=1)
CONTEXT_CACHE_SIZE = 1024
ALPN = ["http/1.1"]
DEFAULT_SYSTEM_ROOTS = Path("/etc/ssl/certs/ca-certificates.crt")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_SigningKey = (
    ec.EllipticCurvePrivateKey
    | rsa.RSAPrivateKey
    | ed25519.Ed25519PrivateKey
    | ed448.Ed448PrivateKey
)

# SSL objects whose handshake the SNI callback refused (THREATS C5). Weak, so entries go
# away with their connections.
_SNI_MISMATCHED: weakref.WeakSet[object] = weakref.WeakSet()


class CAError(Exception):
    """CA files unusable; str() is one line for the operator, never key material."""


def sni_mismatched(ssl_object: object) -> bool:
    """True when the SNI callback of a :meth:`GatewayCA.server_context` refused this object."""
    return ssl_object in _SNI_MISMATCHED


@dataclass(frozen=True)
class _CachedContext:
    context: ssl.SSLContext
    not_after: datetime


class GatewayCA:
    """The loaded CA: its certificate, its key, and a cache of per-host server contexts."""

    def __init__(self, key: _SigningKey, cert: x509.Certificate) -> None:
        self._key = key
        self._cert = cert
        self._cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        self._hash: hashes.SHA256 | None = (
            None
            if isinstance(key, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey)
            else hashes.SHA256()
        )
        self._authority_key_id = _authority_key_id(cert, key)
        self._contexts: OrderedDict[tuple[str, IPAddress | None], _CachedContext] = OrderedDict()

    @classmethod
    def load_or_create(cls, directory: Path) -> GatewayCA:
        key_path = directory / KEY_FILE
        cert_path = directory / CERT_FILE
        try:
            if not directory.exists():
                directory.mkdir(parents=True, mode=0o700)
                os.chmod(directory, 0o700)
            has_key = key_path.exists()
            has_cert = cert_path.exists()
        except OSError as exc:
            raise CAError(f"cannot use CA directory {str(directory)!r}: {_reason(exc)}") from None
        if has_key and has_cert:
            return cls._load(key_path, cert_path)
        if has_key or has_cert:
            present, missing = (key_path, cert_path) if has_key else (cert_path, key_path)
            raise CAError(
                f"CA file {str(present)!r} exists but {str(missing)!r} is missing; "
                "restore it, or remove both to create a new CA"
            )
        return cls._create(key_path, cert_path)

    @classmethod
    def _create(cls, key_path: Path, cert_path: Path) -> GatewayCA:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.COMMON_NAME, CA_COMMON_NAME),
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, CA_ORGANIZATION),
            ]
        )
        now = datetime.now(UTC)
        public = key.public_key()
        cert = (
            _certificate_builder(name, name, public, now, now + CA_LIFETIME, ca=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        try:
            _write_atomically(key_path, key_pem, 0o600)
            _write_atomically(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
        except OSError as exc:
            raise CAError(
                f"cannot write CA files in {str(key_path.parent)!r}: {_reason(exc)}"
            ) from None
        return cls(key, cert)

    @classmethod
    def _load(cls, key_path: Path, cert_path: Path) -> GatewayCA:
        try:
            with open(key_path, "rb") as handle:
                info = os.fstat(handle.fileno())
                if not stat.S_ISREG(info.st_mode):
                    raise CAError(f"CA key {str(key_path)!r} is not a regular file")
                if info.st_mode & 0o077:
                    raise CAError(
                        f"CA key {str(key_path)!r} is accessible by group or others "
                        f"(mode {stat.S_IMODE(info.st_mode):04o}); chmod 600 it"
                    )
                key_pem = handle.read()
            cert_pem = cert_path.read_bytes()
        except OSError as exc:
            raise CAError(f"cannot read CA files: {_reason(exc)}") from None
        try:
            key = serialization.load_pem_private_key(key_pem, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm):
            raise CAError(
                f"CA key {str(key_path)!r} is not an unencrypted PEM private key"
            ) from None
        if not isinstance(
            key,
            ec.EllipticCurvePrivateKey
            | rsa.RSAPrivateKey
            | ed25519.Ed25519PrivateKey
            | ed448.Ed448PrivateKey,
        ):
            raise CAError(f"CA key {str(key_path)!r} has an unsupported key type")
        try:
            cert = x509.load_pem_x509_certificate(cert_pem)
        except ValueError:
            raise CAError(f"CA certificate {str(cert_path)!r} is not a PEM certificate") from None
        _check_ca_certificate(cert, key, cert_path)
        return cls(key, cert)

    @property
    def certificate(self) -> x509.Certificate:
        return self._cert

    @property
    def cert_pem(self) -> bytes:
        return self._cert_pem

    def bundle(self, system_roots: Path | None = DEFAULT_SYSTEM_ROOTS) -> bytes:
        """System roots followed by this CA, for the sandbox's CA bundle variables.

        The roots come from ``system_roots`` when that file exists, otherwise from
        ``certifi`` when it is importable, otherwise there are none.
        """
        roots = b""
        if system_roots is not None and system_roots.is_file():
            roots = system_roots.read_bytes()
        else:
            try:
                import certifi  # optional: only for hosts without system roots
            except ImportError:
                pass
            else:
                roots = Path(certifi.where()).read_bytes()
        return roots + b"\n" + self._cert_pem if roots else self._cert_pem

    def server_context(self, host: str, ip: IPAddress | None = None) -> ssl.SSLContext:
        """A server context presenting a leaf for ``host`` (or for ``ip`` when given)."""
        canonical = _canonical_host(host)
        cache_key = (canonical, ip)
        now = datetime.now(UTC)
        cached = self._contexts.get(cache_key)
        if cached is not None and cached.not_after - now >= REMINT_MARGIN:
            self._contexts.move_to_end(cache_key)
            return cached.context
        entry = self._mint(canonical, ip, now)
        self._contexts[cache_key] = entry
        self._contexts.move_to_end(cache_key)
        while len(self._contexts) > CONTEXT_CACHE_SIZE:
            self._contexts.popitem(last=False)
        return entry.context

    def _mint(self, host: str, ip: IPAddress | None, now: datetime) -> _CachedContext:
        key = ec.generate_private_key(ec.SECP256R1())
        public = key.public_key()
        not_after = min(now + LEAF_LIFETIME, self._cert.not_valid_after_utc)
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, CA_ORGANIZATION)]
        if len(host) <= 64:  # the CN upper bound; the SAN is what clients check anyway
            attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, host))
        san: x509.GeneralName = x509.IPAddress(ip) if ip is not None else x509.DNSName(host)
        subject = x509.Name(attributes)
        leaf = (
            _certificate_builder(subject, self._cert.subject, public, now, not_after, ca=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(self._authority_key_id, critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(self._key, self._hash)
        )
        password = secrets.token_bytes(32)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.BestAvailableEncryption(password),
        )
        chain_pem = leaf.public_bytes(serialization.Encoding.PEM) + self._cert_pem

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.options |= ssl.OP_NO_RENEGOTIATION
        context.set_alpn_protocols(ALPN)
        scratch = tempfile.mkdtemp(prefix="svcgate-leaf-")
        try:
            os.chmod(scratch, 0o700)
            chain_file = os.path.join(scratch, "chain.pem")
            key_file = os.path.join(scratch, "key.pem")
            _write_new(chain_file, chain_pem, 0o600, durable=False)
            _write_new(key_file, key_pem, 0o600, durable=False)
            context.load_cert_chain(chain_file, key_file, password=password)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        context.sni_callback = _sni_check(host)
        return _CachedContext(context, not_after)


def _certificate_builder(
    subject: x509.Name,
    issuer: x509.Name,
    public: ec.EllipticCurvePublicKey,
    now: datetime,
    not_after: datetime,
    *,
    ca: bool,
) -> x509.CertificateBuilder:
    """What the CA and its leaves share: names, key, validity from ``now - BACKDATE`` to
    ``not_after``, critical BasicConstraints (a CA: ``path_length=0``) and critical KeyUsage
    (digital signature; certificate and CRL signing for a CA)."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )


def upstream_context(extra_ca_file: Path | None = None) -> ssl.SSLContext:
    """The proxy's client context toward upstreams: verified, hostname-checked, HTTP/1.1."""
    context = ssl.create_default_context()
    if extra_ca_file is not None:
        try:
            context.load_verify_locations(cafile=str(extra_ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise CAError(
                f"cannot load upstream CA file {str(extra_ca_file)!r}: {_reason(exc)}"
            ) from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(ALPN)
    return context


def _sni_check(
    host: str,
) -> Callable[[ssl.SSLObject, str | None, ssl.SSLContext], int | None]:
    def check(ssl_object: ssl.SSLObject, server_name: str | None, _: ssl.SSLContext) -> int | None:
        if server_name is None or _canonical_sni(server_name) == host:
            return None
        _SNI_MISMATCHED.add(ssl_object)
        return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME

    return check


def _canonical_sni(name: str) -> str:
    return name.lower().removesuffix(".")


def _canonical_host(host: str) -> str:
    canonical = host.lower().removesuffix(".")
    if not canonical or not canonical.isascii() or len(canonical) > 253:
        raise ValueError("leaf host must be a non-empty ASCII (A-label) name")
    return canonical


def _check_ca_certificate(cert: x509.Certificate, key: _SigningKey, cert_path: Path) -> None:
    where = repr(str(cert_path))
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if cert.public_key().public_bytes(der, spki) != key.public_key().public_bytes(der, spki):
        raise CAError(f"CA certificate {where} does not match the CA key")
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        raise CAError(f"CA certificate {where} is not a CA (no BasicConstraints)") from None
    if not constraints.ca:
        raise CAError(f"CA certificate {where} is not a CA (BasicConstraints ca=false)")
    try:
        usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        pass
    else:
        if not usage.key_cert_sign:
            raise CAError(f"CA certificate {where} may not sign certificates (KeyUsage)")
    expires = cert.not_valid_after_utc
    if expires <= datetime.now(UTC):
        raise CAError(
            f"CA certificate {where} expired on {expires:%Y-%m-%d}; "
            "remove both CA files to create a new CA"
        )


def _authority_key_id(cert: x509.Certificate, key: _SigningKey) -> x509.AuthorityKeyIdentifier:
    try:
        ski = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key())
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    """Write ``path`` via a new temp file with ``mode`` from the start, then rename."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        _write_new(str(tmp), data, mode, durable=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _write_new(path: str, data: bytes, mode: int, *, durable: bool) -> None:
    """Create ``path`` (which must not exist) with ``mode`` from the first instant."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, mode)
    try:
        os.fchmod(fd, mode)  # exact mode whatever the umask
        with open(fd, "wb", closefd=False) as handle:
            handle.write(data)
            handle.flush()
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__
