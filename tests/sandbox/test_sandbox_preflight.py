"""Startup checks (threat catalogue D6) and the seccomp program's construction.

The filter's *effect* is tested from inside real sandboxes in test_sandbox_isolation.py;
here we check what is built and what the launcher refuses before anything runs.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

import pytest
from process_support import public_tmpdir

from sandbox import LauncherConfig, open_launcher, seccomp
from sandbox import host as hostmod
from sandbox.memfd import sealed_memfd

REQUIRED_BLOCKS = {
    "setns", "keyctl", "add_key", "request_key", "mount", "umount2", "pivot_root",
    "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "perf_event_open",
    "bpf", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "ptrace",
    "process_vm_readv", "process_vm_writev", "kexec_load", "kexec_file_load", "init_module",
    "finit_module", "delete_module", "acct", "swapon", "swapoff", "reboot",
}  # fmt: skip


def test_policy_blocks_the_required_syscalls() -> None:
    assert set(seccomp.BLOCKED_SYSCALLS) >= REQUIRED_BLOCKS
    assert seccomp.FilterPolicy().blocked_ioctls == (seccomp.TIOCSTI, seccomp.TIOCLINUX)


def test_bpf_program_is_a_whole_number_of_instructions() -> None:
    program = seccomp.compile_bpf()
    assert program and len(program) % 8 == 0  # struct sock_filter is 8 bytes


def test_ioctl_rules_compare_only_the_low_32_bits() -> None:
    text = seccomp.describe()
    # libseccomp's pseudo code for a MASKED_EQ 0xFFFFFFFF rule on the 64-bit argument:
    # the high word is masked out entirely, the low word compared exactly.
    assert "$a1.hi32 & 0x00000000 == 0" in text
    assert f"$a1.lo32 & 0xffffffff == {seccomp.TIOCSTI}" in text
    assert f"$a1.lo32 & 0xffffffff == {seccomp.TIOCLINUX}" in text
    assert "action KILL_PROCESS;" in text.split("# invalid architecture action")[1]


def test_unknown_syscall_names_are_an_error() -> None:
    policy = seccomp.FilterPolicy(blocked=("no_such_syscall",))
    with pytest.raises(seccomp.SeccompError):
        seccomp.compile_bpf(policy)


def test_memfd_is_sealed_and_rewound() -> None:
    fd = sealed_memfd("test", b"hello")
    try:
        assert os.read(fd, 10) == b"hello"
        with pytest.raises(PermissionError):
            os.write(fd, b"x")
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_WRITE and seals & fcntl.F_SEAL_SEAL
        assert not os.get_inheritable(fd)
    finally:
        os.close(fd)


def test_setuid_bwrap_is_refused() -> None:
    directory = public_tmpdir("bwrap")
    fake = directory / "bwrap"
    try:
        shutil.copy("/usr/bin/bwrap", fake)
        fake.chmod(0o4755)
        with pytest.raises(hostmod.HostCheckError, match="setuid"):
            hostmod.check_bwrap_unprivileged(str(fake))
    finally:
        shutil.rmtree(directory)


async def test_launcher_refuses_setuid_bwrap_and_root_sandboxes(state_dir: Path) -> None:
    directory = public_tmpdir("bwrap")
    fake = directory / "bwrap"
    try:
        shutil.copy("/usr/bin/bwrap", fake)
        fake.chmod(0o4755)
        with pytest.raises(hostmod.HostCheckError, match="setuid"):
            async with open_launcher(LauncherConfig(state_dir=state_dir, bwrap=str(fake))):
                pass  # pragma: no cover - never reached
    finally:
        shutil.rmtree(directory)
    if os.geteuid() == 0:
        with pytest.raises(hostmod.HostCheckError, match="uid/gid 0"):
            async with open_launcher(LauncherConfig(state_dir=state_dir, host_uid=0)):
                pass  # pragma: no cover - never reached


def test_process_running_as_host_root_is_detected() -> None:
    if os.geteuid() != 0:  # pragma: no cover - the suite runs as root
        pytest.skip("needs a process with uid 0 to inspect")
    with pytest.raises(hostmod.HostCheckError, match="uid 0"):
        hostmod.check_not_host_root(os.getpid())


def test_installed_bwrap_supports_what_we_need() -> None:
    features = hostmod.probe_bwrap("/usr/bin/bwrap", "/usr/bin/nsenter", "/usr/bin/prlimit")
    # Debian 12 ships bubblewrap 0.8.0, the first with --disable-userns.
    assert features.disable_userns


def test_host_layout_follows_usrmerge() -> None:
    layout = hostmod.host_root_layout()
    assert ("/usr", "/usr") in layout.binds
    for path in ("/bin", "/sbin", "/lib", "/lib64"):
        if os.path.islink(path):
            assert (path, os.readlink(path)) in layout.symlinks
        elif os.path.isdir(path):
            assert (path, path) in layout.binds


def test_image_layout_binds_top_level_dirs_and_skips_runtime_ones(tmp_path: Path) -> None:
    for name in ("usr", "etc", "opt", "proc", "tmp", "home", "dev"):
        (tmp_path / name).mkdir()
    (tmp_path / "bin").symlink_to("usr/bin")
    (tmp_path / "README").write_text("not a directory")
    layout = hostmod.image_root_layout(str(tmp_path))
    assert not layout.host
    assert sorted(dest for _, dest in layout.binds) == ["/etc", "/opt", "/usr"]
    assert layout.symlinks == (("/bin", "usr/bin"),)


def test_state_dir_must_be_reachable_by_the_sandbox_uid(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "scratch").mkdir(mode=0o711)
    with pytest.raises(hostmod.HostCheckError, match="not searchable"):
        hostmod.check_traversable(private / "scratch", 65534)
    hostmod.check_traversable(private / "scratch", None)  # unprivileged launcher: no switch
