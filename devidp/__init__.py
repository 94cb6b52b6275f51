"""devidp: a tiny, real OpenID Connect provider for svcgate's demo and tests.

Hand-written on purpose: it is a small test and demo provider, and authlib's server
pieces need a web framework and a storage layer. See :mod:`devidp.provider`.
The svcgate gateway never imports this package.
"""

from devidp.provider import DevIdP
from devidp.users import DEFAULT_ROLES_CLAIM, DEFAULT_USERS, User

__all__ = ["DEFAULT_ROLES_CLAIM", "DEFAULT_USERS", "DevIdP", "User"]
