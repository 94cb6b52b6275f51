"""Versioned schema migrations, applied in order and recorded in ``PRAGMA user_version``.

A migration is never edited once released: add a new one. Each runs in one transaction
together with the version bump, so a crash leaves the schema at a known version.
"""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
    # 1: users, sessions, audit log, and the profile tables the data plane authenticates against.
    """
    CREATE TABLE users (
        id INTEGER PRIMARY KEY,
        issuer TEXT NOT NULL,
        subject TEXT NOT NULL,
        email TEXT NOT NULL DEFAULT '',
        display_name TEXT NOT NULL DEFAULT '',
        role TEXT NOT NULL CHECK (role IN ('admin', 'user')),
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        UNIQUE (issuer, subject)
    );
    CREATE TABLE sessions (
        token_hash TEXT PRIMARY KEY,
        user_id INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        imp_user_id INTEGER REFERENCES users(id) ON DELETE SET NULL,
        imp_expires_at REAL
    ) WITHOUT ROWID;
    CREATE INDEX sessions_user ON sessions(user_id);
    CREATE INDEX sessions_expiry ON sessions(expires_at);
    CREATE TABLE audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('egress', 'auth', 'admin')),
        user_id INTEGER NOT NULL DEFAULT 0,
        profile_id INTEGER NOT NULL DEFAULT 0,
        server TEXT NOT NULL DEFAULT '',
        host TEXT NOT NULL DEFAULT '',
        decision TEXT NOT NULL,
        detail TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX audit_user_id ON audit(user_id, id);
    CREATE TABLE servers (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE CHECK (instr(name, '_') = 0),
        created_at TEXT NOT NULL
    );
    CREATE TABLE profiles (
        id INTEGER PRIMARY KEY,
        slug TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL,
        user_id INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
        token_hash TEXT NOT NULL UNIQUE,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    );
    CREATE INDEX profiles_user ON profiles(user_id, id);
    CREATE TABLE profile_servers (
        profile_id INTEGER NOT NULL REFERENCES profiles(id) ON DELETE CASCADE,
        server_id INTEGER NOT NULL REFERENCES servers(id) ON DELETE CASCADE,
        PRIMARY KEY (profile_id, server_id)
    ) WITHOUT ROWID;
    """,
    # 2: per-user, per-server credentials, envelope-encrypted (svcgate/vault.py).
    """
    CREATE TABLE credentials (
        id INTEGER PRIMARY KEY,
        user_id INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
        server TEXT NOT NULL,
        ciphertext BLOB NOT NULL,
        wrapped_dek BLOB NOT NULL,
        kek_version INTEGER NOT NULL,
        inject_header TEXT,
        inject_format TEXT,
        placeholder TEXT,
        allowed_hosts TEXT NOT NULL DEFAULT '[]',
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        UNIQUE (user_id, server)
    );
    CREATE INDEX credentials_kek ON credentials(kek_version);
    """,
    # 3: servers installed from the signed registry, and the registry's trusted state.
    """
    CREATE TABLE installed_servers (
        server_id INTEGER PRIMARY KEY REFERENCES servers(id) ON DELETE CASCADE,
        version TEXT NOT NULL,
        image TEXT NOT NULL,
        image_digest TEXT NOT NULL,
        manifest TEXT NOT NULL,
        runtime TEXT NOT NULL,
        index_version INTEGER NOT NULL,
        installed_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    );
    CREATE INDEX installed_servers_digest ON installed_servers(image_digest);
    CREATE TABLE registry_state (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        version INTEGER NOT NULL,
        sha256 TEXT NOT NULL,
        expires TEXT NOT NULL,
        accepted_at TEXT NOT NULL
    );
    """,
)
