"""The JSON control plane under ``/api/`` (quart-trio)."""
