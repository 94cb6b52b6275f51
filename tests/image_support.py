"""Real OCI image parts for tests: :mod:`devregistry.images` plus the test-only pieces.

The image builders (the minimal Python runtime layer copied from the host, app layers,
configs with computed ``diff_ids``, the deterministic tar helpers) live in
:mod:`devregistry.images`, which the demo's sample registry uses too; every name is
re-exported here so the tests keep importing them from ``image_support``. This module adds:

* :func:`python_runtime_layer` covering the test fixtures' imports as well (the rug-pull
  server), and :func:`python_server_image`, :func:`echo_image` and :func:`rugpull_image`
  built on it;
* :func:`tar_layer` (re-exported) for hand-made hostile layers (path traversal, device
  nodes, setuid files, symlink tricks) in the unpacker's tests;
* :func:`extract_for_test`, a trusting extractor for this module's own tests only; the
  product's safe unpacker lives elsewhere and must not be replaced by it.

Every layer is deterministic: building twice gives identical bytes and digests.
"""

from __future__ import annotations

import functools
import io
import tarfile
from pathlib import Path
from typing import Any

from devregistry import images as _images
from devregistry.images import (
    _LDD_RE,
    _PROBE,
    BASE_IMPORTS,
    DEFAULT_PATH,
    ECHO_SERVER,
    EXAMPLES,
    GROUP,
    HOST_PYTHON,
    LAYER_MEDIA_TYPE,
    LAYER_MEDIA_TYPE_TAR,
    NOTES_SERVER,
    OCI_ARCH,
    PASSWD,
    USR_MERGE_LINKS,
    ImageParts,
    _collect,
    _image_path,
    _info,
    _ldd,
    _relative,
    _stdlib_files,
    _tree_layer,
    app_layer,
    build_runtime_layer,
    diff_id,
    dir_info,
    file_info,
    image_from_layers,
    runtime_contents,
    script_imports,
    symlink_info,
    tar_layer,
)

REPO = Path(__file__).resolve().parents[1]
RUGPULL_SERVER = REPO / "tests/fixtures/rugpull_server.py"
# The sample servers and the test fixtures the runtime layer must serve.
RUNTIME_SCRIPTS: tuple[Path, ...] = (*_images.RUNTIME_SCRIPTS, RUGPULL_SERVER)

__all__ = [
    "BASE_IMPORTS",
    "DEFAULT_PATH",
    "ECHO_SERVER",
    "EXAMPLES",
    "GROUP",
    "HOST_PYTHON",
    "LAYER_MEDIA_TYPE",
    "LAYER_MEDIA_TYPE_TAR",
    "NOTES_SERVER",
    "OCI_ARCH",
    "PASSWD",
    "REPO",
    "RUGPULL_SERVER",
    "RUNTIME_SCRIPTS",
    "USR_MERGE_LINKS",
    "_LDD_RE",
    "_PROBE",
    "ImageParts",
    "_collect",
    "_image_path",
    "_info",
    "_ldd",
    "_relative",
    "_stdlib_files",
    "_tree_layer",
    "app_layer",
    "build_runtime_layer",
    "diff_id",
    "dir_info",
    "echo_image",
    "extract_for_test",
    "file_info",
    "image_from_layers",
    "notes_image",
    "python_runtime_layer",
    "python_server_image",
    "rugpull_image",
    "runtime_contents",
    "script_imports",
    "symlink_info",
    "tar_layer",
]


@functools.cache
def python_runtime_layer() -> tuple[str, bytes]:
    """The minimal Python runtime layer for the sample servers and the test fixtures (built
    once per process; ``python_runtime_layer.__wrapped__()`` builds it afresh)."""
    return build_runtime_layer(RUNTIME_SCRIPTS)


def python_server_image(script: bytes, **kw: Any) -> ImageParts:
    """:func:`devregistry.images.python_server_image` on this module's runtime layer."""
    kw.setdefault("runtime", python_runtime_layer())
    return _images.python_server_image(script, **kw)


def echo_image(**kw: Any) -> ImageParts:
    """The example echo server (tools echo, add, fetch) as an image."""
    return python_server_image(ECHO_SERVER.read_bytes(), name="echo_server.py", **kw)


def notes_image(**kw: Any) -> ImageParts:
    """The example notes server (tools add_note, list_notes, clear_notes) as an image."""
    return python_server_image(NOTES_SERVER.read_bytes(), name="notes_server.py", **kw)


def rugpull_image(**kw: Any) -> ImageParts:
    """The rug-pull server (tests/fixtures/rugpull_server.py) as an image."""
    return python_server_image(RUGPULL_SERVER.read_bytes(), name="rugpull_server.py", **kw)


def extract_for_test(parts: ImageParts, dest: Path) -> None:
    """Unpack ``parts`` into ``dest`` trusting the content (this module's own tests only).

    No whiteouts, no safety checks beyond tarfile's ``tar`` filter: hostile layers belong
    to the product's unpacker, not here.
    """
    dest.mkdir(parents=True, exist_ok=True)
    for _, data in parts.layers:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            tar.extractall(dest, filter="tar")
