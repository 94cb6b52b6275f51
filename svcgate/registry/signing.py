"""Ed25519 keys and detached signatures for the registry index (THREATS.md F1).

The index is signed as opaque bytes: the signature covers the exact file, and the gateway
verifies it **before** parsing anything, against public keys pinned in its settings
(``SVC_REGISTRY_KEYS``). A signature by any one trusted key is enough, which lets an
operator rotate keys: sign with old and new, move the gateways over, drop the old key.

Formats (docs/registry.md):

- Public key: one line ``ed25519:<base64 of the 32 raw bytes>``. Its key id is the first 16
  hex digits of the SHA-256 of the raw bytes.
- Private key: PKCS#8 PEM, written with mode 0600 by ``svcgate registry keygen``.
- Signature file (``index.json.sig``): JSON ``{"signatures": [{"keyid": "<16 hex>", "sig":
  "<base64 of 64 bytes>"}]}``. Signatures whose key id names no trusted key are ignored.

Uses ``cryptography`` for Ed25519; only the small text formats are ours.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PREFIX = "ed25519:"
MAX_SIGNATURE_FILE = 64 * 1024
MAX_SIGNATURES = 16


class SignatureError(Exception):
    """The signature or a key is unusable; ``str()`` says why (never key material)."""


@dataclass(frozen=True)
class PublicKey:
    raw: bytes

    @property
    def keyid(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()[:16]

    def text(self) -> str:
        return PREFIX + base64.b64encode(self.raw).decode("ascii")

    def verify(self, signature: bytes, data: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.raw).verify(signature, data)
        except InvalidSignature:
            return False
        return True


def parse_public_key(text: str) -> PublicKey:
    """Parse ``ed25519:<base64>`` (surrounding whitespace ignored)."""
    text = text.strip()
    if not text.startswith(PREFIX):
        raise SignatureError(f"a public key must look like {PREFIX}<base64>")
    try:
        raw = base64.b64decode(text[len(PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise SignatureError("the public key is not valid base64") from None
    if len(raw) != 32:
        raise SignatureError("an Ed25519 public key has 32 bytes")
    try:
        Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        raise SignatureError("not a valid Ed25519 public key") from None
    return PublicKey(raw)


def parse_public_keys(lines: Iterable[str]) -> list[PublicKey]:
    """Keys from text lines; blank lines and ``#`` comments are skipped."""
    keys: list[PublicKey] = []
    for line in lines:
        line = line.strip()
        if line and not line.startswith("#"):
            key = parse_public_key(line)
            if key not in keys:
                keys.append(key)
    return keys


def generate(private_path: Path) -> PublicKey:
    """Write a new private key (PEM, 0600, never overwriting) and return its public key."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    return _public_of(key)


def _public_of(key: Ed25519PrivateKey) -> PublicKey:
    return PublicKey(
        key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SignatureError(f"cannot read {path} ({exc.strerror})") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise SignatureError(f"{path} is not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SignatureError(f"{path} is not an Ed25519 key")
    return key


def sign(data: bytes, keys: Sequence[Ed25519PrivateKey]) -> bytes:
    """The signature file for ``data``, one signature per key."""
    signatures = [
        {"keyid": _public_of(key).keyid, "sig": base64.b64encode(key.sign(data)).decode()}
        for key in keys
    ]
    return json.dumps({"signatures": signatures}, indent=2).encode() + b"\n"


def parse_signatures(blob: bytes) -> list[tuple[str, bytes]]:
    """(key id, signature) pairs of a signature file; malformed files raise."""
    if len(blob) > MAX_SIGNATURE_FILE:
        raise SignatureError("the signature file is too large")
    try:
        document = json.loads(blob)
    except (ValueError, RecursionError):
        raise SignatureError("the signature file is not JSON") from None
    entries = document.get("signatures") if isinstance(document, dict) else None
    if not isinstance(document, dict) or set(document) != {"signatures"}:
        raise SignatureError('the signature file must be {"signatures": [...]}')
    if not isinstance(entries, list) or not entries or len(entries) > MAX_SIGNATURES:
        raise SignatureError(f"the signature file needs 1 to {MAX_SIGNATURES} signatures")
    out: list[tuple[str, bytes]] = []
    for entry in entries:
        if (
            not isinstance(entry, dict)
            or set(entry) != {"keyid", "sig"}
            or not isinstance(entry["keyid"], str)
            or not isinstance(entry["sig"], str)
        ):
            raise SignatureError('each signature must be {"keyid": ..., "sig": ...}')
        try:
            signature = base64.b64decode(entry["sig"], validate=True)
        except (binascii.Error, ValueError):
            raise SignatureError("a signature is not valid base64") from None
        if len(signature) != 64:
            raise SignatureError("an Ed25519 signature has 64 bytes")
        out.append((entry["keyid"], signature))
    return out


def _printable_id(keyid: str) -> str:
    return keyid if len(keyid) == 16 and all(c in "0123456789abcdef" for c in keyid) else "?"


def verify(data: bytes, signature_file: bytes, trusted: Sequence[PublicKey]) -> PublicKey:
    """Return the trusted key that signed ``data`` exactly; raise otherwise."""
    if not trusted:
        raise SignatureError("no trusted registry key is configured")
    by_id = {key.keyid: key for key in trusted}
    signatures = parse_signatures(signature_file)
    known = [(by_id[keyid], sig) for keyid, sig in signatures if keyid in by_id]
    if not known:
        raise SignatureError(
            "the index is not signed by a trusted key (signed by key id(s) "
            + ", ".join(sorted({_printable_id(keyid) for keyid, _ in signatures}))
            + ")"
        )
    for key, signature in known:
        if key.verify(signature, data):
            return key
    raise SignatureError(
        "the index signature does not verify: the index or its signature was altered"
    )
