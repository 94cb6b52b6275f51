"""Demo users of the development identity provider."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Zitadel-style project roles claim: ``{"role": {"<org id>": "<org domain>"}}``.
DEFAULT_ROLES_CLAIM = "urn:zitadel:iam:org:project:roles"
ROLE_ORG_ID = "270000000000000001"
ROLE_ORG_DOMAIN = "devidp.localhost"

_USER_KEYS = ("username", "password", "sub", "email", "name")


@dataclass(frozen=True)
class User:
    username: str
    password: str
    sub: str
    email: str
    name: str
    roles: tuple[str, ...] = ()

    def roles_claim_value(self) -> dict[str, dict[str, str]]:
        return {role: {ROLE_ORG_ID: ROLE_ORG_DOMAIN} for role in self.roles}

    def public_dict(self) -> dict[str, Any]:
        """Everything except the password (for the test hooks' answers)."""
        return {
            "username": self.username,
            "sub": self.sub,
            "email": self.email,
            "name": self.name,
            "roles": list(self.roles),
        }


DEFAULT_USERS: tuple[User, ...] = (
    User("alice", "alice", "user-alice", "alice@example.test", "Alice Admin", ("svc-admin",)),
    User("bob", "bob", "user-bob", "bob@example.test", "Bob User"),
    User("carol", "carol", "user-carol", "carol@example.test", "Carol User"),
)


def parse_roles(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(r, str) and r for r in value):
        raise ValueError("roles must be a list of non-empty strings")
    return tuple(value)


def users_from_json(data: object) -> list[User]:
    """Users from a decoded JSON list of ``{username, password, sub, email, name, roles}``."""
    if not isinstance(data, list) or not data:
        raise ValueError("users must be a non-empty JSON list of objects")
    users: list[User] = []
    for index, item in enumerate(data):
        if not isinstance(item, dict):
            raise ValueError(f"user #{index} is not an object")
        fields: dict[str, str] = {}
        for key in _USER_KEYS:
            value = item.get(key)
            if not isinstance(value, str) or not value:
                raise ValueError(f"user #{index}: {key!r} must be a non-empty string")
            fields[key] = value
        try:
            roles = parse_roles(item.get("roles", []))
        except ValueError as exc:
            raise ValueError(f"user #{index}: {exc}") from None
        users.append(User(roles=roles, **fields))
    check_unique(users)
    return users


def check_unique(users: Iterable[User]) -> None:
    names: set[str] = set()
    subs: set[str] = set()
    for user in users:
        if user.username in names or user.sub in subs:
            raise ValueError(f"duplicate username or sub: {user.username!r} / {user.sub!r}")
        names.add(user.username)
        subs.add(user.sub)


def load_users_file(path: str | Path) -> list[User]:
    with open(path, encoding="utf-8") as fh:
        return users_from_json(json.load(fh))
