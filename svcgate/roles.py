"""Role mapping from identity-provider claims (pure).

A user is ``admin`` iff a project-roles claim contains the configured admin role key. The
claim follows Zitadel's shapes, for any provider name ``<idp>``:

- ``urn:<idp>:iam:org:project:roles``
- ``urn:<idp>:iam:org:project:<project-id>:roles``

whose value is an object keyed by role (``{"svc-admin": {"<orgId>": "<domain>"}}``). A list of
role names is accepted too, for generic providers mapped to the same claim name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

ROLES_CLAIM = re.compile(r"^urn:[^:]+:iam:org:project:(?:[^:]+:)?roles$")

Role = Literal["admin", "user"]


def project_roles(claims: Mapping[str, Any]) -> set[str]:
    roles: set[str] = set()
    for key, value in claims.items():
        if not isinstance(key, str) or ROLES_CLAIM.fullmatch(key) is None:
            continue
        if isinstance(value, Mapping):
            roles.update(k for k in value if isinstance(k, str))
        elif isinstance(value, list):
            roles.update(v for v in value if isinstance(v, str))
    return roles


def role_for(claims: Mapping[str, Any], admin_role: str) -> Role:
    return "admin" if admin_role in project_roles(claims) else "user"
