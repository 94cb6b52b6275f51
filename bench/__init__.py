"""svcgate's benchmarks: ``python -m bench`` (see docs/benchmarks.md)."""
