"""Real OCI images built directly as tar layers from the host (there is no docker here).

The gateway installs MCP servers as OCI images and runs them with the unpacked image as the
sandbox's whole read-only root. The demo's sample registry and the tests need real images
holding a real runtime and a real MCP server, so this module builds them from the host:

* :func:`python_runtime_layer` is a minimal Python 3 runtime copied from Debian's
  ``/usr/bin/python3.11``: the interpreter, the shared libraries it and the included
  extension modules link against (found with ``ldd``, the dynamic loader at its real
  path), the standard-library modules the servers need, a two-line ``/etc/passwd``
  and ``/etc/group``, and the usr-merge links ``bin``, ``lib``, ``lib64`` and ``sbin``.
  The module list is computed, not hand-kept: a ``/usr/bin/python3 -I -S`` subprocess
  imports every module the server scripts import (read from their source with ``ast``;
  by default the sample servers in :data:`RUNTIME_SCRIPTS`), the ``site`` module, the whole
  ``encodings`` package, and exercises the lazy paths of a ``fetch`` (IDNA, the TLS context,
  proxy handling), then reports every stdlib file in its ``sys.modules``. No
  ``__pycache__`` is shipped: the image is read-only.
* :func:`app_layer` and :func:`python_server_image` add a server script on top;
  :func:`echo_image` and :func:`notes_image` are the two sample servers
  (``svcgate/examples``).
* :func:`tar_layer` writes entries exactly as given; :func:`file_info`, :func:`dir_info` and
  :func:`symlink_info` make normalised members.

Every layer is deterministic: sorted members, mtime 0, owner 0:0 with empty names, and a
gzip stream with a zero timestamp, so building twice gives identical bytes and digests.

Resource handling: everything is built in memory (the runtime layer is about 8 MB and is
built once per process and set of scripts, see :func:`python_runtime_layer`); the probe and
``ldd`` run as short subprocesses with timeouts and a minimal environment. Errors: a
missing host interpreter is :class:`RuntimeError`, a failing probe
:class:`subprocess.CalledProcessError` (or ``TimeoutExpired``), and a malformed image path
or tree :class:`ValueError`.
"""

from __future__ import annotations

import ast
import functools
import gzip as gzip_module
import hashlib
import io
import json
import os
import platform
import posixpath
import re
import stat
import subprocess
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import svcgate.examples

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
LAYER_MEDIA_TYPE_TAR = "application/vnd.oci.image.layer.v1.tar"

HOST_PYTHON = "/usr/bin/python3.11"  # Debian's; the venv's python may be a pyenv build
EXAMPLES = Path(svcgate.examples.__file__).resolve().parent
ECHO_SERVER = EXAMPLES / "echo_server.py"
NOTES_SERVER = EXAMPLES / "notes_server.py"
# The scripts whose imports the default runtime layer covers.
RUNTIME_SCRIPTS: tuple[Path, ...] = (ECHO_SERVER, NOTES_SERVER)

DEFAULT_PATH = "PATH=/usr/local/bin:/usr/bin:/bin"
# Top-level links of a usr-merged root; the real files live under usr/.
USR_MERGE_LINKS = {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64", "sbin": "usr/sbin"}
PASSWD = (
    b"root:x:0:0:root:/root:/usr/sbin/nologin\n"
    b"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
GROUP = b"root:x:0:\nnogroup:x:65534:\n"

# Imported in the probe besides what the server scripts import: the modules a full start
# (site) and an HTTP(S) fetch through a proxy need even when a script does not name them.
BASE_IMPORTS = ("site", "json", "ssl", "socket", "http.client", "urllib.request", "typing")

# Runs under ``python3 -I -S``: import, exercise lazy paths, report the stdlib files used.
_PROBE = r"""
import json, os, sys
import encodings
names = json.loads(sys.argv[1])
for entry in sorted(os.listdir(encodings.__path__[0])):
    if entry.endswith(".py") and entry != "__init__.py":
        names.append("encodings." + entry[:-3])
for name in names:
    try:
        __import__(name)
    except ImportError:
        if not name.startswith("encodings."):  # mbcs, oem... are Windows-only
            raise
import ssl, urllib.request
ssl.create_default_context()
"b\u00fccher.example".encode("idna")
urllib.request.build_opener(urllib.request.ProxyHandler({"http": "http://127.0.0.1:1"}))
urllib.request.getproxies()
json.loads(json.dumps({"a": [1, 2.5, None]}))
files = sorted({m.__file__ for m in list(sys.modules.values())
                if isinstance(getattr(m, "__file__", None), str)})
print(json.dumps({"stdlib": os.path.dirname(os.__file__), "files": files}))
"""

# OCI architecture names of the machines the host runtime can come from.
OCI_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}

_LDD_RE = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")


@dataclass(frozen=True)
class ImageParts:
    """An image's layers (bottom first) and its OCI image config."""

    layers: list[tuple[str, bytes]]  # (media type, layer bytes as stored in the registry)
    config: dict[str, Any]

    def config_bytes(self) -> bytes:
        """The config as a registry stores it (canonical JSON)."""
        return json.dumps(self.config, sort_keys=True, separators=(",", ":")).encode()


# ---------------------------------------------------------------------------------------------
# Tar members


def _info(name: str, kind: bytes, mode: int, size: int = 0, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = linkname
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def file_info(name: str, size: int, mode: int = 0o644) -> tarfile.TarInfo:
    """A normalised regular-file member (``name`` relative, like ``usr/bin/x``)."""
    return _info(name, tarfile.REGTYPE, mode, size)


def dir_info(name: str, mode: int = 0o755) -> tarfile.TarInfo:
    """A normalised directory member."""
    return _info(name, tarfile.DIRTYPE, mode)


def symlink_info(name: str, target: str) -> tarfile.TarInfo:
    """A normalised symlink member."""
    return _info(name, tarfile.SYMTYPE, 0o777, linkname=target)


def tar_layer(
    entries: Iterable[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]], *, gzip: bool = True
) -> bytes:
    """A layer holding ``entries`` exactly as given, in that order (nothing is normalised).

    For hand-made hostile layers: the caller controls names (``../x``, ``/etc/x``), types
    (devices, fifos, hard links), modes (setuid) and link targets. A plain ``TarInfo`` is a
    member without data; a regular file needs ``(info, data)`` with ``info.size`` set.
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info, data = entry if isinstance(entry, tuple) else (entry, None)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    raw = buffer.getvalue()
    return gzip_module.compress(raw, compresslevel=6, mtime=0) if gzip else raw


def _tree_layer(
    files: Mapping[str, tuple[bytes, int]],
    symlinks: Mapping[str, str],
    empty_dirs: Iterable[str] = (),
) -> bytes:
    """A deterministic gzip layer: ``files``, ``symlinks`` and ``empty_dirs`` (relative
    names) with every parent directory."""
    dirs: set[str] = set(empty_dirs)
    for name in [*files, *symlinks, *dirs]:
        parent = posixpath.dirname(name)
        while parent:
            dirs.add(parent)
            parent = posixpath.dirname(parent)
    clash = (dirs | set(files)) & set(symlinks) or dirs & set(files)
    if clash:
        raise ValueError(f"paths used both as file, directory or symlink: {sorted(clash)}")
    members: list[tuple[str, tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]] = []
    members += [(d, dir_info(d)) for d in dirs]
    members += [(n, symlink_info(n, t)) for n, t in symlinks.items()]
    for name, (data, mode) in files.items():
        members.append((name, (file_info(name, len(data), mode), data)))
    return tar_layer(entry for _, entry in sorted(members, key=lambda m: m[0]))


def _relative(path: str) -> str:
    """An absolute image path as a layer member name (``/app/x`` -> ``app/x``)."""
    norm = posixpath.normpath(path)
    if not path.startswith("/") or norm != path or norm == "/":
        raise ValueError(f"image paths must be absolute and normalised, got {path!r}")
    return norm.lstrip("/")


def app_layer(files: Mapping[str, bytes | tuple[bytes, int]]) -> tuple[str, bytes]:
    """A layer with ``files`` (absolute image path -> bytes or (bytes, mode)); parents 0755."""
    entries = {}
    for path, value in files.items():
        data, mode = value if isinstance(value, tuple) else (value, 0o644)
        entries[_relative(path)] = (data, mode)
    return LAYER_MEDIA_TYPE, _tree_layer(entries, {})


# ---------------------------------------------------------------------------------------------
# The Python runtime layer


def script_imports(source: bytes) -> list[str]:
    """Every module a script imports, at any level of its code (``from __future__`` too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return sorted(names)


def _stdlib_files(imports: list[str]) -> tuple[str, list[str]]:
    """(stdlib dir, stdlib files loaded) after the probe imports ``imports`` on the host."""
    out = subprocess.run(
        [HOST_PYTHON, "-I", "-S", "-c", _PROBE, json.dumps(imports)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={"LANG": "C.UTF-8", "PATH": "/usr/bin:/bin"},
    ).stdout
    found = json.loads(out)
    stdlib: str = found["stdlib"]
    # Only the stdlib proper: -I -S keeps site-packages and .pth files out, but be sure.
    outside = ("/site-packages/", "/dist-packages/")
    files = [
        f
        for f in found["files"]
        if f.startswith(stdlib + "/") and not any(part in f for part in outside)
    ]
    return stdlib, files


def _ldd(path: str) -> list[str]:
    """The shared libraries (and the loader) ``path`` needs, as the loader names them."""
    out = subprocess.run(
        ["ldd", path], capture_output=True, text=True, check=True, timeout=30, env={}
    ).stdout
    return sorted(set(_LDD_RE.findall(out)))


def _image_path(path: str) -> str:
    """A host path as the usr-merged image sees it (``/lib/x`` -> ``/usr/lib/x``)."""
    head, _, rest = path.lstrip("/").partition("/")
    if head in USR_MERGE_LINKS:
        return "/" + USR_MERGE_LINKS[head] + ("/" + rest if rest else "")
    return path


def _collect(path: str, files: dict[str, tuple[bytes, int]], links: dict[str, str]) -> None:
    """Add host ``path`` to the image, with every symlink met on the way to the real file.

    Absolute link targets are rewritten relative to the link: they resolve the same way in
    the image and do not point into the host when the extracted tree is inspected.
    """
    for _ in range(40):  # like the kernel's symlink limit
        path = _image_path(posixpath.normpath(path))
        parts = path.strip("/").split("/")
        current = ""
        for index, part in enumerate(parts):
            current = f"{current}/{part}"
            if os.path.islink(current):
                target = os.readlink(current)
                parent = posixpath.dirname(current)
                resolved = posixpath.normpath(posixpath.join(parent, target))
                if target.startswith("/"):
                    target = posixpath.relpath(_image_path(resolved), parent)
                links[current.lstrip("/")] = target
                path = "/".join([resolved, *parts[index + 1 :]])
                break
        else:
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{path} is not a regular file")
            mode = 0o755 if st.st_mode & 0o111 else 0o644
            files[path.lstrip("/")] = (Path(path).read_bytes(), mode)
            return
    raise ValueError(f"too many symlinks resolving {path}")


def runtime_contents(
    scripts: Iterable[Path] = RUNTIME_SCRIPTS,
) -> tuple[dict[str, tuple[bytes, int]], dict[str, str], list[str]]:
    """The runtime layer's (files, symlinks, directories) for servers like ``scripts``."""
    if not os.access(HOST_PYTHON, os.X_OK):
        raise RuntimeError(f"{HOST_PYTHON} is missing: the runtime layer is copied from it")
    imports = sorted(
        {
            *BASE_IMPORTS,
            *(name for script in scripts for name in script_imports(script.read_bytes())),
        }
    )
    stdlib, modules = _stdlib_files(imports)
    # The whole encodings package, and os.py: getpath's landmark for the stdlib directory.
    modules += [str(p) for p in Path(stdlib, "encodings").glob("*.py")]
    modules.append(f"{stdlib}/os.py")
    files: dict[str, tuple[bytes, int]] = {}
    links: dict[str, str] = {}
    elves = [HOST_PYTHON, *(m for m in modules if m.endswith(".so"))]
    libraries = {lib for elf in elves for lib in _ldd(elf)}
    for path in sorted({"/usr/bin/python3", *elves, *modules, *libraries}):
        _collect(path, files, links)
    links.update(USR_MERGE_LINKS)
    files["etc/passwd"] = (PASSWD, 0o644)
    files["etc/group"] = (GROUP, 0o644)
    # The usr-merge links must not dangle, and PATH names /usr/local/bin.
    return files, links, [*USR_MERGE_LINKS.values(), "usr/local/bin"]


def build_runtime_layer(scripts: Iterable[Path] = RUNTIME_SCRIPTS) -> tuple[str, bytes]:
    """The minimal Python runtime layer for servers like ``scripts``, built afresh."""
    files, links, dirs = runtime_contents(scripts)
    return LAYER_MEDIA_TYPE, _tree_layer(files, links, dirs)


@functools.cache
def python_runtime_layer(scripts: tuple[Path, ...] = RUNTIME_SCRIPTS) -> tuple[str, bytes]:
    """The minimal Python runtime layer (built once per process and set of scripts)."""
    return build_runtime_layer(scripts)


# ---------------------------------------------------------------------------------------------
# Images


def diff_id(layer: bytes) -> str:
    """The digest of a layer's uncompressed tar (what the config's ``diff_ids`` list)."""
    raw = gzip_module.decompress(layer) if layer[:2] == b"\x1f\x8b" else layer
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def image_from_layers(
    layers: list[tuple[str, bytes]],
    *,
    entrypoint: list[str] | None = None,
    cmd: list[str] | None = None,
    env: Iterable[str] = (DEFAULT_PATH,),
    workdir: str | None = None,
) -> ImageParts:
    """An image of ``layers`` with a matching OCI config (``diff_ids`` computed)."""
    inner: dict[str, Any] = {"Env": list(env)}
    if entrypoint is not None:
        inner["Entrypoint"] = entrypoint
    if cmd is not None:
        inner["Cmd"] = cmd
    if workdir is not None:
        inner["WorkingDir"] = workdir
    config = {
        "architecture": OCI_ARCH.get(platform.machine(), platform.machine()),
        "os": "linux",
        "config": inner,
        "rootfs": {"type": "layers", "diff_ids": [diff_id(data) for _, data in layers]},
    }
    return ImageParts(layers=list(layers), config=config)


def python_server_image(
    script: bytes,
    *,
    name: str = "server.py",
    entrypoint: bool = True,
    env: Mapping[str, str] | None = None,
    runtime: tuple[str, bytes] | None = None,
) -> ImageParts:
    """A runtime layer plus ``/app/<name>``; runs ``/usr/bin/python3 /app/<name>``.

    ``runtime`` is the bottom layer (default :func:`python_runtime_layer`, which covers the
    imports of :data:`RUNTIME_SCRIPTS`; pass a layer built for ``script`` when it imports
    more).
    """
    app = f"/app/{name}"
    return image_from_layers(
        [runtime or python_runtime_layer(), app_layer({app: script})],
        entrypoint=["/usr/bin/python3", app] if entrypoint else None,
        env=[DEFAULT_PATH, *(f"{k}={v}" for k, v in (env or {}).items())],
        workdir="/app",
    )


def echo_image(**kw: Any) -> ImageParts:
    """The example echo server (tools echo, add, fetch) as an image."""
    return python_server_image(ECHO_SERVER.read_bytes(), name=ECHO_SERVER.name, **kw)


def notes_image(**kw: Any) -> ImageParts:
    """The example notes server (tools add_note, list_notes, clear_notes) as an image."""
    return python_server_image(NOTES_SERVER.read_bytes(), name=NOTES_SERVER.name, **kw)
