"""What a sandboxed process can see and do, checked from inside with the probe script.

Threat catalogue D1 (egress), D2 (filesystem), D3 (kernel surface), D6 (privileges),
D7 (cross-tenant), D8 (fds).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import secrets
import signal
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import pytest
import trio
from process_support import public_tmpdir
from pyroute2.iproute import IPRoute
from sandbox_helpers import Probe

from sandbox.launcher import Launcher
from sandbox.spec import SANDBOX_TMP, SandboxSpec

# x86_64 syscall numbers (CI and dev machines are x86_64).
SYS = {
    "ioctl": 16,
    "ptrace": 101,
    "mount": 165,
    "umount2": 166,
    "add_key": 248,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "setns": 308,
    "process_vm_readv": 310,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "open_tree": 428,
    "fsopen": 430,
    "clone3": 435,
    "clone": 56,
}
CLONE_NEWUSER = 0x10000000
TIOCSTI = 0x5412
TIOCLINUX = 0x541C

pytestmark = pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86_64 syscall table")


def host_addresses() -> list[str]:
    """The host's own interface addresses (not loopback, not link-local)."""
    with IPRoute() as ipr:
        addrs = [str(a.get_attr("IFA_ADDRESS")) for a in ipr.get_addr()]
    return [
        a
        for a in addrs
        if not ipaddress.ip_address(a).is_loopback and not ipaddress.ip_address(a).is_link_local
    ]


async def test_no_route_out_of_the_sandbox(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    async with launcher.sandbox(probe_spec()) as sb:
        probe = Probe(sb)
        for host, port in [("1.1.1.1", 443), ("169.254.169.254", 80)]:
            reply = await probe.call("connect", host=host, port=port)
            assert reply["errno"] == errno.ENETUNREACH, (host, reply)
        udp = await probe.call("connect", host="1.1.1.1", port=53, udp=True)
        assert udp["errno"] == errno.ENETUNREACH, udp
        own = host_addresses()
        assert own, "the host should have at least one non-loopback address to try"
        for address in own:
            reply = await probe.call("connect", host=address, port=22)
            assert reply["errno"] == errno.ENETUNREACH, (address, reply)


async def test_host_loopback_is_not_the_sandbox_loopback(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    host_listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = host_listeners[0].socket.getsockname()[1]
    async with host_listeners[0], launcher.sandbox(probe_spec()) as sb:
        reply = await Probe(sb).call("connect", host="127.0.0.1", port=port)
        assert reply["errno"] == errno.ECONNREFUSED, reply


async def test_only_the_in_namespace_listener_is_reachable(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec], prefix: str
) -> None:
    name = f"{prefix}own"
    await launcher.netns.create(name)
    try:
        listener = await launcher.netns.open_trio_listener(name)
        port = listener.socket.getsockname()[1]
        async with listener, trio.open_nursery() as nursery:

            async def serve_one() -> None:
                stream = await listener.accept()
                async with stream:
                    assert await stream.receive_some(5) == b"hello"
                    await stream.send_all(b"world")

            nursery.start_soon(serve_one)
            async with launcher.sandbox(probe_spec(netns=name)) as sb:
                reply = await Probe(sb).call("connect", host="127.0.0.1", port=port, send="hello")
                assert reply == {"ok": True, "reply": "world", "elapsed": reply["elapsed"]}
    finally:
        await launcher.netns.remove(name)


async def test_host_filesystem_is_invisible(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    canary_dir = public_tmpdir("canary")
    canary = canary_dir / f"secret-{secrets.token_hex(4)}"
    canary.write_text("canary secret")
    try:
        async with launcher.sandbox(probe_spec()) as sb:
            probe = Probe(sb)
            paths = [str(canary), str(canary_dir), "/root", "/var/lib", "/work", "/etc/shadow"]
            reply = await probe.call("exists", paths=paths)
            assert reply["exists"] == dict.fromkeys(paths, False)
            top = await probe.call("listdir", path="/")
            assert set(top["entries"]) <= {
                "usr", "bin", "sbin", "lib", "lib64", "etc", "proc", "dev", "tmp", "home", "probe",
            }  # fmt: skip
            etc = await probe.call("listdir", path="/etc")
            assert set(etc["entries"]) <= {
                "passwd", "group", "ssl", "ca-certificates", "ld.so.cache", "alternatives",
            }  # fmt: skip
            # Only the sandbox's own processes exist in its pid namespace.
            procs = await probe.call("listdir", path="/proc")
            assert {int(e) for e in procs["entries"] if e.isdigit()} <= {1, 2, 3, 4}
            for path in ("/usr/evil", "/evil", "/etc/evil", "/probe/evil"):
                reply = await probe.call("write", path=path, data="x")
                assert reply["errno"] in (errno.EROFS, errno.EACCES), (path, reply)
            assert (await probe.call("write", path=f"{SANDBOX_TMP}/ok", data="x"))["ok"]
            assert (await probe.call("write", path="/home/sandbox/ok", data="x"))["ok"]
    finally:
        canary.unlink()
        canary_dir.rmdir()


async def test_process_has_no_privileges(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    async with launcher.sandbox(probe_spec()) as sb:
        status = (await Probe(sb).call("status"))["status"]
        assert status["NoNewPrivs"] == "1"
        assert status["Seccomp"] == "2"
        for cap in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb"):
            assert status[cap] == "0000000000000000", cap
        assert status["Uid"].split() == ["65534"] * 4
        # Seen from the host, the sandbox is the unprivileged host uid, never 0.
        host_status = await trio.Path(f"/proc/{sb.child_pid}/status").read_text()
        uid_line = next(line for line in host_status.splitlines() if line.startswith("Uid:"))
        assert uid_line.split()[1:] == ["65534"] * 4


@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        ("keyctl", [0, 0, 0, 0, 0], errno.EPERM),
        ("add_key", [0, 0, 0, 0, 0], errno.EPERM),
        ("bpf", [0, 0, 0], errno.EPERM),
        ("perf_event_open", [0, 0, -1, -1, 0], errno.EPERM),
        ("userfaultfd", [0], errno.EPERM),
        ("io_uring_setup", [1, 0], errno.EPERM),
        ("ptrace", [0, 0, 0, 0], errno.EPERM),  # PTRACE_TRACEME would succeed unfiltered
        ("unshare", [CLONE_NEWUSER], errno.EPERM),
        ("clone", [CLONE_NEWUSER | signal.SIGCHLD, 0, 0, 0, 0], errno.EPERM),
        ("clone3", [0, 0], errno.ENOSYS),
        ("setns", [0, 0], errno.EPERM),
        ("mount", [0, 0, 0, 0, 0], errno.EPERM),
        ("umount2", [0, 0], errno.EPERM),
        ("open_tree", [-100, 0, 0], errno.EPERM),
        ("fsopen", [0, 0], errno.EPERM),
        ("process_vm_readv", [1, 0, 0, 0, 0, 0], errno.EPERM),
        # fd 0 is a pipe: unfiltered these would fail with ENOTTY, not EPERM.
        ("ioctl", [0, TIOCSTI, 0], errno.EPERM),
        ("ioctl", [0, TIOCSTI | (1 << 32), 0], errno.EPERM),
        ("ioctl", [0, TIOCLINUX, 0], errno.EPERM),
    ],
)
async def test_blocked_syscalls_fail(
    launcher: Launcher,
    probe_spec: Callable[..., SandboxSpec],
    name: str,
    args: list[int],
    expected: int,
) -> None:
    async with launcher.sandbox(probe_spec()) as sb:
        reply = await Probe(sb).call("syscall", nr=SYS[name], args=args)
        assert (reply["ret"], reply["errno"]) == (-1, expected), reply


async def test_non_native_abi_kills_the_process(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    async with launcher.sandbox(probe_spec()) as sb:
        reply = await Probe(sb).call("x32")
        assert reply["signal"] == signal.SIGSYS


async def test_only_stdio_fds_are_inherited(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    async with launcher.sandbox(probe_spec()) as sb:
        fds = (await Probe(sb).call("fds"))["fds"]
        assert set(fds) == {"0", "1", "2"}, fds
        assert all(link.startswith("pipe:") for link in fds.values()), fds
        # bwrap's init (pid 1 inside) holds nothing of ours either: stdio plus its own
        # eventfd, no memfd (seccomp, /etc data), info/block pipe or other descriptor.
        fd_dir = f"/proc/{sb.child_pid}/fd"
        init_fds = {f: os.readlink(f"{fd_dir}/{f}") for f in os.listdir(fd_dir)}
        extra = {f: link for f, link in init_fds.items() if f not in {"0", "1", "2"}}
        assert set(extra.values()) <= {"anon_inode:[eventfd]"}, init_fds


async def test_rlimits_are_applied(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    async with launcher.sandbox(probe_spec()) as sb:
        limits = (await Probe(sb).call("limits"))["limits"]
    rows = {line[:26].strip(): line[26:].split()[:2] for line in limits.splitlines()[1:]}
    spec_limits = probe_spec().limits
    assert rows["Max open files"] == [str(spec_limits.nofile)] * 2
    assert rows["Max core file size"] == ["0", "0"]
    assert rows["Max file size"] == [str(spec_limits.fsize_bytes)] * 2
    assert rows["Max processes"] == [str(spec_limits.nproc)] * 2


async def test_environment_is_only_what_the_caller_passes(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    os.environ["SVCG_TEST_LEAK"] = "must-not-leak"
    try:
        spec = probe_spec(env={"ONLY": "this"}, cwd=SANDBOX_TMP)
        async with launcher.sandbox(spec) as sb:
            reply = await Probe(sb).call("env")
    finally:
        del os.environ["SVCG_TEST_LEAK"]
    # bwrap sets PWD after --chdir and Python may add LC_CTYPE; nothing from the host.
    env = {k: v for k, v in reply["env"].items() if k != "LC_CTYPE"}
    assert env == {"ONLY": "this", "PWD": SANDBOX_TMP}
    assert reply["cwd"] == SANDBOX_TMP


async def test_two_sandboxes_share_no_tmp_and_no_abstract_socket(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    socket_name = f"svcg-test-{secrets.token_hex(4)}"
    spec = probe_spec(scratch="/scratch")
    async with launcher.sandbox(spec) as a, launcher.sandbox(spec) as b:
        pa, pb = Probe(a), Probe(b)
        tmp_file = f"{SANDBOX_TMP}/from-a"
        assert (await pa.call("write", path=tmp_file, data="a"))["ok"]
        assert (await pa.call("write", path="/scratch/from-a", data="a"))["ok"]
        assert (await pa.call("abstract_bind", name=socket_name))["ok"]
        seen = await pb.call("exists", paths=[tmp_file, "/scratch/from-a"])
        assert seen["exists"] == {tmp_file: False, "/scratch/from-a": False}
        refused = await pb.call("abstract_connect", name=socket_name)
        assert refused["errno"] == errno.ECONNREFUSED
        # The name is free in B's namespace too: no collision with A's socket.
        assert (await pb.call("abstract_bind", name=socket_name))["ok"]
        assert a.scratch_dir != b.scratch_dir


async def test_symlinks_planted_in_scratch_do_not_reach_the_host(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    canary_dir = public_tmpdir("canary")
    canary = canary_dir / "keep-me"
    canary.write_text("host data")
    try:
        async with launcher.sandbox(probe_spec(scratch="/scratch")) as sb:
            probe = Probe(sb)
            for name, target in (("dir", str(canary_dir)), ("file", str(canary))):
                assert (await probe.call("symlink", target=target, path=f"/scratch/{name}"))["ok"]
                # Inside, the link resolves in the sandbox's own mount namespace: nothing.
                read = await probe.call("read", path=f"/scratch/{name}/keep-me")
                assert read["errno"] == errno.ENOENT
            scratch = sb.scratch_dir
        # Removing the scratch dir removed the links, never what they point to.
        assert scratch is not None and not await trio.Path(scratch).exists()
        assert await trio.Path(canary).read_text() == "host data"
    finally:
        canary.unlink()
        canary_dir.rmdir()


async def test_image_rootfs_replaces_the_host_layout(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    # A minimal "image": its own /etc, and a /usr that is the host's (bind-mounted, so the
    # probe's Python runs) with usr-merge links.
    image = public_tmpdir("image")
    (image / "usr").mkdir()
    (image / "etc").mkdir()
    (image / "etc/image-marker").write_text("from the image")
    for name in ("bin", "lib", "lib64", "sbin"):
        (image / name).symlink_to(f"usr/{name}")
    image.chmod(0o755)
    await trio.run_process(["mount", "--bind", "/usr", str(image / "usr")])
    try:
        async with launcher.sandbox(probe_spec(rootfs=str(image))) as sb:
            probe = Probe(sb)
            marker = await probe.call("read", path="/etc/image-marker")
            assert marker["data"] == "from the image"
            seen = await probe.call("exists", paths=["/etc/ssl", "/etc/passwd", "/usr/bin"])
            assert seen["exists"] == {"/etc/ssl": False, "/etc/passwd": False, "/usr/bin": True}
            top = await probe.call("listdir", path="/")
            assert set(top["entries"]) == {
                "usr", "etc", "bin", "lib", "lib64", "sbin", "proc", "dev", "tmp", "home", "probe",
            }  # fmt: skip
    finally:
        await trio.run_process(["umount", "--lazy", str(image / "usr")])
        # Never rmtree here: if the unmount had not happened it would recurse into /usr.
        (image / "etc/image-marker").unlink()
        for name in ("bin", "lib", "lib64", "sbin"):
            (image / name).unlink()
        for name in ("etc", "usr", ""):
            (image / name).rmdir()


async def test_prepare_hook_listens_inside_the_new_namespace_and_adds_files(
    launcher: Launcher, probe_spec: Callable[..., SandboxSpec]
) -> None:
    """``Launcher.run(prepare=...)``: the egress proxy's way in (a listener and a CA file)."""
    async with trio.open_nursery() as nursery:

        async def serve_one(listener: trio.SocketListener) -> None:
            async with listener:
                stream = await listener.accept()
                async with stream:
                    assert await stream.receive_some(5) == b"hello"
                    await stream.send_all(b"world")

        async def prepare(namespace: str, spec: SandboxSpec) -> SandboxSpec:
            listener = await launcher.netns.open_trio_listener(namespace)
            nursery.start_soon(serve_one, listener)
            port = listener.socket.getsockname()[1]
            return replace(
                spec,
                env={**spec.env, "PROXY_PORT": str(port)},
                files=(("/svcgate/tls/bundle.pem", b"-----BEGIN CERTIFICATE-----\n"),),
            )

        sb = await nursery.start(partial(launcher.run, probe_spec(), prepare=prepare))
        try:
            probe = Probe(sb)
            env = (await probe.call("env"))["env"]
            port = int(env["PROXY_PORT"])
            reply = await probe.call("connect", host="127.0.0.1", port=port, send="hello")
            assert reply["reply"] == "world"
            data = await probe.call("read", path="/svcgate/tls/bundle.pem")
            assert data["data"] == "-----BEGIN CERTIFICATE-----\n"
            written = await probe.call("write", path="/svcgate/tls/bundle.pem", data="x")
            assert not written["ok"]
        finally:
            await sb.stop()
