"""Named network namespaces made with pyroute2.

Create/list/remove namespaces, bring ``lo`` up, open listening sockets *inside* a namespace,
inspect links, and clean up what a crashed run left. Knows nothing of MCP, users or
profiles, and never imports :mod:`svcgate`.

``netns.core`` is the blocking core; ``netns.aio.Netns`` is the trio API over it.
"""

from netns.aio import Netns
from netns.core import (
    NETNS_RUN_DIR,
    InterfaceInfo,
    NamespaceExists,
    NamespaceInfo,
    NamespaceMetadata,
    NamespaceNotFound,
    NetnsError,
    cleanup_leftovers,
    create_namespace,
    inspect_namespace,
    list_namespaces,
    namespace_path,
    open_listener,
    remove_namespace,
    run_in_namespace,
)
from netns.names import InvalidNamespaceName, has_prefix, is_valid_name, validate_name

__all__ = [
    "NETNS_RUN_DIR",
    "InterfaceInfo",
    "InvalidNamespaceName",
    "NamespaceExists",
    "NamespaceInfo",
    "NamespaceMetadata",
    "NamespaceNotFound",
    "Netns",
    "NetnsError",
    "cleanup_leftovers",
    "create_namespace",
    "has_prefix",
    "inspect_namespace",
    "is_valid_name",
    "list_namespaces",
    "namespace_path",
    "open_listener",
    "remove_namespace",
    "run_in_namespace",
    "validate_name",
]
