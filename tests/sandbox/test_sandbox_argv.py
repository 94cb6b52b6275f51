"""The pure argv builder and spec validation, including property tests (no I/O)."""

from __future__ import annotations

import posixpath
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.argv import (
    BwrapFeatures,
    RootLayout,
    Runtime,
    build_bwrap_argv,
    build_command,
    group_line,
    passwd_line,
    rlimit_options,
)
from sandbox.spec import (
    SANDBOX_TMP,
    Bind,
    InvalidSpec,
    ResourceLimits,
    SandboxSpec,
    is_under,
)

NO_ARG = {
    "--unshare-user", "--disable-userns", "--unshare-ipc", "--unshare-pid", "--unshare-uts",
    "--unshare-cgroup-try", "--unshare-net", "--die-with-parent", "--new-session", "--clearenv",
}  # fmt: skip
ONE_ARG = {
    "--hostname", "--uid", "--gid", "--cap-drop", "--info-fd", "--block-fd", "--proc", "--dev",
    "--size", "--tmpfs", "--remount-ro", "--seccomp", "--chdir",
}  # fmt: skip
TWO_ARGS = {
    "--ro-bind", "--ro-bind-try", "--bind", "--bind-try", "--symlink", "--setenv",
    "--ro-bind-data",
}  # fmt: skip
MOUNTS = {"--ro-bind", "--ro-bind-try", "--bind", "--bind-try", "--ro-bind-data", "--symlink",
          "--tmpfs", "--proc", "--dev"}  # fmt: skip
HOST_ROOT = RootLayout(
    binds=(("/usr", "/usr"),),
    symlinks=(("/bin", "usr/bin"), ("/lib", "usr/lib"), ("/lib64", "usr/lib64")),
)


def parse(argv: list[str]) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """Split a bwrap argv into (option, args) pairs and the command; fail on unknowns."""
    assert argv[0].endswith("bwrap")
    ops: list[tuple[str, list[str]]] = []
    i = 1
    while argv[i] != "--":
        opt = argv[i]
        arity = 0 if opt in NO_ARG else 1 if opt in ONE_ARG else 2 if opt in TWO_ARGS else -1
        assert arity >= 0, f"unexpected option {opt!r}"
        ops.append((opt, argv[i + 1 : i + 1 + arity]))
        i += 1 + arity
    return ops, argv[i + 1 :]


def mount_dest(opt: str, args: list[str]) -> str:
    return args[0] if opt in {"--tmpfs", "--proc", "--dev"} else args[1]


def minimal_spec(**kw: Any) -> SandboxSpec:
    return SandboxSpec(command=("/usr/bin/true",), **kw)


# --- strategies ---------------------------------------------------------------------------

segment = st.text("abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=1, max_size=8).filter(
    lambda s: s not in {".", ".."}
)
abs_path = st.lists(segment, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))
free_dest = abs_path.filter(
    lambda p: not any(is_under(p, r) for r in ("/proc", "/dev")) and p != "/"
)
arg_text = st.text(st.characters(blacklist_characters="\x00"), max_size=20)
env_name = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
binds = st.builds(Bind, source=abs_path, dest=free_dest, writable=st.booleans(),
                  optional=st.booleans())  # fmt: skip


@st.composite
def specs(draw: st.DrawFn) -> SandboxSpec:
    return SandboxSpec(
        command=(draw(abs_path), *draw(st.lists(arg_text, max_size=4))),
        env=draw(st.dictionaries(env_name, arg_text, max_size=5)),
        uid=draw(st.integers(0, 2**32 - 2)),
        gid=draw(st.integers(0, 2**32 - 2)),
        home=draw(free_dest),
        home_size=draw(st.integers(1, 2**40)),
        tmp_size=draw(st.integers(1, 2**40)),
        cwd=draw(st.none() | abs_path),
        binds=tuple(draw(st.lists(binds, max_size=5))),
        scratch=draw(st.none() | free_dest),
    )


@st.composite
def runtimes(draw: st.DrawFn) -> Runtime:
    fd = st.integers(3, 1000)
    with_uid = draw(st.booleans())
    return Runtime(
        netns_path=draw(st.none() | st.just("/var/run/netns/svcg-x")),
        host_uid=draw(st.integers(1, 2**31)) if with_uid else None,
        host_gid=draw(st.integers(1, 2**31)) if with_uid else None,
        seccomp_fd=draw(st.none() | fd),
        info_fd=draw(st.none() | fd),
        block_fd=draw(st.none() | fd),
        data_files=tuple(draw(st.lists(st.tuples(fd, free_dest), max_size=2))),
        scratch_source="/var/lib/svcgate/scratch/x",
    )


roots = st.sampled_from(
    [HOST_ROOT, RootLayout(binds=(("/img/usr", "/usr"), ("/img/etc", "/etc")), host=False)]
)
features = st.builds(BwrapFeatures, disable_userns=st.booleans())


# --- properties ---------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(spec=specs(), root=roots, feat=features, runtime=runtimes())
def test_argv_invariants(
    spec: SandboxSpec, root: RootLayout, feat: BwrapFeatures, runtime: Runtime
) -> None:
    argv = build_bwrap_argv(spec, root, feat, runtime)
    assert all("\x00" not in a for a in argv)
    ops, command = parse(argv)
    names = [opt for opt, _ in ops]
    assert command == list(spec.command)

    # Namespaces: never --unshare-all; the network namespace is ours unless none is given.
    assert "--unshare-all" not in names
    for flag in ("--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts",
                 "--unshare-cgroup-try", "--die-with-parent", "--new-session"):  # fmt: skip
        assert names.count(flag) == 1, flag
    assert ("--unshare-net" in names) == (runtime.netns_path is None)
    assert ("--disable-userns" in names) == feat.disable_userns
    assert ("--cap-drop", ["ALL"]) in ops
    assert ("--uid", [str(spec.uid)]) in ops and ("--gid", [str(spec.gid)]) in ops

    # --size always directly precedes a --tmpfs, and each tmpfs is sized.
    for i, (opt, _) in enumerate(ops):
        if opt == "--size":
            assert ops[i + 1][0] == "--tmpfs"
        if opt == "--tmpfs":
            assert ops[i - 1][0] == "--size"
    assert ("--tmpfs", [SANDBOX_TMP]) in ops and ("--tmpfs", [spec.home]) in ops

    # A mount comes after every mount at one of its parent directories.
    mounts = [(i, mount_dest(opt, args)) for i, (opt, args) in enumerate(ops) if opt in MOUNTS]
    for i, dest in mounts:
        for j, other in mounts:
            if other != dest and is_under(dest, other):
                assert j < i, (other, dest)
    # The root is frozen after the last mount.
    remount = names.index("--remount-ro")
    assert ops[remount] == ("--remount-ro", ["/"])
    assert all(i < remount for i, _ in mounts)

    # Environment: cleared, then exactly the caller's.
    setenvs = [i for i, name in enumerate(names) if name == "--setenv"]
    assert all(names.index("--clearenv") < i for i in setenvs)
    assert {ops[i][1][0]: ops[i][1][1] for i in setenvs} == dict(spec.env)
    assert ("--chdir", [spec.workdir]) in ops

    # File descriptors appear exactly when the runtime has them.
    assert (("--seccomp", [str(runtime.seccomp_fd)]) in ops) == (runtime.seccomp_fd is not None)
    assert (("--info-fd", [str(runtime.info_fd)]) in ops) == (runtime.info_fd is not None)
    assert (("--block-fd", [str(runtime.block_fd)]) in ops) == (runtime.block_fd is not None)

    # No host path is bound that nobody asked for.
    allowed = {s for s, _ in root.binds} | {b.source for b in spec.binds}
    allowed |= set(spec.host_etc) if root.host else set()
    allowed |= {runtime.scratch_source} if spec.scratch else set()
    sources = {args[0] for opt, args in ops if opt in {"--ro-bind", "--ro-bind-try", "--bind",
                                                         "--bind-try"}}  # fmt: skip
    assert sources <= allowed
    # Writable binds are exactly the caller's writable binds plus scratch.
    writable = {(args[0], args[1]) for opt, args in ops if opt in {"--bind", "--bind-try"}}
    expected = {(b.source, b.dest) for b in spec.binds if b.writable}
    if spec.scratch:
        expected.add((str(runtime.scratch_source), spec.scratch))
    assert writable == expected

    assert build_bwrap_argv(spec, root, feat, runtime) == argv  # deterministic


@settings(max_examples=100, deadline=None)
@given(spec=specs(), feat=features, runtime=runtimes())
def test_command_prefix(spec: SandboxSpec, feat: BwrapFeatures, runtime: Runtime) -> None:
    argv = build_command(spec, HOST_ROOT, feat, runtime)
    assert argv[0] == feat.prlimit_path
    rest = argv[argv.index("--") + 1 :]
    assert argv[1 : argv.index("--")] == rlimit_options(spec.limits)
    if runtime.netns_path is None and runtime.host_uid is None:
        assert rest[0] == feat.bwrap_path
        return
    assert rest[0] == feat.nsenter_path
    nsenter_opts = rest[1 : rest.index("--")]
    assert (f"--net={runtime.netns_path}" in nsenter_opts) == (runtime.netns_path is not None)
    if runtime.host_uid is not None:
        assert nsenter_opts[-4:] == ["-S", str(runtime.host_uid), "-G", str(runtime.host_gid)]
    else:
        assert "-S" not in nsenter_opts
    assert rest[rest.index("--") + 1 :] == build_bwrap_argv(spec, HOST_ROOT, feat, runtime)


# --- examples -----------------------------------------------------------------------------


def test_host_layout_binds_usr_and_recreates_usrmerge_links() -> None:
    spec = minimal_spec(env={"A": "1"})
    ops, _ = parse(build_bwrap_argv(spec, HOST_ROOT, BwrapFeatures(), Runtime()))
    assert ("--ro-bind", ["/usr", "/usr"]) in ops
    assert ("--symlink", ["usr/bin", "/bin"]) in ops
    assert ("--ro-bind-try", ["/etc/ssl", "/etc/ssl"]) in ops
    image = RootLayout(binds=(("/img/usr", "/usr"),), host=False)
    ops, _ = parse(build_bwrap_argv(spec, image, BwrapFeatures(), Runtime()))
    assert not any(opt == "--ro-bind-try" and args[0].startswith("/etc") for opt, args in ops)


def test_caller_bind_below_tmp_comes_after_the_tmpfs() -> None:
    spec = minimal_spec(binds=(Bind("/srv/data", f"{SANDBOX_TMP}/data"),))
    ops, _ = parse(build_bwrap_argv(spec, HOST_ROOT, BwrapFeatures(), Runtime()))
    assert ops.index(("--tmpfs", [SANDBOX_TMP])) < ops.index(
        ("--ro-bind", ["/srv/data", f"{SANDBOX_TMP}/data"])
    )


def test_scratch_needs_a_runtime_source() -> None:
    with pytest.raises(InvalidSpec):
        build_bwrap_argv(minimal_spec(scratch="/scratch"), HOST_ROOT, BwrapFeatures(), Runtime())


def test_etc_entries_are_generated_for_the_sandbox_user() -> None:
    assert passwd_line(65534, 65534, "/home/sandbox") == (
        "sandbox:x:65534:65534:sandbox:/home/sandbox:/bin/sh\n"
    )
    assert group_line(100) == "sandbox:x:100:\n"


def test_rlimit_options() -> None:
    limits = ResourceLimits(nofile=64, nproc=None, fsize_bytes=1000)
    assert rlimit_options(limits) == ["--nofile=64:64", "--core=0:0", "--fsize=1000:1000"]
    assert rlimit_options(replace(limits, nproc=7))[-1] == "--nproc=7:7"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"command": ()},
        {"command": ("python3",)},
        {"command": ("/usr/bin/../bin/sh",)},
        {"command": ("/bin/sh", "a\x00b")},
        {"command": ("/bin/sh",), "env": {"A=B": "x"}},
        {"command": ("/bin/sh",), "env": {"1A": "x"}},
        {"command": ("/bin/sh",), "env": {"A": "x\x00"}},
        {"command": ("/bin/sh",), "hostname": "Bad_Host"},
        {"command": ("/bin/sh",), "home": "/proc/x"},
        {"command": ("/bin/sh",), "home": "relative"},
        {"command": ("/bin/sh",), "scratch": "/dev/x"},
        {"command": ("/bin/sh",), "uid": -1},
        {"command": ("/bin/sh",), "uid": 2**32 - 1},
        {"command": ("/bin/sh",), "tmp_size": 0},
        {"command": ("/bin/sh",), "host_etc": ("/usr/lib",)},
        {"command": ("/bin/sh",), "binds": [Bind("/a", "/b")]},
        {"command": ("/bin/sh",), "rootfs": "images/x"},
        {"command": ("/bin/sh",), "files": (("/proc/x", b""),)},
        {"command": ("/bin/sh",), "files": (("relative", b""),)},
        {"command": ("/bin/sh",), "files": (("/x", "text"),)},
    ],
)
def test_invalid_specs_are_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidSpec):
        SandboxSpec(**kwargs)


@pytest.mark.parametrize(
    ("source", "dest"),
    [
        ("/a", "/"),
        ("/a", "/proc"),
        ("/a", "/proc/1"),
        ("/a", "/dev/null"),
        ("a", "/b"),
        ("/a/../b", "/c"),
        ("/a", "/b/"),
        ("//a", "/b"),
    ],
)
def test_invalid_binds_are_rejected(source: str, dest: str) -> None:
    with pytest.raises(InvalidSpec):
        Bind(source, dest)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"seccomp_fd": 2},
        {"info_fd": 0},
        {"data_files": ((1, "/etc/x"),)},
        {"host_uid": 5},
        {"netns_path": "netns/x"},
    ],
)
def test_invalid_runtimes_are_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidSpec):
        Runtime(**kwargs)


def test_spec_environment_is_immutable() -> None:
    env = {"A": "1"}
    spec = minimal_spec(env=env)
    env["B"] = "2"
    assert dict(spec.env) == {"A": "1"}
    with pytest.raises(TypeError):
        spec.env["C"] = "3"  # type: ignore[index]


@given(abs_path)
def test_generated_paths_are_normalised(path: str) -> None:
    assert posixpath.normpath(path) == path
