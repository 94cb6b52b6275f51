"""Signed registry index, OCI image pulls, and the server installer."""
