"""The OCI layer unpacker and the image rootfs store (layers built in memory, no network)."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import stat
import tarfile
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sandbox import images
from sandbox.images import (
    MEDIA_DOCKER_GZIP,
    MEDIA_DOCKER_TAR,
    MEDIA_TAR,
    MEDIA_TAR_GZIP,
    ImageError,
    ImageStore,
    Layer,
    UnpackLimits,
    unpack_layers,
)

MTIME = 1_600_000_000
Entry = tuple[tarfile.TarInfo, bytes | None]


# -- building layers ---------------------------------------------------------------------


def file(name: str, data: bytes = b"data", mode: int = 0o644, mtime: int = MTIME) -> Entry:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, mtime
    return info, data


def dir_(name: str, mode: int = 0o755, mtime: int = MTIME) -> Entry:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, mtime
    return info, None


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE, mtime: int = MTIME) -> Entry:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.mtime = kind, target, 0o777, mtime
    return info, None


def hard(name: str, target: str) -> Entry:
    return link(name, target, tarfile.LNKTYPE)


def node(name: str, kind: bytes) -> Entry:
    info = tarfile.TarInfo(name)
    info.type, info.mode = kind, 0o644
    return info, None


def tar_bytes(entries: list[Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


class Layers:
    """Writes layer blobs into a directory; ``dest`` is a fresh empty unpack target."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.count = 0
        self.dest = base / "dest"
        self.dest.mkdir()

    def blob(self, content: bytes, media_type: str) -> Layer:
        self.count += 1
        path = self.base / f"layer{self.count}"
        path.write_bytes(content)
        return Layer(path, media_type)

    def __call__(self, *entries: Entry, gz: bool = True, media_type: str | None = None) -> Layer:
        data = tar_bytes(list(entries))
        if gz:
            data = gzip.compress(data)
        return self.blob(data, media_type or (MEDIA_TAR_GZIP if gz else MEDIA_TAR))


@pytest.fixture
def mk(tmp_path: Path) -> Layers:
    return Layers(tmp_path)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to dest that no layer may touch."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "passwd").write_text("root:x:0:0\n")
    return path


def tree(root: Path) -> dict[str, tuple[str, ...]]:
    """Everything below ``root`` without following symlinks: type, mode and content."""
    result: dict[str, tuple[str, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st_ = os.lstat(path)
            if stat.S_ISLNK(st_.st_mode):
                result[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st_.st_mode):
                result[rel] = ("dir", oct(st_.st_mode))
            else:
                content = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                result[rel] = ("file", oct(st_.st_mode), content)
    return result


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# -- normal images -----------------------------------------------------------------------


def test_multi_layer_image(mk: Layers) -> None:
    base = mk(
        dir_("usr"),
        dir_("usr/bin"),
        dir_("opt", 0o750, mtime=1000),
        file("usr/bin/tool", b"#!/bin/sh\n", 0o755, mtime=2000),
        file("etc/os-release", b"ID=test\n"),  # parent created implicitly
        link("bin", "usr/bin", mtime=3000),
        hard("usr/bin/tool2", "usr/bin/tool"),
        link("etc/abs", "/does/not/exist"),  # any target: only resolved in the sandbox
    )
    top = mk(
        file("usr/bin/tool", b"new version\n", 0o750),
        dir_("usr/share", 0o700),
        file("./usr/share/doc", b"doc"),
        hard("usr/share/lowerlink", "usr/bin/tool2"),  # a file of a lower layer
    )
    progress: list[tuple[int, int]] = []
    report = unpack_layers([base, top], mk.dest, progress=lambda i, n: progress.append((i, n)))
    dest = mk.dest
    assert (dest / "usr/bin/tool").read_bytes() == b"new version\n"
    assert mode(dest / "usr/bin/tool") == 0o755
    # The hard link of the first layer still points at the replaced (old) file.
    assert (dest / "usr/bin/tool2").read_bytes() == b"#!/bin/sh\n"
    assert (dest / "usr/share/lowerlink").stat().st_ino == (dest / "usr/bin/tool2").stat().st_ino
    assert (dest / "usr/bin/tool2").stat().st_nlink == 2
    assert os.readlink(dest / "bin") == "usr/bin"
    assert os.readlink(dest / "etc/abs") == "/does/not/exist"
    assert (dest / "etc/os-release").read_text() == "ID=test\n"
    assert mode(dest / "etc") == 0o755
    assert mode(dest / "usr/share") == 0o755  # 0700 + r-x for group and others
    assert os.lstat(dest / "opt").st_mtime == 1000
    assert mode(dest / "opt") == 0o755
    assert os.lstat(dest / "bin").st_mtime == 3000
    assert os.lstat(dest / "etc/os-release").st_mtime == MTIME
    assert os.lstat(dest / "usr/bin/tool").st_mtime == MTIME
    assert all(os.lstat(p).st_uid == os.getuid() for p in dest.rglob("*"))
    assert report.entries == 12
    assert report.bytes == len(b"#!/bin/sh\n") + len(b"ID=test\n") + len(b"new version\n") + 3
    assert report.stripped_modes == 0
    assert progress == [(0, 18), (1, report.bytes)]


def test_progress_steps(mk: Layers, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "PROGRESS_STEP", 1000)
    layers = [mk(file("a", b"x" * 2500), file("b", b"x" * 100)), mk(file("c", b"x" * 900))]
    calls: list[tuple[int, int]] = []
    unpack_layers(layers, mk.dest, progress=lambda i, n: calls.append((i, n)))
    assert calls == [(0, 2500), (0, 2600), (1, 3500), (1, 3500)]


def test_dir_mtime_and_mode_applied_after_children(mk: Layers) -> None:
    layer = mk(dir_("ro", 0o555, mtime=1234), file("ro/a"), dir_("ro/sub"), file("ro/sub/b"))
    unpack_layers([layer], mk.dest)
    assert mode(mk.dest / "ro") == 0o555
    assert os.lstat(mk.dest / "ro").st_mtime == 1234
    assert (mk.dest / "ro/sub/b").read_bytes() == b"data"


def test_modes_are_stripped_and_widened(mk: Layers) -> None:
    layer = mk(
        file("suid", mode=0o4755),
        file("sgid", mode=0o2711),
        dir_("sticky", 0o1777),
        file("private", mode=0o600),
        file("owner_exec", mode=0o700),
        file("group_only", mode=0o640),
        file("write_exec", mode=0o311),
    )
    report = unpack_layers([layer], mk.dest)
    assert report.stripped_modes == 3
    assert mode(mk.dest / "suid") == 0o755
    assert mode(mk.dest / "sgid") == 0o755
    assert mode(mk.dest / "sticky") == 0o777
    assert mode(mk.dest / "private") == 0o644
    assert mode(mk.dest / "owner_exec") == 0o755
    assert mode(mk.dest / "group_only") == 0o644
    assert mode(mk.dest / "write_exec") == 0o311


@pytest.mark.parametrize(
    "media_type", [MEDIA_TAR, MEDIA_TAR_GZIP, MEDIA_DOCKER_GZIP, MEDIA_DOCKER_TAR]
)
@pytest.mark.parametrize("gz", [True, False])
def test_compression_is_sniffed_not_trusted(mk: Layers, media_type: str, gz: bool) -> None:
    layer = mk(file("f", b"hello"), gz=gz, media_type=media_type)
    unpack_layers([layer], mk.dest)
    assert (mk.dest / "f").read_bytes() == b"hello"


def test_multi_member_gzip(mk: Layers) -> None:
    data = tar_bytes([file("f", b"x" * 5000)])
    layer = mk.blob(gzip.compress(data[:3000]) + gzip.compress(data[3000:]), MEDIA_TAR_GZIP)
    unpack_layers([layer], mk.dest)
    assert (mk.dest / "f").read_bytes() == b"x" * 5000


def test_root_entries_skipped(mk: Layers) -> None:
    report = unpack_layers([mk(dir_("."), dir_("./"), file("./a"))], mk.dest)
    assert sorted(os.listdir(mk.dest)) == ["a"]
    assert report.entries == 3


def test_non_empty_dest_refused(mk: Layers) -> None:
    (mk.dest / "x").touch()
    with pytest.raises(ImageError, match="not empty"):
        unpack_layers([mk(file("a"))], mk.dest)


def test_missing_layer_file(mk: Layers, tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="layer 0: cannot read"):
        unpack_layers([Layer(tmp_path / "nope", MEDIA_TAR)], mk.dest)


# -- replacing entries -------------------------------------------------------------------


def test_replacements(mk: Layers, outside: Path) -> None:
    before = tree(outside)
    lower = mk(
        file("file_over_file", b"old"),
        dir_("dir_over_dir"),
        file("dir_over_dir/kept"),
        file("dir_over_file"),
        dir_("file_over_dir"),
        file("file_over_dir/child"),
        link("file_over_dir/escape", str(outside)),
        dir_("link_over_dir"),
        link("link_over_dir/escape", "../../outside"),
        link("dir_over_link", str(outside)),
    )
    upper = mk(
        file("file_over_file", b"new"),
        dir_("dir_over_dir", 0o700),
        dir_("dir_over_file"),
        file("file_over_dir", b"now a file"),
        link("link_over_dir", "elsewhere"),
        dir_("dir_over_link"),
        file("dir_over_link/inside"),
    )
    unpack_layers([lower, upper], mk.dest)
    dest = mk.dest
    assert (dest / "file_over_file").read_bytes() == b"new"
    assert (dest / "dir_over_dir/kept").exists()
    assert mode(dest / "dir_over_dir") == 0o755
    assert (dest / "dir_over_file").is_dir()
    assert (dest / "file_over_dir").read_bytes() == b"now a file"
    assert os.readlink(dest / "link_over_dir") == "elsewhere"
    assert (dest / "dir_over_link").is_dir()
    assert not (dest / "dir_over_link").is_symlink()
    assert (dest / "dir_over_link/inside").exists()
    assert tree(outside) == before


# -- whiteouts ---------------------------------------------------------------------------


def test_whiteout_file_and_tree(mk: Layers) -> None:
    lower = mk(file("a/x"), file("a/y"), file("d/sub/deep/f"), link("d/link", "/etc"))
    upper = mk(file("a/.wh.x"), file(".wh.d"), file(".wh.never_existed"), file("b/.wh.z"))
    unpack_layers([lower, upper], mk.dest)
    assert tree(mk.dest).keys() == {"a", "a/y"}


@pytest.mark.parametrize("marker_first", [True, False])
def test_opaque_directory_keeps_same_layer_entries(mk: Layers, marker_first: bool) -> None:
    lower = mk(file("o/old"), file("o/sub/old2"), file("o/sub/keep_name"), file("other"))
    same_layer = [file("o/new"), file("o/sub/new2"), file("o/sub/keep_name", b"upper")]
    marker = [file("o/.wh..wh..opq")]
    upper = mk(*(marker + same_layer if marker_first else same_layer + marker))
    unpack_layers([lower, upper], mk.dest)
    assert tree(mk.dest).keys() == {"o", "o/new", "o/sub", "o/sub/new2", "o/sub/keep_name", "other"}
    assert (mk.dest / "o/sub/keep_name").read_bytes() == b"upper"


def test_root_opaque_marker(mk: Layers) -> None:
    lower = mk(file("a"), file("d/b"))
    upper = mk(file(".wh..wh..opq"), file("c"))
    unpack_layers([lower, upper], mk.dest)
    assert tree(mk.dest).keys() == {"c"}


def test_whiteout_only_hides_lower_layers(mk: Layers) -> None:
    lower = mk(file("d/lower"))
    upper = mk(file("same"), file(".wh.same"), file("d/upper"), file(".wh.d"))
    unpack_layers([lower, upper], mk.dest)
    # "same" and "d/upper" come from the whiteout's own layer; "d/lower" is hidden.
    assert tree(mk.dest).keys() == {"same", "d", "d/upper"}


def test_aufs_metadata_ignored(mk: Layers) -> None:
    unpack_layers([mk(file("a"), file(".wh..wh.plnk"), dir_(".wh..wh.aufs"))], mk.dest)
    assert os.listdir(mk.dest) == ["a"]


def test_whiteout_through_symlink_refused(mk: Layers, outside: Path) -> None:
    lower = mk(link("evil", str(outside)))
    upper = mk(file("evil/.wh.passwd"))
    with pytest.raises(ImageError, match=r"layer 1: entry 'evil/\.wh\.passwd'.*symlink 'evil'"):
        unpack_layers([lower, upper], mk.dest)
    assert (outside / "passwd").exists()


def test_opaque_through_symlink_refused(mk: Layers, outside: Path) -> None:
    lower = mk(link("evil", str(outside)))
    upper = mk(file("evil/.wh..wh..opq"))
    with pytest.raises(ImageError, match="symlink 'evil'"):
        unpack_layers([lower, upper], mk.dest)
    assert (outside / "passwd").exists()


def test_whiteout_of_dotdot_refused(mk: Layers) -> None:
    with pytest.raises(ImageError, match="whiteout without a valid name"):
        unpack_layers([mk(file("a/.wh..."))], mk.dest)


# -- refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (file("/etc/passwd"), "absolute name"),
        (file("../escape"), "'..' component"),
        (file("a/../../escape"), "'..' component"),
        (file("a/.."), "'..' component"),
        (dir_("/etc"), "absolute name"),
        (hard("h", "/etc/passwd"), "absolute hard link target"),
        (hard("h", "../outside/passwd"), "hard link target '../outside/passwd' has a '..'"),
        (hard("h", "missing"), "does not exist"),
        (hard("h", "missing_dir/f"), "does not exist"),
        (node("dev/null", tarfile.CHRTYPE), "device nodes and FIFOs"),
        (node("dev/sda", tarfile.BLKTYPE), "device nodes and FIFOs"),
        (node("pipe", tarfile.FIFOTYPE), "device nodes and FIFOs"),
        (node("odd", b"Z"), "unsupported tar entry type"),
    ],
)
def test_refused_entries(mk: Layers, outside: Path, entry: Entry, message: str) -> None:
    before = tree(outside)
    name = entry[0].name
    with pytest.raises(ImageError, match="layer 0: entry ") as excinfo:
        unpack_layers([mk(entry)], mk.dest)
    assert message in str(excinfo.value)
    assert repr(name) in str(excinfo.value)
    assert "\n" not in str(excinfo.value)
    assert tree(outside) == before


def test_nul_in_name_refused(mk: Layers) -> None:
    info, data = file("a")
    info.pax_headers = {"path": "a\x00b"}
    with pytest.raises(ImageError, match="NUL byte"):
        unpack_layers([mk((info, data))], mk.dest)


def test_sparse_refused(mk: Layers) -> None:
    info = tarfile.TarInfo("sparse")
    info.type = tarfile.GNUTYPE_SPARSE
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(info)
    with pytest.raises(ImageError, match="sparse files are not supported"):
        unpack_layers([mk.blob(buf.getvalue(), MEDIA_TAR)], mk.dest)


def test_symlink_parent_across_layers(mk: Layers, outside: Path) -> None:
    before = tree(outside)
    lower = mk(link("evil", str(outside)))
    upper = mk(file("evil/passwd", b"pwned"))
    with pytest.raises(ImageError, match=r"layer 1: entry 'evil/passwd'.*symlink 'evil'"):
        unpack_layers([lower, upper], mk.dest)
    assert tree(outside) == before


@pytest.mark.parametrize(
    "entries",
    [
        [link("evil", "../outside"), file("evil/passwd", b"pwned")],
        [dir_("d"), link("d/up", "../.."), file("d/up/outside/new")],
        [link("evil", "../outside"), dir_("evil/sub")],
        [link("evil", "../outside"), link("evil/l", "x")],
        [link("evil", "../outside"), file("f"), hard("evil/h", "f")],
        [link("evil", "../outside"), file("evil/deeper/f")],
    ],
)
def test_symlink_parent_within_layer(mk: Layers, outside: Path, entries: list[Entry]) -> None:
    before = tree(outside)
    with pytest.raises(ImageError, match="goes through the symlink"):
        unpack_layers([mk(*entries)], mk.dest)
    assert tree(outside) == before


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([link("lnk", "../outside"), hard("h", "lnk/passwd")], "symlink 'lnk'"),
        ([link("lnk", "../outside/passwd"), hard("h", "lnk")], "not a regular file"),
        ([dir_("d"), hard("h", "d")], "not a regular file"),
        ([hard("h", ".")], "hard link to the root directory"),
    ],
)
def test_bad_hard_links(mk: Layers, outside: Path, entries: list[Entry], message: str) -> None:
    with pytest.raises(ImageError, match=message):
        unpack_layers([mk(*entries)], mk.dest)
    assert (outside / "passwd").stat().st_nlink == 1


def test_parent_not_a_directory(mk: Layers) -> None:
    with pytest.raises(ImageError, match="parent 'f' is not a directory"):
        unpack_layers([mk(file("f"), file("f/child"))], mk.dest)


def test_unsupported_media_types(mk: Layers) -> None:
    for media_type in ("application/vnd.oci.image.layer.v1.tar+zstd", "application/x-tar"):
        layer = mk(file("f"), gz=False, media_type=media_type)
        with pytest.raises(ImageError, match="unsupported layer media type"):
            unpack_layers([layer], mk.dest)


@pytest.mark.parametrize(
    "content",
    [
        b"\x1f\x8b" + b"garbage" * 100,
        gzip.compress(tar_bytes([file("f", b"x" * 100_000)]))[:120],
        b"not a tar" * 200,
        b"",
        tar_bytes([file("f", b"x" * 100_000)])[:20_000],
    ],
)
def test_corrupt_layers(mk: Layers, content: bytes) -> None:
    with pytest.raises(ImageError, match="layer 0: "):
        unpack_layers([mk.blob(content, MEDIA_TAR_GZIP)], mk.dest)


def test_max_bytes(mk: Layers) -> None:
    layers = [mk(file("a", b"x" * 600)), mk(file("b", b"x" * 600))]
    with pytest.raises(ImageError, match=r"layer 1: entry 'b': .*max_bytes=1000"):
        unpack_layers(layers, mk.dest, UnpackLimits(max_bytes=1000))


def test_max_entries(mk: Layers) -> None:
    layers = [mk(file("a"), file("b")), mk(file("c"), file("d"))]
    unpack_layers(layers, mk.dest, UnpackLimits(max_entries=4))
    shutil.rmtree(mk.dest)
    mk.dest.mkdir()
    with pytest.raises(ImageError, match=r"layer 1: .*max_entries=3"):
        unpack_layers(layers, mk.dest, UnpackLimits(max_entries=3))


def test_max_path_and_depth(mk: Layers) -> None:
    with pytest.raises(ImageError, match="name longer than max_path=20"):
        unpack_layers([mk(file("d/" + "x" * 30))], mk.dest, UnpackLimits(max_path=20))
    with pytest.raises(ImageError, match="symlink target longer than max_path=20"):
        unpack_layers([mk(link("l", "y" * 30))], mk.dest, UnpackLimits(max_path=20))
    with pytest.raises(ImageError, match="deeper than max_depth=3"):
        unpack_layers([mk(file("a/b/c/d"))], mk.dest, UnpackLimits(max_depth=3))


def test_decompression_bomb_guard(mk: Layers) -> None:
    layer = mk(file("zeros", bytes(1024 * 1024)))
    assert layer.path.stat().st_size < 10_000
    with pytest.raises(
        ImageError, match="layer 0: decompressed layer exceeds max_layer_bytes=65536"
    ):
        unpack_layers([layer], mk.dest, UnpackLimits(max_layer_bytes=64 * 1024))


# -- the store ---------------------------------------------------------------------------

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64
DIGEST_C = "sha256:" + "c" * 64


def test_store_add_and_reuse(mk: Layers, tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store")
    assert mode(tmp_path / "store") == 0o755
    assert not store.has(DIGEST_A)
    path = store.add(DIGEST_A, [mk(file("usr/bin/x", b"x"))])
    assert path == tmp_path / "store/rootfs" / ("a" * 64)
    assert store.has(DIGEST_A)
    assert mode(path) == 0o755
    assert (path / "usr/bin/x").read_bytes() == b"x"
    # Already present: nothing is unpacked (this layer would fail).
    broken = mk.blob(b"junk", "application/vnd.oci.image.layer.v1.tar+zstd")
    assert store.add(DIGEST_A, [broken]) == path
    assert store.digests() == {DIGEST_A}
    assert os.listdir(tmp_path / "store/tmp") == []


def test_store_add_failure_leaves_nothing(mk: Layers, tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store")
    good = mk(file("usr/lib/big", b"x" * 10_000), dir_("etc"))
    bad = mk(file("/etc/shadow"))
    with pytest.raises(ImageError, match="absolute name"):
        store.add(DIGEST_A, [good, bad])
    assert os.listdir(tmp_path / "store/rootfs") == []
    assert os.listdir(tmp_path / "store/tmp") == []
    assert not store.has(DIGEST_A)


def test_store_add_progress_exception_cleans_up(mk: Layers, tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store")

    def cancel(index: int, done: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.add(DIGEST_A, [mk(file("f"))], progress=cancel)
    assert os.listdir(tmp_path / "store/rootfs") == []
    assert os.listdir(tmp_path / "store/tmp") == []


def test_store_remove_and_gc(mk: Layers, tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store")
    for digest in (DIGEST_A, DIGEST_B, DIGEST_C):
        store.add(digest, [mk(dir_("ro", 0o555), file("ro/f", mode=0o400))])
    (tmp_path / "store/rootfs/not-a-digest").mkdir()  # not ours: never listed or collected
    assert store.digests() == {DIGEST_A, DIGEST_B, DIGEST_C}
    assert store.remove(DIGEST_C)
    assert not store.remove(DIGEST_C)
    assert not store.has(DIGEST_C)
    assert store.gc([DIGEST_A, DIGEST_C]) == [DIGEST_B]
    assert store.digests() == {DIGEST_A}
    assert store.gc([DIGEST_A]) == []
    assert sorted(os.listdir(tmp_path / "store/rootfs")) == ["a" * 64, "not-a-digest"]
    assert os.listdir(tmp_path / "store/tmp") == []
    with pytest.raises(ImageError, match="invalid image digest"):
        store.gc(["sha256:A"])
    assert store.has(DIGEST_A)


def test_store_cleans_leftovers(tmp_path: Path, outside: Path) -> None:
    store_root = tmp_path / "store"
    ImageStore(store_root)
    crashed = store_root / "tmp/add-123"
    (crashed / "usr/bin").mkdir(parents=True)
    (crashed / "usr/bin/f").write_text("x")
    os.symlink(outside, crashed / "escape")
    os.symlink(outside, store_root / "tmp/dangling")
    (store_root / "tmp/file").write_text("x")
    ImageStore(store_root)
    assert os.listdir(store_root / "tmp") == []
    assert (outside / "passwd").exists()


@pytest.mark.parametrize(
    "digest",
    [
        "",
        "a" * 64,
        "sha256:" + "A" * 64,
        "sha256:" + "a" * 63,
        "sha256:" + "a" * 65,
        "sha512:" + "a" * 64,
        "sha256:" + "a" * 63 + "/",
        "sha256:../../" + "a" * 58,
        "sha256:" + "a" * 64 + "\n",
        "sha256:" + "g" * 64,
    ],
)
def test_bad_digests(tmp_path: Path, digest: str) -> None:
    store = ImageStore(tmp_path / "store")
    for call in (store.path, store.has, store.remove):
        with pytest.raises(ImageError, match="invalid image digest"):
            call(digest)
    with pytest.raises(ImageError, match="invalid image digest"):
        store.add(digest, [])


# -- property: nothing lands outside dest -------------------------------------------------

_ANY_NAME = st.builds(
    lambda prefix, parts: prefix + "/".join(parts),
    st.sampled_from(["", "./", "/"]),
    st.lists(st.sampled_from(["a", "b", "..", ".", "", ".wh.a", ".wh..wh..opq"]), max_size=4),
)
_PLAIN_NAME = st.builds(
    lambda prefix, parts: prefix + "/".join(parts),
    st.sampled_from(["", "./"]),
    st.lists(
        st.sampled_from(["a", "a", "b", "b", ".wh.a", ".wh..wh..opq"]), min_size=1, max_size=3
    ),
)
# Mostly names that are fine on their own, so that many examples unpack and the interesting
# part is what earlier entries (symlinks, files, whiteouts) do to later ones.
_NAME = st.sampled_from([True] * 9 + [False]).flatmap(
    lambda plain: _PLAIN_NAME if plain else _ANY_NAME
)
OUTSIDE_MARK = "@OUTSIDE@"
_TARGET = st.one_of(
    st.sampled_from(["..", "../..", "../../..", "../outside", OUTSIDE_MARK, "a", "a/b", "."]),
    _NAME,
)
_KIND = st.sampled_from(["file", "file", "dir", "dir", "symlink", "symlink", "hardlink"])
_ENTRY = st.tuples(_KIND, _NAME, _TARGET)


def _build(kind: str, name: str, target: str, outside: Path) -> Entry:
    target = target.replace(OUTSIDE_MARK, str(outside))
    if kind == "file":
        return file(name, b"hyp")
    if kind == "dir":
        return dir_(name)
    return link(name, target, tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(_ENTRY, min_size=1, max_size=8), min_size=1, max_size=3))
def test_nothing_lands_outside_dest(layers: list[list[tuple[str, str, str]]]) -> None:
    top = Path(tempfile.mkdtemp(prefix="images-hyp-"))
    try:
        # Symlinks may point up to three levels above dest: all of it stays inside `top`.
        base = top / "x" / "y"
        base.mkdir(parents=True)
        outside = base / "outside"
        outside.mkdir()
        (outside / "passwd").write_text("root\n")
        (top / "x/canary").write_text("c\n")
        mk = Layers(base)
        blobs = [mk(*(_build(*entry, outside) for entry in layer)) for layer in layers]
        before = tree(top)
        dest_prefix = os.path.relpath(mk.dest, top)
        try:
            unpack_layers(blobs, mk.dest)
        except ImageError as exc:
            assert "\n" not in str(exc)
            event("refused")
        else:
            event("unpacked")
        after = tree(top)
        # dest was empty before: everything else in `top` must be exactly as it was.
        assert {k: v for k, v in after.items() if not k.startswith(dest_prefix + "/")} == before
        real_dest = os.path.realpath(mk.dest)
        for dirpath, dirnames, filenames in os.walk(mk.dest):
            for entry in dirnames + filenames:
                parent = os.path.realpath(dirpath)
                assert os.path.commonpath([real_dest, parent]) == real_dest
                st_ = os.lstat(os.path.join(parent, entry))
                assert (
                    stat.S_ISDIR(st_.st_mode)
                    or stat.S_ISREG(st_.st_mode)
                    or stat.S_ISLNK(st_.st_mode)
                )
    finally:
        shutil.rmtree(top)
