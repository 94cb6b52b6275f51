"""Named network namespaces: lifecycle, listeners inside them, metadata and crash cleanup."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

import netns
from netns import core, names

NETNS_DIR = Path("/var/run/netns")


def thread_namespaces() -> set[int]:
    """Network namespace inodes of every thread of this process."""
    inodes = set()
    for task in os.listdir("/proc/self/task"):
        try:
            inodes.add(os.stat(f"/proc/self/task/{task}/ns/net").st_ino)
        except FileNotFoundError:
            continue  # thread exited meanwhile
    return inodes


HOST_NETNS = os.stat("/proc/self/ns/net").st_ino


# --- names (pure) -------------------------------------------------------------------------


@given(st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", fullmatch=True))
def test_valid_names_are_accepted(name: str) -> None:
    if name not in {".", ".."}:
        assert names.validate_name(name) == name


@pytest.mark.parametrize(
    "name", ["", ".", "..", "-x", "a/b", "../x", "a\x00b", "x" * 65, "white space", "ü"]
)
def test_unsafe_names_are_rejected(name: str) -> None:
    assert not names.is_valid_name(name)
    with pytest.raises(names.InvalidNamespaceName):
        names.validate_name(name)


def test_empty_prefix_matches_nothing() -> None:
    assert not names.has_prefix("svcg-1", "")
    assert not names.has_prefix("svcg-", "svcg-")
    assert names.has_prefix("svcg-1", "svcg-")


# --- lifecycle ----------------------------------------------------------------------------


async def test_create_inspect_list_remove(prefix: str, state_dir: Path) -> None:
    ns = netns.Netns(state_dir, limiter=trio.CapacityLimiter(2))
    name = f"{prefix}a"
    info = await ns.create(name, labels={"owner": "test"})
    try:
        assert info.path == NETNS_DIR / name and info.path.exists()
        meta = json.loads((state_dir / f"{name}.json").read_text())
        assert meta["labels"] == {"owner": "test"}
        assert meta["owner_pid"] == os.getpid()
        links = await ns.inspect(name)
        assert [(i.name, i.up) for i in links] == [("lo", True)]
        assert "127.0.0.1/8" in links[0].addresses
        listed = await ns.list_namespaces(prefix=prefix)
        assert [(i.name, i.mounted, i.owner_alive) for i in listed] == [(name, True, True)]
        assert listed[0].metadata is not None
        assert listed[0].metadata.labels == {"owner": "test"}
    finally:
        assert await ns.remove(name)
    assert not (NETNS_DIR / name).exists()
    assert not (state_dir / f"{name}.json").exists()
    assert not await ns.remove(name)  # idempotent


async def test_duplicate_name_is_refused_and_the_original_kept(
    prefix: str, state_dir: Path
) -> None:
    ns = netns.Netns(state_dir)
    name = f"{prefix}dup"
    await ns.create(name, labels={"first": "1"})
    try:
        with pytest.raises(netns.NamespaceExists):
            await ns.create(name)
        assert (NETNS_DIR / name).exists()
        assert core.read_metadata(state_dir, name) is not None
    finally:
        await ns.remove(name)


async def test_invalid_name_is_refused_before_anything_is_created(state_dir: Path) -> None:
    with pytest.raises(netns.InvalidNamespaceName):
        await netns.Netns(state_dir).create("../etc")
    assert os.listdir(state_dir) == []


async def test_listener_inside_namespace_is_reachable_only_from_inside(
    prefix: str, state_dir: Path
) -> None:
    ns = netns.Netns(state_dir)
    name = f"{prefix}l"
    await ns.create(name)
    try:
        listener = await ns.open_trio_listener(name)
        port = listener.socket.getsockname()[1]

        def connect_inside() -> None:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
                client.sendall(b"ping")

        async with listener:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    trio.to_thread.run_sync, lambda: netns.run_in_namespace(name, connect_inside)
                )
                with trio.fail_after(5):
                    stream = await listener.accept()
                async with stream:
                    assert await stream.receive_some(4) == b"ping"
            # From the host's loopback the port is another socket (or nothing at all): our
            # listener must not see the attempt.
            with socket.socket() as probe:
                probe.settimeout(2)
                try:
                    probe.connect(("127.0.0.1", port))
                except OSError as exc:
                    assert exc.errno == errno.ECONNREFUSED
            with socket.socket(fileno=os.dup(listener.socket.fileno())) as raw:
                raw.setblocking(False)
                with pytest.raises(BlockingIOError):
                    raw.accept()
    finally:
        await ns.remove(name)


async def test_namespace_switches_never_leak_into_other_threads(
    prefix: str, state_dir: Path
) -> None:
    ns = netns.Netns(state_dir, limiter=trio.CapacityLimiter(3))
    names_ = [f"{prefix}{i}" for i in range(4)]
    async with trio.open_nursery() as nursery:
        for name in names_:
            nursery.start_soon(ns.create, name)
    sockets: list[socket.socket] = []
    try:
        async with trio.open_nursery() as nursery:

            async def listen(name: str) -> None:
                sockets.append(await ns.open_listener(name))

            for name in names_:
                nursery.start_soon(listen, name)
        # Every thread of the process (trio's idle workers included) is in the host's
        # namespace; the sockets are each in their own.
        assert thread_namespaces() == {HOST_NETNS}
        assert len(sockets) == 4
    finally:
        for sock in sockets:
            sock.close()
        for name in names_:
            await ns.remove(name)


async def test_open_listener_in_missing_namespace_fails_clearly(state_dir: Path) -> None:
    with pytest.raises(netns.NamespaceNotFound):
        await netns.Netns(state_dir).open_listener("svcg-does-not-exist")


async def test_cancelled_create_then_remove_leaves_nothing(prefix: str, state_dir: Path) -> None:
    ns = netns.Netns(state_dir)
    for step in range(5):
        name = f"{prefix}c{step}"
        with trio.move_on_after(step * 0.002):
            await ns.create(name)
        # The caller cannot know whether it got the namespace; remove is idempotent.
        await ns.remove(name)
        assert not (NETNS_DIR / name).exists()
        assert os.listdir(state_dir) == []


# --- crash cleanup ------------------------------------------------------------------------


def dead_pid() -> int:
    proc = subprocess.Popen(["/bin/true"])
    proc.wait()
    return proc.pid


async def test_cleanup_removes_only_namespaces_of_dead_owners(prefix: str, state_dir: Path) -> None:
    ns = netns.Netns(state_dir)
    alive, dead, orphan, unrecorded = (f"{prefix}{n}" for n in ("alive", "dead", "orph", "unrec"))
    for name in (alive, dead, unrecorded):
        await ns.create(name)
    # A crashed owner: rewrite the record with a pid that no longer exists.
    meta = json.loads((state_dir / f"{dead}.json").read_text())
    meta["owner_pid"] = dead_pid()
    (state_dir / f"{dead}.json").write_text(json.dumps(meta))
    # A record whose namespace never got mounted, and a namespace whose record is gone.
    (state_dir / f"{orphan}.json").write_text(json.dumps({**meta, "name": orphan}))
    (state_dir / f"{unrecorded}.json").unlink()
    other_prefix = f"x{prefix}"
    await ns.create(f"{other_prefix}keep")
    try:
        removed = await ns.cleanup_leftovers(prefix)
        assert sorted(removed) == sorted([dead, orphan, unrecorded])
        assert [i.name for i in await ns.list_namespaces(prefix=prefix)] == [alive]
        assert (NETNS_DIR / f"{other_prefix}keep").exists()
        assert await ns.cleanup_leftovers("") == []  # an empty prefix never matches
    finally:
        await ns.remove(alive)
        await ns.remove(f"{other_prefix}keep")
