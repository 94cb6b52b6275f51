"""devregistry: a local OCI registry and signed index with sample servers (demo and tests).

- :mod:`devregistry.images` builds real OCI images from the host (a minimal Python runtime
  layer plus app layers), deterministically;
- :mod:`devregistry.registry` runs Debian's ``docker-registry`` on loopback and pushes to it;
- :mod:`devregistry.publish` signs and writes a registry index and pins a server's tools;
- ``python -m devregistry --dir DIR`` puts them together for ``svcgate demo``: it serves the
  sample servers ``pyecho`` and ``notes`` from a signed index (see :mod:`devregistry.__main__`).

Development tooling only, like :mod:`devidp`: the svcgate gateway never imports this package
(``svcgate demo`` starts it as a separate program).
"""
