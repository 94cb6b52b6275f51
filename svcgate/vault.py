"""The credential vault: envelope encryption with AES-256-GCM under a key-encryption key.

Each credential gets a fresh 256-bit data key (DEK) and random 96-bit nonces. The secret is
sealed with the DEK; the DEK is wrapped with the active key-encryption key (KEK). Associated
data binds both layers to the owner and the server name, and the wrap also to the KEK
version, so a ciphertext or wrapped key copied to another row fails to decrypt (THREATS.md
E1). Any tampering raises :class:`VaultError`, never an empty credential (E3).

The KEK ring lives in a file of JSON lines ``{"version": N, "key": "<base64>"}``; the
highest version is active. Rotation (:func:`rotate`) appends a new version, re-wraps every
DEK in batches, and only then removes the old versions, so a rotation killed at any point
leaves every row decryptable and a re-run finishes the job (E2). The file must not be
readable by group or others (E4); in development it is created with mode 0600 on first use.

Resource handling: key material is held in memory only as long as the :class:`Vault` lives.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

NONCE_BYTES = 12
KEY_BYTES = 32
SCHEMA = "svcgate-vault-v1"
REWRAP_BATCH = 200


class VaultError(Exception):
    """Decryption or key handling failed. Messages never contain key or secret material."""


class KeyFileError(VaultError):
    pass


@dataclass(frozen=True)
class Sealed:
    ciphertext: bytes  # nonce || AES-GCM(DEK, secret)
    wrapped_dek: bytes  # nonce || AES-GCM(KEK_v, DEK)
    kek_version: int


def _secret_aad(user_id: int, server: str) -> bytes:
    return f"{SCHEMA}|secret|user={user_id}|server={server}".encode()


def _wrap_aad(user_id: int, server: str, version: int) -> bytes:
    return f"{SCHEMA}|dek|user={user_id}|server={server}|kek={version}".encode()


def _seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    nonce = secrets.token_bytes(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def _open(key: bytes, blob: bytes, aad: bytes) -> bytes:
    try:
        return AESGCM(key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], aad)
    except (InvalidTag, ValueError) as exc:
        raise VaultError("credential failed authentication (tampered or moved)") from exc


class KeyRing:
    """KEK versions read from the key file."""

    def __init__(self, keys: dict[int, bytes]) -> None:
        if not keys:
            raise KeyFileError("the vault key file holds no key")
        self.keys = dict(keys)

    @property
    def active(self) -> int:
        return max(self.keys)

    @classmethod
    def parse(cls, text: str) -> KeyRing:
        keys: dict[int, bytes] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                version = int(entry["version"])
                key = base64.b64decode(entry["key"], validate=True)
            except (ValueError, KeyError, TypeError) as exc:
                raise KeyFileError(f"vault key file line {number} is malformed") from exc
            if len(key) != KEY_BYTES or version < 1:
                raise KeyFileError(f"vault key file line {number} is not a 256-bit key")
            keys[version] = key
        return cls(keys)

    def dump(self) -> str:
        return "".join(
            json.dumps({"version": v, "key": base64.b64encode(k).decode()}) + "\n"
            for v, k in sorted(self.keys.items())
        )


def check_permissions(path: Path) -> None:
    info = path.stat()
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            f"vault key file {str(path)!r} is accessible by group or others "
            f"(mode {stat.S_IMODE(info.st_mode):04o}); chmod 600 it"
        )


def write_key_file(path: Path, ring: KeyRing) -> None:
    """Replace the key file atomically (write, fsync, rename, fsync the directory)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, ring.dump().encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_key_file(path: Path, *, create: bool) -> KeyRing:
    if not path.exists():
        if not create:
            raise KeyFileError(f"vault key file {str(path)!r} does not exist")
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        ring = KeyRing({1: secrets.token_bytes(KEY_BYTES)})
        write_key_file(path, ring)
        return ring
    check_permissions(path)
    try:
        return KeyRing.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"cannot read vault key file {str(path)!r}") from exc


class Vault:
    def __init__(self, ring: KeyRing, path: Path | None = None) -> None:
        self._ring = ring
        self._path = path

    def _kek(self, version: int) -> bytes:
        key = self._ring.keys.get(version)
        if key is None and self._path is not None:
            # A rotation may have added a version since start-up: re-read the file once.
            self._ring = load_key_file(self._path, create=False)
            key = self._ring.keys.get(version)
        if key is None:
            raise VaultError(f"key version {version} is not on the key ring")
        return key

    def seal(self, user_id: int, server: str, secret: bytes) -> Sealed:
        if self._path is not None:
            # Seal under the newest key even if a rotation started after start-up.
            self._ring = load_key_file(self._path, create=False)
        dek = AESGCM.generate_key(bit_length=256)
        version = self._ring.active
        return Sealed(
            ciphertext=_seal(dek, secret, _secret_aad(user_id, server)),
            wrapped_dek=_seal(self._kek(version), dek, _wrap_aad(user_id, server, version)),
            kek_version=version,
        )

    def open(self, user_id: int, server: str, sealed: Sealed) -> bytes:
        aad = _wrap_aad(user_id, server, sealed.kek_version)
        dek = _open(self._kek(sealed.kek_version), sealed.wrapped_dek, aad)
        return _open(dek, sealed.ciphertext, _secret_aad(user_id, server))

    def rewrap(self, user_id: int, server: str, sealed: Sealed, version: int) -> Sealed:
        aad = _wrap_aad(user_id, server, sealed.kek_version)
        dek = _open(self._kek(sealed.kek_version), sealed.wrapped_dek, aad)
        wrapped = _seal(self._kek(version), dek, _wrap_aad(user_id, server, version))
        return Sealed(sealed.ciphertext, wrapped, version)


def rotate(conn: sqlite3.Connection, path: Path) -> tuple[int, int]:
    """Rotate the KEK; return (new active version, rows re-wrapped).

    Safe to kill at any point and to re-run: a file that already holds several versions is
    a rotation in progress, which is finished (re-wrap to the newest, then prune) instead of
    starting another.
    """
    ring = load_key_file(path, create=False)
    if len(ring.keys) == 1:
        ring = KeyRing({**ring.keys, ring.active + 1: secrets.token_bytes(KEY_BYTES)})
        write_key_file(path, ring)
    vault = Vault(ring)
    target = ring.active
    rewrapped = 0
    while True:
        rows = conn.execute(
            "SELECT id, user_id, server, ciphertext, wrapped_dek, kek_version FROM credentials"
            " WHERE kek_version != ? LIMIT ?",
            (target, REWRAP_BATCH),
        ).fetchall()
        if not rows:
            break
        conn.execute("BEGIN IMMEDIATE")
        try:
            for row in rows:
                sealed = Sealed(row[3], row[4], row[5])
                new = vault.rewrap(row[1], row[2], sealed, target)
                conn.execute(
                    "UPDATE credentials SET wrapped_dek = ?, kek_version = ? WHERE id = ?",
                    (new.wrapped_dek, new.kek_version, row[0]),
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        rewrapped += len(rows)
    # Prune under the write lock so no row sealed with an old version can slip in between
    # the last check and the file replacement.
    conn.execute("BEGIN IMMEDIATE")
    try:
        left = conn.execute(
            "SELECT count(*) FROM credentials WHERE kek_version != ?", (target,)
        ).fetchone()[0]
        if left:
            raise VaultError("credentials were written during rotation; run it again")
        write_key_file(path, KeyRing({target: ring.keys[target]}))
    finally:
        conn.execute("ROLLBACK")
    return target, rewrapped
