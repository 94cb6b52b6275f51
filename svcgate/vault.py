"""The credential vault: envelope encryption with AES-256-GCM under a key-encryption key.

Each credential gets a fresh 256-bit data key (DEK) and random 96-bit nonces. The secret is
sealed with the DEK; the DEK is wrapped with the active key-encryption key (KEK). Associated
data binds both layers to the owner and the server name, and the wrap also to the KEK
version, so a ciphertext or wrapped key copied to another row fails to decrypt (THREATS.md
E1). Any tampering raises :class:`VaultError`, never an empty credential (E3).

The KEK ring lives in a file of JSON lines ``{"version": N, "key": "<base64>"}``; the
highest version is active. Rotation appends a new version, re-wraps every DEK in batches,
and only then removes the old versions, so a rotation killed at any point leaves every row
decryptable and a re-run finishes the job (E2). The file must not be readable by group or
others (E4); in development it is created with mode 0600 on first use.

Rotation runs offline (:func:`rotate`, no daemon) or through the running daemon: the
operator's ``svcgate vault rotate-key`` writes the new version to the key file, hands the
daemon the file's ring (:meth:`Vault.adopt`), the daemon re-wraps through its store writer
(:func:`rewrap_batch`) and forgets the old keys (:meth:`Vault.retire_except`), then the CLI
prunes the file. Keys are compared by :func:`fingerprint`, never shown.

Resource handling: key material is held in memory only as long as the :class:`Vault` lives.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
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


def fingerprint(key: bytes) -> str:
    """A short, one-way name for a key: lets two holders check they hold the same key
    without either showing it (the key is 256 random bits, so the hash reveals nothing)."""
    return hashlib.sha256(b"svcgate-vault-kek-fingerprint\x00" + key).hexdigest()[:16]


def check_extends(ring: KeyRing, held: KeyRing) -> None:
    """Raise unless ``ring`` holds every version of ``held`` with the same key bytes."""
    for version, key in held.keys.items():
        other = ring.keys.get(version)
        if other is None:
            raise KeyFileError(f"the new key ring lacks key version {version}, which is in use")
        if not hmac.compare_digest(other, key):
            raise KeyFileError(f"the new key ring holds a different key for version {version}")


class Vault:
    """Seals and opens credentials with the key ring.

    The ring is read from ``path`` at start. Until a rotation hands the vault a ring
    (:meth:`adopt`), the file is read again when a version is missing or before sealing, so
    an offline rotation of the file is picked up; a file that is older than the ring held
    (fewer versions, a lower active one) or disagrees with it is never taken, so a stale
    copy can never downgrade the ring. After :meth:`adopt` the file is not read again: under
    systemd it is a read-only copy made at start (``$CREDENTIALS_DIRECTORY``), which no
    rotation updates.

    Thread safety: the ring is replaced, never mutated, so a reader in another thread sees
    either the old or the new ring.
    """

    def __init__(self, ring: KeyRing, path: Path | None = None) -> None:
        self._ring = ring
        self._path = path
        self._adopted = False

    @property
    def active(self) -> int:
        return self._ring.active

    def fingerprints(self) -> dict[int, str]:
        """Version -> :func:`fingerprint` of every key held."""
        return {v: fingerprint(k) for v, k in sorted(self._ring.keys.items())}

    def adopt(self, ring: KeyRing) -> None:
        """Use ``ring`` from now on (a rotation); it must extend the ring held."""
        check_extends(ring, self._ring)
        self._ring = KeyRing(ring.keys)
        self._adopted = True

    def retire_except(self, version: int) -> None:
        """Forget every key but ``version`` (the end of a rotation)."""
        self._ring = KeyRing({version: self._kek(version)})

    def _reread(self) -> KeyRing:
        ring = self._ring
        if self._path is None or self._adopted:
            return ring
        fresh = load_key_file(self._path, create=False)
        if fresh.active < ring.active:
            return ring  # an older copy of the file: never go back
        if fresh.active == ring.active and not hmac.compare_digest(
            fresh.keys[fresh.active], ring.keys[ring.active]
        ):
            raise KeyFileError(
                f"vault key file {str(self._path)!r} holds another key for the active version "
                f"{ring.active}; restore it"
            )
        self._ring = fresh
        return fresh

    def _kek(self, version: int) -> bytes:
        key = self._ring.keys.get(version)
        if key is None:
            # A rotation may have added a version since start-up: re-read the file once.
            key = self._reread().keys.get(version)
        if key is None:
            raise VaultError(f"key version {version} is not on the key ring")
        return key

    def seal(self, user_id: int, server: str, secret: bytes) -> Sealed:
        # Seal under the newest key even if an offline rotation started after start-up.
        ring = self._reread()
        dek = AESGCM.generate_key(bit_length=256)
        version = ring.active
        return Sealed(
            ciphertext=_seal(dek, secret, _secret_aad(user_id, server)),
            wrapped_dek=_seal(ring.keys[version], dek, _wrap_aad(user_id, server, version)),
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


def rewrap_batch(
    conn: sqlite3.Connection, vault: Vault, target: int, limit: int = REWRAP_BATCH
) -> int:
    """Re-wrap up to ``limit`` credentials that are not under key ``target``; return how
    many. Runs inside the caller's write transaction."""
    rows = conn.execute(
        "SELECT id, user_id, server, ciphertext, wrapped_dek, kek_version FROM credentials"
        " WHERE kek_version != ? LIMIT ?",
        (target, limit),
    ).fetchall()
    for row in rows:
        new = vault.rewrap(row[1], row[2], Sealed(row[3], row[4], row[5]), target)
        conn.execute(
            "UPDATE credentials SET wrapped_dek = ?, kek_version = ? WHERE id = ?",
            (new.wrapped_dek, new.kek_version, row[0]),
        )
    return len(rows)


def not_under(conn: sqlite3.Connection, target: int) -> int:
    """How many credentials are wrapped under another key than ``target``."""
    count: int = conn.execute(
        "SELECT count(*) FROM credentials WHERE kek_version != ?", (target,)
    ).fetchone()[0]
    return count


def next_ring(ring: KeyRing) -> KeyRing:
    """The ring a rotation works with: a file that already holds several versions is a
    rotation in progress (finished, not started again); else a new version is added."""
    if len(ring.keys) > 1:
        return ring
    return KeyRing({**ring.keys, ring.active + 1: secrets.token_bytes(KEY_BYTES)})


def rotate(conn: sqlite3.Connection, path: Path) -> tuple[int, int]:
    """Rotate the KEK offline (no daemon running); return (new active version, rows
    re-wrapped).

    Safe to kill at any point and to re-run: a file that already holds several versions is
    a rotation in progress, which is finished (re-wrap to the newest, then prune) instead of
    starting another. With a running daemon the rotation goes through it instead
    (``svcgate vault rotate-key``, :mod:`svcgate.operator_commands`).
    """
    current = load_key_file(path, create=False)
    ring = next_ring(current)
    if ring is not current:
        write_key_file(path, ring)
    vault = Vault(ring)
    target = ring.active
    rewrapped = 0
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            done = rewrap_batch(conn, vault, target)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if not done:
            break
        rewrapped += done
    # Prune under the write lock so no row sealed with an old version can slip in between
    # the last check and the file replacement.
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not_under(conn, target):
            raise VaultError("credentials were written during rotation; run it again")
        write_key_file(path, KeyRing({target: ring.keys[target]}))
    finally:
        conn.execute("ROLLBACK")
    return target, rewrapped
