"""Image root file systems: unpack OCI image layers into a content-addressed store.

An image-mode sandbox binds the top-level directories of a plain directory holding the
image's root file system (see :func:`sandbox.host.image_root_layout`). This module makes
those directories: :func:`unpack_layers` applies already-downloaded, already-digest-verified
layer blobs (files on disk) in order into an empty directory, and :class:`ImageStore` keeps
the results under ``<root>/rootfs/<hex>``, named by a ``sha256:`` digest the caller chooses
(typically the image's manifest or config digest; nothing here recomputes it).

The unpacker is hand-written on purpose: no maintained library unpacks OCI layers safely
into a plain directory without a container runtime. ``tarfile``'s extraction filters know
nothing of whiteouts, of symlinks left by a lower layer or of replacing entries, and the
tools that get this right (containerd, umoci) are Go programs tied to a runtime's storage
or one more privileged binary to ship. The rules it enforces:

* member names are relative and normalised; absolute names, ``..`` components, NUL bytes and
  over-long names refuse the image;
* nothing is ever written through a symlink: parent directories are walked one component at
  a time with ``O_NOFOLLOW`` relative to the destination's file descriptor, so a symlink left
  by any layer (``evil -> /etc`` then ``evil/passwd``) refuses the image; files are created
  with ``O_CREAT|O_EXCL|O_NOFOLLOW``; symlink entries are created as they are and never
  followed on the host (they are only resolved inside the sandbox);
* hard links must point at a regular file already unpacked, reached without symlinks;
* device nodes, FIFOs, sparse files and unknown entry types refuse the image;
* modes keep only the permission bits (setuid/setgid/sticky are stripped and counted) and
  group/others get the owner's read and execute bits, so the unprivileged sandbox uid can
  read what the image's owner could; tar uids/gids, xattrs and PAX extras are ignored, files
  belong to the calling user;
* OCI whiteouts (``.wh.<name>``, ``.wh..wh..opq``) remove lower-layer content only; entries
  of the whiteout's own layer are kept;
* caps on total file bytes, member count, name length, directory depth and the decompressed
  size of each layer stream (a gzip bomb stops at ``max_layer_bytes``).

Resources:
    Everything is synchronous (callers run it in a worker thread) and streams: a layer is read
    once through ``tarfile``'s stream mode, regular files are copied in 1 MiB chunks, and only
    a few file descriptors are open at a time (the destination's, the directory of the last
    entry, one or two more while an entry is placed). Per layer, the set of paths the layer
    touched is kept in memory (bounded by ``max_entries``).

    :meth:`ImageStore.add` unpacks into ``<root>/tmp/`` and renames the finished tree into
    ``<root>/rootfs/`` (atomic); :meth:`ImageStore.remove` renames it away first, so a crash
    never leaves a half-written or half-deleted rootfs under ``rootfs/``; ``tmp/`` leftovers
    are deleted when the store is next opened. The store does no locking: callers serialise
    work on one digest (a concurrent duplicate ``add`` only wastes work) and must not remove a
    rootfs a running sandbox still binds. Nothing is fsynced; after a power loss a recently
    added rootfs may be incomplete. The caller is expected to be root: a non-root caller could
    not add entries to a read-only directory of a lower layer.

Error handling:
    Every refusal and every I/O failure is an :class:`ImageError` whose message names the
    layer index and the entry (or the cap and its value). :meth:`ImageStore.add` removes its
    temporary directory on any failure, including exceptions raised by ``progress`` (which
    propagate unchanged).
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import re
import secrets
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

MIB = 1024 * 1024
# progress() is called whenever another PROGRESS_STEP bytes of file data have been written.
PROGRESS_STEP = 16 * MIB
_CHUNK = MIB

MEDIA_TAR = "application/vnd.oci.image.layer.v1.tar"
MEDIA_TAR_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_DOCKER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
MEDIA_DOCKER_TAR = "application/vnd.docker.image.rootfs.diff.tar"
# Plain and gzip types are interchangeable: the content is sniffed, because some registries
# and tools label plain tar as gzip (and the other way round).
LAYER_MEDIA_TYPES = frozenset({MEDIA_TAR, MEDIA_TAR_GZIP, MEDIA_DOCKER_GZIP, MEDIA_DOCKER_TAR})
_GZIP_MAGIC = b"\x1f\x8b"

WHITEOUT_PREFIX = ".wh."
WHITEOUT_OPAQUE = ".wh..wh..opq"
# Other ".wh..wh." names are aufs bookkeeping (.wh..wh.plnk, .wh..wh.aufs): ignored.
_WHITEOUT_META = ".wh..wh."

_DIGEST_RE = re.compile(r"sha256:([0-9a-f]{64})")
_HEX_RE = re.compile(r"[0-9a-f]{64}")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_ERRORS = (OSError, tarfile.TarError, EOFError, zlib.error)


class ImageError(Exception):
    """Unpacking or storing failed; ``str()`` is a one-line message naming layer and entry."""


@dataclass(frozen=True)
class UnpackLimits:
    """Caps on what an image may unpack to; exceeding one refuses the image."""

    # Total size of regular-file data across all layers.
    max_bytes: int = 4 * 1024**3
    # Tar members across all layers (whiteouts and skipped entries included).
    max_entries: int = 500_000
    # Bytes in one member name (and in a link target).
    max_path: int = 4096
    # Decompressed bytes read from one layer stream (gzip bomb guard).
    max_layer_bytes: int = 2 * 1024**3
    # Components in one member name; keeps trees shallow enough for the recursive
    # shutil.rmtree of Python 3.11 (and for every other tool that walks them).
    max_depth: int = 128


DEFAULT_LIMITS = UnpackLimits()


@dataclass(frozen=True)
class Layer:
    """One layer blob on disk and its media type (from the manifest)."""

    path: Path
    media_type: str


@dataclass(frozen=True)
class UnpackReport:
    """What :func:`unpack_layers` did."""

    entries: int
    bytes: int
    # Entries that lost setuid/setgid/sticky bits.
    stripped_modes: int


Progress = Callable[[int, int], None]


def unpack_layers(
    layers: Sequence[Layer],
    dest: Path,
    limits: UnpackLimits = DEFAULT_LIMITS,
    progress: Progress | None = None,
) -> UnpackReport:
    """Apply ``layers`` in order into the empty existing directory ``dest``.

    ``progress(layer_index, bytes_so_far)`` is called after every :data:`PROGRESS_STEP`
    bytes of file data and at the end of each layer; ``bytes_so_far`` counts regular-file
    bytes written across all layers (the quantity ``max_bytes`` caps). On failure ``dest``
    holds a partial tree; the caller removes it (:meth:`ImageStore.add` does).
    """
    try:
        root_fd = os.open(dest, _DIR_FLAGS)
    except OSError as exc:
        raise ImageError(f"cannot open destination {dest}: {exc.strerror}") from exc
    try:
        if os.listdir(root_fd):
            raise ImageError(f"destination {dest} is not empty")
        unpacker = _Unpacker(root_fd, limits, progress)
        try:
            for index, layer in enumerate(layers):
                unpacker.apply_layer(index, layer)
        finally:
            unpacker.forget_dir()
        return UnpackReport(unpacker.entries, unpacker.bytes, unpacker.stripped)
    finally:
        os.close(root_fd)


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class _LimitedReader:
    """Read-only file object that refuses to deliver more than ``limit`` bytes."""

    def __init__(self, source: _Readable, limit: int, index: int) -> None:
        self._source = source
        self._limit = limit
        self._index = index
        self._count = 0

    def read(self, size: int = -1, /) -> bytes:
        # Never ask the decompressor for more than one byte past the limit.
        room = self._limit - self._count + 1
        data = self._source.read(room if size < 0 else min(size, room))
        self._count += len(data)
        if self._count > self._limit:
            raise ImageError(
                f"layer {self._index}: decompressed layer exceeds max_layer_bytes={self._limit}"
            )
        return data

    def tell(self) -> int:
        return self._count

    def write(self, b: bytes, /) -> object:
        raise io.UnsupportedOperation("read-only layer stream")

    def seek(self, pos: int, /) -> object:
        raise io.UnsupportedOperation("layer streams cannot seek")

    def close(self) -> object:
        return None


def _open_layer(
    index: int, layer: Layer, limits: UnpackLimits, stack: ExitStack
) -> tarfile.TarFile:
    if layer.media_type not in LAYER_MEDIA_TYPES:
        raise ImageError(f"layer {index}: unsupported layer media type {layer.media_type!r}")
    try:
        raw: IO[bytes] = stack.enter_context(open(layer.path, "rb"))  # noqa: SIM115
        magic = raw.read(len(_GZIP_MAGIC))
        raw.seek(0)
        source: _Readable = raw
        if magic == _GZIP_MAGIC:
            source = gzip.GzipFile(fileobj=raw, mode="rb")
            stack.callback(source.close)
        reader = _LimitedReader(source, limits.max_layer_bytes, index)
        return stack.enter_context(
            tarfile.open(fileobj=reader, mode="r|", encoding="utf-8", errors="surrogateescape")
        )
    except ImageError:
        raise
    except _READ_ERRORS as exc:
        raise ImageError(f"layer {index}: cannot read {layer.path}: {exc}") from exc


@dataclass(frozen=True)
class _Blocked:
    """Why a directory walk stopped: at ``parts[:depth]``, which is ``kind``."""

    depth: int
    kind: str  # "missing", "symlink" or "notdir"


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _ns(mtime: float) -> int:
    return mtime * 1_000_000_000 if isinstance(mtime, int) else int(mtime * 1e9)


def _set_mtime(target: int | str, mtime: float, dir_fd: int | None = None) -> None:
    """Set atime and mtime; for a name, of the entry itself (never a symlink's target)."""
    try:
        ns = _ns(mtime)
        if isinstance(target, int):
            os.utime(target, ns=(ns, ns))
        else:
            os.utime(target, ns=(ns, ns), dir_fd=dir_fd, follow_symlinks=False)
    except (OverflowError, ValueError):
        pass  # an absurd timestamp is not worth refusing the image over
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EOVERFLOW, errno.EOPNOTSUPP):
            raise


class _Unpacker:
    """State of one :func:`unpack_layers` call."""

    def __init__(self, root_fd: int, limits: UnpackLimits, progress: Progress | None) -> None:
        self.root_fd = root_fd
        self.limits = limits
        self.progress = progress
        self.entries = 0
        self.bytes = 0
        self.stripped = 0
        self.layer = 0
        self.next_progress = PROGRESS_STEP
        # Paths the current layer created or wrote, and all their ancestors: whiteouts
        # remove everything else (lower-layer content) and keep these.
        self.touched: set[str] = set()
        # Directory entries of the current layer: mode and mtime, applied at the layer end.
        self.dirs: dict[str, tuple[int, float]] = {}
        # The directory the last walk ended in (members usually come grouped by directory).
        # Only a removal can change what a path inside dest resolves to, so every removal
        # forgets it.
        self._last_dir: tuple[tuple[str, ...], int] | None = None

    def forget_dir(self) -> None:
        if self._last_dir is not None:
            os.close(self._last_dir[1])
            self._last_dir = None

    def _remove(self, dir_fd: int, name: str, st: os.stat_result) -> None:
        """Remove ``name`` (a whole tree for a directory) without following symlinks."""
        self.forget_dir()
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)

    # -- layers -------------------------------------------------------------------------

    def apply_layer(self, index: int, layer: Layer) -> None:
        self.layer = index
        self.touched = set()
        self.dirs = {}
        self.forget_dir()
        with ExitStack() as stack:
            tar = _open_layer(index, layer, self.limits, stack)
            while True:
                try:
                    member = tar.next()
                except ImageError:
                    raise
                except _READ_ERRORS as exc:
                    raise ImageError(f"layer {index}: corrupt layer {layer.path}: {exc}") from exc
                if member is None:
                    break
                self.entries += 1
                if self.entries > self.limits.max_entries:
                    raise ImageError(
                        f"layer {index}: image has more than max_entries="
                        f"{self.limits.max_entries} entries"
                    )
                self._entry(tar, member)
                # Stream mode still records every member (not in the stubs); drop them to
                # keep memory flat on images with many entries.
                tar.members.clear()  # type: ignore[attr-defined]
        self._finish_dirs()
        if self.progress is not None:
            self.progress(index, self.bytes)

    def _finish_dirs(self) -> None:
        """Apply the layer's directory modes and mtimes (after their children exist)."""
        for rel, (mode, mtime) in self.dirs.items():
            try:
                fd = self._walk(rel.split("/"))
                if isinstance(fd, _Blocked):
                    continue  # replaced or removed later in the same layer
                try:
                    os.fchmod(fd, mode)
                    _set_mtime(fd, mtime)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise ImageError(f"layer {self.layer}: directory {rel!r}: {exc}") from exc

    # -- entries ------------------------------------------------------------------------

    def _refuse(self, name: str, why: str) -> ImageError:
        return ImageError(f"layer {self.layer}: entry {name!r}: {why}")

    def _entry(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        name = member.name
        try:
            parts = self._parts(name, name, "name")
            if not parts:
                return  # the root directory itself
            if parts[-1].startswith(WHITEOUT_PREFIX):
                self._whiteout(name, parts)
            elif member.issparse():
                raise self._refuse(name, "sparse files are not supported")
            elif member.isreg():
                self._regular(tar, member, name, parts)
            elif member.isdir():
                self._directory(member, name, parts)
            elif member.issym():
                self._symlink(member, name, parts)
            elif member.islnk():
                self._hardlink(member, name, parts)
            elif member.ischr() or member.isblk() or member.isfifo():
                raise self._refuse(name, "device nodes and FIFOs are not allowed in images")
            else:
                raise self._refuse(name, f"unsupported tar entry type {member.type!r}")
        except ImageError:
            raise
        except _READ_ERRORS as exc:
            raise self._refuse(name, str(exc)) from exc

    def _parts(self, name: str, entry: str, what: str) -> list[str]:
        """Split a member name (or hard link target) into checked, normalised components."""
        if "\x00" in name:
            raise self._refuse(entry, f"{what} contains a NUL byte")
        try:
            size = len(os.fsencode(name))
        except UnicodeError as exc:
            raise self._refuse(entry, f"{what} cannot be encoded") from exc
        if size > self.limits.max_path:
            raise self._refuse(entry, f"{what} longer than max_path={self.limits.max_path}")
        if name.startswith("/"):
            raise self._refuse(entry, f"absolute {what} {name!r}")
        parts = [part for part in name.split("/") if part not in ("", ".")]
        if ".." in parts:
            raise self._refuse(entry, f"{what} {name!r} has a '..' component")
        if len(parts) > self.limits.max_depth:
            raise self._refuse(entry, f"{what} deeper than max_depth={self.limits.max_depth}")
        return parts

    def _mode(self, mode: int) -> int:
        if mode & 0o7000:
            self.stripped += 1
        perm = mode & 0o777
        return perm | (perm & 0o500) >> 3 | (perm & 0o500) >> 6

    def _touch(self, parts: list[str]) -> None:
        for depth in range(1, len(parts) + 1):
            self.touched.add("/".join(parts[:depth]))

    def _walk(self, dir_parts: list[str], create: bool = False) -> int | _Blocked:
        """Open the directory ``dir_parts`` (relative to dest) without following symlinks.

        Missing components are created (mode 0755) when ``create``; otherwise, and for
        symlinks and non-directories, the walk stops and says where and why.
        """
        key = tuple(dir_parts)
        if self._last_dir is not None and self._last_dir[0] == key:
            return os.dup(self._last_dir[1])
        fd = os.dup(self.root_fd)
        try:
            for depth, part in enumerate(dir_parts, 1):
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                        raise
                    st = _lstat(fd, part)
                    if st is not None and stat.S_ISLNK(st.st_mode):
                        return _Blocked(depth, "symlink")
                    if st is not None and not stat.S_ISDIR(st.st_mode):
                        return _Blocked(depth, "notdir")
                    if st is not None or not create:
                        return _Blocked(depth, "missing")
                    os.mkdir(part, 0o700, dir_fd=fd)
                    self._touch(dir_parts[:depth])
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    os.fchmod(child, 0o755)
                os.close(fd)
                fd = child
            result, fd = fd, -1
            self.forget_dir()
            self._last_dir = (key, os.dup(result))
            return result
        finally:
            if fd >= 0:
                os.close(fd)

    def _parent(self, entry: str, parts: list[str], create: bool) -> int | None:
        """Open the parent directory of ``parts``; refuse symlinks (and, when creating,
        non-directories) on the way; None when it does not exist."""
        fd = self._walk(parts[:-1], create)
        if not isinstance(fd, _Blocked):
            return fd
        where = "/".join(parts[: fd.depth])
        if fd.kind == "symlink":
            raise self._refuse(entry, f"path goes through the symlink {where!r}")
        if create:
            raise self._refuse(entry, f"parent {where!r} is not a directory")
        return None

    def _place(self, entry: str, parts: list[str]) -> int:
        """Open the parent of a new entry (creating it) and clear the entry's name."""
        parent = self._parent(entry, parts, create=True)
        assert parent is not None  # create=True never returns None
        try:
            st = _lstat(parent, parts[-1])
            if st is not None:
                self._remove(parent, parts[-1], st)
        except BaseException:
            os.close(parent)
            raise
        return parent

    def _regular(
        self, tar: tarfile.TarFile, member: tarfile.TarInfo, name: str, parts: list[str]
    ) -> None:
        if self.bytes + member.size > self.limits.max_bytes:
            raise self._refuse(name, f"image data exceeds max_bytes={self.limits.max_bytes}")
        source = tar.extractfile(member)
        assert source is not None  # always a file object for regular members
        parent = self._place(name, parts)
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, 0o600, dir_fd=parent)
        finally:
            os.close(parent)
        try:
            while chunk := source.read(_CHUNK):
                _write_all(fd, chunk)
                self.bytes += len(chunk)
                if self.progress is not None and self.bytes >= self.next_progress:
                    self.next_progress = (self.bytes // PROGRESS_STEP + 1) * PROGRESS_STEP
                    self.progress(self.layer, self.bytes)
            os.fchmod(fd, self._mode(member.mode))
            _set_mtime(fd, member.mtime)
        finally:
            os.close(fd)
        self._touch(parts)

    def _directory(self, member: tarfile.TarInfo, name: str, parts: list[str]) -> None:
        parent = self._parent(name, parts, create=True)
        assert parent is not None
        try:
            st = _lstat(parent, parts[-1])
            if st is None or not stat.S_ISDIR(st.st_mode):
                if st is not None:
                    self._remove(parent, parts[-1], st)
                os.mkdir(parts[-1], 0o700, dir_fd=parent)
        finally:
            os.close(parent)
        self.dirs["/".join(parts)] = (self._mode(member.mode), member.mtime)
        self._touch(parts)

    def _symlink(self, member: tarfile.TarInfo, name: str, parts: list[str]) -> None:
        target = member.linkname
        if "\x00" in target:
            raise self._refuse(name, "symlink target contains a NUL byte")
        if len(os.fsencode(target)) > self.limits.max_path:
            raise self._refuse(name, f"symlink target longer than max_path={self.limits.max_path}")
        parent = self._place(name, parts)
        try:
            os.symlink(target, parts[-1], dir_fd=parent)
            _set_mtime(parts[-1], member.mtime, dir_fd=parent)
        finally:
            os.close(parent)
        self._touch(parts)

    def _hardlink(self, member: tarfile.TarInfo, name: str, parts: list[str]) -> None:
        source = self._parts(member.linkname, name, "hard link target")
        if not source:
            raise self._refuse(name, "hard link to the root directory")
        source_parent = self._parent(name, source, create=False)
        if source_parent is None:
            raise self._refuse(name, f"hard link target {member.linkname!r} does not exist")
        try:
            st = _lstat(source_parent, source[-1])
            if st is None:
                raise self._refuse(name, f"hard link target {member.linkname!r} does not exist")
            if not stat.S_ISREG(st.st_mode):
                raise self._refuse(
                    name, f"hard link target {member.linkname!r} is not a regular file"
                )
            if source == parts:
                return  # a link to itself: already there
            parent = self._place(name, parts)
            try:
                os.link(
                    source[-1],
                    parts[-1],
                    src_dir_fd=source_parent,
                    dst_dir_fd=parent,
                    follow_symlinks=False,
                )
            finally:
                os.close(parent)
        finally:
            os.close(source_parent)
        self._touch(parts)

    # -- whiteouts ------------------------------------------------------------------------

    def _whiteout(self, name: str, parts: list[str]) -> None:
        base = parts[-1]
        if base == WHITEOUT_OPAQUE:
            self._prune_below(name, parts[:-1])
            return
        if base.startswith(_WHITEOUT_META):
            return
        hidden = base[len(WHITEOUT_PREFIX) :]
        if hidden in ("", ".", ".."):
            raise self._refuse(name, "whiteout without a valid name")
        target = [*parts[:-1], hidden]
        parent = self._parent(name, target, create=False)
        if parent is None:
            return
        try:
            st = _lstat(parent, hidden)
            if st is None:
                return
            if "/".join(target) not in self.touched:
                self._remove(parent, hidden, st)
                return
            if not stat.S_ISDIR(st.st_mode):
                return  # created by this very layer: a whiteout only hides lower layers
        finally:
            os.close(parent)
        self._prune_below(name, target)

    def _prune_below(self, name: str, dir_parts: list[str]) -> None:
        """Remove lower-layer content below ``dir_parts``; keep what this layer touched."""
        pending = [dir_parts]
        while pending:
            current = pending.pop()
            fd = self._walk(current)
            if isinstance(fd, _Blocked):
                if fd.kind == "symlink":
                    where = "/".join(current[: fd.depth])
                    raise self._refuse(name, f"path goes through the symlink {where!r}")
                continue
            try:
                for child in os.listdir(fd):
                    st = _lstat(fd, child)
                    if st is None:
                        continue
                    rel = "/".join([*current, child])
                    if rel not in self.touched:
                        self._remove(fd, child, st)
                    elif stat.S_ISDIR(st.st_mode):
                        pending.append([*current, child])
            finally:
                os.close(fd)


def _digest_hex(digest: str) -> str:
    match = _DIGEST_RE.fullmatch(digest)
    if match is None:
        raise ImageError(f"invalid image digest {digest!r} (want sha256:<64 lowercase hex>)")
    return match.group(1)


class ImageStore:
    """Unpacked image root file systems under ``root/rootfs/<hex>``, keyed by digest."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._rootfs = root / "rootfs"
        self._tmp = root / "tmp"
        try:
            for path, mode in ((root, 0o755), (self._rootfs, 0o755), (self._tmp, 0o700)):
                if not path.is_dir():
                    path.mkdir(parents=True)
                    path.chmod(mode)  # not subject to the umask
            for entry in os.scandir(self._tmp):  # leftovers of a crashed add or remove
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
        except OSError as exc:
            raise ImageError(f"cannot prepare image store {root}: {exc}") from exc

    def path(self, digest: str) -> Path:
        """Where the rootfs of ``digest`` lives (whether or not it exists)."""
        return self._rootfs / _digest_hex(digest)

    def has(self, digest: str) -> bool:
        try:
            return stat.S_ISDIR(os.lstat(self.path(digest)).st_mode)
        except FileNotFoundError:
            return False

    def add(
        self,
        digest: str,
        layers: Sequence[Layer],
        limits: UnpackLimits = DEFAULT_LIMITS,
        progress: Progress | None = None,
    ) -> Path:
        """Unpack ``layers`` as the rootfs of ``digest`` unless it is already stored."""
        final = self.path(digest)
        if self.has(digest):
            return final
        try:
            work = Path(tempfile.mkdtemp(prefix=f"add-{final.name[:12]}-", dir=self._tmp))
        except OSError as exc:
            raise ImageError(f"cannot create a work directory in {self._tmp}: {exc}") from exc
        done = False
        try:
            unpack_layers(layers, work, limits, progress)
            os.chmod(work, 0o755)  # noqa: S103 - the sandbox uid must traverse it
            try:
                os.rename(work, final)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY) or not self.has(digest):
                    raise
                # A concurrent add of the same digest won; ours is removed below.
            else:
                done = True
        except OSError as exc:
            raise ImageError(f"cannot store image {digest}: {exc}") from exc
        finally:
            if not done:
                shutil.rmtree(work, ignore_errors=True)
        return final

    def digests(self) -> set[str]:
        """Digests of every stored rootfs."""
        try:
            return {
                f"sha256:{entry.name}"
                for entry in os.scandir(self._rootfs)
                if _HEX_RE.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False)
            }
        except OSError as exc:
            raise ImageError(f"cannot list {self._rootfs}: {exc}") from exc

    def remove(self, digest: str) -> bool:
        """Delete the rootfs of ``digest``; False when it was not stored."""
        final = self.path(digest)
        grave = self._tmp / f"rm-{final.name[:12]}-{secrets.token_hex(8)}"
        try:
            os.rename(final, grave)  # disappears from rootfs/ atomically
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise ImageError(f"cannot remove image {digest}: {exc}") from exc
        try:
            shutil.rmtree(grave)
        except OSError as exc:
            raise ImageError(
                f"image {digest} removed from the store, but deleting {grave} failed: {exc} "
                "(retried when the store is next opened)"
            ) from exc
        return True

    def gc(self, keep: Iterable[str]) -> list[str]:
        """Remove every stored rootfs whose digest is not in ``keep``; return those removed.

        Every digest in ``keep`` is validated first, so a malformed one fails closed instead
        of silently failing to protect the rootfs it meant.
        """
        wanted = {f"sha256:{_digest_hex(digest)}" for digest in keep}
        return [d for d in sorted(self.digests() - wanted) if self.remove(d)]
