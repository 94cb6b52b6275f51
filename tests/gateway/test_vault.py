"""The vault: envelope encryption, binding, tampering, key files and crash-safe rotation (E1-E4)."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svcgate import vault
from svcgate.migrations import MIGRATIONS
from svcgate.store import migrate
from svcgate.vault import KeyFileError, KeyRing, Sealed, Vault, VaultError, load_key_file

RING = KeyRing({1: b"\x01" * 32})


def test_round_trip_and_fresh_randomness() -> None:
    v = Vault(RING)
    a = v.seal(1, "github", b"ghp_secret")
    b = v.seal(1, "github", b"ghp_secret")
    assert v.open(1, "github", a) == b"ghp_secret"
    assert a.ciphertext != b.ciphertext
    assert a.wrapped_dek != b.wrapped_dek
    assert b"ghp_secret" not in a.ciphertext


@pytest.mark.parametrize(("user", "server"), [(2, "github"), (1, "gitlab"), (2, "gitlab")])
def test_a_transplanted_ciphertext_fails(user: int, server: str) -> None:
    v = Vault(RING)
    sealed = v.seal(1, "github", b"secret")
    with pytest.raises(VaultError):
        v.open(user, server, sealed)


def test_a_wrapped_key_relabelled_with_another_version_fails() -> None:
    v = Vault(KeyRing({1: b"\x01" * 32, 2: b"\x01" * 32}))
    sealed = v.seal(1, "s", b"secret")
    with pytest.raises(VaultError):
        v.open(
            1,
            "s",
            Sealed(sealed.ciphertext, sealed.wrapped_dek, 1 if sealed.kek_version == 2 else 2),
        )


@settings(max_examples=200)
@given(st.data())
def test_any_bit_flip_is_detected(data: st.DataObject) -> None:
    v = Vault(RING)
    sealed = v.seal(7, "srv", b"the secret value")
    field = data.draw(st.sampled_from(["ciphertext", "wrapped_dek"]))
    blob = bytearray(getattr(sealed, field))
    bit = data.draw(st.integers(0, len(blob) * 8 - 1))
    blob[bit // 8] ^= 1 << (bit % 8)
    tampered = Sealed(**{**sealed.__dict__, field: bytes(blob)})
    with pytest.raises(VaultError):
        v.open(7, "srv", tampered)


def test_key_file_is_generated_0600(tmp_path: Path) -> None:
    path = tmp_path / "k" / "vault.key"
    ring = load_key_file(path, create=True)
    assert (path.stat().st_mode & 0o777) == 0o600
    assert load_key_file(path, create=False).keys == ring.keys


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_readable_key_file_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "vault.key"
    load_key_file(path, create=True)
    path.chmod(mode)
    with pytest.raises(KeyFileError, match="group or others"):
        load_key_file(path, create=False)


def test_a_missing_production_key_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="does not exist"):
        load_key_file(tmp_path / "absent", create=False)


def _db_with_credentials(
    tmp_path: Path, count: int
) -> tuple[Path, Path, dict[tuple[int, str], bytes]]:
    db, key = tmp_path / "svcgate.db", tmp_path / "vault.key"
    v = Vault(load_key_file(key, create=True))
    conn = sqlite3.connect(db, isolation_level=None)
    migrate(conn)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    conn.execute(
        "INSERT INTO users (id, issuer, subject, role, created_at, updated_at)"
        " VALUES (1, 'i', 's', 'user', 't', 't')"
    )
    expected = {}
    conn.execute("BEGIN")
    for n in range(count):
        server = f"srv{n}"
        secret = os.urandom(16).hex().encode()
        sealed = v.seal(1, server, secret)
        conn.execute(
            "INSERT INTO credentials (user_id, server, ciphertext, wrapped_dek, kek_version,"
            " created_at, updated_at) VALUES (1, ?, ?, ?, ?, 't', 't')",
            (server, sealed.ciphertext, sealed.wrapped_dek, sealed.kek_version),
        )
        expected[(1, server)] = secret
    conn.execute("COMMIT")
    conn.close()
    return db, key, expected


def _decrypt_all(db: Path, key: Path) -> dict[tuple[int, str], bytes]:
    v = Vault(load_key_file(key, create=False))
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT user_id, server, ciphertext, wrapped_dek, kek_version FROM credentials"
        ).fetchall()
    return {(r[0], r[1]): v.open(r[0], r[1], Sealed(r[2], r[3], r[4])) for r in rows}


def test_rotation_rewraps_everything_and_drops_the_old_key(tmp_path: Path) -> None:
    db, key, expected = _db_with_credentials(tmp_path, 450)
    with sqlite3.connect(db, isolation_level=None) as conn:
        version, count = vault.rotate(conn, key)
    assert (version, count) == (2, 450)
    assert list(load_key_file(key, create=False).keys) == [2]
    assert _decrypt_all(db, key) == expected
    with sqlite3.connect(db, isolation_level=None) as conn:
        assert vault.rotate(conn, key) == (3, 450)
    assert _decrypt_all(db, key) == expected


def test_rotation_survives_being_killed_at_any_point(tmp_path: Path) -> None:
    db, key, expected = _db_with_credentials(tmp_path, 3000)
    env = {**os.environ, "SVC_DATA_DIR": str(tmp_path), "SVC_VAULT_KEY_FILE": str(key)}
    rng = random.Random(1234)  # seeded: the kill points are chaos input, not synchronisation
    for _ in range(6):
        proc = subprocess.Popen(
            [sys.executable, "-m", "svcgate", "vault", "rotate-key"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            proc.wait(timeout=rng.uniform(0.2, 1.5))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        # Whatever point it died at, every row decrypts under the key file as it is.
        assert _decrypt_all(db, key) == expected
    finished = subprocess.run(
        [sys.executable, "-m", "svcgate", "vault", "rotate-key"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "re-wrapped" in finished.stdout
    assert len(load_key_file(key, create=False).keys) == 1
    assert _decrypt_all(db, key) == expected
