"""svcgate: a self-hosted gateway that bundles sandboxed MCP tool servers into per-user profiles."""

__version__ = "0.1.0"
